//! Finding bottles again and taking them down: `list`, `stop`, `cleanup`.
//!
//! A bottle is its machine (`machine ls --json`, filtered by the
//! `bot-bottle-` prefix), its bundle (the [`BundleHost`]'s bottles) and its
//! state file; each may outlive the others after a crash, so every
//! operation cross-checks all three.

use bottle_core::backend::{
    BackendError, BackendKind, BottleInfo, CleanupItem, CleanupPass, CleanupReport,
};
use bottle_core::bundle_host::BundleHost;
use bottle_core::sandbox::ResetFiles;
use bottle_core::slug::{bottle_name, slug_of};

use crate::backend::SmolvmBackend;
use crate::cli::MachineEntry;
use crate::data::{STATE_FILE, remove_own_files};
use crate::error::SmolvmError;
use bottle_core::audit_files::AuditHealth;

impl<H: BundleHost + 'static> SmolvmBackend<H> {
    /// Every machine, state file and bundle that looks like a bottle.
    pub(crate) fn list(&self) -> Result<Vec<BottleInfo>, BackendError> {
        let machines = self.machines()?;
        let states = self.all_states()?;
        let mut out = Vec::new();
        for machine in &machines {
            let state = states.iter().find(|s| s.machine == machine.name);
            let halted = bottle_core::sandbox::reset::halted(&ResetFiles::new(
                self.state_dir(&machine.name),
            ))
            .is_some();
            out.push(BottleInfo {
                name: machine.name.clone(),
                agent: state.map_or_else(|| "?".into(), |s| s.agent.clone()),
                backend: BackendKind::Smolmachines,
                state: match state {
                    Some(s) if s.abandoned() => {
                        format!("{} (abandoned launch)", machine.state())
                    }
                    // A reset found it diverged: kept stopped for inspection.
                    Some(_) if halted => "halted".to_string(),
                    Some(_) => machine.state().to_string(),
                    None => format!("{} (orphaned: no bottle state)", machine.state()),
                },
                bundle_address: state.and_then(|s| s.bundle_address.clone()),
                created: machine.created(),
                pending_requests: 0,
                agent_running: None,
                ports: Vec::new(),
                audit: AuditHealth::Unknown,
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
                state: if state.in_flight() {
                    "launching".into()
                } else {
                    "vm missing".into()
                },
                bundle_address: state.bundle_address.clone(),
                created: Some(state.created.to_string()),
                pending_requests: 0,
                agent_running: None,
                ports: Vec::new(),
                audit: AuditHealth::Unknown,
            });
        }
        Ok(out)
    }

    /// Removes the machine, bundle and state of the bottle `name`.
    pub(crate) fn stop_bottle(&self, name: &str) -> Result<CleanupReport, BackendError> {
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

    /// Finds (and, for the items `pass` says the operator approved,
    /// removes) what no live bottle of this install owns: machines whose
    /// launch died, state and bundles left without a machine. A machine
    /// with no state in this install's state root is not this install's
    /// (its launch writes the state before `machine create`): `list` shows
    /// it as orphaned, and it is left alone.
    pub(crate) fn cleanup(&self, pass: &mut CleanupPass<'_>) -> Result<(), BackendError> {
        let machines = self.machines()?;
        let states = self.all_states()?;
        let bundles = self.bundles.bottles()?;
        for machine in &machines {
            // The launch that was creating it died: nobody will ever stop it.
            let owner = states.iter().find(|s| s.machine == machine.name);
            if owner.is_some_and(|s| s.abandoned())
                && pass.found(CleanupItem::new(
                    "vm",
                    machine.name.clone(),
                    "the launch that created it died",
                ))
            {
                self.remove_machine(machine, &mut pass.report);
            }
        }
        for state in &states {
            let machine_alive = machines.iter().any(|m| m.name == state.machine);
            if state.in_flight() || (machine_alive && !state.abandoned()) {
                continue;
            }
            let why = if state.abandoned() {
                "the launch that made it died"
            } else {
                "its vm is gone"
            };
            if pass.found(CleanupItem::new("bottle", state.bottle.clone(), why)) {
                self.remove_bundle(&state.bottle, &mut pass.report);
                self.remove_state(&state.machine, &mut pass.report);
            }
        }
        for bottle in &bundles {
            let owned = machines.iter().any(|m| &m.name == bottle)
                || states.iter().any(|s| &s.bottle == bottle);
            if !owned
                && pass.found(CleanupItem::new(
                    "bundle",
                    bottle.clone(),
                    "its bottle has neither a vm nor a state",
                ))
            {
                self.remove_bundle(bottle, &mut pass.report);
            }
        }
        Ok(())
    }

    fn remove_machine(&self, machine: &MachineEntry, report: &mut CleanupReport) {
        if machine.state() == "running"
            && let Err(err) = self.smolvm.stop(&machine.name)
        {
            report
                .failed
                .push(format!("vm {} (stop): {}", machine.name, err));
        }
        match self.smolvm.delete(&machine.name) {
            Ok(()) => report.removed.push(format!("vm {}", machine.name)),
            Err(err) => report.failed.push(format!("vm {}: {}", machine.name, err)),
        }
    }

    fn remove_bundle(&self, bottle: &str, report: &mut CleanupReport) {
        match self.bundles.stop(bottle) {
            // The bundle's host keeps the audit log it removes.
            Ok(sub) => report.merge(sub),
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
