//! `bottle reset NAME`: returns a bottle to its golden snapshot and prints
//! the three sources' verdicts (or, with `--json`, the `ResetReport`). A
//! halted reset exits 5 and its message says which source diverged and
//! how.

use std::process::ExitCode;
use std::time::Duration;

use bottle_core::sandbox::{ResetReport, SandboxError};

use crate::args::Global;
use crate::failure::Failure;
use crate::output;

/// The widest value a row of the table shows (a whole `sha256:<hex>`);
/// `--json` has every value whole.
const SHOWN_VALUE_CHARS: usize = 71;

/// Runs `bottle reset`.
pub(crate) fn reset(global: &Global, bottle: &str) -> Result<ExitCode, Failure> {
    let bottle = crate::commands::find_bottle(global, bottle)?;
    match bottle.reset() {
        Ok(report) => {
            print_report(global, &report)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            if let SandboxError::ResetDivergence { report } = &err {
                print_report(global, report)?;
            }
            Err(Failure::coded(&err, err.exit_code()))
        }
    }
}

fn print_report(global: &Global, report: &ResetReport) -> Result<(), Failure> {
    if global.json {
        return output::json(report);
    }
    output::out(&render(report));
    Ok(())
}

/// The report as the operator reads it: one row per source, then times.
fn render(report: &ResetReport) -> String {
    let rows: Vec<Vec<String>> = report
        .checks
        .iter()
        .map(|check| {
            vec![
                check.source.to_string(),
                cut(&check.expected),
                cut(&check.observed),
                if check.matched { "✓" } else { "✗" }.to_string(),
            ]
        })
        .collect();
    let verdict = if report.verified {
        "verified"
    } else {
        "diverged"
    };
    format!(
        "{}{}: reset {verdict} (revert {}, verify {})\n",
        output::table(&["SOURCE", "EXPECTED", "OBSERVED", ""], &rows),
        report.bottle,
        millis(report.revert),
        millis(report.verify)
    )
}

fn cut(value: &str) -> String {
    let mut chars = value.chars();
    let mut shown: String = chars.by_ref().take(SHOWN_VALUE_CHARS).collect();
    if chars.next().is_some() {
        shown.push('…');
    }
    shown
}

fn millis(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}

#[cfg(test)]
mod tests {
    use bottle_core::sandbox::{Source, SourceCheck};

    use super::*;

    fn report(fds_observed: &str) -> ResetReport {
        let check = |source, expected: &str, observed: &str| SourceCheck {
            source,
            expected: expected.into(),
            observed: observed.into(),
            matched: expected == observed,
        };
        let checks = vec![
            check(Source::Filesystem, "sha256:ab", "sha256:ab"),
            check(Source::OpenFds, "6", fds_observed),
            check(Source::Engine, &"x".repeat(100), &"x".repeat(100)),
        ];
        ResetReport {
            bottle: "bot-bottle-demo".into(),
            verified: checks.iter().all(|c| c.matched),
            checks,
            revert: Duration::from_millis(310),
            verify: Duration::from_millis(12),
        }
    }

    #[test]
    fn the_report_shows_each_source_with_its_verdict_and_the_times() {
        let text = render(&report("6"));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("filesystem") && lines[1].ends_with('✓'));
        assert!(lines[1].contains("sha256:ab  "));
        assert!(lines[3].contains(&format!(" {}…", "x".repeat(71))));
        assert_eq!(
            lines[4],
            "bot-bottle-demo: reset verified (revert 310 ms, verify 12 ms)"
        );
        let diverged = render(&report("7"));
        assert!(diverged.lines().nth(2).unwrap().ends_with('✗'));
        assert!(diverged.contains("reset diverged"));
    }
}
