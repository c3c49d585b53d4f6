//! The smolmachines backend's warm pool ([`WarmPool`]): microVM bottles
//! launched ahead of `bottle start`, their golden snapshot taken, nothing
//! of the agent running. The entries' files, the claim and the drain are
//! [`bottle_core::pool`]'s; this is what a microVM bottle's fingerprint
//! covers, what is recorded at fill ([`SmolvmPoolFacts`], the plan among
//! it: a microVM bottle keeps no plan file of its own) and the claim's
//! checks.
//!
//! A claim re-reads two of reset's three sources: the open descriptors
//! (through a fresh in-box agent) and smolvm's record of the machine (its
//! allowlist, image, resources, network). It cannot re-read the disks: they
//! are hashed while the machine is stopped (a booted machine's disks never
//! equal the golden ones, [`crate::reset`]), and stopping and starting the
//! machine would cost the boot the pool is there to save. Instead the
//! claim requires the very VMM process of the fill (its pid and creation
//! time, and `running`), so the disks are those of the machine the fill
//! left running, with nothing of the agent ever started on them.

use std::collections::BTreeMap;
use std::path::Path;

use bottle_core::backend::{BackendError, BackendKind, Bottle, BottleBackend, CleanupReport};
use bottle_core::bundle_host::BundleHost;
use bottle_core::life::{Phase, StateDir};
use bottle_core::plan::PlannedDevice;
use bottle_core::pool::{
    Claim, Fingerprint, PoolHost, PoolRecord, WarmPool, mark_ready, stands_as_filled,
};
use bottle_core::sandbox::reset::{check_against_baseline, divergence};
use bottle_core::sandbox::{ResetFiles, Source};
use bottle_core::spec::BottleSpec;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::backend::{SmolvmBackend, SmolvmPlan};
use crate::cli::MachineEntry;
use crate::data::{PLAN_DATA_VERSION, STATE_VERSION};
use crate::error::SmolvmError;
use crate::reset::VmReset;
use crate::statedb;

/// What the smolmachines backend records of an entry at fill.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "P: Serialize + DeserializeOwned")]
pub(crate) struct SmolvmPoolFacts<P> {
    /// The machine's VMM at fill ([`machine_standing`]).
    pub machine: BTreeMap<String, String>,
    /// The bundle host's word on the bundle at fill
    /// ([`BundleHost::standing`]).
    pub bundle: BTreeMap<String, String>,
    /// The plan the entry was launched from, handed to the claiming start.
    pub plan: SmolvmPlan<P>,
}

/// What `machine ls` says of a machine's VMM: a stop, a restart or a new
/// machine of the name changes it.
pub(crate) fn machine_standing(entry: &MachineEntry) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("state".to_string(), entry.state().to_string()),
        (
            "pid".to_string(),
            entry
                .pid
                .map_or_else(|| "none".into(), |pid| pid.to_string()),
        ),
        (
            "created".to_string(),
            entry.created().unwrap_or_else(|| "unknown".into()),
        ),
    ])
}

impl<H: BundleHost + 'static> WarmPool for SmolvmBackend<H> {
    /// What every backend's bottle is made from ([`Fingerprint::spec`]),
    /// the state layout, the agent image's ID, the smolvm release, the
    /// in-box agent binary, and the bundle's inputs
    /// ([`BundleHost::fingerprint`]).
    fn pool_fingerprint(
        &self,
        spec: &BottleSpec,
        devices: &[PlannedDevice],
    ) -> Result<String, BackendError> {
        let mut fingerprint = Fingerprint::new();
        fingerprint.field(
            "state-layout",
            format!("{STATE_VERSION}/{PLAN_DATA_VERSION}").as_bytes(),
        );
        fingerprint.spec(spec, devices).map_err(SmolvmError::from)?;
        let image = self
            .images
            .inspect(crate::backend::image_reference(spec)?)?;
        fingerprint.field("image", image.id.as_bytes());
        fingerprint.field("smolvm", self.smolvm.version()?.to_string().as_bytes());
        if let Some(toolbox) = bottle_core::bundle_binary::first_file(&self.toolbox_places) {
            fingerprint
                .file("toolbox-binary", toolbox)
                .map_err(SmolvmError::from)?;
        }
        self.bundles.fingerprint(spec, &mut fingerprint)?;
        Ok(fingerprint.finish())
    }

    /// Records the machine's VMM, the bundle and the plan as they stand
    /// now. Refuses a bottle without a golden snapshot: a claim could not
    /// check it against its baseline.
    fn mark_pooled(
        &self,
        plan: &SmolvmPlan<H::Prepared>,
        fingerprint: &str,
    ) -> Result<(), BackendError> {
        if !ResetFiles::new(&plan.state_dir).baseline().exists() {
            return Err(SmolvmError::PoolNeedsReset {
                bottle: plan.bottle.clone(),
            }
            .into());
        }
        let machine = &plan.backend_data.machine;
        let entry = self
            .machines()?
            .into_iter()
            .find(|m| &m.name == machine)
            .ok_or_else(|| SmolvmError::VmMissing {
                machine: machine.clone(),
            })?;
        let facts = SmolvmPoolFacts {
            machine: machine_standing(&entry),
            bundle: self.bundles.standing(&plan.bottle)?,
            plan: plan.clone(),
        };
        let record =
            PoolRecord::new(&plan.agent, fingerprint, &facts).map_err(SmolvmError::from)?;
        mark_ready(&plan.state_dir, &record).map_err(SmolvmError::from)?;
        Ok(())
    }

    fn claim_pooled(
        &self,
        agent: &str,
        fingerprint: &str,
        detached: bool,
    ) -> Result<Claim<SmolvmPlan<H::Prepared>>, BackendError> {
        let host = SmolvmPoolHost { backend: self };
        Ok(
            bottle_core::pool::claim(&host, self.state_root(), agent, fingerprint, detached)
                .map_err(SmolvmError::from)?,
        )
    }

    fn drain_pool(&self, agent: Option<&str>) -> Result<CleanupReport, BackendError> {
        let host = SmolvmPoolHost { backend: self };
        bottle_core::pool::drain(&host, self.state_root(), agent)
    }
}

