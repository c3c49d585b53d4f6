//! What the agent's audit flood (`audit-flood`) left on the operator's
//! disk: after a full probe phase the harness reads the bottle's audit
//! files under the run's state, and the bottle's log through `bottle logs
//! --json`, and judges:
//!
//! - `audit-log-bounded`: the log's files together stay within
//!   `bottle_core::audit_files::audit_log_bound` of `limits.audit_log`.
//!   Its control is that the flood mattered: rotation dropped a generation
//!   (the summary of dropped lines exists), so the whole stream was passed
//!   (a small log proves nothing).
//! - `audit-log-coalesced`: the probe's run of identical requests became
//!   counted records rather than a line each.
//! - `audit-denials-merged`: the probe's denials to distinct hosts became
//!   a few lines a second, not a line each.
//! - `audit-finding-kept`, `audit-credential-kept`, `audit-evidence-kept`:
//!   what the agent did before the flood, a secret finding (the proxy
//!   probes'), a credential injection (`proxy-credential-tls`) and a tool
//!   call's line with its evidence hash (the harness's own `bottle execute`
//!   before the probe), are still in `bottle logs --json`. Each one's
//!   control is that it is in the kept file: its generation was dropped,
//!   so it is there only because the bundle kept it.
//! - `audit-not-degraded`: `bottle list --json` still shows the audit as
//!   ok; the cap should absorb the flood, so a degraded audit is an error
//!   (the bundle failed closed, which is no escape, but the bound failed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::audit_files::{
    AUDIT_LOG_DIR, AUDIT_LOG_FILE, AuditLines, audit_log_bound, dropped_file, kept_file,
};
use bottle_probe::contract::{
    AUDIT_FLOOD_DENY_PREFIX, AUDIT_FLOOD_SAME_PATH, Outcome, ProbeResult,
};
use serde_json::Value;

use super::Gate;
use crate::escape::fixture::{self, AUDIT_LOG_BYTES};
use crate::escape::report::{Expect, Observed, Row, Verdict};

const CAT: &str = "audit";

/// The bundle's merging window (`bottle_bundle::audit::COALESCE_WINDOW`,
/// which xtask does not link).
const COALESCE_WINDOW_MS: i64 = 1000;

/// Lines a merging window may cost: the decisions the bundle writes on
/// their own in a window (`bottle_bundle::audit::WRITTEN_PER_WINDOW`, 4),
/// then its counted line.
const LINES_PER_WINDOW: u64 = 5;

/// How long after the flood the harness waits for the last window's
/// counted line: the window, the bundle's closer tick, and margin.
const COUNTS_WRITTEN_WITHIN: Duration = Duration::from_secs(5);

/// The credential's name in the gate's manifest (`fixture::manifest`).
const CREDENTIAL_NAME: &str = "canary";

/// The probe whose request makes the bundle inject the credential.
const CREDENTIAL_PROBE: &str = "proxy-credential-tls";

/// The tool call the harness makes before the flood, through the real
/// CLI: the in-box agent's built-in `list_dir`, which needs no program in
/// the image.
const SEED_CALL: &[&str] = &[
    "--json",
    "--tool",
    "list_dir",
    "--params",
    r#"{"path":"/"}"#,
];

/// What the harness did in a bottle before its flood: the evidence hash of
/// its tool call, or why there is none.
pub(super) struct AuditSeed {
    evidence: Result<String, String>,
}

impl Gate {
    /// Makes one tool call in `bottle` through `bottle execute --json` and
    /// keeps its evidence hash, whose audit line must survive the flood.
    pub(super) fn audit_seed(&mut self, bottle: &str) -> AuditSeed {
        let mut args = vec!["execute", bottle];
        args.extend_from_slice(SEED_CALL);
        let evidence = self
            .sys
            .output(&self.cli.command(&args, Duration::from_secs(120)))
            .map_err(|e| format!("`bottle execute` did not run: {e:#}"))
            .and_then(|out| {
                if !out.success() {
                    return Err(format!("`bottle execute` failed: {}", out.stderr.trim()));
                }
                let result: Value = serde_json::from_str(&out.stdout)
                    .map_err(|e| format!("`bottle execute --json` printed no JSON: {e}"))?;
                result["evidence_hash"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("no evidence_hash in {}", out.stdout.trim()))
            });
        AuditSeed { evidence }
    }

