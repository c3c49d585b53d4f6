//! The record that a bottle is stopping: `stopping` in its state dir.
//!
//! `bottle stop` returns once the bottle's containers are gone (the agent
//! can then neither run nor reach anything) and leaves the rest (network,
//! state dir, audit log retention) to a detached finisher. This record,
//! written and synced before the first container goes, is what makes that
//! safe: `list` shows the bottle as `stopping`, and `cleanup` treats it as
//! an orphan and finishes it if the finisher never does. It goes with the
//! state dir.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data;
use crate::error::DockerError;

/// The record's file name in a state dir.
const FILE: &str = "stopping";

/// The version of the record this build writes and reads.
const VERSION: u32 = 1;

/// What the record holds: enough for an operator reading it by hand.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    /// When the stop began (RFC 3339).
    since: String,
}

/// The record's path in the state dir `dir`.
fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Records durably that the bottle of the state dir `dir` is stopping:
/// the file is synced, then the dir holding its name. Recording it again
/// keeps the first record.
pub(crate) fn record(dir: &Path) -> Result<(), DockerError> {
    if is_stopping(dir) {
        return Ok(());
    }
    let record = Record {
        version: VERSION,
        since: bottle_core::time::now_rfc3339_millis(),
    };
    let json = serde_json::to_vec(&record).map_err(|err| DockerError::PlanData {
        detail: err.to_string(),
    })?;
    data::write_file(&path(dir), &json, 0o600)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(DockerError::io("sync", dir))
}

/// Whether the bottle of the state dir `dir` is recorded as stopping. Any
/// file by that name counts, whatever it holds: a record this build cannot
/// read still means a stop began.
pub(crate) fn is_stopping(dir: &Path) -> bool {
    path(dir).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_versioned_kept_once_and_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_stopping(dir.path()));
        record(dir.path()).unwrap();
        assert!(is_stopping(dir.path()));
        let first = std::fs::read(path(dir.path())).unwrap();
        let parsed: Record = serde_json::from_slice(&first).unwrap();
        assert_eq!(parsed.version, VERSION);
        record(dir.path()).unwrap();
        assert_eq!(std::fs::read(path(dir.path())).unwrap(), first);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
