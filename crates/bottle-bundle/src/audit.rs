//! The audit log: one JSON object per line, one line per decision.
//!
//! Format version 3 (field `v`; version 1 lines lack `count` and
//! `truncated`, version 1 and 2 lines `hosts`, and read with their
//! defaults). Lines are written with a single `write` on an `O_APPEND` file
//! under a mutex, so concurrent writers (the proxy and egress daemons, many
//! connections, and the host appending tool calls) never interleave, and
//! each line is flushed before the call returns.
//!
//! The agent chooses most of what is logged, so the log is bounded, and it
//! must not be able to flood its own history away:
//!
//! - agent-chosen fields are cut to a fixed length ([`PATH_BOUND`],
//!   [`FIELD_BOUND`]);
//! - decisions are merged within [`COALESCE_WINDOW`]: identical ones (same
//!   daemon, decision, host, port, method and reason), the first written at
//!   once and the rest as one counted line when the window closes; and the
//!   proxy's and egress's refusals, findings and injections by reason
//!   alone, whatever the host, method or path: the first
//!   [`WRITTEN_PER_WINDOW`] written at once, the rest as one counted line
//!   with a sample of [`HOST_SAMPLE`] hosts. So a flood of denials to
//!   distinct hosts costs five lines a second per reason. Pushes and
//!   operator decisions are never merged. At most [`MAX_WINDOWS`] windows
//!   of each kind are open;
//! - the live file is rotated at the cap from the bundle's limits, keeping
//!   [`AUDIT_GENERATIONS`] old ones; when rotation drops the oldest, its
//!   security-relevant lines ([`is_security_relevant`]) are carried to the
//!   kept file, within its own bound, and everything else it held is counted
//!   in the one-line summary of what was dropped ([`DroppedSummary`]), so
//!   the log says what it no longer holds. `bottle_core::audit_files` names
//!   the files and their bound.
//!
//! A write that fails degrades the log for good: the daemons then refuse
//! traffic ([`AUDIT_UNAVAILABLE`]) rather than forward it unaudited, and the
//! marker beside the log is renamed so the host sees it.
//!
//! The reader side ([`read_audit`], [`AuditFollower`]) reads the kept
//! lines, the summary and the rotated generations in order and follows the
//! live file across rotations.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bottle_core::audit_files::{
    AUDIT_DEGRADED_MARKER, AUDIT_GENERATIONS, AUDIT_OK_MARKER, AuditLines, KEPT_CAPS, dropped_file,
    generation, is_security_relevant, kept_file,
};
use serde::{Deserialize, Serialize};

use crate::BundleError;

/// Version written in every line's `v` field.
pub const AUDIT_VERSION: u32 = 3;
/// Longest request path kept, in bytes; longer ones are cut.
pub const PATH_BOUND: usize = 1024;
/// Longest host, method, reason or rule kept, in bytes.
pub const FIELD_BOUND: usize = 256;
/// Decisions merged with one written less than this long ago are counted,
/// not written: one line with their `count` follows when the window
/// closes.
pub const COALESCE_WINDOW: Duration = Duration::from_secs(1);
/// Distinct hosts a merged line names (`hosts`); the rest are in its count.
pub const HOST_SAMPLE: usize = 8;
/// Decisions merging by reason written on their own in a window before the
/// rest are counted: a few refusals a second, as an agent makes them in
/// ordinary work, read one by one; a flood costs these and one counted line
/// a second per reason.
pub const WRITTEN_PER_WINDOW: u32 = 4;
/// Merging windows open at once, of each kind (by reason, and exact); a
/// decision that needs another closes the oldest of its kind (its counted
/// line is written).
pub const MAX_WINDOWS: usize = 64;
/// Counts the summary of dropped lines keeps apart (by daemon, decision and
/// reason); the rest are counted together as `other`.
pub const SUMMARY_KEYS: usize = 32;
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
    /// Egress put a credential the agent never holds on a request it sends
    /// to the credential's host (over TLS it verifies); the reason names the
    /// credential (`credential:<name>`), never its value. Whether the
    /// upstream answered is the request's own line. Version 3.
    Inject,
    /// The summary of what rotation dropped ([`DroppedSummary`]). Version 3.
    Dropped,
    /// Failed (upstream unreachable, protocol error, ...).
    Error,
}

