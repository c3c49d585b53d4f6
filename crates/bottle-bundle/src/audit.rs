//! The audit log: one JSON object per line, one line per decision.
//!
//! Format version 2 (field `v`; version 1 lines lack `count` and
//! `truncated` and read with their defaults). Lines are written with a
//! single `write` on an `O_APPEND` file under a mutex, so concurrent writers
//! (the proxy and egress daemons, many connections) never interleave, and
//! each line is flushed before the call returns.
//!
//! The agent chooses most of what is logged, so the log is bounded three
//! ways: agent-chosen fields are cut to a fixed length ([`PATH_BOUND`],
//! [`FIELD_BOUND`]), identical decisions within [`COALESCE_WINDOW`] become
//! one line with a `count`, and the live file is rotated at the cap from
//! the bundle's limits, keeping [`AUDIT_GENERATIONS`] old ones. A write that fails degrades the log for good: the daemons then
//! refuse traffic ([`AUDIT_UNAVAILABLE`]) rather than forward it unaudited,
//! and the marker beside the log is renamed so the host sees it.
//!
//! The reader side ([`read_audit`], [`AuditFollower`]) reads the rotated
//! generations in order and follows the live file across rotations.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bottle_core::audit_files::{
    AUDIT_DEGRADED_MARKER, AUDIT_GENERATIONS, AUDIT_OK_MARKER, AuditLines, generation,
};
use serde::{Deserialize, Serialize};

use crate::BundleError;

/// Version written in every line's `v` field.
pub const AUDIT_VERSION: u32 = 2;
/// Longest request path kept, in bytes; longer ones are cut.
pub const PATH_BOUND: usize = 1024;
/// Longest host, method, reason or rule kept, in bytes.
pub const FIELD_BOUND: usize = 256;
/// Identical decisions within this long of the first one written are
/// counted, not written: one line with their `count` follows when the
/// window closes or a different decision comes.
pub const COALESCE_WINDOW: Duration = Duration::from_secs(1);
/// The reason of a refusal because the audit log cannot be written.
pub const AUDIT_UNAVAILABLE: &str = "audit_unavailable";
/// What the agent reads when it is refused for [`AUDIT_UNAVAILABLE`]
/// (with status 503).
pub const AUDIT_UNAVAILABLE_MESSAGE: &str = "bottle: refused (audit_unavailable): the bottle's audit \
     log cannot be written, so nothing is let through; the operator must free space for it and \
     restart the bottle";

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Forwarded.
    Allow,
    /// Refused by policy.
    Deny,
    /// Refused because the request carried a secret.
    BlockedSecret,
    /// Forwarded with the secrets it carried masked (a host whose
    /// `on_secret` is `redact`); the reason names their kinds.
    Redacted,
    /// Failed (upstream unreachable, protocol error, ...).
    Error,
}

/// One audit line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// [`AUDIT_VERSION`].
    pub v: u32,
    /// RFC 3339 UTC time the decision completed (of the last one, for a
    /// counted line).
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
    /// How many identical decisions (same daemon, decision, host, port,
    /// method and reason) this line stands for; the path, sizes and time are
    /// the last one's. Version 2; 1 in version 1 lines.
    #[serde(default = "one")]
    pub count: u64,
    /// Whether a field was cut to its bound (it then ends in
    /// `…[+N bytes]`). Version 2; written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

fn one() -> u64 {
    1
}

impl AuditRecord {
    /// Cuts every agent-chosen field to its bound, on a char boundary,
    /// marking the cut with `…[+N bytes]` and `truncated`.
    fn bound(&mut self) {
        let mut cut = bound_field(&mut self.path, PATH_BOUND);
        for field in [
            &mut self.host,
            &mut self.method,
            &mut self.reason,
            &mut self.rule,
        ] {
            cut |= bound_field(field, FIELD_BOUND);
        }
        self.truncated |= cut;
    }

    /// Whether `key` is this record's coalescing key, compared in place:
    /// most lines on a busy tunnel repeat the last, and building the key
    /// for each would cost four allocations.
    fn has_coalesce_key(&self, key: &CoalesceKey) -> bool {
        // Every field named, so a field added to the key cannot be left
        // out of the comparison.
        let CoalesceKey {
            daemon,
            decision,
            host,
            port,
            method,
            reason,
        } = key;
        self.decision == *decision
            && self.port == *port
            && &self.daemon == daemon
            && &self.host == host
            && &self.method == method
            && &self.reason == reason
    }

    fn coalesce_key(&self) -> CoalesceKey {
        CoalesceKey {
            daemon: self.daemon.clone(),
            decision: self.decision,
            host: self.host.clone(),
            port: self.port,
            method: self.method.clone(),
            reason: self.reason.clone(),
        }
    }
}

