//! `bottle-net` owns address allocation for bottles: the per-bottle
//! `192.168.X.0/24` subnet, derived from the slug and probed past the
//! networks already in use, and the host's route table it must not shadow.
//!
//! It never creates Docker networks itself: what is "in use" is the
//! caller's answer, passed in as a callback. It runs no processes.

pub mod error;
pub mod routes;
pub mod subnet;

pub use error::NetError;
pub use routes::{HostRoute, HostRoutes};
pub use subnet::{
    BottleSubnet, DEFAULT_SUBNET_POOL, Ipv4Net, SKIPPED_OCTET, SubnetPool, bottle_subnet,
    preferred_octet,
};
