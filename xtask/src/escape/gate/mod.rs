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
//!
//! Here: the run and its phases. `controls`: the positive controls from
//! the host; `bottles`: starting bottles and their targets; `probing`: a
//! probing phase and its evidence; `bottle_posture`: a bottle seen from
//! the host; `faults`: the fault phases; `prepare`: what the run builds
//! first; `leftovers`: what a run must not leave behind; `operator`: what
//! agent text does to the operator's terminal; `copy`: what the agent's
//! planted links and trees do to the operator's `bottle cp`; `git_repos`:
//! each agent's bare repository on the host, seeded and read back with
//! real git; `toolbox`: the in-box agent's channel attacked from a tool
//! call; `ports`: the relays' audit lines, a published port seen from the
//! host, and the box's routes; `reset`: a bottle reset through its
//! standby, the old box cut off and the new one probed.

mod audit_log;
mod bottle_posture;
mod bottles;
mod controls;
mod copy;
mod faults;
mod git_repos;
mod gvisor;
mod leftovers;
mod operator;
mod ports;
mod prepare;
mod probing;
mod reset;
mod split;
mod toolbox;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;

use self::controls::listener_specs;
use self::leftovers::{bottle_resources, leftovers};
use self::prepare::{build_agent_image, build_cli, smolvm_of, tempdir};
use self::probing::ProbeSet;
use super::canary::{self, Interface, Listeners};
use super::cli::{BottleCli, BottleGuard};
use super::dns::DnsRecorder;
use super::engine::EngineSocket;
use super::evidence::Cidr;
use super::fixture::{self, AgentDef, AgentSource};
use super::report::{Expect, Observed, Report, Row};
use super::resolv::{RESOLV_CONF, ResolvGuard};
use super::smol;
use super::sys::{Run, Sys};
use crate::dist;

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

/// The in-bottle git probes whose control is the plain push's ref on the
/// host (`git-push-plain-control` is an in-bottle control itself).
const GIT_PROBES: &[&str] = &["git-push-signed", "git-push-cert-protected"];

/// The probe aiming at the other bottle's proxy port.
const OTHER_BUNDLE_PROBE: &str = "tcp-other-bundle";

/// The image the smolmachines run builds with the Engine (smolmachines
/// cannot build a Dockerfile itself).
const SMOL_AGENT_IMAGE: &str = "bottle-escape-agent:latest";
/// The prefix of every bottle the run starts.
const RUN_PREFIX: &str = "bot-bottle-escape-";

/// The backend under test.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// Containers.
    Docker,
    /// microVMs through this smolvm (real, or the test double).
    Smolmachines(smol::Target),
}

impl Backend {
    /// The name `bottle --backend` takes.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Docker => "docker",
            Backend::Smolmachines(_) => "smolmachines",
        }
    }
}

/// Options of the run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The backend under test.
    pub backend: Backend,
    /// Every agent runs under gVisor (`isolation = "gvisor"`, docker).
    pub gvisor: bool,
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
    engine: EngineSocket,
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
    /// Whether the host saw the credential's secret at the canaries (the
    /// control of every `credential-on-the-wire` row).
    credential_detector: Option<bool>,
    /// Whether the host saw each per-run key's first half at the canary
    /// (the control of every `*-on-the-wire` row of `split.rs`), by kind.
    split_detectors: BTreeMap<&'static str, bool>,
    /// Each agent's seeded `main` in its bare repository, by agent key.
    git_seeds: BTreeMap<String, String>,
    /// A gVisor run: the binary the daemon's `runsc` runtime names.
    gvisor: Option<gvisor::Runtime>,
    /// The host loopback ports of the run's services and published port.
    ports: RunPorts,
    report: Report,
}

/// Host loopback ports the run takes, picked free before the manifest is
/// written: the host service the manifest names, one it does not, and
/// the host port A's [`fixture::PUBLISH_AGENT_PORT`] is published on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunPorts {
    /// `egress.host_services` names `127.0.0.1:<this>`.
    pub host_service: u16,
    /// A host loopback service no manifest names.
    pub unnamed_service: u16,
    /// A's published port on the host's `127.0.0.1`.
    pub publish: u16,
}