/// Cuts `field` to at most `max` bytes of its text plus a marker naming how
/// many bytes were dropped. Returns whether it cut.
fn bound_field(field: &mut String, max: usize) -> bool {
    if field.len() <= max {
        return false;
    }
    let keep = field.floor_char_boundary(max);
    let dropped = field.len() - keep;
    field.truncate(keep);
    field.push_str(&format!("…[+{dropped} bytes]"));
    true
}

/// What makes two decisions the same for coalescing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CoalesceKey {
    daemon: String,
    decision: Decision,
    host: String,
    port: u16,
    method: String,
    reason: String,
}

/// The decision last written and the identical ones counted since.
#[derive(Debug)]
struct Window {
    key: CoalesceKey,
    opened: Instant,
    repeats: u64,
    last: Option<AuditRecord>,
}

/// Appends audit lines; cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditLog {
    inner: Arc<AuditInner>,
}

#[derive(Debug)]
struct AuditInner {
    path: PathBuf,
    bottle: String,
    max_bytes: u64,
    degraded: AtomicBool,
    writer: Mutex<Writer>,
}

#[derive(Debug)]
struct Writer {
    file: File,
    /// Bytes in the live file.
    size: u64,
    window: Option<Window>,
}

impl AuditLog {
    /// Opens (creating) the log for appending; it is rotated when the next
    /// line would take it past `max_bytes`.
    pub fn open(path: &Path, bottle: &str, max_bytes: u64) -> Result<Self, BundleError> {
        let err = |source| BundleError::Audit {
            path: path.display().to_string(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        let file = open_append(path).map_err(err)?;
        let size = file.metadata().map_err(err)?.len();
        let log = Self {
            inner: Arc::new(AuditInner {
                path: path.to_path_buf(),
                bottle: bottle.to_string(),
                max_bytes,
                degraded: AtomicBool::new(false),
                writer: Mutex::new(Writer {
                    file,
                    size,
                    window: None,
                }),
            }),
        };
        spawn_window_closer(Arc::downgrade(&log.inner));
        Ok(log)
    }

    /// The bottle name stamped on each line.
    pub fn bottle(&self) -> &str {
        &self.inner.bottle
    }

    /// Whether a write has failed: from then on nothing is audited, so the
    /// daemons must refuse traffic with [`AUDIT_UNAVAILABLE`].
    pub fn is_degraded(&self) -> bool {
        self.inner.degraded.load(Ordering::SeqCst)
    }

    /// Records one decision: written at once, or counted when an identical
    /// one was written less than [`COALESCE_WINDOW`] ago. A failed write
    /// degrades the log ([`AuditLog::is_degraded`]).
    pub fn write(&self, mut record: AuditRecord) {
        record.bound();
        let mut writer = self.inner.lock();
        if self.is_degraded() {
            return;
        }
        if let Some(window) = writer.window.as_mut()
            && record.has_coalesce_key(&window.key)
            && window.opened.elapsed() < COALESCE_WINDOW
        {
            window.repeats += 1;
            window.last = Some(record);
            return;
        }
        self.inner.close_window(&mut writer);
        self.inner.append(&mut writer, &record);
        writer.window = Some(Window {
            key: record.coalesce_key(),
            opened: Instant::now(),
            repeats: 0,
            last: None,
        });
    }

    /// Writes the counted line of the open window now (a clean shutdown).
    pub fn flush(&self) {
        let mut writer = self.inner.lock();
        self.inner.close_window(&mut writer);
    }
}

impl AuditInner {
    fn lock(&self) -> MutexGuard<'_, Writer> {
        match self.writer.lock() {
            Ok(w) => w,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Ends the coalescing window, writing its repeats as one counted line.
    fn close_window(&self, writer: &mut Writer) {
        let Some(window) = writer.window.take() else {
            return;
        };
        if let Some(mut last) = window.last {
            last.count = window.repeats;
            self.append(writer, &last);
        }
    }

    fn append(&self, writer: &mut Writer, record: &AuditRecord) {
        if self.degraded.load(Ordering::SeqCst) {
            return;
        }
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                crate::log!("could not encode audit record: {e}");
                return;
            }
        };
        line.push(b'\n');
        let len = line.len() as u64;
        let result = if writer.size > 0 && writer.size + len > self.max_bytes {
            self.rotate(writer)
        } else {
            Ok(())
        }
        .and_then(|()| writer.file.write_all(&line))
        .and_then(|()| writer.file.flush());
        match result {
            Ok(()) => writer.size += len,
            Err(e) => self.degrade(&e),
        }
    }

    /// `audit.jsonl.2` -> `.3`, ..., the live file -> `.1`, then a new live
    /// file. The oldest generation is overwritten by the rename.
    fn rotate(&self, writer: &mut Writer) -> std::io::Result<()> {
        for n in (1..AUDIT_GENERATIONS).rev() {
            match std::fs::rename(generation(&self.path, n), generation(&self.path, n + 1)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, generation(&self.path, 1))?;
        writer.file = open_append(&self.path)?;
        writer.size = 0;
        Ok(())
    }

    /// Fails closed: no more lines, the daemons refuse traffic, and the
    /// host's marker says so.
    fn degrade(&self, error: &std::io::Error) {
        if self.degraded.swap(true, Ordering::SeqCst) {
            return;
        }
        crate::log!(
            "could not write audit log {}: {error}; refusing all traffic from now on",
            self.path.display()
        );
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let degraded = dir.join(AUDIT_DEGRADED_MARKER);
        // A rename needs no free blocks; creating the marker is the
        // fallback when the host made none.
        if let Err(e) = std::fs::rename(dir.join(AUDIT_OK_MARKER), &degraded)
            .or_else(|_| File::create(&degraded).map(drop))
        {
            crate::log!(
                "could not mark the audit log degraded in {}: {e}",
                dir.display()
            );
        }
    }
}

impl Drop for AuditInner {
    fn drop(&mut self) {
        let mut writer = self.lock();
        self.close_window(&mut writer);
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Closes expired coalescing windows so a count is written within about
/// [`COALESCE_WINDOW`] even when no other decision comes. Ends when the log
/// is dropped.
fn spawn_window_closer(inner: Weak<AuditInner>) {
    let tick = COALESCE_WINDOW / 4;
    let spawned = std::thread::Builder::new()
        .name("audit-window".into())
        .spawn(move || {
            loop {
                std::thread::sleep(tick);
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let mut writer = inner.lock();
                if writer
                    .window
                    .as_ref()
                    .is_some_and(|w| w.opened.elapsed() >= COALESCE_WINDOW)
                {
                    inner.close_window(&mut writer);
                }
            }
        });
    if let Err(e) = spawned {
        // Counts are still written by the next different decision and at
        // shutdown.
        crate::log!("could not start the audit window closer: {e}");
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

/// Reads every complete record in the log, oldest rotated generation
/// first. Lines that are not valid records (a newer version, a torn write)
/// are skipped.
pub fn read_audit(path: &Path) -> Result<Vec<AuditRecord>, BundleError> {
    AuditFollower::new(path).poll()
}

/// Tails the audit log across rotations: each [`AuditFollower::poll`]
/// returns the records appended since the last call. Missing file = no
/// records yet.
#[derive(Debug)]
pub struct AuditFollower {
    path: PathBuf,
    lines: AuditLines,
}

impl AuditFollower {
    /// Starts at the oldest rotated generation.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            lines: AuditLines::new(path),
        }
    }

    /// Starts at the current end of the file (only new lines are returned).
    pub fn from_end(path: &Path) -> Result<Self, BundleError> {
        Ok(Self {
            path: path.to_path_buf(),
            lines: AuditLines::from_end(path).map_err(|source| BundleError::Audit {
                path: path.display().to_string(),
                source,
            })?,
        })
    }

    /// Returns the complete records appended since the last poll.
    pub fn poll(&mut self) -> Result<Vec<AuditRecord>, BundleError> {
        let lines = self.lines.poll().map_err(|source| BundleError::Audit {
            path: self.path.display().to_string(),
            source,
        })?;
        Ok(lines
            .iter()
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect())
    }

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
    use std::io::Write as _;

    use bottle_core::audit_files::{AuditHealth, audit_health};

    use super::*;

    const BIG: u64 = 64 << 20;

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
            count: 1,
            truncated: false,
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
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        log.write(rec("a.example"));
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
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        log.write(rec(&format!("h{t}-{i}-{}", "x".repeat(200))));
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
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        log.write(rec("one"));
        log.write(rec("two"));
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
        log.write(rec("three"));
        assert_eq!(tail.poll().unwrap()[0].host, "three");
    }

    #[test]
    fn long_agent_fields_are_cut_on_a_char_boundary_and_marked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        let mut long = rec(&"h".repeat(1000));
        long.path = format!("/{}", "é".repeat(2000));
        long.reason = "r".repeat(300);
        log.write(long);
        log.write(rec("short"));
        let got = read_audit(&path).unwrap();
        assert!(got[0].truncated);
        assert!(
            got[0].path.len() <= PATH_BOUND + 20,
            "{}",
            got[0].path.len()
        );
        // "/" then 511 two-byte chars fit in 1024 bytes; the rest is counted.
        assert!(
            got[0]
                .path
                .ends_with(&format!("é…[+{} bytes]", 4001 - 1023))
        );
        assert!(got[0].host.ends_with("h…[+744 bytes]"));
        assert!(got[0].reason.ends_with("…[+44 bytes]"));
        assert!(!got[1].truncated);
        let raw = std::fs::read_to_string(&path).unwrap();
        assert!(!raw.lines().nth(1).unwrap().contains("truncated"));
    }

    #[test]
    fn identical_decisions_are_counted_and_the_count_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        for i in 0..100 {
            let mut r = rec("same");
            r.path = format!("/{i}");
            log.write(r);
        }
        // The first is written at once, the repeats wait.
        let now = read_audit(&path).unwrap();
        assert_eq!(
            (now.len(), now[0].count, now[0].path.as_str()),
            (1, 1, "/0")
        );
        log.write(rec("other"));
        let got = read_audit(&path).unwrap();
        let counts: Vec<(&str, u64)> = got.iter().map(|r| (r.host.as_str(), r.count)).collect();
        assert_eq!(counts, [("same", 1), ("same", 99), ("other", 1)]);
        assert_eq!(got[1].path, "/99");
        for _ in 0..5 {
            log.write(rec("other"));
        }
        log.flush();
        assert_eq!(read_audit(&path).unwrap().last().unwrap().count, 5);
    }

    #[test]
    fn an_open_window_is_closed_without_another_decision() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        log.write(rec("same"));
        log.write(rec("same"));
        bottle_test_support::wait_until("the counted line", Duration::from_secs(10), || {
            read_audit(&path).unwrap().len() == 2
        });
        assert_eq!(read_audit(&path).unwrap()[1].count, 1);
    }

