//! `launch`: the steps that turn a confirmed plan into a running microVM
//! bottle, each registering its undo, run last-first if a later one fails.
//! Every step ends through [`bottle_core::launch_steps`] (its `--timings`
//! lap, the operator's ^C, `BOTTLE_FAILPOINT`); the bundle host's own
//! steps (the docker bundle's `network` … `bundle-health`) end inside
//! `bundle` the same way.
//!
//! | step | what it does |
//! | --- | --- |
//! | `image` | refuse smolvm versions whose allowlist is not enforced and machines that already exist; the agent image as a `.smolmachine` (cached by image ID) |
//! | `bottle-state` | the bottle's state file (before anything that could leak, so `cleanup` finds it) |
//! | `bundle` | the bundle, through the [`BundleHost`] (which resolved it at `prepare`, so the plan shows the exact `/32`); its address must be a valid one-address allowlist and the one the plan showed |
//! | `machine-create` | `machine create --from … --allow-cidr <bundle>/32`, then the state-DB patch: the record must hold exactly that `/32` and no DNS names, confirmed by reading it back, else the launch is refused |
//! | `machine-start` | `machine start`, and the record read back again (the policy smolvm booted with must still be the one confirmed) |
//! | `provision` | provisioning through `machine cp` and `machine exec`, the in-box agent included |
//! | `snapshot` | the golden snapshot a reset returns to ([`crate::reset`]): the machine stopped, its disks copied, started again |
//! | `complete` | the state file says the bottle runs |

use std::path::Path;
use std::sync::Arc;

use bottle_core::backend::{BackendError, BackendErrorKind, BackendKind};
use bottle_core::bundle_host::BundleHost;
use bottle_core::launch_steps::{Failpoint, LaunchStep, StepEnds, UnknownFailpoint};
use bottle_core::life::{BottleRecord, Phase, StateDir};
use bottle_core::undo::Unwind;

use crate::backend::{SmolvmBackend, SmolvmPlan};
use crate::bottle::SmolvmBottle;
use crate::bundle_address::validate_bundle_address;
use crate::data::{
    BottleState, PLAN_DATA_VERSION, PlanData, STATE_FILE, STATE_VERSION, remove_own_files,
    write_state_file,
};
use crate::error::{SmolvmError, io_err};
use crate::provision;
use crate::reset::VmReset;
use crate::statedb::{self, EgressPolicy};
use crate::version::require_enforced;