impl RunPorts {
    /// Three distinct free ports on 127.0.0.1 (bound at once, then let go).
    fn pick() -> anyhow::Result<RunPorts> {
        let held = (0..3)
            .map(|_| std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)))
            .collect::<Result<Vec<_>, _>>()?;
        let port = |i: usize| held[i].local_addr().map(|a| a.port());
        Ok(RunPorts {
            host_service: port(0)?,
            unnamed_service: port(1)?,
            publish: port(2)?,
        })
    }
}

/// Runs the gate against `options.backend`; rows and harness errors go
/// into `report`. Everything it sets up is undone before it returns.
pub(crate) fn run(options: &Options, sys: Arc<dyn Sys>, report: &mut Report) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the gate needs root (it creates the canary interface and swaps /etc/resolv.conf)\n  fix: run it as root, e.g. `sudo -E cargo xtask sandbox-escape`"
        );
    }
    let engine = EngineSocket::from_env();
    if !engine.ping() {
        bail!("the Docker Engine does not answer\n  fix: start dockerd (`.ci/setup`)");
    }
    let before = bottle_resources(&engine)?;

    progress("building the static bundle and probe, and the bottle CLI");
    // BOTTLE_ESCAPE_PROBE: a prebuilt probe (for working on the harness
    // itself); the run still builds the bundle it tests.
    let binaries = match std::env::var_os("BOTTLE_ESCAPE_PROBE") {
        Some(probe) => {
            let dir = dist::build(&["bottle-bundle", "bottle-toolbox"])?;
            dist::StaticBinaries {
                bundle: dir.join("bottle-bundle"),
                probe: PathBuf::from(probe),
                toolbox: dir.join("bottle-toolbox"),
            }
        }
        None => dist::run()?,
    };
    let bottle_bin = build_cli()?;

    let work = tempdir()?;
    let result = (|| {
        let context = fixture::write_context(&work.join("agent"))?;
        let ports = RunPorts::pick()?;
        // The probing agents get the relays; A alone publishes (a host
        // port is one bottle's).
        let mut agents: Vec<AgentDef> = [A, B, C, D]
            .iter()
            .map(|k| AgentDef {
                key: k.to_string(),
                rebind: true,
                relays: true,
                publish: (*k == A).then_some(ports.publish),
            })
            .collect();
        agents.extend(PARALLEL.iter().map(|k| AgentDef {
            key: k.to_string(),
            rebind: false,
            relays: false,
            publish: None,
        }));
        let source = match &options.backend {
            Backend::Docker => AgentSource::Build(context),
            Backend::Smolmachines(_) => {
                progress("building the agent image with the Engine (smolmachines cannot build)");
                build_agent_image(&sys, &context)?;
                AgentSource::Image(SMOL_AGENT_IMAGE.to_string())
            }
        };
        let credential = work.join("credential");
        std::fs::write(&credential, credential_secret(&report.token))?;
        let manifest = work.join("bottle.toml");
        std::fs::write(
            &manifest,
            fixture::manifest(
                &source,
                &agents,
                &canary::INTERNET.to_string(),
                &credential,
                &work.join("git"),
                ports.host_service,
                options.gvisor,
            ),
        )?;
        let cli = BottleCli {
            bin: bottle_bin,
            manifest,
            state_home: work.join("state"),
            bundle_bin: binaries.bundle.clone(),
            toolbox_bin: binaries.toolbox.clone(),
            backend: options.backend.name().into(),
            sys: sys.clone(),
        };
        // Leftovers of a killed run.
        for agent in &agents {
            let _ = cli.stop(&agent.key);
        }
        let _ = cli.drain_pool();
        run_with_canaries(
            options,
            sys.clone(),
            engine.clone(),
            cli,
            (&work, &binaries.probe),
            ports,
            report,
        )
    })();
    let _ = std::fs::remove_dir_all(&work);
    result?;
    progress("every bottle of the run is stopped, looking for leftovers");

    // A stop returns once the agent's container is gone; each bottle's
    // detached finisher removes its bundle and network just after.
    let finishers_within = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut left = leftovers(&before, &bottle_resources(&engine)?);
    while !left.is_empty() && std::time::Instant::now() < finishers_within {
        std::thread::sleep(std::time::Duration::from_millis(250));
        left = leftovers(&before, &bottle_resources(&engine)?);
    }
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

