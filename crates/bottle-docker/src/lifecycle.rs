//! Finding bottles again and taking them down: `list`, `stop` (its fast
//! first part, [`begin_stop`], and the rest), `cleanup`, and the removal
//! helpers a failed launch unwinds with.
//!
//! Resources are found by label ([`crate::names`]), never by name alone, so
//! a container that merely looks like a bottle's is never touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use bollard::query_parameters::{ListContainersOptionsBuilder, ListNetworksOptionsBuilder};
use bottle_core::backend::{
    BackendKind, BottleInfo, CleanupItem, CleanupPass, CleanupReport, StopProgress,
};
use bottle_core::life::{Phase, StateDir};
use bottle_core::slug::{bottle_name, slug_of};
use bottle_core::time::rfc3339;

pub use crate::client::remove_container;
use crate::client::{Engine, remove_container_async};
use crate::data::{self, StatePaths};
use crate::error::{DockerError, is_not_found};
use crate::names::{
    EGRESS_NETWORK, LABEL_AGENT, LABEL_BUNDLE_IP, LABEL_DETACHED, LABEL_MANAGED, LABEL_NAME,
    LABEL_ROLE, LABEL_SLUG, LABEL_STATE_DIR, MANAGED_BY_DOCKER, ResourceNames, label_filter,
    owner_from_labels, role,
};

/// Removes a network. `Ok(false)` if it was gone.
pub fn remove_network(engine: &Engine, name: &str) -> Result<bool, DockerError> {
    match engine.block_on(engine.docker.remove_network(name)) {
        Ok(()) => Ok(true),
        Err(err) if is_not_found(&err) => Ok(false),
        Err(err) => Err(DockerError::api(format!("remove network {name}"))(err)),
    }
}

/// Serialises "is the egress network unused? remove it" against launches
/// that are between creating it and starting a bundle on it (a created
/// container does not hold an endpoint, so the daemon would let the network
/// go), and launches against each other (Docker lets two networks share a
/// name). Best effort: if the lock file cannot be
/// opened (another user's), we go on without it.
#[derive(Debug)]
pub struct EgressLock {
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

/// Takes the egress lock.
pub fn egress_lock() -> EgressLock {
    let uid = nix::unistd::getuid().as_raw();
    let path = std::env::temp_dir().join(format!("bottle-docker-egress-{uid}.lock"));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()
        .and_then(|file| nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).ok());
    EgressLock { _lock: lock }
}

/// Removes the shared egress network if no container uses it (created
/// ones included). `Ok(false)` if it is in use or gone.
pub fn remove_egress_if_unused(engine: &Engine) -> Result<bool, DockerError> {
    let _lock = egress_lock();
    let filters = HashMap::from([("network".to_string(), vec![EGRESS_NETWORK.to_string()])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let users = engine
        .block_on(engine.docker.list_containers(Some(options)))
        .map_err(DockerError::api(format!(
            "list the containers on {EGRESS_NETWORK}"
        )))?;
    if !users.is_empty() {
        return Ok(false);
    }
    match engine.block_on(engine.docker.remove_network(EGRESS_NETWORK)) {
        Ok(()) => Ok(true),
        Err(err) if is_not_found(&err) => Ok(false),
        // A launch attached a bundle since we looked: it is in use.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 403 | 409,
            ..
        }) => Ok(false),
        Err(err) => Err(DockerError::api(format!("remove network {EGRESS_NETWORK}"))(err)),
    }
}

/// One managed container or network, as the list APIs report it.
#[derive(Debug, Clone)]
pub(crate) struct Resource {
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    pub(crate) labels: HashMap<String, String>,
    state: String,
    created: Option<i64>,
}

/// A docker bottle's containers: `bottle.managed=1` and `extra`.
fn managed_containers(
    engine: &Engine,
    extra: &[(&str, &str)],
) -> Result<Vec<Resource>, DockerError> {
    let mut pairs = vec![(LABEL_MANAGED, MANAGED_BY_DOCKER)];
    pairs.extend_from_slice(extra);
    labelled_containers(engine, &pairs)
}

/// A docker bottle's networks: `bottle.managed=1` and `extra`.
fn managed_networks(engine: &Engine, extra: &[(&str, &str)]) -> Result<Vec<Resource>, DockerError> {
    let mut pairs = vec![(LABEL_MANAGED, MANAGED_BY_DOCKER)];
    pairs.extend_from_slice(extra);
    labelled_networks(engine, &pairs)
}

