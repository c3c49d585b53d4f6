//! The loopback alias pool: one `127.0.0.N` per bottle, handed out under an
//! exclusive file lock and recorded in a lease file per address.
//!
//! A bottle's sidecar bundle publishes its agent-facing ports on the
//! bottle's alias, and a microVM's TSI allowlist is exactly that alias's
//! `/32`: the agent reaches its own bundle and nothing else on host
//! loopback (not `127.0.0.1`'s services, not another bottle's ports).
//!
//! On-disk layout under the state root:
//!
//! ```text
//! <state_root>/net/aliases.lock          flock(2)ed while allocating
//! <state_root>/net/leases/<addr>.json    {"version":1,"bottle":"…","pid":N,"created":<unix secs>}
//! ```
//!
//! The lock file is never removed (removing a lock file that another
//! process is about to open would let two processes lock different files);
//! a lease file exists exactly while its alias is held.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bottle_core::exec::CommandRunner;
use serde::{Deserialize, Serialize};

use crate::error::NetError;
use crate::loopback::LoopbackPlatform;
use crate::subnet::Ipv4Net;

/// The version of the lease file format this build writes and reads.
pub const LEASE_VERSION: u32 = 1;

/// First address of the default pool.
pub const DEFAULT_POOL_FIRST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 16);
/// Last address of the default pool: 16 aliases in all.
pub const DEFAULT_POOL_LAST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 31);
/// Last address of the widest pool offered on Linux.
pub const LINUX_WIDEST_POOL_LAST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 254);

/// Loopback addresses that well-known host services own; a pool that spans
/// them skips them. Sharing one would put that service inside the bottle's
/// allowlist (127.0.0.53 is systemd-resolved's DNS stub: a DNS path out).
pub const RESERVED_LOOPBACK: [Ipv4Addr; 4] = [
    // systemd-resolved's stub resolver.
    Ipv4Addr::new(127, 0, 0, 53),
    // systemd-resolved's proxy stub.
    Ipv4Addr::new(127, 0, 0, 54),
    // Debian and Ubuntu map the host name here in /etc/hosts.
    Ipv4Addr::new(127, 0, 1, 1),
    // The broadcast address of 127.0.0.0/8.
    Ipv4Addr::new(127, 255, 255, 255),
];

/// A contiguous range of loopback addresses to hand out, minus
/// [`RESERVED_LOOPBACK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AliasPool {
    first: Ipv4Addr,
    last: Ipv4Addr,
}

impl AliasPool {
    /// A pool over `range`. Refused unless it lies inside `127.0.0.0/8`,
    /// avoids `127.0.0.0` and `127.0.0.1` (the host's shared loopback
    /// address, which the per-bottle aliases exist to keep bottles away
    /// from), and leaves at least one address once reserved ones are
    /// skipped.
    pub fn new(range: RangeInclusive<Ipv4Addr>) -> Result<AliasPool, NetError> {
        let (first, last) = range.into_inner();
        let refuse = |reason: &str| NetError::InvalidPool {
            first,
            last,
            reason: reason.to_string(),
        };
        if first > last {
            return Err(refuse("the first address is after the last"));
        }
        if first.octets()[0] != 127 || last.octets()[0] != 127 {
            return Err(refuse("it is not inside 127.0.0.0/8"));
        }
        if u32::from(first) <= u32::from(Ipv4Addr::LOCALHOST) {
            return Err(refuse(
                "it includes 127.0.0.0 or 127.0.0.1, which are shared by the whole host",
            ));
        }
        let pool = AliasPool { first, last };
        if pool.addresses().next().is_none() {
            return Err(refuse("every address in it is reserved"));
        }
        Ok(pool)
    }

    /// The pool every platform uses unless told otherwise: 127.0.0.16 to
    /// 127.0.0.31, 16 aliases.
    ///
    /// Linux could offer far more (all of `127.0.0.0/8` is loopback there),
    /// but the default stays the same everywhere so that addresses,
    /// documentation, firewall rules and the exhaustion message read the
    /// same on every host, and on macOS each alias is a root-only
    /// `ifconfig` change to the host. An operator who runs more than 16
    /// bottles on Linux widens the pool with [`AliasPool::new`] or
    /// [`AliasPool::widest_for`].
    pub fn default_for_platform() -> AliasPool {
        AliasPool {
            first: DEFAULT_POOL_FIRST,
            last: DEFAULT_POOL_LAST,
        }
    }

