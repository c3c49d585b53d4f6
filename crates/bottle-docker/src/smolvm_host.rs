//! The docker side of the smolmachines backend: [`DockerBundleHost`] runs a
//! microVM bottle's sidecar bundle as a container
//! ([`bottle_smolvm::BundleHost`]), and [`EngineImages`] turns agent images
//! into `.smolmachine`s ([`bottle_smolvm::pack::ImageSource`]), both over
//! this crate's [`Engine`] (API version negotiated down to the daemon's).
//!
//! The bundle is launched by [`launch::launch_bundle`]: the same steps,
//! undo and failpoints as a docker bottle, up to `bundle-health`. Its
//! network differs in one way. smolvm dials the guest's traffic from the
//! host (see `bottle_smolvm::bundle_host`), so the host needs an address on
//! the bottle's bridge: the gateway `.1`, from which it reaches the bundle
//! at `.2`. The bridge stays `internal` (no route off it, no NAT), no other
//! container joins it, and the guest's allowlist is `.2/32` alone, so the
//! guest cannot reach the host's `.1`; the bundle's only way out is still
//! the shared egress network.
//!
//! The bundle's files live in the bottle's state dir in the docker layout
//! (`ca/`, `logs/`, `stage/`, `owner.json`), next to the smolmachines
//! backend's own files, so `bottle logs` reads the same path on both
//! backends; [`remove_bundle_files`] removes exactly these.
//!
//! Everything carries [`MANAGED_FOR_VM`] instead of `bottle.managed=1`: the
//! docker backend's `list`, `stop` and `cleanup` never touch a microVM's
//! bundle, and this host touches nothing else.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bollard::models::NetworkCreateRequest;
use bottle_core::backend::{BackendError, CleanupReport};
use bottle_core::slug::slug_of;
use bottle_core::{BottleSpec, Plan};
use bottle_smolvm::pack::{AgentImage, ImageSource, cache_entry, pack_archive};
use bottle_smolvm::{BundleEndpoint, BundleHost, BundlePlan, Smolvm, SmolvmError};
use futures_util::StreamExt as _;

use crate::backend::{DockerBackend, DockerOptions, choose_subnet, credential_refs, git_refs};
use crate::client::Engine;
use crate::config::{self, OPT_INHIBIT_IPV4};
use crate::data::{self, DockerPlanData, STATE_LAYOUT_VERSION, StatePaths};
use crate::error::{DockerError, is_not_found};
use crate::images;
use crate::launch::{self, Failpoint, LaunchSettings};
use crate::lifecycle;
use crate::names::{
    EGRESS_NETWORK, LABEL_MANAGED, LABEL_NAME, LABEL_SLUG, MANAGED_FOR_VM, ResourceNames,
};

/// The entries of a bottle's state dir that a bundle-only launch writes.
const BUNDLE_FILES: [&str; 6] = ["owner.json", "launched", "ca", "logs", "stage", "requests"];

/// The bottle network of a microVM's bundle: [`config::internal_network`]
/// (internal, no NAT) except that the host keeps its gateway address on
/// the bridge, so smolvm can dial the bundle from the host.
pub fn vm_bundle_network(
    name: &str,
    subnet: &str,
    gateway: Ipv4Addr,
    labels: HashMap<String, String>,
) -> NetworkCreateRequest {
    let mut request = config::internal_network(name, subnet, gateway, labels);
    if let Some(options) = request.options.as_mut() {
        options.remove(OPT_INHIBIT_IPV4);
    }
    request
}

/// Removes what a bundle-only launch wrote into the state dir `dir`, and
/// `dir` itself if nothing else is left in it. `Ok(true)` if anything was
/// removed.
pub fn remove_bundle_files(dir: &Path) -> Result<bool, DockerError> {
    let mut removed = false;
    for name in BUNDLE_FILES {
        let path = dir.join(name);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(DockerError::io("inspect", &path)(err)),
        };
        let result = if meta.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => removed = true,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(DockerError::io("remove", &path)(err)),
        }
    }
    // Only an empty dir goes: the rest belongs to the smolmachines backend.
    let _ = std::fs::remove_dir(dir);
    Ok(removed)
}

