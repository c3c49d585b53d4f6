//! The audit log's files on the host: its name, its rotated generations,
//! the health marker beside it, and a reader that follows the log across
//! rotations.
//!
//! The bundle writes and rotates the log, the backends create the marker
//! at launch, and `bottle logs` / `bottle list` read both: one definition
//! here keeps the four from drifting apart. The log lives in the bottle's
//! `<state_dir>/logs`, which the bundle sees at
//! [`BUNDLE_LOG_DIR`](crate::bundle::BUNDLE_LOG_DIR).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The log file's name in its directory.
pub const AUDIT_LOG_FILE: &str = "audit.jsonl";
/// Rotated generations kept besides the live file (`audit.jsonl.1` is the
/// newest), so the log takes at most about `cap × (generations + 1)`.
pub const AUDIT_GENERATIONS: u32 = 3;
/// The live file's size cap when the manifest sets none.
pub const DEFAULT_AUDIT_LOG_MAX_BYTES: u64 = 64 << 20;
/// The directory of a bottle's state dir holding the log and its marker.
pub const AUDIT_LOG_DIR: &str = "logs";
/// Created empty by the host at launch; the bundle renames it to
/// [`AUDIT_DEGRADED_MARKER`] when a write fails. A rename in the same
/// directory needs no new data blocks, so it works on a full disk.
pub const AUDIT_OK_MARKER: &str = "audit.ok";
/// Present when the bundle could not write the log and refuses traffic.
pub const AUDIT_DEGRADED_MARKER: &str = "audit.degraded";

/// Generation `n` of the log at `log`: `0` is the live file, `n` is
/// `<log>.<n>`.
pub fn generation(log: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return log.to_path_buf();
    }
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Whether a bottle's bundle can still write its audit log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditHealth {
    /// The marker says the log is written.
    Ok,
    /// A write failed: the bundle refuses all traffic.
    Degraded,
    /// No marker (a bottle launched before markers existed, or no log dir).
    #[default]
    Unknown,
}

impl std::fmt::Display for AuditHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ok => "ok",
            Self::Degraded => "degraded",
            Self::Unknown => "-",
        })
    }
}

/// The audit health recorded in `log_dir`. Degraded wins over ok: the
/// bundle creates the degraded marker when it cannot rename the ok one.
pub fn audit_health(log_dir: &Path) -> AuditHealth {
    if log_dir.join(AUDIT_DEGRADED_MARKER).exists() {
        AuditHealth::Degraded
    } else if log_dir.join(AUDIT_OK_MARKER).exists() {
        AuditHealth::Ok
    } else {
        AuditHealth::Unknown
    }
}

/// Follows the log's complete lines, oldest first, across rotations:
/// each [`AuditLines::poll`] returns the lines appended since the last.
///
/// It keeps the live file open; when the path names another file (the
/// bundle rotated it), it reads the old file to its end, then moves to the
/// new one. A trailing partial line is held back until it is complete.
#[derive(Debug)]
pub struct AuditLines {
    path: PathBuf,
    current: Option<File>,
    /// Rotated generations still to read before the live file.
    backlog: Vec<PathBuf>,
    partial: Vec<u8>,
}

