//! What the agent's audit flood (`audit-flood`) left on the operator's
//! disk: after a full probe phase the harness reads the bottle's audit
//! files under the run's state and judges two things.
//!
//! - `audit-log-bounded`: the live log and its generations together stay
//!   within `(generations + 1) × limits.audit_log` plus a line's slack.
//!   Its control is that the flood mattered: a rotated generation exists,
//!   so more than the cap was written (a small log proves nothing).
//! - `audit-not-degraded`: `bottle list --json` still shows the audit as
//!   ok; the cap should absorb the flood, so a degraded audit is an error
//!   (the bundle failed closed, which is no escape, but the bound failed).

use std::path::{Path, PathBuf};

use bottle_core::audit_files::{AUDIT_GENERATIONS, AUDIT_LOG_DIR, AUDIT_LOG_FILE, generation};
use serde_json::Value;

use super::Gate;
use crate::escape::fixture::AUDIT_LOG_BYTES;
use crate::escape::report::{Expect, Observed, Row};

const CAT: &str = "audit";

/// What one file may exceed the cap by: the bundle rotates before a line
/// would pass it, so only a single line longer than the cap could; a
/// bounded line is a few KiB.
const SLACK: u64 = 64 << 10;

impl Gate {
    /// The three audit rows for `bottle` after a full probe phase.
    pub(super) fn audit_evidence(&mut self, phase: &str, bottle: &str) -> anyhow::Result<()> {
        let dir = audit_dir(&self.cli.state_home, bottle);
        self.report
            .rows
            .push(bounded_row(phase, &dir, AUDIT_LOG_BYTES));
        let row = match self.cli.list() {
            Ok(list) => health_row(phase, bottle, &list),
            Err(e) => Row::new(
                phase,
                "audit-not-degraded",
                CAT,
                Expect::Blocked,
                Observed::Error,
                None,
                format!("`bottle list --json` failed: {e:#}"),
            ),
        };
        self.report.rows.push(row);
        Ok(())
    }
}

/// The bottle's log dir under the run's `XDG_STATE_HOME`, named as the CLI
/// names it (`bottle_core::state::state_root`, the slug, `logs`).
fn audit_dir(state_home: &Path, bottle: &str) -> PathBuf {
    state_home
        .join("bottle")
        .join(bottle_core::slug::slug_of(bottle))
        .join(AUDIT_LOG_DIR)
}

/// Reached when the log's files together pass `(generations + 1) × cap`
/// plus slack; every `audit.jsonl*` file counts, not only the generations
/// the bundle should keep.
fn bounded_row(phase: &str, dir: &Path, cap: u64) -> Row {
    let row = |observed, control, detail: String| {
        Row::new(
            phase,
            "audit-log-bounded",
            CAT,
            Expect::Blocked,
            observed,
            control,
            detail,
        )
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            return row(
                Observed::Error,
                None,
                format!("cannot read {}: {e}", dir.display()),
            );
        }
    };
    let mut files = Vec::new();
    let mut total = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(AUDIT_LOG_FILE) {
            continue;
        }
        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
        total += len;
        files.push(format!("{name} {len}"));
    }
    files.sort();
    let bound = (u64::from(AUDIT_GENERATIONS) + 1) * cap + SLACK;
    let rotated = generation(&dir.join(AUDIT_LOG_FILE), 1).exists();
    let detail = format!(
        "{total} bytes in {} (bound {bound}; {})",
        files.join(", "),
        if rotated {
            "rotated: the flood passed the cap"
        } else {
            "never rotated: the flood did not pass the cap, so the bound is untested"
        }
    );
    let observed = if total > bound {
        Observed::Reached
    } else {
        Observed::Blocked
    };
    row(observed, Some(rotated), detail)
}

/// `bottle list --json` must show `bottle`'s audit as ok after the flood.
fn health_row(phase: &str, bottle: &str, list: &[Value]) -> Row {
    let entry = list.iter().find(|b| b["name"].as_str() == Some(bottle));
    let (observed, detail) = match entry.map(|e| &e["audit"]) {
        None => (
            Observed::Error,
            format!("`bottle list --json` does not list {bottle}"),
        ),
        Some(Value::String(s)) if s == "ok" => (
            Observed::Blocked,
            "`bottle list --json`: audit ok after the flood".to_string(),
        ),
        Some(Value::String(s)) if s == "degraded" => (
            Observed::Error,
            "`bottle list --json`: audit degraded after a flood the cap should absorb (the bundle fails closed, but the bound did not hold)".to_string(),
        ),
        Some(Value::Null) => (
            Observed::Error,
            "`bottle list --json` has no audit field".to_string(),
        ),
        Some(other) => (
            Observed::Error,
            format!("`bottle list --json`: audit {other}"),
        ),
    };
    Row::new(
        phase,
        "audit-not-degraded",
        CAT,
        Expect::Blocked,
        observed,
        None,
        detail,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::escape::report::Verdict;

    const CAP: u64 = 1 << 20;

    fn write(dir: &Path, name: &str, len: u64) {
        let f = std::fs::File::create(dir.join(name)).unwrap();
        f.set_len(len).unwrap();
    }

    #[test]
    fn a_rotated_log_within_the_bound_passes() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "audit.jsonl", CAP / 2);
        for n in 1..=3 {
            write(dir.path(), &format!("audit.jsonl.{n}"), CAP);
        }
        write(dir.path(), "audit.ok", 0);
        let r = bounded_row("p", dir.path(), CAP);
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
    }

    #[test]
    fn a_log_past_the_bound_is_an_escape() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "audit.jsonl", CAP);
        write(dir.path(), "audit.jsonl.1", 3 * CAP);
        write(dir.path(), "audit.jsonl.2", CAP);
        let r = bounded_row("p", dir.path(), CAP);
        assert_eq!(r.verdict, Verdict::Escape, "{r:?}");
        // Stray generations count too.
        let dir = tempfile::tempdir().unwrap();
        for n in 0..=5 {
            let name = generation(Path::new(AUDIT_LOG_FILE), n);
            write(dir.path(), name.to_str().unwrap(), CAP);
        }
        let r = bounded_row("p", dir.path(), CAP);
        assert_eq!(r.verdict, Verdict::Escape, "{r:?}");
    }

    #[test]
    fn a_log_that_never_rotated_fails_the_control() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "audit.jsonl", 1000);
        let r = bounded_row("p", dir.path(), CAP);
        assert_eq!(r.verdict, Verdict::ControlFailed, "{r:?}");
        let r = bounded_row("p", &dir.path().join("missing"), CAP);
        assert_eq!(r.verdict, Verdict::Error, "{r:?}");
    }

    #[test]
    fn the_audit_must_be_listed_ok() {
        let b = "bot-bottle-escape-a";
        let row = |list: Value| health_row("p", b, list.as_array().unwrap()).verdict;
        assert_eq!(row(json!([{"name": b, "audit": "ok"}])), Verdict::Pass);
        assert_eq!(
            row(json!([{"name": b, "audit": "degraded"}])),
            Verdict::Error
        );
        assert_eq!(row(json!([{"name": b}])), Verdict::Error);
        assert_eq!(
            row(json!([{"name": b, "audit": "unknown"}])),
            Verdict::Error
        );
        assert_eq!(
            row(json!([{"name": "other", "audit": "ok"}])),
            Verdict::Error
        );
    }

    #[test]
    fn the_log_dir_is_the_clis() {
        assert_eq!(
            audit_dir(Path::new("/s"), "bot-bottle-escape-a"),
            Path::new("/s/bottle/escape-a/logs")
        );
    }
}
