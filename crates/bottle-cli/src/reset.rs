//! `bottle reset NAME`: returns a bottle to its golden snapshot and prints
//! the three sources' verdicts (or, with `--json`, the `ResetReport`). A
//! halted reset exits 5 and its message says which source diverged and
//! how. The revert ends every process of the box, a detached agent's
//! with them: once the reset is verified, its command starts again in a
//! new session (`--keep-stopped` leaves it stopped), and `reset` says so.

use std::process::ExitCode;
use std::time::Duration;

use bottle_core::sandbox::{ResetReport, SandboxError};

use bottle_core::slug;
use bottle_core::state::SessionPaths;

use crate::args::{Global, ResetArgs};
use crate::failure::Failure;
use crate::output;

/// The widest value a row of the table shows (a whole `sha256:<hex>`);
/// `--json` has every value whole.
const SHOWN_VALUE_CHARS: usize = 71;

/// Runs `bottle reset`.
pub(crate) fn reset(global: &Global, args: &ResetArgs) -> Result<ExitCode, Failure> {
    let (bottle, kind) = crate::lookup::find_bottle_and_backend(global, &args.bottle)?;
    let session = SessionPaths::new(&crate::lookup::state_root()?, slug::slug_of(bottle.name()));
    // Read before the revert ends the agent: the command its session ran.
    let detached_agent = detached_command(&session);
    match bottle.reset() {
        Ok(report) => {
            print_report(global, &report)?;
            if let Some(command) = detached_agent {
                restart_agent(global, args, bottle.name(), kind, &session, &command)?;
            }
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

/// The command of the bottle's detached agent, when a session ran one.
fn detached_command(session: &SessionPaths) -> Option<Vec<String>> {
    if !session.started().exists() {
        return None;
    }
    serde_json::from_slice(&std::fs::read(session.command()).ok()?).ok()
}

/// After a verified reset: ends the old session (its agent died with the
/// revert) and, unless `--keep-stopped`, starts the command again in a new
/// one.
fn restart_agent(
    global: &Global,
    args: &ResetArgs,
    name: &str,
    kind: bottle_core::BackendKind,
    session: &SessionPaths,
    command: &[String],
) -> Result<(), Failure> {
    crate::session::end(session);
    if args.keep_stopped {
        output::note(
            global.quiet,
            &format!("the reset ended {name}'s detached agent; it stays stopped (--keep-stopped)"),
        );
        return Ok(());
    }
    crate::session::spawn_host(
        &bottle_core::exec::SystemRunner,
        session,
        kind,
        name,
        command,
    )?;
    output::note(
        global.quiet,
        &format!(
            "the reset ended {name}'s detached agent; its command runs again in a new session (`bottle attach {name}`)"
        ),
    );
    Ok(())
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
