//! smolvm's state database: where it is, and the fail-closed allowlist
//! patch.
//!
//! smolvm keeps each machine as a JSON `VmRecord` in
//! `vms(name TEXT PRIMARY KEY, data BLOB NOT NULL)` (`src/db.rs`,
//! `insert_vm` writes `serde_json::to_vec(record)`), in SQLite with WAL, and
//! `machine start` reads the record back (`start_vm_named` → `db.get_vm`).
//! `machine ls --json` does not show the allowlist, so this database is the
//! only place to confirm it.
//!
//! The algorithm (seed 000, "fail-closed force_allowlist"):
//! 1. the database is missing → refuse (never create one);
//! 2. the machine's row is missing → refuse;
//! 3. the record already holds the policy → no write;
//! 4. otherwise patch the two egress fields, leaving every other field of
//!    the JSON as it was, and read the row back;
//! 5. refuse unless the read-back equals the policy.
//!
//! The read-modify-write runs in one `BEGIN IMMEDIATE` transaction with a
//! busy timeout, so a running smolvm server (which holds the writer briefly
//! per update) is waited for rather than raced: its update is either before
//! our read or after our write, never lost in between.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension as _, TransactionBehavior};
use serde_json::Value;

use crate::error::SmolvmError;
use crate::version::{Capabilities, SmolvmVersion};

/// How long to wait for smolvm's own writer before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The host platform, as far as smolvm's paths are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPlatform {
    /// `dirs::data_local_dir()` is `$XDG_DATA_HOME` or `~/.local/share`.
    Linux,
    /// `dirs::data_local_dir()` is `~/Library/Application Support`.
    MacOs,
}

impl DataPlatform {
    /// This host.
    pub fn current() -> DataPlatform {
        if cfg!(target_os = "macos") {
            DataPlatform::MacOs
        } else {
            DataPlatform::Linux
        }
    }
}

/// Where smolvm keeps its state database:
/// `dirs::data_local_dir()/smolvm/server/smolvm.db` (`SmolvmDb::default_path`).
///
/// On Linux, `SMOLVM_DATA_DIR` (honoured from 1.2.5) becomes smolvm's `HOME`
/// and `XDG_DATA_HOME` is dropped (`apply_system_data_root`), so the file is
/// `$SMOLVM_DATA_DIR/.local/share/smolvm/server/smolvm.db`. macOS ignores it.
/// `version` is `None` when unknown; the newest behaviour is assumed.
///
/// `home_fallback` is the passwd home directory, used like `dirs` does when
/// `HOME` is unset.
pub fn state_db_path(
    platform: DataPlatform,
    env: impl Fn(&str) -> Option<String>,
    version: Option<SmolvmVersion>,
    home_fallback: Option<PathBuf>,
) -> Result<PathBuf, SmolvmError> {
    let absolute = |value: Option<String>| {
        value
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let data_dir_honoured = version.is_none_or(Capabilities::honours_data_dir);
    let relocated = match platform {
        DataPlatform::Linux if data_dir_honoured => absolute(env("SMOLVM_DATA_DIR")),
        _ => None,
    };
    let data_local = match (platform, relocated) {
        (DataPlatform::Linux, Some(root)) => root.join(".local/share"),
        (DataPlatform::Linux, None) => match absolute(env("XDG_DATA_HOME")) {
            Some(xdg) => xdg,
            None => home(&env, home_fallback)?.join(".local/share"),
        },
        (DataPlatform::MacOs, _) => home(&env, home_fallback)?.join("Library/Application Support"),
    };
    Ok(data_local.join("smolvm/server/smolvm.db"))
}

fn home(
    env: &impl Fn(&str) -> Option<String>,
    fallback: Option<PathBuf>,
) -> Result<PathBuf, SmolvmError> {
    env("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or(fallback)
        .ok_or_else(|| SmolvmError::StateDbPath {
            detail: "HOME is not set to an absolute path and the user has no home directory".into(),
        })
}

/// The passwd home directory of this user (what `dirs::home_dir` falls back
/// to when `HOME` is unset).
pub fn passwd_home() -> Option<PathBuf> {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|user| user.dir)
}

/// [`state_db_path`] for this process's environment.
pub fn state_db_path_from_env(version: Option<SmolvmVersion>) -> Result<PathBuf, SmolvmError> {
    state_db_path(
        DataPlatform::current(),
        |key| std::env::var(key).ok(),
        version,
        passwd_home(),
    )
}

/// The egress policy a bottle's machine must hold in its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPolicy {
    /// `allowed_cidrs`: exactly the bundle's `/32`.
    pub allowed_cidrs: Vec<String>,
    /// `dns_filter_hosts`: `Some(vec![])` makes the virtio-net gateway
    /// answer every name it is asked with NXDOMAIN (`EgressPolicy::new(…,
    /// Some(&[]))` → `dns_filter_active()`, nothing allowed), closing the
    /// DNS path the gateway otherwise forwards to the host's resolver under
    /// a CIDR-only policy. `None` leaves the field alone.
    pub dns_filter_hosts: Option<Vec<String>>,
}