/// The microVM side of a claim.
struct SmolvmPoolHost<'a, H> {
    backend: &'a SmolvmBackend<H>,
}

impl<H: BundleHost + 'static> PoolHost for SmolvmPoolHost<'_, H> {
    type Plan = SmolvmPlan<H::Prepared>;

    fn kind(&self) -> BackendKind {
        BackendKind::Smolmachines
    }

    fn recheck(&self, dir: &Path, record: &PoolRecord) -> Result<Self::Plan, String> {
        let facts: SmolvmPoolFacts<H::Prepared> =
            record.facts(dir).map_err(|err| err.to_string())?;
        recheck(self.backend, dir, facts)
    }

    fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError> {
        BottleBackend::attach(self.backend, name)
    }

    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        self.backend.stop_bottle(name)
    }
}

/// The claim's microVM checks of the entry in `dir` recorded as `facts`,
/// each failing with why; its plan when every one passed.
fn recheck<H: BundleHost + 'static>(
    backend: &SmolvmBackend<H>,
    dir: &Path,
    facts: SmolvmPoolFacts<H::Prepared>,
) -> Result<SmolvmPlan<H::Prepared>, String> {
    let plan = facts.plan;
    let slug = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if plan.backend != BackendKind::Smolmachines || plan.slug != slug {
        return Err("its plan is not this microVM bottle's".into());
    }
    let phase = StateDir::new(dir).phase();
    if phase != Some(Phase::Running) {
        return Err(format!(
            "its record says {}, not running",
            phase.map_or("nothing", Phase::as_str)
        ));
    }
    let machine = &plan.backend_data.machine;
    let entry = backend
        .machines()
        .map_err(|err| err.to_string())?
        .into_iter()
        .find(|m| &m.name == machine)
        .ok_or_else(|| format!("its machine {machine} is gone"))?;
    stands_as_filled("machine", &facts.machine, &machine_standing(&entry))?;
    let state = backend
        .read_state(machine)
        .map_err(|err| err.to_string())?
        .ok_or_else(|| "it has no state file".to_string())?;
    let bottle = backend
        .bottle_of(machine, &state)
        .map_err(|err| err.to_string())?;
    // The launch's invariant: the machine's allowlist is the bundle's /32.
    statedb::verify(&bottle.db, machine, &bottle.policy).map_err(|err| err.to_string())?;
    let files = ResetFiles::new(dir);
    let substrate = VmReset::new(&bottle, files.golden_dir());
    let checks = check_against_baseline(&substrate, &files, &[Source::OpenFds, Source::Engine]);
    bottle.end_toolbox();
    let diverged = divergence(&checks);
    if !diverged.is_empty() {
        return Err(format!(
            "the machine differs from its snapshot ({diverged})"
        ));
    }
    let bundle = backend
        .bundles
        .standing(&plan.bottle)
        .map_err(|err| err.to_string())?;
    stands_as_filled("bundle", &facts.bundle, &bundle)?;
    backend
        .bundles
        .answers(&plan.bottle, &plan.backend_data.bundle.data)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_stands_by_its_vmms_state_pid_and_creation() {
        let entry = |state: &str, pid: Option<i64>| MachineEntry {
            name: "bot-bottle-x".into(),
            state: Some(state.into()),
            pid,
            created_at: Some(serde_json::json!(1_700_000_000)),
        };
        let filled = machine_standing(&entry("running", Some(41)));
        assert_eq!(filled["pid"], "41");
        assert_eq!(filled["created"], "1700000000");
        let same = machine_standing(&entry("running", Some(41)));
        assert_eq!(stands_as_filled("machine", &filled, &same), Ok(()));
        let restarted = machine_standing(&entry("running", Some(42)));
        assert!(
            stands_as_filled("machine", &filled, &restarted)
                .unwrap_err()
                .contains("pid changed")
        );
        let stopped = machine_standing(&entry("stopped", None));
        assert!(stands_as_filled("machine", &filled, &stopped).is_err());
    }
}
