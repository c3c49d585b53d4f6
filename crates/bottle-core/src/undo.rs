//! `undo`: the stack a launch registers each created resource's removal
//! on, so a launch that fails half-way takes down everything it made
//! (Invariant 3, "nothing leaks") — one implementation for every backend.
//!
//! Each step pushes its undo right after it creates something and before
//! the next step runs. On failure the caller [`Unwind::run`]s the stack:
//! newest first (a container goes before the network it sits on), best
//! effort (one failed removal does not stop the others), and it gets back
//! what could not be removed, to report. On success it [`Unwind::disarm`]s
//! it: the resources now belong to the running bottle.

/// One registered undo: what it removes, and how.
type UndoStep<'a> = (&'static str, Box<dyn FnOnce() -> Result<(), String> + 'a>);

/// A stack of labelled undo steps.
#[derive(Default)]
#[must_use = "an Unwind must be run on failure or disarmed on success"]
pub struct Unwind<'a> {
    steps: Vec<UndoStep<'a>>,
}

impl<'a> Unwind<'a> {
    /// Registers `undo`, which removes `what` (a short noun phrase, e.g.
    /// "the microVM") and says why it could not.
    pub fn push(&mut self, what: &'static str, undo: impl FnOnce() -> Result<(), String> + 'a) {
        self.steps.push((what, Box::new(undo)));
    }

    /// Runs every undo, newest first, and returns those that failed as
    /// `"<what>: <why>"`, in the order they ran.
    pub fn run(self) -> Vec<String> {
        self.steps
            .into_iter()
            .rev()
            .filter_map(|(what, undo)| undo().err().map(|err| format!("{what}: {err}")))
            .collect()
    }

    /// Drops every undo without running it: the launch succeeded.
    pub fn disarm(self) {
        drop(self.steps);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[test]
    fn run_undoes_newest_first_and_reports_every_failure() {
        let log = RefCell::new(Vec::new());
        let mut unwind = Unwind::default();
        unwind.push("the network", || {
            log.borrow_mut().push("network");
            Err("in use".into())
        });
        unwind.push("the state dir", || {
            log.borrow_mut().push("state dir");
            Ok(())
        });
        unwind.push("the container", || {
            log.borrow_mut().push("container");
            Err("busy".into())
        });
        let failures = unwind.run();
        assert_eq!(*log.borrow(), ["container", "state dir", "network"]);
        assert_eq!(failures, ["the container: busy", "the network: in use"]);
    }

    #[test]
    fn disarm_runs_nothing() {
        let ran = RefCell::new(false);
        let mut unwind = Unwind::default();
        unwind.push("the microVM", || {
            *ran.borrow_mut() = true;
            Ok(())
        });
        unwind.disarm();
        assert!(!*ran.borrow());
    }
}
