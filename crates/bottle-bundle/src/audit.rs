//! The audit log: one JSON object per line, one line per decision.
//!
//! Format version 1 (field `v`). Lines are written with a single `write` on
//! an `O_APPEND` file under a mutex, so concurrent writers (the proxy and
//! egress daemons, many connections) never interleave, and each line is
//! flushed before the call returns. The reader side ([`read_audit`],
//! [`AuditFollower`]) is what `bottle logs <bottle> [--follow]` uses; it
//! skips a trailing partial line until it is complete.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::BundleError;

/// Version written in every line's `v` field.
pub const AUDIT_VERSION: u32 = 1;

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Forwarded.
    Allow,
    /// Refused by policy.
    Deny,
    /// Refused because the request carried a secret.
    BlockedSecret,
    /// Failed (upstream unreachable, protocol error, ...).
    Error,
}

/// One audit line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// [`AUDIT_VERSION`].
    pub v: u32,
    /// RFC 3339 UTC time the decision completed.
    pub time: String,
    /// The bottle.
    pub bottle: String,
    /// `proxy`, `egress`, `git-gate` or `supervise`.
    pub daemon: String,
    /// The decision.
    pub decision: Decision,
    /// Destination host (normalised when it could be parsed).
    pub host: String,
    /// Destination port (0 when unknown).
    pub port: u16,
    /// HTTP method (`CONNECT` for tunnel set-up).
    pub method: String,
    /// Request path; query values are replaced by `…` so that secrets in
    /// them never reach the log.
    pub path: String,
    /// HTTP status returned to the client (0 when none was sent).
    #[serde(default)]
    pub status: u16,
    /// Request body bytes sent upstream.
    pub bytes_up: u64,
    /// Response body bytes sent back to the client.
    pub bytes_down: u64,
    /// Time from request to end of response.
    pub duration_ms: u64,
    /// Why (`allowed`, `host_not_allowed`, `secret:github_token`, ...).
    pub reason: String,
    /// The allowlist rule that matched, or the rule to add.
    pub rule: String,
}

/// Appends audit lines; cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditLog {
    inner: Arc<AuditInner>,
}

#[derive(Debug)]
struct AuditInner {
    path: PathBuf,
    file: Mutex<File>,
    bottle: String,
}

impl AuditLog {
    /// Opens (creating) the log for appending.
    pub fn open(path: &Path, bottle: &str) -> Result<Self, BundleError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| BundleError::Audit {
                path: path.display().to_string(),
                source,
            })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| BundleError::Audit {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self {
            inner: Arc::new(AuditInner {
                path: path.to_path_buf(),
                file: Mutex::new(file),
                bottle: bottle.to_string(),
            }),
        })
    }

    /// The bottle name stamped on each line.
    pub fn bottle(&self) -> &str {
        &self.inner.bottle
    }

    /// Writes one line. A failed write is reported on stderr and otherwise
    /// ignored: refusing traffic because the log disk is full would be a
    /// denial of service, and every denial is already enforced.
    pub fn write(&self, record: &AuditRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                crate::log!("could not encode audit record: {e}");
                return;
            }
        };
        line.push(b'\n');
        let mut file = match self.inner.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = file.write_all(&line).and_then(|()| file.flush()) {
            crate::log!(
                "could not write audit log {}: {e}",
                self.inner.path.display()
            );
        }
    }
}

/// Redacts query values: `/a?x=1&y` becomes `/a?x=…&y`.
pub fn redact_path(path_and_query: &str) -> String {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_string();
    };
    let redacted: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) => format!("{k}=…"),
            None => pair.to_string(),
        })
        .collect();
    format!("{path}?{}", redacted.join("&"))
}

/// Reads every complete record in the log. Lines that are not valid records
/// (a newer version, a torn write) are skipped.
pub fn read_audit(path: &Path) -> Result<Vec<AuditRecord>, BundleError> {
    let mut follower = AuditFollower::new(path);
    follower.poll()
}