/// Every container (running or not) carrying all the label `pairs`.
pub(crate) fn labelled_containers(
    engine: &Engine,
    pairs: &[(&str, &str)],
) -> Result<Vec<Resource>, DockerError> {
    let filters = label_filter(pairs);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let containers = engine
        .block_on(engine.docker.list_containers(Some(options)))
        .map_err(DockerError::api("list bottle containers"))?;
    Ok(containers
        .into_iter()
        .map(|c| Resource {
            kind: "container",
            name: c
                .names
                .and_then(|n| n.into_iter().next())
                .map(|n| n.trim_start_matches('/').to_string())
                .or(c.id)
                .unwrap_or_default(),
            labels: c.labels.unwrap_or_default(),
            state: c.state.map(|s| s.to_string()).unwrap_or_default(),
            created: c.created,
        })
        .collect())
}

/// Every network carrying all the label `pairs`, except the shared egress
/// network, which belongs to no one bottle.
pub(crate) fn labelled_networks(
    engine: &Engine,
    pairs: &[(&str, &str)],
) -> Result<Vec<Resource>, DockerError> {
    let filters = label_filter(pairs);
    let options = ListNetworksOptionsBuilder::default()
        .filters(&filters)
        .build();
    let networks = engine
        .block_on(engine.docker.list_networks(Some(options)))
        .map_err(DockerError::api("list bottle networks"))?;
    Ok(networks
        .into_iter()
        .map(|n| Resource {
            kind: "network",
            name: n.name.unwrap_or_default(),
            labels: n.labels.unwrap_or_default(),
            state: String::new(),
            created: None,
        })
        .filter(|r| r.labels.get(LABEL_ROLE).map(String::as_str) != Some(role::EGRESS))
        .collect())
}

/// True if anything Docker holds is (or would be) this bottle's: labelled
/// resources, or a container or network that has one of its names. The
/// five questions go to the Engine at once.
pub fn bottle_resources_exist(engine: &Engine, slug: &str) -> Result<bool, DockerError> {
    let names = ResourceNames::for_slug(slug);
    let filters = label_filter(&[(LABEL_MANAGED, MANAGED_BY_DOCKER), (LABEL_SLUG, slug)]);
    let containers = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let networks = ListNetworksOptionsBuilder::default()
        .filters(&filters)
        .build();
    let docker = &engine.docker;
    let (containers, networks, network, bundle, agent) = engine.block_on(async {
        tokio::join!(
            docker.list_containers(Some(containers)),
            docker.list_networks(Some(networks)),
            docker.inspect_network(&names.network, None),
            docker.inspect_container(&names.bundle, None),
            docker.inspect_container(&names.agent, None),
        )
    });
    if !containers
        .map_err(DockerError::api("list bottle containers"))?
        .is_empty()
        || !networks
            .map_err(DockerError::api("list bottle networks"))?
            .is_empty()
    {
        return Ok(true);
    }
    let named = |found: Result<(), bollard::errors::Error>, what: String| match found {
        Ok(()) => Ok(true),
        Err(err) if is_not_found(&err) => Ok(false),
        Err(err) => Err(DockerError::api(what)(err)),
    };
    Ok(named(
        network.map(drop),
        format!("inspect network {}", names.network),
    )? | named(
        bundle.map(drop),
        format!("inspect container {}", names.bundle),
    )? | named(
        agent.map(drop),
        format!("inspect container {}", names.agent),
    )?)
}

/// Every bottle with at least one container, then every bottle that is
/// only a state dir (a launch under way, or one that died before it
/// created a container).
pub fn list_active(engine: &Engine, state_root: &Path) -> Result<Vec<BottleInfo>, DockerError> {
    let mut bottles = bottles_with_containers(engine)?;
    let leftovers = state_only_bottles(state_root, &bottles);
    bottles.extend(leftovers);
    Ok(bottles)
}

/// The bottles that are only a docker state dir under `state_root`, none
/// of them in `listed`: one whose stop is being finished (`stopping`), a
/// launch that has not created a container yet (`launching`, its process
/// runs) or one that died before it did (`incomplete`: its CA key is still
/// on disk, and `bottle cleanup` or `bottle stop` removes it).
pub(crate) fn state_only_bottles(state_root: &Path, listed: &[BottleInfo]) -> Vec<BottleInfo> {
    bottle_core::life::recorded_bottles(state_root, BackendKind::Docker)
        .into_iter()
        .filter_map(|(dir, recorded)| {
            let slug = dir.root().file_name()?.to_str()?.to_string();
            let plan = data::read_plan(&StatePaths::new(dir.root())).ok()?;
            let name = bottle_name(&slug);
            if plan.slug != slug || listed.iter().any(|b| b.name == name) {
                return None;
            }
            let state = match recorded.record.phase {
                Phase::Stopping => "stopping",
                _ if recorded.record.in_flight() => "launching",
                _ => "incomplete (state dir only)",
            };
            Some(BottleInfo {
                name,
                agent: plan.agent.clone(),
                backend: BackendKind::Docker,
                state: bottle_core::life::with_layout(state.into(), recorded.legacy),
                bundle_address: Some(plan.backend_data.bundle.ip.to_string()),
                created: recorded.record.created,
                pending_requests: 0,
                audit: bottle_core::audit_files::AuditHealth::Unknown,
                agent_running: None,
                ports: Vec::new(),
            })
        })
        .collect()
}

