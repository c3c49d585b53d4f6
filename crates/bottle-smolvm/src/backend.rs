//! The smolmachines backend: [`SmolvmBackend`] implements
//! [`bottle_core::BottleBackend`], [`SmolvmBottle`] implements
//! [`bottle_core::Bottle`].
//!
//! Launch, in order, each step undone if a later one fails:
//! 1. refuse smolvm versions whose allowlist is not enforced, and machines
//!    that already exist;
//! 2. the agent image as a `.smolmachine` (cached by image ID);
//! 3. the bottle's state file (before anything that could leak, so
//!    `cleanup` finds it);
//! 4. the bundle, through the [`BundleHost`] (which resolved it at
//!    `prepare`, so the plan shows the exact `/32`); its address must be a
//!    valid one-address allowlist and the one the plan showed;
//! 5. `machine create --from … --allow-cidr <bundle>/32`;
//! 6. the state-DB patch: the record must hold exactly that `/32` and no
//!    DNS names, confirmed by reading it back, else the launch is refused;
//! 7. `machine start`, and the record read back again (the policy smolvm
//!    booted with must still be the one confirmed);
//! 8. provisioning through `machine cp` and `machine exec`.
//!
//! Every resource is named `bot-bottle-<slug>`; `list` is `machine ls
//! --json` filtered by that prefix and cross-checked with the state files
//! under `<state root>/<slug>/smolvm.json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bottle_core::backend::{
    BackendError, BackendErrorKind, BackendKind, Bottle, BottleBackend, BottleInfo, BottleLauncher,
    CleanupReport, ExecOutput,
};
use bottle_core::bundle_host::{BundleHost, PreparedBundle};
use bottle_core::images::{AgentImage, ImageStore};
use bottle_core::plan::Plan;
use bottle_core::slug::{RESOURCE_PREFIX, bottle_name, slug_of};
use bottle_core::spec::BottleSpec;
use serde::{Deserialize, Serialize};

use crate::bundle_address::validate_bundle_address;
use crate::cli::{MachineEntry, Smolvm};
use crate::error::{SmolvmError, io_err};
use crate::interactive::{InteractiveRunner, TerminalRunner, stdin_is_tty};
use crate::pack::SmolmachineCache;
use crate::provision::{self, ProvisionInputs};
use crate::statedb::{self, DataPlatform, EgressPolicy};
use crate::version::require_enforced;

/// The backend's file in a bottle's state dir.
pub const STATE_FILE: &str = "smolvm.json";
/// Version of [`BottleState`]'s format.
pub const STATE_VERSION: u32 = 1;
/// Version of [`PlanData`]'s format.
pub const PLAN_DATA_VERSION: u32 = 1;

/// Files this backend writes into a bottle's state dir, removed by `stop`.
/// `Smolfile` and `guest-gitconfig` are no longer written, but bottles
/// started by earlier versions still have them.
const OWN_FILES: [&str; 5] = [
    STATE_FILE,
    "Smolfile",
    "guest-env",
    "guest-mcp.json",
    "guest-gitconfig",
];

/// The backend's part of a [`Plan`] (`plan.backend_data`); `P` is what
/// the bundle host resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanData<P> {
    /// [`PLAN_DATA_VERSION`].
    pub version: u32,
    /// The smolvm machine name (`bot-bottle-<slug>`).
    pub machine: String,
    /// The resolved agent image.
    pub image: AgentImage,
    /// What provisioning copies in.
    pub inputs: ProvisionInputs,
    /// The agent's environment (`bottle_core::agent::agent_env_of`).
    pub env: Vec<(String, String)>,
    /// What the bundle host resolved for the bundle.
    pub bundle: PreparedBundle<P>,
}

/// Where a launch got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Resources are being created by `launch_pid`.
    Launching,
    /// The bottle is up.
    Running,
}

/// A bottle's state on disk: what `stop`, `list`, `attach` and `cleanup`
/// need to find everything a launch created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BottleState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// `bot-bottle-<slug>`.
    pub bottle: String,
    /// The agent's name in the manifest.
    pub agent: String,
    /// The smolvm machine.
    pub machine: String,
    /// Where the guest reaches the bundle, once known.
    pub bundle_address: Option<String>,
    /// The environment every exec carries.
    pub env: Vec<(String, String)>,
    /// What `exec_interactive` runs when given no command.
    pub default_command: Vec<String>,
    /// Unix seconds.
    pub created: u64,
    /// The process that ran the launch.
    pub launch_pid: u32,
    /// Where the launch got to.
    pub phase: Phase,
}

