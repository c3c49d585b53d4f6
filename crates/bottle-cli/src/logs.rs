//! `bottle logs`: a bottle's audit log, one readable line per decision, or
//! with `--json` the log's own JSON lines.
//!
//! The agent chose most of what is in the log (hosts, paths, methods), so
//! every field is escaped for the terminal on its own before it is put on
//! a line: a newline in a path cannot start a line of its own.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bottle_core::audit_files;
use bottle_core::backend::BackendErrorKind;
use bottle_core::display::{escape_for_terminal, escape_json_for_terminal};
use bottle_core::slug;
use serde::Deserialize;

use crate::args::{Global, LogsArgs};
use crate::failure::{Failure, exit_for};
use crate::output;

/// `bottle logs`.
pub(crate) fn logs(
    global: &Global,
    args: &LogsArgs,
    state_root: &Path,
) -> Result<ExitCode, Failure> {
    let path = audit_log_path(state_root, &args.bottle);
    let format = if global.json {
        Format::Json
    } else {
        Format::Readable
    };
    follow_file(&path, args.follow, &format)?;
    Ok(ExitCode::SUCCESS)
}

fn audit_log_path(state_root: &Path, bottle: &str) -> PathBuf {
    state_root
        .join(slug::slug_of(bottle))
        .join(audit_files::AUDIT_LOG_DIR)
        .join(audit_files::AUDIT_LOG_FILE)
}

/// How the lines are printed.
enum Format {
    /// The log's JSON lines, as they are.
    Json,
    /// One line of text per decision, times in the operator's zone.
    Readable,
}

/// Prints the audit log, its rotated generations first, and with `follow`
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
        .with_fix("check the bottle name with `bottle list`")
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
/// `AuditRecord`, any version: a field a line lacks reads as empty).
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
}

fn one() -> u64 {
    1
}

/// One decision as a line of text, newline-terminated:
/// `time  decision  method host:port/path  status  reason  (xN)`. A line
/// that is not an audit record is shown whole, escaped.
fn readable_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let Ok(record) = serde_json::from_str::<Decision>(&text) else {
        return format!("{}\n", escape_for_terminal(&text));
    };
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
    if record.count > 1 {
        out.push_str(&format!("  (x{})", record.count));
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
