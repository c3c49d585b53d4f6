//! The warm pool, for every backend: bottles of an agent launched ahead of
//! `bottle start`, every check of a cold launch passed, nothing of the
//! agent running, and handed out to a `start` after a second check of what
//! could have changed while they waited.
//!
//! An entry is an ordinary detached bottle with a name of its own
//! (`<agent>-pool-<hex>`: a claimed bottle keeps it) and three files in its
//! state dir:
//!
//! - `pool.json` ([`PoolRecord`]): the fingerprint of everything the
//!   bottle was made from, and the facts its backend recorded at fill;
//! - `pool-ready`: present while the entry waits, written last;
//! - `pool-claimed` ([`ClaimRecord`]): who took it (a `start`, attached or
//!   detached, or a `drain`/`cleanup`) and how long the re-check took. It
//!   is hard-linked into place, which fails when it exists, so of two
//!   `start`s racing for one entry exactly one wins and the other moves
//!   on; a taker that dies right after is an owner `cleanup` can judge.
//!
//! This module owns those files, the claim ([`claim`]: take, the checks
//! every backend shares, the backend's own re-check through [`PoolHost`],
//! the claim record), the drain, and the fingerprint's framing and
//! credentials key ([`Fingerprint`]). A backend offers the pool through
//! [`WarmPool`].

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use thiserror::Error;

use crate::backend::{
    BackendError, BackendErrorKind, BackendKind, Bottle, BottleLauncher, CleanupReport,
};
use crate::error::Coded;
use crate::files::{Flush, write_aside};
use crate::life::StateDir;
use crate::plan::{Plan, PlannedDevice};
use crate::process::Owner;
use crate::sandbox::ResetFiles;
use crate::slug::bottle_name;
use crate::spec::BottleSpec;

/// The version of the pool's files; an entry of another version is
/// discarded, never reused.
pub const POOL_LAYOUT_VERSION: u32 = 2;

/// The entry's record in its state dir.
pub const RECORD: &str = "pool.json";
/// Present while the entry waits.
pub const READY: &str = "pool-ready";
/// Who took the entry.
pub const CLAIMED: &str = "pool-claimed";
/// Every file the pool keeps in an entry's state dir, for a backend that
/// removes its bottle's files by name.
pub const FILES: [&str; 3] = [RECORD, READY, CLAIMED];

/// Between the agent's name and an entry's random suffix.
const ENTRY_INFIX: &str = "-pool-";
/// The key of the credentials' HMAC, in the state root, owner-only.
const FINGERPRINT_KEY: &str = "pool-fingerprint.key";

/// What went wrong with a pool's files.
#[derive(Debug, Error)]
pub enum PoolError {
    /// The file system refused.
    #[error("could not {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// To which path.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// An entry's record is not one this build reads or writes.
    #[error("pool record {path}: {detail}")]
    Record {
        /// The record's path.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
}

impl PoolError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PoolError {
        let path = path.to_path_buf();
        move |source| PoolError::Io {
            action,
            path,
            source,
        }
    }

    fn written(failure: crate::files::WriteFailure) -> PoolError {
        PoolError::Io {
            action: failure.action,
            path: failure.path,
            source: failure.source,
        }
    }
}

impl Coded for PoolError {
    fn code(&self) -> &'static str {
        match self {
            PoolError::Io { .. } => "BOT-S011",
            PoolError::Record { .. } => "BOT-S012",
        }
    }

    fn fix(&self) -> Option<String> {
        Some(match self {
            PoolError::Io { .. } => "check the state dir's owner and free space".into(),
            PoolError::Record { .. } => {
                "run `bottle pool drain <agent>` (or `bottle cleanup`) and fill the pool again"
                    .into()
            }
        })
    }
}

impl From<PoolError> for BackendError {
    fn from(err: PoolError) -> Self {
        BackendError::from_coded(BackendErrorKind::Failed, err)
    }
}

/// `pool.json`: what an entry was made from and how it stood when filled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    /// [`POOL_LAYOUT_VERSION`].
    pub version: u32,
    /// The manifest's agent.
    pub agent: String,
    /// The backend's [`WarmPool::pool_fingerprint`] at fill.
    pub fingerprint: String,
    /// RFC 3339 time it was filled.
    pub filled: String,
    /// What the backend recorded of the entry at fill, for its re-check at
    /// claim (beside the fields above, so each backend keeps its own).
    #[serde(flatten)]
    pub facts: serde_json::Map<String, serde_json::Value>,
}

impl PoolRecord {
    /// The record of an entry of `agent` made from `fingerprint`, filled
    /// now, with the backend's `facts` (which must encode as an object).
    pub fn new(
        agent: &str,
        fingerprint: &str,
        facts: &impl Serialize,
    ) -> Result<PoolRecord, PoolError> {
        let not_an_object = |detail: String| PoolError::Record {
            path: PathBuf::from(RECORD),
            detail,
        };
        let facts = match serde_json::to_value(facts) {
            Ok(serde_json::Value::Object(facts)) => facts,
            Ok(other) => return Err(not_an_object(format!("facts encode as {other}"))),
            Err(err) => return Err(not_an_object(err.to_string())),
        };
        Ok(PoolRecord {
            version: POOL_LAYOUT_VERSION,
            agent: agent.to_string(),
            fingerprint: fingerprint.to_string(),
            filled: crate::time::now_rfc3339_millis(),
            facts,
        })
    }