/// Runs a host check (KVM and platform) and says why it failed.
pub type HostCheck = dyn Fn() -> Result<(), BackendError> + Send + Sync;

/// The smolmachines backend, running its bundles on `H`.
pub struct SmolvmBackend<H> {
    smolvm: Arc<Smolvm>,
    images: Arc<dyn ImageStore>,
    cache: SmolmachineCache,
    bundles: Arc<H>,
    state_root: PathBuf,
    db_path: Option<PathBuf>,
    host_check: Arc<HostCheck>,
    interactive: Arc<dyn InteractiveRunner>,
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
        }
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

    fn state_dir(&self, machine: &str) -> PathBuf {
        self.state_root.join(slug_of(machine))
    }

    fn read_state(&self, machine: &str) -> Result<Option<BottleState>, SmolvmError> {
        read_state_file(&self.state_dir(machine).join(STATE_FILE))
    }

    fn machines(&self) -> Result<Vec<MachineEntry>, SmolvmError> {
        Ok(self
            .smolvm
            .list()?
            .into_iter()
            .filter(|m| m.name.starts_with(RESOURCE_PREFIX))
            .collect())
    }

    fn all_states(&self) -> Result<Vec<BottleState>, SmolvmError> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.state_root) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(err) => return Err(io_err("read", &self.state_root, err)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err("read", &self.state_root, e))?;
            if let Some(state) = read_state_file(&entry.path().join(STATE_FILE))? {
                out.push(state);
            }
        }
        out.sort_by(|a, b| a.bottle.cmp(&b.bottle));
        Ok(out)
    }

    fn prepare_inner(&self, spec: &BottleSpec) -> Result<SmolvmPlan<H::Prepared>, SmolvmError> {
        let version = self.smolvm.version()?;
        require_enforced(version)?;
        let Some(reference) = spec.agent.image.as_deref() else {
            return Err(SmolvmError::External(BackendError::new(
                BackendErrorKind::Unsupported,
                "BOT-K090",
                format!(
                    "agent {:?} is built from a Dockerfile; the smolmachines backend packs prebuilt images only",
                    spec.agent_name
                ),
                "build the image first (`docker build -t NAME CONTEXT`) and set `image = \"NAME\"` in the manifest",
            )));
        };
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
        backend_lines.extend(bundle.lines.iter().cloned());
        let image_line = format!("{reference} ({})", short_id(&image.id));
        let data = PlanData {
            version: PLAN_DATA_VERSION,
            machine: spec.name.clone(),
            image,
            inputs: ProvisionInputs::from_spec(spec),
            env: bottle_core::agent::agent_env_of(spec, bundle.address),
            bundle,
        };
        let mut plan = Plan::from_spec(spec, BackendKind::Smolmachines, spec.agent.memory_bytes())
            .with_data(data);
        plan.image = image_line;
        plan.backend_lines = backend_lines;
        Ok(plan)
    }

    fn launch_inner(&self, plan: &SmolvmPlan<H::Prepared>) -> Result<SmolvmBottle, BackendError> {
        let version = self.smolvm.version()?;
        require_enforced(version)?;
        (self.host_check)()?;
        let data = &plan.backend_data;
        if plan.backend != BackendKind::Smolmachines || data.version != PLAN_DATA_VERSION {
            return Err(BackendError::new(
                BackendErrorKind::Failed,
                "BOT-K091",
                format!(
                    "the plan was not made by this smolmachines backend (backend {}, data version {})",
                    plan.backend, data.version
                ),
                "run `bottle start` again so the plan is prepared by this backend",
            ));
        }
        let machine = data.machine.clone();
        if self.machines()?.iter().any(|m| m.name == machine) {
            return Err(SmolvmError::AlreadyExists { machine }.into());
        }
        let smolmachine =
            self.cache
                .smolmachine(self.images.as_ref(), &data.image, &self.smolvm)?;

        let mut unwind = Unwind::default();
        let result = self.launch_steps(plan, data, &smolmachine, &mut unwind);
        match result {
            Ok(bottle) => {
                unwind.disarm();
                Ok(bottle)
            }
            Err(err) => {
                let mut err: BackendError = err.into();
                let failures = unwind.run();
                if !failures.is_empty() {
                    err.message = format!(
                        "{}; while undoing the launch, could not remove: {}",
                        err.message,
                        failures.join("; ")
                    );
                    err.fix = format!("{}; then run `bottle cleanup`", err.fix);
                }
                Err(err)
            }
        }
    }

    fn launch_steps<'a>(
        &'a self,
        plan: &SmolvmPlan<H::Prepared>,
        data: &PlanData<H::Prepared>,
        smolmachine: &Path,
        unwind: &mut Unwind<'a>,
    ) -> Result<SmolvmBottle, SmolvmError> {
        let machine = data.machine.clone();
        let state_dir = plan.state_dir.clone();
        std::fs::create_dir_all(&state_dir)
            .map_err(|e| io_err("create directory", &state_dir, e))?;
        let default_command = if plan.command.is_empty() {
            data.image.default_command()
        } else {
            plan.command.clone()
        };
        let mut state = BottleState {
            version: STATE_VERSION,
            bottle: plan.bottle.clone(),
            agent: plan.agent.clone(),
            machine: machine.clone(),
            bundle_address: None,
            env: Vec::new(),
            default_command,
            created: unix_now(),
            launch_pid: std::process::id(),
            phase: Phase::Launching,
        };
        let state_path = state_dir.join(STATE_FILE);
        write_state_file(&state_path, &state)?;
        {
            let state_dir = state_dir.clone();
            unwind.push("bottle state files", move || remove_own_files(&state_dir));
        }

        let endpoint = self
            .bundles
            .start(plan, &data.bundle.data)
            .map_err(SmolvmError::External)?;
        {
            let bundles = Arc::clone(&self.bundles);
            let bottle = plan.bottle.clone();
            unwind.push("the bundle", move || {
                bundles.stop(&bottle).map(drop).map_err(|e| e.message)
            });
        }
        validate_bundle_address(endpoint.address)?;
        // The agent's environment names the planned address; the bundle
        // must be exactly there.
        if endpoint.address != data.bundle.address {
            return Err(SmolvmError::BundleAddress {
                address: endpoint.address.to_string(),
                reason: format!(
                    "the confirmed plan put the bundle at {}",
                    data.bundle.address
                ),
            });
        }
        let policy = EgressPolicy::one_address(endpoint.address);
        let env = data.env.clone();
        state.bundle_address = Some(endpoint.address.to_string());
        state.env = env.clone();
        write_state_file(&state_path, &state)?;

        self.smolvm
            .create(&machine, smolmachine, &policy.allowed_cidrs)?;
        {
            let smolvm = Arc::clone(&self.smolvm);
            let machine = machine.clone();
            unwind.push("the microVM", move || {
                smolvm.delete(&machine).map_err(|e| e.message())
            });
        }
        let db = self.db_path()?;
        statedb::enforce(&db, &machine, &policy)?;

        self.smolvm.start(&machine)?;
        {
            let smolvm = Arc::clone(&self.smolvm);
            let machine = machine.clone();
            unwind.push("the running microVM", move || {
                smolvm.stop(&machine).map_err(|e| e.message())
            });
        }
        // smolvm read the record to boot; it must still be the one confirmed.
        statedb::verify(&db, &machine, &policy)?;

        provision::provision(
            &self.smolvm,
            &machine,
            &data.inputs,
            &endpoint,
            &env,
            &state_dir,
        )?;

        state.phase = Phase::Running;
        write_state_file(&state_path, &state)?;
        Ok(SmolvmBottle {
            machine,
            smolvm: Arc::clone(&self.smolvm),
            env,
            default_command: state.default_command,
            interactive: Arc::clone(&self.interactive),
        })
    }

    fn remove_machine(&self, machine: &MachineEntry, report: &mut CleanupReport) {
        if machine.state() == "running"
            && let Err(err) = self.smolvm.stop(&machine.name)
        {
            report
                .failed
                .push(format!("vm {} (stop): {}", machine.name, err.message()));
        }
        match self.smolvm.delete(&machine.name) {
            Ok(()) => report.removed.push(format!("vm {}", machine.name)),
            Err(err) => report
                .failed
                .push(format!("vm {}: {}", machine.name, err.message())),
        }
    }

    fn remove_bundle(&self, bottle: &str, report: &mut CleanupReport) {
        match self.bundles.stop(bottle) {
            Ok(sub) => {
                report.removed.extend(sub.removed);
                report.failed.extend(sub.failed);
            }
            Err(err) => report
                .failed
                .push(format!("bundle of {bottle}: {}", err.message)),
        }
    }

    fn remove_state(&self, machine: &str, report: &mut CleanupReport) {
        let dir = self.state_dir(machine);
        match remove_own_files(&dir) {
            Ok(()) => report
                .removed
                .push(format!("state {}", dir.join(STATE_FILE).display())),
            Err(err) => report
                .failed
                .push(format!("state {}: {err}", dir.display())),
        }
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
            Some(entry) if entry.state() == "running" => Ok(Box::new(SmolvmBottle {
                machine,
                smolvm: Arc::clone(&self.smolvm),
                env: state.env,
                default_command: state.default_command,
                interactive: Arc::clone(&self.interactive),
            })),
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
        let machines = self.machines()?;
        let states = self.all_states()?;
        let mut out = Vec::new();
        for machine in &machines {
            let state = states.iter().find(|s| s.machine == machine.name);
            out.push(BottleInfo {
                name: machine.name.clone(),
                agent: state.map_or_else(|| "?".into(), |s| s.agent.clone()),
                backend: BackendKind::Smolmachines,
                state: match state {
                    Some(s) if abandoned(s) => format!("{} (abandoned launch)", machine.state()),
                    Some(_) => machine.state().to_string(),
                    None => format!("{} (orphaned: no bottle state)", machine.state()),
                },
                bundle_address: state.and_then(|s| s.bundle_address.clone()),
                created: machine.created(),
                pending_requests: 0,
            });
        }
        for state in states
            .iter()
            .filter(|s| !machines.iter().any(|m| m.name == s.machine))
        {
            out.push(BottleInfo {
                name: state.bottle.clone(),
                agent: state.agent.clone(),
                backend: BackendKind::Smolmachines,
                state: match state.phase {
                    Phase::Launching if pid_alive(state.launch_pid) => "launching".into(),
                    _ => "vm missing".into(),
                },
                bundle_address: state.bundle_address.clone(),
                created: Some(state.created.to_string()),
                pending_requests: 0,
            });
        }
        Ok(out)
    }

    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        let machine_name = bottle_name(slug_of(name));
        let machine = self
            .machines()?
            .into_iter()
            .find(|m| m.name == machine_name);
        let state = self.read_state(&machine_name)?;
        let bundled = self.bundles.bottles()?.contains(&machine_name);
        if machine.is_none() && state.is_none() && !bundled {
            return Err(SmolvmError::VmMissing {
                machine: machine_name,
            }
            .into());
        }
        let mut report = CleanupReport::default();
        if let Some(machine) = &machine {
            self.remove_machine(machine, &mut report);
        }
        self.remove_bundle(&machine_name, &mut report);
        if state.is_some() {
            self.remove_state(&machine_name, &mut report);
        }
        Ok(report)
    }

    fn cleanup_orphans(&self) -> Result<CleanupReport, BackendError> {
        let machines = self.machines()?;
        let states = self.all_states()?;
        let bundles = self.bundles.bottles()?;
        let mut report = CleanupReport::default();
        let in_flight = |s: &BottleState| s.phase == Phase::Launching && pid_alive(s.launch_pid);
        for machine in &machines {
            // No state, or the launch that was creating it died: nobody will
            // ever stop it.
            let owner = states.iter().find(|s| s.machine == machine.name);
            if owner.is_none_or(abandoned) {
                self.remove_machine(machine, &mut report);
            }
        }
        for state in &states {
            let machine_alive = machines.iter().any(|m| m.name == state.machine);
            if in_flight(state) || (machine_alive && !abandoned(state)) {
                continue;
            }
            self.remove_bundle(&state.bottle, &mut report);
            self.remove_state(&state.machine, &mut report);
        }
        for bottle in &bundles {
            let owned = machines.iter().any(|m| &m.name == bottle)
                || states.iter().any(|s| &s.bottle == bottle);
            if !owned {
                self.remove_bundle(bottle, &mut report);
            }
        }
        Ok(report)
    }
}

