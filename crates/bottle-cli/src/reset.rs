//! `bottle reset NAME`: returns a bottle to its golden snapshot and prints
//! the three sources' verdicts (or, with `--json`, the `ResetReport`). A
//! halted reset exits 5 and its message says which source diverged and
//! how. The revert ends every process of the box, a detached agent's
//! with them: once the reset is verified, its command starts again in a
//! new session (`--keep-stopped` leaves it stopped), and `reset` says so.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use bottle_core::BackendKind;
use bottle_core::backend::BackendError;
use bottle_core::exec::{CommandSpec, SystemRunner};
use bottle_core::sandbox::{ResetFiles, ResetReport, SandboxError};
use bottle_core::slug;
use bottle_core::state::SessionPaths;

use crate::args::{Global, ResetArgs};
use crate::failure::Failure;
use crate::output;
use crate::spawn_self::spawn_self;

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
            if bottle.reset_is_preparable()
                && let Err(why) = spawn_prepare(bottle.name(), kind)
            {
                output::note(global.quiet, &prepare_warning(bottle.name(), &why));
            }
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

/// The hidden command that prepares a bottle's next reset.
pub(crate) const PREPARE_SUBCOMMAND: &str = "__prepare-reset";

/// Starts `bottle __prepare-reset NAME` detached, so the next reset's
/// standby is made off the caller's path; it writes what it did to the
/// bottle's `golden/prepare.log`. A bottle with no golden snapshot has
/// nothing to prepare.
pub(crate) fn spawn_prepare(name: &str, backend: BackendKind) -> Result<(), String> {
    let root = bottle_core::state::state_root(|key| std::env::var(key).ok())
        .map_err(|err| err.to_string())?;
    let golden = ResetFiles::new(root.join(slug::slug_of(name))).golden_dir();
    if !golden.is_dir() {
        return Ok(());
    }
    spawn_self(
        &SystemRunner,
        |exe| prepare_spec(exe, name, backend),
        &golden.join(PREPARE_LOG),
    )
    .map(drop)
}

/// Where a bottle's preparers say what they did, in its golden dir.
pub(crate) const PREPARE_LOG: &str = "prepare.log";

/// Appends what a preparation of `name`'s next reset did to `log`, as the
/// preparer process writes it.
pub(crate) fn log_prepared(log: &Path, name: &str, done: Result<String, BackendError>) {
    let said = match done {
        Ok(done) => done,
        Err(err) => format!(
            "error: {}",
            bottle_core::display::escape_for_terminal(&err.to_string())
        ),
    };
    let line = prepared_line(name, &said);
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| std::io::Write::write_all(&mut file, line.as_bytes()));
    // The log is for the operator; a preparation that cannot be logged
    // still prepared.
    drop(appended);
}

/// One line of the preparer's log: when, which bottle, what was said.
fn prepared_line(name: &str, said: &str) -> String {
    format!(
        "{} {name}: {said}\n",
        bottle_core::time::now_rfc3339_millis()
    )
}

/// The warning when the next reset of `name` was not prepared.
pub(crate) fn prepare_warning(name: &str, why: &str) -> String {
    format!(
        "warning: the next reset of {name} is not prepared ({}); it will restart the box",
        bottle_core::display::escape_for_terminal(why)
    )
}

/// The preparer's invocation: this `bottle`, on the bottle's backend.
fn prepare_spec(bottle_exe: &Path, name: &str, backend: BackendKind) -> CommandSpec {
    CommandSpec::new(bottle_exe)
        .arg("--backend")
        .arg(backend.as_str())
        .args(["--quiet", PREPARE_SUBCOMMAND, name])
        .cwd("/")
}

/// `bottle __prepare-reset NAME`: leaves the caller's session, then
/// prepares the bottle's next reset and says what it did.
pub(crate) fn prepare(global: &Global, name: &str) -> Result<ExitCode, Failure> {
    let _ = rustix::process::setsid();
    let _ = crate::session::host::close_inherited_fds();
    let (bottle, _) = crate::lookup::find_bottle_and_backend(global, name)?;
    let done = bottle.prepare_reset()?;
    output::out(&prepared_line(bottle.name(), &done));
    Ok(ExitCode::SUCCESS)
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
        "{}{}: reset {verdict} (revert by {} {}, verify {})\n",
        output::table(&["SOURCE", "EXPECTED", "OBSERVED", ""], &rows),
        report.bottle,
        report.method.as_str(),
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
    use bottle_core::sandbox::{RevertMethod, Source, SourceCheck};

    use super::*;

    #[test]
    fn the_preparer_is_this_bottle_on_the_bottles_backend() {
        let spec = prepare_spec(
            Path::new("/usr/bin/bottle"),
            "bot-bottle-demo",
            BackendKind::Docker,
        );
        let argv = spec.argv();
        assert_eq!(
            argv,
            [
                "/usr/bin/bottle",
                "--backend",
                "docker",
                "--quiet",
                PREPARE_SUBCOMMAND,
                "bot-bottle-demo"
            ]
        );
        assert_eq!(spec.cwd.as_deref(), Some(Path::new("/")));
        let cli = <crate::args::Cli as clap::Parser>::try_parse_from(&argv).unwrap();
        assert!(cli.global.quiet);
        let crate::args::Command::PrepareReset(args) = cli.command else {
            panic!("{PREPARE_SUBCOMMAND} parsed as another command");
        };
        assert_eq!(args.bottle, "bot-bottle-demo");
    }

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
            method: RevertMethod::Standby,
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
            "bot-bottle-demo: reset verified (revert by standby 310 ms, verify 12 ms)"
        );
        let diverged = render(&report("7"));
        assert!(diverged.lines().nth(2).unwrap().ends_with('✗'));
        assert!(diverged.contains("reset diverged"));
    }
}
