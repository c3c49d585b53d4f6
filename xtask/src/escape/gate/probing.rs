//! One probing phase inside a bottle: the probe's own rows, and the
//! harness's evidence from the canaries and the DNS recorder.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use bottle_probe::contract::{ProbeConfig, ProbeResult, Targets};

use super::{
    A, B, BOTTLE_DIR, Bottle, C, D, Gate, OTHER_BUNDLE_PROBE, PARALLEL, PROBE_RUN_BOUND,
    PROBE_TIMEOUT_MS,
};
use crate::escape::canary;
use crate::escape::dns;
use crate::escape::evidence::{self, Allowance, DnsAllowance};
use crate::escape::fixture;
use crate::escape::probe;
use crate::escape::route;
use crate::escape::sys::Output;

/// Which probes a phase runs, and so what it may expect of the bottle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ProbeSet {
    /// Every probe, on a bottle as launched: the in-bottle proxy control
    /// must reach, and the DNS upstream control runs (its outcome backs
    /// the rebinding probes).
    Full,
    /// These probes again, after a fault: the in-bottle proxy control is
    /// expected blocked too (the bundle may be gone), and the DNS upstream
    /// control is not repeated.
    AfterFault(Vec<String>),
}

impl ProbeSet {
    /// The probe names to run; empty runs them all.
    fn only(&self) -> Vec<String> {
        match self {
            Self::Full => Vec::new(),
            Self::AfterFault(only) => only.clone(),
        }
    }

    /// Whether the bottle's own proxy must serve its allowed host.
    fn proxy_expected(&self) -> bool {
        matches!(self, Self::Full)
    }

    /// Whether the phase checks that the bottle's DNS queries went only to
    /// its bundle's upstream.
    fn checks_dns_upstream(&self) -> bool {
        matches!(self, Self::Full)
    }
}

impl Gate {
    /// Tells the probe the bottle's tier. A gVisor box's memory hog ends
    /// the whole box (the host kills the sandbox), so in a gVisor run it
    /// runs alone, last, in a bottle of its own (`gvisor.rs`).
    pub(super) fn for_the_tier(&self, config: &mut ProbeConfig) {
        if self.gvisor.is_some() {
            config.isolation = "gvisor".into();
            if config.only.is_empty() {
                config.skip.push(super::gvisor::MEMORY_PROBE.to_string());
            }
        }
    }

    pub(super) fn write_config(&mut self, config: &ProbeConfig) -> anyhow::Result<PathBuf> {
        self.config_seq += 1;
        let path = self.work.join(format!("probe-{}.json", self.config_seq));
        std::fs::write(&path, serde_json::to_vec_pretty(config)?)?;
        Ok(path)
    }

    /// Copies the probe (once) and a config into `bottle` and runs it.
    pub(super) fn exec_probe(
        &mut self,
        bottle: &mut Bottle,
        config: &ProbeConfig,
    ) -> anyhow::Result<Output> {
        if !bottle.probe_copied {
            self.cli
                .cp(&self.probe_bin, &bottle.guard.name, BOTTLE_DIR)?;
            bottle.probe_copied = true;
        }
        let path = self.write_config(config)?;
        self.cli.cp(&path, &bottle.guard.name, BOTTLE_DIR)?;
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .context("config file name")?
            .to_string();
        self.cli.exec(
            &bottle.guard.name,
            &[
                format!("{BOTTLE_DIR}/bottle-probe"),
                "--config".into(),
                format!("{BOTTLE_DIR}/{file}"),
            ],
            PROBE_RUN_BOUND,
        )
    }

