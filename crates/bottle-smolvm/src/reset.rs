//! The verified reset of a microVM bottle: how smolvm snapshots, reverts,
//! halts and reads a machine ([`ResetSubstrate`]); the protocol itself is
//! `bottle_core::sandbox::reset`.
//!
//! smolvm (through 1.9.3) has no snapshot or restore. Its `machine fork`
//! clones a golden machine's RAM, which needs the golden started
//! `--forkable` and kept frozen, its VMM pinned in memory, for as long as
//! clones exist, and which dies with that process (no reset after a crash
//! or a host reboot); clones cannot be packed. So bottle does not fork: it
//! resets a machine by restoring its disks. A machine's state is its two
//! sparse disks in `machine data-dir` (`storage.raw`: image layers and the
//! container's overlays; `overlay.raw`: the VM's root overlay), whose bytes
//! hold still while it is stopped.
//!
//! - snapshot (at the end of launch): stop, copy both disks to the golden
//!   directory (data extents only), start. That start is what a reset
//!   returns to.
//! - revert: end the in-box agent, stop (which ends every guest process),
//!   restore both disks from the golden copies, hash them, start.
//! - filesystem: the hash of both disks taken right after the restore,
//!   before the start. It cannot be taken later: any boot writes the disks
//!   (ext4's superblock and journal), so the running machine's disks never
//!   equal the golden ones. The baseline is taken the same way, while the
//!   machine is stopped at the snapshot.
//! - open descriptors: counted by a fresh in-box agent, through `/proc` in
//!   the guest (the host cannot read the guest's).
//! - engine: smolvm's own view: the machine's record in its state database
//!   (state, image, source, allowlist, resources, network, mounts, ports)
//!   and `machine ls`'s state.
//!
//! A record whose allowlist is no longer exactly the bundle's `/32` is
//! never started (the launch's invariant holds for every start): the
//! revert leaves the machine stopped, and the engine source reports what
//! changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bottle_core::backend::{BackendError, BackendErrorKind};
use bottle_core::sandbox::{ResetSubstrate, RevertMethod};
use serde_json::Value;

use crate::bottle::SmolvmBottle;
use crate::error::SmolvmError;
use crate::sparse;
use crate::statedb;

/// The disks a reset restores, as `machine data-dir` names them.
pub const DISKS: [&str; 2] = ["storage.raw", "overlay.raw"];

/// The record fields the engine source compares.
const RECORD_FACTS: [&str; 10] = [
    "state",
    "image",
    "source_smolmachine",
    "allowed_cidrs",
    "dns_filter_hosts",
    "cpus",
    "mem",
    "network",
    "mounts",
    "ports",
];

/// One reset (or snapshot) of a microVM bottle.
pub struct VmReset<'a> {
    bottle: &'a SmolvmBottle,
    golden: PathBuf,
    /// The disks' hash, taken while the machine was stopped.
    fs_reading: Mutex<Option<Result<String, String>>>,
}

impl<'a> VmReset<'a> {
    /// The reset of `bottle`, its golden disks in `golden`.
    pub fn new(bottle: &'a SmolvmBottle, golden: PathBuf) -> VmReset<'a> {
        VmReset {
            bottle,
            golden,
            fs_reading: Mutex::new(None),
        }
    }

    /// Stops the machine, lets `between` act on its disks, hashes them,
    /// then starts it unless its record no longer holds exactly the
    /// bundle's `/32`.
    fn while_stopped(
        &self,
        between: impl FnOnce(&Path) -> Result<(), SmolvmError>,
    ) -> Result<(), SmolvmError> {
        let smolvm = &self.bottle.smolvm;
        let machine = &self.bottle.machine;
        self.bottle.end_toolbox();
        smolvm.stop(machine)?;
        let data_dir = smolvm.data_dir(machine)?;
        between(&data_dir)?;
        let disks: Vec<(&str, PathBuf)> = DISKS.iter().map(|d| (*d, data_dir.join(d))).collect();
        let named: Vec<(&str, &Path)> = disks.iter().map(|(n, p)| (*n, p.as_path())).collect();
        let reading = sparse::hash(&named).map_err(|err| err.to_string());
        if let Ok(mut slot) = self.fs_reading.lock() {
            *slot = Some(reading);
        }
        if statedb::verify(&self.bottle.db, machine, &self.bottle.policy).is_ok() {
            smolvm.start(machine)?;
        }
        Ok(())
    }
}

fn backend(err: SmolvmError) -> BackendError {
    err.into()
}

impl ResetSubstrate for VmReset<'_> {
    fn bottle(&self) -> &str {
        &self.bottle.machine
    }