impl EgressPolicy {
    /// The bottle policy: one address, no names.
    pub fn one_address(address: std::net::Ipv4Addr) -> EgressPolicy {
        EgressPolicy {
            allowed_cidrs: vec![format!("{address}/32")],
            dns_filter_hosts: Some(Vec::new()),
        }
    }

    fn held_by(&self, record: &Value) -> bool {
        let cidrs_ok = record.get("allowed_cidrs") == Some(&strings(&self.allowed_cidrs));
        let hosts_ok = match &self.dns_filter_hosts {
            None => true,
            Some(hosts) => record.get("dns_filter_hosts") == Some(&strings(hosts)),
        };
        cidrs_ok && hosts_ok
    }

    fn apply(&self, record: &mut serde_json::Map<String, Value>) {
        record.insert("allowed_cidrs".into(), strings(&self.allowed_cidrs));
        if let Some(hosts) = &self.dns_filter_hosts {
            record.insert("dns_filter_hosts".into(), strings(hosts));
        }
    }

    /// How the policy reads in messages.
    pub fn describe(&self) -> String {
        describe(&Value::Object({
            let mut m = serde_json::Map::new();
            self.apply(&mut m);
            m
        }))
    }
}

fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}

fn describe(record: &Value) -> String {
    let field = |name: &str| {
        record
            .get(name)
            .map_or_else(|| "absent".to_string(), Value::to_string)
    };
    format!(
        "allowed_cidrs={} dns_filter_hosts={}",
        field("allowed_cidrs"),
        field("dns_filter_hosts")
    )
}

/// What [`enforce`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchOutcome {
    /// The record already held the policy; nothing was written.
    AlreadySet,
    /// The record was patched and the read-back matched.
    Patched,
}

/// Makes `machine`'s record hold `policy`, failing closed (see the module
/// docs for the algorithm).
pub fn enforce(
    path: &Path,
    machine: &str,
    policy: &EgressPolicy,
) -> Result<PatchOutcome, SmolvmError> {
    let mut conn = open(path)?;
    let outcome = {
        let db_err = |action: &str| {
            let path = path.to_path_buf();
            let action = action.to_string();
            move |source| SmolvmError::StateDb {
                action,
                path,
                source,
            }
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db_err("lock"))?;
        let mut record = read_record(&tx, path, machine)?;
        if policy.held_by(&record) {
            tx.commit().map_err(db_err("end the transaction on"))?;
            PatchOutcome::AlreadySet
        } else {
            let Some(map) = record.as_object_mut() else {
                return Err(SmolvmError::StateRecordInvalid {
                    path: path.into(),
                    machine: machine.into(),
                    detail: "the record is not a JSON object".into(),
                });
            };
            policy.apply(map);
            let bytes =
                serde_json::to_vec(&record).map_err(|err| SmolvmError::StateRecordInvalid {
                    path: path.into(),
                    machine: machine.into(),
                    detail: err.to_string(),
                })?;
            let changed = tx
                .execute(
                    "UPDATE vms SET data = ?1 WHERE name = ?2",
                    rusqlite::params![bytes, machine],
                )
                .map_err(db_err("write"))?;
            if changed != 1 {
                return Err(SmolvmError::StateRowMissing {
                    path: path.into(),
                    machine: machine.into(),
                });
            }
            tx.commit().map_err(db_err("commit to"))?;
            PatchOutcome::Patched
        }
    };
    verify_on(&conn, path, machine, policy)?;
    Ok(outcome)
}

/// Confirms, without writing, that `machine`'s record holds `policy`.
pub fn verify(path: &Path, machine: &str, policy: &EgressPolicy) -> Result<(), SmolvmError> {
    let conn = open(path)?;
    verify_on(&conn, path, machine, policy)
}

