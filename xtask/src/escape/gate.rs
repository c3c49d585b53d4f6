//! The gate's run, start to finish, on either backend: canaries up and
//! proven local, the positive controls from the host, two probed bottles,
//! the host-side posture checks, the faults, and a teardown that runs
//! however the run ends.
//!
//! Both backends go through the same CLI, the same probes and the same
//! evidence; they differ where the host looks. A smolmachines bottle has
//! no agent container: its agent address is unknown (the probe skips that
//! target), its gateway is the host's `.1` on the bundle bridge (the VM's
//! allowlist is the bundle's `/32`, so it must not reach it), and its
//! posture is the machine's record in smolvm's state database (exactly the
//! bundle's `/32`), the VM process, and the bundle container's own
//! hardening. smolvm dials a guest's traffic from the host, so before a
//! smolmachines probe runs every address it will dial must route locally
//! or onto a bottle bridge of this run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bottle_probe::contract::{ProbeResult, Targets};
use serde_json::Value;

use super::canary::{self, Interface, Listeners, Proto, Spec};
use super::cli::{BottleCli, BottleGuard};
use super::dns::{self, DnsRecorder};
use super::engine::Engine;
use super::evidence::{self, Allowance, Cidr, DnsAllowance};
use super::fixture::{self, AgentDef, AgentSource};
use super::posture;
use super::probe;
use super::report::{Expect, Observed, Report, Row};
use super::resolv::{RESOLV_CONF, ResolvGuard};
use super::route;
use super::smol::{self, SysRunner};
use super::sys::{Run, Sys};
use super::{dockerd, teardown};
use crate::dist;
use crate::process::{cargo, describe_exit, watch};

/// Every probe attempt's timeout.
const PROBE_TIMEOUT_MS: u64 = 1500;
/// A whole probe run's bound.
const PROBE_RUN_BOUND: Duration = Duration::from_secs(240);
/// Where the probe and its configs go inside a bottle.
const BOTTLE_DIR: &str = "/tmp";

/// The agents the run starts: A and B probe each other, C is started
/// after the daemon restart, P1..P3 start at once.
const A: &str = "escape-a";
const B: &str = "escape-b";
const C: &str = "escape-c";
const D: &str = "escape-d";
const PARALLEL: &[&str] = &["escape-p1", "escape-p2", "escape-p3"];

/// The probe aiming at the other bottle's proxy port.
const OTHER_BUNDLE_PROBE: &str = "tcp-other-bundle";

/// The image the smolmachines run builds with the Engine (smolmachines
/// cannot build a Dockerfile itself).
const SMOL_AGENT_IMAGE: &str = "bottle-escape-agent:latest";
/// The prefix of every bottle the run starts.
const RUN_PREFIX: &str = "bot-bottle-escape-";

/// The backend under test.
#[derive(Debug, Clone)]
pub enum Backend {
    /// Containers.
    Docker,
    /// microVMs through this smolvm (real, or the test double).
    Smolmachines(smol::Target),
}

impl Backend {
    /// The name `bottle --backend` takes.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Docker => "docker",
            Backend::Smolmachines(_) => "smolmachines",
        }
    }
}

/// Options of the run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The backend under test.
    pub backend: Backend,
    /// Go on to the next phase after a harness error in one.
    pub keep_going: bool,
    /// Skip the daemon restart (it disturbs everything else using this
    /// Docker Engine); recorded as a failed row, never a silent pass.
    pub skip_dockerd_restart: bool,
}

/// A running bottle and what the host knows about it.
struct Bottle {
    guard: BottleGuard,
    key: String,
    bundle_ip: String,
    agent_ip: String,
    gateway: String,
    probe_copied: bool,
}

/// The run's shared state.
struct Gate {
    sys: Arc<dyn Sys>,
    /// smolvm, on a smolmachines run.
    smolvm: Option<bottle_smolvm::Smolvm>,
    engine: Engine,
    cli: BottleCli,
    token: String,
    work: PathBuf,
    probe_bin: PathBuf,
    listeners: Listeners,
    dns: DnsRecorder,
    /// Host-side control outcomes by probe name.
    controls: BTreeMap<String, bool>,
    /// Controls the harness derives itself (the Engine's DNS upstream).
    extra_controls: BTreeMap<String, bool>,
    egress: Vec<Cidr>,
    bottle_subnets: Vec<Cidr>,
    /// Each bottle network's subnet and bridge device (what a smolmachines
    /// probe may dial from the host besides local addresses).
    bottle_bridges: Vec<(Cidr, String)>,
    config_seq: usize,
    report: Report,
}

