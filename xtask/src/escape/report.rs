//! Verdicts and the report: what each probe was expected to do, what it
//! did, and what that means for the run.
//!
//! The rule the whole gate rests on: a run passes only when every attack
//! was blocked *and* every positive control showed the canary it aimed at
//! was reachable from outside the bottle in the same run. A blocked probe
//! whose control failed proves nothing (the canary may simply have been
//! down), so it fails the run instead of passing it.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

/// Exit code when any escape was observed.
pub(crate) const EXIT_ESCAPE: u8 = 10;
/// Exit code for a failed control, a probe that could not run, or a
/// harness error.
pub(crate) const EXIT_FAILED: u8 = 1;

/// What a row expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Expect {
    /// An attack: must be blocked.
    Blocked,
    /// A positive control: must reach its canary.
    Reached,
}

/// What was observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Observed {
    /// The attempt failed the way isolation should make it fail.
    Blocked,
    /// The attempt got through.
    Reached,
    /// The probe could not tell (it crashed, printed nothing, or did not
    /// run).
    Error,
}

impl Observed {
    /// [`Observed::Reached`] when `reached`, else [`Observed::Blocked`].
    pub(crate) fn reached_if(reached: bool) -> Observed {
        if reached {
            Observed::Reached
        } else {
            Observed::Blocked
        }
    }
}

/// The verdict on one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Verdict {
    /// As expected.
    Pass,
    /// The probe could not run or could not tell: nothing is proven.
    Error,
    /// The canary this probe depends on was not reachable from outside the
    /// bottle, so "blocked" proves nothing.
    ControlFailed,
    /// Isolation was broken.
    Escape,
}

impl Verdict {
    /// The word in the table.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Error => "ERROR",
            Verdict::ControlFailed => "CONTROL-FAILED",
            Verdict::Escape => "ESCAPE",
        }
    }
}

/// Judges one row. `control` is the outcome of the positive control for
/// the canary the row depends on (`None`: it depends on none).
pub(crate) fn judge(expect: Expect, observed: Observed, control: Option<bool>) -> Verdict {
    match (expect, observed) {
        // An escape stays an escape even when a control failed too.
        (Expect::Blocked, Observed::Reached) => Verdict::Escape,
        (Expect::Blocked, Observed::Blocked) if control == Some(false) => Verdict::ControlFailed,
        (Expect::Blocked, Observed::Blocked) => Verdict::Pass,
        (Expect::Blocked, Observed::Error) => Verdict::Error,
        (Expect::Reached, Observed::Reached) => Verdict::Pass,
        (Expect::Reached, Observed::Blocked | Observed::Error) => Verdict::ControlFailed,
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    /// Where it ran: `bottle A`, `host control`, `after bundle kill`, ...
    pub phase: String,
    /// The probe (or check) name.
    pub probe: String,
    /// Its category.
    pub category: String,
    /// What it had to do.
    pub expected: Expect,
    /// What it did.
    pub observed: Observed,
    /// The verdict.
    pub verdict: Verdict,
    /// One line of evidence.
    pub detail: String,
}

impl Row {
    /// A judged row.
    pub(crate) fn new(
        phase: &str,
        probe: &str,
        category: &str,
        expected: Expect,
        observed: Observed,
        control: Option<bool>,
        detail: impl Into<String>,
    ) -> Row {
        Row {
            phase: phase.to_string(),
            probe: probe.to_string(),
            category: category.to_string(),
            expected,
            observed,
            verdict: judge(expected, observed, control),
            detail: detail.into(),
        }
    }

    /// A positive control of the harness's own: it must have `reached`.
    pub(crate) fn control(
        phase: &str,
        probe: &str,
        reached: bool,
        detail: impl Into<String>,
    ) -> Row {
        Row::new(
            phase,
            probe,
            "control",
            Expect::Reached,
            Observed::reached_if(reached),
            None,
            detail,
        )
    }
}

/// Counts per verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Summary {
    /// Rows that passed.
    pub pass: usize,
    /// Escapes.
    pub escape: usize,
    /// Failed controls.
    pub control_failed: usize,
    /// Probes that could not tell.
    pub error: usize,
}

