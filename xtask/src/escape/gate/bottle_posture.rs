//! A running bottle seen from the host: the agent container's (or the
//! microVM's) posture as the Engine, the kernel and smolvm's state
//! database record it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::{Bottle, Gate};
use crate::escape::fixture;
use crate::escape::posture;
use crate::escape::report::{Expect, Observed, Row};

impl Gate {
    /// The agent as the Engine and the kernel see it, while an exec'd
    /// process runs in it too.
    pub(super) fn posture(&mut self, phase: &str, bottle: &Bottle) -> anyhow::Result<()> {
        if self.smolvm.is_some() {
            return self.vm_posture(phase, bottle);
        }
        let agent = format!("{}-agent", bottle.guard.name);
        let spec = self.posture_spec(&bottle.guard.name);
        let inspect = self.engine.inspect_container(&agent)?;
        self.report
            .rows
            .extend(posture::check_inspect(phase, &inspect, &spec));
        if let Some(runtime) = self.gvisor.clone() {
            // The box's processes live in gVisor's kernel; on the host
            // there are gVisor's own, in the box's cgroup.
            let sandbox = inspect["State"]["Pid"].as_u64().unwrap_or(0);
            let pids = u32::try_from(sandbox)
                .ok()
                .filter(|p| *p > 0)
                .map(posture::gvisor_processes)
                .unwrap_or_else(|| Err("the Engine reports no process".into()));
            let pids = pids.map_err(|why| anyhow::anyhow!("{}: {why}", bottle.guard.name))?;
            self.report.rows.extend(posture::check_gvisor_processes(
                phase,
                &pids,
                &spec,
                &runtime.path,
            ));
            return Ok(());
        }
        let cli = self.cli.clone();
        let name = bottle.guard.name.clone();
        let sleeper =
            std::thread::spawn(move || cli.exec(&name, &["sleep", "8"], Duration::from_secs(30)));
        // Bounded wait for the exec'd process to show up.
        let deadline = Instant::now() + Duration::from_secs(6);
        let mut pids = self.engine.container_pids(&agent)?;
        while pids.len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            pids = self.engine.container_pids(&agent)?;
        }
        self.report
            .rows
            .extend(posture::check_processes(phase, &pids, &spec));
        let _ = sleeper.join();
        Ok(())
    }

    /// What the agent container of bottle `name` must look like: the
    /// manifest's limits, translated for gVisor in a gVisor run.
    pub(super) fn posture_spec(&self, name: &str) -> posture::Spec {
        let tier = if self.gvisor.is_some() {
            bottle_core::isolation::Isolation::Gvisor
        } else {
            bottle_core::isolation::Isolation::Container
        };
        let pids = u32::try_from(fixture::PIDS).unwrap_or(u32::MAX);
        let limits =
            bottle_core::isolation::engine_limits(tier, fixture::MEMORY_BYTES as u64, pids);
        posture::Spec {
            memory: i64::try_from(limits.memory).unwrap_or(i64::MAX),
            pids: limits.pids,
            network: name.to_string(),
            runtime: self.gvisor.as_ref().map(|runtime| runtime.name.clone()),
        }
    }

    /// Whether the bottle's agent (container or VM) still runs.
    pub(super) fn agent_running(&self, bottle: &Bottle) -> bool {
        match &self.smolvm {
            Some(smolvm) => smolvm.list().is_ok_and(|machines| {
                machines
                    .iter()
                    .any(|m| m.name == bottle.guard.name && m.state() == "running")
            }),
            None => self
                .engine
                .inspect_container(&format!("{}-agent", bottle.guard.name))
                .map(|i| i["State"]["Running"].as_bool() == Some(true))
                .unwrap_or(false),
        }
    }

    /// A microVM bottle from the host side: the machine's record in
    /// smolvm's state database holds exactly the bundle's /32 (and no DNS
    /// names), the VM process runs, and the bundle container is hardened.
    fn vm_posture(&mut self, phase: &str, bottle: &Bottle) -> anyhow::Result<()> {
        let Some(smolvm) = &self.smolvm else {
            bail!("no smolvm on a smolmachines run");
        };
        let machine = &bottle.guard.name;
        let bundle: std::net::Ipv4Addr = bottle
            .bundle_ip
            .parse()
            .with_context(|| format!("bundle address {:?} of {machine}", bottle.bundle_ip))?;
        let policy = bottle_smolvm::statedb::EgressPolicy::one_address(bundle);
        let db = bottle_smolvm::statedb::state_db_path_from_env(smolvm.version().ok())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let (observed, detail) = match bottle_smolvm::statedb::verify(&db, machine, &policy) {
            Ok(()) => (
                Observed::Blocked,
                format!("{}: {}", db.display(), policy.describe()),
            ),
            Err(err @ bottle_smolvm::SmolvmError::AllowlistNotPersisted { .. }) => {
                (Observed::Reached, err.to_string())
            }
            Err(err) => (Observed::Error, err.to_string()),
        };
        self.report.rows.push(Row::new(
            phase,
            "vm-allowlist",
            "posture",
            Expect::Blocked,
            observed,
            None,
            detail,
        ));

        let entry = smolvm
            .list()
            .map_err(|e| anyhow::anyhow!("smolvm machine ls: {e}"))?
            .into_iter()
            .find(|m| &m.name == machine);
        let (observed, detail) = match &entry {
            Some(m) if m.state() == "running" => match m.pid {
                Some(pid) if Path::new(&format!("/proc/{pid}")).exists() => (
                    Observed::Blocked,
                    format!("running, VM process {pid} alive"),
                ),
                pid => (
                    Observed::Error,
                    format!("running, but its VM process {pid:?} does not exist on this host"),
                ),
            },
            Some(m) => (Observed::Error, format!("machine is {}", m.state())),
            None => (
                Observed::Error,
                "`smolvm machine ls` does not list it".into(),
            ),
        };
        self.report.rows.push(Row::new(
            phase,
            "vm-process",
            "posture",
            Expect::Blocked,
            observed,
            None,
            detail,
        ));

        let inspect = self
            .engine
            .inspect_container(&format!("{machine}-bundle"))?;
        self.report
            .rows
            .extend(posture::check_bundle_inspect(phase, &inspect, machine));
        Ok(())
    }
}
