//! One bottle's life on the host, for every backend: the record in its
//! state dir (`<state root>/<slug>/bottle.json`, [`BottleRecord`]) saying
//! which backend runs it, which process launched it and where its life is
//! ([`Phase`]). A launch writes it before it creates anything and advances
//! it; `list`, `stop` and `cleanup` read it whatever the backend.
//!
//! What a backend resolved for the bottle (docker's `plan.json`, the
//! microVM's `smolvm.json`) stays the backend's own file beside it.
//!
//! State dirs written before the record existed are read from the files
//! they had instead ([`legacy`]) and say so ([`Recorded::legacy`]); the
//! first change of phase writes the record.

pub mod legacy;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::backend::BackendKind;
use crate::error::Coded;
use crate::files::Flush;
use crate::process::Owner;

/// The record's file name in a state dir.
pub const RECORD_FILE: &str = "bottle.json";

/// The version of [`BottleRecord`] this build writes and reads.
pub const RECORD_VERSION: u32 = 1;

/// Where a bottle's life is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Its launch is creating it.
    Launching,
    /// Its launch completed.
    Running,
    /// Its stop began: what is left goes, and nothing of it runs again.
    Stopping,
}

impl Phase {
    /// The phase's name as the record spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Launching => "launching",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
        }
    }

    /// Whether a bottle in this phase may move to `next`: a launch
    /// completes once, any bottle may begin to stop, and a stopping
    /// bottle stays stopping (recording it again is no change).
    pub fn can_become(self, next: Phase) -> bool {
        matches!(
            (self, next),
            (Phase::Launching, Phase::Running) | (_, Phase::Stopping)
        )
    }

    /// Whether its launch completed: what `cleanup` must not take for a
    /// crashed launch.
    pub fn launch_completed(self) -> bool {
        self != Phase::Launching
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a state dir records of its bottle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BottleRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// `bot-bottle-<slug>`.
    pub bottle: String,
    /// The agent's name in the manifest.
    pub agent: String,
    /// The backend that runs it.
    pub backend: BackendKind,
    /// The process that launched it.
    pub owner: Owner,
    /// Where its life is.
    pub phase: Phase,
    /// When its launch began (RFC 3339), when known.
    pub created: Option<String>,
}

impl BottleRecord {
    /// The record of a launch beginning now in this process.
    pub fn launching(bottle: &str, agent: &str, backend: BackendKind) -> BottleRecord {
        BottleRecord {
            version: RECORD_VERSION,
            bottle: bottle.to_string(),
            agent: agent.to_string(),
            backend,
            owner: Owner::current(),
            phase: Phase::Launching,
            created: Some(crate::time::now_rfc3339()),
        }
    }

    /// A launch still under way: not complete, and its process runs.
    pub fn in_flight(&self) -> bool {
        self.phase == Phase::Launching && self.owner.is_alive()
    }

    /// A launch that never completed and whose process is gone.
    pub fn abandoned(&self) -> bool {
        self.phase == Phase::Launching && !self.owner.is_alive()
    }
}

/// A record as read from a state dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The record.
    pub record: BottleRecord,
    /// Read from the files of a state dir written before `bottle.json`
    /// existed ([`legacy`]).
    pub legacy: bool,
}

/// A bottle's state as `list` shows it, saying when its state dir is of
/// the layout before `bottle.json` (read all the same).
pub fn with_layout(state: String, legacy: bool) -> String {
    if legacy {
        format!("{state} (earlier state layout)")
    } else {
        state
    }
}

/// A bottle's record could not be read, written or changed.
#[derive(Debug, Error)]
pub enum RecordError {
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
    /// The record is not one this build reads.
    #[error("{path} is not a bottle record this bottle reads: {detail}")]
    Unreadable {
        /// The record's path.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The change asked for is not one the bottle's phase allows.
    #[error("the bottle of {dir} is {from}: it cannot become {to}")]
    Transition {
        /// The state dir.
        dir: PathBuf,
        /// Its recorded phase.
        from: Phase,
        /// The phase asked for.
        to: Phase,
    },
    /// The state dir records no bottle, in any layout.
    #[error("{dir} records no bottle")]
    Missing {
        /// The state dir.
        dir: PathBuf,
    },
}

impl Coded for RecordError {
    fn code(&self) -> &'static str {
        match self {
            RecordError::Io { .. } => "BOT-S008",
            RecordError::Unreadable { .. } | RecordError::Missing { .. } => "BOT-S009",
            RecordError::Transition { .. } => "BOT-S010",
        }
    }

    fn fix(&self) -> Option<String> {
        Some(match self {
            RecordError::Io { .. } => {
                "check the state dir's owner and free space, then try again".into()
            }
            RecordError::Unreadable { .. } | RecordError::Missing { .. } => {
                "`bottle cleanup` removes what is left of a bottle whose record is gone; a record written by a newer bottle needs that bottle".into()
            }
            RecordError::Transition { .. } => {
                "see `bottle list`; a stopping bottle is only ever removed (`bottle stop` or `bottle cleanup`)".into()
            }
        })
    }
}

