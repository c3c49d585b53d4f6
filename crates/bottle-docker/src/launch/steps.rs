//! The launch's steps by name, and the failure injection
//! (`BOTTLE_FAILPOINT`) that lets tests stop a launch after any of them to
//! prove the unwinding.

use std::time::Duration;

use crate::error::DockerError;

/// The launch steps, in the order of a bottle's launch (the names
/// `BOTTLE_FAILPOINT` accepts):
///
/// | step | what it does |
/// | --- | --- |
/// | `network` | create `bot-bottle-<slug>` (internal, no host address) and check it |
/// | `egress-network` | create the shared `bot-bottle-egress` if missing (at once with `network`) |
/// | `bundle-create` | create the bundle container pinned at `.2` |
/// | `bundle-connect` | attach it to the egress network |
/// | `bundle-files` | write config, CA and credentials into `/run/bottle` |
/// | `agent-create` | create the agent container pinned at `.3` |
/// | `agent-files` | write the keep-alive program, the in-box agent (`/.bottle/toolbox`, when one is found), `/etc/bottle` and the MCP config naming supervise (`/etc/bottle/mcp.json`), in one upload; start, on a thread, the survey of the image for its CA (remembered by image ID in `<state_root>/.cache/ca-survey`) and, when it has no trust tool to run, the CA's install through the archive API, while both containers start |
/// | `provision-prompt` | the prompt file |
/// | `provision-skills` | the skills directories |
/// | `bundle-start` | the bundle's start, sent after `bundle-files`, has completed |
/// | `bundle-verify` | check its address, both networks, and that the bottle network is internal |
/// | `bundle-health` | wait until the bundle serves: its ready line on the stderr attached before its start, else (no attach, or no line) until the proxy answers `/__bottle/health` through an exec |
/// | `agent-start` | the agent's keep-alive (nothing of the agent runs yet), sent after `bundle-start`, has started |
/// | `agent-verify` | check it is running, on the bottle network only, at its address, with every capability dropped |
/// | `provision-ca` | the CA as `bottle_core::ca_install` defines (joining the install `agent-files` started; an image with a trust tool installs it now): `/etc/bottle/ca.pem` (the directory made in `agent-files`), the anchors, the image's trust tool (an exec as root, so after the start), the system bundles, the hashed directory |
/// | `provision-git` | git repositories: served by the bundle's git-gate (mounts and mirrors are set up with the bundle); this step reports them |
/// | `provision-supervise` | report the MCP config (written in `agent-files`) |
/// | `snapshot` | the golden snapshot of the agent's writable layer and the baseline of its three reset sources (`crate::reset`); a host that cannot take it gets a warning and a bottle without reset |
/// | `complete` | mark the launch complete in the state dir |
///
/// The bundle's start is sent to the Engine as soon as its files are in
/// and overlaps the agent container's creation and files (each start is a
/// third of a launch's time); `bundle-start` ends when it has completed.
/// The agent's start is sent then and overlaps the bundle's checks. The
/// agent's keep-alive runs nothing, and no command reaches the agent
/// before every check above has passed. A bundle for a microVM runs the bundle steps only (`network` to
/// `bundle-files`, `bundle-start`, `bundle-verify`, `bundle-health`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `network`.
    Network,
    /// `egress-network`.
    EgressNetwork,
    /// `bundle-create`.
    BundleCreate,
    /// `bundle-connect`.
    BundleConnect,
    /// `bundle-files`.
    BundleFiles,
    /// `agent-create`.
    AgentCreate,
    /// `agent-files`.
    AgentFiles,
    /// `provision-prompt`.
    ProvisionPrompt,
    /// `provision-skills`.
    ProvisionSkills,
    /// `bundle-start`.
    BundleStart,
    /// `bundle-verify`.
    BundleVerify,
    /// `bundle-health`.
    BundleHealth,
    /// `agent-start`.
    AgentStart,
    /// `agent-verify`.
    AgentVerify,
    /// `provision-ca`.
    ProvisionCa,
    /// `provision-git`.
    ProvisionGit,
    /// `provision-supervise`.
    ProvisionSupervise,
    /// `snapshot`.
    Snapshot,
    /// `complete`.
    Complete,
}

impl Step {
    /// Every step, in launch order.
    pub const ALL: [Step; 19] = [
        Step::Network,
        Step::EgressNetwork,
        Step::BundleCreate,
        Step::BundleConnect,
        Step::BundleFiles,
        Step::AgentCreate,
        Step::AgentFiles,
        Step::ProvisionPrompt,
        Step::ProvisionSkills,
        Step::BundleStart,
        Step::BundleVerify,
        Step::BundleHealth,
        Step::AgentStart,
        Step::AgentVerify,
        Step::ProvisionCa,
        Step::ProvisionGit,
        Step::ProvisionSupervise,
        Step::Snapshot,
        Step::Complete,
    ];