    /// The backend's facts, as its type `T` reads them (of the entry whose
    /// state dir is `dir`, for the error).
    pub fn facts<T: DeserializeOwned>(&self, dir: &Path) -> Result<T, PoolError> {
        serde_json::from_value(serde_json::Value::Object(self.facts.clone())).map_err(|err| {
            PoolError::Record {
                path: dir.join(RECORD),
                detail: err.to_string(),
            }
        })
    }
}

/// `pool-claimed`: who took an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// RFC 3339 time of the claim.
    pub claimed: String,
    /// The `bottle start` that claimed it.
    pub owner: Owner,
    /// Whether that start detached (then the bottle outlives it);
    /// otherwise `cleanup` treats the bottle as an orphan once its owner
    /// died.
    pub detached: bool,
    /// How long the claim's re-check took, in milliseconds.
    pub verify_ms: u64,
}

/// One entry as `bottle pool list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolEntry {
    /// The bottle's name.
    pub name: String,
    /// The backend that runs it.
    pub backend: BackendKind,
    /// The manifest's agent.
    pub agent: String,
    /// `ready`, or `claimed` once a `start` took it.
    pub state: String,
    /// When it was filled.
    pub filled: String,
}

/// A fresh entry's bottle name for `agent`, within the slug's length.
pub fn entry_name(agent: &str) -> Result<String, PoolError> {
    let random = random_bytes::<4>()?;
    let suffix = hex(&random);
    let room = crate::slug::MAX_SLUG_LEN - ENTRY_INFIX.len() - suffix.len();
    let stem: String = agent.chars().take(room).collect();
    Ok(format!(
        "{}{ENTRY_INFIX}{suffix}",
        stem.trim_end_matches('-')
    ))
}

/// Whether the bottle whose state dir is `state_dir` is a pool entry
/// waiting to be claimed.
pub fn is_ready(state_dir: &Path) -> bool {
    state_dir.join(READY).exists() && !state_dir.join(CLAIMED).exists()
}

/// Makes the bottle whose state dir is `state_dir` a waiting entry:
/// `record` first, then the ready marker, last, so an entry without a
/// complete record is never claimed.
pub fn mark_ready(state_dir: &Path, record: &PoolRecord) -> Result<(), PoolError> {
    let path = state_dir.join(RECORD);
    let json = serde_json::to_vec_pretty(record).map_err(|err| PoolError::Record {
        path: path.clone(),
        detail: err.to_string(),
    })?;
    write_aside(&path, &json, 0o600, Flush::No).map_err(PoolError::written)?;
    write_aside(&state_dir.join(READY), b"", 0o600, Flush::No).map_err(PoolError::written)
}

/// Takes the entry in `dir` for this process: its claim record is linked
/// into place, which fails if another process took it first, so of two
/// racing takers exactly one wins; the record names this process from the
/// first instant, so a taker that dies is an owner `cleanup` can judge.
/// `detached`: the taker's bottle outlives it.
pub fn take(dir: &Path, detached: bool) -> bool {
    if !is_ready(dir) {
        return false;
    }
    let owner = Owner::current();
    let record = ClaimRecord {
        claimed: crate::time::now_rfc3339_millis(),
        owner,
        detached,
        verify_ms: 0,
    };
    let Ok(json) = serde_json::to_vec_pretty(&record) else {
        return false;
    };
    let taker = dir.join(format!("{CLAIMED}.{}", owner.pid));
    if write_aside(&taker, &json, 0o600, Flush::No).is_err() {
        return false;
    }
    let won = std::fs::hard_link(&taker, dir.join(CLAIMED)).is_ok();
    let _ = std::fs::remove_file(&taker);
    if won {
        let _ = std::fs::remove_file(dir.join(READY));
    }
    won
}