/// A running microVM bottle.
pub struct SmolvmBottle {
    machine: String,
    smolvm: Arc<Smolvm>,
    env: Vec<(String, String)>,
    default_command: Vec<String>,
    interactive: Arc<dyn InteractiveRunner>,
}

impl std::fmt::Debug for SmolvmBottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmolvmBottle")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}

impl SmolvmBottle {
    /// The environment every command in this bottle runs with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl Bottle for SmolvmBottle {
    fn name(&self) -> &str {
        &self.machine
    }

    fn exec(&self, argv: &[String]) -> Result<ExecOutput, BackendError> {
        let out = self.smolvm.exec(&self.machine, argv, &self.env)?;
        Ok(ExecOutput {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    fn exec_interactive(&self, argv: &[String]) -> Result<i32, BackendError> {
        let argv = if argv.is_empty() {
            self.default_command.clone()
        } else {
            argv.to_vec()
        };
        if argv.is_empty() {
            return Err(BackendError::new(
                BackendErrorKind::Failed,
                "BOT-K092",
                "the agent has no command and its image names none",
                "set `command` for the agent in the manifest",
            ));
        }
        let spec =
            self.smolvm
                .exec_interactive_spec(&self.machine, &argv, &self.env, stdin_is_tty())?;
        self.interactive.run_interactive(&spec).map_err(|source| {
            SmolvmError::NotInstalled {
                program: spec.program.to_string_lossy().into_owned(),
                source,
            }
            .into()
        })
    }

    fn copy_in(&self, host_path: &Path, guest_dir: &str) -> Result<(), BackendError> {
        let name = host_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Failed,
                    "BOT-K093",
                    format!("{} has no file name to copy under", host_path.display()),
                    "name a file or a directory",
                )
            })?;
        let guest = format!("{}/{name}", guest_dir.trim_end_matches('/'));
        Ok(self.smolvm.copy_in(&self.machine, host_path, &guest)?)
    }
}

