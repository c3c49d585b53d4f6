//! What the agent's audit flood (`audit-flood`) left on the operator's
//! disk: after a full probe phase the harness reads the bottle's audit
//! files under the run's state and judges three things.
//!
//! - `audit-log-bounded`: the live log and its generations together stay
//!   within `(generations + 1) × limits.audit_log` plus a line's slack.
//!   Its control is that the flood mattered: a rotated generation exists,
//!   so more than the cap was written (a small log proves nothing).
//! - `audit-log-coalesced`: the probe's run of identical requests became
//!   counted records rather than a line each.
//! - `audit-not-degraded`: `bottle list --json` still shows the audit as
//!   ok; the cap should absorb the flood, so a degraded audit is an error
//!   (the bundle failed closed, which is no escape, but the bound failed).

use std::path::{Path, PathBuf};

use bottle_core::audit_files::{
    AUDIT_GENERATIONS, AUDIT_LOG_DIR, AUDIT_LOG_FILE, AuditLines, generation,
};
use bottle_probe::contract::AUDIT_FLOOD_SAME_PATH;
use serde_json::Value;

use super::Gate;
use crate::escape::fixture::AUDIT_LOG_BYTES;
use crate::escape::report::{Expect, Observed, Row, Verdict};

const CAT: &str = "audit";

/// What one file may exceed the cap by: the bundle rotates before a line
/// would pass it, so only a single line longer than the cap could; a
/// bounded line is a few KiB.
const SLACK: u64 = 64 << 10;

/// The bundle's coalescing window (`bottle_bundle::audit::COALESCE_WINDOW`,
/// which xtask does not link).
const COALESCE_WINDOW_MS: i64 = 1000;

/// How long after the flood the harness waits for the last window's
/// counted line: the window, the bundle's closer tick, and margin.
const COUNTS_WRITTEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl Gate {
    /// The three audit rows for `bottle` after a full probe phase.
    pub(super) fn audit_evidence(&mut self, phase: &str, bottle: &str) -> anyhow::Result<()> {
        let dir = audit_dir(&self.cli.state_home, bottle);
        self.report
            .rows
            .push(bounded_row(phase, &dir, AUDIT_LOG_BYTES));
        // The identical run's counted line is written when its coalescing
        // window closes, up to a window after the probe's last request:
        // read until the run's counts are in, bounded.
        let mut coalesced = coalesced_row(phase, &dir);
        bottle_test_support::eventually(COUNTS_WRITTEN_WITHIN, || {
            coalesced = coalesced_row(phase, &dir);
            coalesced.verdict != Verdict::ControlFailed
        });
        self.report.rows.push(coalesced);
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
    let observed = Observed::reached_if(total > bound);
    row(observed, Some(rotated), detail)
}

/// Judges the probe's identical run (records whose path is
/// [`AUDIT_FLOOD_SAME_PATH`]). A bottle is flooded once in its life (the
/// audit probe is not among those re-run after a fault), so every such
/// record belongs to the one run, however long it stalled in between.
///
/// The criterion: the bundle writes at most two lines per coalescing
/// window (the first decision at once, the counted repeats when the window
/// closes), and a run spanning `s` seconds opens at most `s + 1` windows,
/// so more than `2 × (s + 1) + 2` lines (two for the run's edges) means the
/// identical requests were written out one by one. The control is that the
/// run's requests (the sum of the lines' `count`) outnumber that bound:
/// otherwise a line per request would pass too, and nothing is proven.
/// Passing then implies some `count` > 1.
fn coalesced_row(phase: &str, dir: &Path) -> Row {
    let row = |observed, control, detail: String| {
        Row::new(
            phase,
            "audit-log-coalesced",
            CAT,
            Expect::Blocked,
            observed,
            control,
            detail,
        )
    };
    let log = dir.join(AUDIT_LOG_FILE);
    let lines = match AuditLines::new(&log).poll() {
        Ok(l) => l,
        Err(e) => {
            return row(
                Observed::Error,
                None,
                format!("cannot read {}: {e}", log.display()),
            );
        }
    };
    let mut run: Vec<(i64, u64)> = lines
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|v| v["path"].as_str() == Some(AUDIT_FLOOD_SAME_PATH))
        .filter_map(|v| {
            Some((
                millis(v["time"].as_str()?)?,
                v["count"].as_u64().unwrap_or(1),
            ))
        })
        .collect();
    run.sort();
    let (observed, control, detail) = judge_coalescing(&run);
    row(observed, Some(control), detail)
}