/// The phases, with the canaries up and `/etc/resolv.conf` pointing at the
/// recorder for as long as they run (on either backend).
fn run_with_canaries(
    options: &Options,
    sys: Arc<dyn Sys>,
    engine: EngineSocket,
    cli: BottleCli,
    (work, probe_bin): (&Path, &Path),
    ports: RunPorts,
    report: &mut Report,
) -> anyhow::Result<()> {
    progress("seeding each agent's git repository");
    let mut git_seeds = BTreeMap::new();
    for key in [A, B, C, D].iter().chain(PARALLEL) {
        let repo = fixture::git_repo_path(&work.join("git"), key);
        git_seeds.insert(key.to_string(), git_repos::seed(sys.as_ref(), &repo)?);
    }
    progress("canaries: interface, listeners, DNS recorder");
    let iface = Interface::create(sys.clone())?;
    iface.verify()?;
    let listeners = Listeners::start(
        &listener_specs(ports.host_service, ports.unnamed_service),
        &report.token,
    )?;
    let recorder = DnsRecorder::start(SocketAddr::from((canary::DNS, 53)))?;
    for (name, addr) in [
        ("rebind-loopback.bottle.test", std::net::Ipv4Addr::LOCALHOST),
        ("rebind-metadata.bottle.test", canary::METADATA),
        ("rebind-private.bottle.test", canary::PRIVATE),
        ("denied.bottle.test", canary::INTERNET),
        (fixture::PINNED_TCP_HOST, canary::PINNED_TCP),
        (fixture::OTHER_TCP_HOST, canary::OTHER_TCP),
    ] {
        recorder.set(name, vec![addr]);
    }
    let resolv = ResolvGuard::swap(Path::new(RESOLV_CONF), canary::DNS)?;

    let smolvm = match &options.backend {
        Backend::Docker => None,
        Backend::Smolmachines(target) => Some(smolvm_of(target, &sys)),
    };
    let gvisor = if options.gvisor {
        Some(gvisor::Runtime::of(&engine.get("/info")?)?)
    } else {
        None
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
        credential_detector: None,
        split_detectors: BTreeMap::new(),
        git_seeds,
        gvisor,
        ports,
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

        // B comes from a warm pool: a claimed bottle must hold against the
        // same probes as a cold one, on every backend.
        progress("starting bottle A, and B from a warm pool");
        let mut started = self.launch_cold_and_pooled(A, B)?.into_iter();
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
            ProbeSet::Full,
        )?;
        progress("attacking A's in-box agent from a tool call");
        self.toolbox_phase("bottle A", &a, targets_a.clone())?;
        progress("probing bottle B");
        let targets_b = self.targets(&b, &a);
        let results_b =
            self.probe_phase("bottle B", &mut b, Some(&a), targets_b, ProbeSet::Full)?;
        progress("host-side posture of A and B");
        self.posture("posture A", &a)?;
        self.posture("posture B", &b)?;
        progress(
            "ports: A's relays in its audit log, its published port from the host, its routes",
        );
        self.ports_phase("ports A", &mut a, &b)?;

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

        // A reset swaps in a box made off the reset's path: it must hold
        // like a launched one, and the old one must be cut off.
        if self.smolvm.is_none() {
            progress("reset: B through its standby, then probing B again");
            let r = self.reset_phase(&mut b, &a, &results_b);
            step(self, "reset: B through its standby", r)?;
        }

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

        if self.gvisor.is_some() {
            let r = self.gvisor_memory_phase();
            step(self, "gvisor: memory past the limit", r)?;
        }
        Ok(())
    }
}

/// The secret of the run's canary credential: it may reach the internet
/// canary only over TLS, so seeing it there in cleartext is an escape.
fn credential_secret(token: &str) -> String {
    format!("bottle-credential-{token}")
}

/// A progress line on stderr (stdout carries the report), with the time
/// since the run's first line: a CI log then says where the run's
/// minutes go.
pub(crate) fn progress(text: &str) {
    static FIRST: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let since = FIRST.get_or_init(std::time::Instant::now).elapsed();
    eprintln!("sandbox-escape: [{:5.0} s] {text}", since.as_secs_f64());
}