    fn snapshot(&self) -> Result<(), BackendError> {
        let golden = self.golden.clone();
        self.while_stopped(|data_dir| {
            for disk in DISKS {
                sparse::copy(&data_dir.join(disk), &golden.join(disk))?;
            }
            Ok(())
        })
        .map_err(backend)
    }

    fn revert(&self) -> Result<RevertMethod, BackendError> {
        let golden = self.golden.clone();
        if let Some(missing) = DISKS.iter().map(|d| golden.join(d)).find(|p| !p.is_file()) {
            return Err(BackendError::new(
                BackendErrorKind::Failed,
                "BOT-K082",
                format!(
                    "there is no golden snapshot to revert to ({} is missing)",
                    missing.display()
                ),
                "the snapshot is taken at launch when the in-box agent is installed; install `bottle-toolbox` (`cargo xtask install`, or BOTTLE_TOOLBOX_BIN), then stop this bottle and start a new one",
            ));
        }
        self.while_stopped(|data_dir| {
            for disk in DISKS {
                sparse::copy(&golden.join(disk), &data_dir.join(disk))?;
            }
            Ok(())
        })
        .map(|()| RevertMethod::Restart)
        .map_err(backend)
    }

    fn read_fs_hash(&self) -> Result<String, BackendError> {
        let reading = self.fs_reading.lock().ok().and_then(|slot| slot.clone());
        match reading {
            Some(Ok(hash)) => Ok(hash),
            Some(Err(why)) => Err(failed(format!("hashing the disks failed: {why}"))),
            None => Err(failed(
                "no reading of the disks was taken while the machine was stopped".into(),
            )),
        }
    }

    fn read_open_fds(&self) -> Result<u64, BackendError> {
        self.bottle
            .toolbox
            .count_open_fds(|| self.bottle.open_toolbox())
            .map(|fds| fds.count)
            .map_err(|err| BackendError::from_coded(BackendErrorKind::Failed, err))
    }

    fn read_engine(&self) -> Result<BTreeMap<String, String>, BackendError> {
        let machine = &self.bottle.machine;
        let record = statedb::read(&self.bottle.db, machine).map_err(backend)?;
        let mut facts: BTreeMap<String, String> = RECORD_FACTS
            .iter()
            .map(|key| {
                let value = match &record[*key] {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                (format!("record.{key}"), value)
            })
            .collect();
        let listed = self
            .bottle
            .smolvm
            .list()
            .map_err(backend)?
            .into_iter()
            .find(|entry| &entry.name == machine)
            .map_or_else(|| "missing".to_string(), |entry| entry.state().to_string());
        facts.insert("ls.state".into(), listed);
        Ok(facts)
    }

    fn halt(&self) -> Result<(), BackendError> {
        self.bottle.end_toolbox();
        self.bottle
            .smolvm
            .stop(&self.bottle.machine)
            .map_err(backend)
    }
}

fn failed(message: String) -> BackendError {
    BackendError::new(
        BackendErrorKind::Failed,
        "BOT-K081",
        message,
        "the machine's disks could not be read while it was stopped; check `smolvm machine data-dir` and the disk files' permissions",
    )
}
