//! Finding bottles again and taking them down: `list`, `stop`, `cleanup`.
//!
//! A bottle is its machine (`machine ls --json`, filtered by the
//! `bot-bottle-` prefix), its bundle (the [`BundleHost`]'s bottles) and its
//! state file; each may outlive the others after a crash, so every
//! operation cross-checks all three.

use bottle_core::backend::{
    BackendError, BackendKind, BottleInfo, CleanupItem, CleanupPass, CleanupReport, StopProgress,
};
use bottle_core::bundle_host::BundleHost;
use bottle_core::life::{Phase, StateDir};
use bottle_core::sandbox::ResetFiles;
use bottle_core::slug::{bottle_name, slug_of};

use crate::backend::{KnownBottle, SmolvmBackend};
use crate::cli::MachineEntry;
use crate::data::{STATE_FILE, remove_own_files};
use crate::error::SmolvmError;
use crate::pool::SmolvmPoolFacts;
use bottle_core::audit_files::AuditHealth;

impl<H: BundleHost + 'static> SmolvmBackend<H> {
    /// Every machine, record and bundle that looks like a bottle.
    pub(crate) fn list(&self) -> Result<Vec<BottleInfo>, BackendError> {
        let machines = self.machines()?;
        let known = self.all_states()?;
        let mut out = Vec::new();
        for machine in &machines {
            let bottle = known.iter().find(|k| k.machine() == machine.name);
            let state_dir = self.state_dir(&machine.name);
            let halted =
                bottle_core::sandbox::reset::halted(&ResetFiles::new(&state_dir)).is_some();
            let pooled = bottle_core::pool::is_ready(&state_dir);
            let state = match bottle.map(|k| &k.recorded.record) {
                Some(r) if r.abandoned() => {
                    format!("{} (abandoned launch)", machine.state())
                }
                // A reset found it diverged: kept stopped for inspection.
                Some(_) if halted => "halted".to_string(),
                Some(r) if r.phase == Phase::Stopping => "stopping".to_string(),
                // A warm pool's entry: prepared, nothing of the agent runs.
                Some(_) if pooled && machine.state() == "running" => "pooled".to_string(),
                Some(_) => machine.state().to_string(),
                None => format!("{} (orphaned: no bottle state)", machine.state()),
            };
            out.push(BottleInfo {
                name: machine.name.clone(),
                agent: bottle.map_or_else(|| "?".into(), |k| k.recorded.record.agent.clone()),
                backend: BackendKind::Smolmachines,
                state: bottle_core::life::with_layout(
                    state,
                    bottle.is_some_and(|k| k.recorded.legacy),
                ),
                bundle_address: bottle.and_then(KnownBottle::bundle_address),
                created: machine.created(),
                pending_requests: 0,
                agent_running: None,
                ports: Vec::new(),
                audit: AuditHealth::Unknown,
            });
        }
        for bottle in known
            .iter()
            .filter(|k| !machines.iter().any(|m| m.name == k.machine()))
        {
            let record = &bottle.recorded.record;
            let state = if record.in_flight() {
                "launching"
            } else {
                "vm missing"
            };
            out.push(BottleInfo {
                name: record.bottle.clone(),
                agent: record.agent.clone(),
                backend: BackendKind::Smolmachines,
                state: bottle_core::life::with_layout(state.into(), bottle.recorded.legacy),
                bundle_address: bottle.bundle_address(),
                created: record.created.clone(),
                pending_requests: 0,
                agent_running: None,
                ports: Vec::new(),
                audit: AuditHealth::Unknown,
            });
        }
        Ok(out)
    }

    /// The part of a stop the operator waits for: records the bottle as
    /// stopping, then stops its machine, after which the agent can neither
    /// run nor reach anything; [`Self::finish_stop_bottle`] removes the
    /// machine, the bundle and the state, and `cleanup` does if nothing
    /// else does. A bottle with no record to keep the stop's place (none,
    /// or one that cannot be written) is stopped whole, here.
    pub(crate) fn begin_stop_bottle(&self, name: &str) -> Result<StopProgress, BackendError> {
        let machine_name = bottle_name(slug_of(name));
        let dir = StateDir::new(self.state_dir(&machine_name));
        // A finisher at work holds the dir until it is gone: a second stop
        // then finds the bottle gone rather than recording a stop in a dir
        // being removed.
        let _finisher_done = dir.lock();
        // No record (`advance` finds none) or one that cannot be written.
        if dir.advance(Phase::Stopping).is_err() {
            return self.stop_bottle(name).map(StopProgress::Stopped);
        }
        let mut report = CleanupReport::default();
        let running = self
            .machines()?
            .into_iter()
            .find(|m| m.name == machine_name && m.state() == "running");
        // Stopped, not yet deleted: nothing is reported removed until the
        // finish removes it.
        if let Some(machine) = running
            && let Err(err) = self.smolvm.stop(&machine.name)
        {
            report
                .failed
                .push(format!("vm {} (stop): {err}", machine.name));
        }
        Ok(StopProgress::Stopping(report))
    }

    /// Finishes the stop [`Self::begin_stop_bottle`] began, and nothing
    /// else: only while the bottle is recorded as stopping, holding its
    /// state dir throughout, so a finisher that comes late (the bottle
    /// finished by another, or a new bottle of the name) removes nothing.
    pub(crate) fn finish_stop_bottle(&self, name: &str) -> Result<CleanupReport, BackendError> {
        let machine_name = bottle_name(slug_of(name));
        let dir = StateDir::new(self.state_dir(&machine_name));
        let Some(_held) = dir.lock() else {
            return Ok(CleanupReport::default());
        };
        if !dir.is_stopping() {
            return Ok(CleanupReport::default());
        }
        self.stop_bottle(name)
    }

    /// Removes the machine, bundle and state of the bottle `name`.
    pub(crate) fn stop_bottle(&self, name: &str) -> Result<CleanupReport, BackendError> {
        let machine_name = bottle_name(slug_of(name));
        let machine = self
            .machines()?
            .into_iter()
            .find(|m| m.name == machine_name);
        let dir = StateDir::new(self.state_dir(&machine_name));
        // A record this build cannot read is still a bottle's.
        let recorded = !matches!(dir.read(), Ok(None)) || self.read_state(&machine_name)?.is_some();
        let bundled = self.bundles.bottles()?.contains(&machine_name);
        if machine.is_none() && !recorded && !bundled {
            return Err(SmolvmError::VmMissing {
                machine: machine_name,
            }
            .into());
        }
        // A stop that dies half way is `cleanup`'s to finish; one whose
        // record cannot be written stops all the same.
        if recorded {
            let _ = dir.advance(Phase::Stopping);
        }
        let mut report = CleanupReport::default();
        if let Some(machine) = &machine {
            self.remove_machine(machine, &mut report);
        }
        self.remove_bundle(&machine_name, &mut report);
        if recorded {
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
        let known = self.all_states()?;
        let bundles = self.bundles.bottles()?;
        for machine in &machines {
            // The launch that was creating it died: nobody will ever stop it.
            let owner = known.iter().find(|k| k.machine() == machine.name);
            if owner.is_some_and(|k| k.recorded.record.abandoned())
                && pass.found(CleanupItem::new(
                    "vm",
                    machine.name.clone(),
                    "the launch that created it died",
                ))
            {
                self.remove_machine(machine, &mut pass.report);
            }
        }
        for bottle in &known {
            let record = &bottle.recorded.record;
            let machine_alive = machines.iter().any(|m| m.name == bottle.machine());
            let stopping = record.phase == Phase::Stopping;
            if record.in_flight() || (machine_alive && !record.abandoned() && !stopping) {
                continue;
            }
            let why = if stopping {
                "its stop was not finished"
            } else if record.abandoned() {
                "the launch that made it died"
            } else {
                "its vm is gone"
            };
            if !pass.found(CleanupItem::new("bottle", record.bottle.clone(), why)) {
                continue;
            }
            if stopping {
                // Its machine too, as its finisher would have.
                pass.report.merge(self.finish_stop_bottle(&record.bottle)?);
            } else {
                self.remove_bundle(&record.bottle, &mut pass.report);
                self.remove_state(bottle.machine(), &mut pass.report);
            }
        }
        self.cleanup_broken_pool_entries(&machines, pass)?;
        for bottle in &bundles {
            let owned = machines.iter().any(|m| &m.name == bottle)
                || known.iter().any(|k| k.machine() == bottle);
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

    /// Removes the waiting pool entries whose machine runs but can no
    /// longer be claimed (a record of another layout or unreadable, a
    /// machine stopped or started again since the fill), each once the
    /// pass approves it and this process took it. An entry whose machine
    /// is gone is an ordinary bottle whose vm is gone.
    fn cleanup_broken_pool_entries(
        &self,
        machines: &[MachineEntry],
        pass: &mut CleanupPass<'_>,
    ) -> Result<(), BackendError> {
        for machine in machines {
            let dir = self.state_dir(&machine.name);
            if !bottle_core::pool::is_ready(&dir)
                || bottle_core::pool::backend_of(&dir) != Some(BackendKind::Smolmachines)
            {
                continue;
            }
            let filled = bottle_core::pool::recorded_facts::<SmolvmPoolFacts<H::Prepared>>(&dir);
            let why = match filled.and_then(|filled| {
                bottle_core::pool::stands_as_filled(
                    "machine",
                    &filled.machine,
                    &crate::pool::machine_standing(machine),
                )
            }) {
                Ok(()) => continue,
                Err(why) => why,
            };
            let item = CleanupItem::new("pool entry", machine.name.clone(), why);
            if pass.found(item) && bottle_core::pool::take(&dir, false) {
                pass.report.merge(self.stop_bottle(&machine.name)?);
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
