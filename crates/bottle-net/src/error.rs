//! The crate's error type and its stable codes (`BOT-N…`).

use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use bottle_core::Coded;
use thiserror::Error;

/// Everything that can go wrong while choosing a subnet or an alias.
#[derive(Debug, Error)]
pub enum NetError {
    /// Every candidate `192.168.X.0/24` overlaps something already there.
    #[error(
        "no free bottle subnet: all {candidates} candidates 192.168.1.0/24-192.168.254.0/24 (192.168.17.0/24 is never used) overlap a docker network or a host route\n  fix: remove bottles you no longer need with `bottle stop NAME` or `bottle cleanup`, then unused networks with `docker network prune`"
    )]
    SubnetsExhausted {
        /// How many subnets were tried.
        candidates: usize,
    },

    /// A CIDR string or prefix length is not valid.
    #[error(
        "invalid IPv4 network {input:?}: {reason}\n  fix: write it as a.b.c.d/len with len between 0 and 32"
    )]
    InvalidNet {
        /// What was given.
        input: String,
        /// Why it was refused.
        reason: String,
    },

    /// The host's route table could not be read.
    #[error(
        "could not read the host route table {path}: {source}\n  fix: check that procfs is mounted and readable, or pass the right root"
    )]
    RouteRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// The host's route table is not in the format `/proc/net/route` uses.
    #[error(
        "{path}:{line}: {detail}\n  fix: this file should be the kernel's /proc/net/route; check the root passed to HostRoutes::read"
    )]
    RouteParse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        detail: String,
    },

    /// The configured loopback alias range cannot be used.
    #[error(
        "invalid loopback alias pool {first}-{last}: {reason}\n  fix: use a range inside 127.0.0.0/8 that avoids 127.0.0.0 and 127.0.0.1, such as the default 127.0.0.16-127.0.0.31"
    )]
    InvalidPool {
        /// First address asked for.
        first: Ipv4Addr,
        /// Last address asked for.
        last: Ipv4Addr,
        /// Why it was refused.
        reason: String,
    },

    /// A bottle name that cannot hold a lease.
    #[error(
        "invalid bottle name {name:?} for a loopback alias lease: {reason}\n  fix: pass the bottle's full name, e.g. bot-bottle-<slug>"
    )]
    InvalidBottle {
        /// The name given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A file or directory under the state root could not be used.
    #[error(
        "could not {action} {path}: {source}\n  fix: check that the state directory exists, is writable by you and is on a local filesystem"
    )]
    State {
        /// What we were doing ("create directory", "read", "write", ...).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// The allocation lock could not be taken.
    #[error(
        "could not lock {path}: {source}\n  fix: check that the state directory is on a local filesystem that supports flock(2)"
    )]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// A lease file is not valid JSON of the expected shape.
    #[error(
        "corrupted loopback alias lease {path}: {detail}\n  fix: check with `bottle list` that no running bottle uses {address}, then delete the file (rm {path})"
    )]
    LeaseCorrupt {
        /// The lease file.
        path: PathBuf,
        /// The address the file is named after.
        address: Ipv4Addr,
        /// What is wrong with it.
        detail: String,
    },

    /// A lease file was written by a newer `bottle`.
    #[error(
        "loopback alias lease {path} has format version {version}, this bottle reads only version {supported}\n  fix: upgrade bottle, or stop the bottles the newer version started and run `bottle cleanup` with it"
    )]
    LeaseVersion {
        /// The lease file.
        path: PathBuf,
        /// The version found.
        version: u64,
        /// The version this build reads.
        supported: u32,
    },

    /// Every alias in the pool is held by a live bottle.
    #[error("pool exhausted: all {size} loopback aliases ({first}-{last}) are held by bottles: {}\n  fix: stop one with `bottle stop NAME`, or run `bottle cleanup` to reclaim the aliases of bottles that are gone", holders.join(", "))]
    PoolExhausted {
        /// Number of addresses in the pool.
        size: usize,
        /// First address of the pool.
        first: Ipv4Addr,
        /// Last address of the pool.
        last: Ipv4Addr,
        /// The bottles holding the aliases, sorted.
        holders: Vec<String>,
    },

    /// The loopback alias could not be brought up; its lease was released.
    #[error(
        "could not add loopback alias {address} ({command}): {detail}; its lease was released\n  fix: {fix}"
    )]
    AliasAdd {
        /// The alias.
        address: Ipv4Addr,
        /// The command line that failed.
        command: String,
        /// Exit status and stderr, or why it could not be run.
        detail: String,
        /// What to do about it.
        fix: String,
    },

    /// The loopback alias could not be removed; its lease is kept so that a
    /// later `release` or `bottle cleanup` retries.
    #[error(
        "could not remove loopback alias {address} ({command}): {detail}; its lease is kept so that `bottle cleanup` can retry\n  fix: {fix}"
    )]
    AliasRemove {
        /// The alias.
        address: Ipv4Addr,
        /// The command line that failed.
        command: String,
        /// Exit status and stderr, or why it could not be run.
        detail: String,
        /// What to do about it.
        fix: String,
    },
}

impl Coded for NetError {
    fn code(&self) -> &'static str {
        match self {
            NetError::SubnetsExhausted { .. } => "BOT-N001",
            NetError::InvalidNet { .. } => "BOT-N002",
            NetError::RouteRead { .. } => "BOT-N003",
            NetError::RouteParse { .. } => "BOT-N004",
            NetError::InvalidPool { .. } => "BOT-N005",
            NetError::InvalidBottle { .. } => "BOT-N006",
            NetError::State { .. } => "BOT-N007",
            NetError::Lock { .. } => "BOT-N008",
            NetError::LeaseCorrupt { .. } => "BOT-N009",
            NetError::LeaseVersion { .. } => "BOT-N010",
            NetError::PoolExhausted { .. } => "BOT-N011",
            NetError::AliasAdd { .. } => "BOT-N012",
            NetError::AliasRemove { .. } => "BOT-N013",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique() {
        let addr = Ipv4Addr::LOCALHOST;
        let io = || io::Error::other("x");
        let errors = [
            NetError::SubnetsExhausted { candidates: 1 },
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
            NetError::InvalidPool {
                first: addr,
                last: addr,
                reason: String::new(),
            },
            NetError::InvalidBottle {
                name: String::new(),
                reason: "",
            },
            NetError::State {
                action: "",
                path: PathBuf::new(),
                source: io(),
            },
            NetError::Lock {
                path: PathBuf::new(),
                source: io(),
            },
            NetError::LeaseCorrupt {
                path: PathBuf::new(),
                address: addr,
                detail: String::new(),
            },
            NetError::LeaseVersion {
                path: PathBuf::new(),
                version: 2,
                supported: 1,
            },
            NetError::PoolExhausted {
                size: 0,
                first: addr,
                last: addr,
                holders: Vec::new(),
            },
            NetError::AliasAdd {
                address: addr,
                command: String::new(),
                detail: String::new(),
                fix: String::new(),
            },
            NetError::AliasRemove {
                address: addr,
                command: String::new(),
                detail: String::new(),
                fix: String::new(),
            },
        ];
        let mut codes: Vec<_> = errors.iter().map(Coded::code).collect();
        assert!(codes.iter().all(|c| c.starts_with("BOT-N")));
        let count = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), count);
        assert!(errors.iter().all(|e| e.to_string().contains("\n  fix: ")));
    }
}
