//! A bottle reset through its standby (docker): the reset swaps the
//! standby the background preparation made in, and from then on the old
//! box reaches nothing (frozen, with no interface but loopback: positive
//! controls, the same readings of the same box before the reset); the new
//! box holds the hardening of a launched one and blocks the same probes.
//! A gVisor box resets by restart, which the row records.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::Value;

use super::probing::ProbeSet;
use super::{Bottle, Gate, OTHER_BUNDLE_PROBE};
use crate::escape::report::{Expect, Observed, Row};
use bottle_probe::contract::ProbeResult;

/// How long the background preparation may take to make a standby.
const STANDBY_WITHIN: Duration = Duration::from_secs(90);

/// What the host sees of one box from outside.
struct Seen {
    /// Interfaces in the box's network namespace other than loopback.
    interfaces: Vec<String>,
    /// The box's freezer says frozen.
    frozen: bool,
}

impl Gate {
    /// Resets `b` through its standby, checks the old box is cut off and
    /// probes the new box with the network probes `b` ran before.
    pub(super) fn reset_phase(
        &mut self,
        b: &mut Bottle,
        a: &Bottle,
        before: &[ProbeResult],
    ) -> anyhow::Result<()> {
        let phase = "reset: B through its standby";
        let agent = format!("{}-agent", b.guard.name);
        let standby = format!("{agent}-standby");
        let gvisor = self.gvisor.is_some();
        if !gvisor {
            self.wait_for_standby(&standby)?;
        }
        let old = self.engine.inspect_container(&agent)?;
        let old_id = old["Id"].as_str().unwrap_or_default().to_string();
        let old_pid = pid_of(&old)?;
        // A gVisor box resets by restart: there is no old box to look at.
        let seen_before = if gvisor { None } else { Some(seen(old_pid)?) };
        let old_start = process_start(old_pid);

        let out = self.cli.reset(&b.guard.name)?;
        let method = if gvisor { "restart" } else { "standby" };
        let said = format!("reset verified (revert by {method} ");
        self.report.rows.push(Row::new(
            phase,
            "reset-verified",
            "reset",
            Expect::Reached,
            Observed::reached_if(out.success() && out.stdout.contains(&said)),
            None,
            format!(
                "`bottle reset` said: {}",
                out.stdout.lines().last().unwrap_or_default()
            ),
        ));
        if !out.success() {
            bail!(
                "`bottle reset {}` failed: {}",
                b.guard.name,
                out.stderr.trim()
            );
        }
        // The reset reverted the box: the probe is gone with the rest.
        b.probe_copied = false;

        if let Some(seen_before) = seen_before {
            // The next preparation removes the old box when it is done;
            // one already removed is judged by its process.
            let Ok(retired) = self.engine.inspect_container(&old_id) else {
                let alive = process_start(old_pid).is_some_and(|s| Some(s) == old_start);
                for probe in ["old-box-network", "old-box-processes"] {
                    self.report.rows.push(Row::new(
                        phase,
                        probe,
                        "reset",
                        Expect::Blocked,
                        Observed::reached_if(alive),
                        Some(!seen_before.interfaces.is_empty() && !seen_before.frozen),
                        if alive {
                            "the Engine no longer knows the old box, but its init process still runs"
                        } else {
                            "the next preparation already removed the old box: its init process is gone"
                        },
                    ));
                }
                return self.after_reset(b, a, before);
            };
            let networks = retired["NetworkSettings"]["Networks"]
                .as_object()
                .map(|n| n.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default();
            let seen_after = seen(old_pid)?;
            let interfaces = seen_after.interfaces;
            self.report.rows.push(Row::new(
                phase,
                "old-box-network",
                "reset",
                Expect::Blocked,
                Observed::reached_if(!interfaces.is_empty() || !networks.is_empty()),
                Some(!seen_before.interfaces.is_empty()),
                format!(
                    "after the reset the old box has interfaces {interfaces:?} and Engine networks {networks:?} (before: {:?})",
                    seen_before.interfaces
                ),
            ));
            self.report.rows.push(Row::new(
                phase,
                "old-box-processes",
                "reset",
                Expect::Blocked,
                Observed::reached_if(!seen_after.frozen),
                Some(!seen_before.frozen),
                format!(
                    "after the reset the old box's freezer says {} (before: {})",
                    if seen_after.frozen {
                        "frozen"
                    } else {
                        "thawed"
                    },
                    if seen_before.frozen {
                        "frozen"
                    } else {
                        "thawed"
                    },
                ),
            ));
        }

        self.after_reset(b, a, before)
    }

    /// The new box: the hardening of a launched one, and `b`'s network
    /// probes blocked again.
    fn after_reset(
        &mut self,
        b: &mut Bottle,
        a: &Bottle,
        before: &[ProbeResult],
    ) -> anyhow::Result<()> {
        self.posture("posture B after its reset", b)?;
        let network_only: Vec<String> = before
            .iter()
            .filter(|r| r.network && r.probe != OTHER_BUNDLE_PROBE)
            .map(|r| r.probe.clone())
            .collect();
        if network_only.is_empty() {
            bail!("bottle B's probe reported no network probes to re-run");
        }
        let targets = self.targets(b, a);
        self.probe_phase(
            "reset: B after its reset",
            b,
            Some(a),
            targets,
            ProbeSet::AfterFault(network_only),
        )?;
        Ok(())
    }

    /// Waits (bounded) until the standby waits, paused.
    fn wait_for_standby(&self, standby: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + STANDBY_WITHIN;
        loop {
            if let Ok(inspect) = self.engine.inspect_container(standby)
                && inspect["State"]["Paused"] == true
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "no standby {standby} waited within {} s of the start",
                    STANDBY_WITHIN.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The start time of process `pid` (`/proc/<pid>/stat` field 22), which
/// tells a process from a later one given the same pid.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it do not.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19).map(str::to_string)
}

fn pid_of(inspect: &Value) -> anyhow::Result<u32> {
    inspect["State"]["Pid"]
        .as_u64()
        .and_then(|pid| u32::try_from(pid).ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| anyhow::anyhow!("the Engine reports no process of the agent's box"))
}

/// The box of init process `pid`, from the host's `/proc` and cgroups.
fn seen(pid: u32) -> anyhow::Result<Seen> {
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))?;
    let interfaces = dev
        .lines()
        .skip(2)
        .filter_map(|line| line.split(':').next())
        .map(|name| name.trim().to_string())
        .filter(|name| name != "lo")
        .collect();
    Ok(Seen {
        interfaces,
        frozen: frozen(pid)?,
    })
}

/// Whether the freezer of `pid`'s cgroup says frozen: cgroup v1's
/// `freezer.state`, or cgroup v2's `cgroup.freeze`.
fn frozen(pid: u32) -> anyhow::Result<bool> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next(), fields.next(), fields.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "freezer") {
            let state = PathBuf::from("/sys/fs/cgroup/freezer")
                .join(path)
                .join("freezer.state");
            return Ok(std::fs::read_to_string(state)?.trim() == "FROZEN");
        }
        if controllers.is_empty() {
            let state = PathBuf::from("/sys/fs/cgroup")
                .join(path)
                .join("cgroup.freeze");
            if state.exists() {
                return Ok(std::fs::read_to_string(state)?.trim() == "1");
            }
        }
    }
    bail!("no freezer cgroup for process {pid}")
}
