//! `bottle stop`, and `bottle __finish-stop`, the detached process that
//! finishes what `stop` began.
//!
//! Why two processes: the operator waits only until the agent can no
//! longer run or reach anything. The backend's `begin_stop` records that
//! the bottle is stopping and removes the agent's box; `stop` then returns,
//! and the finisher ends the session holder and removes the rest (bundle, network,
//! state dir with its audit log kept; the shared egress network stays for
//! the next launch until `cleanup`). If
//! the finisher dies, the record makes `list` show the bottle as
//! `stopping` and `cleanup` finish it, so nothing leaks. A backend with no
//! faster first part (smolmachines) stops the bottle whole, as before.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bottle_core::backend::{BackendErrorKind, StopProgress};
use bottle_core::exec::{CommandSpec, SystemRunner};
use bottle_core::life::StateDir;
use bottle_core::state::SessionPaths;
use bottle_core::{BackendKind, CleanupReport, slug};

use crate::args::Global;
use crate::backends::{self, AnyBackend};
use crate::failure::{EXIT_BACKEND, Failure};
use crate::lookup::{backends_to_ask, no_bottle_named, state_root};
use crate::output::{note, out};
use crate::spawn_self::spawn_self;

/// The hidden subcommand the finisher runs as.
pub(crate) const FINISH_SUBCOMMAND: &str = "__finish-stop";

/// The finisher's output, in the bottle's state dir: kept with the dir
/// when the finish fails.
const FINISHER_LOG: &str = "stopping.log";

/// `bottle stop BOTTLE`; with `wait`, the finish runs here before it
/// returns instead of in a detached finisher.
pub(crate) fn stop(global: &Global, bottle: &str, wait: bool) -> Result<ExitCode, Failure> {
    let slug = slug::slug_of(bottle);
    let name = slug::bottle_name(slug);
    let root = state_root().ok();
    let session = root.as_deref().map(|root| SessionPaths::new(root, slug));
    // The holder winds down while the boxes go; it is waited for later.
    if let Some(session) = &session {
        crate::session::signal_end(session);
    }
    // The host's side of its ports and host services goes first: nothing
    // reaches into a bottle that is stopping.
    let state_dir = root.as_deref().map(|root| root.join(slug));
    if let Some(state_dir) = &state_dir {
        crate::forward::end_all(state_dir);
    }
    // What the agent pushed into working checkouts' mirrors goes into the
    // checkouts before anything of the bottle is removed.
    let mut synced = state_dir
        .as_deref()
        .map(crate::checkout::sync_quietly)
        .unwrap_or_default();
    let mut last_error = None;
    let mut outcome = None;
    for backend in backends_for(global, root.as_deref(), slug)? {
        match backend.begin_stop(&name) {
            // Stopping is idempotent in the backends; nothing removed means
            // this backend never had the bottle.
            Ok(StopProgress::Stopped(report))
                if report.removed.is_empty() && report.failed.is_empty() => {}
            Ok(StopProgress::Stopped(report)) => {
                outcome = Some((report, None));
                break;
            }
            Ok(StopProgress::Stopping(report)) => {
                outcome = Some((report, Some(backend)));
                break;
            }
            Err(err) if err.kind == BackendErrorKind::NotFound => last_error = Some(err),
            Err(err) => return Err(err.into()),
        }
    }
    let Some((mut report, stopping_on)) = outcome else {
        return Err(last_error
            .map(Failure::from)
            .unwrap_or_else(|| no_bottle_named(&name)));
    };
    if stopping_on.is_some()
        && let Some(dir) = &state_dir
    {
        // The agent's box is gone, the mirrors not yet: a push from its
        // last moment is brought in too.
        let last = crate::checkout::sync_quietly(dir);
        synced.refs.extend(last.refs);
        synced.failed = last.failed;
    }
    crate::checkout::print_report(global, &synced);
    match stopping_on {
        Some(backend) if report.failed.is_empty() && wait => {
            let finished = finish_on(&backend, session.as_ref(), &name)?;
            report.removed.extend(finished.removed);
            report.kept.extend(finished.kept);
        }
        Some(backend) if report.failed.is_empty() => {
            let log = root
                .as_deref()
                .map(|root| root.join(slug).join(FINISHER_LOG));
            if let Err(reason) = spawn_finisher(backend.kind(), &name, log.as_deref()) {
                // Finished here instead: slower, never leaky.
                note(
                    global.quiet,
                    &format!("warning: finishing the stop here, not in the background: {reason}"),
                );
                finish_on(&backend, session.as_ref(), &name)?;
            }
        }
        _ => {
            if let Some(session) = &session {
                crate::session::end(session);
                // The backend left the state dir to us if only the session
                // was in it.
                if let Some(root) = &root {
                    let _ = std::fs::remove_dir(root.join(slug));
                }
            }
        }
    }
    for line in &report.removed {
        note(global.quiet, &format!("removed {line}"));
    }
    for line in &report.kept {
        note(
            global.quiet,
            &format!("kept {line} (`bottle logs {name}` reads it)"),
        );
    }
    if !report.failed.is_empty() {
        return Err(Failure::new(
            "BOT-C007",
            EXIT_BACKEND,
            format!(
                "{name} was stopped but some of its resources remain: {}",
                report.failed.join("; ")
            ),
        )
        .with_fix("run `bottle cleanup`, then check `bottle list`"));
    }
    out(&format!("stopped {name}\n"));
    Ok(ExitCode::SUCCESS)
}

