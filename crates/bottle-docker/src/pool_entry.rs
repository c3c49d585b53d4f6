//! A warm-pool entry's files in its state dir and what they say:
//! `pool.json` ([`PoolRecord`]), `pool-ready` while it waits, and
//! `pool-claimed` ([`ClaimRecord`]), hard-linked into place so of two
//! racing takers exactly one wins. What fills and claims entries is
//! [`crate::pool`]; this module is what `list`, `stop` and `cleanup` read
//! of them without depending on it.

use std::collections::BTreeMap;
use std::path::Path;

use bollard::models::ContainerInspectResponse;
use bottle_core::process::Owner;
use serde::{Deserialize, Serialize};

use crate::client::Engine;
use crate::data;
use crate::error::DockerError;
use crate::names::ResourceNames;

/// The version of the pool's files; an entry of another version is
/// discarded, never reused.
pub const POOL_LAYOUT_VERSION: u32 = 1;

pub(crate) const RECORD: &str = "pool.json";
pub(crate) const READY: &str = "pool-ready";
pub(crate) const CLAIMED: &str = "pool-claimed";

/// What the Engine says of a container's life: a restart or a stop and
/// start changes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartFacts {
    /// Whether it runs.
    pub running: bool,
    /// When it last started.
    pub started_at: String,
    /// How often the daemon restarted it.
    pub restart_count: i64,
}

/// `pool.json`: what an entry was made from and how it stood when filled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    /// [`POOL_LAYOUT_VERSION`].
    pub version: u32,
    /// The manifest's agent.
    pub agent: String,
    /// [`crate::backend::DockerBackend::pool_fingerprint`] at fill.
    pub fingerprint: String,
    /// RFC 3339 time it was filled.
    pub filled: String,
    /// The agent container at fill.
    pub agent_start: StartFacts,
    /// The bundle container at fill.
    pub bundle_start: StartFacts,
    /// The bundle's Engine facts at fill (networks and addresses, limits,
    /// image), compared as a whole at claim.
    pub bundle_engine: BTreeMap<String, String>,
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

/// Whether the bottle whose state dir is `state_dir` is a pool entry
/// waiting to be claimed.
pub fn is_ready(state_dir: &Path) -> bool {
    state_dir.join(READY).exists() && !state_dir.join(CLAIMED).exists()
}

