//! `bottle logs`: a bottle's audit log, one readable line per decision, or
//! with `--json` the log's own JSON lines; while the bottle runs, the live
//! log in its state dir; once it is stopped, the runs kept under the state
//! root (`bottle_core::audit_files`), the newest by default, another with
//! `--run`, all of them listed with `--runs`. `bottle cleanup
//! --logs-older-than` prunes those ([`prune`]).
//!
//! The agent chose most of what is in the log (hosts, paths, methods), so
//! every field is escaped for the terminal on its own before it is put on
//! a line: a newline in a path cannot start a line of its own.
//!
//! The log is read as `bottle_core::audit_files` lays it out: the
//! security-relevant lines kept from generations rotation dropped, the
//! summary of what it dropped, then the stream; merged lines show their
//! count and sample of hosts. Every version's lines read (a field an older
//! line lacks reads as empty).

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use bottle_core::audit_files::{self, RetainedRun};
use bottle_core::backend::BackendErrorKind;
use bottle_core::display::{escape_for_terminal, escape_json_for_terminal};
use bottle_core::slug;
use serde::{Deserialize, Serialize};

use crate::args::{Global, LogsArgs};
use crate::failure::{EXIT_USAGE, Failure, exit_for};
use crate::output;

/// `bottle logs`.
pub(crate) fn logs(
    global: &Global,
    args: &LogsArgs,
    state_root: &Path,
) -> Result<ExitCode, Failure> {
    let slug = slug::slug_of(&args.bottle);
    let runs =
        audit_files::retained_runs(state_root, slug).map_err(|err| Failure::coded(&err, 1))?;
    if args.runs {
        list_runs(global, &runs);
        return Ok(ExitCode::SUCCESS);
    }
    let path = match &args.run {
        Some(wanted) => chosen_run(&args.bottle, &runs, wanted)?.log(),
        None => {
            let live = live_log(state_root, slug);
            match runs.last() {
                // Stopped: its newest run.
                Some(newest) if !live.exists() => newest.log(),
                _ => live,
            }
        }
    };
    let format = if global.json {
        Format::Json
    } else {
        Format::Readable
    };
    follow_file(&path, args.follow, &format)?;
    Ok(ExitCode::SUCCESS)
}

/// The live log of a bottle that runs (or of its state dir's leftovers).
fn live_log(state_root: &Path, slug: &str) -> PathBuf {
    state_root
        .join(slug)
        .join(audit_files::AUDIT_LOG_DIR)
        .join(audit_files::AUDIT_LOG_FILE)
}