/// The backends to ask for the bottle `slug`: the one its state dir's
/// record names when there is one (of any layout), without a preflight
/// (its first request reports an unreachable daemon as well, a round trip
/// sooner), otherwise those [`backends_to_ask`] picks.
fn backends_for(
    global: &Global,
    state_root: Option<&Path>,
    slug: &str,
) -> Result<Vec<AnyBackend>, Failure> {
    let owner = state_root.and_then(|root| recorded_backend(&StateDir::of(root, slug)));
    match owner {
        Some(kind) if !backends::explicit(global) => Ok(vec![backends::open(
            kind,
            global,
            backends::Mode::default(),
        )?]),
        _ => backends_to_ask(global),
    }
}

/// The backend a state dir's record names, if it can be read.
fn recorded_backend(dir: &StateDir) -> Option<BackendKind> {
    Some(dir.read().ok()??.record.backend)
}

/// The finisher's invocation: this `bottle`, on the bottle's backend.
fn finisher_spec(bottle_exe: &Path, kind: BackendKind, name: &str) -> CommandSpec {
    CommandSpec::new(bottle_exe)
        .args(["--backend", kind.as_str(), FINISH_SUBCOMMAND, name])
        // Holds no directory the operator may want to unmount.
        .cwd("/")
}

/// Starts the finisher, detached; its output goes to `log` (in the
/// bottle's state dir, kept with it when the finish fails).
fn spawn_finisher(kind: BackendKind, name: &str, log: Option<&Path>) -> Result<(), String> {
    let log = log
        .filter(|log| log.parent().is_some_and(Path::is_dir))
        .map_or_else(|| PathBuf::from("/dev/null"), Path::to_path_buf);
    spawn_self(&SystemRunner, |exe| finisher_spec(exe, kind, name), &log).map(drop)
}

/// `bottle __finish-stop BOTTLE`: leaves the operator's session, ends the
/// bottle's session holder and removes the rest of the bottle.
pub(crate) fn finish(global: &Global, bottle: &str) -> Result<ExitCode, Failure> {
    // First, so the operator's terminal closing cannot signal us; then let
    // go of whatever `stop` inherited (an operator's `flock LOCK bottle
    // stop` would otherwise stay locked until we are done).
    let _ = rustix::process::setsid();
    let _ = crate::session::host::close_inherited_fds();
    let slug = slug::slug_of(bottle);
    let name = slug::bottle_name(slug);
    let session = state_root().ok().map(|root| SessionPaths::new(&root, slug));
    let kind = backends::selected(global)?;
    let backend = backends::open(kind, global, backends::Mode::default())?;
    finish_on(&backend, session.as_ref(), &name)?;
    Ok(ExitCode::SUCCESS)
}

/// Ends the session holder, then stops the bottle on `backend`; what could
/// not be removed is the error (the bottle stays recorded as stopping, for
/// `cleanup`).
fn finish_on(
    backend: &AnyBackend,
    session: Option<&SessionPaths>,
    name: &str,
) -> Result<CleanupReport, Failure> {
    if let Some(session) = session {
        crate::session::end(session);
    }
    let report = backend.finish_stop(name)?;
    if report.failed.is_empty() {
        // A backend that removes only its own files (smolmachines) leaves
        // the finisher's log in the state dir: the stop is finished, so
        // the log goes, and the dir once nothing else is in it.
        if let Some(state_dir) = session.and_then(|s| s.dir.parent()) {
            let _ = std::fs::remove_file(state_dir.join(FINISHER_LOG));
            let _ = std::fs::remove_dir(state_dir);
        }
        return Ok(report);
    }
    Err(Failure::new(
        "BOT-C055",
        EXIT_BACKEND,
        format!(
            "the stop of {name} was not finished: {}",
            report.failed.join("; ")
        ),
    )
    .with_fix(format!(
        "`bottle list` shows {name} as stopping; run `bottle cleanup` to finish it"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_finisher_is_this_bottle_on_the_bottles_backend() {
        let spec = finisher_spec(
            Path::new("/usr/bin/bottle"),
            BackendKind::Docker,
            "bot-bottle-demo",
        );
        assert_eq!(
            spec.argv(),
            [
                "/usr/bin/bottle",
                "--backend",
                "docker",
                FINISH_SUBCOMMAND,
                "bot-bottle-demo"
            ]
        );
        assert_eq!(spec.cwd.as_deref(), Some(Path::new("/")));
    }

    #[test]
    fn the_record_names_the_backend_to_ask_in_either_layout() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::of(root.path(), "demo");
        assert_eq!(recorded_backend(&dir), None);
        let record = bottle_core::life::BottleRecord::launching(
            "bot-bottle-demo",
            "demo",
            BackendKind::Smolmachines,
        );
        dir.begin(&record).unwrap();
        assert_eq!(recorded_backend(&dir), Some(BackendKind::Smolmachines));
        std::fs::write(dir.record_path(), "garbage").unwrap();
        assert_eq!(recorded_backend(&dir), None);
        // A docker state dir of the layout before `bottle.json`.
        std::fs::remove_file(dir.record_path()).unwrap();
        std::fs::write(
            dir.root().join("plan.json"),
            r#"{"backend":"docker","bottle":"bot-bottle-demo","agent":"demo"}"#,
        )
        .unwrap();
        assert_eq!(recorded_backend(&dir), Some(BackendKind::Docker));
    }
}
