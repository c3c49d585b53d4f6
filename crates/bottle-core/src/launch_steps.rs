//! A launch's named steps, ended one way by every backend: each step's end
//! records a lap on the `--timings` timeline, checks the operator's
//! interrupt, and fails the launch when `BOTTLE_FAILPOINT` names the step
//! (so a test proves the launch unwinds from there). A backend keeps its
//! own step enum ([`LaunchStep`]) and what each step does; what happens
//! between two steps is decided here, once.
//!
//! `BOTTLE_FAILPOINT=<step>` fails the launch right after that step;
//! `BOTTLE_FAILPOINT=<step>:sleep` makes it stop there for up to ten
//! minutes (or until interrupted), so a test can kill the process
//! mid-launch. Either can only make a launch fail, never change what it
//! creates.

use std::time::Duration;

use crate::timeline::Timeline;
use crate::undo::{Interrupt, Interrupted};

/// The environment variable for failure injection.
pub const FAILPOINT_ENV: &str = "BOTTLE_FAILPOINT";

/// How long a `:sleep` failpoint waits before failing anyway.
const FAILPOINT_SLEEP: Duration = Duration::from_secs(600);

/// A backend's launch steps.
pub trait LaunchStep: Copy + Eq + std::fmt::Debug + 'static {
    /// Every step, in launch order.
    const ALL: &'static [Self];

    /// The name `--timings` shows and `BOTTLE_FAILPOINT` accepts.
    fn name(self) -> &'static str;

    /// The step named `name`.
    fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|step| step.name() == name)
    }

    /// Every step's name, in launch order, comma-separated.
    fn names() -> String {
        Self::ALL
            .iter()
            .map(|step| step.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The step a `BOTTLE_FAILPOINT` value names, and whether it asks to
/// sleep: `STEP` or `STEP:sleep`, nothing else. Whichever launch fires it
/// reads the name by this one rule, so a value is never one launch's and
/// also no launch's.
pub fn failpoint_step_name(value: &str) -> Option<(&str, bool)> {
    match value.trim().split_once(':') {
        Some((step, "sleep")) => Some((step, true)),
        Some(_) => None,
        None => Some((value.trim(), false)),
    }
}

/// A parsed `BOTTLE_FAILPOINT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failpoint<S> {
    /// The step after which the launch fails.
    pub step: S,
    /// Wait (to be killed) instead of failing at once.
    pub sleep: bool,
}

/// `BOTTLE_FAILPOINT` names no step of the launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("BOTTLE_FAILPOINT={value:?} names no launch step (steps: {steps})")]
pub struct UnknownFailpoint {
    /// The value given.
    pub value: String,
    /// The launch's steps, comma-separated.
    pub steps: String,
}

impl<S: LaunchStep> Failpoint<S> {
    /// Parses a `BOTTLE_FAILPOINT` value; a step the launch does not have
    /// is an error, so a typo cannot silently test nothing.
    pub fn parse(value: &str) -> Result<Option<Failpoint<S>>, UnknownFailpoint> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let unknown = || UnknownFailpoint {
            value: value.to_string(),
            steps: S::names(),
        };
        let (step, sleep) = failpoint_step_name(value).ok_or_else(unknown)?;
        let step = S::parse(step).ok_or_else(unknown)?;
        Ok(Some(Failpoint { step, sleep }))
    }

    /// Reads `BOTTLE_FAILPOINT`.
    pub fn from_env() -> Result<Option<Failpoint<S>>, UnknownFailpoint> {
        Failpoint::parse(&std::env::var(FAILPOINT_ENV).unwrap_or_default())
    }
}