/// Takes the entry in `dir` for this process: its claim record is linked
/// into place, which fails if another process took it first, so of two
/// racing takers exactly one wins; the record names this process from the
/// first instant, so a taker that dies is an owner `cleanup` can judge.
/// `detached`: the taker's bottle outlives it.
pub(crate) fn take(dir: &Path, detached: bool) -> bool {
    if !is_ready(dir) {
        return false;
    }
    let owner = Owner::current();
    let record = ClaimRecord {
        claimed: bottle_core::time::now_rfc3339_millis(),
        owner,
        detached,
        verify_ms: 0,
    };
    let Ok(json) = serde_json::to_vec_pretty(&record) else {
        return false;
    };
    let temp = dir.join(format!("{CLAIMED}.{}.tmp", owner.pid));
    if data::write_file(&temp, &json, 0o600).is_err() {
        return false;
    }
    let won = std::fs::hard_link(&temp, dir.join(CLAIMED)).is_ok();
    let _ = std::fs::remove_file(&temp);
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

pub(crate) fn read_record(state_dir: &Path) -> Result<PoolRecord, DockerError> {
    let path = state_dir.join(RECORD);
    let text = std::fs::read(&path).map_err(DockerError::io("read", &path))?;
    serde_json::from_slice(&text).map_err(|err| DockerError::PoolRecord {
        path: path.clone(),
        detail: err.to_string(),
    })
}

pub(crate) fn start_facts(inspect: &ContainerInspectResponse) -> StartFacts {
    let state = inspect.state.clone().unwrap_or_default();
    StartFacts {
        running: state.running == Some(true),
        started_at: state.started_at.unwrap_or_default(),
        restart_count: inspect.restart_count.unwrap_or(-1),
    }
}

pub(crate) fn inspect_both(
    engine: &Engine,
    names: &ResourceNames,
) -> Result<(ContainerInspectResponse, ContainerInspectResponse), DockerError> {
    let (agent, bundle) = engine.block_on(async {
        futures_util::join!(
            engine.docker.inspect_container(&names.agent, None),
            engine.docker.inspect_container(&names.bundle, None)
        )
    });
    Ok((
        agent.map_err(DockerError::api(format!(
            "inspect container {}",
            names.agent
        )))?,
        bundle.map_err(DockerError::api(format!(
            "inspect container {}",
            names.bundle
        )))?,
    ))
}

/// The waiting entries that can no longer be claimed, each with why: a
/// record that cannot be read or is of another layout, a container that
/// stopped or restarted. Entries that merely belong to another manifest
/// are not among them: only a claim knows the manifest.
pub fn broken_entries(engine: &Engine, state_root: &Path) -> Vec<(String, String)> {
    let Ok(dirs) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut broken = Vec::new();
    for dir in dirs.flatten().map(|entry| entry.path()) {
        if !is_ready(&dir) {
            continue;
        }
        let Some(slug) = dir.file_name().map(|n| n.to_string_lossy().to_string()) else {
            continue;
        };
        let why = match read_record(&dir) {
            Err(err) => Some(err.to_string()),
            Ok(record) if record.version != POOL_LAYOUT_VERSION => {
                Some(format!("layout version {}", record.version))
            }
            Ok(record) => {
                let names = ResourceNames::for_slug(&slug);
                match inspect_both(engine, &names) {
                    Err(err) => Some(err.to_string()),
                    Ok((agent, bundle)) => lives_as_filled(&record, &agent, &bundle).err(),
                }
            }
        };
        if let Some(why) = why {
            broken.push((slug, why));
        }
    }
    broken
}

/// Whether both containers still live the life they had at fill: running,
/// never restarted, not started again since.
pub(crate) fn lives_as_filled(
    record: &PoolRecord,
    agent: &ContainerInspectResponse,
    bundle: &ContainerInspectResponse,
) -> Result<(), String> {
    for (what, recorded, now) in [
        ("agent", &record.agent_start, start_facts(agent)),
        ("bundle", &record.bundle_start, start_facts(bundle)),
    ] {
        if !now.running {
            return Err(format!("the {what} container is not running"));
        }
        if &now != recorded {
            return Err(format!(
                "the {what} container was started again (started {} restarts {}, at fill {} restarts {})",
                now.started_at, now.restart_count, recorded.started_at, recorded.restart_count
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record() -> PoolRecord {
        let started = StartFacts {
            running: true,
            started_at: "2026-11-24T11:00:00Z".into(),
            restart_count: 0,
        };
        PoolRecord {
            version: POOL_LAYOUT_VERSION,
            agent: "demo".into(),
            fingerprint: "sha256:x".into(),
            filled: "2026-11-24T11:00:01Z".into(),
            agent_start: started.clone(),
            bundle_start: started,
            bundle_engine: BTreeMap::new(),
        }
    }

    fn inspect(started_at: &str, restarts: i64, running: bool) -> ContainerInspectResponse {
        ContainerInspectResponse {
            restart_count: Some(restarts),
            state: Some(bollard::models::ContainerState {
                running: Some(running),
                started_at: Some(started_at.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_entry_started_again_or_stopped_is_not_as_filled() {
        let record = record();
        let same = inspect("2026-11-24T11:00:00Z", 0, true);
        assert_eq!(lives_as_filled(&record, &same, &same), Ok(()));
        let restarted = inspect("2026-11-24T11:00:00Z", 1, true);
        assert!(lives_as_filled(&record, &restarted, &same).is_err());
        let started_again = inspect("2026-11-24T11:05:00Z", 0, true);
        assert!(lives_as_filled(&record, &same, &started_again).is_err());
        let stopped = inspect("2026-11-24T11:00:00Z", 0, false);
        assert!(
            lives_as_filled(&record, &stopped, &same)
                .unwrap_err()
                .contains("not running")
        );
    }

    #[test]
    fn of_two_takers_one_wins_and_is_named_in_the_record() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!take(dir.path(), true), "nothing waits yet");
        data::write_file(&dir.path().join(READY), b"", 0o600).unwrap();
        assert!(is_ready(dir.path()));
        assert!(take(dir.path(), true));
        assert!(!take(dir.path(), false), "taken twice");
        assert!(!is_ready(dir.path()));
        let record = claim_record(dir.path()).unwrap();
        assert_eq!(record.owner, Owner::current());
        assert!(record.detached);
        // A taker that died between the link and removing the marker left
        // both: the entry is taken all the same.
        data::write_file(&dir.path().join(READY), b"", 0o600).unwrap();
        assert!(!is_ready(dir.path()));
        assert!(!take(dir.path(), false));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