/// Writes the bundle's CA and, for the operator to read, its config into
/// the state dir. Done at launch, not at prepare, so a declined plan leaves
/// nothing behind.
pub(crate) fn write_stage(
    paths: &StatePaths,
    plan: &Plan,
    data: &DockerPlanData,
) -> Result<(), DockerError> {
    let ca = bottle_bundle_files::generate_ca(&plan.bottle).map_err(|err| DockerError::Ca {
        detail: err.to_string(),
    })?;
    data::write_file(&paths.ca_cert(), ca.cert_pem.as_bytes(), 0o644)?;
    data::write_file(&paths.ca_key(), ca.key_pem.as_bytes(), 0o600)?;
    let config = serde_json::to_vec_pretty(&config::bundle_config(plan, data)).map_err(|err| {
        DockerError::PlanData {
            detail: err.to_string(),
        }
    })?;
    data::write_file(&paths.bundle_config(), &config, 0o600)
}

/// Runs microVM bottles' bundles on the Docker Engine.
#[derive(Debug)]
pub struct DockerBundleHost {
    backend: DockerBackend,
}

impl DockerBundleHost {
    /// A host with the docker backend's `options` (state root, bundle
    /// binary, progress, daemon, health timeout, failpoint). Does not
    /// contact the daemon yet.
    pub fn new(options: DockerOptions) -> Result<DockerBundleHost, BackendError> {
        Ok(DockerBundleHost {
            backend: DockerBackend::new(options)?,
        })
    }

    fn engine(&self) -> Result<&Engine, DockerError> {
        self.backend.engine()
    }

    fn options(&self) -> &DockerOptions {
        self.backend.options()
    }

    fn prepare_inner(&self, spec: &BottleSpec) -> Result<BundlePlan, DockerError> {
        let engine = self.engine()?;
        if lifecycle::bottle_resources_exist(engine, &spec.slug)? {
            return Err(DockerError::AlreadyExists {
                name: spec.name.clone(),
            });
        }
        let options = self.options();
        let bundle_bin = images::find_bundle_binary(options.bundle_bin.as_deref())?;
        // git-gate runs the host's git: only bottles with repositories
        // need it (as in the docker backend's prepare).
        let git_files = if spec.agent.git.is_empty() {
            Vec::new()
        } else {
            images::git_runtime_files(&bottle_core::exec::SystemRunner)?
        };
        let bundle_image = images::ensure_bundle_image(
            engine,
            &bundle_bin,
            &git_files,
            options.progress.as_ref(),
        )?;
        let subnet = choose_subnet(engine, &spec.slug)?;
        let names = ResourceNames::for_slug(&spec.slug);
        let data = DockerPlanData {
            version: STATE_LAYOUT_VERSION,
            network: names.network.clone(),
            subnet: subnet.network.to_string(),
            gateway: subnet.gateway,
            bundle_ip: subnet.bundle_ip,
            agent_ip: subnet.agent_ip,
            bundle_container: names.bundle.clone(),
            agent_container: names.agent.clone(),
            bundle_image: bundle_image.clone(),
            // The agent is the microVM; no agent container is made.
            agent_image_id: String::new(),
            agent_image_ref: String::new(),
            agent_user: String::new(),
            default_command: Vec::new(),
            arch: String::new(),
            dns_upstream: subnet.bundle_ip,
            env: Default::default(),
            credentials: credential_refs(spec),
            prompt: None,
            skills: Vec::new(),
            git: git_refs(spec),
            // The smolmachines backend decides when the bundle goes.
            detached: true,
            bundle_user: (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            ),
        };
        let lines = vec![(
            "bundle".to_string(),
            format!(
                "{} at {} ({bundle_image}) on {} ({}, internal; the host holds {} there so smolvm can dial the bundle), also on {EGRESS_NETWORK}",
                data.bundle_container, data.bundle_ip, data.network, data.subnet, data.gateway
            ),
        )];
        Ok(BundlePlan {
            lines,
            address: Some(data.bundle_ip),
            data: serde_json::to_value(&data).map_err(|err| DockerError::PlanData {
                detail: err.to_string(),
            })?,
        })
    }