/// Every bottle with at least one container.
fn bottles_with_containers(engine: &Engine) -> Result<Vec<BottleInfo>, DockerError> {
    let mut by_name: BTreeMap<String, Vec<Resource>> = BTreeMap::new();
    for container in managed_containers(engine, &[])? {
        let Some(name) = container.labels.get(LABEL_NAME).cloned() else {
            continue;
        };
        by_name.entry(name).or_default().push(container);
    }
    Ok(by_name
        .into_iter()
        .map(|(name, resources)| {
            let of_role = |r: &str| {
                resources
                    .iter()
                    .find(|c| c.labels.get(LABEL_ROLE).map(String::as_str) == Some(r))
            };
            // A reset's standby and the boxes it retired carry the agent's
            // labels: the agent is the one with the agent's name.
            let agent = resources
                .iter()
                .find(|c| {
                    c.labels.get(LABEL_ROLE).map(String::as_str) == Some(role::AGENT)
                        && c.labels
                            .get(LABEL_SLUG)
                            .is_some_and(|slug| ResourceNames::for_slug(slug).agent == c.name)
                })
                .or_else(|| of_role(role::AGENT));
            let bundle = of_role(role::BUNDLE);
            let any = agent.or(bundle).unwrap_or(&resources[0]);
            let state = match (agent, bundle) {
                (Some(a), Some(b)) if a.state == b.state => a.state.clone(),
                (Some(a), Some(b)) => format!("{} (bundle {})", a.state, b.state),
                (Some(a), None) => format!("{} (no bundle)", a.state),
                (None, Some(b)) => format!("incomplete (bundle {})", b.state),
                (None, None) => any.state.clone(),
            };
            // A reset that halted the bottle stopped both containers and
            // left them for inspection; say why they are stopped.
            let state_dir = any.labels.get(LABEL_STATE_DIR).map(Path::new);
            let halted = state_dir.and_then(|dir| {
                bottle_core::sandbox::reset::halted(&bottle_core::sandbox::ResetFiles::new(dir))
            });
            let pooled = any
                .labels
                .get(LABEL_STATE_DIR)
                .is_some_and(|dir| bottle_core::pool::is_ready(Path::new(dir)));
            let record = state_dir.and_then(|dir| StateDir::new(dir).read().ok().flatten());
            let legacy = record.as_ref().is_some_and(|r| r.legacy);
            let stopping = record.is_some_and(|r| r.record.phase == Phase::Stopping);
            let state = if stopping {
                "stopping".to_string()
            } else if is_orphan(&any.labels) {
                // Its `start` died before the bottle was complete: what
                // runs is what `bottle cleanup` removes.
                format!("incomplete ({state})")
            } else if halted.is_some() {
                "halted".to_string()
            } else if pooled && state == "running" {
                // A warm pool's entry: prepared, nothing of the agent runs.
                "pooled".to_string()
            } else {
                state
            };
            BottleInfo {
                name,
                agent: any.labels.get(LABEL_AGENT).cloned().unwrap_or_default(),
                backend: BackendKind::Docker,
                state: bottle_core::life::with_layout(state, legacy),
                bundle_address: any.labels.get(LABEL_BUNDLE_IP).cloned(),
                created: any.created.map(rfc3339),
                pending_requests: 0,
                agent_running: None,
                ports: Vec::new(),
                audit: bottle_core::audit_files::AuditHealth::Unknown,
            }
        })
        .collect())
}

/// Only a directory named after the slug, holding a docker plan (or
/// nothing at all), is ever removed as a state dir: a label is not proof
/// enough to delete a path.
fn removable_state_dir(dir: &Path, slug: &str) -> bool {
    if dir.file_name().and_then(|n| n.to_str()) != Some(slug) {
        return false;
    }
    let paths = StatePaths::new(dir);
    match data::read_plan(&paths) {
        Ok(plan) => plan.backend == BackendKind::Docker && plan.slug == slug,
        Err(_) => std::fs::read_dir(dir)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false),
    }
}

