//! The docker backend's warm pool ([`WarmPool`]): what a docker bottle's
//! fingerprint covers, what is recorded of both containers at fill
//! ([`DockerPoolFacts`]), and the claim's docker checks. The entries'
//! files, the claim and the drain are [`bottle_core::pool`]'s.
//!
//! A claim is refused, and the entry removed, when the fingerprint differs
//! (the manifest, an image, a binary or a credential changed), when either
//! container restarted or stopped, when the bundle's Engine facts (its
//! networks and addresses among them) or the agent's three reset sources
//! differ from what was recorded, or when the bundle does not answer its
//! health check.

use std::path::Path;

use bollard::models::ContainerInspectResponse;
use bottle_core::BottleSpec;
use bottle_core::backend::{BackendError, BackendKind, Bottle, CleanupReport};
use bottle_core::plan::PlannedDevice;
use bottle_core::pool::{
    Claim, Fingerprint, PoolHost, PoolRecord, WarmPool, credentials_key, mark_ready,
};
use bottle_core::sandbox::reset::{check_against_baseline, divergence};
use bottle_core::sandbox::{ResetFiles, Source};
use bottle_core::slug::slug_of;

use crate::backend::{DockerBackend, credential_refs, upstream_ca_files};
use crate::bottle::exec_captured;
use crate::client::Engine;
use crate::config::BUNDLE_BINARY_PATH;
use crate::data::{self, DockerPlan, STATE_LAYOUT_VERSION, StatePaths};
use crate::error::DockerError;
use crate::isolation;
use crate::lifecycle;
use crate::names::ResourceNames;
use crate::pool_entry::{
    DockerPoolFacts, bundle_standing, inspect_both, lives_as_filled, start_facts,
};
use crate::reset::DockerResetSubstrate;

impl WarmPool for DockerBackend {
    /// What every backend's bottle is made from
    /// ([`Fingerprint::spec`]), the state layout, the agent image's ID, the
    /// in-box agent binary, the keep-alive, and the bundle's inputs
    /// (`bundle_fingerprint`, which a microVM's bundle host adds too).
    fn pool_fingerprint(
        &self,
        spec: &BottleSpec,
        devices: &[PlannedDevice],
    ) -> Result<String, BackendError> {
        let engine = self.engine()?;
        let mut fingerprint = Fingerprint::new();
        fingerprint.field("state-layout", &STATE_LAYOUT_VERSION.to_le_bytes());
        fingerprint.spec(spec, devices)?;
        let (_, image) = self.agent_image(engine, spec)?;
        fingerprint.field("image", image.id.as_bytes());
        let toolbox_places = bottle_core::bundle_binary::toolbox_places();
        if let Some(toolbox) = bottle_core::bundle_binary::first_file(&toolbox_places) {
            fingerprint.file("toolbox-binary", toolbox)?;
        }
        fingerprint.field(
            "keep-alive",
            &crate::pause::pause_elf(std::env::consts::ARCH).unwrap_or_default(),
        );
        bundle_fingerprint(self, spec, &mut fingerprint)?;
        Ok(fingerprint.finish())
    }

    /// Records both containers as they stand now. Refuses a bottle without
    /// a reset baseline: a claim could not check its three sources.
    fn mark_pooled(&self, plan: &DockerPlan, fingerprint: &str) -> Result<(), BackendError> {
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
        let facts = DockerPoolFacts {
            agent_start: start_facts(&agent),
            bundle: bundle_standing(&bundle),
        };
        let record = PoolRecord::new(&plan.agent, fingerprint, &facts)?;
        Ok(mark_ready(&plan.state_dir, &record)?)
    }

    fn claim_pooled(
        &self,
        agent: &str,
        fingerprint: &str,
        detached: bool,
    ) -> Result<Claim<DockerPlan>, BackendError> {
        let host = DockerPoolHost {
            backend: self,
            engine: self.engine()?,
        };
        let state_root = &self.options().state_root;
        Ok(bottle_core::pool::claim(
            &host,
            state_root,
            agent,
            fingerprint,
            detached,
        )?)
    }

    fn drain_pool(&self, agent: Option<&str>) -> Result<CleanupReport, BackendError> {
        let host = DockerPoolHost {
            backend: self,
            engine: self.engine()?,
        };
        bottle_core::pool::drain(&host, &self.options().state_root, agent)
    }
}