    fn start_inner(
        &self,
        plan: &Plan,
        prepared: &BundlePlan,
    ) -> Result<BundleEndpoint, DockerError> {
        let engine = self.engine()?;
        // The bundle's own plan: the docker section this host prepared.
        let mut bundle_plan = plan.clone();
        bundle_plan.backend = bottle_core::BackendKind::Docker;
        bundle_plan.backend_data = prepared.data.clone();
        let data = DockerPlanData::from_plan(&bundle_plan)?;
        let options = self.options();
        let settings = LaunchSettings {
            progress: options.progress.clone(),
            health_timeout: options.health_timeout,
            failpoint: match &options.failpoint {
                Some(value) => Failpoint::parse(value)?,
                None => Failpoint::from_env()?,
            },
        };
        launch::launch_bundle(engine, &settings, &bundle_plan)?;
        let config = config::bundle_config(&bundle_plan, &data);
        Ok(BundleEndpoint {
            address: data.bundle_ip,
            ca_cert: StatePaths::new(&plan.state_dir).ca_cert(),
            git_gate: config.git_gate_listen.is_some(),
            supervise: config.supervise_listen.is_some(),
        })
    }

    fn stop_inner(&self, bottle: &str) -> Result<CleanupReport, DockerError> {
        let engine = self.engine()?;
        let slug = slug_of(bottle).to_string();
        let pairs = [(LABEL_MANAGED, MANAGED_FOR_VM), (LABEL_SLUG, slug.as_str())];
        let containers = lifecycle::labelled_containers(engine, &pairs)?;
        let networks = lifecycle::labelled_networks(engine, &pairs)?;
        let mut report = CleanupReport::default();
        let state_dirs = lifecycle::labelled_state_dirs(
            &containers,
            &networks,
            &self.options().state_root,
            &slug,
        );
        lifecycle::remove_resources(engine, &containers, &networks, &mut report);
        for dir in state_dirs {
            // A label is not proof enough to delete a path: only a dir
            // named after the slug.
            if dir.file_name().and_then(|n| n.to_str()) != Some(slug.as_str()) {
                continue;
            }
            match remove_bundle_files(&dir) {
                Ok(true) => report
                    .removed
                    .push(format!("bundle files in {}", dir.display())),
                Ok(false) => {}
                Err(err) => report.failed.push(err.message()),
            }
        }
        lifecycle::remove_egress_into(engine, &mut report);
        Ok(report)
    }

    fn bottles_inner(&self) -> Result<Vec<String>, DockerError> {
        let engine = self.engine()?;
        let pairs = [(LABEL_MANAGED, MANAGED_FOR_VM)];
        let mut names: Vec<String> = lifecycle::labelled_containers(engine, &pairs)?
            .into_iter()
            .chain(lifecycle::labelled_networks(engine, &pairs)?)
            .filter_map(|r| r.labels.get(LABEL_NAME).cloned())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

impl BundleHost for DockerBundleHost {
    fn prepare(&self, spec: &BottleSpec, _plan: &Plan) -> Result<BundlePlan, BackendError> {
        Ok(self.prepare_inner(spec)?)
    }

    fn start(&self, plan: &Plan, prepared: &BundlePlan) -> Result<BundleEndpoint, BackendError> {
        Ok(self.start_inner(plan, prepared)?)
    }

    fn stop(&self, bottle: &str) -> Result<CleanupReport, BackendError> {
        Ok(self.stop_inner(bottle)?)
    }

    fn bottles(&self) -> Result<Vec<String>, BackendError> {
        Ok(self.bottles_inner()?)
    }
}

/// Agent images from the Docker Engine, packed into `.smolmachine`s
/// through `bottle_smolvm::pack` and cached by image ID.
#[derive(Debug)]
pub struct EngineImages {
    backend: DockerBackend,
    cache_dir: PathBuf,
}

impl EngineImages {
    /// Images from the daemon `options` name, cached under `cache_dir`.
    pub fn new(options: DockerOptions, cache_dir: PathBuf) -> Result<EngineImages, BackendError> {
        Ok(EngineImages {
            backend: DockerBackend::new(options)?,
            cache_dir,
        })
    }

    /// Writes the engine's `docker save` export of `reference` to `dest`.
    fn export(&self, reference: &str, dest: &Path) -> Result<(), DockerError> {
        use std::io::Write as _;
        let engine = self.backend.engine()?;
        let mut file = std::fs::File::create(dest).map_err(DockerError::io("create", dest))?;
        engine.block_on(async {
            let mut stream = engine.docker.export_image(reference);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(DockerError::api(format!("export image {reference}")))?;
                file.write_all(&chunk)
                    .map_err(DockerError::io("write", dest))?;
            }
            file.sync_all().map_err(DockerError::io("write", dest))
        })
    }
}

fn external(err: DockerError) -> SmolvmError {
    SmolvmError::External(err.into())
}

impl ImageSource for EngineImages {
    fn inspect(&self, reference: &str) -> Result<AgentImage, SmolvmError> {
        let engine = self.backend.engine().map_err(external)?;
        let image = engine
            .block_on(engine.docker.inspect_image(reference))
            .map_err(|err| {
                external(if is_not_found(&err) {
                    DockerError::ImageNotFound {
                        reference: reference.to_string(),
                    }
                } else {
                    DockerError::api(format!("inspect image {reference}"))(err)
                })
            })?;
        let id = image.id.ok_or_else(|| SmolvmError::ImageArchive {
            detail: format!("the engine reported no ID for {reference}"),
        })?;
        let config = image.config.unwrap_or_default();
        Ok(AgentImage {
            reference: reference.to_string(),
            id,
            entrypoint: config.entrypoint.unwrap_or_default(),
            cmd: config.cmd.unwrap_or_default(),
        })
    }

