//! `undo`: the stack a launch registers each created resource's removal
//! on, so a launch that fails half-way takes down everything it made
//! (Invariant 3, "nothing leaks") — one implementation for every backend.
//!
//! Each step pushes its undo right after it creates something and before
//! the next step runs. On failure the caller [`Unwind::run`]s the stack:
//! newest first (a container goes before the network it sits on), best
//! effort (one failed removal does not stop the others), and it gets back
//! what could not be removed, to report. On success it [`Unwind::disarm`]s
//! it: the resources now belong to the running bottle. An [`Interrupt`]
//! turns the operator's ^C into such a failure, between two steps.

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

/// The operator's request to stop a launch half-way (^C, `SIGTERM`):
/// the CLI's signal handler sets it, and every launch step checks it
/// ([`Interrupt::check`]) so the launch fails there and runs its [`Unwind`]
/// instead of dying with half a bottle on the host. Cheap to clone: every
/// clone shares the one flag.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Interrupt {
    /// The flag a signal handler sets.
    pub fn flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        std::sync::Arc::clone(&self.0)
    }

    /// Asks the launch to stop.
    pub fn request(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the launch was asked to stop.
    pub fn is_requested(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Fails with [`Interrupted`] once the launch was asked to stop; `step`
    /// names the step just done.
    pub fn check(&self, step: &str) -> Result<(), Interrupted> {
        if self.is_requested() {
            return Err(Interrupted {
                step: step.to_string(),
            });
        }
        Ok(())
    }

    /// Waits up to `limit` for a request to stop, polling; `true` if one
    /// came. (A test's paused launch waits here to be interrupted.)
    pub fn wait(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while !self.is_requested() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        true
    }
}

/// A launch stopped because the operator interrupted it; what it had
/// created was removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the launch was interrupted after step {step}; what it had created was removed")]
pub struct Interrupted {
    /// The last step the launch finished.
    pub step: String,
}

impl crate::Coded for Interrupted {
    fn code(&self) -> &'static str {
        "BOT-S007"
    }

    fn fix(&self) -> Option<String> {
        Some(
            "start the bottle again; if the launching process was killed outright instead, `bottle cleanup` removes what it left"
                .into(),
        )
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

    #[test]
    fn an_interrupt_fails_the_next_check_in_every_clone() {
        let interrupt = Interrupt::default();
        let seen_by_a_step = interrupt.clone();
        assert_eq!(seen_by_a_step.check("network"), Ok(()));
        assert!(!seen_by_a_step.wait(std::time::Duration::from_millis(10)));
        interrupt
            .flag()
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(seen_by_a_step.wait(std::time::Duration::from_secs(5)));
        let err = seen_by_a_step.check("bundle-files").unwrap_err();
        assert_eq!(err.step, "bundle-files");
        assert_eq!(crate::Coded::code(&err), "BOT-S007");
    }
}