/// The first part of a stop, all the operator waits for: records in the
/// bottle's state dir that it is stopping (its record's phase, flushed to
/// disk: `list` shows it stopping, and `cleanup` finishes the stop if its
/// finisher never does), then removes the agent's container. Once it is
/// gone the agent can neither run nor reach anything (the bundle it leaves is alone on an internal
/// network the host has no address on); [`finish_stop`] removes the bundle
/// and the rest, and `cleanup` does if nothing else does. Removing the
/// bundle here too would cost the operator the daemon killing a second
/// container alongside the first, most of a second `docker rm -f`. `Stopped` when the bottle has no
/// state dir under `state_root` to record in (or its labels name another):
/// then it is stopped whole, here.
///
/// A container that could not be removed is in the report's failures and
/// the bottle stays recorded as stopping, so `cleanup` tries again.
///
/// A finisher at work holds the state dir's lock until the dir is gone;
/// this waits for it, so a second stop finds the bottle gone rather than
/// recording a stop in a dir being removed.
pub fn begin_stop(
    engine: &Engine,
    state_root: &Path,
    name: &str,
) -> Result<StopProgress, DockerError> {
    let slug = slug_of(name).to_string();
    let _finisher_done = StateDir::of(state_root, &slug).lock();
    let containers = managed_containers(engine, &[(LABEL_SLUG, &slug)])?;
    let state_dirs: Vec<PathBuf> = labelled_state_dirs(&containers, &[], state_root, &slug)
        .into_iter()
        .filter(|dir| dir.exists() && removable_state_dir(dir, &slug))
        .collect();
    // The finish looks for the record under this state root only: a
    // bottle labelled with another state dir is stopped whole, here.
    let dir = state_root.join(&slug);
    if state_dirs != [dir.clone()] {
        return stop(engine, state_root, name).map(StopProgress::Stopped);
    }
    // With no record to keep the stop's place (unwritable, or none), the
    // whole stop happens here.
    if StateDir::new(&dir).advance(Phase::Stopping).is_err() {
        return stop(engine, state_root, name).map(StopProgress::Stopped);
    }
    let agent: Vec<Resource> = containers
        .into_iter()
        .filter(|c| c.labels.get(LABEL_ROLE).map(String::as_str) == Some(role::AGENT))
        .collect();
    let mut report = CleanupReport::default();
    remove_resources(engine, &agent, &[], &mut report);
    Ok(StopProgress::Stopping(report))
}

/// Finishes the stop of the bottle `name` that [`begin_stop`] began, and
/// nothing else. With the state dir there, only while it is recorded as
/// stopping, holding the dir's lock (flock on the dir) throughout and
/// reading the record under it: two finishers (the detached one,
/// `cleanup`, a launch of the same name) never interleave, and one that
/// comes late finds the record gone and cannot take down a new bottle of
/// the same name. A dir without its record that goes within two seconds
/// was being removed under the finisher (`rm -rf` deletes the record
/// first): the rest is then found by its labels, as below.
///
/// With the state dir gone (another finisher removed it, or someone
/// removed the state root before the finish), what still carries the
/// bottle's labels, naming that dir, is the stopped bottle's leftovers,
/// provided the dir is still missing once they are listed: a launch writes
/// its state dir before it creates anything in Docker.
pub fn finish_stop(
    engine: &Engine,
    state_root: &Path,
    name: &str,
) -> Result<CleanupReport, DockerError> {
    let slug = slug_of(name).to_string();
    let dir = state_root.join(&slug);
    if let Some(_lock) = StateDir::new(&dir).lock() {
        if is_stopping(&dir) {
            return stop(engine, state_root, name);
        }
        // No record: a new bottle of the name, or this one's dir being
        // removed under the finisher (an `rm -rf` deletes the record
        // before the dir). Only the second is still this stop's.
        if !goes_away(&dir, REMOVAL_GRACE) {
            return Ok(CleanupReport::default());
        }
    }
    // Only what was made for this state dir: a bottle of the same name
    // under another state root is not this stop's.
    let dir_label = dir.display().to_string();
    let pairs = [
        (LABEL_SLUG, slug.as_str()),
        (LABEL_STATE_DIR, dir_label.as_str()),
    ];
    let containers = managed_containers(engine, &pairs)?;
    let networks = managed_networks(engine, &pairs)?;
    let mut report = CleanupReport::default();
    if dir.exists() {
        return Ok(report);
    }
    remove_resources(engine, &containers, &networks, &mut report);
    Ok(report)
}

