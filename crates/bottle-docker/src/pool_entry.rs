//! What the docker backend records of a warm-pool entry at fill
//! ([`DockerPoolFacts`], beside the shared fields of
//! [`bottle_core::pool::PoolRecord`]) and how `cleanup` judges a waiting
//! entry by it. The entry's files and the claim are
//! [`bottle_core::pool`]'s; the claim's docker checks are [`crate::pool`]'s.

use std::collections::BTreeMap;
use std::path::Path;

use bollard::models::ContainerInspectResponse;
use bottle_core::backend::BackendKind;
use bottle_core::pool::{backend_of, is_ready, recorded_facts};
use serde::{Deserialize, Serialize};

use crate::client::Engine;
use crate::error::DockerError;
use crate::names::ResourceNames;

/// What the Engine says of a container's life: a restart or a stop and
/// start changes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StartFacts {
    /// Whether it runs.
    pub running: bool,
    /// When it last started.
    pub started_at: String,
    /// How often the daemon restarted it.
    pub restart_count: i64,
}

/// The docker facts of an entry at fill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DockerPoolFacts {
    /// The agent container at fill.
    pub agent_start: StartFacts,
    /// The bundle container's standing at fill ([`bundle_standing`]),
    /// compared as a whole at claim.
    pub bundle: BTreeMap<String, String>,
}

pub(crate) fn start_facts(inspect: &ContainerInspectResponse) -> StartFacts {
    let state = inspect.state.clone().unwrap_or_default();
    StartFacts {
        running: state.running == Some(true),
        started_at: state.started_at.unwrap_or_default(),
        restart_count: inspect.restart_count.unwrap_or(-1),
    }
}

/// What the Engine says of a bundle container, for a pool's claim: its
/// Engine facts (networks and addresses, limits, image, running) and when
/// it last started and how often it restarted. The same for a docker
/// bottle's bundle and a microVM's.
pub(crate) fn bundle_standing(inspect: &ContainerInspectResponse) -> BTreeMap<String, String> {
    let start = start_facts(inspect);
    let mut standing = crate::reset::engine_facts(inspect);
    standing.insert("started_at".into(), start.started_at);
    standing.insert("restart_count".into(), start.restart_count.to_string());
    standing
}

pub(crate) fn inspect_both(
    engine: &Engine,
    names: &ResourceNames,
) -> Result<(ContainerInspectResponse, ContainerInspectResponse), DockerError> {
    let (agent, bundle) = engine.block_on(async {
        futures_util::join!(
            engine.docker.inspect_container(&names.agent, None),
            engine.docker.inspect_container(&names.bundle, None)
        )
    });
    Ok((
        agent.map_err(DockerError::api(format!(
            "inspect container {}",
            names.agent
        )))?,
        bundle.map_err(DockerError::api(format!(
            "inspect container {}",
            names.bundle
        )))?,
    ))
}

/// The waiting entries that can no longer be claimed, each with why: a
/// record that cannot be read or is of another layout, a container that
/// stopped or restarted. Entries that merely belong to another manifest
/// are not among them: only a claim knows the manifest.
pub(crate) fn broken_entries(engine: &Engine, state_root: &Path) -> Vec<(String, String)> {
    let Ok(dirs) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut broken = Vec::new();
    for dir in dirs.flatten().map(|entry| entry.path()) {
        if !is_ready(&dir) || backend_of(&dir) != Some(BackendKind::Docker) {
            continue;
        }
        let Some(slug) = dir.file_name().map(|n| n.to_string_lossy().to_string()) else {
            continue;
        };
        let why = match recorded_facts::<DockerPoolFacts>(&dir) {
            Err(why) => Some(why),
            Ok(facts) => match inspect_both(engine, &ResourceNames::for_slug(&slug)) {
                Err(err) => Some(err.to_string()),
                Ok((agent, bundle)) => lives_as_filled(&facts, &agent, &bundle).err(),
            },
        };
        if let Some(why) = why {
            broken.push((slug, why));
        }
    }
    broken
}

/// Whether both containers still live the life they had at fill: running,
/// never restarted, not started again since, the bundle's networks,
/// addresses and settings unchanged.
pub(crate) fn lives_as_filled(
    record: &DockerPoolFacts,
    agent: &ContainerInspectResponse,
    bundle: &ContainerInspectResponse,
) -> Result<(), String> {
    let now = start_facts(agent);
    if !now.running {
        return Err("the agent container is not running".into());
    }
    if now != record.agent_start {
        let then = &record.agent_start;
        return Err(format!(
            "the agent container was started again (started {} restarts {}, at fill {} restarts {})",
            now.started_at, now.restart_count, then.started_at, then.restart_count
        ));
    }
    if !start_facts(bundle).running {
        return Err("the bundle container is not running".into());
    }
    bottle_core::pool::stands_as_filled("bundle", &record.bundle, &bundle_standing(bundle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> DockerPoolFacts {
        let same = inspect("2026-11-24T11:00:00Z", 0, true);
        DockerPoolFacts {
            agent_start: start_facts(&same),
            bundle: bundle_standing(&same),
        }
    }

    fn inspect(started_at: &str, restarts: i64, running: bool) -> ContainerInspectResponse {
        ContainerInspectResponse {
            restart_count: Some(restarts),
            state: Some(bollard::models::ContainerState {
                running: Some(running),
                started_at: Some(started_at.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_entry_started_again_or_stopped_is_not_as_filled() {
        let facts = facts();
        let same = inspect("2026-11-24T11:00:00Z", 0, true);
        assert_eq!(lives_as_filled(&facts, &same, &same), Ok(()));
        let restarted = inspect("2026-11-24T11:00:00Z", 1, true);
        assert!(lives_as_filled(&facts, &restarted, &same).is_err());
        let started_again = inspect("2026-11-24T11:05:00Z", 0, true);
        assert!(
            lives_as_filled(&facts, &same, &started_again)
                .unwrap_err()
                .contains("bundle's started_at changed")
        );
        let stopped = inspect("2026-11-24T11:00:00Z", 0, false);
        assert!(
            lives_as_filled(&facts, &stopped, &same)
                .unwrap_err()
                .contains("not running")
        );
    }
}