/// Why a launch stopped at the end of a step.
#[derive(Debug, thiserror::Error)]
pub enum StepStop {
    /// The operator interrupted the launch.
    #[error(transparent)]
    Interrupted(#[from] Interrupted),
    /// `BOTTLE_FAILPOINT` named this step.
    #[error("launch failed on purpose after step {step} (BOTTLE_FAILPOINT)")]
    Failpoint {
        /// The step.
        step: &'static str,
    },
}

/// What ends every step of one launch: the timeline it laps, the interrupt
/// it checks, the failpoint it fires.
#[derive(Debug, Clone)]
pub struct StepEnds<S> {
    /// `bottle start --timings`: every step ends a lap.
    pub timeline: Option<Timeline>,
    /// The operator's ^C.
    pub interrupt: Interrupt,
    /// Failure injection.
    pub failpoint: Option<Failpoint<S>>,
}

impl<S> Default for StepEnds<S> {
    fn default() -> StepEnds<S> {
        StepEnds {
            timeline: None,
            interrupt: Interrupt::default(),
            failpoint: None,
        }
    }
}

impl<S: LaunchStep> StepEnds<S> {
    /// Ends `step`: records its lap, then fails if the operator interrupted
    /// the launch or the failpoint names it (after waiting, to be killed or
    /// interrupted, if it says `:sleep`).
    pub fn done(&self, step: S) -> Result<(), StepStop> {
        if let Some(timeline) = &self.timeline {
            timeline.lap(step.name());
        }
        self.interrupt.check(step.name())?;
        match &self.failpoint {
            Some(failpoint) if failpoint.step == step => {
                if failpoint.sleep && self.interrupt.wait(FAILPOINT_SLEEP) {
                    self.interrupt.check(step.name())?;
                }
                Err(StepStop::Failpoint { step: step.name() })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Step {
        Create,
        Start,
    }

    impl LaunchStep for Step {
        const ALL: &'static [Step] = &[Step::Create, Step::Start];

        fn name(self) -> &'static str {
            match self {
                Step::Create => "create",
                Step::Start => "start",
            }
        }
    }

    #[test]
    fn failpoints_parse_and_refuse_unknown_steps() {
        assert_eq!(Failpoint::<Step>::parse(" ").unwrap(), None);
        assert_eq!(
            Failpoint::parse("start").unwrap(),
            Some(Failpoint {
                step: Step::Start,
                sleep: false
            })
        );
        assert_eq!(
            Failpoint::parse("create:sleep").unwrap(),
            Some(Failpoint {
                step: Step::Create,
                sleep: true
            })
        );
        let err = Failpoint::<Step>::parse("strat").unwrap_err();
        assert_eq!(err.steps, "create, start");
        assert!(err.to_string().contains("\"strat\""), "{err}");
        assert!(Failpoint::<Step>::parse("start:nap").is_err());
        assert!(Failpoint::<Step>::parse("start:sleep:sleep").is_err());
    }

    #[test]
    fn every_launch_reads_a_failpoints_step_name_by_parses_rule() {
        assert_eq!(failpoint_step_name(" start "), Some(("start", false)));
        assert_eq!(failpoint_step_name("start:sleep"), Some(("start", true)));
        // What parse refuses names no step, for a launch that only asks
        // whose step it is.
        for refused in ["start:sleep:sleep", "start:nap", "start:"] {
            assert_eq!(failpoint_step_name(refused), None, "{refused}");
            assert!(Failpoint::<Step>::parse(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_step_end_laps_then_fails_only_at_its_failpoint() {
        let ends = StepEnds {
            timeline: Some(Timeline::new()),
            interrupt: Interrupt::default(),
            failpoint: Some(Failpoint {
                step: Step::Start,
                sleep: false,
            }),
        };
        assert!(ends.done(Step::Create).is_ok());
        assert!(matches!(
            ends.done(Step::Start),
            Err(StepStop::Failpoint { step: "start" })
        ));
        let laps = ends.timeline.as_ref().unwrap().laps();
        let names: Vec<&str> = laps.iter().map(|lap| lap.name.as_str()).collect();
        assert_eq!(names, ["create", "start"]);
    }

    #[test]
    fn an_interrupt_stops_at_the_next_step_end() {
        let ends = StepEnds::<Step>::default();
        ends.interrupt.request();
        assert!(matches!(
            ends.done(Step::Create),
            Err(StepStop::Interrupted(Interrupted { step })) if step == "create"
        ));
    }

    #[test]
    fn a_sleeping_failpoint_ends_as_interrupted_when_the_operator_interrupts() {
        let ends = StepEnds {
            failpoint: Some(Failpoint {
                step: Step::Create,
                sleep: true,
            }),
            ..StepEnds::default()
        };
        let operator = ends.interrupt.clone();
        let presses = std::thread::spawn(move || operator.request());
        assert!(matches!(
            ends.done(Step::Create),
            Err(StepStop::Interrupted(Interrupted { step })) if step == "create"
        ));
        presses.join().unwrap();
    }
}