/// The newest run whose name starts with `wanted`.
fn chosen_run<'a>(
    bottle: &str,
    runs: &'a [RetainedRun],
    wanted: &str,
) -> Result<&'a RetainedRun, Failure> {
    runs.iter()
        .rev()
        .find(|run| run.name.starts_with(wanted))
        .ok_or_else(|| {
            let fix = if runs.is_empty() {
                format!("{bottle} has no stopped runs kept; leave out --run to read its live log")
            } else {
                format!(
                    "use one of: {}",
                    runs.iter()
                        .map(|run| run.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            Failure::new(
                "BOT-C020",
                EXIT_USAGE,
                format!("no kept run of {bottle}'s audit log starts with {wanted:?}"),
            )
            .with_fix(fix)
        })
}

/// A kept run as `--runs --json` lists it.
#[derive(Debug, Serialize)]
struct RunEntry<'a> {
    run: &'a str,
    log: PathBuf,
}

fn list_runs(global: &Global, runs: &[RetainedRun]) {
    if global.json {
        let entries: Vec<RunEntry<'_>> = runs
            .iter()
            .map(|run| RunEntry {
                run: &run.name,
                log: run.log(),
            })
            .collect();
        // Only our own names and paths: nothing to fail on but a closed pipe.
        let _ = output::json(&entries);
        return;
    }
    if runs.is_empty() {
        output::note(global.quiet, "no stopped runs kept");
        return;
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| vec![run.name.clone(), run.log().display().to_string()])
        .collect();
    output::out(&output::table(&["RUN", "LOG"], &rows));
}

/// The cutoff of `bottle cleanup --logs-older-than age`: the RFC 3339
/// time `age` ago, which run names (their stop times) are compared with.
pub(crate) fn cutoff(age: Duration) -> String {
    let cutoff = SystemTime::now()
        .checked_sub(age)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .unwrap_or_default();
    bottle_core::time::rfc3339_millis(
        i64::try_from(cutoff.as_secs()).unwrap_or(i64::MAX),
        cutoff.subsec_millis(),
    )
}

/// The kept runs of every bottle stopped before `cutoff`, which
/// [`prune`] removes: a run's name starts with its stop time.
pub(crate) fn prunable(state_root: &Path, cutoff: &str) -> Result<Vec<PathBuf>, Failure> {
    let root = state_root.join(audit_files::RETAINED_LOGS_DIR);
    let Ok(bottles) = std::fs::read_dir(&root) else {
        return Ok(Vec::new());
    };
    let mut runs = Vec::new();
    for bottle in bottles.flatten() {
        let Ok(slug) = bottle.file_name().into_string() else {
            continue;
        };
        if !bottle.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let kept =
            audit_files::retained_runs(state_root, &slug).map_err(|err| Failure::coded(&err, 1))?;
        runs.extend(
            kept.into_iter()
                .filter(|run| run.name.as_str() < cutoff)
                .map(|run| run.dir),
        );
    }
    Ok(runs)
}

/// Removes the kept runs of every bottle stopped before `cutoff`; returns
/// their directories.
pub(crate) fn prune(state_root: &Path, cutoff: &str) -> Result<Vec<PathBuf>, Failure> {
    audit_files::prune_retained_logs(state_root, cutoff).map_err(|err| Failure::coded(&err, 1))
}

/// How the lines are printed.
enum Format {
    /// The log's JSON lines, as they are.
    Json,
    /// One line of text per decision, times in the operator's zone.
    Readable,
}

/// Prints the audit log, its kept lines, summary of dropped ones and
/// rotated generations first, and with `follow`
/// waits for more, across rotations.
fn follow_file(path: &Path, follow: bool, format: &Format) -> Result<(), Failure> {
    std::fs::metadata(path).map_err(|err| {
        let exit = if err.kind() == io::ErrorKind::NotFound {
            exit_for(BackendErrorKind::NotFound)
        } else {
            1
        };
        Failure::new(
            "BOT-C005",
            exit,
            format!("cannot read the audit log {}: {err}", path.display()),
        )
        .with_fix(
            "check the bottle name with `bottle list`; a stopped bottle's log is kept until `bottle cleanup --logs-older-than` removes it",
        )
    })?;
    let mut lines = audit_files::AuditLines::new(path);
    loop {
        let text: String = lines
            .poll()
            .map_err(|err| anyhow::anyhow!("reading {}: {err}", path.display()))?
            .iter()
            .map(|line| match format {
                Format::Json => json_line(line),
                Format::Readable => readable_line(line),
            })
            .collect();
        if !text.is_empty() {
            output::out(&text);
        }
        if !follow {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// One audit log line for the terminal, newline-terminated: a JSON record
/// keeps its value with what a terminal acts on written as `\uXXXX`; a line
/// that is not JSON is shown with visible `\u{XX}` escapes.
fn json_line(line: &[u8]) -> String {
    let line = String::from_utf8_lossy(line);
    let shown = if serde_json::from_str::<serde::de::IgnoredAny>(&line).is_ok() {
        escape_json_for_terminal(&line)
    } else {
        escape_for_terminal(&line)
    };
    format!("{shown}\n")
}

/// What the readable form shows of an audit record (the bundle's
/// `AuditRecord`, any version: a field a line lacks reads as empty), and of
/// the summary of what rotation dropped (version 3).
#[derive(Debug, Deserialize)]
struct Decision {
    #[serde(default)]
    time: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    method: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    path: String,
    #[serde(default)]
    status: u16,
    #[serde(default)]
    reason: String,
    #[serde(default = "one")]
    count: u64,
    /// A merged line's sample of hosts (version 3).
    #[serde(default)]
    hosts: Vec<String>,
    /// A tool call's evidence hash (the sandbox interface's lines).
    #[serde(default)]
    evidence: Option<String>,
    /// The summary's first dropped decision.
    #[serde(default)]
    since: String,
    /// The summary's counts.
    #[serde(default)]
    dropped: Vec<DroppedCount>,
    /// The summary's security-relevant decisions the kept file had no room
    /// for.
    #[serde(default)]
    unkept: u64,
}

/// One of the summary's counts (the bundle's `DroppedCount`).
#[derive(Debug, Deserialize)]
struct DroppedCount {
    #[serde(default)]
    daemon: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    count: u64,
}

fn one() -> u64 {
    1
}

/// The bundle's sample of a merged line's hosts: when it is this full,
/// there may have been more.
const HOST_SAMPLE: usize = 8;

/// Counts of the summary shown; the rest are summed into "more".
const SUMMARY_SHOWN: usize = 5;

/// One decision as a line of text, newline-terminated:
/// `time  decision  method host:port/path  status  reason  (xN; hosts …)`,
/// a tool call's evidence after it, and the summary of dropped lines as
/// `time  dropped  N decisions in M lines since T: kind xN, …`. A line that
/// is not an audit record is shown whole, escaped.
fn readable_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let Ok(record) = serde_json::from_str::<Decision>(&text) else {
        return format!("{}\n", escape_for_terminal(&text));
    };
    if record.decision == "dropped" {
        return dropped_line(&record);
    }
    let shown = |field: &str| escape_for_terminal(field).into_owned();
    let mut target = shown(&record.host);
    if record.port != 0 {
        target.push_str(&format!(":{}", record.port));
    }
    // A request path follows its host; supervise logs a request id there.
    if !record.path.is_empty() {
        if !record.path.starts_with('/') {
            target.push(' ');
        }
        target.push_str(&shown(&record.path));
    }
    let status = match record.status {
        0 => "-".to_string(),
        status => status.to_string(),
    };
    let mut out = format!(
        "{}  {}  {} {target}  {status}  {}",
        local_time(&record.time),
        shown(&record.decision),
        shown(&record.method),
        shown(&record.reason),
    );
    if record.count > 1 || !record.hosts.is_empty() {
        out.push_str(&format!("  (x{}", record.count));
        if !record.hosts.is_empty() {
            let hosts: Vec<String> = record.hosts.iter().map(|h| shown(h)).collect();
            let more = if record.hosts.len() >= HOST_SAMPLE {
                ", …"
            } else {
                ""
            };
            out.push_str(&format!("; hosts {}{more}", hosts.join(", ")));
        }
        out.push(')');
    }
    if let Some(evidence) = &record.evidence {
        out.push_str(&format!("  evidence {}", shown(evidence)));
    }
    out.push('\n');
    out
}

/// The summary of what rotation dropped, as one line of text.
fn dropped_line(record: &Decision) -> String {
    let shown = |field: &str| escape_for_terminal(field).into_owned();
    let mut counts: Vec<String> = record
        .dropped
        .iter()
        .take(SUMMARY_SHOWN)
        .map(|d| {
            format!(
                "{} {} {} x{}",
                shown(&d.daemon),
                shown(&d.decision),
                shown(&d.reason),
                d.count
            )
        })
        .collect();
    let rest: u64 = record
        .dropped
        .iter()
        .skip(SUMMARY_SHOWN)
        .map(|d| d.count)
        .sum();
    if rest > 0 {
        counts.push(format!("more x{rest}"));
    }
    let mut out = format!(
        "{}  dropped  {} decisions rotated out since {}: {}",
        local_time(&record.time),
        record.count,
        local_time(&record.since),
        counts.join(", ")
    );
    if record.unkept > 0 {
        out.push_str(&format!(
            " ({} security-relevant ones among them: the kept lines above had no room)",
            record.unkept
        ));
    }
    if !record.hosts.is_empty() {
        let hosts: Vec<String> = record.hosts.iter().map(|h| shown(h)).collect();
        out.push_str(&format!("; hosts {}, …", hosts.join(", ")));
    }
    out.push('\n');
    out
}

/// An audit time (RFC 3339) as `YYYY-MM-DD hh:mm:ss` in the operator's
/// zone (`TZ`, else the system's); in UTC with a `Z` when the zone cannot
/// be read (`time` reads it only while the process has one thread); a time
/// that does not parse, escaped as it is.
fn local_time(rfc3339: &str) -> String {
    use time::format_description::well_known::Rfc3339;
    let Ok(utc) = time::OffsetDateTime::parse(rfc3339, &Rfc3339) else {
        return escape_for_terminal(rfc3339).into_owned();
    };
    let (shown, suffix) = match time::UtcOffset::local_offset_at(utc) {
        Ok(offset) => (utc.to_offset(offset), ""),
        Err(_) => (utc, "Z"),
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}{suffix}",
        shown.year(),
        u8::from(shown.month()),
        shown.day(),
        shown.hour(),
        shown.minute(),
        shown.second()
    )
}
