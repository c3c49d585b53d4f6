//! The crate's error type and its stable codes (`BOT-N…`).

use std::io;
use std::path::PathBuf;

use bottle_core::Coded;
use thiserror::Error;

/// Everything that can go wrong while choosing a subnet.
#[derive(Debug, Error)]
pub enum NetError {
    /// Every `/24` of the bottle subnet pool overlaps something already
    /// there: the pool is full.
    #[error(
        "no free bottle subnet: the pool {pool} is full, all {candidates} of its /24s are in use by a docker network (one per running bottle) or a host route"
    )]
    SubnetsExhausted {
        /// How many subnets the pool holds; every one was tried.
        candidates: usize,
        /// The pool's range.
        pool: crate::Ipv4Net,
    },

    /// A CIDR string or prefix length is not valid.
    #[error("invalid IPv4 network {input:?}: {reason}")]
    InvalidNet {
        /// What was given.
        input: String,
        /// Why it was refused.
        reason: String,
    },

    /// The host's route table could not be read.
    #[error("could not read the host route table {path}: {source}")]
    RouteRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// The host's route table is not in the format `/proc/net/route` uses.
    #[error("{path}:{line}: {detail}")]
    RouteParse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        detail: String,
    },
}

impl Coded for NetError {
    fn code(&self) -> &'static str {
        match self {
            NetError::SubnetsExhausted { .. } => "BOT-N001",
            NetError::InvalidNet { .. } => "BOT-N002",
            NetError::RouteRead { .. } => "BOT-N003",
            NetError::RouteParse { .. } => "BOT-N004",
            // N005 to N013 named the removed loopback alias pool: never reuse them.
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            NetError::SubnetsExhausted { .. } => {
                "stop bottles you no longer need (`bottle list`, `bottle stop NAME`, `bottle cleanup`) and remove unused networks (`docker network prune`), or widen the pool: set BOTTLE_SUBNET_POOL to a larger free range, e.g. 10.213.0.0/16 (65536 addresses, 256 bottles)"
            }
            NetError::InvalidNet { .. } => "write it as a.b.c.d/len with len between 0 and 32",
            NetError::RouteRead { .. } => {
                "check that procfs is mounted and readable, or pass the right root"
            }
            NetError::RouteParse { .. } => {
                "this file should be the kernel's /proc/net/route; check the root passed to HostRoutes::read"
            }
        };
        Some(fix.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique() {
        let io = || io::Error::other("x");
        let errors = [
            NetError::SubnetsExhausted {
                candidates: 1,
                pool: crate::SubnetPool::default().range(),
            },
            NetError::InvalidNet {
                input: String::new(),
                reason: String::new(),
            },
            NetError::RouteRead {
                path: PathBuf::new(),
                source: io(),
            },
            NetError::RouteParse {
                path: PathBuf::new(),
                line: 1,
                detail: String::new(),
            },
        ];
        let mut codes: Vec<_> = errors.iter().map(Coded::code).collect();
        assert!(codes.iter().all(|c| c.starts_with("BOT-N")));
        let count = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), count);
        assert!(
            errors
                .iter()
                .all(|e| e.fix().is_some_and(|fix| !fix.is_empty()))
        );
    }
}