/// One bottle's state dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state dir at `root`.
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// The state dir of the bottle `slug` under `state_root`.
    pub fn of(state_root: &Path, slug: &str) -> StateDir {
        StateDir::new(state_root.join(slug))
    }

    /// The dir itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `bottle.json`.
    pub fn record_path(&self) -> PathBuf {
        self.root.join(RECORD_FILE)
    }

    /// The bottle's record: `bottle.json`, or what a state dir of the
    /// earlier layout records; `None` when the dir records no bottle.
    pub fn read(&self) -> Result<Option<Recorded>, RecordError> {
        let path = self.record_path();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Ok(legacy::read(&self.root).map(|record| Recorded {
                    record,
                    legacy: true,
                }));
            }
            Err(source) => {
                return Err(RecordError::Io {
                    action: "read",
                    path,
                    source,
                });
            }
        };
        let record: BottleRecord =
            serde_json::from_slice(&bytes).map_err(|err| RecordError::Unreadable {
                path: path.clone(),
                detail: err.to_string(),
            })?;
        if record.version != RECORD_VERSION {
            return Err(RecordError::Unreadable {
                path,
                detail: format!(
                    "version {} (this bottle reads {RECORD_VERSION})",
                    record.version
                ),
            });
        }
        Ok(Some(Recorded {
            record,
            legacy: false,
        }))
    }

    /// The recorded phase, `None` when the dir records no bottle or its
    /// record cannot be read: for readers that only ask.
    pub fn phase(&self) -> Option<Phase> {
        self.read().ok().flatten().map(|r| r.record.phase)
    }

    /// Whether the bottle is recorded as stopping: its stop began, and
    /// what is left of it is a finisher's or `cleanup`'s to remove.
    pub fn is_stopping(&self) -> bool {
        self.phase() == Some(Phase::Stopping)
    }

    /// Holds the state dir exclusively (flock on the dir itself), waiting
    /// for its holder; released when dropped. A stop's finisher holds it
    /// until the dir is gone, so two finishers (the detached one,
    /// `cleanup`, a launch of the same name) never interleave and a late
    /// one finds the record gone. `None` if the dir cannot be opened:
    /// there is then nothing of it to finish.
    pub fn lock(&self) -> Option<StateDirLock> {
        let dir = std::fs::File::open(&self.root).ok()?;
        nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive)
            .ok()
            .map(StateDirLock)
    }

    /// Records a launch beginning (creating the dir, owner-only), durably:
    /// `cleanup` finds a crashed launch by it.
    pub fn begin(&self, record: &BottleRecord) -> Result<(), RecordError> {
        create_private_dir(&self.root)?;
        self.write(record)
    }

    /// Moves the bottle to `phase`, durably, if its phase allows it
    /// ([`Phase::can_become`]); recording the phase it is in changes
    /// nothing. A state dir of the earlier layout gets its record here.
    pub fn advance(&self, phase: Phase) -> Result<(), RecordError> {
        let Some(Recorded { mut record, legacy }) = self.read()? else {
            return Err(RecordError::Missing {
                dir: self.root.clone(),
            });
        };
        if record.phase == phase && !legacy {
            return Ok(());
        }
        if record.phase != phase && !record.phase.can_become(phase) {
            return Err(RecordError::Transition {
                dir: self.root.clone(),
                from: record.phase,
                to: phase,
            });
        }
        record.phase = phase;
        self.write(&record)
    }

    /// Writes `record` aside, flushes it, renames it into place and
    /// flushes the dir holding the name: after a crash the record is the
    /// old one or the new one, never half of either, and never missing.
    fn write(&self, record: &BottleRecord) -> Result<(), RecordError> {
        let path = self.record_path();
        let json = serde_json::to_vec_pretty(record).map_err(|err| RecordError::Unreadable {
            path: path.clone(),
            detail: err.to_string(),
        })?;
        crate::files::write_aside(&path, &json, 0o600, Flush::FileAndDir).map_err(|failure| {
            RecordError::Io {
                action: failure.action,
                path: failure.path,
                source: failure.source,
            }
        })
    }
}

/// An exclusive hold on a state dir ([`StateDir::lock`]).
#[derive(Debug)]
pub struct StateDirLock(
    #[expect(dead_code, reason = "held for its drop")] nix::fcntl::Flock<std::fs::File>,
);

/// Creates `dir` and its parents, the last one 0700.
fn create_private_dir(dir: &Path) -> Result<(), RecordError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| RecordError::Io {
            action: "create directory",
            path: dir.to_path_buf(),
            source,
        })
}

