//! The warm pool: bottles of an agent launched ahead of `bottle start`,
//! every check of a cold launch passed, nothing of the agent running, and
//! handed out to a `start` after a second check of what could have changed
//! while they waited.
//!
//! An entry is an ordinary detached bottle with a name of its own
//! (`<agent>-pool-<hex>`: names and labels cannot change in Docker, so a
//! claimed bottle keeps it) and three files in its state dir:
//!
//! - `pool.json` ([`PoolRecord`]): the fingerprint of everything the
//!   bottle was made from, and what the Engine said of both containers
//!   when it was filled;
//! - `pool-ready`: present while the entry waits;
//! - `pool-claimed` ([`ClaimRecord`]): who took it (a `start`, attached or
//!   detached, or a `drain`/`cleanup`) and how long the re-check took. It
//!   is hard-linked into place, which fails when it exists, so of two
//!   `start`s racing for one entry exactly one wins and the other moves
//!   on; a taker that dies right after is an owner `cleanup` can judge.
//!
//! A claim is refused, and the entry removed, when the fingerprint differs
//! (the manifest, an image, a binary or a credential changed), when either
//! container restarted or stopped, when the bundle's Engine facts (its
//! networks and addresses among them) or the agent's three reset sources
//! differ from what was recorded, or when the bundle does not answer its
//! health check.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bollard::models::ContainerInspectResponse;
use bottle_core::BottleSpec;
use bottle_core::backend::{BackendError, BackendKind, CleanupReport};
use bottle_core::plan::PlannedDevice;
use bottle_core::process::Owner;
use bottle_core::sandbox::reset::check_against_baseline;
use bottle_core::sandbox::{ResetFiles, reset::halted};
use bottle_core::slug::{bottle_name, slug_of};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::backend::{DockerBackend, credential_refs, upstream_ca_files};
use crate::bottle::{DockerBottle, exec_captured};
use crate::client::Engine;
use crate::config::BUNDLE_BINARY_PATH;
use crate::data::{self, DockerPlan, STATE_LAYOUT_VERSION, StatePaths};
use crate::error::DockerError;
use crate::isolation;
use crate::lifecycle;
use crate::names::ResourceNames;
use crate::pool_entry::{
    CLAIMED, READY, RECORD, inspect_both, lives_as_filled, read_record, start_facts, take,
};
pub use crate::pool_entry::{
    ClaimRecord, POOL_LAYOUT_VERSION, PoolRecord, StartFacts, claim_record, is_ready,
};
use crate::reset::{DockerResetSubstrate, engine_facts, tree_hash};

/// Between the agent's name and an entry's random suffix.
const ENTRY_INFIX: &str = "-pool-";
/// The key of the credentials' HMAC, in the state root, owner-only.
const FINGERPRINT_KEY: &str = "pool-fingerprint.key";

/// One entry as `bottle pool list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolEntry {
    /// The bottle's name.
    pub name: String,
    /// The manifest's agent.
    pub agent: String,
    /// `ready`, or `claimed` once a `start` took it.
    pub state: String,
    /// When it was filled.
    pub filled: String,
}

/// What a claim found.
#[derive(Debug, Default)]
pub struct Claim {
    /// The bottle handed out, and its plan, if an entry passed every check.
    pub bottle: Option<(DockerBottle, Box<DockerPlan>)>,
    /// The entries refused (and removed) on the way, each with why.
    pub refused: Vec<(String, String)>,
}

/// A fresh entry's bottle name for `agent`, within the slug's length.
pub fn entry_name(agent: &str) -> Result<String, BackendError> {
    let mut random = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(DockerError::io("read", "/dev/urandom"))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let room = bottle_core::slug::MAX_SLUG_LEN - ENTRY_INFIX.len() - suffix.len();
    let stem: String = agent.chars().take(room).collect();
    Ok(format!(
        "{}{ENTRY_INFIX}{suffix}",
        stem.trim_end_matches('-')
    ))
}