/// The docker side of a claim.
struct DockerPoolHost<'a> {
    backend: &'a DockerBackend,
    engine: &'a Engine,
}

impl PoolHost for DockerPoolHost<'_> {
    type Plan = DockerPlan;

    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    fn recheck(&self, dir: &Path, record: &PoolRecord) -> Result<DockerPlan, String> {
        let facts = record
            .facts::<DockerPoolFacts>(dir)
            .map_err(|err| err.to_string())?;
        recheck(self.engine, dir, &facts, self.backend.health_timeout())
    }

    fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError> {
        Ok(Box::new(self.backend.attach_bottle(name)?))
    }

    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        Ok(lifecycle::stop(
            self.engine,
            &self.backend.options().state_root,
            slug_of(name),
        )?)
    }
}

/// The claim's docker checks of one entry (whose layout, fingerprint and
/// halt [`bottle_core::pool::claim`] checked), each failing with why; its
/// plan when every one passed.
fn recheck(
    engine: &Engine,
    dir: &Path,
    facts: &DockerPoolFacts,
    health_timeout: std::time::Duration,
) -> Result<DockerPlan, String> {
    let files = ResetFiles::new(dir);
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
    lives_as_filled(facts, &agent, &bundle)?;
    isolated_as_launched(&plan, &names.network, &network, &agent, &bundle)?;
    let substrate = DockerResetSubstrate::new(
        engine.clone(),
        &names.bottle,
        &names.agent,
        &names.bundle,
        dir,
        crate::data::gvisor_binary_of(&plan).map_err(|e| e.to_string())?,
    );
    let diverged = divergence(&check_against_baseline(&substrate, &files, &Source::ALL));
    if !diverged.is_empty() {
        return Err(format!(
            "the agent's box differs from its snapshot ({diverged})"
        ));
    }
    bundle_answers(
        engine,
        &names.bundle,
        plan.backend_data.bundle.ip,
        health_timeout,
    )?;
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
        crate::launch::BundleComponent::BESIDE_CONTAINER.host_on_bridge,
    )?;
    isolation::check_bundle(network_name, bundle, data.bundle.ip)?;
    isolation::check_agent(network_name, agent, data.agent.ip)?;
    if let Some(binary) = crate::data::gvisor_binary_of(plan).map_err(|e| e.to_string())? {
        let runtime = data.agent.runtime.as_deref().unwrap_or_default();
        crate::gvisor::check_host_side(agent, runtime, &binary)?;
    }
    Ok(())
}

/// One health probe of the bundle's proxy, from inside the bundle
/// container `bundle`, at the address `ip` the plan pinned.
pub(crate) fn bundle_answers(
    engine: &Engine,
    bundle: &str,
    ip: std::net::Ipv4Addr,
    timeout: std::time::Duration,
) -> Result<(), String> {
    let addr = format!("{ip}:{}", bottle_core::bundle::PROXY_PORT);
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

/// Adds what a bundle of `spec` is made from to `fingerprint`: the
/// bundle binary (by identity), the upstream CAs' contents, and an HMAC of
/// the credentials' values (keyed by a secret of the state root, so the
/// record does not let anyone test guesses). A docker bottle's bundle and
/// a microVM's alike.
pub(crate) fn bundle_fingerprint(
    backend: &DockerBackend,
    spec: &BottleSpec,
    fingerprint: &mut Fingerprint,
) -> Result<(), DockerError> {
    let bundle = crate::images::find_bundle_binary(backend.options().bundle_bin.as_deref())?;
    fingerprint.file("bundle-binary", &bundle)?;
    for ca in upstream_ca_files(spec, Path::new("/"))? {
        fingerprint.contents("upstream-ca", &ca)?;
    }
    let key = credentials_key(&backend.options().state_root)?;
    for credential in credential_refs(spec) {
        let value = match (&credential.file, &credential.env) {
            (Some(file), _) => std::fs::read(file).map_err(DockerError::io("read", file))?,
            (None, Some(var)) => std::env::var(var).unwrap_or_default().into_bytes(),
            (None, None) => Vec::new(),
        };
        fingerprint.credential(&key, &value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
