//! Who brings the agent's accepted pushes from a bottle's mirrors back
//! into the operator's working checkouts, and when
//! (`bottle_core::checkout` says how, and why it is safe).
//!
//! Always a `bottle` process on the host, never the bundle, which has no
//! access to the checkout at all:
//!
//! - the process that holds the bottle while its agent runs: the attached
//!   `bottle start`, or a detached bottle's session holder (`bottle
//!   __session-host`), through a [`Watcher`]: a thread that looks at the
//!   mirrors' ref files every [`POLL`] (a few `stat`s, no git) and syncs
//!   when they changed, writing what it did to `git/sync.log` in the state
//!   dir (never to the agent's terminal), then syncs once more when the
//!   agent ends;
//! - `bottle stop`, before anything is removed and, on docker, again once
//!   the agent's container is gone, so a push from the agent's last moment
//!   is not lost with the mirror;
//! - `bottle sync BOTTLE`, whenever the operator asks.
//!
//! Syncs of one bottle never interleave: they take the lock in its state
//! dir.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bottle_core::checkout::{self, CheckoutPaths, Outcome, SyncReport};
use bottle_core::exec::SystemRunner;
use bottle_core::slug;

use crate::args::Global;
use crate::failure::{EXIT_BACKEND, Failure};
use crate::output::{note, out};

/// How often a watcher looks at the mirrors' refs.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// A watcher syncs at least this often even when no ref file seems to
/// have changed (a change within one timestamp tick, say).
const RESYNC: Duration = Duration::from_secs(60);

/// Whether the bottle whose state dir is `state_dir` has a working
/// checkout the agent may push to.
pub(crate) fn has_checkouts(state_dir: &Path) -> bool {
    CheckoutPaths::of_state_dir(state_dir).record().exists()
}

/// Syncs now; an error is the report's failure, so a sync never stops
/// what called it.
pub(crate) fn sync_quietly(state_dir: &Path) -> SyncReport {
    if !has_checkouts(state_dir) {
        return SyncReport::default();
    }
    checkout::sync(&SystemRunner, state_dir).unwrap_or_else(|err| SyncReport {
        refs: Vec::new(),
        failed: vec![err.to_string()],
    })
}

/// Tells the operator what a sync did, on stderr.
pub(crate) fn print_report(global: &Global, report: &SyncReport) {
    for outcome in &report.refs {
        let line = bottle_core::display::escape_for_terminal(&outcome.line()).into_owned();
        match outcome.outcome {
            Outcome::Landed => note(global.quiet, &line),
            // What did not come over is always said.
            Outcome::Kept(_) => note(false, &format!("warning: {line}")),
        }
    }
    for failed in &report.failed {
        let failed = bottle_core::display::escape_for_terminal(failed).into_owned();
        note(false, &format!("warning: {failed}"));
    }
}

/// Appends what a background sync did to the bottle's `git/sync.log`.
fn log_report(state_dir: &Path, report: &SyncReport) {
    if report.is_empty() {
        return;
    }
    let paths = CheckoutPaths::of_state_dir(state_dir);
    let Ok(mut log) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(paths.log())
    else {
        return;
    };
    let at = bottle_core::time::now_rfc3339();
    // Ref names come from the mirror the agent pushed to: escaped, so a
    // `cat` of the log shows them without acting on the terminal.
    let escape = bottle_core::display::escape_for_terminal;
    for outcome in &report.refs {
        let _ = writeln!(log, "{at} {}", escape(&outcome.line()));
    }
    for failed in &report.failed {
        let _ = writeln!(log, "{at} failed: {}", escape(failed));
    }
}

/// Syncs a bottle's mirrors into their checkouts while its agent runs: a
/// thread polling the mirrors' ref files. [`Watcher::finish`] stops it and
/// syncs one last time.
pub(crate) struct Watcher {
    state_dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<checkout::RefOutcome>>>,
}

impl Watcher {
    /// Starts watching the bottle whose state dir is `state_dir`; `None`
    /// when it has no working checkout the agent may push to.
    pub(crate) fn start(state_dir: &Path) -> Option<Watcher> {
        let paths = CheckoutPaths::of_state_dir(state_dir);
        let record = checkout::read_record(&paths).ok().flatten()?;
        let mirrors: Vec<PathBuf> = record.repos.into_iter().map(|r| r.mirror).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, state_dir) = (Arc::clone(&stop), state_dir.to_path_buf());
            std::thread::spawn(move || watch(&state_dir, &mirrors, &stop))
        };
        Some(Watcher {
            state_dir: state_dir.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stops watching and syncs once more; returns every ref the watcher
    /// and that last sync saw.
    pub(crate) fn finish(mut self) -> SyncReport {
        self.stop.store(true, Ordering::Relaxed);
        let mut refs = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let last = sync_quietly(&self.state_dir);
        log_report(&self.state_dir, &last);
        refs.extend(last.refs);
        SyncReport {
            refs,
            failed: last.failed,
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The watcher's loop: a sync whenever the mirrors' fingerprint moves (and
/// at least every [`RESYNC`]), until `stop`.
fn watch(state_dir: &Path, mirrors: &[PathBuf], stop: &AtomicBool) -> Vec<checkout::RefOutcome> {
    let fingerprint = || -> Vec<u64> {
        mirrors
            .iter()
            .map(|m| checkout::mirror_fingerprint(m))
            .collect()
    };
    let mut seen = fingerprint();
    let mut synced = Instant::now();
    let mut outcomes = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLL);
        let now = fingerprint();
        if now == seen && synced.elapsed() < RESYNC {
            continue;
        }
        seen = now;
        synced = Instant::now();
        let report = sync_quietly(state_dir);
        log_report(state_dir, &report);
        outcomes.extend(report.refs);
    }
    outcomes
}

/// `bottle sync BOTTLE`: brings what the agent pushed into the working
/// checkouts now, and says what it did.
pub(crate) fn sync_command(global: &Global, bottle: &str) -> Result<ExitCode, Failure> {
    let name = slug::bottle_name(slug::slug_of(bottle));
    let state_dir = crate::lookup::state_dir_of(bottle)?;
    if !state_dir.is_dir() {
        return Err(crate::lookup::no_bottle_named(&name));
    }
    if !has_checkouts(&state_dir) {
        note(
            global.quiet,
            &format!("{name} serves no working checkout the agent may push to: nothing to sync"),
        );
        return Ok(ExitCode::SUCCESS);
    }
    let report = checkout::sync(&SystemRunner, &state_dir)
        .map_err(|err| Failure::coded(&err, EXIT_BACKEND))?;
    print_report(global, &report);
    if let Some(first) = report.failed.first() {
        return Err(Failure::new(
            "BOT-C070",
            EXIT_BACKEND,
            format!("{name}: {first}"),
        )
        .with_fix(
            "check the checkout with `git status`; the agent's commits stay in the bottle's mirror until `bottle stop`, and `bottle sync` tries again",
        ));
    }
    let landed = report
        .refs
        .iter()
        .filter(|r| r.outcome == Outcome::Landed)
        .count();
    out(&format!(
        "{name}: {landed} ref(s) brought into the checkout\n"
    ));
    Ok(ExitCode::SUCCESS)
}