impl DockerBackend {
    /// The fingerprint of everything a bottle of `spec` is made from: the
    /// manifest's agent (paths resolved), the agent image's ID, the
    /// bundle, in-box agent and `bottle` binaries (path, size, inode and
    /// modification time: hashing 15 MB at every claim would cost more
    /// than the claim), the keep-alive, the prompt's, skills' and upstream
    /// CAs' contents, an HMAC of the credentials' values (keyed by a
    /// secret of this state root, so the record does not let anyone test
    /// guesses), the devices, and the layout versions. Two equal
    /// fingerprints mean a cold start would launch the same bottle.
    pub fn pool_fingerprint(
        &self,
        spec: &BottleSpec,
        devices: &[PlannedDevice],
    ) -> Result<String, BackendError> {
        let engine = self.engine()?;
        let mut hash = Sha256::new();
        let mut field = |name: &str, value: &[u8]| {
            hash.update((name.len() as u64).to_le_bytes());
            hash.update(name.as_bytes());
            hash.update((value.len() as u64).to_le_bytes());
            hash.update(value);
        };
        field("pool-layout", &POOL_LAYOUT_VERSION.to_le_bytes());
        field("state-layout", &STATE_LAYOUT_VERSION.to_le_bytes());
        field("agent", &json(&spec.agent)?);
        field("upstream-trust", spec.upstream_trust.to_string().as_bytes());
        field("base-dir", spec.base_dir.as_os_str().as_encoded_bytes());
        field("devices", &json(&devices)?);
        let (_, image) = self.agent_image(engine, spec)?;
        field("image", image.id.as_bytes());
        let bundle = crate::images::find_bundle_binary(self.options().bundle_bin.as_deref())?;
        field("bundle-binary", &file_identity(&bundle)?);
        if let Ok(toolbox) = crate::toolbox::find_binary() {
            field("toolbox-binary", &file_identity(&toolbox.path)?);
        }
        if let Ok(exe) = std::env::current_exe() {
            field("bottle-binary", &file_identity(&exe)?);
        }
        field(
            "keep-alive",
            &crate::pause::pause_elf(std::env::consts::ARCH).unwrap_or_default(),
        );
        if let Some(prompt) = &spec.agent.prompt {
            field("prompt", content_hash(&spec.resolve(prompt))?.as_bytes());
        }
        for skill in &spec.agent.skills {
            field("skill", content_hash(&spec.resolve(skill))?.as_bytes());
        }
        for ca in upstream_ca_files(spec, Path::new("/"))? {
            field("upstream-ca", content_hash(&ca)?.as_bytes());
        }
        let key = fingerprint_key(&self.options().state_root)?;
        for credential in credential_refs(spec) {
            let value = match (&credential.file, &credential.env) {
                (Some(file), _) => std::fs::read(file).map_err(DockerError::io("read", file))?,
                (None, Some(var)) => std::env::var(var).unwrap_or_default().into_bytes(),
                (None, None) => Vec::new(),
            };
            field("credential", &hmac_sha256(&key, &value));
        }
        Ok(format!("sha256:{}", hex(&hash.finalize())))
    }

    /// Marks the freshly launched `bottle` (of `plan`) a pool entry of its
    /// agent made from `fingerprint`: records both containers as they stand
    /// now, then the ready marker, last, so an entry without a complete
    /// record is never claimed. Refuses a bottle without a reset baseline:
    /// a claim could not check its three sources.
    pub fn mark_pooled(&self, plan: &DockerPlan, fingerprint: &str) -> Result<(), BackendError> {
        let engine = self.engine()?;
        let files = ResetFiles::new(&plan.state_dir);
        if !files.baseline().exists() {
            return Err(DockerError::PoolNeedsReset {
                bottle: plan.bottle.clone(),
            }
            .into());
        }
        let names = ResourceNames::for_slug(&plan.slug);
        let (agent, bundle) = inspect_both(engine, &names)?;
        let record = PoolRecord {
            version: POOL_LAYOUT_VERSION,
            agent: plan.agent.clone(),
            fingerprint: fingerprint.to_string(),
            filled: bottle_core::time::now_rfc3339_millis(),
            agent_start: start_facts(&agent),
            bundle_start: start_facts(&bundle),
            bundle_engine: engine_facts(&bundle),
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|err| DockerError::PoolRecord {
            path: plan.state_dir.join(RECORD),
            detail: err.to_string(),
        })?;
        data::write_file(&plan.state_dir.join(RECORD), &json, 0o600)?;
        Ok(data::write_file(&plan.state_dir.join(READY), b"", 0o600)?)
    }