/// Runs the gate against `options.backend`; rows and harness errors go
/// into `report`. Everything it sets up is undone before it returns.
pub fn run(options: &Options, sys: Arc<dyn Sys>, report: &mut Report) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the gate needs root (it creates the canary interface and swaps /etc/resolv.conf)\n  fix: run it as root, e.g. `sudo -E cargo xtask sandbox-escape`"
        );
    }
    let engine = Engine::from_env();
    if !engine.ping() {
        bail!("the Docker Engine does not answer\n  fix: start dockerd (`.ci/setup`)");
    }
    let before = bottle_resources(&engine)?;

    progress("building the static bundle and probe, and the bottle CLI");
    // BOTTLE_ESCAPE_PROBE: a prebuilt probe (for working on the harness
    // itself); the run still builds the bundle it tests.
    let binaries = match std::env::var_os("BOTTLE_ESCAPE_PROBE") {
        Some(probe) => dist::StaticBinaries {
            bundle: dist::build(&["bottle-bundle"])?.join("bottle-bundle"),
            probe: PathBuf::from(probe),
        },
        None => dist::run()?,
    };
    let bottle_bin = build_cli()?;

    let work = tempdir()?;
    let result = (|| {
        let context = fixture::write_context(&work.join("agent"))?;
        let mut agents: Vec<AgentDef> = [A, B, C, D]
            .iter()
            .map(|k| AgentDef {
                key: k.to_string(),
                rebind: true,
            })
            .collect();
        agents.extend(PARALLEL.iter().map(|k| AgentDef {
            key: k.to_string(),
            rebind: false,
        }));
        let source = match &options.backend {
            Backend::Docker => AgentSource::Build(context),
            Backend::Smolmachines(_) => {
                progress("building the agent image with the Engine (smolmachines cannot build)");
                build_agent_image(&sys, &context)?;
                AgentSource::Image(SMOL_AGENT_IMAGE.to_string())
            }
        };
        let manifest = work.join("bottle.toml");
        std::fs::write(
            &manifest,
            fixture::manifest(&source, &agents, &canary::INTERNET.to_string()),
        )?;
        let cli = BottleCli {
            bin: bottle_bin,
            manifest,
            state_home: work.join("state"),
            bundle_bin: binaries.bundle.clone(),
            backend: options.backend.name().into(),
            sys: sys.clone(),
        };
        // Leftovers of a killed run.
        for agent in &agents {
            let _ = cli.stop(&agent.key);
        }
        docker_run(
            options,
            sys.clone(),
            engine.clone(),
            cli,
            &work,
            &binaries.probe,
            report,
        )
    })();
    let _ = std::fs::remove_dir_all(&work);
    result?;

    let after = bottle_resources(&engine)?;
    let mut left = leftovers(&before, &after);
    if let Backend::Smolmachines(target) = &options.backend {
        let smolvm = smolvm_of(target, &sys);
        let machines = smolvm
            .list()
            .map_err(|e| anyhow::anyhow!("listing smolvm machines after the run: {e}"))?;
        left.extend(
            machines
                .into_iter()
                .filter(|m| m.name.starts_with(RUN_PREFIX))
                .map(|m| format!("machine {}", m.name)),
        );
    }
    if !left.is_empty() {
        bail!("resources of the run remain after teardown: {left:?}\n  fix: `bottle cleanup`");
    }
    let iface = sys.output(&Run::new("ip", &["link", "show", canary::IFACE]))?;
    if iface.success() {
        bail!(
            "the canary interface {} remains\n  fix: ip link del {}",
            canary::IFACE,
            canary::IFACE
        );
    }
    Ok(())
}