impl Decision {
    /// The name written in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::BlockedSecret => "blocked_secret",
            Self::Redacted => "redacted",
            Self::Inject => "inject",
            Self::Dropped => "dropped",
            Self::Error => "error",
        }
    }
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
    /// How many merged decisions this line stands for; the host, port,
    /// method, path, sizes and time are the last one's. Version 2; 1 in
    /// version 1 lines.
    #[serde(default = "one")]
    pub count: u64,
    /// Whether a field was cut to its bound (it then ends in
    /// `…[+N bytes]`). Version 2; written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// A counted line's distinct hosts, at most [`HOST_SAMPLE`] (the rest
    /// are in its count). Version 3; written only when not empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
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
        self.hosts.truncate(HOST_SAMPLE);
        for host in &mut self.hosts {
            cut |= bound_field(host, FIELD_BOUND);
        }
        self.truncated |= cut;
    }

    /// Whether this record merges into a window keyed `key`, compared in
    /// place: most lines on a busy tunnel repeat the last, and building the
    /// key for each would cost four allocations.
    fn has_merge_key(&self, key: &MergeKey) -> bool {
        // Every field named, so a field added to the key cannot be left
        // out of the comparison.
        let MergeKey {
            daemon,
            decision,
            reason,
            exact,
        } = key;
        let same_exact = match exact {
            None => self.merges_by_reason(),
            Some(Exact { host, port, method }) => {
                !self.merges_by_reason()
                    && self.port == *port
                    && &self.host == host
                    && &self.method == method
            }
        };
        self.decision == *decision && &self.daemon == daemon && &self.reason == reason && same_exact
    }

    /// Whether this line is written on its own whatever came before: a
    /// push git-gate let through or an operator's decision, each of which
    /// names refs or a request that a counted line (the last one's) would
    /// lose. The agent cannot make them faster than git and the operator
    /// run.
    fn never_merges(&self) -> bool {
        self.daemon == "supervise" || self.is_accepted_push()
    }

    /// Whether decisions like this one merge by reason alone: the proxy's
    /// and egress's refusals, findings and injections, and git-gate's
    /// refused pushes (a read-only repository or a malformed body is
    /// refused before git runs, so they cost the agent one request each),
    /// which an agent can make for as many hosts, methods and paths as it
    /// likes. Allowed requests, git-gate's other lines and supervise's
    /// merge only when identical.
    fn merges_by_reason(&self) -> bool {
        self.decision != Decision::Allow
            && (matches!(self.daemon.as_str(), "proxy" | "egress")
                || (self.daemon == "git-gate" && self.method == "push"))
    }

    fn is_accepted_push(&self) -> bool {
        self.daemon == "git-gate" && self.method == "push" && self.decision == Decision::Allow
    }

    fn merge_key(&self) -> MergeKey {
        MergeKey {
            daemon: self.daemon.clone(),
            decision: self.decision,
            reason: self.reason.clone(),
            exact: (!self.merges_by_reason()).then(|| Exact {
                host: self.host.clone(),
                port: self.port,
                method: self.method.clone(),
            }),
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

/// What makes two decisions one for merging.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MergeKey {
    daemon: String,
    decision: Decision,
    reason: String,
    /// `None` when the decision merges by reason alone.
    exact: Option<Exact>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Exact {
    host: String,
    port: u16,
    method: String,
}

/// A decision written and the ones merged into it since.
#[derive(Debug)]
struct Window {
    key: MergeKey,
    opened: Instant,
    /// Decisions written on their own in this window.
    written: u32,
    repeats: u64,
    last: Option<AuditRecord>,
    /// Distinct hosts of the repeats, for a by-reason window.
    hosts: Vec<String>,
}

impl Window {
    fn count(&mut self, record: AuditRecord) {
        self.repeats += 1;
        if self.key.exact.is_none()
            && self.hosts.len() < HOST_SAMPLE
            && !self.hosts.contains(&record.host)
        {
            self.hosts.push(record.host.clone());
        }
        self.last = Some(record);
    }

    /// The counted line, if anything was counted.
    fn counted(self) -> Option<AuditRecord> {
        let mut last = self.last?;
        last.count = self.repeats;
        last.hosts = self.hosts;
        Some(last)
    }
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
    /// Open merging windows, oldest first.
    windows: Vec<Window>,
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
        let log = Self {
            inner: Arc::new(AuditInner {
                path: path.to_path_buf(),
                bottle: bottle.to_string(),
                max_bytes,
                degraded: AtomicBool::new(false),
                writer: Mutex::new(Writer {
                    file,
                    windows: Vec::new(),
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

    /// Records one decision: written at once, or counted when one it merges
    /// with was written less than [`COALESCE_WINDOW`] ago. A failed write
    /// degrades the log ([`AuditLog::is_degraded`]).
    pub fn write(&self, mut record: AuditRecord) {
        record.bound();
        let mut writer = self.inner.lock();
        if self.is_degraded() {
            return;
        }
        if record.never_merges() {
            self.inner.append(&mut writer, &record);
            return;
        }
        if let Some(at) = writer
            .windows
            .iter()
            .position(|w| record.has_merge_key(&w.key))
        {
            let window = &mut writer.windows[at];
            if window.opened.elapsed() < COALESCE_WINDOW {
                if window.key.exact.is_none() && window.written < WRITTEN_PER_WINDOW {
                    window.written += 1;
                    self.inner.append(&mut writer, &record);
                } else {
                    window.count(record);
                }
                return;
            }
            let window = writer.windows.remove(at);
            self.inner.close_window(&mut writer, window);
        }
        // Windows merging by reason and exact ones are bounded apart, so
        // that requests the agent makes distinct at will (a new method
        // each) cannot push a flood's by-reason window out, which would cost
        // two lines each time.
        let key = record.merge_key();
        let by_reason = key.exact.is_none();
        let same_kind = |w: &Window| w.key.exact.is_none() == by_reason;
        if writer.windows.iter().filter(|w| same_kind(w)).count() >= MAX_WINDOWS
            && let Some(at) = writer.windows.iter().position(same_kind)
        {
            let oldest = writer.windows.remove(at);
            self.inner.close_window(&mut writer, oldest);
        }
        self.inner.append(&mut writer, &record);
        writer.windows.push(Window {
            key,
            opened: Instant::now(),
            written: 1,
            repeats: 0,
            last: None,
            hosts: Vec::new(),
        });
    }

    /// Writes the counted lines of the open windows now (a clean shutdown).
    pub fn flush(&self) {
        let mut writer = self.inner.lock();
        self.inner.close_windows(&mut writer, |_| true);
    }
}

impl AuditInner {
    fn lock(&self) -> MutexGuard<'_, Writer> {
        match self.writer.lock() {
            Ok(w) => w,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Ends a merging window, writing its repeats as one counted line.
    fn close_window(&self, writer: &mut Writer, window: Window) {
        if let Some(counted) = window.counted() {
            self.append(writer, &counted);
        }
    }

    /// Ends the windows `expired` picks, oldest first.
    fn close_windows(&self, writer: &mut Writer, expired: impl Fn(&Window) -> bool) {
        let (closing, open): (Vec<Window>, Vec<Window>) = std::mem::take(&mut writer.windows)
            .into_iter()
            .partition(&expired);
        writer.windows = open;
        for window in closing {
            self.close_window(writer, window);
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
        // The file's own size, not a count of ours: the host appends the
        // sandbox interface's lines to it too.
        let result = writer
            .file
            .metadata()
            .and_then(|meta| {
                if meta.len() > 0 && meta.len() + len > self.max_bytes {
                    self.rotate(writer)
                } else {
                    Ok(())
                }
            })
            .and_then(|()| writer.file.write_all(&line))
            .and_then(|()| writer.file.flush());
        if let Err(e) = result {
            self.degrade(&e);
        }
    }

    /// Rotates when the live file has passed the cap with no line of ours
    /// to trigger it (the host's lines while the bottle is quiet).
    fn rotate_if_full(&self, writer: &mut Writer) {
        if self.degraded.load(Ordering::SeqCst) {
            return;
        }
        let result = writer.file.metadata().and_then(|meta| {
            if meta.len() >= self.max_bytes {
                self.rotate(writer)
            } else {
                Ok(())
            }
        });
        if let Err(e) = result {
            self.degrade(&e);
        }
    }

    /// Keeps what the oldest generation holds of security (see
    /// [`AuditInner::carry`]), then `audit.jsonl.2` -> `.3`, ..., the live
    /// file -> `.1`, and a new live file. The oldest generation is
    /// overwritten by the rename.
    fn rotate(&self, writer: &mut Writer) -> std::io::Result<()> {
        self.carry(&generation(&self.path, AUDIT_GENERATIONS))?;
        for n in (1..AUDIT_GENERATIONS).rev() {
            match std::fs::rename(generation(&self.path, n), generation(&self.path, n + 1)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, generation(&self.path, 1))?;
        writer.file = open_append(&self.path)?;
        Ok(())
    }

    /// Before the generation at `oldest` is dropped: appends its
    /// security-relevant lines to the kept file while that stays within
    /// [`KEPT_CAPS`] caps, and counts every other line (and those the kept
    /// file has no room for) into the summary of what was dropped.
    ///
    /// It reads the whole generation (at most a cap and a little) under the
    /// writer's lock, once per cap written: at the 64 MiB default, a pause
    /// of a fraction of a second in the daemons' audit writes, against a
    /// history that outlasts any flood. A crash between this and the
    /// renames keeps those lines twice, never loses them.
    fn carry(&self, oldest: &Path) -> std::io::Result<()> {
        let data = match std::fs::read(oldest) {
            Ok(data) => data,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let kept_path = kept_file(&self.path);
        let kept_bound = KEPT_CAPS.saturating_mul(self.max_bytes);
        let mut kept_len = match std::fs::metadata(&kept_path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let summary_path = dropped_file(&self.path);
        let mut summary = DroppedSummary::read(&summary_path, &self.bottle);
        let summarised = summary.lines;
        let mut keep = Vec::new();
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let seen: Option<Seen<'_>> = serde_json::from_slice(line).ok();
            let relevant = seen
                .as_ref()
                .is_some_and(|s| is_security_relevant(&s.daemon, &s.decision, &s.method));
            let len = line.len() as u64 + 1;
            if relevant && kept_len + len <= kept_bound {
                keep.extend_from_slice(line);
                keep.push(b'\n');
                kept_len += len;
            } else {
                summary.add(seen.as_ref(), relevant);
            }
        }
        if !keep.is_empty() {
            let mut kept = open_append(&kept_path)?;
            kept.write_all(&keep)?;
            kept.flush()?;
        }
        if summary.lines > summarised {
            summary.write(&summary_path)?;
        }
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
        self.close_windows(&mut writer, |_| true);
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// What the summary reads of a dropped line (any version, the host's lines
/// included).
#[derive(Debug, Deserialize)]
struct Seen<'a> {
    #[serde(borrow, default)]
    time: Cow<'a, str>,
    #[serde(borrow, default)]
    daemon: Cow<'a, str>,
    #[serde(borrow, default)]
    decision: Cow<'a, str>,
    #[serde(borrow, default)]
    method: Cow<'a, str>,
    #[serde(borrow, default)]
    reason: Cow<'a, str>,
    #[serde(borrow, default)]
    host: Cow<'a, str>,
    #[serde(default = "one")]
    count: u64,
    #[serde(borrow, default)]
    hosts: Vec<Cow<'a, str>>,
}

/// How many dropped decisions had one daemon, decision and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedCount {
    /// The daemon (`*` for the `other` count).
    pub daemon: String,
    /// The decision, as written (`*` for the `other` count).
    pub decision: String,
    /// The reason (`other` once [`SUMMARY_KEYS`] are taken).
    pub reason: String,
    /// The decisions (a counted line's `count`, summed).
    pub count: u64,
}

/// The one line `audit.jsonl.dropped` holds: what rotation dropped from the
/// log since the bottle started, as an audit line (daemon `audit`,
/// decision `dropped`, reason `rotated`) whose `count` is the decisions
/// dropped and `time` the last one's. Rewritten whole at every drop (a new
/// file renamed over the old), so it never grows past
/// [`SUMMARY_BOUND`](bottle_core::audit_files::SUMMARY_BOUND).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedSummary {
    /// The line's audit fields.
    #[serde(flatten)]
    pub record: AuditRecord,
    /// The time of the first decision dropped.
    #[serde(default)]
    pub since: String,
    /// The lines dropped.
    #[serde(default)]
    pub lines: u64,
    /// Of the decisions dropped, how many were security-relevant but found
    /// the kept file full (the earliest are kept, later ones counted).
    #[serde(default)]
    pub unkept: u64,
    /// The decisions dropped, by daemon, decision and reason, most first
    /// when written; at most [`SUMMARY_KEYS`] and one `other`.
    #[serde(default)]
    pub dropped: Vec<DroppedCount>,
}

impl DroppedSummary {
    fn empty(bottle: &str) -> DroppedSummary {
        DroppedSummary {
            record: AuditRecord {
                v: AUDIT_VERSION,
                time: String::new(),
                bottle: bottle.to_string(),
                daemon: "audit".into(),
                decision: Decision::Dropped,
                host: String::new(),
                port: 0,
                method: String::new(),
                path: String::new(),
                status: 0,
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
                reason: "rotated".into(),
                rule: String::new(),
                count: 0,
                truncated: false,
                hosts: Vec::new(),
            },
            since: String::new(),
            lines: 0,
            unkept: 0,
            dropped: Vec::new(),
        }
    }

    /// The summary so far, or an empty one (none yet, or one that does not
    /// read: it is rewritten whole, so a torn one is only a restart).
    fn read(path: &Path, bottle: &str) -> DroppedSummary {
        std::fs::read(path)
            .ok()
            .and_then(|data| serde_json::from_slice(&data).ok())
            .unwrap_or_else(|| DroppedSummary::empty(bottle))
    }

    /// Counts one dropped line (`None`: it did not read as a record).
    fn add(&mut self, seen: Option<&Seen<'_>>, relevant: bool) {
        let cut = |text: &str| {
            let mut text = text.to_string();
            bound_field(&mut text, FIELD_BOUND);
            text
        };
        let (daemon, decision, reason, count) = match seen {
            Some(s) => (cut(&s.daemon), cut(&s.decision), cut(&s.reason), s.count),
            None => ("?".into(), "?".into(), "unreadable_line".into(), 1),
        };
        self.lines += 1;
        self.record.count += count;
        if relevant {
            self.unkept += count;
        }
        if let Some(s) = seen.filter(|s| !s.time.is_empty()) {
            if self.since.is_empty() {
                self.since = cut(&s.time);
            }
            self.record.time = cut(&s.time);
            for host in std::iter::once(&s.host).chain(&s.hosts) {
                if !host.is_empty()
                    && self.record.hosts.len() < HOST_SAMPLE
                    && !self.record.hosts.iter().any(|h| h == host)
                {
                    self.record.hosts.push(cut(host));
                }
            }
        }
        let at = self
            .dropped
            .iter()
            .position(|d| d.daemon == daemon && d.decision == decision && d.reason == reason);
        let at = match at {
            Some(at) => at,
            None if self.dropped.len() < SUMMARY_KEYS => {
                self.dropped.push(DroppedCount {
                    daemon,
                    decision,
                    reason,
                    count: 0,
                });
                self.dropped.len() - 1
            }
            None => {
                let other = self
                    .dropped
                    .iter()
                    .position(|d| d.daemon == "*" && d.reason == "other");
                match other {
                    Some(at) => at,
                    None => {
                        self.dropped.push(DroppedCount {
                            daemon: "*".into(),
                            decision: "*".into(),
                            reason: "other".into(),
                            count: 0,
                        });
                        self.dropped.len() - 1
                    }
                }
            }
        };
        self.dropped[at].count += count;
    }

    /// Replaces the file at `path` with this summary, as one line.
    fn write(&mut self, path: &Path) -> std::io::Result<()> {
        self.dropped.sort_by_key(|d| std::cmp::Reverse(d.count));
        let mut line = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut file = File::create(&tmp)?;
        file.write_all(&line)?;
        file.flush()?;
        drop(file);
        std::fs::rename(&tmp, path)
    }
}

/// Closes expired merging windows so a count is written within about
/// [`COALESCE_WINDOW`] even when no other decision comes, and rotates a
/// live file the host's lines took past the cap. Ends when the log is
/// dropped.
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
                inner.close_windows(&mut writer, |w| w.opened.elapsed() >= COALESCE_WINDOW);
                inner.rotate_if_full(&mut writer);
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

/// Reads every complete record in the log: the kept lines, the summary of
/// the dropped ones, then the rotated generations, oldest first. Lines that
/// are not valid records (a newer version, a torn write) are skipped.
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
    /// Starts at the kept lines, then the oldest rotated generation.
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
            hosts: Vec::new(),
        }
    }

    fn denial(host: &str, path: &str) -> AuditRecord {
        AuditRecord {
            decision: Decision::Deny,
            status: 403,
            path: path.into(),
            reason: "host_not_allowed".into(),
            ..rec(host)
        }
    }

    fn finding(host: &str) -> AuditRecord {
        AuditRecord {
            decision: Decision::BlockedSecret,
            status: 403,
            reason: "secret:aws_access_key_id".into(),
            ..rec(host)
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
        // Another decision has a window of its own: the two interleave
        // without costing a line each.
        for _ in 0..5 {
            log.write(rec("other"));
            log.write(rec("same"));
        }
        log.flush();
        let got = read_audit(&path).unwrap();
        let counts: Vec<(&str, u64)> = got.iter().map(|r| (r.host.as_str(), r.count)).collect();
        assert_eq!(
            counts,
            [("same", 1), ("other", 1), ("same", 104), ("other", 4)]
        );
        assert_eq!(got[2].path, "/");
        // Identical lines name no host sample: the host is the key.
        assert!(got[2].hosts.is_empty());
    }

    #[test]
    fn denials_to_distinct_hosts_merge_by_reason_with_a_bounded_sample() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        for i in 0..1000 {
            log.write(denial(&format!("h{i}.denied.test"), &format!("/{i}")));
        }
        // A finding for another host is its own window, merged by reason
        // too; an allowed request is keyed by its host.
        log.write(finding("a.allowed.test"));
        log.write(finding("b.allowed.test"));
        log.write(rec("a.allowed.test"));
        log.flush();
        let got = read_audit(&path).unwrap();
        let shape: Vec<(Decision, &str, u64)> = got
            .iter()
            .map(|r| (r.decision, r.host.as_str(), r.count))
            .collect();
        // The first few of a window are written as they come, the rest
        // counted in one line.
        let written = WRITTEN_PER_WINDOW as usize;
        let mut expected: Vec<(Decision, String, u64)> = (0..written)
            .map(|i| (Decision::Deny, format!("h{i}.denied.test"), 1))
            .collect();
        expected.extend([
            (Decision::BlockedSecret, "a.allowed.test".into(), 1),
            (Decision::BlockedSecret, "b.allowed.test".into(), 1),
            (Decision::Allow, "a.allowed.test".into(), 1),
            (
                Decision::Deny,
                "h999.denied.test".into(),
                1000 - written as u64,
            ),
        ]);
        let shape: Vec<(Decision, String, u64)> = shape
            .into_iter()
            .map(|(d, h, c)| (d, h.to_string(), c))
            .collect();
        assert_eq!(shape, expected);
        let sample: Vec<String> = (written..written + HOST_SAMPLE)
            .map(|i| format!("h{i}.denied.test"))
            .collect();
        let merged = got.last().unwrap();
        assert_eq!(merged.hosts, sample);
        assert_eq!(merged.path, "/999");
        // The version 3 field reads back, and only merged lines carry it.
        let raw = std::fs::read_to_string(&path).unwrap();
        assert_eq!(raw.matches("\"hosts\"").count(), 1, "{raw}");
        assert!(raw.lines().all(|l| l.starts_with("{\"v\":3,")));
    }

    #[test]
    fn open_windows_are_bounded_and_the_oldest_closes_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, "b", BIG).unwrap();
        log.write(rec("first"));
        log.write(rec("first"));
        // Distinct allowed hosts each need a window; the first one's count
        // is written when the bound pushes it out.
        for i in 0..MAX_WINDOWS {
            log.write(rec(&format!("h{i}")));
        }
        let got = read_audit(&path).unwrap();
        assert_eq!(got.len(), MAX_WINDOWS + 2);
        // "first" and 63 others fill the windows; the 64th pushes "first"
        // out, so its count comes just before that one.
        let last = format!("h{}", MAX_WINDOWS - 1);
        assert_eq!(
            (got[MAX_WINDOWS].host.as_str(), got[MAX_WINDOWS].count),
            ("first", 1)
        );
        assert_eq!(got[MAX_WINDOWS + 1].host, last);
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

    /// The hosts of the records in the log, and the summary of the dropped
    /// ones.
    fn hosts_and_summary(path: &Path) -> (Vec<String>, Option<DroppedSummary>) {
        let hosts = read_audit(path)
            .unwrap()
            .into_iter()
            .filter(|r| r.decision != Decision::Dropped)
            .map(|r| r.host)
            .collect();
        let summary = std::fs::read(dropped_file(path))
            .ok()
            .map(|d| serde_json::from_slice(&d).unwrap());
        (hosts, summary)
    }

    fn log_bytes(path: &Path) -> u64 {
        bottle_core::audit_files::log_files(path)
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum()
    }

    #[test]
    fn the_log_rotates_at_its_cap_keeps_a_few_generations_and_counts_what_it_drops() {
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
        let (hosts, summary) = hosts_and_summary(&path);
        // The newest are all there, in order.
        assert_eq!(hosts.last().unwrap(), "h399");
        let first: usize = hosts[0][1..].parse().unwrap();
        let expected: Vec<String> = (first..400).map(|i| format!("h{i}")).collect();
        assert_eq!(hosts, expected);
        // The rest are counted, not silently gone.
        let summary = summary.unwrap();
        assert_eq!(summary.record.count, first as u64);
        assert_eq!(summary.lines, first as u64);
        assert_eq!(summary.unkept, 0);
        assert_eq!(
            summary.dropped,
            [DroppedCount {
                daemon: "proxy".into(),
                decision: "allow".into(),
                reason: "allowed".into(),
                count: first as u64,
            }]
        );
        assert_eq!(summary.record.hosts.len(), HOST_SAMPLE);
        assert!(summary.since <= summary.record.time);
        // Nothing security-relevant was written, so nothing is kept.
        assert!(!kept_file(&path).exists());
        assert_eq!(read_audit(&path).unwrap()[0].decision, Decision::Dropped);
    }

    #[test]
    fn security_lines_outlive_any_flood_of_ordinary_ones_within_the_kept_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let cap = 8192;
        let log = AuditLog::open(&path, "b", cap).unwrap();
        log.write(finding("early.allowed.test"));
        // The host's tool call, appended beside the bundle's lines.
        bottle_core::sandbox::audit::append(
            &path,
            &bottle_core::sandbox::audit::SandboxRecord::tool(
                "b",
                "make",
                0,
                false,
                0,
                0,
                Duration::ZERO,
                "sha256:aa",
            ),
        )
        .unwrap();
        for i in 0..2000 {
            log.write(rec(&format!("h{i}")));
        }
        log.flush();
        let (hosts, summary) = hosts_and_summary(&path);
        assert_eq!(hosts[0], "early.allowed.test", "{hosts:?}");
        let raw = std::fs::read_to_string(kept_file(&path)).unwrap();
        assert!(raw.contains("\"evidence\":\"sha256:aa\""), "{raw}");
        assert_eq!(summary.unwrap().unkept, 0);
        assert!(
            log_bytes(&path) <= bottle_core::audit_files::audit_log_bound(cap),
            "{}",
            log_bytes(&path)
        );

        // A flood of security lines themselves fills the kept file only to
        // its bound: the earliest stay, the later ones are counted.
        for i in 0..2000 {
            let mut f = finding("flood.allowed.test");
            f.method = format!("M{i}");
            // Merged by reason: only distinct reasons cost lines.
            f.reason = format!("secret:kind{i}");
            log.write(f);
        }
        log.flush();
        let (hosts, summary) = hosts_and_summary(&path);
        assert_eq!(hosts[0], "early.allowed.test");
        let kept = std::fs::metadata(kept_file(&path)).unwrap().len();
        assert!(kept <= KEPT_CAPS * cap, "{kept}");
        let summary = summary.unwrap();
        assert!(summary.unkept > 0, "{summary:?}");
        assert!(summary.dropped.len() <= SUMMARY_KEYS + 1);
        let summary_len = std::fs::metadata(dropped_file(&path)).unwrap().len();
        assert!(
            summary_len <= bottle_core::audit_files::SUMMARY_BOUND,
            "{summary_len}"
        );
        assert!(log_bytes(&path) <= bottle_core::audit_files::audit_log_bound(cap));
    }

    #[test]
    fn a_live_file_the_host_filled_is_rotated_without_a_line_of_the_bundles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let cap = 4096;
        let _log = AuditLog::open(&path, "b", cap).unwrap();
        for _ in 0..30 {
            bottle_core::sandbox::audit::append(
                &path,
                &bottle_core::sandbox::audit::SandboxRecord::tool(
                    "b",
                    "make",
                    0,
                    false,
                    0,
                    0,
                    Duration::ZERO,
                    "sha256:aa",
                ),
            )
            .unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() > cap);
        bottle_test_support::wait_until("the rotation", Duration::from_secs(10), || {
            generation(&path, 1).exists()
        });
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
    fn version_three_lines_and_the_summary_parse() {
        let line = r#"{"v":3,"time":"2025-01-01T00:00:00.000Z","bottle":"b","daemon":"egress","decision":"deny","host":"h9","port":443,"method":"GET","path":"/","status":403,"bytes_up":0,"bytes_down":0,"duration_ms":0,"reason":"host_not_allowed","rule":"","count":7,"hosts":["h1","h9"]}"#;
        let r: AuditRecord = serde_json::from_str(line).unwrap();
        assert_eq!((r.count, r.hosts.len()), (7, 2));
        let inject = r#"{"v":3,"time":"2025-01-01T00:00:00.000Z","bottle":"b","daemon":"egress","decision":"inject","host":"api.github.com","port":443,"method":"POST","path":"/x","status":0,"bytes_up":0,"bytes_down":0,"duration_ms":0,"reason":"credential:github","rule":"api.github.com","count":1}"#;
        let r: AuditRecord = serde_json::from_str(inject).unwrap();
        assert_eq!(r.decision, Decision::Inject);
        let mut summary = DroppedSummary::empty("b");
        summary.add(None, false);
        let line = serde_json::to_string(&summary).unwrap();
        let r: AuditRecord = serde_json::from_str(&line).unwrap();
        assert_eq!((r.decision, r.count), (Decision::Dropped, 1));
        let back: DroppedSummary = serde_json::from_str(&line).unwrap();
        assert_eq!(back, summary);
        assert_eq!(back.dropped[0].reason, "unreadable_line");
    }

    #[test]
    fn version_two_lines_parse() {
        let line = r#"{"v":2,"time":"2025-01-01T00:00:00.000Z","bottle":"b","daemon":"proxy","decision":"deny","host":"h","port":443,"method":"GET","path":"/x…[+9 bytes]","status":403,"bytes_up":0,"bytes_down":0,"duration_ms":0,"reason":"host_not_allowed","rule":"h","count":7,"truncated":true}"#;
        let r: AuditRecord = serde_json::from_str(line).unwrap();
        assert_eq!((r.count, r.truncated), (7, true));
    }
}
