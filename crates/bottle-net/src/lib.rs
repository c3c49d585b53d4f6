//! `bottle-net` owns address allocation for bottles: the per-bottle
//! `192.168.X.0/24` subnet (derived from the slug, probed past networks in
//! use) and the loopback alias pool (`127.0.0.16`..`127.0.0.31` by default),
//! allocated across processes under a file lock with one lease file per
//! alias.
//!
//! It never creates Docker networks itself: what is "in use" is the
//! caller's answer, passed in as a callback. The only processes it runs are
//! macOS's `ifconfig lo0 alias`, through [`bottle_core::exec::CommandRunner`].
//!
//! **Architecture Invariant:** every alias this crate brings up has a lease
//! file written before it goes up and deleted only after it went down, so
//! `bottle cleanup` can always find it.

pub mod alias;
pub mod error;
pub mod loopback;
pub mod routes;
pub mod subnet;

pub use alias::{
    Alias, AliasAllocator, AliasPool, DEFAULT_POOL_FIRST, DEFAULT_POOL_LAST, LEASE_VERSION,
    LINUX_WIDEST_POOL_LAST, Lease, RESERVED_LOOPBACK,
};
pub use error::NetError;
pub use loopback::LoopbackPlatform;
pub use routes::{HostRoute, HostRoutes};
pub use subnet::{BottleSubnet, Ipv4Net, SKIPPED_OCTET, bottle_subnet, preferred_octet};
