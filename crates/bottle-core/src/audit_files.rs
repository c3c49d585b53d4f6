//! The audit log's files on the host: its name, its rotated generations,
//! the health marker beside it, and a reader that follows the log across
//! rotations.
//!
//! The bundle writes and rotates the log, the backends create the marker
//! at launch, and `bottle logs` / `bottle list` read both: one definition
//! here keeps the four from drifting apart. The log lives in the bottle's
//! `<state_dir>/logs`, which the bundle sees at
//! [`BUNDLE_LOG_DIR`](crate::bundle::BUNDLE_LOG_DIR).
//!
//! The log is the one record of what the agent did, so it outlives the
//! bottle: when a backend removes a state dir it first moves the log's
//! files to a retained run ([`retain_audit_log`]), which `bottle
//! logs` reads by the bottle's name ([`retained_runs`]) until `bottle
//! cleanup --logs-older-than` prunes it ([`prune_retained_logs`]).
//!
//! **What survives the agent.** The agent chooses most of what is logged,
//! and a flood could rotate the oldest lines away. So the log is a stream
//! and two files beside it ([`log_files`], in reading order):
//!
//! - `audit.jsonl.kept`: the security-relevant lines
//!   ([`is_security_relevant`]) of every generation rotation dropped, in
//!   order, up to the cap ([`KEPT_CAPS`]): the earliest findings,
//!   credential injections, tool calls, pushes, approvals and resets;
//! - `audit.jsonl.dropped`: one line, rewritten whole at each drop, that
//!   counts what the drops took (by daemon, decision and reason; bounded,
//!   [`SUMMARY_BOUND`]);
//! - the stream itself: `audit.jsonl.3` .. `audit.jsonl.1`, then the live
//!   `audit.jsonl`, each rotated at the cap ([`AUDIT_GENERATIONS`]).
//!
//! Together they never take more than [`audit_log_bound`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Coded;

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
/// The kept file's bound, in caps: security-relevant lines carried out of
/// dropped generations stop being kept (they are counted instead) once it
/// would pass `KEPT_CAPS × cap`.
pub const KEPT_CAPS: u64 = 1;
/// The most the dropped-lines summary takes: its counts are bounded in
/// number and each field in length.
pub const SUMMARY_BOUND: u64 = 32 << 10;
/// What one generation may pass the cap by: the bundle rotates before its
/// own line would pass it, but the host appends tool calls and resets
/// between the bundle's checks (every quarter second).
pub const GENERATION_SLACK: u64 = 64 << 10;

/// The security-relevant lines `audit.jsonl.kept` keeps when rotation drops
/// their generation, given to `log`, the live file.
pub fn kept_file(log: &Path) -> PathBuf {
    suffixed(log, "kept")
}

/// The one-line summary of what rotation dropped, beside `log`.
pub fn dropped_file(log: &Path) -> PathBuf {
    suffixed(log, "dropped")
}

fn suffixed(log: &Path, suffix: &str) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{suffix}"));
    PathBuf::from(name)
}

/// Every file of the log at `log`, in reading order: the kept lines, the
/// summary of the dropped ones, the rotated generations oldest first, the
/// live file. Some may not exist.
pub fn log_files(log: &Path) -> Vec<PathBuf> {
    let mut files = vec![kept_file(log), dropped_file(log)];
    files.extend((1..=AUDIT_GENERATIONS).rev().map(|n| generation(log, n)));
    files.push(log.to_path_buf());
    files
}

/// The most a log rotated at `cap` takes on disk, all its files together:
/// the stream's generations (the live file and [`AUDIT_GENERATIONS`] old
/// ones, each within `cap` plus [`GENERATION_SLACK`]), the kept lines
/// ([`KEPT_CAPS`] × `cap`) and the summary ([`SUMMARY_BOUND`]).
pub fn audit_log_bound(cap: u64) -> u64 {
    (u64::from(AUDIT_GENERATIONS) + 1) * (cap + GENERATION_SLACK) + KEPT_CAPS * cap + SUMMARY_BOUND
}

