//! The faults: a bundle killed under its agent, the Docker daemon
//! restarted under running bottles, and bottles started all at once.

use anyhow::bail;
use bottle_probe::contract::{ProbeResult, Targets};

use super::probing::{ProbeSet, network_and_proxy};
use super::{Bottle, C, D, Gate, OTHER_BUNDLE_PROBE, PARALLEL, progress};
use crate::escape::dockerd;
use crate::escape::fixture;
use crate::escape::report::{Expect, Observed, Row};

impl Gate {
    /// Fault (a): the bundle dies; the agent must be left with nothing.
    pub(super) fn fault_bundle_kill(
        &mut self,
        a: &mut Bottle,
        b: &Bottle,
        targets: &Targets,
        before: &[ProbeResult],
    ) -> anyhow::Result<()> {
        let phase = "fault: A's bundle killed";
        self.engine.kill(&format!("{}-bundle", a.guard.name))?;
        let only = network_and_proxy(before);
        if only.is_empty() {
            bail!("bottle A's probe reported no network or proxy probes to re-run");
        }
        self.probe_phase(
            phase,
            a,
            Some(b),
            targets.clone(),
            ProbeSet::AfterFault(only),
        )?;
        Ok(())
    }

    /// Fault (b): the daemon restarts under running bottles; old bottles
    /// stay blocked whatever state they are in, and a fresh one is as
    /// isolated as the first.
    pub(super) fn fault_dockerd_restart(
        &mut self,
        a: &mut Bottle,
        b: &mut Bottle,
        before: &[ProbeResult],
    ) -> anyhow::Result<()> {
        let phase = "fault: dockerd restarted";
        let how = dockerd::restart(&self.sys, &self.engine)?;
        self.report.rows.push(Row::new(
            phase,
            "dockerd-restart",
            "fault",
            Expect::Reached,
            Observed::Reached,
            None,
            format!("restarted ({how}); the Engine answers again"),
        ));
        let network_only: Vec<String> = before
            .iter()
            // The other old bottle's proxy is down with it.
            .filter(|r| r.network && r.probe != OTHER_BUNDLE_PROBE)
            .map(|r| r.probe.clone())
            .collect();
        let (targets_a, targets_b) = (self.targets(a, b), self.targets(b, a));
        for (label, bottle, targets) in [("A", &mut *a, targets_a), ("B", &mut *b, targets_b)] {
            let running = self.agent_running(bottle);
            let sub = format!("{phase}: old bottle {label}");
            if !running {
                self.report.rows.push(Row::new(
                    &sub,
                    "old-bottle-state",
                    "fault",
                    Expect::Blocked,
                    Observed::Blocked,
                    None,
                    "its agent is no longer running after the restart: nothing left to escape from",
                ));
                continue;
            }
            self.probe_phase(
                &sub,
                bottle,
                None,
                targets,
                ProbeSet::AfterFault(network_only.clone()),
            )?;
        }
        progress("starting fresh bottles C and D after the restart");
        let mut started = self.launch_each(&[C, D])?.into_iter();
        let (Some(mut c), Some(d)) = (started.next(), started.next()) else {
            bail!("bottles C and D did not both start");
        };
        let targets = self.targets(&c, &d);
        self.probe_phase(
            &format!("{phase}: fresh bottle C"),
            &mut c,
            Some(&d),
            targets,
            ProbeSet::Full,
        )?;
        self.posture(&format!("{phase}: posture C"), &c)?;
        Ok(())
    }

    /// Fault (c): three bottles start at once; each reaches its own
    /// allowed host through its proxy and none of the others'.
    pub(super) fn fault_parallel(&mut self) -> anyhow::Result<()> {
        let phase = "fault: 3 bottles at once";
        let bottles = self.launch_many(PARALLEL)?;
        self.refresh_egress()?;
        let hits_before = self.listeners.hits().len();
        let dns_before = self.dns.queries().len();
        let hosts: Vec<String> = PARALLEL.iter().map(|k| fixture::allowed_host(k)).collect();
        for bottle in &bottles {
            let own = fixture::allowed_host(&bottle.key);
            for host in &hosts {
                let answer = self.fetch_through_proxy(bottle, host)?;
                let reached = answer.contains(&self.token);
                let mine = host == &own;
                self.report.rows.push(Row::new(
                    phase,
                    &format!("{} -> {host}", fixture::short(&bottle.key)),
                    if mine { "control" } else { "proxy" },
                    if mine {
                        Expect::Reached
                    } else {
                        Expect::Blocked
                    },
                    Observed::reached_if(reached),
                    None,
                    format!(
                        "GET through the proxy: {:?}{}",
                        answer.lines().next().unwrap_or("no answer").trim(),
                        if reached {
                            ", canary token in the body"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        let queries = self.dns.queries()[dns_before..].to_vec();
        self.evidence(phase, hits_before, &queries, &hosts);
        for bottle in &bottles {
            self.posture(
                &format!("{phase}: posture {}", fixture::short(&bottle.key)),
                bottle,
            )?;
        }
        Ok(())
    }
}
