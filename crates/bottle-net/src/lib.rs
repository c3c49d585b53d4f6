//! `bottle-net` owns address allocation: per-bottle subnets and the loopback
//! alias pool. It never creates Docker networks itself.