    /// Claims a ready entry of `agent` made from `fingerprint`, checking it
    /// again first; every entry that fails a check is removed and named
    /// in [`Claim::refused`]. `detached`: the claiming `start` detaches.
    pub fn claim_pooled(
        &self,
        agent: &str,
        fingerprint: &str,
        detached: bool,
    ) -> Result<Claim, BackendError> {
        let engine = self.engine()?;
        let state_root = &self.options().state_root;
        let mut claim = Claim::default();
        for (dir, record) in ready_entries(state_root, Some(agent)) {
            let started = Instant::now();
            if !take(&dir, detached) {
                continue;
            }
            let name = bottle_name(&dir.file_name().unwrap_or_default().to_string_lossy());
            let checked = recheck(engine, &dir, &record, fingerprint, self.health_timeout());
            let plan = match checked {
                Ok(plan) => plan,
                Err(why) => {
                    discard(engine, state_root, &name);
                    claim.refused.push((name, why));
                    continue;
                }
            };
            let bottle = match self.attach_bottle(&name) {
                Ok(bottle) => bottle,
                Err(err) => {
                    discard(engine, state_root, &name);
                    claim.refused.push((name, err.to_string()));
                    continue;
                }
            };
            let record = ClaimRecord {
                claimed: bottle_core::time::now_rfc3339_millis(),
                owner: Owner::current(),
                detached,
                verify_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            };
            // The same owner and mode as taken; the check's time added.
            let json =
                serde_json::to_vec_pretty(&record).map_err(|err| DockerError::PoolRecord {
                    path: dir.join(CLAIMED),
                    detail: err.to_string(),
                })?;
            data::write_file(&dir.join(CLAIMED), &json, 0o600)?;
            claim.bottle = Some((bottle, Box::new(plan)));
            return Ok(claim);
        }
        Ok(claim)
    }
}

/// The entries waiting under `state_root` (of `agent`, if given), oldest
/// first. Entries whose record cannot be read are left to
/// [`cleanup_broken`].
fn ready_entries(state_root: &Path, agent: Option<&str>) -> Vec<(PathBuf, PoolRecord)> {
    let Ok(dirs) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, PoolRecord)> = dirs
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| is_ready(dir))
        .filter_map(|dir| read_record(&dir).ok().map(|record| (dir, record)))
        .filter(|(_, record)| agent.is_none_or(|agent| record.agent == agent))
        .collect();
    found.sort_by(|a, b| a.1.filled.cmp(&b.1.filled));
    found
}

