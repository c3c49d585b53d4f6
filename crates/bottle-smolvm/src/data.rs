//! What `prepare` resolves for a launch ([`PlanData`], the typed
//! `Plan::backend_data`) and the bottle's state file ([`BottleState`] in
//! `<state dir>/smolvm.json`): what `attach` and a reset need of the
//! machine. Which process launched the bottle and where its life is are
//! the bottle's record (`bottle_core::life`, `bottle.json`).

use std::path::Path;

use bottle_core::bundle_host::PreparedBundle;
use bottle_core::images::AgentImage;
use bottle_core::sandbox::ResetFiles;
use serde::{Deserialize, Serialize};

use crate::error::{SmolvmError, io_err};
use crate::provision::ProvisionInputs;

/// The backend's file in a bottle's state dir.
pub const STATE_FILE: &str = "smolvm.json";
/// Version of [`BottleState`]'s format. Version 1 also held the launch's
/// process and phase, now the record's; its files are read all the same.
pub const STATE_VERSION: u32 = 2;
/// Version of [`PlanData`]'s format.
pub const PLAN_DATA_VERSION: u32 = 1;

/// Files this backend writes into a bottle's state dir, removed by `stop`
/// (and the warm pool's, [`bottle_core::pool::FILES`]). `Smolfile`,
/// `guest-mcp.json` and `guest-gitconfig` are no longer written, but
/// bottles started by earlier versions still have them.
const OWN_FILES: [&str; 8] = [
    bottle_core::life::RECORD_FILE,
    STATE_FILE,
    "Smolfile",
    "guest-env",
    "guest-mcp.json",
    "guest-gitconfig",
    "guest-hosts",
    crate::provision::CA_SCRATCH,
];

/// The backend's part of a [`bottle_core::Plan`] (`plan.backend_data`); `P` is what
/// the bundle host resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanData<P> {
    /// [`PLAN_DATA_VERSION`].
    pub version: u32,
    /// The smolvm machine name (`bot-bottle-<slug>`).
    pub machine: String,
    /// The resolved agent image.
    pub image: AgentImage,
    /// What provisioning copies in.
    pub inputs: ProvisionInputs,
    /// The agent's environment (`bottle_core::agent::agent_env_of`).
    pub env: Vec<(String, String)>,
    /// What the bundle host resolved for the bundle.
    pub bundle: PreparedBundle<P>,
}

/// A bottle's state on disk: what `attach` and a reset need to find the
/// machine a launch created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BottleState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// `bot-bottle-<slug>`.
    pub bottle: String,
    /// The agent's name in the manifest.
    pub agent: String,
    /// The smolvm machine.
    pub machine: String,
    /// Where the guest reaches the bundle, once known.
    pub bundle_address: Option<String>,
    /// The environment every exec carries.
    pub env: Vec<(String, String)>,
    /// What `exec_interactive` runs when given no command.
    pub default_command: Vec<String>,
}

/// Reads the state file at `path`; `None` if there is none.
pub fn read_state_file(path: &Path) -> Result<Option<BottleState>, SmolvmError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io_err("read", path, err)),
    };
    let state: BottleState =
        serde_json::from_slice(&bytes).map_err(|err| SmolvmError::BadOutput {
            argv: vec![path.display().to_string()],
            detail: format!("not a bottle state file: {err}"),
        })?;
    if !(1..=STATE_VERSION).contains(&state.version) {
        return Err(SmolvmError::BadOutput {
            argv: vec![path.display().to_string()],
            detail: format!(
                "state version {} is not one this bottle reads (1 to {STATE_VERSION})",
                state.version
            ),
        });
    }
    Ok(Some(state))
}

/// Writes the state file at `path` through a temporary file and a rename,
/// so a reader never sees half of it.
pub fn write_state_file(path: &Path, state: &BottleState) -> Result<(), SmolvmError> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|err| SmolvmError::BadOutput {
        argv: vec![path.display().to_string()],
        detail: err.to_string(),
    })?;
    bottle_core::files::write_aside(path, &bytes, 0o600, bottle_core::files::Flush::No)
        .map_err(|failure| io_err(failure.action, &failure.path, failure.source))
}

/// Removes the files this backend wrote into the state dir `dir`, and `dir`
/// itself if nothing else is left in it.
pub(crate) fn remove_own_files(dir: &Path) -> Result<(), String> {
    let mut failures = Vec::new();
    for name in OWN_FILES.iter().chain(&bottle_core::pool::FILES) {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => failures.push(format!("{}: {err}", path.display())),
        }
    }
    // The reset's records: the golden disks and baseline, a halt.
    let reset = ResetFiles::new(dir);
    let golden = reset.golden_dir();
    if let Err(err) = std::fs::remove_dir_all(&golden)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        failures.push(format!("{}: {err}", golden.display()));
    }
    let halted = reset.halted();
    if let Err(err) = std::fs::remove_file(&halted)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        failures.push(format!("{}: {err}", halted.display()));
    }
    // The dir goes too if nothing else lives there; otherwise it is the CLI's.
    let _ = std::fs::remove_dir(dir);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> BottleState {
        BottleState {
            version: STATE_VERSION,
            bottle: "bot-bottle-a".into(),
            agent: "a".into(),
            machine: "bot-bottle-a".into(),
            bundle_address: Some("192.168.7.2".into()),
            env: vec![("K".into(), "V".into())],
            default_command: vec!["sh".into()],
        }
    }

    #[test]
    fn state_file_round_trips_and_refuses_other_versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let state = state();
        write_state_file(&path, &state).unwrap();
        assert_eq!(read_state_file(&path).unwrap(), Some(state));
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"version\": 2", "\"version\": 9");
        std::fs::write(&path, text).unwrap();
        assert!(read_state_file(&path).is_err());
        assert_eq!(read_state_file(&dir.path().join("none")).unwrap(), None);
    }

    /// A state file of version 1 held the launch's process and phase too
    /// (now the record's, read by `bottle_core::life::legacy`).
    #[test]
    fn a_state_file_of_version_1_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let mut json = serde_json::to_value(state()).unwrap();
        let object = json.as_object_mut().unwrap();
        object.insert("version".into(), 1.into());
        object.insert("created".into(), 1.into());
        object.insert("launch_pid".into(), 2.into());
        object.insert("phase".into(), "running".into());
        std::fs::write(&path, json.to_string()).unwrap();
        let old = read_state_file(&path).unwrap().unwrap();
        assert_eq!(
            old,
            BottleState {
                version: 1,
                ..state()
            }
        );
    }
}
