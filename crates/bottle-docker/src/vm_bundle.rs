//! The docker side of a microVM bottle: [`DockerBundleHost`] runs its
//! sidecar bundle as a container ([`bottle_core::bundle_host::BundleHost`]),
//! and [`EngineImages`] hands its agent image over
//! ([`bottle_core::images::ImageStore`]). The smolmachines backend reaches
//! both only through those traits; the CLI composes them.
//!
//! The bundle is launched by [`launch::launch_bundle`] as
//! [`launch::BundleComponent::FOR_MICROVM`]: the same steps, undo and
//! failpoints as a docker bottle's bundle, up to `bundle-health`. Its
//! network differs in one way. smolvm dials the guest's traffic from the
//! host, so the host needs an address on the bottle's bridge: the gateway
//! `.1`, from which it reaches the bundle at `.2`
//! ([`crate::config::bottle_network`] with `HostOnBridge::Gateway`). The bridge stays `internal` (no
//! route off it, no NAT), no other container joins it, and the guest's
//! allowlist is `.2/32` alone, so the guest cannot reach the host's `.1`;
//! the bundle's only way out is still the shared egress network.
//!
//! The bundle's files live in the bottle's state dir in the docker layout
//! (`ca/`, `logs/`, `stage/`, `owner.json`), next to the smolmachines
//! backend's own files, so `bottle logs` reads the same path on both
//! backends; [`data::remove_bundle_files`] removes exactly these.
//!
//! Everything carries [`MANAGED_FOR_VM`] instead of `bottle.managed=1`: the
//! docker backend's `list`, `stop` and `cleanup` never touch a microVM's
//! bundle, and this host touches nothing else.

use std::collections::BTreeMap;
use std::path::Path;

use bottle_core::backend::{BackendError, CleanupReport};
use bottle_core::bundle_host::{BundleEndpoint, BundleHost, PreparedBundle};
use bottle_core::images::{AgentImage, ImageStore};
use bottle_core::pool::Fingerprint;
use bottle_core::slug::slug_of;
use bottle_core::{BottleSpec, Plan};
use futures_util::StreamExt as _;

use crate::backend::{DockerBackend, DockerOptions};
use crate::client::Engine;
use crate::data::{self, BundleData, StatePaths};
use crate::error::DockerError;
use crate::launch;
use crate::lifecycle;
use crate::names::{
    EGRESS_NETWORK, LABEL_MANAGED, LABEL_NAME, LABEL_SLUG, LABEL_STATE_DIR, MANAGED_FOR_VM,
    ResourceNames,
};
use bottle_core::launch_steps::LaunchStep as _;

/// Runs microVM bottles' bundles on the Docker Engine.
#[derive(Debug)]
pub struct DockerBundleHost {
    backend: DockerBackend,
}

impl DockerBundleHost {
    /// A host with the docker backend's `options` (state root, bundle
    /// binary, progress, daemon, health timeout, failpoint). Does not
    /// contact the daemon yet.
    pub fn new(mut options: DockerOptions) -> Result<DockerBundleHost, BackendError> {
        // A failpoint naming no step of a bundle's own launch (a step of
        // the microVM's, say) is not this host's: the microVM backend
        // checks the name against both and fires its own.
        let value = match &options.failpoint {
            Some(value) => value.clone(),
            None => std::env::var(launch::FAILPOINT_ENV).unwrap_or_default(),
        };
        let ours = matches!(
            launch::Failpoint::parse(&value),
            Ok(Some(failpoint)) if launch::BUNDLE_STEPS.contains(&failpoint.step)
        );
        options.failpoint = Some(if ours { value } else { String::new() });
        Ok(DockerBundleHost {
            backend: DockerBackend::new(options)?,
        })
    }

    fn engine(&self) -> Result<&Engine, DockerError> {
        self.backend.engine()
    }

    fn prepare_inner(&self, spec: &BottleSpec) -> Result<PreparedBundle<BundleData>, DockerError> {
        // The smolmachines backend decides when the bundle goes.
        let (bundle, _) = self.backend.prepare_bundle(spec, true)?;
        let lines = vec![(
            "bundle".to_string(),
            format!(
                "{} at {} ({}) on {} ({}, internal; the host holds {} there so smolvm can dial the bundle), also on {EGRESS_NETWORK}",
                bundle.container,
                bundle.ip,
                bundle.image,
                bundle.network,
                bundle.subnet,
                bundle.gateway
            ),
        )];
        Ok(PreparedBundle {
            address: bundle.ip,
            lines,
            data: bundle,
        })
    }