/// The claim record of the bottle whose state dir is `state_dir`, if it
/// was a pool entry that a `start` claimed.
pub fn claim_record(state_dir: &Path) -> Option<ClaimRecord> {
    let text = std::fs::read(state_dir.join(CLAIMED)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The record of the entry whose state dir is `state_dir`.
pub fn read_record(state_dir: &Path) -> Result<PoolRecord, PoolError> {
    let path = state_dir.join(RECORD);
    let text = std::fs::read(&path).map_err(PoolError::io("read", &path))?;
    serde_json::from_slice(&text).map_err(|err| PoolError::Record {
        path: path.clone(),
        detail: err.to_string(),
    })
}

/// The facts a backend recorded of the waiting entry in `state_dir`, as
/// its type `T` reads them, or why they cannot be used: a record that
/// cannot be read, is of another layout, or holds facts of another shape.
/// What `cleanup` judges a waiting entry by.
pub fn recorded_facts<T: DeserializeOwned>(state_dir: &Path) -> Result<T, String> {
    let record = read_record(state_dir).map_err(|err| err.to_string())?;
    if record.version != POOL_LAYOUT_VERSION {
        return Err(format!("layout version {}", record.version));
    }
    record.facts(state_dir).map_err(|err| err.to_string())
}

/// The backend that runs the bottle of `state_dir`, as its life record
/// says (the one word on which backend owns a state dir).
pub fn backend_of(state_dir: &Path) -> Option<BackendKind> {
    let recorded = StateDir::new(state_dir).read().ok()??;
    Some(recorded.record.backend)
}

/// The entries of `backend` waiting under `state_root` (of `agent`, if
/// given), oldest first. Entries whose record cannot be read are left to
/// the backend's `cleanup`.
pub fn ready_entries(
    state_root: &Path,
    backend: BackendKind,
    agent: Option<&str>,
) -> Vec<(PathBuf, PoolRecord)> {
    let Ok(dirs) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, PoolRecord)> = dirs
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| is_ready(dir) && backend_of(dir) == Some(backend))
        .filter_map(|dir| read_record(&dir).ok().map(|record| (dir, record)))
        .filter(|(_, record)| agent.is_none_or(|agent| record.agent == agent))
        .collect();
    found.sort_by(|a, b| a.1.filled.cmp(&b.1.filled));
    found
}