/// One undo step: what it removes, and how.
type UndoStep<'a> = (&'static str, Box<dyn FnOnce() -> Result<(), String> + 'a>);

/// Steps that undo a half-done launch, run last-first.
#[derive(Default)]
struct Unwind<'a> {
    steps: Vec<UndoStep<'a>>,
}

impl<'a> Unwind<'a> {
    fn push(&mut self, what: &'static str, step: impl FnOnce() -> Result<(), String> + 'a) {
        self.steps.push((what, Box::new(step)));
    }

    fn run(self) -> Vec<String> {
        self.steps
            .into_iter()
            .rev()
            .filter_map(|(what, step)| step().err().map(|err| format!("{what}: {err}")))
            .collect()
    }

    fn disarm(self) {
        drop(self.steps);
    }
}

fn read_state_file(path: &Path) -> Result<Option<BottleState>, SmolvmError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io_err("read", path, err)),
    };
    let state: BottleState =
        serde_json::from_slice(&bytes).map_err(|err| SmolvmError::BadOutput {
            argv: vec![path.display().to_string()],
            detail: format!("not a bottle state file: {err}"),
        })?;
    if state.version != STATE_VERSION {
        return Err(SmolvmError::BadOutput {
            argv: vec![path.display().to_string()],
            detail: format!("state version {} is not {STATE_VERSION}", state.version),
        });
    }
    Ok(Some(state))
}