impl AuditLines {
    /// Starts at the oldest rotated generation (`bottle logs`).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            current: None,
            backlog: (1..=AUDIT_GENERATIONS)
                .rev()
                .map(|n| generation(path, n))
                .collect(),
            partial: Vec::new(),
        }
    }

    /// Starts at the current end of the live file: only new lines.
    pub fn from_end(path: &Path) -> std::io::Result<Self> {
        let mut lines = Self {
            path: path.to_path_buf(),
            current: None,
            backlog: Vec::new(),
            partial: Vec::new(),
        };
        match File::open(path) {
            Ok(mut file) => {
                file.seek(SeekFrom::End(0))?;
                lines.current = Some(file);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(lines)
    }

    /// The complete lines (without their newline) appended since the last
    /// poll. A missing log is no lines yet.
    pub fn poll(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for old in std::mem::take(&mut self.backlog) {
            match File::open(&old) {
                Ok(mut file) => {
                    self.read_from(&mut file, &mut out)?;
                    // A torn last line of a closed generation never completes.
                    self.partial.clear();
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        loop {
            let Some(mut file) = self.current.take() else {
                match File::open(&self.path) {
                    Ok(file) => self.current = Some(file),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                    Err(e) => return Err(e),
                }
                continue;
            };
            let position = file.stream_position()?;
            if file.metadata()?.len() < position {
                // Truncated in place: start over.
                file.seek(SeekFrom::Start(0))?;
                self.partial.clear();
            }
            self.read_from(&mut file, &mut out)?;
            if self.names_live_file(&file)? {
                self.current = Some(file);
                return Ok(out);
            }
            // Rotated away: the writer no longer appends to it, so what is
            // there now is all it will hold.
            self.read_from(&mut file, &mut out)?;
            self.partial.clear();
        }
    }

    fn read_from(&mut self, file: &mut File, out: &mut Vec<Vec<u8>>) -> std::io::Result<()> {
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)?;
        self.partial.extend_from_slice(&buf);
        if let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') {
            let complete: Vec<u8> = self.partial.drain(..=end).collect();
            out.extend(complete[..end].split(|&b| b == b'\n').map(<[u8]>::to_vec));
        }
        Ok(())
    }

    fn names_live_file(&self, file: &File) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt as _;
        let open = file.metadata()?;
        match std::fs::metadata(&self.path) {
            Ok(live) => Ok(live.dev() == open.dev() && live.ino() == open.ino()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn append(path: &Path, text: &str) {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    fn rotate(log: &Path) {
        for n in (1..AUDIT_GENERATIONS).rev() {
            let _ = std::fs::rename(generation(log, n), generation(log, n + 1));
        }
        std::fs::rename(log, generation(log, 1)).unwrap();
    }

    fn text(lines: Vec<Vec<u8>>) -> Vec<String> {
        lines
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect()
    }

    #[test]
    fn generations_are_numbered_suffixes() {
        let log = Path::new("/s/logs/audit.jsonl");
        assert_eq!(generation(log, 0), log);
        assert_eq!(generation(log, 2), Path::new("/s/logs/audit.jsonl.2"));
    }

    #[test]
    fn reads_rotated_generations_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(AUDIT_LOG_FILE);
        append(&log, "a\n");
        rotate(&log);
        append(&log, "b\n");
        rotate(&log);
        append(&log, "c\npart");
        assert_eq!(text(AuditLines::new(&log).poll().unwrap()), ["a", "b", "c"]);
    }

    #[test]
    fn following_survives_a_rotation_and_holds_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(AUDIT_LOG_FILE);
        let mut lines = AuditLines::new(&log);
        assert!(lines.poll().unwrap().is_empty());
        append(&log, "one\ntw");
        assert_eq!(text(lines.poll().unwrap()), ["one"]);
        append(&log, "o\nthree\n");
        rotate(&log);
        append(&log, "four\n");
        assert_eq!(text(lines.poll().unwrap()), ["two", "three", "four"]);
        append(&log, "five\n");
        assert_eq!(text(lines.poll().unwrap()), ["five"]);
    }

    #[test]
    fn from_end_returns_only_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(AUDIT_LOG_FILE);
        append(&log, "old\n");
        let mut lines = AuditLines::from_end(&log).unwrap();
        assert!(lines.poll().unwrap().is_empty());
        append(&log, "new\n");
        assert_eq!(text(lines.poll().unwrap()), ["new"]);
    }

    #[test]
    fn health_follows_the_markers() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(audit_health(dir.path()), AuditHealth::Unknown);
        std::fs::write(dir.path().join(AUDIT_OK_MARKER), "").unwrap();
        assert_eq!(audit_health(dir.path()), AuditHealth::Ok);
        std::fs::rename(
            dir.path().join(AUDIT_OK_MARKER),
            dir.path().join(AUDIT_DEGRADED_MARKER),
        )
        .unwrap();
        assert_eq!(audit_health(dir.path()), AuditHealth::Degraded);
        assert_eq!(AuditHealth::Degraded.to_string(), "degraded");
    }
}