/// The whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Report {
    /// The backend under test.
    pub backend: String,
    /// The agents' isolation tier (`container`, `gvisor`).
    pub isolation: String,
    /// The run's canary token.
    pub token: String,
    /// Every row, in the order they were produced.
    pub rows: Vec<Row>,
    /// Harness errors that cut the run short (each fails it).
    pub harness_errors: Vec<String>,
    /// Wall time of the run in milliseconds.
    pub duration_ms: u128,
}

impl Report {
    /// Counts per verdict.
    pub(crate) fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for row in &self.rows {
            match row.verdict {
                Verdict::Pass => s.pass += 1,
                Verdict::Escape => s.escape += 1,
                Verdict::ControlFailed => s.control_failed += 1,
                Verdict::Error => s.error += 1,
            }
        }
        s
    }

    /// 10 on any escape; 1 on a failed control, a probe error, a harness
    /// error, or an empty run; 0 only when everything passed.
    pub(crate) fn exit_code(&self) -> u8 {
        let s = self.summary();
        if s.escape > 0 {
            EXIT_ESCAPE
        } else if s.control_failed > 0
            || s.error > 0
            || !self.harness_errors.is_empty()
            || self.rows.is_empty()
        {
            EXIT_FAILED
        } else {
            0
        }
    }

    /// The process exit code.
    pub(crate) fn exit(&self) -> ExitCode {
        ExitCode::from(self.exit_code())
    }

    /// The table, grouped by phase, then the summary line.
    pub(crate) fn render_table(&self) -> String {
        let headers = ["PROBE", "CATEGORY", "EXPECTED", "OBSERVED", "VERDICT"];
        let cells = |r: &Row| {
            [
                r.probe.clone(),
                r.category.clone(),
                expect_word(r.expected).to_string(),
                observed_word(r.observed).to_string(),
                r.verdict.as_str().to_string(),
            ]
        };
        let mut widths = headers.map(str::len);
        for row in &self.rows {
            for (w, c) in widths.iter_mut().zip(cells(row)) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cols: [String; 5]| {
            let mut out = String::new();
            for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
                if i + 1 == cols.len() {
                    out.push_str(c);
                } else {
                    let _ = write!(out, "{c:<w$}  ");
                }
            }
            out.push('\n');
            out
        };
        let mut out = line(headers.map(str::to_string));
        let mut phase = None;
        for row in &self.rows {
            if phase != Some(&row.phase) {
                let _ = writeln!(out, "-- {}", row.phase);
                phase = Some(&row.phase);
            }
            out.push_str(&line(cells(row)));
        }
        let bad: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.verdict != Verdict::Pass)
            .collect();
        if !bad.is_empty() {
            out.push_str("\nfailures:\n");
            for row in bad {
                let _ = writeln!(
                    out,
                    "  {} [{}] {}: {}",
                    row.verdict.as_str(),
                    row.phase,
                    row.probe,
                    row.detail
                );
            }
        }
        for err in &self.harness_errors {
            let _ = writeln!(out, "harness error: {err}");
        }
        let s = self.summary();
        let _ = writeln!(
            out,
            "\nsandbox-escape ({}{}): {} passed, {} escaped, {} control failed, {} errors in {:.1}s -> exit {}",
            self.backend,
            if self.isolation.is_empty() || self.isolation == "container" {
                String::new()
            } else {
                format!(", {}", self.isolation)
            },
            s.pass,
            s.escape,
            s.control_failed,
            s.error,
            self.duration_ms as f64 / 1000.0,
            self.exit_code()
        );
        out
    }

    /// The report as one JSON document.
    pub(crate) fn render_json(&self) -> String {
        let value = serde_json::json!({
            "backend": self.backend,
            "isolation": self.isolation,
            "token": self.token,
            "exit_code": self.exit_code(),
            "summary": self.summary(),
            "rows": self.rows,
            "harness_errors": self.harness_errors,
            "duration_ms": self.duration_ms,
        });
        serde_json::to_string_pretty(&value).unwrap_or_else(|_| "{}".to_string())
    }
}

fn expect_word(e: Expect) -> &'static str {
    match e {
        Expect::Blocked => "blocked",
        Expect::Reached => "reached",
    }
}