fn write_state_file(path: &Path, state: &BottleState) -> Result<(), SmolvmError> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|err| SmolvmError::BadOutput {
        argv: vec![path.display().to_string()],
        detail: err.to_string(),
    })?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes).map_err(|e| io_err("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("write", path, e))
}

fn remove_own_files(dir: &Path) -> Result<(), String> {
    let mut failures = Vec::new();
    for name in OWN_FILES {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => failures.push(format!("{}: {err}", path.display())),
        }
    }
    // The dir goes too if nothing else lives there; otherwise it is the CLI's.
    let _ = std::fs::remove_dir(dir);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn short_id(id: &str) -> String {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A launch that never finished and whose process is gone.
fn abandoned(state: &BottleState) -> bool {
    state.phase == Phase::Launching && !pid_alive(state.launch_pid)
}

fn pid_alive(pid: u32) -> bool {
    // 0 would address our own process group, not a process.
    pid != 0
        && i32::try_from(pid).is_ok_and(|pid| {
            // Signal 0 checks existence; EPERM means it exists but is not ours.
            match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
                Ok(()) => true,
                Err(errno) => errno == nix::errno::Errno::EPERM,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwind_runs_last_first_and_collects_failures() {
        let log = std::cell::RefCell::new(Vec::new());
        let mut unwind = Unwind::default();
        unwind.push("first", || {
            log.borrow_mut().push(1);
            Ok(())
        });
        unwind.push("second", || {
            log.borrow_mut().push(2);
            Err("busy".into())
        });
        let failures = unwind.run();
        assert_eq!(*log.borrow(), [2, 1]);
        assert_eq!(failures, ["second: busy"]);
    }

    #[test]
    fn state_file_round_trips_and_refuses_other_versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let state = BottleState {
            version: STATE_VERSION,
            bottle: "bot-bottle-a".into(),
            agent: "a".into(),
            machine: "bot-bottle-a".into(),
            bundle_address: Some("192.168.7.2".into()),
            env: vec![("K".into(), "V".into())],
            default_command: vec!["sh".into()],
            created: 1,
            launch_pid: 2,
            phase: Phase::Running,
        };
        write_state_file(&path, &state).unwrap();
        assert_eq!(read_state_file(&path).unwrap(), Some(state));
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"version\": 1", "\"version\": 9");
        std::fs::write(&path, text).unwrap();
        assert!(read_state_file(&path).is_err());
        assert_eq!(read_state_file(&dir.path().join("none")).unwrap(), None);
    }

    #[test]
    fn this_process_is_alive() {
        assert!(pid_alive(std::process::id()));
    }
}
