//! What a run leaves behind on the Engine, which must be nothing of its
//! own.

use std::collections::BTreeSet;

use serde_json::Value;

use super::RUN_PREFIX;
use crate::escape::engine::EngineSocket;

/// What of `after` the run left behind: its own bottles' resources. The
/// shared egress network is not the run's: a stop keeps it for the next
/// launch, and `bottle cleanup` removes it once no bottle uses it.
pub(super) fn leftovers(before: &BTreeSet<String>, after: &BTreeSet<String>) -> Vec<String> {
    let ours = |r: &str| {
        r.split_once(' ')
            .is_some_and(|(_, name)| name.starts_with(RUN_PREFIX))
    };
    after
        .difference(before)
        .filter(|r| ours(r))
        .cloned()
        .collect()
}

/// Names of every `bot-bottle-` container and network.
pub(super) fn bottle_resources(engine: &EngineSocket) -> anyhow::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let containers = engine.get("/containers/json?all=1")?;
    for c in containers.as_array().into_iter().flatten() {
        for name in c["Names"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let name = name.trim_start_matches('/');
            if name.starts_with(bottle_core::slug::RESOURCE_PREFIX) {
                out.insert(format!("container {name}"));
            }
        }
    }
    let networks = engine.get("/networks")?;
    for n in networks.as_array().into_iter().flatten() {
        if let Some(name) = n["Name"].as_str()
            && name.starts_with(bottle_core::slug::RESOURCE_PREFIX)
        {
            out.insert(format!("network {name}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_runs_own_leftovers_count() {
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let before = set(&[]);
        // Another user's bottle appeared meanwhile: not ours; nor is the
        // shared egress network a stop keeps.
        let after = set(&["container bot-bottle-t1-agent", "network bot-bottle-egress"]);
        assert!(leftovers(&before, &after).is_empty());
        let after = set(&["network bot-bottle-escape-a"]);
        assert_eq!(leftovers(&before, &after), ["network bot-bottle-escape-a"]);
        let after = set(&[
            "container bot-bottle-escape-a-agent",
            "container bot-bottle-t1-agent",
        ]);
        assert_eq!(
            leftovers(&before, &after),
            ["container bot-bottle-escape-a-agent"]
        );
        // There before the run: not the run's doing.
        assert!(leftovers(&after, &after).is_empty());
    }
}