/// Whether a line is security-relevant, and so kept when rotation drops
/// its generation: a secret finding (`blocked_secret`, `redacted`), a
/// credential injection (`inject`), a tool call or reset (daemon `sandbox`),
/// a push git-gate let through (an `allow` `push` line: refused ones are
/// refusals like the proxy's, which the agent can make one per request and
/// which would otherwise crowd the kept lines out) or an operator's
/// decision (daemon `supervise`). One definition, for the bundle that keeps
/// them and the tests and gate that look for them.
pub fn is_security_relevant(daemon: &str, decision: &str, method: &str) -> bool {
    matches!(decision, "blocked_secret" | "redacted" | "inject")
        || matches!(daemon, "sandbox" | "supervise")
        || (daemon == "git-gate" && method == "push" && decision == "allow")
}

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
    /// Starts at the kept lines, then the summary of the dropped ones, then
    /// the oldest rotated generation (`bottle logs`).
    pub fn new(path: &Path) -> Self {
        let mut backlog = log_files(path);
        backlog.pop();
        Self {
            path: path.to_path_buf(),
            current: None,
            backlog,
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

/// The directory beside the bottles' state dirs (under the state root)
/// that keeps the audit logs of stopped bottles:
/// `<state_root>/retained_logs/<slug>/<run>/`, one run per stop, named by
/// its stop time. A slug has no `_`, so this is never a bottle's state
/// dir, and no retained log sits beside a CA key.
pub const RETAINED_LOGS_DIR: &str = "retained_logs";

/// The length of a run's name without its collision suffix: an RFC 3339
/// UTC time to the millisecond, `2025-01-02T03:04:05.678Z`.
const RUN_TIME_LEN: usize = 24;

/// Most runs of one bottle that may share a stop time (`<time>-<n>`).
const RUN_COLLISIONS: u32 = 100;

/// Retained audit logs could not be kept, read or pruned.
#[derive(Debug, thiserror::Error)]
#[error("could not {action} {}: {source}", path.display())]
pub struct RetainedLogsError {
    /// What was being done ("keep the audit log in").
    pub action: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

impl Coded for RetainedLogsError {
    fn code(&self) -> &'static str {
        "BOT-S006"
    }

    fn fix(&self) -> Option<String> {
        Some(format!(
            "check that the state directory and its {RETAINED_LOGS_DIR}/ are yours and writable (and the disk not full)"
        ))
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RetainedLogsError {
    let path = path.to_path_buf();
    move |source| RetainedLogsError {
        action,
        path,
        source,
    }
}

/// One stop's audit log of a bottle, kept after its state dir went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedRun {
    /// The run's name: its stop time (RFC 3339 UTC), with `-<n>` when two
    /// stops shared it.
    pub name: String,
    /// Its directory, holding the log's generations.
    pub dir: PathBuf,
}

impl RetainedRun {
    /// The run's live file; its older generations are beside it.
    pub fn log(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG_FILE)
    }
}

/// Where the retained runs of the bottle `slug` are.
pub fn retained_runs_dir(state_root: &Path, slug: &str) -> PathBuf {
    state_root.join(RETAINED_LOGS_DIR).join(slug)
}

/// Whether `name` is a run's name: the stop time, maybe `-<n>`. Only such
/// directories are ever read or pruned as runs.
fn is_run_name(name: &str) -> bool {
    let Some(time) = name.get(..RUN_TIME_LEN) else {
        return false;
    };
    let shape_ok = time.bytes().enumerate().all(|(i, b)| match i {
        4 | 7 => b == b'-',
        10 => b == b'T',
        13 | 16 => b == b':',
        19 => b == b'.',
        23 => b == b'Z',
        _ => b.is_ascii_digit(),
    });
    let suffix = &name[RUN_TIME_LEN..];
    shape_ok
        && (suffix.is_empty()
            || suffix
                .strip_prefix('-')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
}

/// The retained runs of the bottle `slug`, oldest first; none when it has
/// none.
pub fn retained_runs(state_root: &Path, slug: &str) -> Result<Vec<RetainedRun>, RetainedLogsError> {
    let dir = retained_runs_dir(state_root, slug);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("read", &dir)(e)),
    };
    let mut runs: Vec<RetainedRun> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            is_run_name(&name).then(|| RetainedRun {
                name,
                dir: entry.path(),
            })
        })
        .collect();
    // The time is fixed-width, so the names sort by it; `-<n>` sorts by n.
    runs.sort_by(|a, b| {
        let key = |run: &RetainedRun| {
            let (time, n) = run.name.split_at(RUN_TIME_LEN);
            (
                time.to_string(),
                n.trim_start_matches('-').parse::<u32>().unwrap_or(0),
            )
        };
        key(a).cmp(&key(b))
    });
    Ok(runs)
}

