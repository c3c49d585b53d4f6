//! The docker launch's steps by name. What ends each one (its lap, the
//! interrupt check, `BOTTLE_FAILPOINT`) is [`bottle_core::launch_steps`].

use bottle_core::launch_steps::LaunchStep;

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
/// | `agent-files` | write the keep-alive program and the in-box agent (`/.bottle/toolbox`, when one is found) into the box's read-only mount, and what every box receives (`bottle_core::agent_box::agent_files`: `/etc/bottle`, the MCP config naming supervise, the prompt and the skills, the last two the agent's user's) in one upload; start, on a thread, the survey of the image for its CA (remembered by image ID in `<state_root>/.cache/ca-survey`) and, when it has no trust tool to run, the CA's install through the archive API, while both containers start |
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

/// The steps a bundle alone runs (a microVM's, [`super::launch_bundle`]).
pub const BUNDLE_STEPS: &[Step] = &[
    Step::Network,
    Step::EgressNetwork,
    Step::BundleCreate,
    Step::BundleConnect,
    Step::BundleFiles,
    Step::BundleStart,
    Step::BundleVerify,
    Step::BundleHealth,
];

impl LaunchStep for Step {
    const ALL: &'static [Step] = &[
        Step::Network,
        Step::EgressNetwork,
        Step::BundleCreate,
        Step::BundleConnect,
        Step::BundleFiles,
        Step::AgentCreate,
        Step::AgentFiles,
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

    fn name(self) -> &'static str {
        match self {
            Step::Network => "network",
            Step::EgressNetwork => "egress-network",
            Step::BundleCreate => "bundle-create",
            Step::BundleConnect => "bundle-connect",
            Step::BundleFiles => "bundle-files",
            Step::AgentCreate => "agent-create",
            Step::AgentFiles => "agent-files",
            Step::ProvisionCa => "provision-ca",
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
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_are_unique_and_parse_back() {
        for &step in Step::ALL {
            assert_eq!(Step::parse(step.name()), Some(step));
        }
        let mut names: Vec<&str> = Step::ALL.iter().map(|step| step.name()).collect();
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
        let names: Vec<&str> = Step::ALL.iter().map(|step| step.name()).collect();
        assert_eq!(table, names);
    }
}