/// How long a finisher that finds a state dir without its `stopping`
/// record waits to see whether the dir is being removed.
const REMOVAL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the directory `dir` is gone within `grace` (checked every
/// 20 ms, so a removal in progress is seen to its end).
fn goes_away(dir: &Path, grace: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + grace;
    loop {
        if !dir.exists() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether the bottle of the state dir `dir` is recorded as stopping.
fn is_stopping(dir: &Path) -> bool {
    StateDir::new(dir).is_stopping()
}

/// Finishes the stop of the bottle `slug` if it is recorded as stopping
/// (its finisher may still be at work, or dead), waiting for a finisher at
/// work: a launch of the same name right after `bottle stop` then starts
/// instead of finding the old bottle's network, and no late finisher can
/// remove the new bottle. What cannot be removed stays for the launch's
/// own check to refuse.
pub fn finish_if_stopping(engine: &Engine, state_root: &Path, slug: &str) {
    if is_stopping(&state_root.join(slug)) {
        let _ = finish_stop(engine, state_root, &bottle_name(slug));
    }
}

/// Stops a bottle, or finishes one [`begin_stop`] left stopping: removes
/// its containers (together), its network and its state dir. The shared
/// egress network stays for the next launch (creating it is a tenth of a
/// cold start); `cleanup` removes it when no container uses it. Stopping a bottle that is already gone
/// removes nothing and is not an error. A stopping bottle whose containers
/// or network could not be removed keeps its state dir, and so its record,
/// for `cleanup` to finish.
pub fn stop(engine: &Engine, state_root: &Path, name: &str) -> Result<CleanupReport, DockerError> {
    let slug = slug_of(name).to_string();
    let mut report = CleanupReport::default();
    let containers = managed_containers(engine, &[(LABEL_SLUG, &slug)])?;
    let networks = managed_networks(engine, &[(LABEL_SLUG, &slug)])?;
    let state_dirs = labelled_state_dirs(&containers, &networks, state_root, &slug);
    remove_resources(engine, &containers, &networks, &mut report);
    let leftovers = !report.failed.is_empty();
    for dir in state_dirs {
        if !dir.exists() || !removable_state_dir(&dir, &slug) || (leftovers && is_stopping(&dir)) {
            continue;
        }
        record_removal(
            &mut report,
            format!("state dir {}", dir.display()),
            data::remove_state_dir(&dir),
        );
    }
    Ok(report)
}

/// Records in `report` what removing a bottle's files (`what`) did: the
/// removal, the audit log kept, or why it failed.
pub(crate) fn record_removal(
    report: &mut CleanupReport,
    what: String,
    removal: Result<data::Removal, DockerError>,
) {
    match removal {
        Ok(removal) => {
            if let Some(run) = removal.kept_log {
                report.kept.push(format!("audit log {}", run.display()));
            }
            if removal.removed {
                report.removed.push(what);
            }
        }
        Err(err) => report.failed.push(err.to_string()),
    }
}

/// The state dirs a bottle's resources name in their labels, and
/// `<state_root>/<slug>`: candidates only, each checked before removal.
pub(crate) fn labelled_state_dirs(
    containers: &[Resource],
    networks: &[Resource],
    state_root: &Path,
    slug: &str,
) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = containers
        .iter()
        .chain(networks)
        .filter_map(|r| r.labels.get(LABEL_STATE_DIR).map(PathBuf::from))
        .collect();
    dirs.push(state_root.join(slug));
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Removes `containers`, then `networks`, recording each outcome in
/// `report`. The containers go together (most of `stop`'s time is the
/// daemon killing them); the networks can only go once they are empty.
pub(crate) fn remove_resources(
    engine: &Engine,
    containers: &[Resource],
    networks: &[Resource],
    report: &mut CleanupReport,
) {
    let removed_containers = engine.block_on(futures_util::future::join_all(
        containers
            .iter()
            .map(|c| remove_container_async(engine, &c.name)),
    ));
    let removed_networks = networks.iter().map(|n| remove_network(engine, &n.name));
    for (resource, result) in containers
        .iter()
        .chain(networks)
        .zip(removed_containers.into_iter().chain(removed_networks))
    {
        match result {
            Ok(true) => report
                .removed
                .push(format!("{} {}", resource.kind, resource.name)),
            Ok(false) => {}
            Err(err) => report
                .failed
                .push(format!("{} {}: {}", resource.kind, resource.name, err)),
        }
    }
}

/// Whether a bottle is an orphan ([`orphan_reason`]).
fn is_orphan(labels: &HashMap<String, String>) -> bool {
    orphan_reason(labels).is_some()
}

/// Why a bottle is an orphan, if it is: it is recorded as stopping
/// (whoever began the stop may have died before finishing it), or its
/// owner died and it was not a completed detached launch. A detached launch is
/// complete once launched and, when a `start --detach` gave it a session,
/// once its agent's command runs there (the holder's `started` marker);
/// a pool entry no `start` has claimed runs no agent until one does.
fn orphan_reason(labels: &HashMap<String, String>) -> Option<&'static str> {
    let state_dir = labels.get(LABEL_STATE_DIR).map(Path::new);
    if state_dir.is_some_and(is_stopping) {
        return Some("its stop was not finished");
    }
    let owner_alive = owner_from_labels(labels).is_some_and(|o| o.is_alive());
    if owner_alive {
        return None;
    }
    const DEAD: &str = "the bottle process that launched it is gone";
    let Some(dir) = state_dir else {
        return Some(DEAD);
    };
    let detached = labels.get(LABEL_DETACHED).map(String::as_str) == Some("1");
    let launched = StateDir::new(dir)
        .phase()
        .is_some_and(Phase::launch_completed);
    // A pool entry is launched detached; the `start` that claimed it
    // decides whether it still is, and owns it if not.
    let orphan = match bottle_core::pool::claim_record(dir) {
        Some(claim) if !claim.detached => !claim.owner.is_alive(),
        Some(_) => !(launched && agent_started(dir)),
        None if bottle_core::pool::is_ready(dir) => !(detached && launched),
        None => !(detached && launched && agent_started(dir)),
    };
    orphan.then_some(DEAD)
}

/// Whether a bottle's resources, by their labels, belong to the install
/// whose state root is `state_root`: they name a state dir in it.
/// Resources of another install (another state root on this host), or
/// with no state dir label, are not this cleanup's to remove.
fn of_this_install(labels: &HashMap<String, String>, state_root: &Path) -> bool {
    labels
        .get(LABEL_STATE_DIR)
        .map(Path::new)
        .and_then(Path::parent)
        .is_some_and(|root| root == state_root)
}

/// Whether the bottle in `state_dir` has no session waiting for its agent:
/// none was made for it (a detached launch through the library), or its
/// agent's command ran there. A holder from before the `started` marker
/// wrote no command record; its session counts as started, so that
/// `cleanup` after an upgrade does not take running bottles for crashed
/// launches.
fn agent_started(state_dir: &Path) -> bool {
    let session = bottle_core::state::SessionPaths::of_state_dir(state_dir);
    !session.dir.exists()
        || session.started().exists()
        || (session.holder().exists() && !session.command().exists())
}

/// Removes the warm-pool entries that can no longer be claimed
/// (`pool_entry::broken_entries`), each once the pass approves it
/// and this process took it.
pub fn cleanup_broken_pool_entries(
    engine: &Engine,
    state_root: &Path,
    pass: &mut CleanupPass<'_>,
) -> Result<(), DockerError> {
    for (slug, why) in crate::pool_entry::broken_entries(engine, state_root) {
        let name = bottle_name(&slug);
        let item = CleanupItem::new("pool entry", name.clone(), why);
        if !pass.found(item) || !bottle_core::pool::take(&state_root.join(&slug), false) {
            continue;
        }
        pass.report.merge(stop(engine, state_root, &name)?);
    }
    Ok(())
}

/// What crashed launches and dead owners of this install left behind,
/// found and (for the items `pass` says the operator approved) removed:
/// their containers, networks and state dirs, state dirs of plans that
/// were never launched, and the shared egress network when no container
/// uses it. Only resources labelled with a state dir under `state_root`
/// are looked at: another install's are never touched.
pub fn cleanup(
    engine: &Engine,
    state_root: &Path,
    pass: &mut CleanupPass<'_>,
) -> Result<(), DockerError> {
    let mut by_slug: BTreeMap<String, HashMap<String, String>> = BTreeMap::new();
    let mut others = BTreeSet::new();
    for resource in managed_containers(engine, &[])?
        .into_iter()
        .chain(managed_networks(engine, &[])?)
    {
        if let Some(slug) = resource.labels.get(LABEL_SLUG).cloned() {
            if of_this_install(&resource.labels, state_root) {
                by_slug.entry(slug).or_insert(resource.labels);
            } else {
                others.insert(slug);
            }
        }
    }
    for (slug, labels) in &by_slug {
        let Some(why) = orphan_reason(labels) else {
            continue;
        };
        let name = bottle_name(slug);
        if !pass.found(CleanupItem::new("bottle", name.clone(), why)) {
            continue;
        }
        // A stop began: finish it where it began, in the state root its
        // labels name.
        let labelled_dir = labels.get(LABEL_STATE_DIR).map(Path::new);
        let removed = match labelled_dir.and_then(|dir| Some((dir, dir.parent()?))) {
            Some((dir, root)) if is_stopping(dir) => finish_stop(engine, root, &name)?,
            _ => stop(engine, state_root, &name)?,
        };
        pass.report.merge(removed);
    }
    // State dirs with no Docker resources at all: prepared but never (or
    // no longer) launched.
    if let Ok(entries) = std::fs::read_dir(state_root) {
        for entry in entries.flatten() {
            let dir = entry.path();
            let Some(slug) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            if by_slug.contains_key(&slug)
                || others.contains(&slug)
                || !dir.join("plan.json").exists()
            {
                continue;
            }
            let record = StateDir::new(&dir).read().ok().flatten();
            let owner_alive = record.as_ref().is_some_and(|r| r.record.owner.is_alive());
            if record.is_some_and(|r| r.record.phase == Phase::Stopping) {
                let item = CleanupItem::new(
                    "state dir",
                    dir.display().to_string(),
                    "its stop was not finished",
                );
                if pass.found(item) {
                    pass.report
                        .merge(finish_stop(engine, state_root, &bottle_name(&slug))?);
                }
                continue;
            }
            if owner_alive || !removable_state_dir(&dir, &slug) {
                continue;
            }
            let item = CleanupItem::new(
                "state dir",
                dir.display().to_string(),
                "a launch that never completed; its bottle process is gone",
            );
            if pass.found(item) {
                record_removal(
                    &mut pass.report,
                    format!("state dir {}", dir.display()),
                    data::remove_state_dir(&dir),
                );
            }
        }
    }
    if egress_unused(engine)? {
        let item = CleanupItem::new(
            "network",
            EGRESS_NETWORK,
            "shared by the bottles of this host, used by none now",
        );
        if pass.found(item) {
            match remove_egress_if_unused(engine) {
                Ok(true) => {
                    let line = format!("network {EGRESS_NETWORK}");
                    if !pass.report.removed.contains(&line) {
                        pass.report.removed.push(line);
                    }
                }
                Ok(false) => {}
                Err(err) => pass.report.failed.push(err.to_string()),
            }
        }
    }
    Ok(())
}

/// Whether the shared egress network exists and no container uses it.
fn egress_unused(engine: &Engine) -> Result<bool, DockerError> {
    match engine.block_on(engine.docker.inspect_network(EGRESS_NETWORK, None)) {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(false),
        Err(err) => {
            return Err(DockerError::api(format!(
                "inspect network {EGRESS_NETWORK}"
            ))(err));
        }
    }
    let filters = HashMap::from([("network".to_string(), vec![EGRESS_NETWORK.to_string()])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let users = engine
        .block_on(engine.docker.list_containers(Some(options)))
        .map_err(DockerError::api(format!(
            "list the containers on {EGRESS_NETWORK}"
        )))?;
    Ok(users.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{LABEL_OWNER_PID, LABEL_OWNER_START};

    fn labels(pid: u32, detached: bool, state_dir: &Path) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_OWNER_PID.to_string(), pid.to_string()),
            (LABEL_OWNER_START.to_string(), "0".to_string()),
            (
                LABEL_DETACHED.to_string(),
                if detached { "1" } else { "0" }.to_string(),
            ),
            (LABEL_STATE_DIR.to_string(), state_dir.display().to_string()),
        ])
    }

    #[test]
    fn only_resources_naming_a_state_dir_of_this_root_are_this_installs() {
        let ours = labels(1, false, Path::new("/home/op/.local/state/bottle/demo"));
        assert!(of_this_install(
            &ours,
            Path::new("/home/op/.local/state/bottle")
        ));
        assert!(!of_this_install(&ours, Path::new("/srv/other/bottle")));
        assert!(!of_this_install(
            &labels(1, false, Path::new("/home/op/.local/state/bottle/x/y")),
            Path::new("/home/op/.local/state/bottle")
        ));
        assert!(!of_this_install(&HashMap::new(), Path::new("/")));
    }

    #[test]
    fn orphan_rules() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        // A PID above the kernel's maximum is never alive.
        let dead = 4_194_305;
        assert!(!is_orphan(&labels(me, false, dir.path())));
        assert!(is_orphan(&labels(dead, false, dir.path())));
        // Detached but never completed: an orphan.
        assert!(is_orphan(&labels(dead, true, dir.path())));
        let record = StateDir::new(dir.path());
        record
            .begin(&bottle_core::life::BottleRecord::launching(
                "bot-bottle-demo",
                "demo",
                BackendKind::Docker,
            ))
            .unwrap();
        assert!(is_orphan(&labels(dead, true, dir.path())));
        record.advance(Phase::Running).unwrap();
        // Launched detached with no session (through the library).
        assert!(!is_orphan(&labels(dead, true, dir.path())));
        // Launched by `start --detach`, which died before its agent ran.
        let session = dir.path().join("session");
        std::fs::create_dir_all(&session).unwrap();
        std::fs::write(session.join("command.json"), "[]").unwrap();
        assert!(is_orphan(&labels(dead, true, dir.path())));
        std::fs::write(session.join("started"), "1\n").unwrap();
        assert!(!is_orphan(&labels(dead, true, dir.path())));
        // A session from before the marker: started if its holder wrote.
        std::fs::remove_file(session.join("started")).unwrap();
        std::fs::remove_file(session.join("command.json")).unwrap();
        std::fs::write(session.join("holder.json"), "{}").unwrap();
        assert!(!is_orphan(&labels(dead, true, dir.path())));
        std::fs::remove_dir_all(&session).unwrap();
        assert!(is_orphan(&HashMap::new()));
        // A pooled bottle (launched detached) claimed by an attached
        // `start` is that start's: an orphan once it died.
        let claim = |pid: u32| {
            let owner = bottle_core::process::Owner {
                pid,
                start: bottle_core::process::Owner::current().start,
            };
            let record = serde_json::json!({
                "claimed": "2026-11-24T11:00:00Z",
                "owner": owner,
                "detached": false,
                "verify_ms": 1,
            });
            std::fs::write(dir.path().join("pool-claimed"), record.to_string()).unwrap();
        };
        claim(me);
        assert!(!is_orphan(&labels(dead, true, dir.path())));
        claim(dead);
        assert!(is_orphan(&labels(dead, true, dir.path())));
        // A stop began: an orphan whoever owns it, so `cleanup` finishes it.
        record.advance(Phase::Stopping).unwrap();
        assert!(is_orphan(&labels(dead, true, dir.path())));
        assert!(is_orphan(&labels(me, false, dir.path())));
    }

    #[test]
    fn a_state_dir_without_containers_is_listed_as_incomplete_launching_or_stopping() {
        let root = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(root.path().join("demo"));
        let plan = crate::config::tests::sample_plan();
        let state_dir = StateDir::new(&paths.root);
        let mut record =
            bottle_core::life::BottleRecord::launching(&plan.bottle, "demo", BackendKind::Docker);
        // The launching process is gone (no PID is above the kernel's maximum).
        record.owner = bottle_core::process::Owner {
            pid: 4_194_305,
            start: 1,
        };
        state_dir.begin(&record).unwrap();
        data::write_plan(&paths, &plan).unwrap();
        data::write_file(&paths.ca_key(), b"KEY", 0o600).unwrap();
        // Not bottles: a dir without a plan, and the kept audit logs.
        std::fs::create_dir_all(root.path().join("other")).unwrap();
        std::fs::create_dir_all(root.path().join("retained_logs/demo")).unwrap();

        let found = state_only_bottles(root.path(), &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].name, "bot-bottle-demo");
        assert_eq!(found[0].state, "incomplete (state dir only)");
        assert_eq!(found[0].agent, "demo");
        assert_eq!(found[0].created, record.created);

        record.owner = bottle_core::process::Owner::current();
        state_dir.begin(&record).unwrap();
        assert_eq!(state_only_bottles(root.path(), &[])[0].state, "launching");
        state_dir.advance(Phase::Stopping).unwrap();
        assert_eq!(state_only_bottles(root.path(), &[])[0].state, "stopping");
        // A bottle listed with its containers is not listed twice.
        assert!(state_only_bottles(root.path(), &found).is_empty());
    }

    /// A state dir as bottles before `bottle.json` wrote it: the plan, the
    /// owner, `launched`, `stopping`. It is listed, judged and finished by
    /// those files, and `list` says which layout it is.
    #[test]
    fn a_state_dir_of_the_earlier_layout_is_listed_and_judged_by_its_files() {
        let root = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(root.path().join("demo"));
        data::write_plan(&paths, &crate::config::tests::sample_plan()).unwrap();
        let owner = serde_json::to_vec(&bottle_core::process::Owner::current()).unwrap();
        std::fs::write(paths.root.join("owner.json"), owner).unwrap();
        let listed = || state_only_bottles(root.path(), &[])[0].state.clone();
        assert_eq!(listed(), "launching (earlier state layout)");
        std::fs::write(paths.root.join("launched"), "1\n").unwrap();
        let mine = labels(std::process::id(), true, &paths.root);
        assert!(!is_orphan(&mine));
        std::fs::write(paths.root.join("stopping"), "{}").unwrap();
        assert_eq!(listed(), "stopping (earlier state layout)");
        assert!(is_stopping(&paths.root));
        assert!(is_orphan(&mine), "a stop that began is cleanup's to finish");
    }

    #[test]
    fn only_docker_state_dirs_named_after_the_slug_are_removable() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("demo");
        std::fs::create_dir(&dir).unwrap();
        assert!(
            removable_state_dir(&dir, "demo"),
            "empty dirs are removable"
        );
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        assert!(!removable_state_dir(&dir, "demo"), "foreign files are kept");
        assert!(!removable_state_dir(root.path(), "demo"));
    }
}