fn observed_word(o: Observed) -> &'static str {
    match o {
        Observed::Blocked => "blocked",
        Observed::Reached => "reached",
        Observed::Error => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        use Expect::*;
        use Observed as O;
        assert_eq!(judge(Blocked, O::Blocked, Some(true)), Verdict::Pass);
        assert_eq!(judge(Blocked, O::Blocked, None), Verdict::Pass);
        // Blocked, but the canary was never shown reachable: not a pass.
        assert_eq!(
            judge(Blocked, O::Blocked, Some(false)),
            Verdict::ControlFailed
        );
        assert_eq!(judge(Blocked, O::Reached, Some(true)), Verdict::Escape);
        assert_eq!(judge(Blocked, O::Reached, Some(false)), Verdict::Escape);
        assert_eq!(judge(Blocked, O::Error, Some(true)), Verdict::Error);
        assert_eq!(judge(Reached, O::Reached, None), Verdict::Pass);
        assert_eq!(judge(Reached, O::Blocked, None), Verdict::ControlFailed);
        assert_eq!(judge(Reached, O::Error, None), Verdict::ControlFailed);
    }

    fn report(rows: Vec<Row>) -> Report {
        Report {
            backend: "docker".into(),
            isolation: "container".into(),
            token: "t".into(),
            rows,
            harness_errors: Vec::new(),
            duration_ms: 61_500,
        }
    }

    fn blocked(probe: &str) -> Row {
        Row::new(
            "bottle A",
            probe,
            "network",
            Expect::Blocked,
            Observed::Blocked,
            Some(true),
            "refused",
        )
    }

    #[test]
    fn exit_codes() {
        assert_eq!(report(vec![blocked("a")]).exit_code(), 0);
        assert_eq!(
            report(vec![]).exit_code(),
            EXIT_FAILED,
            "an empty run proves nothing"
        );
        let control = Row::new(
            "host",
            "c",
            "control",
            Expect::Reached,
            Observed::Blocked,
            None,
            "down",
        );
        assert_eq!(
            report(vec![blocked("a"), control.clone()]).exit_code(),
            EXIT_FAILED
        );
        let escape = Row::new(
            "bottle A",
            "e",
            "network",
            Expect::Blocked,
            Observed::Reached,
            Some(true),
            "got token",
        );
        assert_eq!(report(vec![control, escape]).exit_code(), EXIT_ESCAPE);
        let mut with_error = report(vec![blocked("a")]);
        with_error
            .harness_errors
            .push("dockerd did not come back".into());
        assert_eq!(with_error.exit_code(), EXIT_FAILED);
    }

    #[test]
    fn the_table_groups_by_phase_and_lists_failures() {
        let rows = vec![
            Row::new(
                "host control",
                "internet:80",
                "control",
                Expect::Reached,
                Observed::Reached,
                None,
                "token seen",
            ),
            blocked("tcp-internet"),
            Row::new(
                "bottle A",
                "dns-exfil",
                "dns",
                Expect::Blocked,
                Observed::Reached,
                None,
                "recorder saw exfil.bottle.test from 192.168.3.3",
            ),
        ];
        let expected = "\
PROBE         CATEGORY  EXPECTED  OBSERVED  VERDICT
-- host control
internet:80   control   reached   reached   pass
-- bottle A
tcp-internet  network   blocked   blocked   pass
dns-exfil     dns       blocked   reached   ESCAPE

failures:
  ESCAPE [bottle A] dns-exfil: recorder saw exfil.bottle.test from 192.168.3.3

sandbox-escape (docker): 2 passed, 1 escaped, 0 control failed, 0 errors in 61.5s -> exit 10
";
        assert_eq!(report(rows).render_table(), expected);
    }

    #[test]
    fn json_carries_rows_summary_and_exit_code() {
        let json: serde_json::Value =
            serde_json::from_str(&report(vec![blocked("a")]).render_json()).unwrap();
        assert_eq!(json["exit_code"], 0);
        assert_eq!(json["summary"]["pass"], 1);
        assert_eq!(json["rows"][0]["probe"], "a");
        assert_eq!(json["rows"][0]["expected"], "blocked");
        assert_eq!(json["rows"][0]["verdict"], "pass");
    }
}