/// Every state dir under `state_root` that records a bottle of
/// `backend`, by slug order; dirs whose record cannot be read are not
/// any backend's to judge and are left out.
pub fn recorded_bottles(state_root: &Path, backend: BackendKind) -> Vec<(StateDir, Recorded)> {
    let Ok(entries) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut found: Vec<(StateDir, Recorded)> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| {
            let dir = StateDir::new(entry.path());
            let recorded = dir.read().ok().flatten()?;
            (recorded.record.backend == backend).then_some((dir, recorded))
        })
        .collect();
    found.sort_by(|a, b| a.0.root.cmp(&b.0.root));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_owner() -> Owner {
        // Above any pid_max: no process has it.
        Owner {
            pid: u32::MAX,
            start: 1,
        }
    }

    #[test]
    fn a_launch_is_recorded_then_advanced_once() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::of(root.path(), "coder");
        let record = BottleRecord::launching("bot-bottle-coder", "coder", BackendKind::Docker);
        dir.begin(&record).unwrap();
        let read = dir.read().unwrap().unwrap();
        assert_eq!(read.record, record);
        assert!(!read.legacy);
        assert!(read.record.in_flight());
        dir.advance(Phase::Running).unwrap();
        assert_eq!(dir.phase(), Some(Phase::Running));
        let err = dir.advance(Phase::Launching).unwrap_err();
        assert_eq!(err.code(), "BOT-S010", "{err}");
        dir.advance(Phase::Stopping).unwrap();
        dir.advance(Phase::Stopping).unwrap();
        let err = dir.advance(Phase::Running).unwrap_err();
        assert!(err.to_string().contains("is stopping"), "{err}");
        assert_eq!(dir.phase(), Some(Phase::Stopping));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.record_path()).unwrap().permissions();
        assert_eq!(mode.mode() & 0o777, 0o600);
        assert!(!root.path().join("coder/bottle.json.tmp").exists());
    }

    #[test]
    fn a_state_dir_is_held_by_one_at_a_time() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::of(root.path(), "x");
        assert!(dir.lock().is_none(), "no dir, nothing to hold");
        dir.begin(&BottleRecord::launching("b", "a", BackendKind::Docker))
            .unwrap();
        let held = dir.lock().unwrap();
        let other = std::fs::File::open(dir.root()).unwrap();
        let busy = nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock);
        assert!(busy.is_err(), "a second holder must wait");
        drop(held);
        let other = std::fs::File::open(dir.root()).unwrap();
        assert!(
            nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
        );
    }

    #[test]
    fn phases_allow_only_a_completed_launch_and_a_stop() {
        use Phase::*;
        let all = [Launching, Running, Stopping];
        for from in all {
            for to in all {
                let allowed = matches!((from, to), (Launching, Running) | (_, Stopping));
                assert_eq!(from.can_become(to), allowed, "{from} -> {to}");
            }
        }
        assert!(!Launching.launch_completed());
        assert!(Running.launch_completed() && Stopping.launch_completed());
    }

    #[test]
    fn a_launch_whose_process_is_gone_is_abandoned() {
        let mut record = BottleRecord::launching("b", "a", BackendKind::Smolmachines);
        record.owner = dead_owner();
        assert!(record.abandoned() && !record.in_flight());
        record.phase = Phase::Running;
        assert!(!record.abandoned() && !record.in_flight());
    }

    #[test]
    fn records_of_another_version_or_garbage_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::of(root.path(), "x");
        dir.begin(&BottleRecord::launching("b", "a", BackendKind::Docker))
            .unwrap();
        let text = std::fs::read_to_string(dir.record_path()).unwrap();
        std::fs::write(
            dir.record_path(),
            text.replace("\"version\": 1", "\"version\": 9"),
        )
        .unwrap();
        let err = dir.read().unwrap_err();
        assert_eq!(err.code(), "BOT-S009");
        assert!(err.to_string().contains("version 9"), "{err}");
        std::fs::write(dir.record_path(), "{").unwrap();
        assert!(dir.read().is_err());
        assert_eq!(dir.phase(), None);
        let err = StateDir::of(root.path(), "none")
            .advance(Phase::Stopping)
            .unwrap_err();
        assert_eq!(err.code(), "BOT-S009", "{err}");
    }

    #[test]
    fn recorded_bottles_are_one_backends_readable_records() {
        let root = tempfile::tempdir().unwrap();
        for (slug, backend) in [
            ("b", BackendKind::Docker),
            ("a", BackendKind::Docker),
            ("vm", BackendKind::Smolmachines),
        ] {
            StateDir::of(root.path(), slug)
                .begin(&BottleRecord::launching(slug, "x", backend))
                .unwrap();
        }
        std::fs::create_dir(root.path().join("broken")).unwrap();
        std::fs::write(root.path().join("broken/bottle.json"), "nope").unwrap();
        std::fs::write(root.path().join("a-file"), "").unwrap();
        let slugs = |backend| {
            recorded_bottles(root.path(), backend)
                .into_iter()
                .map(|(_, r)| r.record.bottle)
                .collect::<Vec<_>>()
        };
        assert_eq!(slugs(BackendKind::Docker), ["a", "b"]);
        assert_eq!(slugs(BackendKind::Smolmachines), ["vm"]);
        assert!(recorded_bottles(&root.path().join("missing"), BackendKind::Docker).is_empty());
    }
}