/// Tails the audit log: each [`AuditFollower::poll`] returns the records
/// appended since the last call. Missing file = no records yet.
#[derive(Debug)]
pub struct AuditFollower {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl AuditFollower {
    /// Starts at the beginning of the file.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// Starts at the current end of the file (only new lines are returned).
    pub fn from_end(path: &Path) -> Result<Self, BundleError> {
        let mut f = Self::new(path);
        f.offset = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => {
                return Err(BundleError::Audit {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        Ok(f)
    }

    /// Returns the complete records appended since the last poll.
    pub fn poll(&mut self) -> Result<Vec<AuditRecord>, BundleError> {
        let err = |source| BundleError::Audit {
            path: self.path.display().to_string(),
            source,
        };
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        };
        let len = file.metadata().map_err(err)?.len();
        if len < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
            self.partial.clear();
        }
        file.seek(SeekFrom::Start(self.offset)).map_err(err)?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).map_err(err)?;
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let mut out = Vec::new();
        let mut consumed = 0;
        while let Some(nl) = self.partial[consumed..].iter().position(|&b| b == b'\n') {
            let line = &self.partial[consumed..consumed + nl];
            consumed += nl + 1;
            if let Ok(rec) = serde_json::from_slice::<AuditRecord>(line) {
                out.push(rec);
            }
        }
        self.partial.drain(..consumed);
        Ok(out)
    }
}

impl AuditFollower {
    /// Calls `on_record` for every record now in the log and then for each
    /// one appended, polling every `interval`, until it returns
    /// `ControlFlow::Break` (`bottle logs --follow`).
    pub fn follow(
        &mut self,
        interval: std::time::Duration,
        mut on_record: impl FnMut(&AuditRecord) -> std::ops::ControlFlow<()>,
    ) -> Result<(), BundleError> {
        loop {
            for rec in self.poll()? {
                if on_record(&rec).is_break() {
                    return Ok(());
                }
            }
            std::thread::sleep(interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(host: &str) -> AuditRecord {
        AuditRecord {
            v: AUDIT_VERSION,
            time: bottle_core::time::now_rfc3339_millis(),
            bottle: "b".into(),
            daemon: "proxy".into(),
            decision: Decision::Allow,
            host: host.into(),
            port: 443,
            method: "GET".into(),
            path: "/".into(),
            status: 200,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            reason: "allowed".into(),
            rule: host.into(),
        }
    }

    #[test]
    fn redacts_query_values() {
        assert_eq!(redact_path("/a/b?x=1&y&z=secret"), "/a/b?x=…&y&z=…");
        assert_eq!(redact_path("/plain"), "/plain");
    }

    #[test]
    fn writes_and_follows_lines_including_partial_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut follower = AuditFollower::new(&path);
        assert!(follower.poll().unwrap().is_empty());
        let log = AuditLog::open(&path, "b").unwrap();
        log.write(&rec("a.example"));
        // A torn line is held back until complete.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":1")
            .unwrap();
        let got = follower.poll().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].host, "a.example");
        assert!(got[0].time.ends_with('Z'));
        let all = read_audit(&path).unwrap();
        assert_eq!(all.len(), 1);
    }

    #[test]
    fn concurrent_writers_never_interleave() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b").unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        log.write(&rec(&format!("h{t}-{i}-{}", "x".repeat(300))));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1600);
        assert_eq!(read_audit(&path).unwrap().len(), 1600);
    }

    #[test]
    fn follow_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b").unwrap();
        log.write(&rec("one"));
        log.write(&rec("two"));
        let mut seen = Vec::new();
        AuditFollower::new(&path)
            .follow(std::time::Duration::from_millis(10), |r| {
                seen.push(r.host.clone());
                if seen.len() == 2 {
                    std::ops::ControlFlow::Break(())
                } else {
                    std::ops::ControlFlow::Continue(())
                }
            })
            .unwrap();
        assert_eq!(seen, ["one", "two"]);
        let mut tail = AuditFollower::from_end(&path).unwrap();
        assert!(tail.poll().unwrap().is_empty());
        log.write(&rec("three"));
        assert_eq!(tail.poll().unwrap()[0].host, "three");
    }

    #[test]
    fn version_one_lines_parse() {
        let line = r#"{"v":1,"time":"2025-01-01T00:00:00.000Z","bottle":"b","daemon":"proxy","decision":"blocked_secret","host":"h","port":443,"method":"POST","path":"/","bytes_up":1,"bytes_down":0,"duration_ms":3,"reason":"secret:aws_access_key_id","rule":"h"}"#;
        let r: AuditRecord = serde_json::from_str(line).unwrap();
        assert_eq!(r.decision, Decision::BlockedSecret);
        assert_eq!(r.status, 0);
    }
}
