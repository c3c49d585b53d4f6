//! [`SmolvmBackend`]: the [`BottleBackend`] over the `smolvm` CLI, and
//! `prepare`, which resolves a spec into a plan the operator confirms.
//!
//! The rest of the backend is laid out like bottle-docker's: [`crate::launch`]
//! (the ordered launch steps and their unwinding), [`crate::lifecycle`]
//! (list, stop, cleanup), [`crate::bottle`] (exec, copy-in) and
//! [`crate::data`] (plan data, the state file). Every resource is named
//! `bot-bottle-<slug>`; `list` is `machine ls --json` filtered by that
//! prefix and cross-checked with the state files under
//! `<state root>/<slug>/smolvm.json`.

use std::path::PathBuf;
use std::sync::Arc;

use bottle_core::backend::{
    BackendError, BackendErrorKind, BackendKind, Bottle, BottleBackend, BottleInfo, BottleLauncher,
    CleanupItem, CleanupPass, CleanupReport, StopProgress,
};
use bottle_core::bundle_host::BundleHost;
use bottle_core::images::ImageStore;
use bottle_core::plan::Plan;
use bottle_core::slug::{RESOURCE_PREFIX, bottle_name, slug_of};
use bottle_core::spec::BottleSpec;

use crate::bottle::{SandboxPlace, SmolvmBottle};
use crate::bundle_address::validate_bundle_address;
use crate::cli::{MachineEntry, Smolvm};
pub use crate::data::PlanData;
use crate::data::{BottleState, PLAN_DATA_VERSION, STATE_FILE, read_state_file};
use crate::error::SmolvmError;
use crate::interactive::{InteractiveRunner, TerminalRunner};
use crate::pack::SmolmachineCache;
use crate::provision::ProvisionInputs;
use crate::statedb::{self, DataPlatform, EgressPolicy};
use crate::version::require_enforced;

/// Runs a host check (KVM and platform) and says why it failed.
pub type HostCheck = dyn Fn() -> Result<(), BackendError> + Send + Sync;

/// The smolmachines backend, running its bundles on `H`.
pub struct SmolvmBackend<H> {
    pub(crate) smolvm: Arc<Smolvm>,
    pub(crate) images: Arc<dyn ImageStore>,
    pub(crate) cache: SmolmachineCache,
    pub(crate) bundles: Arc<H>,
    state_root: PathBuf,
    db_path: Option<PathBuf>,
    pub(crate) host_check: Arc<HostCheck>,
    pub(crate) interactive: Arc<dyn InteractiveRunner>,
    /// The operator's ^C: a launch checks it between its steps.
    pub(crate) interrupt: bottle_core::undo::Interrupt,
    /// `bottle start --timings`: every launch step ends a lap.
    pub(crate) timeline: Option<bottle_core::timeline::Timeline>,
    /// A `BOTTLE_FAILPOINT` value given directly (tests), read instead of
    /// the environment.
    pub(crate) failpoint: Option<String>,
    /// Where to look for the static in-box agent put into every machine:
    /// the first file is read and checked at launch, not when the backend
    /// is built (none, or not static: the bottle runs without the sandbox
    /// interface).
    pub(crate) toolbox_places: Vec<PathBuf>,
}

/// A bottle of this backend as its state dir records it.
pub(crate) struct KnownBottle {
    /// The bottle's record.
    pub(crate) recorded: bottle_core::life::Recorded,
    /// Its state file, once the launch wrote it.
    pub(crate) state: Option<BottleState>,
}

impl KnownBottle {
    /// Its machine: named after the bottle.
    pub(crate) fn machine(&self) -> &str {
        &self.recorded.record.bottle
    }

    /// Where its guest reaches the bundle, once the launch knew.
    pub(crate) fn bundle_address(&self) -> Option<String> {
        self.state.as_ref()?.bundle_address.clone()
    }
}

impl<H> std::fmt::Debug for SmolvmBackend<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmolvmBackend")
            .field("smolvm", &self.smolvm)
            .field("state_root", &self.state_root)
            .field("db_path", &self.db_path)
            .finish_non_exhaustive()
    }
}