fn docker_run(
    options: &Options,
    sys: Arc<dyn Sys>,
    engine: Engine,
    cli: BottleCli,
    work: &Path,
    probe_bin: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    progress("canaries: interface, listeners, DNS recorder");
    let iface = Interface::create(sys.clone())?;
    iface.verify()?;
    let listeners = Listeners::start(&listener_specs(), &report.token)?;
    let recorder = DnsRecorder::start(SocketAddr::from((canary::DNS, 53)))?;
    for (name, addr) in [
        ("rebind-loopback.bottle.test", std::net::Ipv4Addr::LOCALHOST),
        ("rebind-metadata.bottle.test", canary::METADATA),
        ("rebind-private.bottle.test", canary::PRIVATE),
        ("denied.bottle.test", canary::INTERNET),
    ] {
        recorder.set(name, vec![addr]);
    }
    let resolv = ResolvGuard::swap(Path::new(RESOLV_CONF), canary::DNS)?;

    let smolvm = match &options.backend {
        Backend::Docker => None,
        Backend::Smolmachines(target) => Some(smolvm_of(target, &sys)),
    };
    let mut gate = Gate {
        sys,
        smolvm,
        engine,
        cli,
        token: report.token.clone(),
        work: work.to_path_buf(),
        probe_bin: probe_bin.to_path_buf(),
        listeners,
        dns: recorder,
        controls: BTreeMap::new(),
        extra_controls: BTreeMap::new(),
        egress: Vec::new(),
        bottle_subnets: Vec::new(),
        bottle_bridges: Vec::new(),
        config_seq: 0,
        report: std::mem::take(report),
    };
    let result = gate.phases(options);
    if let Err(err) = &result {
        gate.report.harness_errors.push(format!("{err:#}"));
    }
    *report = std::mem::take(&mut gate.report);
    drop(gate);
    drop(resolv);
    drop(iface);
    Ok(())
}

impl Gate {
    fn phases(&mut self, options: &Options) -> anyhow::Result<()> {
        progress("positive controls from the host");
        self.host_controls()?;

        progress("starting bottles A and B");
        let mut started = self.launch_each(&[A, B])?.into_iter();
        let (Some(mut a), Some(mut b)) = (started.next(), started.next()) else {
            bail!("bottles A and B did not both start");
        };

        progress("probing bottle A");
        let targets_a = self.targets(&a, &b);
        let results_a = self.probe_phase(
            "bottle A",
            &mut a,
            Some(&b),
            targets_a.clone(),
            Vec::new(),
            true,
            true,
        )?;
        progress("probing bottle B");
        let targets_b = self.targets(&b, &a);
        self.probe_phase(
            "bottle B",
            &mut b,
            Some(&a),
            targets_b,
            Vec::new(),
            true,
            true,
        )?;
        progress("host-side posture of A and B");
        self.posture("posture A", &a)?;
        self.posture("posture B", &b)?;

        let step =
            |gate: &mut Gate, name: &str, result: anyhow::Result<()>| -> anyhow::Result<()> {
                match result {
                    Ok(()) => Ok(()),
                    Err(err) if options.keep_going => {
                        gate.report.harness_errors.push(format!("{name}: {err:#}"));
                        Ok(())
                    }
                    Err(err) => Err(err.context(name.to_string())),
                }
            };

        progress("fault: kill -9 A's bundle, probe A again");
        let r = self.fault_bundle_kill(&mut a, &b, &targets_a, &results_a);
        step(self, "fault: bundle killed", r)?;

        progress("fault: restart dockerd, probe the old bottles and a fresh one");
        let r = if options.skip_dockerd_restart {
            self.report.rows.push(Row::new(
                "fault: dockerd restarted",
                "dockerd-restart",
                "fault",
                Expect::Blocked,
                Observed::Error,
                None,
                "skipped (--skip-dockerd-restart): not proven",
            ));
            Ok(())
        } else {
            self.fault_dockerd_restart(&mut a, &mut b, &results_a)
        };
        step(self, "fault: dockerd restarted", r)?;
        drop(a);
        drop(b);

        progress("fault: three bottles at once, each with its own allowed host");
        let r = self.fault_parallel();
        step(self, "fault: parallel bottles", r)?;
        Ok(())
    }