impl<H: BundleHost + 'static> SmolvmBackend<H> {
    pub(crate) fn launch_inner(
        &self,
        plan: &SmolvmPlan<H::Prepared>,
    ) -> Result<SmolvmBottle, BackendError> {
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
        let ends = self.step_ends()?;
        let machine = data.machine.clone();
        // A stop of this name that is not finished yet is finished first
        // (waiting for its finisher): a new bottle never starts beside the
        // old one's leftovers, and what cannot be removed refuses it.
        self.finish_stop_bottle(&machine)?;
        let stopping = StateDir::new(&plan.state_dir).is_stopping();
        if stopping || self.machines()?.iter().any(|m| m.name == machine) {
            return Err(SmolvmError::AlreadyExists { machine }.into());
        }
        let smolmachine =
            self.cache
                .smolmachine(self.images.as_ref(), &data.image, &self.smolvm)?;
        ends.done(Step::Image).map_err(SmolvmError::from)?;

        let mut unwind = Unwind::default();
        let result = self.launch_steps(plan, data, &smolmachine, &ends, &mut unwind);
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

    /// What ends every step of a launch: the timeline, the interrupt and
    /// the failpoint (given, or `BOTTLE_FAILPOINT`). A failpoint naming one
    /// of the bundle host's steps is the host's to fire; one naming
    /// neither's is refused before anything starts.
    fn step_ends(&self) -> Result<StepEnds<Step>, SmolvmError> {
        let value = match &self.failpoint {
            Some(value) => value.clone(),
            None => std::env::var(bottle_core::launch_steps::FAILPOINT_ENV).unwrap_or_default(),
        };
        let failpoint = match Failpoint::parse(&value) {
            Ok(failpoint) => failpoint,
            Err(unknown) => {
                let step = bottle_core::launch_steps::failpoint_step_name(&value);
                let hosts = self.bundles.launch_steps();
                if !step.is_some_and(|(step, _)| hosts.contains(&step)) {
                    let mut steps = vec![Step::names()];
                    steps.extend(hosts.iter().map(|step| (*step).to_string()));
                    return Err(SmolvmError::UnknownFailpoint(UnknownFailpoint {
                        steps: steps.join(", "),
                        ..unknown
                    }));
                }
                None
            }
        };
        Ok(StepEnds {
            timeline: self.timeline.clone(),
            interrupt: self.interrupt.clone(),
            failpoint,
        })
    }

    fn launch_steps<'a>(
        &'a self,
        plan: &SmolvmPlan<H::Prepared>,
        data: &PlanData<H::Prepared>,
        smolmachine: &Path,
        ends: &StepEnds<Step>,
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
        // The record first: `cleanup` finds a launch that dies from here
        // on by it.
        let record = StateDir::new(&state_dir);
        record.begin(&BottleRecord::launching(
            &plan.bottle,
            &plan.agent,
            BackendKind::Smolmachines,
        ))?;
        {
            let state_dir = state_dir.clone();
            unwind.push("bottle state files", move || remove_own_files(&state_dir));
        }
        let mut state = BottleState {
            version: STATE_VERSION,
            bottle: plan.bottle.clone(),
            agent: plan.agent.clone(),
            machine: machine.clone(),
            bundle_address: None,
            env: Vec::new(),
            default_command,
        };
        let state_path = state_dir.join(STATE_FILE);
        write_state_file(&state_path, &state)?;

        ends.done(Step::BottleState)?;
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
        ends.done(Step::Bundle)?;

        self.smolvm.create(
            &machine,
            smolmachine,
            &policy.allowed_cidrs,
            plan.disk_bytes.map(bottle_core::disk::whole_gib_ceil),
        )?;
        {
            let smolvm = Arc::clone(&self.smolvm);
            let machine = machine.clone();
            unwind.push("the microVM", move || {
                smolvm.delete(&machine).map_err(|e| e.to_string())
            });
        }
        let db = self.db_path()?;
        statedb::enforce(&db, &machine, &policy)?;
        ends.done(Step::MachineCreate)?;

        self.smolvm.start(&machine)?;
        {
            let smolvm = Arc::clone(&self.smolvm);
            let machine = machine.clone();
            unwind.push("the running microVM", move || {
                smolvm.stop(&machine).map_err(|e| e.to_string())
            });
        }
        // smolvm read the record to boot; it must still be the one confirmed.
        statedb::verify(&db, &machine, &policy)?;
        ends.done(Step::MachineStart)?;

        let mut warnings = provision::provision(
            &self.smolvm,
            &machine,
            &data.inputs,
            &endpoint,
            &env,
            &bottle_core::agent::bundle_host_names(&plan.host_services, &plan.tcp),
            &state_dir,
        )?;
        // Without a static in-box agent the bottle still runs; `execute`
        // says how to get one.
        let toolbox = match bottle_core::bundle_binary::find_toolbox_in(&self.toolbox_places) {
            Ok(binary) => {
                provision::install_toolbox(&self.smolvm, &machine, &binary, &env, &state_dir)?;
                true
            }
            Err(_) => false,
        };
        ends.done(Step::Provision)?;

        let bottle = SmolvmBottle::new(
            machine,
            Arc::clone(&self.smolvm),
            self.sandbox_place(&state)?,
            env,
            state.default_command.clone(),
            Arc::clone(&self.interactive),
        );
        // The golden snapshot: what `reset` returns to. Without it the
        // bottle still runs, and a reset halts it (no baseline is no pass);
        // without the in-box agent, `execute` says how to get one.
        if toolbox && let Err(err) = record_golden(&bottle, &bottle.reset_files()) {
            warnings.push(
                bottle_core::display::escape_for_terminal(&format!(
                    "reset is not available: {err}"
                ))
                .into_owned(),
            );
        }
        ends.done(Step::Snapshot)?;

        record.advance(Phase::Running)?;
        ends.done(Step::Complete)?;
        Ok(bottle.with_warnings(warnings))
    }
}

/// The microVM launch's steps, in order (the table above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `image`.
    Image,
    /// `bottle-state`.
    BottleState,
    /// `bundle`.
    Bundle,
    /// `machine-create`.
    MachineCreate,
    /// `machine-start`.
    MachineStart,
    /// `provision`.
    Provision,
    /// `snapshot`.
    Snapshot,
    /// `complete`.
    Complete,
}

impl LaunchStep for Step {
    const ALL: &'static [Step] = &[
        Step::Image,
        Step::BottleState,
        Step::Bundle,
        Step::MachineCreate,
        Step::MachineStart,
        Step::Provision,
        Step::Snapshot,
        Step::Complete,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Image => "image",
            Step::BottleState => "bottle-state",
            Step::Bundle => "bundle",
            Step::MachineCreate => "machine-create",
            Step::MachineStart => "machine-start",
            Step::Provision => "provision",
            Step::Snapshot => "snapshot",
            Step::Complete => "complete",
        }
    }
}

/// Takes `bottle`'s golden snapshot and records its baseline.
fn record_golden(
    bottle: &SmolvmBottle,
    files: &bottle_core::sandbox::ResetFiles,
) -> Result<(), bottle_core::sandbox::SandboxError> {
    let substrate = VmReset::new(bottle, files.golden_dir());
    bottle_core::sandbox::reset::record_golden(&substrate, files).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_table_lists_every_step_in_launch_order() {
        let table: Vec<&str> = include_str!("launch.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//! | `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        let names: Vec<&str> = Step::ALL.iter().map(|step| step.name()).collect();
        assert_eq!(table, names);
    }
}