/// Every pool entry under `state_root`, waiting or claimed, by name.
pub fn list(state_root: &Path) -> Vec<PoolEntry> {
    let Ok(dirs) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut entries: Vec<PoolEntry> = dirs
        .flatten()
        .map(|entry| entry.path())
        .filter_map(|dir| {
            let record = read_record(&dir).ok()?;
            let state = if is_ready(&dir) {
                "ready"
            } else if dir.join(CLAIMED).exists() {
                "claimed"
            } else {
                return None;
            };
            Some(PoolEntry {
                name: bottle_name(&dir.file_name()?.to_string_lossy()),
                backend: backend_of(&dir)?,
                agent: record.agent,
                state: state.to_string(),
                filled: record.filled,
            })
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// What a backend adds to a claim.
pub trait PoolHost {
    /// What a checked entry's bottle was launched from.
    type Plan;

    /// The backend whose entries this host claims.
    fn kind(&self) -> BackendKind;

    /// The backend's checks of the entry taken from `dir` (whose record is
    /// `record`, of this layout and fingerprint, never halted): what could
    /// have changed while it waited. Its plan when every one passed,
    /// otherwise why not.
    fn recheck(&self, dir: &Path, record: &PoolRecord) -> Result<Self::Plan, String>;

    /// The running bottle of a checked entry.
    fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError>;

    /// Stops the entry `name` a claim refused, or a drain took.
    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError>;
}

/// What a claim found.
pub struct Claim<P> {
    /// The bottle handed out, and its plan, if an entry passed every check.
    pub bottle: Option<(Box<dyn Bottle>, Box<P>)>,
    /// The entries refused (and removed) on the way, each with why.
    pub refused: Vec<(String, String)>,
}

/// Claims a ready entry of `agent` under `state_root` made from
/// `fingerprint`, checking it again first: its layout and fingerprint,
/// that no reset halted it, and `host`'s checks. Every entry that fails a
/// check is stopped (what cannot be removed is left to `bottle cleanup`:
/// its ready marker is gone, so no one claims it) and named in
/// [`Claim::refused`]. `detached`: the claiming `start` detaches.
pub fn claim<H: PoolHost>(
    host: &H,
    state_root: &Path,
    agent: &str,
    fingerprint: &str,
    detached: bool,
) -> Result<Claim<H::Plan>, PoolError> {
    let mut claim = Claim {
        bottle: None,
        refused: Vec::new(),
    };
    for (dir, record) in ready_entries(state_root, host.kind(), Some(agent)) {
        let started = Instant::now();
        if !take(&dir, detached) {
            continue;
        }
        let name = bottle_name(&dir.file_name().unwrap_or_default().to_string_lossy());
        let checked = shared_checks(&dir, &record, fingerprint)
            .and_then(|()| host.recheck(&dir, &record))
            .and_then(|plan| {
                host.attach(&name)
                    .map(|bottle| (bottle, plan))
                    .map_err(|err| err.to_string())
            });
        let (bottle, plan) = match checked {
            Ok(checked) => checked,
            Err(why) => {
                let _ = host.stop(&name);
                claim.refused.push((name, why));
                continue;
            }
        };
        // The same owner and mode as taken; the check's time added.
        let record = ClaimRecord {
            claimed: crate::time::now_rfc3339_millis(),
            owner: Owner::current(),
            detached,
            verify_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        let path = dir.join(CLAIMED);
        let json = serde_json::to_vec_pretty(&record).map_err(|err| PoolError::Record {
            path: path.clone(),
            detail: err.to_string(),
        })?;
        write_aside(&path, &json, 0o600, Flush::No).map_err(PoolError::written)?;
        claim.bottle = Some((bottle, Box::new(plan)));
        return Ok(claim);
    }
    Ok(claim)
}

/// Whether `what` stands now (`now`) as it stood at fill (`at_fill`); the
/// first fact that differs otherwise.
pub fn stands_as_filled(
    what: &str,
    at_fill: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Result<(), String> {
    let names = at_fill.keys().chain(now.keys());
    for name in names {
        let (before, after) = (at_fill.get(name), now.get(name));
        if before != after {
            let shown =
                |value: Option<&String>| value.map_or("nothing", |v| v.as_str()).to_string();
            return Err(format!(
                "the {what}'s {name} changed since it was filled (then {}, now {})",
                shown(before),
                shown(after)
            ));
        }
    }
    Ok(())
}

/// The checks of a taken entry every backend makes first.
fn shared_checks(dir: &Path, record: &PoolRecord, fingerprint: &str) -> Result<(), String> {
    if record.version != POOL_LAYOUT_VERSION {
        return Err(format!("its layout version is {}", record.version));
    }
    if record.fingerprint != fingerprint {
        return Err(
            "it was made from another manifest, image or binary (its fingerprint differs)".into(),
        );
    }
    if let Some(halt) = crate::sandbox::reset::halted(&ResetFiles::new(dir)) {
        return Err(format!("it was halted: {}", halt.reason));
    }
    Ok(())
}

/// Removes the waiting entries under `state_root` (of `agent`, if given):
/// each is taken like a claim first, so a `start` cannot be handed one
/// being removed.
pub fn drain<H: PoolHost>(
    host: &H,
    state_root: &Path,
    agent: Option<&str>,
) -> Result<CleanupReport, BackendError> {
    let mut report = CleanupReport::default();
    for (dir, _) in ready_entries(state_root, host.kind(), agent) {
        if !take(&dir, false) {
            continue;
        }
        let name = bottle_name(&dir.file_name().unwrap_or_default().to_string_lossy());
        report.merge(host.stop(&name)?);
    }
    Ok(report)
}

/// A backend that keeps a warm pool.
pub trait WarmPool: BottleLauncher {
    /// The fingerprint of everything a bottle of `spec` with `devices` is
    /// made from: two equal fingerprints mean a cold start would launch
    /// the same bottle.
    fn pool_fingerprint(
        &self,
        spec: &BottleSpec,
        devices: &[PlannedDevice],
    ) -> Result<String, BackendError>;

    /// Makes the freshly launched bottle of `plan` a waiting entry made
    /// from `fingerprint` ([`mark_ready`] with the backend's facts).
    fn mark_pooled(
        &self,
        plan: &Plan<Self::PlanData>,
        fingerprint: &str,
    ) -> Result<(), BackendError>;

    /// [`claim`] on this backend.
    fn claim_pooled(
        &self,
        agent: &str,
        fingerprint: &str,
        detached: bool,
    ) -> Result<Claim<Plan<Self::PlanData>>, BackendError>;

    /// [`drain`] on this backend.
    fn drain_pool(&self, agent: Option<&str>) -> Result<CleanupReport, BackendError>;
}

/// The fingerprint's hash: named fields, each framed by its length, so no
/// two different inputs hash alike; the pool's layout is always the first.
pub struct Fingerprint {
    hash: Sha256,
}

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint::new()
    }
}

impl Fingerprint {
    /// A fingerprint of this pool layout.
    pub fn new() -> Fingerprint {
        let mut fingerprint = Fingerprint {
            hash: Sha256::new(),
        };
        fingerprint.field("pool-layout", &POOL_LAYOUT_VERSION.to_le_bytes());
        fingerprint
    }

    /// Adds `value` under `name`.
    pub fn field(&mut self, name: &str, value: &[u8]) {
        self.hash.update((name.len() as u64).to_le_bytes());
        self.hash.update(name.as_bytes());
        self.hash.update((value.len() as u64).to_le_bytes());
        self.hash.update(value);
    }

    /// Adds the file at `path` by what identifies it without reading it:
    /// its path, size, inode and modification time (hashing a 15 MB binary
    /// at every claim would cost more than the claim).
    pub fn file(&mut self, name: &str, path: &Path) -> Result<(), PoolError> {
        let meta = std::fs::metadata(path).map_err(PoolError::io("read the metadata of", path))?;
        let identity = format!(
            "{}:{}:{}:{}:{}",
            path.display(),
            meta.len(),
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec()
        );
        self.field(name, identity.as_bytes());
        Ok(())
    }

    /// Adds what every backend's bottle of `spec` with `devices` is made
    /// from: the manifest's agent (paths resolved), the upstream trust,
    /// the base dir, the devices, the prompt's and skills' contents, and
    /// this `bottle` binary.
    pub fn spec(&mut self, spec: &BottleSpec, devices: &[PlannedDevice]) -> Result<(), PoolError> {
        self.field("agent", &encoded(&spec.agent)?);
        self.field("upstream-trust", spec.upstream_trust.to_string().as_bytes());
        self.field("base-dir", spec.base_dir.as_os_str().as_encoded_bytes());
        self.field("devices", &encoded(&devices)?);
        if let Some(prompt) = &spec.agent.prompt {
            self.contents("prompt", &spec.resolve(prompt))?;
        }
        for skill in &spec.agent.skills {
            self.contents("skill", &spec.resolve(skill))?;
        }
        if let Ok(exe) = std::env::current_exe() {
            self.file("bottle-binary", &exe)?;
        }
        Ok(())
    }

    /// Adds the contents of the file or directory tree at `path`: each
    /// entry's relative path and kind, a file's bytes, a link's target.
    pub fn contents(&mut self, name: &str, path: &Path) -> Result<(), PoolError> {
        let mut hash = Sha256::new();
        hash_contents(path, Path::new(""), &mut hash)?;
        self.field(name, &hash.finalize());
        Ok(())
    }

    /// Adds a credential's value as its HMAC under the state root's key
    /// ([`credentials_key`]), so the record does not let anyone test
    /// guesses.
    pub fn credential(&mut self, key: &[u8], value: &[u8]) {
        self.field("credential", &hmac_sha256(key, value));
    }

    /// `sha256:<hex>` of every field added.
    pub fn finish(self) -> String {
        format!("sha256:{}", hex(&self.hash.finalize()))
    }
}

/// `value` as JSON, for the fingerprint.
fn encoded<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, PoolError> {
    serde_json::to_vec(value).map_err(|err| PoolError::Record {
        path: PathBuf::from(RECORD),
        detail: format!("cannot encode the fingerprint's input: {err}"),
    })
}

/// Hashes `root/relative` into `hash`, a directory's entries in name
/// order.
fn hash_contents(root: &Path, relative: &Path, hash: &mut Sha256) -> Result<(), PoolError> {
    // `root.join("")` would end in a slash, which a file's path must not.
    let path = if relative.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(relative)
    };
    let meta = std::fs::symlink_metadata(&path).map_err(PoolError::io("read", &path))?;
    let mut frame = |kind: &str, bytes: &[u8]| {
        let name = relative.as_os_str().as_encoded_bytes();
        for part in [name, kind.as_bytes(), bytes] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
    };
    if meta.is_symlink() {
        let target = std::fs::read_link(&path).map_err(PoolError::io("read", &path))?;
        frame("link", target.as_os_str().as_encoded_bytes());
    } else if meta.is_dir() {
        frame("dir", b"");
        let mut names: Vec<_> = std::fs::read_dir(&path)
            .and_then(|entries| entries.map(|e| e.map(|e| e.file_name())).collect())
            .map_err(PoolError::io("list", &path))?;
        names.sort();
        for name in names {
            hash_contents(root, &relative.join(name), hash)?;
        }
    } else {
        let bytes = std::fs::read(&path).map_err(PoolError::io("read", &path))?;
        frame("file", &Sha256::digest(&bytes));
    }
    Ok(())
}

/// The state root's secret for the credentials' HMAC, made on first use.
pub fn credentials_key(state_root: &Path) -> Result<Vec<u8>, PoolError> {
    let path = state_root.join(FINGERPRINT_KEY);
    if let Ok(key) = std::fs::read(&path)
        && key.len() == 32
    {
        return Ok(key);
    }
    let key = random_bytes::<32>()?.to_vec();
    std::fs::create_dir_all(state_root).map_err(PoolError::io("create", state_root))?;
    write_aside(&path, &key, 0o600, Flush::No).map_err(PoolError::written)?;
    Ok(key)
}

fn random_bytes<const N: usize>() -> Result<[u8; N], PoolError> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(PoolError::io("read", Path::new("/dev/urandom")))?;
    Ok(bytes)
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct BoxFacts {
        started_at: String,
    }

    fn record(agent: &str, fingerprint: &str) -> PoolRecord {
        let facts = BoxFacts {
            started_at: "2026-11-24T11:00:00Z".into(),
        };
        PoolRecord::new(agent, fingerprint, &facts).unwrap()
    }

    /// Lays out a docker entry `slug` under `root`, waiting (`ready`) or
    /// claimed.
    fn entry(root: &Path, slug: &str, record: &PoolRecord, ready: bool) -> PathBuf {
        entry_of(BackendKind::Docker, root, slug, record, ready)
    }

    fn entry_of(
        backend: BackendKind,
        root: &Path,
        slug: &str,
        record: &PoolRecord,
        ready: bool,
    ) -> PathBuf {
        let dir = root.join(slug);
        std::fs::create_dir_all(&dir).unwrap();
        let life = StateDir::new(&dir);
        life.begin(&crate::life::BottleRecord::launching(
            &bottle_name(slug),
            &record.agent,
            backend,
        ))
        .unwrap();
        life.advance(crate::life::Phase::Running).unwrap();
        if ready {
            mark_ready(&dir, record).unwrap();
        } else {
            let json = serde_json::to_vec(record).unwrap();
            std::fs::write(dir.join(RECORD), json).unwrap();
            std::fs::write(dir.join(CLAIMED), b"{}").unwrap();
        }
        dir
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn entry_names_are_valid_slugs_of_the_agent() {
        let name = entry_name("demo").unwrap();
        assert!(name.starts_with("demo-pool-"), "{name}");
        assert_eq!(crate::slug::slugify(&name).unwrap(), name);
        let long = entry_name(&"a".repeat(60)).unwrap();
        assert_eq!(long.len(), crate::slug::MAX_SLUG_LEN);
        assert_eq!(crate::slug::slugify(&long).unwrap(), long);
        assert_ne!(entry_name("demo").unwrap(), entry_name("demo").unwrap());
    }

    #[test]
    fn a_backends_facts_sit_beside_the_shared_fields_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let written = record("demo", "sha256:x");
        mark_ready(dir.path(), &written).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(RECORD)).unwrap()).unwrap();
        assert_eq!(json["started_at"], "2026-11-24T11:00:00Z");
        assert_eq!(json["agent"], "demo");
        let read = read_record(dir.path()).unwrap();
        assert_eq!(read, written);
        assert_eq!(
            read.facts::<BoxFacts>(dir.path()).unwrap().started_at,
            "2026-11-24T11:00:00Z"
        );
        // Facts of another backend's shape are a record this one cannot read.
        #[derive(Debug, Deserialize)]
        struct Other {
            #[expect(dead_code, reason = "only its absence is tested")]
            pid: u32,
        }
        let err = read.facts::<Other>(dir.path()).unwrap_err();
        assert_eq!(err.code(), "BOT-S012");
        assert!(err.to_string().contains("pool.json"), "{err}");
        // What cleanup reads: the facts, or why they cannot be used.
        assert_eq!(
            recorded_facts::<BoxFacts>(dir.path()).unwrap(),
            read.facts::<BoxFacts>(dir.path()).unwrap()
        );
        assert!(
            recorded_facts::<Other>(dir.path())
                .unwrap_err()
                .contains("pool.json")
        );
        let mut old = read.clone();
        old.version = POOL_LAYOUT_VERSION - 1;
        mark_ready(dir.path(), &old).unwrap();
        assert_eq!(
            recorded_facts::<BoxFacts>(dir.path()),
            Err(format!("layout version {}", POOL_LAYOUT_VERSION - 1))
        );
        // Facts must be an object to sit beside the fields.
        assert!(PoolRecord::new("demo", "sha256:x", &7).is_err());
    }

    #[test]
    fn of_two_takers_one_wins_and_is_named_in_the_record() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!take(dir.path(), true), "nothing waits yet");
        mark_ready(dir.path(), &record("demo", "sha256:x")).unwrap();
        assert!(is_ready(dir.path()));
        assert!(take(dir.path(), true));
        assert!(!take(dir.path(), false), "taken twice");
        assert!(!is_ready(dir.path()));
        let claimed = claim_record(dir.path()).unwrap();
        assert_eq!(claimed.owner, Owner::current());
        assert!(claimed.detached);
        // A taker that died between the link and removing the marker left
        // both: the entry is taken all the same.
        std::fs::write(dir.path().join(READY), b"").unwrap();
        assert!(!is_ready(dir.path()));
        assert!(!take(dir.path(), false));
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names, [CLAIMED, READY, RECORD]);
    }

    #[test]
    fn only_ready_entries_with_a_record_are_claimable_and_listed_by_state() {
        let root = tempfile::tempdir().unwrap();
        entry(root.path(), "demo-pool-1", &record("demo", "f"), true);
        entry(root.path(), "demo-pool-2", &record("demo", "f"), false);
        entry(root.path(), "other-pool-1", &record("other", "f"), true);
        entry_of(
            BackendKind::Smolmachines,
            root.path(),
            "demo-pool-3",
            &record("demo", "f"),
            true,
        );
        std::fs::create_dir_all(root.path().join("plain")).unwrap();
        let docker = BackendKind::Docker;
        let ready: Vec<String> = ready_entries(root.path(), docker, Some("demo"))
            .into_iter()
            .map(|(dir, _)| dir.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(ready, ["demo-pool-1"]);
        assert_eq!(ready_entries(root.path(), docker, None).len(), 2);
        let microvm = ready_entries(root.path(), BackendKind::Smolmachines, None);
        assert_eq!(microvm.len(), 1);
        assert!(microvm[0].0.ends_with("demo-pool-3"));
        let listed: Vec<(String, BackendKind, String)> = list(root.path())
            .into_iter()
            .map(|e| (e.name, e.backend, e.state))
            .collect();
        assert_eq!(
            listed,
            [
                ("bot-bottle-demo-pool-1".into(), docker, "ready".into()),
                ("bot-bottle-demo-pool-2".into(), docker, "claimed".into()),
                (
                    "bot-bottle-demo-pool-3".into(),
                    BackendKind::Smolmachines,
                    "ready".into()
                ),
                ("bot-bottle-other-pool-1".into(), docker, "ready".into()),
            ]
        );
    }

    /// A backend whose re-check refuses the entries it is told to, and
    /// that records what it stopped.
    #[derive(Default)]
    struct Host {
        refuse: Vec<&'static str>,
        stopped: RefCell<Vec<String>>,
    }

    struct NoBottle(String);

    impl Bottle for NoBottle {
        fn name(&self) -> &str {
            &self.0
        }
        fn exec(&self, _: &[String]) -> Result<crate::backend::ExecOutput, BackendError> {
            unimplemented!("not run by a claim")
        }
        fn exec_interactive(&self, _: &[String]) -> Result<i32, BackendError> {
            unimplemented!("not run by a claim")
        }
        fn exec_piped(&self, _: &[String]) -> Result<i32, BackendError> {
            unimplemented!("not run by a claim")
        }
        fn copy_in(
            &self,
            _: &crate::copy::CopyIn,
            _: &crate::copy::GuestPath,
        ) -> Result<(), BackendError> {
            unimplemented!("not run by a claim")
        }
        fn copy_out(
            &self,
            _: &crate::copy::GuestPath,
            _: &mut dyn std::io::Write,
        ) -> Result<(), BackendError> {
            unimplemented!("not run by a claim")
        }
        fn execute(
            &self,
            _: &crate::sandbox::ToolCall,
        ) -> Result<crate::sandbox::ToolResult, crate::sandbox::SandboxError> {
            unimplemented!("not run by a claim")
        }
        fn reset(&self) -> Result<crate::sandbox::ResetReport, crate::sandbox::SandboxError> {
            unimplemented!("not run by a claim")
        }
        fn prepare_reset(&self) -> Result<String, BackendError> {
            unimplemented!("not run by a claim")
        }
        fn commit(&self, _: &str) -> Result<crate::backend::CommitReport, BackendError> {
            unimplemented!("not run by a claim")
        }
        fn connect_port(&self, _: u16) -> Result<crate::sandbox::ToolboxStream, BackendError> {
            unimplemented!("not run by a claim")
        }
    }

    impl PoolHost for Host {
        type Plan = String;

        fn kind(&self) -> BackendKind {
            BackendKind::Docker
        }

        fn recheck(&self, dir: &Path, _: &PoolRecord) -> Result<String, String> {
            let slug = dir.file_name().unwrap().to_string_lossy().to_string();
            if self.refuse.contains(&slug.as_str()) {
                return Err("its box restarted".into());
            }
            Ok(slug)
        }

        fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError> {
            Ok(Box::new(NoBottle(name.to_string())))
        }

        fn stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
            self.stopped.borrow_mut().push(name.to_string());
            Ok(CleanupReport {
                removed: vec![name.to_string()],
                ..CleanupReport::default()
            })
        }
    }

    #[test]
    fn a_claim_takes_the_oldest_entry_that_passes_and_removes_each_it_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut older = record("demo", "f");
        older.filled = "2026-11-24T10:00:00Z".into();
        let mut other_make = record("demo", "g");
        other_make.filled = "2026-11-24T10:00:01Z".into();
        let mut restarted = record("demo", "f");
        restarted.filled = "2026-11-24T10:00:02Z".into();
        let mut halted = record("demo", "f");
        halted.filled = "2026-11-24T10:00:03Z".into();
        let mut good = record("demo", "f");
        good.filled = "2026-11-24T10:00:04Z".into();
        let mut old_layout = older.clone();
        old_layout.version = POOL_LAYOUT_VERSION + 1;
        entry(root.path(), "demo-pool-0", &old_layout, true);
        entry(root.path(), "demo-pool-1", &other_make, true);
        entry(root.path(), "demo-pool-2", &restarted, true);
        let halted_dir = entry(root.path(), "demo-pool-3", &halted, true);
        std::fs::write(
            ResetFiles::new(&halted_dir).halted(),
            br#"{"time":"2026-11-24T10:00:05Z","reason":"the filesystem differs"}"#,
        )
        .unwrap();
        let good_dir = entry(root.path(), "demo-pool-4", &good, true);
        entry(root.path(), "demo-pool-5", &record("demo", "f"), true);
        let mut microvm = record("demo", "f");
        microvm.filled = "2026-11-24T09:00:00Z".into();
        let microvm_dir = entry_of(
            BackendKind::Smolmachines,
            root.path(),
            "demo-pool-6",
            &microvm,
            true,
        );

        let host = Host {
            refuse: vec!["demo-pool-2"],
            ..Host::default()
        };
        let claim = claim(&host, root.path(), "demo", "f", true).unwrap();
        let (bottle, plan) = claim.bottle.expect("an entry passed");
        assert_eq!(bottle.name(), "bot-bottle-demo-pool-4");
        assert_eq!(*plan, "demo-pool-4");
        let refused: Vec<(&str, &str)> = claim
            .refused
            .iter()
            .map(|(name, why)| (name.as_str(), why.as_str()))
            .collect();
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert_eq!(refused[0].0, "bot-bottle-demo-pool-0");
        assert!(refused[0].1.contains("layout version"), "{refused:?}");
        assert!(refused[1].1.contains("fingerprint differs"), "{refused:?}");
        assert_eq!(refused[2].1, "its box restarted");
        assert!(refused[3].1.contains("halted"), "{refused:?}");
        assert_eq!(
            *host.stopped.borrow(),
            [0, 1, 2, 3].map(|n| format!("bot-bottle-demo-pool-{n}"))
        );
        let claimed = claim_record(&good_dir).unwrap();
        assert!(claimed.detached);
        assert_eq!(claimed.owner, Owner::current());
        assert!(!is_ready(&good_dir));
        // The newest stays for the next start; another backend's is not
        // this backend's to take, however old.
        assert!(is_ready(&root.path().join("demo-pool-5")));
        assert!(is_ready(&microvm_dir));
    }

    #[test]
    fn a_drain_takes_each_waiting_entry_of_the_agent_before_stopping_it() {
        let root = tempfile::tempdir().unwrap();
        let waiting = entry(root.path(), "demo-pool-1", &record("demo", "f"), true);
        entry(root.path(), "demo-pool-2", &record("demo", "f"), false);
        entry(root.path(), "other-pool-1", &record("other", "f"), true);
        let host = Host::default();
        let report = drain(&host, root.path(), Some("demo")).unwrap();
        assert_eq!(report.removed, ["bot-bottle-demo-pool-1"]);
        assert_eq!(*host.stopped.borrow(), ["bot-bottle-demo-pool-1"]);
        let taken = claim_record(&waiting).unwrap();
        assert!(!taken.detached);
        assert!(is_ready(&root.path().join("other-pool-1")));
    }

    #[test]
    fn a_fingerprint_frames_its_fields_and_keys_credentials_per_state_root() {
        let finish = |fields: &[(&str, &[u8])]| {
            let mut fingerprint = Fingerprint::new();
            for (name, value) in fields {
                fingerprint.field(name, value);
            }
            fingerprint.finish()
        };
        assert_ne!(finish(&[("a", b"bc")]), finish(&[("ab", b"c")]));
        assert_eq!(finish(&[("a", b"b")]), finish(&[("a", b"b")]));
        let root = tempfile::tempdir().unwrap();
        let key = credentials_key(root.path()).unwrap();
        assert_eq!(key.len(), 32);
        assert_eq!(credentials_key(root.path()).unwrap(), key, "kept");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(credentials_key(other.path()).unwrap(), key);
        let mut keyed = Fingerprint::new();
        keyed.credential(&key, b"secret");
        let mut plain = Fingerprint::new();
        plain.field("credential", b"secret");
        assert_ne!(keyed.finish(), plain.finish());
    }

    #[test]
    fn a_trees_contents_change_its_fingerprint_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let skill = dir.path().join("skill");
        std::fs::create_dir_all(skill.join("sub")).unwrap();
        std::fs::write(skill.join("sub").join("SKILL.md"), "one").unwrap();
        std::os::unix::fs::symlink("sub/SKILL.md", skill.join("link")).unwrap();
        let of = |path: &Path| {
            let mut fingerprint = Fingerprint::new();
            fingerprint.contents("skill", path).unwrap();
            fingerprint.finish()
        };
        let before = of(&skill);
        // Touching a file (its time) is no change.
        let file = std::fs::File::options()
            .append(true)
            .open(skill.join("sub").join("SKILL.md"))
            .unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH)
            .unwrap();
        assert_eq!(of(&skill), before);
        std::fs::write(skill.join("sub").join("SKILL.md"), "two").unwrap();
        let edited = of(&skill);
        assert_ne!(edited, before);
        std::fs::rename(skill.join("sub"), skill.join("other")).unwrap();
        assert_ne!(of(&skill), edited, "a renamed entry");
        let prompt = dir.path().join("prompt.md");
        std::fs::write(&prompt, "do it").unwrap();
        let of_prompt = of(&prompt);
        std::fs::write(&prompt, "do it now").unwrap();
        assert_ne!(of(&prompt), of_prompt, "a file's own contents");
        assert!(matches!(
            Fingerprint::new().contents("skill", &dir.path().join("absent")),
            Err(PoolError::Io { .. })
        ));
    }

    #[test]
    fn a_standing_that_changed_names_its_first_difference() {
        let of = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let filled = of(&[("networks", "a=1"), ("started_at", "t0")]);
        assert_eq!(stands_as_filled("bundle", &filled, &filled), Ok(()));
        let restarted = of(&[("networks", "a=1"), ("started_at", "t1")]);
        assert_eq!(
            stands_as_filled("bundle", &filled, &restarted),
            Err("the bundle's started_at changed since it was filled (then t0, now t1)".into())
        );
        let grown = of(&[("networks", "a=1"), ("started_at", "t0"), ("x", "1")]);
        assert!(
            stands_as_filled("bundle", &filled, &grown)
                .unwrap_err()
                .contains("then nothing, now 1")
        );
    }
}