    /// The DNS recorder and the probe's network probes, from the host.
    fn host_controls(&mut self) -> anyhow::Result<()> {
        let phase = "host control";
        let name = format!("control-{}.{}", self.token, dns::ZONE);
        let before = self.dns.queries().len();
        let answer = dns::query_udp(self.dns.addr(), &name);
        let recorded = self.dns.queries()[before..].iter().any(|q| q.name == name);
        let ok = recorded && matches!(answer, Ok((3, _)));
        self.report.rows.push(Row::new(
            phase,
            "control-dns-recorder",
            "control",
            Expect::Reached,
            if ok {
                Observed::Reached
            } else {
                Observed::Blocked
            },
            None,
            format!("host query for {name}: answer {answer:?}, recorded {recorded}"),
        ));

        // Where the probe's bottle-only targets point on the host.
        let placeholder = Targets {
            internet_v4: canary::INTERNET.to_string(),
            internet_v6: canary::INTERNET_V6.to_string(),
            metadata: canary::METADATA.to_string(),
            private: canary::PRIVATE.to_string(),
            dns_server: canary::DNS.to_string(),
            host_loopback_port: self.port("host-loopback")?,
            host_any_port: self.port("host-any")?,
            gateway: String::new(),
            own_bundle: String::new(),
            other_bundle: String::new(),
            other_agent: String::new(),
            proxy: String::new(),
            allowed_host: fixture::allowed_host(A),
            denied_host: "denied.bottle.test".into(),
            rebind_hosts: fixture::REBIND_HOSTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            canary_names: self.canary_names(),
        };
        let config = probe::control_config(
            &self.token,
            PROBE_TIMEOUT_MS,
            &placeholder,
            &canary::INTERNET.to_string(),
        );
        // Nothing the control dials may leave this machine.
        for addr in probe::dialled_addresses(&config) {
            let ip: IpAddr = addr
                .parse()
                .with_context(|| format!("control target {addr:?}"))?;
            let out = self.sys.run("ip", &["route", "get", &addr])?;
            route::check_local(ip, &out).map_err(anyhow::Error::msg)?;
        }
        let path = self.write_config(&config)?;
        let hits_before = self.listeners.hits().len();
        let run = Run::new(
            &self.probe_bin.display().to_string(),
            &["--config".to_string(), path.display().to_string()],
        )
        .timeout(PROBE_RUN_BOUND);
        let out = self.sys.output(&run)?;
        // The probe dials the 0.0.0.0 listener only through a bottle's
        // gateway; from the host the harness reaches it at a canary address.
        let any = SocketAddr::from((canary::INTERNET, self.port("host-any")?));
        let any_seen = fetch_token(any).is_ok_and(|body| body.contains(&self.token));
        let (rows, outcomes) = probe::control_rows(phase, &out);
        self.report.rows.extend(rows);
        self.report.rows.push(Row::new(
            phase,
            "control-host-any",
            "control",
            Expect::Reached,
            if any_seen {
                Observed::Reached
            } else {
                Observed::Blocked
            },
            None,
            format!(
                "harness GET http://{any}/: token {}",
                if any_seen { "seen" } else { "missing" }
            ),
        ));
        self.controls = outcomes;
        // Every network listener must have been reached from the host: the
        // canaries are alive, independently of what the probe says.
        let hits = self.listeners.hits();
        let hits = &hits[hits_before..];
        for bound in &self.listeners.bound {
            let reached = hits.iter().any(|h| h.canary == bound.name);
            self.report.rows.push(Row::new(
                phase,
                &format!("control-listener-{}", bound.name),
                "control",
                Expect::Reached,
                if reached {
                    Observed::Reached
                } else {
                    Observed::Blocked
                },
                None,
                format!(
                    "{} {} {}",
                    match bound.proto {
                        Proto::Tcp => "tcp",
                        Proto::Udp => "udp",
                    },
                    bound.addr,
                    if reached {
                        "reached from the host"
                    } else {
                        "never reached by the host-side probe"
                    }
                ),
            ));
        }
        Ok(())
    }

    fn port(&self, name: &str) -> anyhow::Result<u16> {
        self.listeners
            .get(name)
            .map(|b| b.addr.port())
            .with_context(|| format!("no canary listener {name}"))
    }

    fn canary_names(&self) -> Vec<String> {
        vec![format!("exfil-{}.{}", self.token, dns::ZONE)]
    }

    fn write_config(
        &mut self,
        config: &bottle_probe::contract::ProbeConfig,
    ) -> anyhow::Result<PathBuf> {
        self.config_seq += 1;
        let path = self.work.join(format!("probe-{}.json", self.config_seq));
        std::fs::write(&path, serde_json::to_vec_pretty(config)?)?;
        Ok(path)
    }