fn verify_on(
    conn: &Connection,
    path: &Path,
    machine: &str,
    policy: &EgressPolicy,
) -> Result<(), SmolvmError> {
    let record = read_record(conn, path, machine)?;
    if policy.held_by(&record) {
        Ok(())
    } else {
        Err(SmolvmError::AllowlistNotPersisted {
            path: path.into(),
            machine: machine.into(),
            wanted: policy.describe(),
            found: describe(&record),
        })
    }
}

/// The record of `machine`, as JSON.
pub fn read(path: &Path, machine: &str) -> Result<Value, SmolvmError> {
    let conn = open(path)?;
    read_record(&conn, path, machine)
}

fn open(path: &Path) -> Result<Connection, SmolvmError> {
    if !path.is_file() {
        return Err(SmolvmError::StateDbMissing { path: path.into() });
    }
    // No SQLITE_OPEN_CREATE: a database that vanished between the check and
    // the open is refused, never recreated empty.
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| SmolvmError::StateDb {
        action: "open".into(),
        path: path.into(),
        source,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|source| SmolvmError::StateDb {
            action: "configure".into(),
            path: path.into(),
            source,
        })?;
    Ok(conn)
}

fn read_record(conn: &Connection, path: &Path, machine: &str) -> Result<Value, SmolvmError> {
    let data: Option<rusqlite::types::Value> = conn
        .query_row("SELECT data FROM vms WHERE name = ?1", [machine], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|source| SmolvmError::StateDb {
            action: "read".into(),
            path: path.into(),
            source,
        })?;
    let invalid = |detail: String| SmolvmError::StateRecordInvalid {
        path: path.into(),
        machine: machine.into(),
        detail,
    };
    let bytes = match data {
        None => {
            return Err(SmolvmError::StateRowMissing {
                path: path.into(),
                machine: machine.into(),
            });
        }
        Some(rusqlite::types::Value::Blob(b)) => b,
        Some(rusqlite::types::Value::Text(t)) => t.into_bytes(),
        Some(other) => {
            return Err(invalid(format!(
                "data is a {:?}, not JSON",
                other.data_type()
            )));
        }
    };
    let value: Value = serde_json::from_slice(&bytes).map_err(|err| invalid(err.to_string()))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(invalid("the record is not a JSON object".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    }

    const NEW: Option<SmolvmVersion> = Some(SmolvmVersion::new(1, 9, 3));

    #[test]
    fn linux_path_follows_xdg_then_home() {
        let p = state_db_path(
            DataPlatform::Linux,
            env_of(&[("HOME", "/h"), ("XDG_DATA_HOME", "/x")]),
            NEW,
            None,
        );
        assert_eq!(p.unwrap(), PathBuf::from("/x/smolvm/server/smolvm.db"));
        let p = state_db_path(
            DataPlatform::Linux,
            env_of(&[("HOME", "/h"), ("XDG_DATA_HOME", "rel")]),
            NEW,
            None,
        );
        assert_eq!(
            p.unwrap(),
            PathBuf::from("/h/.local/share/smolvm/server/smolvm.db")
        );
    }

    #[test]
    fn smolvm_data_dir_becomes_home_on_linux_from_1_2_5() {
        let env = env_of(&[
            ("HOME", "/h"),
            ("XDG_DATA_HOME", "/x"),
            ("SMOLVM_DATA_DIR", "/d"),
        ]);
        let p = state_db_path(DataPlatform::Linux, &env, NEW, None).unwrap();
        assert_eq!(p, PathBuf::from("/d/.local/share/smolvm/server/smolvm.db"));
        let old = Some(SmolvmVersion::new(1, 2, 4));
        let p = state_db_path(DataPlatform::Linux, &env, old, None).unwrap();
        assert_eq!(p, PathBuf::from("/x/smolvm/server/smolvm.db"));
        let p = state_db_path(DataPlatform::MacOs, &env, NEW, None).unwrap();
        assert_eq!(
            p,
            PathBuf::from("/h/Library/Application Support/smolvm/server/smolvm.db")
        );
    }

    #[test]
    fn home_falls_back_to_passwd_and_then_refuses() {
        let p = state_db_path(DataPlatform::Linux, env_of(&[]), NEW, Some("/pw".into()));
        assert_eq!(
            p.unwrap(),
            PathBuf::from("/pw/.local/share/smolvm/server/smolvm.db")
        );
        assert!(state_db_path(DataPlatform::MacOs, env_of(&[]), NEW, None).is_err());
    }
}