    /// The widest pool worth offering on `platform`: on Linux 127.0.0.16 to
    /// 127.0.0.254 (less the reserved addresses), kept inside
    /// `127.0.0.0/24` so addresses stay recognisable; on macOS the default,
    /// since every alias there is a change to the host's `lo0`.
    pub fn widest_for(platform: LoopbackPlatform) -> AliasPool {
        match platform {
            LoopbackPlatform::Linux => AliasPool {
                first: DEFAULT_POOL_FIRST,
                last: LINUX_WIDEST_POOL_LAST,
            },
            LoopbackPlatform::MacOs { .. } => AliasPool::default_for_platform(),
        }
    }

    /// The first address of the range.
    pub fn first(&self) -> Ipv4Addr {
        self.first
    }

    /// The last address of the range.
    pub fn last(&self) -> Ipv4Addr {
        self.last
    }

    /// How many addresses the pool hands out.
    pub fn size(&self) -> usize {
        self.addresses().count()
    }

    /// True if `address` is one the pool hands out.
    pub fn contains(&self, address: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&address) && !RESERVED_LOOPBACK.contains(&address)
    }

    /// The addresses handed out, lowest first.
    pub fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + use<> {
        (u32::from(self.first)..=u32::from(self.last))
            .map(Ipv4Addr::from)
            .filter(|addr| !RESERVED_LOOPBACK.contains(addr))
    }
}

/// A held alias, as recorded in its lease file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The alias (the lease file's name).
    pub address: Ipv4Addr,
    /// The bottle holding it, `bot-bottle-<slug>`.
    pub bottle: String,
    /// The process that allocated it. Informational: that process (the
    /// CLI) usually exits long before the bottle does.
    pub pid: u32,
    /// When it was allocated, in seconds since the Unix epoch.
    pub created: u64,
}

/// Version 1 of the lease file.
#[derive(Debug, Serialize, Deserialize)]
struct LeaseFileV1 {
    version: u32,
    bottle: String,
    pid: u32,
    created: u64,
}

/// The alias `allocate` handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The loopback address.
    pub address: Ipv4Addr,
    /// The bottle it belongs to.
    pub bottle: String,
    /// True if the bottle already held it (allocation is idempotent).
    pub reused: bool,
}

impl Alias {
    /// The alias as a `/32`: the microVM's whole TSI allowlist.
    pub fn cidr(&self) -> Ipv4Net {
        Ipv4Net::host(self.address)
    }
}

/// Hands out loopback aliases from a pool, one per bottle, across
/// processes.
pub struct AliasAllocator {
    net_dir: PathBuf,
    pool: AliasPool,
    platform: LoopbackPlatform,
    runner: Arc<dyn CommandRunner>,
}

impl std::fmt::Debug for AliasAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AliasAllocator")
            .field("net_dir", &self.net_dir)
            .field("pool", &self.pool)
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

/// An exclusive or shared `flock(2)` on the lock file, released when the
/// file is closed on drop, including when the process dies.
struct LockGuard {
    _file: File,
}

impl AliasAllocator {
    /// An allocator keeping its lock and leases under `<state_root>/net`,
    /// bringing aliases up on `platform` through `runner`.
    pub fn new(
        state_root: &Path,
        pool: AliasPool,
        platform: LoopbackPlatform,
        runner: Arc<dyn CommandRunner>,
    ) -> AliasAllocator {
        AliasAllocator {
            net_dir: state_root.join("net"),
            pool,
            platform,
            runner,
        }
    }

    /// The pool addresses are taken from.
    pub fn pool(&self) -> AliasPool {
        self.pool
    }

