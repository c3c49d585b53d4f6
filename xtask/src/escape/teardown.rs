//! Undo actions that must run however the gate ends: normally (guards'
//! `Drop`), on a panic (unwinding runs the same `Drop`s), and on Ctrl-C or
//! SIGTERM (a watcher thread runs whatever is still registered, newest
//! first, then exits 130).
//!
//! Guards register their undo here and run it through [`run`] from `Drop`,
//! so an action runs exactly once whichever path gets to it first.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

type Action = Box<dyn FnOnce() + Send>;

static ACTIONS: Mutex<Vec<(u64, &'static str, Action)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(1);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Registers `action`; returns the id to [`run`] it by.
pub(crate) fn register(what: &'static str, action: impl FnOnce() + Send + 'static) -> u64 {
    let id = NEXT.fetch_add(1, Ordering::SeqCst);
    if let Ok(mut actions) = ACTIONS.lock() {
        actions.push((id, what, Box::new(action)));
    }
    id
}

/// Runs the action `id` if it has not run yet.
pub(crate) fn run(id: u64) {
    let action = ACTIONS.lock().ok().and_then(|mut actions| {
        let at = actions.iter().position(|(i, _, _)| *i == id)?;
        Some(actions.remove(at).2)
    });
    if let Some(action) = action {
        action();
    }
}

/// Runs every registered action, newest first; `announce` names each on
/// stderr (the Ctrl-C path, where the operator wants to see it happen).
pub(crate) fn run_all(announce: bool) {
    loop {
        let next = ACTIONS.lock().ok().and_then(|mut actions| actions.pop());
        match next {
            Some((_, what, action)) => {
                if announce {
                    eprintln!("sandbox-escape: undoing: {what}");
                }
                action();
            }
            None => break,
        }
    }
}

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread spawned
/// after it) and starts a thread that waits for them, undoes everything and
/// exits 130. Call first thing, before any other thread exists. Child
/// processes start with an empty signal mask (std resets it), so they still
/// get Ctrl-C.
pub(crate) fn watch_signals() -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    std::thread::spawn(move || {
        if let Ok(signal) = set.wait() {
            INTERRUPTED.store(true, Ordering::SeqCst);
            eprintln!("sandbox-escape: {signal:?}: tearing down");
            run_all(true);
            #[expect(
                clippy::exit,
                reason = "after an interrupt the gate ends here with 130, whatever the main thread is doing"
            )]
            std::process::exit(130);
        }
    });
    Ok(())
}

/// After an interrupt the watcher owns the end of the process: the main
/// thread waits here (bounded) for it to finish undoing and exit 130, so
/// an interrupted run never ends with a report or another exit code.
pub(crate) fn wait_if_interrupted() {
    if !INTERRUPTED.load(Ordering::SeqCst) {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    #[expect(
        clippy::exit,
        reason = "the interrupt watcher did not end the process in time"
    )]
    std::process::exit(130);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn an_action_runs_once() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let id = register("count", move || {
            c.fetch_add(1, Ordering::SeqCst);
        });
        run(id);
        run(id);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