    #[test]
    fn the_log_rotates_at_its_cap_and_keeps_a_few_generations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let cap = 4096;
        let log = AuditLog::open(&path, "b", cap).unwrap();
        for i in 0..400 {
            log.write(rec(&format!("h{i}")));
        }
        log.flush();
        for n in 0..=AUDIT_GENERATIONS {
            let size = std::fs::metadata(generation(&path, n)).unwrap().len();
            assert!(size <= cap, "generation {n}: {size}");
        }
        assert!(!generation(&path, AUDIT_GENERATIONS + 1).exists());
        let kept = read_audit(&path).unwrap();
        let hosts: Vec<String> = kept.iter().map(|r| r.host.clone()).collect();
        // The newest are all there, in order.
        assert_eq!(hosts.last().unwrap(), "h399");
        let first: usize = hosts[0][1..].parse().unwrap();
        let expected: Vec<String> = (first..400).map(|i| format!("h{i}")).collect();
        assert_eq!(hosts, expected);
        assert!(first > 0);
    }

    #[test]
    fn a_failed_write_degrades_the_log_and_renames_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(dir.path().join(AUDIT_OK_MARKER), "").unwrap();
        // Every write to /dev/full fails with ENOSPC.
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        assert!(!log.is_degraded());
        assert_eq!(audit_health(dir.path()), AuditHealth::Ok);
        log.write(rec("a"));
        assert!(log.is_degraded());
        assert_eq!(audit_health(dir.path()), AuditHealth::Degraded);
        assert!(!dir.path().join(AUDIT_OK_MARKER).exists());
    }

    #[test]
    fn a_failed_write_without_a_marker_creates_the_degraded_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        log.write(rec("a"));
        assert_eq!(audit_health(dir.path()), AuditHealth::Degraded);
    }

    #[test]
    fn version_one_lines_parse() {
        let line = r#"{"v":1,"time":"2025-01-01T00:00:00.000Z","bottle":"b","daemon":"proxy","decision":"blocked_secret","host":"h","port":443,"method":"POST","path":"/","bytes_up":1,"bytes_down":0,"duration_ms":3,"reason":"secret:aws_access_key_id","rule":"h"}"#;
        let r: AuditRecord = serde_json::from_str(line).unwrap();
        assert_eq!(r.decision, Decision::BlockedSecret);
        assert_eq!((r.status, r.count, r.truncated), (0, 1, false));
    }

    #[test]
    fn version_two_lines_parse() {
        let line = r#"{"v":2,"time":"2025-01-01T00:00:00.000Z","bottle":"b","daemon":"proxy","decision":"deny","host":"h","port":443,"method":"GET","path":"/x…[+9 bytes]","status":403,"bytes_up":0,"bytes_down":0,"duration_ms":0,"reason":"host_not_allowed","rule":"h","count":7,"truncated":true}"#;
        let r: AuditRecord = serde_json::from_str(line).unwrap();
        assert_eq!((r.count, r.truncated), (7, true));
    }
}