    /// `<state_root>/net/aliases.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.net_dir.join("aliases.lock")
    }

    /// `<state_root>/net/leases`.
    pub fn lease_dir(&self) -> PathBuf {
        self.net_dir.join("leases")
    }

    /// The lease file for `address`.
    pub fn lease_path(&self, address: Ipv4Addr) -> PathBuf {
        self.lease_dir().join(format!("{address}.json"))
    }

    /// Gives `bottle` a loopback alias and brings it up.
    ///
    /// If `bottle` already holds one, that one is returned (and brought up
    /// again, which is harmless, in case the host rebooted), even if it lies
    /// outside a pool that has since been narrowed. Otherwise every
    /// lease whose bottle `in_use` says is gone is reclaimed first, then the
    /// lowest free address is leased. If the alias cannot be brought up its
    /// lease is released before the error is returned.
    ///
    /// Runs under the exclusive lock, `in_use` included, so that a bottle
    /// cannot be judged gone while another process is creating it.
    pub fn allocate(
        &self,
        bottle: &str,
        in_use: &dyn Fn(&Lease) -> bool,
    ) -> Result<Alias, NetError> {
        validate_bottle(bottle)?;
        let _lock = self.lock(true)?;
        let leases = self.read_leases()?;

        if let Some(own) = leases.iter().find(|lease| lease.bottle == bottle) {
            self.bring_up(own.address)?;
            return Ok(Alias {
                address: own.address,
                bottle: bottle.to_string(),
                reused: true,
            });
        }

        let mut held = Vec::new();
        for lease in leases {
            if in_use(&lease) {
                held.push(lease);
            } else {
                self.reclaim(&lease)?;
            }
        }

        let Some(address) = self
            .pool
            .addresses()
            .find(|addr| held.iter().all(|lease| lease.address != *addr))
        else {
            let mut holders: Vec<String> = held
                .into_iter()
                .filter(|lease| self.pool.contains(lease.address))
                .map(|lease| lease.bottle)
                .collect();
            holders.sort_unstable();
            holders.dedup();
            return Err(NetError::PoolExhausted {
                size: self.pool.size(),
                first: self.pool.first,
                last: self.pool.last,
                holders,
            });
        };

        // The lease is written before the alias goes up, so that a crash in
        // between leaves a lease that `bottle cleanup` finds, not an
        // untracked alias.
        self.write_lease(&Lease {
            address,
            bottle: bottle.to_string(),
            pid: std::process::id(),
            created: unix_now(),
        })?;
        self.bring_up(address)?;
        Ok(Alias {
            address,
            bottle: bottle.to_string(),
            reused: false,
        })
    }

    /// Takes `bottle`'s alias down and deletes its lease; returns the
    /// address, or `None` if it held none. If the alias cannot be taken
    /// down the lease is kept, so that a later call can retry.
    pub fn release(&self, bottle: &str) -> Result<Option<Ipv4Addr>, NetError> {
        let _lock = self.lock(true)?;
        let mut released = None;
        for lease in self.read_leases()? {
            if lease.bottle == bottle {
                self.reclaim(&lease)?;
                released = released.or(Some(lease.address));
            }
        }
        Ok(released)
    }

    /// Releases every lease whose bottle `in_use` says is gone, as `bottle
    /// cleanup` does after a crash; returns what was reclaimed.
    pub fn reclaim_stale(&self, in_use: &dyn Fn(&Lease) -> bool) -> Result<Vec<Lease>, NetError> {
        let _lock = self.lock(true)?;
        let mut reclaimed = Vec::new();
        for lease in self.read_leases()? {
            if !in_use(&lease) {
                self.reclaim(&lease)?;
                reclaimed.push(lease);
            }
        }
        Ok(reclaimed)
    }

    /// Every lease, lowest address first. Takes a shared lock so that it
    /// never sees an allocation half-done; creates nothing if no alias was
    /// ever allocated.
    pub fn leases(&self) -> Result<Vec<Lease>, NetError> {
        if !self.lease_dir().exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock(false)?;
        self.read_leases()
    }

    fn lock(&self, exclusive: bool) -> Result<LockGuard, NetError> {
        let lease_dir = self.lease_dir();
        fs::create_dir_all(&lease_dir).map_err(|source| NetError::State {
            action: "create directory",
            path: lease_dir,
            source,
        })?;
        let path = self.lock_path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| NetError::State {
                action: "open",
                path: path.clone(),
                source,
            })?;
        // std's File::lock is flock(2) on Linux and macOS: whole-file,
        // tied to the open file, dropped by the kernel if we die.
        let locked = if exclusive {
            file.lock()
        } else {
            file.lock_shared()
        };
        locked.map_err(|source| NetError::Lock { path, source })?;
        Ok(LockGuard { _file: file })
    }

    fn read_leases(&self) -> Result<Vec<Lease>, NetError> {
        let dir = self.lease_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(NetError::State {
                    action: "list",
                    path: dir,
                    source,
                });
            }
        };
        let mut leases = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| NetError::State {
                action: "list",
                path: dir.clone(),
                source,
            })?;
            // Anything not named `<ipv4>.json` (a temp file left by a crash
            // mid-write, editor droppings) is not a lease.
            let name = entry.file_name();
            let Some(address) = name
                .to_str()
                .and_then(|name| name.strip_suffix(".json"))
                .and_then(|stem| stem.parse::<Ipv4Addr>().ok())
            else {
                continue;
            };
            let path = entry.path();
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                // Deleted between listing and reading; only possible
                // without the lock, and then it is simply not held.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(NetError::State {
                        action: "read",
                        path,
                        source,
                    });
                }
            };
            leases.push(parse_lease(&bytes, &path, address)?);
        }
        leases.sort_by_key(|lease| lease.address);
        Ok(leases)
    }

    fn write_lease(&self, lease: &Lease) -> Result<(), NetError> {
        let path = self.lease_path(lease.address);
        let body = serde_json::to_vec(&LeaseFileV1 {
            version: LEASE_VERSION,
            bottle: lease.bottle.clone(),
            pid: lease.pid,
            created: lease.created,
        })
        .map_err(|err| NetError::State {
            action: "encode",
            path: path.clone(),
            source: io::Error::other(err),
        })?;
        // Write then rename, so that a reader never sees half a lease. The
        // lock already serialises writers; the pid in the name is a second
        // line of defence should a writer ever run without it.
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        fs::write(&tmp, [body.as_slice(), b"\n"].concat()).map_err(|source| NetError::State {
            action: "write",
            path: tmp.clone(),
            source,
        })?;
        fs::rename(&tmp, &path).map_err(|source| NetError::State {
            action: "write",
            path,
            source,
        })
    }

    fn delete_lease(&self, address: Ipv4Addr) -> Result<(), NetError> {
        let path = self.lease_path(address);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(NetError::State {
                action: "delete",
                path,
                source,
            }),
        }
    }

    /// Brings `address` up; on failure releases its lease so nothing leaks.
    fn bring_up(&self, address: Ipv4Addr) -> Result<(), NetError> {
        let Err(failure) = self.platform.add(address, self.runner.as_ref()) else {
            return Ok(());
        };
        let mut error = failure.into_add_error(address);
        if let Err(delete) = self.delete_lease(address)
            && let NetError::AliasAdd { detail, .. } = &mut error
        {
            detail.push_str(&format!(" (and deleting the lease failed too: {delete})"));
        }
        Err(error)
    }

    /// Takes `lease`'s alias down, then deletes the lease.
    fn reclaim(&self, lease: &Lease) -> Result<(), NetError> {
        self.platform
            .remove(lease.address, self.runner.as_ref())
            .map_err(|failure| failure.into_remove_error(lease.address))?;
        self.delete_lease(lease.address)
    }
}