/// Creates `dir` (and its parents), the last one private (0700).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Moves the audit log's files ([`log_files`]) out of the state dir
/// `state_dir` into a new run of the bottle's retained logs, beside the
/// state dir (`<parent>/retained_logs/<state dir's name>/<stopped>/`), before the
/// state dir is removed. `stopped` is the stop time, RFC 3339 UTC to the
/// millisecond ([`crate::time::now_rfc3339_millis`]). Returns the run's
/// directory, or `None` when there was no log to keep (a launch that failed
/// before its bundle ran).
pub fn retain_audit_log(
    state_dir: &Path,
    stopped: &str,
) -> Result<Option<PathBuf>, RetainedLogsError> {
    let log = state_dir.join(AUDIT_LOG_DIR).join(AUDIT_LOG_FILE);
    let generations: Vec<PathBuf> = log_files(&log)
        .into_iter()
        .filter(|path| std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()))
        .collect();
    let (Some(parent), Some(slug)) = (state_dir.parent(), state_dir.file_name()) else {
        return Ok(None);
    };
    if generations.is_empty() {
        return Ok(None);
    }
    let runs = parent.join(RETAINED_LOGS_DIR).join(slug);
    create_private_dir(&runs).map_err(io_error("create", &runs))?;
    let run = new_run_dir(&runs, stopped)?;
    for from in generations {
        let Some(name) = from.file_name() else {
            continue;
        };
        let to = run.join(name);
        std::fs::rename(&from, &to).map_err(io_error("keep the audit log in", &to))?;
    }
    Ok(Some(run))
}

/// Creates the run directory `<runs>/<stopped>`, or `<stopped>-<n>` when
/// another stop took that name.
fn new_run_dir(runs: &Path, stopped: &str) -> Result<PathBuf, RetainedLogsError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    let mut run = runs.join(stopped);
    for n in 1..=RUN_COLLISIONS {
        match builder.create(&run) {
            Ok(()) => return Ok(run),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                run = runs.join(format!("{stopped}-{n}"));
            }
            Err(e) => return Err(io_error("create", &run)(e)),
        }
    }
    Err(io_error("create", &run)(
        std::io::ErrorKind::AlreadyExists.into(),
    ))
}