/// Every pool entry under `state_root`, waiting or claimed, by name.
pub fn list(state_root: &Path) -> Vec<PoolEntry> {
    let Ok(dirs) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut entries: Vec<PoolEntry> = dirs
        .flatten()
        .map(|entry| entry.path())
        .filter_map(|dir| {
            let record = read_record(&dir).ok()?;
            let state = if is_ready(&dir) {
                "ready"
            } else if dir.join(CLAIMED).exists() {
                "claimed"
            } else {
                return None;
            };
            Some(PoolEntry {
                name: bottle_name(&dir.file_name()?.to_string_lossy()),
                agent: record.agent,
                state: state.to_string(),
                filled: record.filled,
            })
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// Removes the waiting entries (of `agent`, if given): each is taken like
/// a claim first, so a `start` cannot be handed one being removed.
pub fn drain(
    engine: &Engine,
    state_root: &Path,
    agent: Option<&str>,
) -> Result<CleanupReport, BackendError> {
    let mut report = CleanupReport::default();
    for (dir, _) in ready_entries(state_root, agent) {
        if !take(&dir, false) {
            continue;
        }
        let name = bottle_name(&dir.file_name().unwrap_or_default().to_string_lossy());
        report.merge(lifecycle::stop(engine, state_root, &name)?);
    }
    Ok(report)
}

/// The claim's checks of one entry, each failing with why; its plan when
/// every one passed.
fn recheck(
    engine: &Engine,
    dir: &Path,
    record: &PoolRecord,
    fingerprint: &str,
    health_timeout: std::time::Duration,
) -> Result<DockerPlan, String> {
    if record.version != POOL_LAYOUT_VERSION {
        return Err(format!("its layout version is {}", record.version));
    }
    if record.fingerprint != fingerprint {
        return Err(
            "it was made from another manifest, image or binary (its fingerprint differs)".into(),
        );
    }
    let files = ResetFiles::new(dir);
    if let Some(halt) = halted(&files) {
        return Err(format!("it was halted: {}", halt.reason));
    }
    let slug = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let names = ResourceNames::for_slug(&slug);
    let plan = data::read_plan(&StatePaths::new(dir)).map_err(|e| e.to_string())?;
    if plan.backend != BackendKind::Docker || plan.slug != slug {
        return Err("its plan is not this docker bottle's".into());
    }
    let (agent, bundle) = inspect_both(engine, &names).map_err(|e| e.to_string())?;
    let network = engine
        .block_on(engine.docker.inspect_network(&names.network, None))
        .map_err(|err| format!("cannot inspect network {}: {err}", names.network))?;
    lives_as_filled(record, &agent, &bundle)?;
    if engine_facts(&bundle) != record.bundle_engine {
        return Err("the bundle's networks, addresses or settings changed".into());
    }
    isolated_as_launched(&plan, &names.network, &network, &agent, &bundle)?;
    let substrate = DockerResetSubstrate::new(
        engine.clone(),
        &names.bottle,
        &names.agent,
        &names.bundle,
        dir,
        crate::data::gvisor_binary_of(&plan).map_err(|e| e.to_string())?,
    );
    let diverged: Vec<String> = check_against_baseline(&substrate, &files)
        .into_iter()
        .filter(|check| !check.matched)
        .map(|check| {
            format!(
                "{}: expected {}, found {}",
                check.source, check.expected, check.observed
            )
        })
        .collect();
    if !diverged.is_empty() {
        return Err(format!(
            "the agent's box differs from its snapshot ({})",
            diverged.join("; ")
        ));
    }
    bundle_answers(engine, &names.bundle, &plan, health_timeout)?;
    Ok(plan)
}

/// The checks a launch makes before the agent runs, made again on what
/// the Engine says now: the bottle network internal, giving the host no
/// address, of the planned subnet; the bundle at its pinned address there
/// and on the egress network; the agent at its pinned address on the
/// bottle network only, running, every capability dropped, no new
/// privileges, not privileged.
fn isolated_as_launched(
    plan: &DockerPlan,
    network_name: &str,
    network: &bollard::models::NetworkInspect,
    agent: &ContainerInspectResponse,
    bundle: &ContainerInspectResponse,
) -> Result<(), String> {
    let data = &plan.backend_data;
    isolation::check_bottle_network(
        network_name,
        network,
        &data.bundle.subnet,
        crate::config::HostOnBridge::Withheld,
    )?;
    isolation::check_bundle(network_name, bundle, data.bundle.ip)?;
    isolation::check_agent(network_name, agent, data.agent.ip)?;
    if let Some(binary) = crate::data::gvisor_binary_of(plan).map_err(|e| e.to_string())? {
        let runtime = data.agent.runtime.as_deref().unwrap_or_default();
        crate::gvisor::check_host_side(agent, runtime, &binary)?;
    }
    Ok(())
}

/// One health probe of the bundle's proxy, from inside the bundle, at the
/// address the plan pinned.
fn bundle_answers(
    engine: &Engine,
    bundle: &str,
    plan: &DockerPlan,
    timeout: std::time::Duration,
) -> Result<(), String> {
    let addr = format!(
        "{}:{}",
        plan.backend_data.bundle.ip,
        bottle_core::bundle::PROXY_PORT
    );
    let argv = [
        BUNDLE_BINARY_PATH.to_string(),
        "health".to_string(),
        "--addr".to_string(),
        addr.clone(),
    ];
    let probe = engine.block_on(async {
        tokio::time::timeout(timeout, exec_captured(engine, bundle, &argv, None)).await
    });
    match probe {
        Ok(Ok(out)) if out.exit_code == 0 => Ok(()),
        Ok(Ok(out)) => Err(format!(
            "the bundle's proxy at {addr} is unhealthy: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(Err(err)) => Err(format!("the bundle's health check failed: {err}")),
        Err(_) => Err(format!(
            "the bundle's proxy at {addr} did not answer in time"
        )),
    }
}

/// Removes an entry a claim refused; what cannot be removed is left to
/// `bottle cleanup` (its ready marker is gone, so no one claims it).
fn discard(engine: &Engine, state_root: &Path, name: &str) {
    let _ = lifecycle::stop(engine, state_root, slug_of(name));
}

/// What identifies a file without reading it: its path, size, inode and
/// modification time.
fn file_identity(path: &Path) -> Result<Vec<u8>, DockerError> {
    let meta = std::fs::metadata(path).map_err(DockerError::io("read the metadata of", path))?;
    Ok(format!(
        "{}:{}:{}:{}:{}",
        path.display(),
        meta.len(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec()
    )
    .into_bytes())
}

/// The contents of a file, or of a directory tree.
fn content_hash(path: &Path) -> Result<String, DockerError> {
    if path.is_dir() {
        return tree_hash(path);
    }
    let bytes = std::fs::read(path).map_err(DockerError::io("read", path))?;
    Ok(hex(&Sha256::digest(&bytes)))
}

/// The state root's secret for the credentials' HMAC, made on first use.
fn fingerprint_key(state_root: &Path) -> Result<Vec<u8>, DockerError> {
    let path = state_root.join(FINGERPRINT_KEY);
    if let Ok(key) = std::fs::read(&path)
        && key.len() == 32
    {
        return Ok(key);
    }
    let mut key = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(DockerError::io("read", "/dev/urandom"))?;
    data::write_file(&path, &key, 0o600)?;
    Ok(key)
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `value` as JSON, for the fingerprint.
fn json<T: Serialize>(value: &T) -> Result<Vec<u8>, DockerError> {
    serde_json::to_vec(value).map_err(|err| DockerError::PlanData {
        detail: format!("cannot encode the fingerprint's input: {err}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn entry_names_are_valid_slugs_of_the_agent() {
        let name = entry_name("demo").unwrap();
        assert!(name.starts_with("demo-pool-"), "{name}");
        assert_eq!(bottle_core::slug::slugify(&name).unwrap(), name);
        let long = entry_name(&"a".repeat(60)).unwrap();
        assert_eq!(long.len(), bottle_core::slug::MAX_SLUG_LEN);
        assert_eq!(bottle_core::slug::slugify(&long).unwrap(), long);
        assert_ne!(entry_name("demo").unwrap(), entry_name("demo").unwrap());
    }

    /// The bottle network, bundle and agent of `config::tests::sample_plan`
    /// as a launch leaves them.
    fn launched() -> (
        bollard::models::NetworkInspect,
        ContainerInspectResponse,
        ContainerInspectResponse,
    ) {
        use bollard::models::{EndpointSettings, HostConfig, Ipam, IpamConfig, NetworkSettings};
        let network = bollard::models::NetworkInspect {
            internal: Some(true),
            options: Some(std::collections::HashMap::from([(
                crate::config::OPT_INHIBIT_IPV4.to_string(),
                "true".to_string(),
            )])),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some("192.168.40.0/24".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let on = |pairs: &[(&str, &str)]| {
            Some(NetworkSettings {
                networks: Some(
                    pairs
                        .iter()
                        .map(|(name, ip)| {
                            (
                                name.to_string(),
                                EndpointSettings {
                                    ip_address: Some(ip.to_string()),
                                    ..Default::default()
                                },
                            )
                        })
                        .collect(),
                ),
                ..Default::default()
            })
        };
        let bundle = ContainerInspectResponse {
            network_settings: on(&[
                ("bot-bottle-demo", "192.168.40.2"),
                (crate::names::EGRESS_NETWORK, "172.30.0.5"),
            ]),
            ..Default::default()
        };
        let agent = ContainerInspectResponse {
            state: Some(bollard::models::ContainerState {
                running: Some(true),
                ..Default::default()
            }),
            network_settings: on(&[("bot-bottle-demo", "192.168.40.3")]),
            host_config: Some(HostConfig {
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        (network, agent, bundle)
    }

    #[test]
    fn a_claim_refuses_what_a_launch_would_refuse() {
        let plan = crate::config::tests::sample_plan();
        let check = |network: &bollard::models::NetworkInspect,
                     agent: &ContainerInspectResponse,
                     bundle: &ContainerInspectResponse| {
            isolated_as_launched(&plan, "bot-bottle-demo", network, agent, bundle)
        };
        let (network, agent, bundle) = launched();
        assert_eq!(check(&network, &agent, &bundle), Ok(()));

        let mut open = network.clone();
        open.internal = Some(false);
        assert!(
            check(&open, &agent, &bundle)
                .unwrap_err()
                .contains("not internal")
        );

        let mut moved = agent.clone();
        if let Some(networks) = moved
            .network_settings
            .as_mut()
            .and_then(|n| n.networks.as_mut())
        {
            networks.insert(crate::names::EGRESS_NETWORK.into(), Default::default());
        }
        assert!(
            check(&network, &moved, &bundle)
                .unwrap_err()
                .contains("not only")
        );

        let mut privileged = agent.clone();
        if let Some(host) = privileged.host_config.as_mut() {
            host.cap_drop = Some(vec![]);
        }
        assert!(
            check(&network, &privileged, &bundle)
                .unwrap_err()
                .contains("capabilities")
        );

        let (_, _, mut cut_off) = launched();
        if let Some(networks) = cut_off
            .network_settings
            .as_mut()
            .and_then(|n| n.networks.as_mut())
        {
            networks.remove(crate::names::EGRESS_NETWORK);
        }
        assert!(
            check(&network, &agent, &cut_off)
                .unwrap_err()
                .contains("egress")
        );
    }

    #[test]
    fn only_ready_entries_with_a_record_are_claimable_and_listed_by_state() {
        let root = tempfile::tempdir().unwrap();
        let write = |slug: &str, agent: &str, ready: bool| {
            let dir = root.path().join(slug);
            let mut record = crate::pool_entry::tests::record();
            record.agent = agent.into();
            data::write_file(
                &dir.join(RECORD),
                &serde_json::to_vec(&record).unwrap(),
                0o600,
            )
            .unwrap();
            if ready {
                data::write_file(&dir.join(READY), b"", 0o600).unwrap();
            } else {
                data::write_file(&dir.join(CLAIMED), b"{}", 0o600).unwrap();
            }
        };
        write("demo-pool-1", "demo", true);
        write("demo-pool-2", "demo", false);
        write("other-pool-1", "other", true);
        std::fs::create_dir_all(root.path().join("plain")).unwrap();
        let ready: Vec<String> = ready_entries(root.path(), Some("demo"))
            .into_iter()
            .map(|(dir, _)| dir.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(ready, ["demo-pool-1"]);
        assert_eq!(ready_entries(root.path(), None).len(), 2);
        let listed: Vec<(String, String)> = list(root.path())
            .into_iter()
            .map(|e| (e.name, e.state))
            .collect();
        assert_eq!(
            listed,
            [
                ("bot-bottle-demo-pool-1".into(), "ready".into()),
                ("bot-bottle-demo-pool-2".into(), "claimed".into()),
                ("bot-bottle-other-pool-1".into(), "ready".into()),
            ]
        );
    }
}