fn validate_bottle(bottle: &str) -> Result<(), NetError> {
    let reason = if bottle.trim().is_empty() {
        "it is empty"
    } else if bottle.chars().any(char::is_control) {
        "it contains control characters"
    } else {
        return Ok(());
    };
    Err(NetError::InvalidBottle {
        name: bottle.to_string(),
        reason,
    })
}

/// Reads a lease file of any version this build understands.
fn parse_lease(bytes: &[u8], path: &Path, address: Ipv4Addr) -> Result<Lease, NetError> {
    let corrupt = |detail: String| NetError::LeaseCorrupt {
        path: path.to_path_buf(),
        address,
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| corrupt(format!("not JSON ({err})")))?;
    let version = value
        .get("version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| corrupt("no numeric \"version\" field".into()))?;
    match version {
        1 => {
            let file: LeaseFileV1 = serde_json::from_value(value)
                .map_err(|err| corrupt(format!("not a version 1 lease ({err})")))?;
            if file.bottle.trim().is_empty() {
                return Err(corrupt("\"bottle\" is empty".into()));
            }
            Ok(Lease {
                address,
                bottle: file.bottle,
                pid: file.pid,
                created: file.created,
            })
        }
        0 => Err(corrupt("version 0 does not exist".into())),
        newer => Err(NetError::LeaseVersion {
            path: path.to_path_buf(),
            version: newer,
            supported: LEASE_VERSION,
        }),
    }
}