impl<H: BundleHost + 'static> SmolvmBackend<H> {
    /// A backend driving `smolvm`, taking agent images from `images` and
    /// packing them into `cache`, running bundles with `bundles`, keeping
    /// state under `state_root`. The host check defaults to
    /// [`crate::host::kvm_usable`].
    pub fn new(
        smolvm: Smolvm,
        images: Arc<dyn ImageStore>,
        cache: SmolmachineCache,
        bundles: Arc<H>,
        state_root: PathBuf,
    ) -> SmolvmBackend<H> {
        SmolvmBackend {
            smolvm: Arc::new(smolvm),
            images,
            cache,
            bundles,
            state_root,
            db_path: None,
            host_check: Arc::new(|| {
                crate::host::kvm_usable().map_err(|reason| {
                    BackendError::new(
                        BackendErrorKind::Preflight,
                        "BOT-K080",
                        reason,
                        "run `bottle doctor --backend smolmachines` for the steps",
                    )
                })
            }),
            interactive: Arc::new(TerminalRunner),
            interrupt: bottle_core::undo::Interrupt::default(),
            timeline: None,
            failpoint: None,
            toolbox_places: bottle_core::bundle_binary::toolbox_places(),
        }
    }

    /// Puts this in-box agent into every machine (`None`: none), instead of
    /// the one found where `bottle` looks for it.
    pub fn with_toolbox_binary(mut self, binary: Option<PathBuf>) -> SmolvmBackend<H> {
        self.toolbox_places = binary.into_iter().collect();
        self
    }

    /// Where the sandbox state of the bottle whose state is `state` lives.
    pub(crate) fn sandbox_place(&self, state: &BottleState) -> Result<SandboxPlace, SmolvmError> {
        let policy = match state.bundle_address.as_deref().map(str::parse) {
            Some(Ok(address)) => EgressPolicy::one_address(address),
            // No known bundle: no allowlist is the right one, so no start.
            _ => EgressPolicy {
                allowed_cidrs: Vec::new(),
                dns_filter_hosts: Some(Vec::new()),
            },
        };
        Ok(SandboxPlace {
            state_dir: self.state_dir(&state.machine),
            db: self.db_path()?,
            policy,
        })
    }

    /// Lets `interrupt` stop a launch between its steps, unwinding it (the
    /// CLI sets it on ^C; give the bundle host the same one).
    pub fn with_interrupt(mut self, interrupt: bottle_core::undo::Interrupt) -> SmolvmBackend<H> {
        self.interrupt = interrupt;
        self
    }

    /// Records every launch step on `timeline` (`bottle start --timings`;
    /// give the bundle host the same one).
    pub fn with_timeline(
        mut self,
        timeline: Option<bottle_core::timeline::Timeline>,
    ) -> SmolvmBackend<H> {
        self.timeline = timeline;
        self
    }

    /// Fails every launch after the step `value` names, as
    /// `BOTTLE_FAILPOINT` would (which is then not read).
    pub fn with_failpoint(mut self, value: Option<String>) -> SmolvmBackend<H> {
        self.failpoint = value;
        self
    }

    /// Uses this state database instead of the one smolvm's environment
    /// points at.
    pub fn with_db_path(mut self, path: PathBuf) -> SmolvmBackend<H> {
        self.db_path = Some(path);
        self
    }

    /// Replaces the host check (the CLI passes bottle-preflight's KVM
    /// checks here).
    pub fn with_host_check(mut self, check: Arc<HostCheck>) -> SmolvmBackend<H> {
        self.host_check = check;
        self
    }

    /// Replaces the terminal runner.
    pub fn with_interactive(mut self, runner: Arc<dyn InteractiveRunner>) -> SmolvmBackend<H> {
        self.interactive = runner;
        self
    }

    /// The smolvm wrapper.
    pub fn smolvm(&self) -> &Arc<Smolvm> {
        &self.smolvm
    }

    /// smolvm's state database, as smolvm itself would find it.
    pub fn db_path(&self) -> Result<PathBuf, SmolvmError> {
        if let Some(path) = &self.db_path {
            return Ok(path.clone());
        }
        let version = self.smolvm.version().ok();
        statedb::state_db_path(
            DataPlatform::current(),
            |key| self.smolvm.lookup_env(key),
            version,
            statedb::passwd_home(),
        )
    }

    /// Where every bottle's state dir is.
    pub(crate) fn state_root(&self) -> &std::path::Path {
        &self.state_root
    }

    /// The bottle of `machine`, as its state file `state` records it.
    pub(crate) fn bottle_of(
        &self,
        machine: &str,
        state: &BottleState,
    ) -> Result<SmolvmBottle, SmolvmError> {
        Ok(SmolvmBottle::new(
            machine.to_string(),
            Arc::clone(&self.smolvm),
            self.sandbox_place(state)?,
            state.env.clone(),
            state.default_command.clone(),
            Arc::clone(&self.interactive),
        ))
    }

    pub(crate) fn state_dir(&self, machine: &str) -> PathBuf {
        self.state_root.join(slug_of(machine))
    }

    pub(crate) fn read_state(&self, machine: &str) -> Result<Option<BottleState>, SmolvmError> {
        read_state_file(&self.state_dir(machine).join(STATE_FILE))
    }

    pub(crate) fn machines(&self) -> Result<Vec<MachineEntry>, SmolvmError> {
        Ok(self
            .smolvm
            .list()?
            .into_iter()
            .filter(|m| m.name.starts_with(RESOURCE_PREFIX))
            .collect())
    }

    /// Every bottle of this backend the state root records, with its
    /// state file when it has one (a launch writes the record first).
    pub(crate) fn all_states(&self) -> Result<Vec<KnownBottle>, SmolvmError> {
        bottle_core::life::recorded_bottles(&self.state_root, BackendKind::Smolmachines)
            .into_iter()
            .map(|(dir, recorded)| {
                Ok(KnownBottle {
                    state: read_state_file(&dir.root().join(STATE_FILE))?,
                    recorded,
                })
            })
            .collect()
    }

    fn prepare_inner(&self, spec: &BottleSpec) -> Result<SmolvmPlan<H::Prepared>, SmolvmError> {
        if spec.agent.isolation != bottle_core::isolation::Isolation::Container {
            return Err(SmolvmError::IsolationUnsupported {
                agent: spec.agent_name.clone(),
                isolation: spec.agent.isolation.to_string(),
            });
        }
        let version = self.smolvm.version()?;
        require_enforced(version)?;
        let reference = image_reference(spec)?;
        let image = self
            .images
            .inspect(reference)
            .map_err(SmolvmError::External)?;
        let bundle = self.bundles.prepare(spec).map_err(SmolvmError::External)?;
        validate_bundle_address(bundle.address)?;
        let mut backend_lines = vec![
            ("vm".into(), format!("libkrun microVM via smolvm {version}")),
            (
                "allowlist".into(),
                format!(
                    "{}/32 only: the bundle on its per-bottle network",
                    bundle.address
                ),
            ),
            (
                "dns".into(),
                "none (smolvm's gateway answers no names)".into(),
            ),
            (
                "image".into(),
                match self.cache.cached(&image) {
                    Some(path) => format!("cached {}", path.display()),
                    None => "packed into a .smolmachine at launch (then cached)".into(),
                },
            ),
        ];
        backend_lines.push(("disk".into(), disk_line(spec.agent.disk_bytes())));
        backend_lines.extend(bundle.lines.iter().cloned());
        let image_line = format!("{reference} ({})", short_id(&image.id));
        let data = PlanData {
            version: PLAN_DATA_VERSION,
            machine: spec.name.clone(),
            image,
            inputs: ProvisionInputs::from_spec(spec),
            // The guest's hostname and address are smolvm's and not told to
            // bottle: only loopback and the bundle are exempt from the proxy.
            env: bottle_core::agent::agent_env_of(
                spec,
                bundle.address,
                &bottle_core::agent::OwnAddresses::default(),
            ),
            bundle,
        };
        let mut plan = Plan::from_spec(spec, BackendKind::Smolmachines, spec.agent.memory_bytes())
            .with_data(data);
        plan.image = image_line;
        plan.backend_lines = backend_lines;
        Ok(plan)
    }
}