    fn cached(&self, image: &AgentImage) -> Option<PathBuf> {
        Some(cache_entry(&self.cache_dir, image)).filter(|p| p.is_file())
    }

    fn smolmachine(&self, image: &AgentImage, smolvm: &Smolvm) -> Result<PathBuf, SmolvmError> {
        if let Some(hit) = self.cached(image) {
            return Ok(hit);
        }
        data::create_private_dir(&self.cache_dir).map_err(external)?;
        let staging = Staging::new(&self.cache_dir).map_err(external)?;
        let archive = staging.0.join("image.tar");
        self.export(&image.id, &archive).map_err(external)?;
        pack_archive(
            &archive,
            image.id_hex(),
            &self.cache_dir,
            std::net::IpAddr::V4(Ipv4Addr::LOCALHOST),
            smolvm,
        )
    }
}

/// A directory for one export, removed on drop.
struct Staging(PathBuf);

impl Staging {
    fn new(cache_dir: &Path) -> Result<Staging, DockerError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = cache_dir.join(format!(".export-{}-{nanos}", std::process::id()));
        data::create_private_dir(&path)?;
        Ok(Staging(path))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_bundle_network_is_internal_and_gives_the_host_its_gateway() {
        let req = vm_bundle_network(
            "bot-bottle-demo",
            "192.168.40.0/24",
            Ipv4Addr::new(192, 168, 40, 1),
            HashMap::from([(LABEL_MANAGED.to_string(), MANAGED_FOR_VM.to_string())]),
        );
        assert_eq!(req.internal, Some(true));
        let options = req.options.unwrap();
        assert!(!options.contains_key(OPT_INHIBIT_IPV4), "{options:?}");
        assert_eq!(options[config::OPT_MASQUERADE], "false");
        let ipam = req.ipam.unwrap().config.unwrap();
        assert_eq!(ipam[0].subnet.as_deref(), Some("192.168.40.0/24"));
        assert_eq!(ipam[0].gateway.as_deref(), Some("192.168.40.1"));
        assert_eq!(req.labels.unwrap()[LABEL_MANAGED], MANAGED_FOR_VM);
    }

    #[test]
    fn only_the_bundle_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("demo");
        let paths = StatePaths::new(&root);
        data::write_file(&paths.ca_key(), b"k", 0o600).unwrap();
        data::write_file(&paths.bundle_config(), b"{}", 0o600).unwrap();
        data::create_private_dir(&paths.logs()).unwrap();
        std::fs::write(paths.logs().join("audit.jsonl"), b"{}\n").unwrap();
        std::fs::write(paths.owner(), b"{}").unwrap();
        std::fs::write(root.join("smolvm.json"), b"{}").unwrap();
        assert!(remove_bundle_files(&root).unwrap());
        let left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["smolvm.json"]);
        std::fs::remove_file(root.join("smolvm.json")).unwrap();
        assert!(!remove_bundle_files(&root).unwrap());
        assert!(!root.exists(), "an empty state dir goes too");
    }
}