fn unix_now() -> u64 {
    // A clock before 1970 is not worth failing an allocation for; the
    // timestamp is informational.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, 0, last)
    }

    #[test]
    fn default_pool_is_sixteen_addresses_everywhere() {
        let pool = AliasPool::default_for_platform();
        assert_eq!(pool.size(), 16);
        assert_eq!(pool.addresses().next(), Some(addr(16)));
        assert_eq!(pool.addresses().last(), Some(addr(31)));
        assert_eq!(
            AliasPool::widest_for(LoopbackPlatform::MacOs { sudo: true }),
            pool
        );
    }

    #[test]
    fn the_wide_linux_pool_skips_reserved_addresses() {
        let pool = AliasPool::widest_for(LoopbackPlatform::Linux);
        assert_eq!(pool.size(), 254 - 16 + 1 - 2);
        assert!(!pool.contains(addr(53)));
        assert!(!pool.contains(addr(54)));
        assert!(pool.contains(addr(55)));
        assert!(pool.addresses().all(|a| a != addr(53) && a != addr(54)));
    }

    #[test]
    fn pools_must_be_private_loopback() {
        let cases = [
            (addr(31), addr(16), "after the last"),
            (addr(1), addr(31), "127.0.0.1"),
            (addr(0), addr(5), "127.0.0.1"),
            (
                Ipv4Addr::new(10, 0, 0, 16),
                Ipv4Addr::new(10, 0, 0, 31),
                "127.0.0.0/8",
            ),
            (addr(16), Ipv4Addr::new(128, 0, 0, 1), "127.0.0.0/8"),
            (addr(53), addr(54), "reserved"),
        ];
        for (first, last, want) in cases {
            let err = AliasPool::new(first..=last).unwrap_err();
            assert!(matches!(err, NetError::InvalidPool { .. }));
            assert!(err.to_string().contains(want), "{first}-{last}: {err}");
        }
        let pool =
            AliasPool::new(Ipv4Addr::new(127, 0, 1, 0)..=Ipv4Addr::new(127, 0, 1, 2)).unwrap();
        assert_eq!(pool.size(), 2);
    }

    #[test]
    fn reads_lease_version_1() {
        let text =
            br#"{ "version": 1, "bottle": "bot-bottle-a", "pid": 4242, "created": 1767225600 }"#;
        let lease = parse_lease(text, Path::new("x.json"), addr(20)).unwrap();
        assert_eq!(
            lease,
            Lease {
                address: addr(20),
                bottle: "bot-bottle-a".into(),
                pid: 4242,
                created: 1_767_225_600,
            }
        );
    }

    #[test]
    fn refuses_newer_and_malformed_leases() {
        let path = Path::new("/s/net/leases/127.0.0.20.json");
        let newer = br#"{ "version": 2, "bottle": "b", "pid": 1, "created": 1, "extra": true }"#;
        let err = parse_lease(newer, path, addr(20)).unwrap_err();
        assert!(
            matches!(err, NetError::LeaseVersion { version: 2, .. }),
            "{err}"
        );

        for bad in [
            &b"{"[..],
            br#"{"bottle":"b"}"#,
            br#"{"version":"1","bottle":"b","pid":1,"created":1}"#,
            br#"{"version":1,"bottle":"b","pid":-1,"created":1}"#,
            br#"{"version":1,"bottle":"","pid":1,"created":1}"#,
            br#"{"version":0}"#,
        ] {
            let err = parse_lease(bad, path, addr(20)).unwrap_err();
            assert!(matches!(err, NetError::LeaseCorrupt { .. }), "{err}");
            assert!(err.to_string().contains(&path.display().to_string()));
        }
    }

    #[test]
    fn alias_cidr_is_a_slash_32() {
        let alias = Alias {
            address: addr(17),
            bottle: "b".into(),
            reused: false,
        };
        assert_eq!(alias.cidr().to_string(), "127.0.0.17/32");
    }

    #[test]
    fn bottle_names_are_checked() {
        assert!(validate_bottle("bot-bottle-a").is_ok());
        assert!(validate_bottle(" ").is_err());
        assert!(validate_bottle("a\nb").is_err());
    }
}