    /// One probing phase: the probe's rows plus the harness's own
    /// evidence from the canaries and the DNS recorder.
    pub(super) fn probe_phase(
        &mut self,
        phase: &str,
        bottle: &mut Bottle,
        other: Option<&Bottle>,
        targets: Targets,
        probes: ProbeSet,
    ) -> anyhow::Result<Vec<ProbeResult>> {
        let mut config = probe::bottle_config(
            &self.token,
            PROBE_TIMEOUT_MS,
            targets.clone(),
            probes.only(),
        );
        self.for_the_tier(&mut config);
        match other {
            Some(other) => {
                let alive = self.proxy_alive(phase, other)?;
                self.extra_controls
                    .insert(OTHER_BUNDLE_PROBE.to_string(), alive);
            }
            None => {
                self.extra_controls.remove(OTHER_BUNDLE_PROBE);
            }
        }
        if self.smolvm.is_some() {
            self.check_dialled_from_host(&config)?;
        }
        let hits_before = self.listeners.hits().len();
        let dns_before = self.dns.queries().len();
        // A tool call before the flood, whose audit line must outlive it.
        let seed = (probes == ProbeSet::Full).then(|| self.audit_seed(&bottle.guard.name));
        let out = self.exec_probe(bottle, &config)?;
        if probes == ProbeSet::Full {
            // Before the probe's rows: the host's refs are the control of
            // its signed-push rows.
            self.git_evidence(phase, &bottle.key)?;
        }
        let queries = self.dns.queries()[dns_before..].to_vec();
        if probes.checks_dns_upstream() {
            let (row, ok) = evidence::upstream_control(
                phase,
                &queries,
                &targets.rebind_hosts,
                &self.bottle_subnets,
            );
            self.report.rows.push(row);
            for host in &targets.rebind_hosts {
                self.extra_controls
                    .insert(probe::rebind_probe_name(host), ok);
            }
        }
        let (rows, results) = probe::bottle_rows(
            phase,
            &out,
            &self.controls,
            &self.extra_controls,
            probes.proxy_expected(),
        );
        self.report.rows.extend(rows);
        self.evidence(
            phase,
            hits_before,
            &queries,
            &[
                targets.allowed_host.clone(),
                targets.credential_host.clone(),
                targets.redact_host.clone(),
            ],
        );
        if let Some(seed) = &seed {
            self.redaction_evidence(phase, hits_before);
            self.operator_output(phase, &bottle.guard.name)?;
            self.copy_evidence(phase, &bottle.guard.name, &results)?;
            self.audit_evidence(phase, &bottle.guard.name, &bottle.key, seed, &results)?;
        }
        Ok(results)
    }

    pub(super) fn evidence(
        &mut self,
        phase: &str,
        hits_before: usize,
        queries: &[dns::Recorded],
        allowed: &[String],
    ) {
        let hits = self.listeners.hits()[hits_before..].to_vec();
        let allowance = Allowance {
            egress: self.egress.clone(),
            pinned: vec![
                SocketAddr::from((canary::INTERNET, 80)),
                SocketAddr::from((canary::INTERNET, 443)),
            ],
            allowed_hosts: allowed.to_vec(),
            relayed: vec![SocketAddr::from((
                canary::PINNED_TCP,
                canary::PINNED_TCP_PORT,
            ))],
            host_services: vec![SocketAddr::from((
                std::net::Ipv4Addr::LOCALHOST,
                self.ports.host_service,
            ))],
        };
        self.report
            .rows
            .push(evidence::canary_row(phase, &hits, &allowance));
        self.report.rows.push(evidence::secret_row(
            phase,
            "credential-on-the-wire",
            &hits,
            &super::credential_secret(&self.token),
            self.credential_detector,
        ));
        self.split_evidence(phase, &hits);
        let mut pinned: Vec<String> = [A, B, C, D]
            .iter()
            .chain(PARALLEL)
            .flat_map(|k| [fixture::allowed_host(k), fixture::redact_host(k)])
            .collect();
        pinned.sort();
        let dns_allowance = DnsAllowance {
            bottle_subnets: self.bottle_subnets.clone(),
            canary_names: self.canary_names(),
            pinned_names: pinned,
        };
        self.report
            .rows
            .extend(evidence::dns_rows(phase, queries, &dns_allowance));
    }

    /// smolvm dials a guest's traffic from the host: every address a
    /// smolmachines probe config names must route locally, or straight onto
    /// a bottle bridge this run created. (On the fake the probe itself runs
    /// on the host, so this is what keeps it on this machine.)
    fn check_dialled_from_host(&self, config: &ProbeConfig) -> anyhow::Result<()> {
        for addr in probe::dialled_addresses(config) {
            let ip: IpAddr = addr
                .parse()
                .with_context(|| format!("probe target {addr:?}"))?;
            let out = self.sys.run("ip", &["route", "get", &addr])?;
            route::check_local_or_bridge(ip, &out, &self.bottle_bridges)
                .map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }
}

/// The names of the network and proxy probes of an earlier run.
pub(super) fn network_and_proxy(results: &[ProbeResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.network || r.category == "proxy")
        .map(|r| r.probe.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_proxy_probes_are_picked_for_the_rerun() {
        let r = |probe: &str, category: &str, network: bool| ProbeResult {
            probe: probe.into(),
            category: category.into(),
            expected: String::new(),
            outcome: bottle_probe::contract::Outcome::Blocked,
            observed: String::new(),
            network,
        };
        let results = [
            r("tcp", "network", true),
            r("proxy-denied", "proxy", false),
            r("caps", "privilege", false),
        ];
        assert_eq!(network_and_proxy(&results), ["tcp", "proxy-denied"]);
    }
}
