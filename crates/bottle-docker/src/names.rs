//! Names and labels of the Docker resources a bottle owns.
//!
//! Every container and network a launch creates carries the labels below,
//! so `list`, `stop` and `cleanup` find them by label, never by guessing
//! from names.

use std::collections::HashMap;

use bottle_core::process::Owner;
use bottle_core::slug::bottle_name;

/// Whose resource it is: [`MANAGED_BY_DOCKER`] on everything a docker
/// bottle's launch creates.
pub const LABEL_MANAGED: &str = "bottle.managed";
/// [`LABEL_MANAGED`]'s value on a docker bottle's resources, which the
/// docker backend's `list`, `stop` and `cleanup` select.
pub const MANAGED_BY_DOCKER: &str = "1";
/// [`LABEL_MANAGED`]'s value on a bundle (and its network) run for a
/// microVM bottle: the smolmachines backend owns its lifetime, so the
/// docker backend's `list`, `stop` and `cleanup` (which select `1`) leave
/// it alone.
pub const MANAGED_FOR_VM: &str = "smolmachines";
/// The bottle's name, `bot-bottle-<slug>`.
pub const LABEL_NAME: &str = "bottle.name";
/// The manifest agent running in the bottle.
pub const LABEL_AGENT: &str = "bottle.agent";
/// The bottle's slug.
pub const LABEL_SLUG: &str = "bottle.slug";
/// PID of the `bottle` process that launched it.
pub const LABEL_OWNER_PID: &str = "bottle.owner-pid";
/// Start time (clock ticks since boot, `/proc/<pid>/stat` field 22) of the
/// owner, so a recycled PID is not mistaken for the owner.
pub const LABEL_OWNER_START: &str = "bottle.owner-start";
/// The bottle's state directory on the host.
pub const LABEL_STATE_DIR: &str = "bottle.state-dir";
/// `1` when the bottle was started with `--detach` and outlives its owner.
pub const LABEL_DETACHED: &str = "bottle.detached";
/// `agent`, `bundle`, `network` or `egress`.
pub const LABEL_ROLE: &str = "bottle.role";
/// The bundle's IP on the bottle's internal network.
pub const LABEL_BUNDLE_IP: &str = "bottle.bundle-ip";
/// The user the agent's commands run as (empty: the image's root).
pub const LABEL_AGENT_USER: &str = "bottle.agent-user";
/// The agent container's own user, running only its init and keep-alive.
/// Not the agent's user: a process of another uid cannot be ptraced or
/// signalled by the agent without capabilities it does not have.
pub const KEEPALIVE_USER: &str = "65534:65534";

/// The shared, non-internal bridge every bundle reaches the internet by.
pub const EGRESS_NETWORK: &str = "bot-bottle-egress";

/// Role label values.
pub mod role {
    /// The agent container.
    pub const AGENT: &str = "agent";
    /// The bundle container.
    pub const BUNDLE: &str = "bundle";
    /// The bottle's internal network.
    pub const NETWORK: &str = "network";
    /// The shared egress network.
    pub const EGRESS: &str = "egress";
}

/// The resource names of one bottle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    /// `bot-bottle-<slug>`: the bottle and its internal network.
    pub bottle: String,
    /// `bot-bottle-<slug>`.
    pub network: String,
    /// `bot-bottle-<slug>-bundle`.
    pub bundle: String,
    /// `bot-bottle-<slug>-agent`.
    pub agent: String,
}

impl ResourceNames {
    /// The names for `slug`.
    pub fn for_slug(slug: &str) -> ResourceNames {
        let bottle = bottle_name(slug);
        ResourceNames {
            network: bottle.clone(),
            bundle: format!("{bottle}-bundle"),
            agent: format!("{bottle}-agent"),
            bottle,
        }
    }
}

/// Reads the launching process back from labels; `None` when the labels
/// are missing or malformed (such a bottle is treated as having no live
/// owner). A missing start time is 0, unknown: only the PID is compared.
pub fn owner_from_labels(labels: &HashMap<String, String>) -> Option<Owner> {
    let pid = labels.get(LABEL_OWNER_PID)?.parse().ok()?;
    let start = labels
        .get(LABEL_OWNER_START)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Some(Owner { pid, start })
}

/// The labels every resource of a bottle carries.
#[derive(Debug, Clone)]
pub struct BottleLabels {
    /// The bottle's name.
    pub name: String,
    /// The manifest agent.
    pub agent: String,
    /// The slug.
    pub slug: String,
    /// Who launched it.
    pub owner: Owner,
    /// The state directory.
    pub state_dir: String,
    /// Whether it outlives its owner.
    pub detached: bool,
    /// The bundle's internal IP.
    pub bundle_ip: String,
}

impl BottleLabels {
    /// The label map for a resource of `role`.
    pub fn for_role(&self, role: &str) -> HashMap<String, String> {
        let pairs = [
            (LABEL_MANAGED, MANAGED_BY_DOCKER.to_string()),
            (LABEL_NAME, self.name.clone()),
            (LABEL_AGENT, self.agent.clone()),
            (LABEL_SLUG, self.slug.clone()),
            (LABEL_OWNER_PID, self.owner.pid.to_string()),
            (LABEL_OWNER_START, self.owner.start.to_string()),
            (LABEL_STATE_DIR, self.state_dir.clone()),
            (
                LABEL_DETACHED,
                if self.detached { "1" } else { "0" }.to_string(),
            ),
            (LABEL_ROLE, role.to_string()),
            (LABEL_BUNDLE_IP, self.bundle_ip.clone()),
        ];
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// A label filter for the list APIs: `key=value` pairs, all required.
pub fn label_filter(pairs: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
    let labels = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    HashMap::from([("label".to_string(), labels)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names() {
        let names = ResourceNames::for_slug("demo");
        assert_eq!(names.bottle, "bot-bottle-demo");
        assert_eq!(names.network, "bot-bottle-demo");
        assert_eq!(names.bundle, "bot-bottle-demo-bundle");
        assert_eq!(names.agent, "bot-bottle-demo-agent");
    }

    #[test]
    fn owner_round_trips_through_labels() {
        let labels = BottleLabels {
            name: "bot-bottle-x".into(),
            agent: "x".into(),
            slug: "x".into(),
            owner: Owner { pid: 42, start: 7 },
            state_dir: "/s/x".into(),
            detached: true,
            bundle_ip: "192.168.3.2".into(),
        }
        .for_role(role::AGENT);
        assert_eq!(
            owner_from_labels(&labels),
            Some(Owner { pid: 42, start: 7 })
        );
        assert_eq!(labels[LABEL_DETACHED], "1");
        assert_eq!(labels[LABEL_MANAGED], "1");
        assert_eq!(labels[LABEL_ROLE], "agent");
        assert_eq!(owner_from_labels(&HashMap::new()), None);
    }

    #[test]
    fn filter_shape() {
        let filter = label_filter(&[(LABEL_MANAGED, "1"), (LABEL_SLUG, "x")]);
        assert_eq!(filter["label"], ["bottle.managed=1", "bottle.slug=x"]);
    }
}