/// The verdict on one run's `(time in ms, count)` lines: see
/// [`coalesced_row`].
fn judge_coalescing(run: &[(i64, u64)]) -> (Observed, bool, String) {
    let lines = run.len() as u64;
    let requests: u64 = run.iter().map(|(_, c)| c).sum();
    let most = run.iter().map(|(_, c)| *c).max().unwrap_or(0);
    let span = match (run.first(), run.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0,
    };
    let windows = u64::try_from(span / COALESCE_WINDOW_MS).unwrap_or(0) + 1;
    let bound = 2 * windows + 2;
    let detail = format!(
        "the identical run: {requests} requests in {lines} lines over {span} ms (at most {bound} lines allowed), largest count {most}"
    );
    let observed = Observed::reached_if(lines > bound);
    (observed, requests > bound, detail)
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the bundle
/// writes it (`2025-01-01T00:00:00.000Z`; fraction optional).
fn millis(time: &str) -> Option<i64> {
    let (date, rest) = time.split_once('T')?;
    let rest = rest.strip_suffix('Z')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = rest.split_once('.').unwrap_or((rest, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    let ms: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + min) * 60_000 + s * 1000 + ms)
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

    fn line(ms: i64, count: u64) -> String {
        let secs = ms / 1000;
        let time = format!(
            "2025-01-01T00:{:02}:{:02}.{:03}Z",
            secs / 60,
            secs % 60,
            ms % 1000
        );
        json!({"v": 2, "time": time, "path": AUDIT_FLOOD_SAME_PATH, "count": count}).to_string()
            + "\n"
    }

    fn log_with(lines: &[String]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let other = json!({"v": 2, "time": "2025-01-01T00:00:00.000Z", "path": "/x", "count": 1});
        let mut text = format!("{other}\n");
        text.extend(lines.iter().map(String::as_str));
        std::fs::write(dir.path().join(AUDIT_LOG_FILE), text).unwrap();
        dir
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
    fn a_counted_identical_run_passes() {
        // 1,500 requests over 2.5 s: a line and a count per window.
        let dir = log_with(&[
            line(10_000, 1),
            line(10_990, 599),
            line(11_000, 1),
            line(11_990, 599),
            line(12_000, 1),
            line(12_500, 299),
        ]);
        let r = coalesced_row("p", dir.path());
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        assert!(
            r.detail.contains("1500 requests in 6 lines"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn an_identical_run_written_line_by_line_is_an_escape() {
        let lines: Vec<String> = (0..300).map(|i| line(10_000 + i * 5, 1)).collect();
        let r = coalesced_row("p", log_with(&lines).path());
        assert_eq!(r.verdict, Verdict::Escape, "{r:?}");
    }

    #[test]
    fn an_identical_run_too_small_to_judge_fails_the_control() {
        let r = coalesced_row("p", log_with(&[line(10_000, 1), line(10_100, 2)]).path());
        assert_eq!(r.verdict, Verdict::ControlFailed, "{r:?}");
        let r = coalesced_row("p", log_with(&[]).path());
        assert_eq!(r.verdict, Verdict::ControlFailed, "{r:?}");
    }

    #[test]
    fn a_run_that_stalled_is_judged_whole() {
        // The probe's last request came seconds after the others (a slow
        // answer): its own window's line is still part of the run.
        let lines = [line(1_000, 1), line(1_900, 400), line(6_000, 1)];
        let r = coalesced_row("p", log_with(&lines).path());
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        assert!(r.detail.contains("402 requests in 3 lines"), "{}", r.detail);
    }

    #[test]
    fn the_bundle_times_parse() {
        assert_eq!(millis("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(millis("1970-01-02T00:00:01.5Z"), Some(86_401_500));
        assert_eq!(millis("2025-01-01T00:00:00Z"), Some(1_735_689_600_000));
        assert_eq!(millis("2025-01-01 00:00:00"), None);
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