    fn start_inner<D>(
        &self,
        plan: &Plan<D>,
        bundle: &BundleData,
    ) -> Result<BundleEndpoint, DockerError> {
        let engine = self.engine()?;
        launch::launch_bundle(
            engine,
            &self.backend.launch_settings()?,
            plan,
            bundle,
            launch::BundleComponent::FOR_MICROVM,
        )?;
        Ok(BundleEndpoint {
            address: bundle.ip,
            ca_cert: StatePaths::new(&plan.state_dir).ca_cert(),
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
            &self.backend.options().state_root,
            &slug,
        );
        lifecycle::remove_resources(engine, &containers, &networks, &mut report);
        for dir in state_dirs {
            // A label is not proof enough to delete a path: only a dir
            // named after the slug.
            if dir.file_name().and_then(|n| n.to_str()) != Some(slug.as_str()) {
                continue;
            }
            lifecycle::record_removal(
                &mut report,
                format!("bundle files in {}", dir.display()),
                data::remove_bundle_files(&dir),
            );
        }
        Ok(report)
    }

    fn bottles_inner(&self) -> Result<Vec<String>, DockerError> {
        let engine = self.engine()?;
        let pairs = [(LABEL_MANAGED, MANAGED_FOR_VM)];
        // This install's alone: a bundle whose state dir is under another
        // state root belongs to another install on this host.
        let root = &self.backend.options().state_root;
        let mut names: Vec<String> = lifecycle::labelled_containers(engine, &pairs)?
            .into_iter()
            .chain(lifecycle::labelled_networks(engine, &pairs)?)
            .filter(|r| {
                r.labels
                    .get(LABEL_STATE_DIR)
                    .map(Path::new)
                    .and_then(Path::parent)
                    .is_some_and(|parent| parent == root)
            })
            .filter_map(|r| r.labels.get(LABEL_NAME).cloned())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

impl BundleHost for DockerBundleHost {
    type Prepared = BundleData;

    fn prepare(&self, spec: &BottleSpec) -> Result<PreparedBundle<BundleData>, BackendError> {
        Ok(self.prepare_inner(spec)?)
    }

    fn launch_steps(&self) -> Vec<&'static str> {
        launch::BUNDLE_STEPS
            .iter()
            .map(|step| step.name())
            .collect()
    }

    fn start<D>(
        &self,
        plan: &Plan<D>,
        prepared: &BundleData,
    ) -> Result<BundleEndpoint, BackendError> {
        Ok(self.start_inner(plan, prepared)?)
    }

    fn stop(&self, bottle: &str) -> Result<CleanupReport, BackendError> {
        Ok(self.stop_inner(bottle)?)
    }

    fn bottles(&self) -> Result<Vec<String>, BackendError> {
        Ok(self.bottles_inner()?)
    }

    fn standing(&self, bottle: &str) -> Result<BTreeMap<String, String>, BackendError> {
        let engine = self.engine()?;
        let container = ResourceNames::for_slug(slug_of(bottle)).bundle;
        let inspect = engine
            .block_on(engine.docker.inspect_container(&container, None))
            .map_err(DockerError::api(format!("inspect container {container}")))?;
        Ok(crate::pool_entry::bundle_standing(&inspect))
    }

    fn answers(&self, bottle: &str, prepared: &BundleData) -> Result<(), String> {
        let engine = self.engine().map_err(|err| err.to_string())?;
        if prepared.container != ResourceNames::for_slug(slug_of(bottle)).bundle {
            return Err(format!("{} is not {bottle}'s bundle", prepared.container));
        }
        crate::pool::bundle_answers(
            engine,
            &prepared.container,
            prepared.ip,
            self.backend.health_timeout(),
        )
    }

    fn fingerprint(
        &self,
        spec: &BottleSpec,
        fingerprint: &mut Fingerprint,
    ) -> Result<(), BackendError> {
        Ok(crate::pool::bundle_fingerprint(
            &self.backend,
            spec,
            fingerprint,
        )?)
    }
}

/// Agent images from the Docker Engine, for a backend that packs them
/// itself.
#[derive(Debug)]
pub struct EngineImages {
    backend: DockerBackend,
}

impl EngineImages {
    /// Images from the daemon `options` name.
    pub fn new(options: DockerOptions) -> Result<EngineImages, BackendError> {
        Ok(EngineImages {
            backend: DockerBackend::new(options)?,
        })
    }

    fn inspect_inner(&self, reference: &str) -> Result<AgentImage, DockerError> {
        let image = crate::images::inspect_raw(self.backend.engine()?, reference)?;
        let Some(id) = image.id else {
            return Err(DockerError::ImageNotFound {
                reference: reference.to_string(),
            });
        };
        let config = image.config.unwrap_or_default();
        Ok(AgentImage {
            reference: reference.to_string(),
            id,
            entrypoint: config.entrypoint.unwrap_or_default(),
            cmd: config.cmd.unwrap_or_default(),
        })
    }

    /// Writes the engine's `docker save` export of `id` to `dest`.
    fn export_inner(&self, id: &str, dest: &Path) -> Result<(), DockerError> {
        use std::io::Write as _;
        let engine = self.backend.engine()?;
        let mut file = std::fs::File::create(dest).map_err(DockerError::io("create", dest))?;
        engine.block_on(async {
            let mut stream = engine.docker.export_image(id);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(DockerError::api(format!("export image {id}")))?;
                file.write_all(&chunk)
                    .map_err(DockerError::io("write", dest))?;
            }
            file.sync_all().map_err(DockerError::io("write", dest))
        })
    }
}

impl ImageStore for EngineImages {
    fn inspect(&self, reference: &str) -> Result<AgentImage, BackendError> {
        Ok(self.inspect_inner(reference)?)
    }

    fn export(&self, id: &str, dest: &Path) -> Result<(), BackendError> {
        Ok(self.export_inner(id, dest)?)
    }
}