    /// The name `BOTTLE_FAILPOINT` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Step::Network => "network",
            Step::EgressNetwork => "egress-network",
            Step::BundleCreate => "bundle-create",
            Step::BundleConnect => "bundle-connect",
            Step::BundleFiles => "bundle-files",
            Step::AgentCreate => "agent-create",
            Step::AgentFiles => "agent-files",
            Step::ProvisionCa => "provision-ca",
            Step::ProvisionPrompt => "provision-prompt",
            Step::ProvisionSkills => "provision-skills",
            Step::BundleStart => "bundle-start",
            Step::AgentStart => "agent-start",
            Step::BundleVerify => "bundle-verify",
            Step::BundleHealth => "bundle-health",
            Step::AgentVerify => "agent-verify",
            Step::ProvisionGit => "provision-git",
            Step::ProvisionSupervise => "provision-supervise",
            Step::Snapshot => "snapshot",
            Step::Complete => "complete",
        }
    }

    /// The step named `name`.
    pub fn parse(name: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.name() == name)
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable for failure injection.
pub const FAILPOINT_ENV: &str = "BOTTLE_FAILPOINT";

/// How long a `:sleep` failpoint waits before failing anyway.
const FAILPOINT_SLEEP: Duration = Duration::from_secs(600);

/// A parsed `BOTTLE_FAILPOINT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failpoint {
    /// The step after which the launch fails.
    pub step: Step,
    /// Wait (to be killed) instead of failing at once.
    pub sleep: bool,
}

impl Failpoint {
    /// Parses a `BOTTLE_FAILPOINT` value; unknown steps are an error so a
    /// typo cannot silently test nothing.
    pub fn parse(value: &str) -> Result<Option<Failpoint>, DockerError> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let (step, sleep) = match value.split_once(':') {
            Some((step, "sleep")) => (step, true),
            Some(_) => {
                return Err(DockerError::UnknownFailpoint {
                    value: value.to_string(),
                });
            }
            None => (value, false),
        };
        let Some(step) = Step::parse(step) else {
            return Err(DockerError::UnknownFailpoint {
                value: value.to_string(),
            });
        };
        Ok(Some(Failpoint { step, sleep }))
    }

    /// Reads `BOTTLE_FAILPOINT`.
    pub fn from_env() -> Result<Option<Failpoint>, DockerError> {
        Failpoint::parse(&std::env::var(FAILPOINT_ENV).unwrap_or_default())
    }

    /// Ends `step`: fails here if this failpoint names it, after waiting
    /// (to be killed, or interrupted: then it fails as interrupted) if it
    /// says so.
    pub(super) fn trip_after(
        &self,
        step: Step,
        interrupt: &bottle_core::undo::Interrupt,
    ) -> Result<(), DockerError> {
        if self.step != step {
            return Ok(());
        }
        if self.sleep && interrupt.wait(FAILPOINT_SLEEP) {
            interrupt.check(step.name())?;
        }
        Err(DockerError::Failpoint {
            step: step.name().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failpoints_parse_and_refuse_unknown_steps() {
        assert_eq!(Failpoint::parse("").unwrap(), None);
        assert_eq!(
            Failpoint::parse("bundle-start").unwrap(),
            Some(Failpoint {
                step: Step::BundleStart,
                sleep: false
            })
        );
        assert_eq!(
            Failpoint::parse("agent-create:sleep").unwrap(),
            Some(Failpoint {
                step: Step::AgentCreate,
                sleep: true
            })
        );
        assert!(matches!(
            Failpoint::parse("bundle-strat"),
            Err(DockerError::UnknownFailpoint { .. })
        ));
        assert!(matches!(
            Failpoint::parse("network:nap"),
            Err(DockerError::UnknownFailpoint { .. })
        ));
    }

    #[test]
    fn a_failpoint_fails_after_its_step_only() {
        let failpoint = Failpoint {
            step: Step::BundleFiles,
            sleep: false,
        };
        let interrupt = bottle_core::undo::Interrupt::default();
        assert!(failpoint.trip_after(Step::BundleCreate, &interrupt).is_ok());
        assert!(matches!(
            failpoint.trip_after(Step::BundleFiles, &interrupt),
            Err(DockerError::Failpoint { step }) if step == "bundle-files"
        ));
    }

    #[test]
    fn a_sleeping_failpoint_ends_as_interrupted_when_the_operator_interrupts() {
        let failpoint = Failpoint {
            step: Step::BundleFiles,
            sleep: true,
        };
        let interrupt = bottle_core::undo::Interrupt::default();
        let operator = interrupt.clone();
        let presses = std::thread::spawn(move || operator.request());
        assert!(matches!(
            failpoint.trip_after(Step::BundleFiles, &interrupt),
            Err(DockerError::Interrupted(err)) if err.step == "bundle-files"
        ));
        presses.join().unwrap();
    }

    #[test]
    fn step_names_are_unique_and_parse_back() {
        for step in Step::ALL {
            assert_eq!(Step::parse(step.name()), Some(step));
        }
        let mut names: Vec<&str> = Step::ALL.map(Step::name).to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Step::ALL.len());
    }

    #[test]
    fn the_step_table_lists_every_step_in_launch_order() {
        let table: Vec<&str> = include_str!("steps.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("/// | `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        assert_eq!(table, Step::ALL.map(Step::name));
    }
}