/// Removes every retained run, of every bottle, that stopped before
/// `cutoff` (RFC 3339 UTC to the millisecond, like the runs' names), and
/// each bottle's retained directory it leaves empty. Returns the runs
/// removed. Only directories named like runs are touched.
pub fn prune_retained_logs(
    state_root: &Path,
    cutoff: &str,
) -> Result<Vec<PathBuf>, RetainedLogsError> {
    let root = state_root.join(RETAINED_LOGS_DIR);
    let bottles = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("read", &root)(e)),
    };
    let mut pruned = Vec::new();
    for bottle in bottles.flatten() {
        let Ok(slug) = bottle.file_name().into_string() else {
            continue;
        };
        if !bottle.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for run in retained_runs(state_root, &slug)? {
            if run.name[..RUN_TIME_LEN] >= *cutoff {
                continue;
            }
            std::fs::remove_dir_all(&run.dir).map_err(io_error("remove", &run.dir))?;
            pruned.push(run.dir);
        }
        // Only an empty one goes.
        let _ = std::fs::remove_dir(bottle.path());
    }
    Ok(pruned)
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
    fn reads_the_kept_lines_and_the_summary_before_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(AUDIT_LOG_FILE);
        append(&log, "live\n");
        append(&generation(&log, 3), "oldest\n");
        append(&generation(&log, 1), "newer\n");
        append(&dropped_file(&log), "summary\n");
        append(&kept_file(&log), "kept 1\nkept 2\n");
        assert_eq!(
            text(AuditLines::new(&log).poll().unwrap()),
            ["kept 1", "kept 2", "summary", "oldest", "newer", "live"]
        );
        assert_eq!(
            log_files(&log)
                .iter()
                .map(|p| p.file_name().unwrap().to_str().unwrap())
                .collect::<Vec<_>>(),
            [
                "audit.jsonl.kept",
                "audit.jsonl.dropped",
                "audit.jsonl.3",
                "audit.jsonl.2",
                "audit.jsonl.1",
                "audit.jsonl"
            ]
        );
    }

    #[test]
    fn security_relevant_lines_are_findings_injections_tool_calls_pushes_and_approvals() {
        for (daemon, decision, method) in [
            ("proxy", "blocked_secret", "POST"),
            ("websocket", "redacted", "GET"),
            ("egress", "inject", "GET"),
            ("sandbox", "allow", "EXEC"),
            ("sandbox", "deny", "RESET"),
            ("git-gate", "allow", "push"),
            ("supervise", "allow", "egress"),
        ] {
            assert!(
                is_security_relevant(daemon, decision, method),
                "{daemon} {decision}"
            );
        }
        for (daemon, decision, method) in [
            ("proxy", "allow", "GET"),
            ("proxy", "deny", "CONNECT"),
            ("egress", "error", "GET"),
            ("git-gate", "allow", "fetch"),
            ("git-gate", "deny", "push"),
            ("audit", "dropped", ""),
        ] {
            assert!(
                !is_security_relevant(daemon, decision, method),
                "{daemon} {decision}"
            );
        }
    }

    #[test]
    fn the_bound_counts_every_file() {
        let cap = 1 << 20;
        assert_eq!(
            audit_log_bound(cap),
            4 * (cap + GENERATION_SLACK) + cap + SUMMARY_BOUND
        );
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

    fn state_dir_with_log(root: &Path, slug: &str, generations: u32) -> PathBuf {
        let dir = root.join(slug);
        let logs = dir.join(AUDIT_LOG_DIR);
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join(AUDIT_OK_MARKER), "").unwrap();
        for n in 0..=generations {
            std::fs::write(
                generation(&logs.join(AUDIT_LOG_FILE), n),
                format!("gen {n}\n"),
            )
            .unwrap();
        }
        dir
    }

    #[test]
    fn retaining_moves_the_kept_lines_and_the_summary_too() {
        let root = tempfile::tempdir().unwrap();
        let dir = state_dir_with_log(root.path(), "demo", 3);
        let log = dir.join(AUDIT_LOG_DIR).join(AUDIT_LOG_FILE);
        std::fs::write(kept_file(&log), "kept\n").unwrap();
        std::fs::write(dropped_file(&log), "summary\n").unwrap();
        let run = retain_audit_log(&dir, "2025-01-02T03:04:05.678Z")
            .unwrap()
            .unwrap();
        assert_eq!(
            text(AuditLines::new(&run.join(AUDIT_LOG_FILE)).poll().unwrap()),
            ["kept", "summary", "gen 3", "gen 2", "gen 1", "gen 0"]
        );
        assert!(log_files(&log).iter().all(|f| !f.exists()));
    }

    #[test]
    fn retaining_moves_every_generation_out_of_the_state_dir() {
        let root = tempfile::tempdir().unwrap();
        let dir = state_dir_with_log(root.path(), "demo", 2);
        std::fs::create_dir_all(dir.join("ca")).unwrap();
        std::fs::write(dir.join("ca/ca-key.pem"), "KEY").unwrap();
        let run = retain_audit_log(&dir, "2025-01-02T03:04:05.678Z")
            .unwrap()
            .unwrap();
        assert_eq!(
            run,
            root.path()
                .join("retained_logs/demo/2025-01-02T03:04:05.678Z")
        );
        let log = run.join(AUDIT_LOG_FILE);
        assert_eq!(
            text(AuditLines::new(&log).poll().unwrap()),
            ["gen 2", "gen 1", "gen 0"]
        );
        assert!(!dir.join(AUDIT_LOG_DIR).join(AUDIT_LOG_FILE).exists());
        // Nothing but the log: the key stays where it was, for its removal.
        let kept: Vec<_> = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(dir.join("ca/ca-key.pem").exists());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&run).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            retained_runs(root.path(), "demo").unwrap(),
            [RetainedRun {
                name: "2025-01-02T03:04:05.678Z".into(),
                dir: run
            }]
        );
    }

    #[test]
    fn a_state_dir_without_a_log_keeps_nothing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("demo");
        std::fs::create_dir_all(dir.join(AUDIT_LOG_DIR)).unwrap();
        std::fs::write(dir.join(AUDIT_LOG_DIR).join(AUDIT_OK_MARKER), "").unwrap();
        assert_eq!(
            retain_audit_log(&dir, "2025-01-02T03:04:05.678Z").unwrap(),
            None
        );
        assert_eq!(
            retain_audit_log(&root.path().join("gone"), "2025-01-02T03:04:05.678Z").unwrap(),
            None
        );
        assert!(!root.path().join(RETAINED_LOGS_DIR).exists());
        assert!(retained_runs(root.path(), "demo").unwrap().is_empty());
    }

    #[test]
    fn stops_in_the_same_millisecond_get_their_own_runs_in_order() {
        let root = tempfile::tempdir().unwrap();
        let time = "2025-01-02T03:04:05.678Z";
        for _ in 0..3 {
            let dir = state_dir_with_log(root.path(), "demo", 0);
            retain_audit_log(&dir, time).unwrap().unwrap();
        }
        let dir = state_dir_with_log(root.path(), "demo", 0);
        retain_audit_log(&dir, "2025-01-02T03:04:05.679Z")
            .unwrap()
            .unwrap();
        let names: Vec<String> = retained_runs(root.path(), "demo")
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(
            names,
            [
                "2025-01-02T03:04:05.678Z",
                "2025-01-02T03:04:05.678Z-1",
                "2025-01-02T03:04:05.678Z-2",
                "2025-01-02T03:04:05.679Z"
            ]
        );
    }

    #[test]
    fn pruning_removes_only_runs_older_than_the_cutoff() {
        let root = tempfile::tempdir().unwrap();
        for (slug, time) in [
            ("old", "2024-12-01T00:00:00.000Z"),
            ("mixed", "2024-12-31T23:59:59.999Z"),
            ("mixed", "2025-01-01T00:00:00.000Z"),
        ] {
            let dir = state_dir_with_log(root.path(), slug, 0);
            retain_audit_log(&dir, time).unwrap().unwrap();
        }
        // Not a run: never touched.
        let stray = root.path().join("retained_logs/mixed/notes");
        std::fs::create_dir_all(&stray).unwrap();
        let pruned = prune_retained_logs(root.path(), "2025-01-01T00:00:00.000Z").unwrap();
        assert_eq!(pruned.len(), 2, "{pruned:?}");
        assert!(!root.path().join("retained_logs/old").exists());
        let left: Vec<String> = retained_runs(root.path(), "mixed")
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(left, ["2025-01-01T00:00:00.000Z"]);
        assert!(stray.is_dir());
        assert!(
            prune_retained_logs(&root.path().join("none"), "2025-01-01T00:00:00.000Z")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn run_names_are_stop_times() {
        assert!(is_run_name("2025-01-02T03:04:05.678Z"));
        assert!(is_run_name("2025-01-02T03:04:05.678Z-12"));
        for not in [
            "",
            "notes",
            "2025-01-02T03:04:05Z",
            "2025-01-02T03:04:05.678Z-",
            "2025-01-02T03:04:05.678Zx",
            "2025-01-02 03:04:05.678Z",
        ] {
            assert!(!is_run_name(not), "{not}");
        }
    }
}