    /// Starts `keys` one after the other and reads back their addresses.
    fn launch_each(&mut self, keys: &[&str]) -> anyhow::Result<Vec<Bottle>> {
        let mut bottles = Vec::new();
        for key in keys {
            let guard = BottleGuard::start(&self.cli, key)?;
            let bottle = self.describe(guard, key)?;
            self.set_rebind_bundle(&bottle);
            bottles.push(bottle);
        }
        self.refresh_egress()?;
        Ok(bottles)
    }

    /// Starts `keys` at once (parallel `bottle start`s, racing for the
    /// shared egress network when none exists yet) and reads back their
    /// addresses.
    fn launch_many(&mut self, keys: &[&str]) -> anyhow::Result<Vec<Bottle>> {
        let started: Vec<(String, anyhow::Result<BottleGuard>)> = std::thread::scope(|s| {
            let handles: Vec<_> = keys
                .iter()
                .map(|k| {
                    let cli = self.cli.clone();
                    (k.to_string(), s.spawn(move || BottleGuard::start(&cli, k)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(k, h)| {
                    let result = h
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("the start thread panicked")));
                    (k, result)
                })
                .collect()
        });
        let mut bottles = Vec::new();
        let mut first_error = None;
        for (key, guard) in started {
            match guard {
                Ok(guard) => match self.describe(guard, &key) {
                    Ok(b) => bottles.push(b),
                    Err(e) => first_error = first_error.or(Some(e)),
                },
                Err(e) => first_error = first_error.or(Some(e.context(format!("starting {key}")))),
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        for bottle in &bottles {
            self.set_rebind_bundle(bottle);
        }
        self.refresh_egress()?;
        Ok(bottles)
    }

    /// Whether `bottle`'s bundle serves its proxy right now: its agent
    /// fetches its allowed host through it. The other-bottle probes aim at
    /// that port, so "blocked" means something only while this holds.
    fn proxy_alive(&mut self, phase: &str, bottle: &Bottle) -> anyhow::Result<bool> {
        let host = fixture::allowed_host(&bottle.key);
        let url = format!("http://{host}/");
        let out = self.cli.exec(
            &bottle.guard.name,
            &["timeout", "8", "wget", "-q", "-O-", url.as_str()],
            Duration::from_secs(30),
        )?;
        let alive = out.stdout.contains(&self.token);
        self.report.rows.push(Row::new(
            phase,
            "control-other-bundle-alive",
            "control",
            Expect::Reached,
            if alive {
                Observed::Reached
            } else {
                Observed::Blocked
            },
            None,
            format!(
                "{} fetched {host} through its own bundle {}: {}",
                fixture::short(&bottle.key),
                bottle.bundle_ip,
                if alive { "token seen" } else { "failed" }
            ),
        ));
        Ok(alive)
    }

    fn describe(&mut self, guard: BottleGuard, key: &str) -> anyhow::Result<Bottle> {
        let bundle_ip = self.cli.bundle_address(&guard.name)?;
        let network = self.engine.inspect_network(&guard.name)?;
        let ipam = &network["IPAM"]["Config"][0];
        let subnet = ipam["Subnet"]
            .as_str()
            .and_then(Cidr::parse)
            .with_context(|| format!("network {} has no IPv4 subnet", guard.name))?;
        // smolmachines: the host's `.1` on the bundle bridge, which the VM
        // must not reach (its allowlist is the bundle's /32).
        let gateway = ipam["Gateway"].as_str().unwrap_or_default().to_string();
        // smolmachines: no agent container, so no agent address (the probe
        // skips the other-agent target).
        let agent_ip = if self.smolvm.is_some() {
            String::new()
        } else {
            let agent = self
                .engine
                .inspect_container(&format!("{}-agent", guard.name))?;
            let ip = agent["NetworkSettings"]["Networks"][&guard.name]["IPAddress"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if ip.is_empty() {
                bail!("the agent of {} has no address on its network", guard.name);
            }
            ip
        };
        self.bottle_subnets.push(subnet);
        self.bottle_bridges.push((subnet, bridge_device(&network)));
        Ok(Bottle {
            guard,
            key: key.to_string(),
            bundle_ip,
            agent_ip,
            gateway,
            probe_copied: false,
        })
    }

    fn set_rebind_bundle(&self, bottle: &Bottle) {
        if let Ok(ip) = bottle.bundle_ip.parse() {
            self.dns
                .set(&fixture::rebind_bundle_host(&bottle.key), vec![ip]);
        }
    }

    fn refresh_egress(&mut self) -> anyhow::Result<()> {
        let network = self.engine.inspect_network("bot-bottle-egress")?;
        self.egress = network["IPAM"]["Config"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["Subnet"].as_str().and_then(Cidr::parse))
            .collect();
        Ok(())
    }

    fn targets(&self, me: &Bottle, other: &Bottle) -> Targets {
        let mut rebind: Vec<String> = fixture::REBIND_HOSTS
            .iter()
            .map(|s| s.to_string())
            .collect();
        rebind.push(fixture::rebind_bundle_host(&me.key));
        Targets {
            internet_v4: canary::INTERNET.to_string(),
            internet_v6: canary::INTERNET_V6.to_string(),
            metadata: canary::METADATA.to_string(),
            private: canary::PRIVATE.to_string(),
            dns_server: canary::DNS.to_string(),
            host_loopback_port: self.port("host-loopback").unwrap_or(0),
            host_any_port: self.port("host-any").unwrap_or(0),
            gateway: me.gateway.clone(),
            own_bundle: me.bundle_ip.clone(),
            other_bundle: other.bundle_ip.clone(),
            other_agent: other.agent_ip.clone(),
            proxy: format!(
                "http://{}:{}",
                me.bundle_ip,
                bottle_core::bundle::PROXY_PORT
            ),
            allowed_host: fixture::allowed_host(&me.key),
            denied_host: "denied.bottle.test".into(),
            rebind_hosts: rebind,
            canary_names: self.canary_names(),
        }
    }

    /// Copies the probe (once) and a config into `bottle` and runs it.
    fn exec_probe(
        &mut self,
        bottle: &mut Bottle,
        config: &bottle_probe::contract::ProbeConfig,
    ) -> anyhow::Result<super::sys::Output> {
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
    #[allow(clippy::too_many_arguments)]
    fn probe_phase(
        &mut self,
        phase: &str,
        bottle: &mut Bottle,
        other: Option<&Bottle>,
        targets: Targets,
        only: Vec<String>,
        proxy_expected: bool,
        dns_control: bool,
    ) -> anyhow::Result<Vec<ProbeResult>> {
        let config = probe::bottle_config(&self.token, PROBE_TIMEOUT_MS, targets.clone(), only);
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
        let out = self.exec_probe(bottle, &config)?;
        let queries = self.dns.queries()[dns_before..].to_vec();
        if dns_control {
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
            proxy_expected,
        );
        self.report.rows.extend(rows);
        self.evidence(
            phase,
            hits_before,
            &queries,
            std::slice::from_ref(&targets.allowed_host),
        );
        Ok(results)
    }

    fn evidence(
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
        };
        self.report
            .rows
            .push(evidence::canary_row(phase, &hits, &allowance));
        let mut pinned: Vec<String> = [A, B, C, D]
            .iter()
            .chain(PARALLEL)
            .map(|k| fixture::allowed_host(k))
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

    /// The agent as the Engine and the kernel see it, while an exec'd
    /// process runs in it too.
    fn posture(&mut self, phase: &str, bottle: &Bottle) -> anyhow::Result<()> {
        if self.smolvm.is_some() {
            return self.vm_posture(phase, bottle);
        }
        let agent = format!("{}-agent", bottle.guard.name);
        let spec = posture::Spec {
            memory: fixture::MEMORY_BYTES,
            pids: fixture::PIDS,
            network: bottle.guard.name.clone(),
        };
        let inspect = self.engine.inspect_container(&agent)?;
        self.report
            .rows
            .extend(posture::check_inspect(phase, &inspect, &spec));
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

    /// Whether the bottle's agent (container or VM) still runs.
    fn agent_running(&self, bottle: &Bottle) -> bool {
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

    /// smolvm dials a guest's traffic from the host: every address a
    /// smolmachines probe config names must route locally, or straight onto
    /// a bottle bridge this run created. (On the fake the probe itself runs
    /// on the host, so this is what keeps it on this machine.)
    fn check_dialled_from_host(
        &self,
        config: &bottle_probe::contract::ProbeConfig,
    ) -> anyhow::Result<()> {
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

    /// Fault (a): the bundle dies; the agent must be left with nothing.
    fn fault_bundle_kill(
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
        self.probe_phase(phase, a, Some(b), targets.clone(), only, false, false)?;
        Ok(())
    }

    /// Fault (b): the daemon restarts under running bottles; old bottles
    /// stay blocked whatever state they are in, and a fresh one is as
    /// isolated as the first.
    fn fault_dockerd_restart(
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
                network_only.clone(),
                false,
                false,
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
            Vec::new(),
            true,
            true,
        )?;
        self.posture(&format!("{phase}: posture C"), &c)?;
        Ok(())
    }

    /// Fault (c): three bottles start at once; each reaches its own
    /// allowed host through its proxy and none of the others'.
    fn fault_parallel(&mut self) -> anyhow::Result<()> {
        let phase = "fault: 3 bottles at once";
        let bottles = self.launch_many(PARALLEL)?;
        self.refresh_egress()?;
        let hits_before = self.listeners.hits().len();
        let dns_before = self.dns.queries().len();
        let hosts: Vec<String> = PARALLEL.iter().map(|k| fixture::allowed_host(k)).collect();
        for bottle in &bottles {
            let own = fixture::allowed_host(&bottle.key);
            for host in &hosts {
                let url = format!("http://{host}/");
                let out = self.cli.exec(
                    &bottle.guard.name,
                    &["timeout", "8", "wget", "-q", "-O-", url.as_str()],
                    Duration::from_secs(30),
                )?;
                let reached = out.stdout.contains(&self.token);
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
                    if reached {
                        Observed::Reached
                    } else {
                        Observed::Blocked
                    },
                    None,
                    format!(
                        "wget through the proxy: exit {:?}{}",
                        out.code,
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

/// The names of the network and proxy probes of an earlier run.
pub fn network_and_proxy(results: &[ProbeResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.network || r.category == "proxy")
        .map(|r| r.probe.clone())
        .collect()
}

/// The canary listeners of a run.
pub fn listener_specs() -> Vec<Spec> {
    let tcp = |name: &str, bind: SocketAddr| Spec {
        name: name.into(),
        bind,
        proto: Proto::Tcp,
    };
    vec![
        tcp("internet:80", SocketAddr::from((canary::INTERNET, 80))),
        tcp("internet:443", SocketAddr::from((canary::INTERNET, 443))),
        tcp("internet:8443", SocketAddr::from((canary::INTERNET, 8443))),
        Spec {
            name: "internet-udp:5353".into(),
            bind: SocketAddr::from((canary::INTERNET, 5353)),
            proto: Proto::Udp,
        },
        tcp(
            "internet-v6:80",
            SocketAddr::from((canary::INTERNET_V6, 80)),
        ),
        tcp("metadata:80", SocketAddr::from((canary::METADATA, 80))),
        tcp("private:80", SocketAddr::from((canary::PRIVATE, 80))),
        tcp(
            "other-bundle-stand-in",
            SocketAddr::from((canary::INTERNET, bottle_core::bundle::PROXY_PORT)),
        ),
        tcp(
            "host-loopback",
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        ),
        tcp(
            "host-any",
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)),
        ),
    ]
}

/// A plain HTTP GET of `/` from `addr`: the whole response.
fn fetch_token(addr: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: control\r\n\r\n")?;
    let mut body = String::new();
    stream.take(64 * 1024).read_to_string(&mut body)?;
    Ok(body)
}

/// What of `after` the run left behind: its own bottles' resources, and
/// the shared egress network when no other bottle (another user of this
/// Engine) still needs it.
pub fn leftovers(before: &BTreeSet<String>, after: &BTreeSet<String>) -> Vec<String> {
    let ours = |r: &str| {
        r.split_once(' ')
            .is_some_and(|(_, name)| name.starts_with(RUN_PREFIX))
    };
    let others_remain = after
        .iter()
        .any(|r| !ours(r) && !r.ends_with(" bot-bottle-egress"));
    after
        .difference(before)
        .filter(|r| ours(r) || (r.as_str() == "network bot-bottle-egress" && !others_remain))
        .cloned()
        .collect()
}

/// Names of every `bot-bottle-` container and network.
fn bottle_resources(engine: &Engine) -> anyhow::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let containers = engine.get("/containers/json?all=1")?;
    for c in containers.as_array().into_iter().flatten() {
        for name in c["Names"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let name = name.trim_start_matches('/');
            if name.starts_with(bottle_core::slug::RESOURCE_PREFIX) {
                out.insert(format!("container {name}"));
            }
        }
    }
    let networks = engine.get("/networks")?;
    for n in networks.as_array().into_iter().flatten() {
        if let Some(name) = n["Name"].as_str()
            && name.starts_with(bottle_core::slug::RESOURCE_PREFIX)
        {
            out.insert(format!("network {name}"));
        }
    }
    Ok(out)
}

/// The Linux bridge of a Docker bridge network: its `bridge.name` option,
/// else Docker's default `br-<first 12 of the id>`.
pub fn bridge_device(network: &Value) -> String {
    match network["Options"]["com.docker.network.bridge.name"].as_str() {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => {
            let id = network["Id"].as_str().unwrap_or_default();
            format!("br-{}", id.get(..12).unwrap_or(id))
        }
    }
}

fn smolvm_of(target: &smol::Target, sys: &Arc<dyn Sys>) -> bottle_smolvm::Smolvm {
    bottle_smolvm::Smolvm::with_program(
        target.program.clone().into_os_string(),
        Arc::new(SysRunner(sys.clone())),
    )
}

/// Builds the demo agent image from `context` with the Engine, as
/// [`SMOL_AGENT_IMAGE`].
fn build_agent_image(sys: &Arc<dyn Sys>, context: &Path) -> anyhow::Result<()> {
    let run = Run::new(
        "docker",
        &[
            "build".to_string(),
            "--quiet".to_string(),
            "--tag".to_string(),
            SMOL_AGENT_IMAGE.to_string(),
            context.display().to_string(),
        ],
    )
    .timeout(Duration::from_secs(600));
    super::sys::checked(sys.output(&run)?, &run)?;
    Ok(())
}

fn build_cli() -> anyhow::Result<PathBuf> {
    let out = watch(cargo().args(["build", "--quiet", "-p", "bottle-cli"]))?;
    if !out.success() {
        bail!("building the bottle CLI failed ({})", describe_exit(&out));
    }
    Ok(dist::target_dir().join("debug").join("bottle"))
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bottle-escape-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let cleanup = dir.clone();
    teardown::register("remove the run's temp dir", move || {
        let _ = std::fs::remove_dir_all(&cleanup);
    });
    Ok(dir)
}

/// A progress line on stderr (stdout carries the report).
pub fn progress(text: &str) {
    eprintln!("sandbox-escape: {text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_cover_every_canary_address_and_fit_the_interface() {
        let specs = listener_specs();
        for addr in canary::addresses() {
            if addr == IpAddr::V4(canary::DNS) || addr == IpAddr::V4(canary::METADATA_STANDIN) {
                continue;
            }
            assert!(
                specs.iter().any(|s| s.bind.ip() == addr),
                "{addr} has no listener"
            );
        }
        assert!(canary::IFACE.len() <= 15);
    }

    #[test]
    fn only_the_runs_own_leftovers_count() {
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let before = set(&[]);
        // Another user's bottle appeared meanwhile: not ours, and it keeps
        // the egress network.
        let after = set(&["container bot-bottle-t1-agent", "network bot-bottle-egress"]);
        assert!(leftovers(&before, &after).is_empty());
        let after = set(&["network bot-bottle-egress"]);
        assert_eq!(leftovers(&before, &after), ["network bot-bottle-egress"]);
        let after = set(&[
            "container bot-bottle-escape-a-agent",
            "container bot-bottle-t1-agent",
        ]);
        assert_eq!(
            leftovers(&before, &after),
            ["container bot-bottle-escape-a-agent"]
        );
        // There before the run: not the run's doing.
        assert!(leftovers(&after, &after).is_empty());
    }

    #[test]
    fn bridge_devices_follow_docker_naming() {
        let net = serde_json::json!({"Id": "0123456789abcdef0123", "Options": {}});
        assert_eq!(bridge_device(&net), "br-0123456789ab");
        let named = serde_json::json!({
            "Id": "0123456789abcdef0123",
            "Options": {"com.docker.network.bridge.name": "docker0"}
        });
        assert_eq!(bridge_device(&named), "docker0");
    }

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
