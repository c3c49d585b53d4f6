//! The records of a state dir written before `bottle.json` existed (state
//! layout 1), read so that bottles started by an earlier `bottle` are
//! still listed, stopped and cleaned up. This module is the one place that
//! knows those files; nothing writes them any more.
//!
//! - a docker bottle: `plan.json` (the confirmed plan: its backend, bottle
//!   and agent), `owner.json` (the launching process), `launched` (the
//!   launch completed) and `stopping` (its stop began; any content);
//! - a microVM bottle: `smolvm.json`, whose `launch_pid`, `launch_start`,
//!   `phase` and `created` are now the record's.

use std::path::Path;

use serde::Deserialize;

use super::{BottleRecord, Phase, RECORD_VERSION};
use crate::backend::BackendKind;
use crate::process::Owner;

/// The docker backend's plan, of which the record needs the head.
const DOCKER_PLAN: &str = "plan.json";
/// The docker launch's owner record.
const DOCKER_OWNER: &str = "owner.json";
/// Written when a docker launch completed.
const DOCKER_LAUNCHED: &str = "launched";
/// Written when a docker bottle's stop began.
const DOCKER_STOPPING: &str = "stopping";
/// The microVM backend's state file.
const SMOLVM_STATE: &str = "smolvm.json";

/// Every file of the earlier layout that only the record replaces: a
/// backend removing a bottle's files removes these too.
pub const REPLACED_FILES: [&str; 3] = [DOCKER_OWNER, DOCKER_LAUNCHED, DOCKER_STOPPING];

/// The record a state dir of the earlier layout at `dir` amounts to, if
/// it holds one.
pub fn read(dir: &Path) -> Option<BottleRecord> {
    read_smolvm(dir).or_else(|| read_docker(dir))
}

fn read_smolvm(dir: &Path) -> Option<BottleRecord> {
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum SmolvmPhase {
        Launching,
        Running,
    }
    #[derive(Deserialize)]
    struct SmolvmState {
        bottle: String,
        agent: String,
        created: i64,
        launch_pid: u32,
        #[serde(default)]
        launch_start: u64,
        phase: SmolvmPhase,
    }
    let bytes = std::fs::read(dir.join(SMOLVM_STATE)).ok()?;
    let state: SmolvmState = serde_json::from_slice(&bytes).ok()?;
    Some(BottleRecord {
        version: RECORD_VERSION,
        bottle: state.bottle,
        agent: state.agent,
        backend: BackendKind::Smolmachines,
        owner: Owner {
            pid: state.launch_pid,
            start: state.launch_start,
        },
        phase: match state.phase {
            SmolvmPhase::Launching => Phase::Launching,
            SmolvmPhase::Running => Phase::Running,
        },
        created: Some(crate::time::rfc3339(state.created)),
    })
}

fn read_docker(dir: &Path) -> Option<BottleRecord> {
    #[derive(Deserialize)]
    struct PlanHead {
        bottle: String,
        agent: String,
        backend: BackendKind,
    }
    let plan = dir.join(DOCKER_PLAN);
    let head: PlanHead = serde_json::from_slice(&std::fs::read(&plan).ok()?).ok()?;
    // A launch that died before it recorded its owner has none alive:
    // PID 0 is no process's.
    let owner = std::fs::read(dir.join(DOCKER_OWNER))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Owner { pid: 0, start: 0 });
    let phase = if dir.join(DOCKER_STOPPING).exists() {
        Phase::Stopping
    } else if dir.join(DOCKER_LAUNCHED).exists() {
        Phase::Running
    } else {
        Phase::Launching
    };
    let created = std::fs::metadata(&plan)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .map(crate::time::rfc3339);
    Some(BottleRecord {
        version: RECORD_VERSION,
        bottle: head.bottle,
        agent: head.agent,
        backend: head.backend,
        owner,
        phase,
        created,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Recorded, StateDir};
    use super::*;

    fn docker_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("plan.json"),
            r#"{"version":1,"bottle":"bot-bottle-coder","slug":"coder","agent":"coder","backend":"docker","more":"ignored"}"#,
        )
        .unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn a_docker_state_dir_of_the_earlier_layout_is_read_with_its_phase() {
        let me = Owner::current();
        let owner = serde_json::to_string(&me).unwrap();
        for (files, phase) in [
            (vec![("owner.json", owner.as_str())], Phase::Launching),
            (
                vec![("owner.json", owner.as_str()), ("launched", "1\n")],
                Phase::Running,
            ),
            (
                vec![("launched", "1\n"), ("stopping", "not json")],
                Phase::Stopping,
            ),
        ] {
            let dir = docker_dir(&files);
            let Some(Recorded { record, legacy }) = StateDir::new(dir.path()).read().unwrap()
            else {
                panic!("no record in {files:?}");
            };
            assert!(legacy);
            assert_eq!(record.phase, phase, "{files:?}");
            assert_eq!(record.backend, BackendKind::Docker);
            assert_eq!(record.bottle, "bot-bottle-coder");
            assert_eq!(record.agent, "coder");
            assert!(record.created.is_some());
            let has_owner = files.iter().any(|(name, _)| *name == "owner.json");
            assert_eq!(record.owner.is_alive(), has_owner, "{files:?}");
        }
    }

    #[test]
    fn a_microvm_state_file_of_the_earlier_layout_is_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("smolvm.json"),
            r#"{"version":1,"bottle":"bot-bottle-vm","agent":"coder","machine":"bot-bottle-vm","bundle_address":null,"env":[],"default_command":[],"created":1700000000,"launch_pid":1,"phase":"running"}"#,
        )
        .unwrap();
        let record = read(dir.path()).unwrap();
        assert_eq!(record.backend, BackendKind::Smolmachines);
        assert_eq!(record.phase, Phase::Running);
        assert_eq!(record.owner, Owner { pid: 1, start: 0 });
        assert_eq!(record.created.as_deref(), Some("2023-11-14T22:13:20Z"));
    }

    #[test]
    fn the_first_change_of_phase_writes_the_record() {
        let dir = docker_dir(&[("launched", "1\n")]);
        let state = StateDir::new(dir.path());
        state.advance(Phase::Stopping).unwrap();
        let read = state.read().unwrap().unwrap();
        assert!(!read.legacy);
        assert_eq!(read.record.phase, Phase::Stopping);
    }

    #[test]
    fn a_dir_with_neither_layout_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        std::fs::write(dir.path().join("plan.json"), "{}").unwrap();
        assert_eq!(read(dir.path()), None);
    }
}