/// The agent's prebuilt image: the smolmachines backend packs no
/// Dockerfile.
pub(crate) fn image_reference(spec: &BottleSpec) -> Result<&str, SmolvmError> {
    spec.agent.image.as_deref().ok_or_else(|| {
        SmolvmError::External(BackendError::new(
            BackendErrorKind::Unsupported,
            "BOT-K090",
            format!(
                "agent {:?} is built from a Dockerfile; the smolmachines backend packs prebuilt images only",
                spec.agent_name
            ),
            "build the image first (`docker build -t NAME CONTEXT`) and set `image = \"NAME\"` in the manifest",
        ))
    })
}

/// The plan's `disk` line: the VM's storage disk bounds what the agent can
/// write, `limits.disk` or smolvm's default.
fn disk_line(disk_bytes: Option<u64>) -> String {
    match disk_bytes {
        Some(bytes) => format!(
            "capped at {} GiB (the VM's storage disk, smolvm --storage; whole GiB, rounded up)",
            bottle_core::disk::whole_gib_ceil(bytes)
        ),
        None => format!(
            "capped at {} GiB (smolvm's default storage disk; limits.disk not set)",
            crate::cli::SMOLVM_DEFAULT_STORAGE_GIB
        ),
    }
}

/// A smolmachines bottle's plan, with the bundle host's data `P`.
pub type SmolvmPlan<P> = Plan<PlanData<P>>;

