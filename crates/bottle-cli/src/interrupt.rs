//! ^C and `SIGTERM` while `bottle start` launches a bottle.
//!
//! Killed half-way, a launch would leave networks, containers and a state
//! dir holding the bottle's CA key. So during the launch the first signal
//! only sets the [`Interrupt`] every backend's launch checks between its
//! steps: the launch fails there and unwinds, and `start` exits with
//! [`EXIT_INTERRUPTED`]. A second signal ends the process at once (what it
//! leaves, `bottle cleanup` removes: its launching process is gone).
//! Before the launch (nothing is written yet) and after it, the signals do
//! what they always do.
//!
//! `bottle cp` holds them the same way ([`during_copy`]): a first signal
//! stops a copy out between two entries, before anything is in place, and
//! lets a copy into a paused docker box finish and unpause it, so an
//! operator's ^C never leaves half a copy or a frozen agent.

use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use bottle_core::backend::BackendErrorKind;
use bottle_core::undo::Interrupt;
use bottle_core::{BottleLauncher, Plan};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;

use crate::failure::{EXIT_INTERRUPTED, Failure};

/// The one interrupt of this process, which the backends are opened with.
static LAUNCH: LazyLock<Interrupt> = LazyLock::new(Interrupt::default);

/// The interrupt the backends' launches check.
pub(crate) fn launch() -> Interrupt {
    LAUNCH.clone()
}

/// Whether the operator interrupted the launch.
pub(crate) fn requested() -> bool {
    LAUNCH.is_requested()
}

/// The signal handlers of one launch (or copy); [`HeldSignals::ended`]
/// gives the signals their default action back.
pub(crate) struct HeldSignals {
    ended: Arc<AtomicBool>,
}

/// Installs the handlers for the launch about to run.
pub(crate) fn during_launch() -> Result<HeldSignals, Failure> {
    let ended = Arc::new(AtomicBool::new(false));
    let interrupted = LAUNCH.flag();
    for signal in [SIGINT, SIGTERM] {
        // Registered in this order: each action runs in turn. Once the
        // launch ended, the default action (the process ends) comes first;
        // during it, a second signal ends the process, and the first sets
        // the flag.
        flag::register_conditional_default(signal, Arc::clone(&ended))
            .and_then(|_| {
                flag::register_conditional_shutdown(
                    signal,
                    i32::from(EXIT_INTERRUPTED),
                    Arc::clone(&interrupted),
                )
            })
            .and_then(|_| flag::register(signal, Arc::clone(&interrupted)))
            .map_err(|err| anyhow::anyhow!("could not handle ^C: {err}"))?;
    }
    Ok(HeldSignals { ended })
}

impl HeldSignals {
    /// The launch is over: signals end the process again.
    pub(crate) fn ended(self) {
        self.ended.store(true, Ordering::SeqCst);
    }
}

/// Installs the handlers for a `bottle cp`: its checks between entries read
/// [`launch`]'s flag, the process's one interrupt.
pub(crate) fn during_copy() -> Result<HeldSignals, Failure> {
    during_launch()
}

/// A launch's failure, and whether a launch running at the same time took
/// what its plan chose (planning again may succeed).
pub(crate) struct LaunchFailed {
    pub failure: Failure,
    pub plan_taken: bool,
}

impl From<Failure> for LaunchFailed {
    fn from(failure: Failure) -> LaunchFailed {
        LaunchFailed {
            failure,
            plan_taken: false,
        }
    }
}

impl From<LaunchFailed> for Failure {
    fn from(failed: LaunchFailed) -> Failure {
        failed.failure
    }
}

/// `backend.launch`, which the operator's ^C (or `SIGTERM`) makes fail
/// and unwind rather than end the process half-way.
pub(crate) fn launch_interruptibly<B: BottleLauncher>(
    backend: &B,
    plan: &Plan<B::PlanData>,
) -> Result<Box<dyn bottle_core::Bottle>, LaunchFailed> {
    let signals = during_launch()?;
    let launched = backend.launch(plan);
    signals.ended();
    let bottle = match launched {
        Err(err) if requested() => {
            return Err(Failure {
                exit: EXIT_INTERRUPTED,
                ..Failure::from(err)
            }
            .into());
        }
        Err(err) => {
            return Err(LaunchFailed {
                plan_taken: err.kind == BackendErrorKind::PlanTaken,
                failure: Failure::from(err),
            });
        }
        Ok(bottle) => bottle,
    };
    if !requested() {
        return Ok(bottle);
    }
    // Interrupted after the launch's last check: take it down all the same.
    let name = bottle.name().to_string();
    drop(bottle);
    let report = backend.stop(&name).map_err(Failure::from)?;
    Err(Failure::new(
        "BOT-C021",
        EXIT_INTERRUPTED,
        format!("the launch of {name} was interrupted as it completed; the bottle was stopped"),
    )
    .with_fix(if report.failed.is_empty() {
        "start it again".to_string()
    } else {
        format!(
            "run `bottle cleanup`; these remain: {}",
            report.failed.join("; ")
        )
    })
    .into())
}