    /// The audit rows for `bottle`, of the agent `agent`, after a full
    /// probe phase.
    pub(super) fn audit_evidence(
        &mut self,
        phase: &str,
        bottle: &str,
        agent: &str,
        seed: &AuditSeed,
        results: &[ProbeResult],
    ) -> anyhow::Result<()> {
        let dir = audit_dir(&self.cli.state_home, bottle);
        self.report
            .rows
            .push(bounded_row(phase, &dir, AUDIT_LOG_BYTES));
        // The runs' counted lines are written when their merging windows
        // close, up to a window after the probe's last request: read until
        // the counts are in, bounded.
        let mut rows = merged_rows(phase, &dir);
        bottle_test_support::eventually(COUNTS_WRITTEN_WITHIN, || {
            rows = merged_rows(phase, &dir);
            rows.iter().all(|r| r.verdict != Verdict::ControlFailed)
        });
        self.report.rows.extend(rows);

        let out = self.sys.output(
            &self
                .cli
                .command(&["logs", "--json", bottle], Duration::from_secs(60)),
        )?;
        let logged: Vec<Value> = out
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let kept = read_values(&kept_file(&dir.join(AUDIT_LOG_FILE)));
        let credential_host = fixture::credential_host(agent);
        let credential_probe = results.iter().find(|r| r.probe == CREDENTIAL_PROBE);
        let looked_for = [
            (
                "audit-finding-kept",
                "a secret finding of the proxy probes",
                Ok(()),
                Box::new(|v: &Value| {
                    v["decision"] == "blocked_secret"
                        && v["reason"]
                            .as_str()
                            .is_some_and(|r| r.starts_with("secret:"))
                }) as Box<dyn Fn(&Value) -> bool>,
            ),
            (
                "audit-credential-kept",
                "the injection of the credential for the credential host",
                match credential_probe {
                    Some(r) if r.outcome == Outcome::Blocked => Ok(()),
                    Some(r) => Err(format!(
                        "{CREDENTIAL_PROBE} did not reach the bundle's egress: {}",
                        r.observed
                    )),
                    None => Err(format!("{CREDENTIAL_PROBE} did not run")),
                },
                Box::new(move |v: &Value| {
                    v["decision"] == "inject"
                        && v["host"] == credential_host.as_str()
                        && v["reason"] == format!("credential:{CREDENTIAL_NAME}").as_str()
                }),
            ),
            (
                "audit-evidence-kept",
                "the harness's tool call with its evidence hash",
                seed.evidence.as_ref().map(|_| ()).map_err(Clone::clone),
                {
                    let evidence = seed.evidence.clone().unwrap_or_default();
                    Box::new(move |v: &Value| {
                        v["daemon"] == "sandbox" && v["evidence"] == evidence.as_str()
                    })
                },
            ),
        ];
        let log_ok = if out.success() {
            Ok(())
        } else {
            Err(format!(
                "`bottle logs --json` failed: {}",
                out.stderr.trim()
            ))
        };
        for (probe, what, seeded, is_it) in looked_for {
            let seeded = log_ok.clone().and(seeded);
            self.report
                .rows
                .push(kept_row(phase, probe, what, seeded, &logged, &kept, is_it));
        }

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

/// Every line of `path` that parses as JSON; none when it is missing.
fn read_values(path: &Path) -> Vec<Value> {
    std::fs::read(path)
        .map(|data| {
            data.split(|&b| b == b'\n')
                .filter_map(|l| serde_json::from_slice(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Reached when the line `is_it` picks is missing from `bottle logs
/// --json` (`logged`): the agent flushed it away. The control is that it is
/// in the kept file (`kept`), so its generation was dropped and the test
/// meant something. An error when there was nothing to look for
/// (`seeded`).
fn kept_row(
    phase: &str,
    probe: &str,
    what: &str,
    seeded: Result<(), String>,
    logged: &[Value],
    kept: &[Value],
    is_it: Box<dyn Fn(&Value) -> bool>,
) -> Row {
    let row = |observed, control, detail: String| {
        Row::new(
            phase,
            probe,
            CAT,
            Expect::Blocked,
            observed,
            control,
            detail,
        )
    };
    if let Err(why) = seeded {
        return row(Observed::Error, None, format!("nothing to look for: {why}"));
    }
    let found = logged.iter().any(&is_it);
    let in_kept = kept.iter().any(&is_it);
    let detail = match (found, in_kept) {
        (true, true) => format!(
            "{what} is in `bottle logs --json` after the flood, from the kept lines: its generation was dropped"
        ),
        (true, false) => format!(
            "{what} is in `bottle logs --json`, but still in the stream: the flood never dropped its generation, so nothing is proven"
        ),
        (false, _) => format!(
            "{what} is gone from `bottle logs --json` ({} lines) after the flood",
            logged.len()
        ),
    };
    row(Observed::reached_if(!found), Some(in_kept), detail)
}

/// The bottle's log dir under the run's `XDG_STATE_HOME`, named as the CLI
/// names it (`bottle_core::state::state_root`, the slug, `logs`).
fn audit_dir(state_home: &Path, bottle: &str) -> PathBuf {
    state_home
        .join("bottle")
        .join(bottle_core::slug::slug_of(bottle))
        .join(AUDIT_LOG_DIR)
}

/// Reached when the log's files together pass their bound for `cap`;
/// every `audit.jsonl*` file counts, not only those the bundle should keep.
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
    let bound = audit_log_bound(cap);
    let dropped = read_values(&dropped_file(&dir.join(AUDIT_LOG_FILE)))
        .first()
        .and_then(|v| v["count"].as_u64())
        .unwrap_or(0);
    let detail = format!(
        "{total} bytes in {} (bound {bound}; {})",
        files.join(", "),
        if dropped > 0 {
            format!("{dropped} decisions rotated out: the flood passed the whole stream")
        } else {
            "nothing rotated out: the flood did not pass the whole stream, so the bound is untested"
                .to_string()
        }
    );
    let observed = Observed::reached_if(total > bound);
    row(observed, Some(dropped > 0), detail)
}

/// Judges the probe's identical run (`audit-log-coalesced`: records whose
/// path is [`AUDIT_FLOOD_SAME_PATH`]) and its denials to distinct hosts
/// (`audit-denials-merged`: records whose path starts with
/// [`AUDIT_FLOOD_DENY_PREFIX`]). A bottle is flooded once in its life (the
/// audit probe is not among those re-run after a fault), so every such
/// record belongs to the one run, however long it stalled in between.
///
/// The criterion: the bundle writes at most [`LINES_PER_WINDOW`] lines per
/// merging window (the first few at once, the rest counted when the window
/// closes), and a run spanning `s` seconds opens at most `s + 1` windows,
/// so more than `LINES_PER_WINDOW × (s + 1) + 2` lines (two for the run's
/// edges) means the requests were written out one by one. The control is
/// that the run's requests (the sum of the lines' `count`) outnumber that
/// bound: otherwise a line per request would pass too, and nothing is
/// proven. Passing then implies some `count` > 1.
fn merged_rows(phase: &str, dir: &Path) -> Vec<Row> {
    let log = dir.join(AUDIT_LOG_FILE);
    let lines = match AuditLines::new(&log).poll() {
        Ok(l) => l,
        Err(e) => {
            return ["audit-log-coalesced", "audit-denials-merged"]
                .into_iter()
                .map(|probe| {
                    Row::new(
                        phase,
                        probe,
                        CAT,
                        Expect::Blocked,
                        Observed::Error,
                        None,
                        format!("cannot read {}: {e}", log.display()),
                    )
                })
                .collect();
        }
    };
    let records: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .collect();
    let run_of = |pick: &dyn Fn(&str) -> bool| {
        let mut run: Vec<(i64, u64)> = records
            .iter()
            .filter(|v| v["path"].as_str().is_some_and(pick))
            .filter_map(|v| {
                Some((
                    millis(v["time"].as_str()?)?,
                    v["count"].as_u64().unwrap_or(1),
                ))
            })
            .collect();
        run.sort();
        run
    };
    let identical = run_of(&|p| p == AUDIT_FLOOD_SAME_PATH);
    let distinct = run_of(&|p| p.starts_with(AUDIT_FLOOD_DENY_PREFIX));
    [
        ("audit-log-coalesced", "the identical run", identical),
        (
            "audit-denials-merged",
            "the denials to distinct hosts",
            distinct,
        ),
    ]
    .into_iter()
    .map(|(probe, what, run)| {
        let (observed, control, detail) = judge_merging(what, &run);
        Row::new(
            phase,
            probe,
            CAT,
            Expect::Blocked,
            observed,
            Some(control),
            detail,
        )
    })
    .collect()
}

/// The verdict on one run's `(time in ms, count)` lines: see
/// [`merged_rows`].
fn judge_merging(what: &str, run: &[(i64, u64)]) -> (Observed, bool, String) {
    let lines = run.len() as u64;
    let requests: u64 = run.iter().map(|(_, c)| c).sum();
    let most = run.iter().map(|(_, c)| *c).max().unwrap_or(0);
    let span = match (run.first(), run.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0,
    };
    let windows = u64::try_from(span / COALESCE_WINDOW_MS).unwrap_or(0) + 1;
    let bound = LINES_PER_WINDOW * windows + 2;
    let detail = format!(
        "{what}: {requests} requests in {lines} lines over {span} ms (at most {bound} lines allowed), largest count {most}"
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
    use bottle_core::audit_files::generation;
    use serde_json::json;

    use super::*;
    use crate::escape::report::Verdict;

    const CAP: u64 = 1 << 20;

    fn write(dir: &Path, name: &str, len: u64) {
        let f = std::fs::File::create(dir.join(name)).unwrap();
        f.set_len(len).unwrap();
    }

    fn line_at(path: &str, ms: i64, count: u64) -> String {
        let secs = ms / 1000;
        let time = format!(
            "2025-01-01T00:{:02}:{:02}.{:03}Z",
            secs / 60,
            secs % 60,
            ms % 1000
        );
        json!({"v": 3, "time": time, "path": path, "count": count}).to_string() + "\n"
    }

    fn line(ms: i64, count: u64) -> String {
        line_at(AUDIT_FLOOD_SAME_PATH, ms, count)
    }

    fn log_with(lines: &[String]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let other = json!({"v": 2, "time": "2025-01-01T00:00:00.000Z", "path": "/x", "count": 1});
        let mut text = format!("{other}\n");
        text.extend(lines.iter().map(String::as_str));
        std::fs::write(dir.path().join(AUDIT_LOG_FILE), text).unwrap();
        dir
    }

    fn coalesced_row(phase: &str, dir: &Path) -> Row {
        merged_rows(phase, dir).remove(0)
    }

    fn summary(dir: &Path, count: u64) {
        std::fs::write(
            dir.join("audit.jsonl.dropped"),
            json!({"decision": "dropped", "count": count}).to_string() + "\n",
        )
        .unwrap();
    }

    #[test]
    fn a_log_that_dropped_a_generation_within_the_bound_passes() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "audit.jsonl", CAP / 2);
        for n in 1..=3 {
            write(dir.path(), &format!("audit.jsonl.{n}"), CAP);
        }
        write(dir.path(), "audit.jsonl.kept", CAP);
        summary(dir.path(), 5000);
        write(dir.path(), "audit.ok", 0);
        let r = bounded_row("p", dir.path(), CAP);
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        assert!(
            r.detail.contains("5000 decisions rotated out"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_log_past_the_bound_is_an_escape() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "audit.jsonl", CAP);
        write(dir.path(), "audit.jsonl.1", 3 * CAP);
        write(dir.path(), "audit.jsonl.2", CAP);
        write(dir.path(), "audit.jsonl.kept", CAP);
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
    fn a_log_that_dropped_nothing_fails_the_control() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..=3 {
            let name = generation(Path::new(AUDIT_LOG_FILE), n);
            write(dir.path(), name.to_str().unwrap(), CAP);
        }
        let r = bounded_row("p", dir.path(), CAP);
        assert_eq!(r.verdict, Verdict::ControlFailed, "{r:?}");
        let r = bounded_row("p", &dir.path().join("missing"), CAP);
        assert_eq!(r.verdict, Verdict::Error, "{r:?}");
    }

    #[test]
    fn a_counted_identical_run_passes() {
        // 3,000 requests over 2.5 s: the first few and a count per window.
        let mut lines = Vec::new();
        for (start, count) in [(10_000, 996), (11_000, 996), (12_000, 996)] {
            for k in 0..4 {
                lines.push(line(start + k, 1));
            }
            lines.push(line(start + 990, count));
        }
        let r = coalesced_row("p", log_with(&lines).path());
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        assert!(
            r.detail.contains("3000 requests in 15 lines"),
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
    fn denials_to_distinct_hosts_are_judged_apart_from_the_identical_run() {
        let deny = |i: i64, ms: i64, count: u64| {
            line_at(&format!("{AUDIT_FLOOD_DENY_PREFIX}{i}/aaaa"), ms, count)
        };
        let merged = [
            deny(0, 1_000, 1),
            deny(500, 1_900, 900),
            deny(900, 2_100, 80),
        ];
        let rows = merged_rows("p", log_with(&merged).path());
        assert_eq!(rows[1].probe, "audit-denials-merged");
        assert_eq!(rows[1].verdict, Verdict::Pass, "{:?}", rows[1]);
        let one_by_one: Vec<String> = (0..200).map(|i| deny(i, 1_000 + i, 1)).collect();
        let rows = merged_rows("p", log_with(&one_by_one).path());
        assert_eq!(rows[1].verdict, Verdict::Escape, "{:?}", rows[1]);
        // The identical run's row does not see them.
        assert_eq!(rows[0].verdict, Verdict::ControlFailed, "{:?}", rows[0]);
    }

    fn finding() -> Box<dyn Fn(&Value) -> bool> {
        Box::new(|v: &Value| v["decision"] == "blocked_secret")
    }

    #[test]
    fn a_kept_line_that_survived_its_generation_passes() {
        let line = json!({"decision": "blocked_secret", "reason": "secret:aws_access_key_id"});
        let logged = [json!({"decision": "deny"}), line.clone()];
        let r = kept_row(
            "p",
            "k",
            "it",
            Ok(()),
            &logged,
            std::slice::from_ref(&line),
            finding(),
        );
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        // Gone: an escape.
        let r = kept_row("p", "k", "it", Ok(()), &logged[..1], &[], finding());
        assert_eq!(r.verdict, Verdict::Escape, "{r:?}");
        // Still in the stream: the flood proved nothing.
        let r = kept_row("p", "k", "it", Ok(()), &logged, &[], finding());
        assert_eq!(r.verdict, Verdict::ControlFailed, "{r:?}");
        // Nothing was planted: an error, never an escape.
        let r = kept_row("p", "k", "it", Err("no".into()), &[], &[], finding());
        assert_eq!(r.verdict, Verdict::Error, "{r:?}");
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