impl<H: BundleHost + 'static> BottleLauncher for SmolvmBackend<H> {
    type PlanData = PlanData<H::Prepared>;

    fn prepare(&self, spec: &BottleSpec) -> Result<SmolvmPlan<H::Prepared>, BackendError> {
        Ok(self.prepare_inner(spec)?)
    }

    fn launch(&self, plan: &SmolvmPlan<H::Prepared>) -> Result<Box<dyn Bottle>, BackendError> {
        Ok(Box::new(self.launch_inner(plan)?))
    }
}

impl<H: BundleHost + 'static> BottleBackend for SmolvmBackend<H> {
    fn kind(&self) -> BackendKind {
        BackendKind::Smolmachines
    }

    fn preflight(&self) -> Result<(), BackendError> {
        (self.host_check)()?;
        let version = self.smolvm.version()?;
        require_enforced(version)?;
        Ok(())
    }

    fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError> {
        let machine = bottle_name(slug_of(name));
        let Some(state) = self.read_state(&machine)? else {
            return Err(SmolvmError::VmMissing { machine }.into());
        };
        let entry = self.machines()?.into_iter().find(|m| m.name == machine);
        match entry {
            Some(entry) if entry.state() == "running" => {
                Ok(Box::new(self.bottle_of(&machine, &state)?))
            }
            Some(entry) => Err(BackendError::new(
                BackendErrorKind::Failed,
                "BOT-K073",
                format!("bottle {machine} is {}, not running", entry.state()),
                "start a new one with `bottle stop NAME` then `bottle start AGENT`",
            )),
            None => Err(SmolvmError::VmMissing { machine }.into()),
        }
    }

    fn list_active(&self) -> Result<Vec<BottleInfo>, BackendError> {
        self.list()
    }

    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        self.stop_bottle(name)
    }

    fn begin_stop(&self, name: &str) -> Result<StopProgress, BackendError> {
        self.begin_stop_bottle(name)
    }

    fn finish_stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        self.finish_stop_bottle(name)
    }

    fn cleanup_plan(&self) -> Result<Vec<CleanupItem>, BackendError> {
        let mut pass = CleanupPass::listing();
        self.cleanup(&mut pass)?;
        Ok(pass.found)
    }

    fn cleanup_approved(&self, approved: &[CleanupItem]) -> Result<CleanupReport, BackendError> {
        let mut pass = CleanupPass::removing(approved);
        self.cleanup(&mut pass)?;
        Ok(pass.report)
    }
}

fn short_id(id: &str) -> String {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_line_says_what_caps_the_vms_writes() {
        assert_eq!(
            disk_line(Some(10 << 30)),
            "capped at 10 GiB (the VM's storage disk, smolvm --storage; whole GiB, rounded up)"
        );
        assert_eq!(disk_line(Some(1536 << 20)).split(' ').nth(2), Some("2"));
        assert_eq!(
            disk_line(None),
            "capped at 20 GiB (smolvm's default storage disk; limits.disk not set)"
        );
    }
}
