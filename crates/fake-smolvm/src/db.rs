//! smolvm's state database, where smolvm keeps it: `vms(name, data)` with
//! one `VmRecord` JSON per machine, in WAL mode.

use std::path::{Path, PathBuf};

use bottle_smolvm::version::{Capabilities as _, SmolvmVersion};
use rusqlite::{Connection, OptionalExtension as _};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::{Result, error};

/// `dirs::data_local_dir()` as smolvm sees it (see the crate docs).
pub(crate) fn data_local_dir(version: SmolvmVersion) -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let missing = || error("could not determine local data directory");
    if cfg!(target_os = "macos") {
        return Ok(var("HOME")
            .ok_or_else(missing)?
            .join("Library/Application Support"));
    }
    if version.honours_data_dir()
        && let Some(root) = var("SMOLVM_DATA_DIR")
    {
        return Ok(root.join(".local/share"));
    }
    match var("XDG_DATA_HOME") {
        Some(xdg) => Ok(xdg),
        None => Ok(var("HOME").ok_or_else(missing)?.join(".local/share")),
    }
}

/// An open state database.
pub(crate) struct StateDb {
    conn: Connection,
}

impl StateDb {
    /// Opens (creating if needed) the database at `path` with smolvm's
    /// tables.
    pub(crate) fn open(path: &Path) -> Result<StateDb> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| error(format!("create {}: {e}", parent.display())))?;
        }
        let conn = Connection::open(path).map_err(|e| error(format!("open database: {e}")))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| error(format!("database: {e}")))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS vms (name TEXT PRIMARY KEY, data BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS config (key TEXT PRIMARY KEY, value TEXT);",
        )
        .map_err(|e| error(format!("initialize database: {e}")))?;
        Ok(StateDb { conn })
    }

    /// The machine's record, if there is one.
    pub(crate) fn get(&self, name: &str) -> Result<Option<Value>> {
        let data: Option<Vec<u8>> = self
            .conn
            .query_row("SELECT data FROM vms WHERE name = ?1", [name], |r| r.get(0))
            .optional()
            .map_err(|e| error(format!("get vm '{name}': {e}")))?;
        data.map(|d| {
            serde_json::from_slice(&d).map_err(|e| error(format!("decode vm '{name}': {e}")))
        })
        .transpose()
    }

    /// The machine's record; smolvm's "not found" error without one.
    pub(crate) fn require(&self, name: &str) -> Result<Value> {
        self.get(name)?
            .ok_or_else(|| error(format!("machine '{name}' not found")))
    }

    /// Writes the machine's record, replacing any.
    pub(crate) fn put(&self, name: &str, record: &Value) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(|e| error(e.to_string()))?;
        self.conn
            .execute(
                "INSERT INTO vms (name, data) VALUES (?1, ?2)
                 ON CONFLICT(name) DO UPDATE SET data = excluded.data",
                rusqlite::params![name, bytes],
            )
            .map_err(|e| error(format!("insert vm '{name}': {e}")))?;
        Ok(())
    }

    /// Removes the machine's record.
    pub(crate) fn remove(&self, name: &str) -> Result<()> {
        self.conn
            .execute("DELETE FROM vms WHERE name = ?1", [name])
            .map_err(|e| error(format!("delete vm '{name}': {e}")))?;
        Ok(())
    }

    /// Every record, by name.
    pub(crate) fn records(&self) -> Result<Vec<Value>> {
        let mut stmt = self
            .conn
            .prepare("SELECT data FROM vms ORDER BY name")
            .map_err(|e| error(e.to_string()))?;
        let rows: Vec<Vec<u8>> = stmt
            .query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(|e| error(e.to_string()))?;
        rows.iter()
            .map(|row| serde_json::from_slice(row).map_err(|e| error(e.to_string())))
            .collect()
    }

    /// The `revert-db-writes` fault: a trigger that undoes every later
    /// write to the machine's record.
    pub(crate) fn revert_later_writes(&self, name: &str) -> Result<()> {
        let quoted = name.replace('\'', "''");
        let digest = format!("{:x}", Sha256::digest(name.as_bytes()));
        self.conn
            .execute_batch(&format!(
                "CREATE TRIGGER IF NOT EXISTS fake_revert_{hash} AFTER UPDATE OF data ON vms
                 WHEN NEW.name = '{quoted}'
                 BEGIN UPDATE vms SET data = OLD.data WHERE name = NEW.name; END;",
                hash = &digest[..16],
            ))
            .map_err(|e| error(format!("install revert trigger: {e}")))
    }
}
