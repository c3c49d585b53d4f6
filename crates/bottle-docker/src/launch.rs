//! `launch`: the steps that turn a confirmed plan into a running bottle,
//! each registering its undo, and the failure injection that tests use to
//! prove the unwinding.
//!
//! Steps, in order (the names `BOTTLE_FAILPOINT` accepts):
//!
//! | step | what it does |
//! | --- | --- |
//! | `network` | create `bot-bottle-<slug>` (internal, no host address) and check it |
//! | `egress-network` | create the shared `bot-bottle-egress` if missing |
//! | `bundle-create` | create the bundle container pinned at `.2` |
//! | `bundle-connect` | attach it to the egress network |
//! | `bundle-files` | write config, CA and credentials into `/run/bottle` |
//! | `agent-create` | create the agent container pinned at `.3` |
//! | `agent-files` | write the keep-alive program |
//! | `provision-ca` | CA into `/etc/bottle/ca.pem` and the system trust bundle |
//! | `provision-prompt` | the prompt file |
//! | `provision-skills` | the skills directories |
//! | `bundle-start` | start the bundle (together with the agent) |
//! | `agent-start` | start the agent's keep-alive (nothing of the agent runs yet) |
//! | `bundle-verify` | check its address, both networks, and that the bottle network is internal |
//! | `bundle-health` | wait until the proxy answers `/__bottle/health` |
//! | `agent-verify` | check it is running, on the bottle network only, at its address, with every capability dropped |
//! | `provision-git` | git repositories: served by the bundle's git-gate (mounts and mirrors are set up with the bundle); this step reports them |
//! | `provision-supervise` | the MCP config naming supervise (`/etc/bottle/mcp.json`) |
//! | `complete` | mark the launch complete in the state dir |
//!
//! [`launch_bundle`] runs the bundle's steps only (`network` to
//! `bundle-files`, `bundle-start`, `bundle-verify`, `bundle-health`), for a
//! microVM bottle ([`LaunchMode::BundleForVm`]): the bottle network is
//! still internal but gives the host its gateway address, because smolvm
//! dials the guest's traffic from the host, and `bundle-health` also
//! requires the host to connect to the bundle's proxy port.
//!
//! `BOTTLE_FAILPOINT=<step>` makes the launch fail right after that step
//! (and unwind); `BOTTLE_FAILPOINT=<step>:sleep` makes it stop there for up
//! to ten minutes, so a test can kill the process mid-launch. Either can
//! only make a launch fail, never change what it creates.

use std::time::{Duration, Instant};

use bollard::models::NetworkConnectRequest;
use bollard::query_parameters::{CreateContainerOptionsBuilder, LogsOptionsBuilder};
use bottle_core::process::Owner;
use bottle_core::{BackendKind, Plan};
use futures_util::StreamExt;

use crate::bottle::{DockerBottle, container_owner, download_file, exec_captured, upload};
use crate::client::Engine;
use crate::config::{
    self, AGENT_CA_PATH, AGENT_PROMPT_PATH, AGENT_SKILLS_DIR, BUNDLE_BINARY_PATH, BUNDLE_CA_CERT,
    BUNDLE_CA_KEY, BUNDLE_CREDENTIALS_DIR, OPT_INHIBIT_IPV4, SYSTEM_TRUST_BUNDLE,
};
use crate::data::{self, AgentData, BundleData, DockerPlan, StatePaths};
use crate::error::{DockerError, is_not_found};
use crate::images::Progress;
use crate::lifecycle;
use crate::names::{BottleLabels, EGRESS_NETWORK, role};
use crate::pause::{PAUSE_PATH, pause_elf};
use crate::tarball::{Ownership, TarBuilder, entry_name};

/// The launch steps, in the order of a bottle's launch. Both containers
/// are created and filled first and started together (each start is a
/// third of a launch's time); the agent's keep-alive runs nothing, and no
/// command reaches the agent before every check below has passed. A
/// bundle for a microVM runs the bundle steps only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `network`.
    Network,
    /// `egress-network`.
    EgressNetwork,
    /// `bundle-create`.
    BundleCreate,
    /// `bundle-connect`.
    BundleConnect,
    /// `bundle-files`.
    BundleFiles,
    /// `agent-create`.
    AgentCreate,
    /// `agent-files`.
    AgentFiles,
    /// `provision-ca`.
    ProvisionCa,
    /// `provision-prompt`.
    ProvisionPrompt,
    /// `provision-skills`.
    ProvisionSkills,
    /// `bundle-start`.
    BundleStart,
    /// `agent-start`.
    AgentStart,
    /// `bundle-verify`.
    BundleVerify,
    /// `bundle-health`.
    BundleHealth,
    /// `agent-verify`.
    AgentVerify,
    /// `provision-git`.
    ProvisionGit,
    /// `provision-supervise`.
    ProvisionSupervise,
    /// `complete`.
    Complete,
}

impl Step {
    /// Every step, in launch order.
    pub const ALL: [Step; 18] = [
        Step::Network,
        Step::EgressNetwork,
        Step::BundleCreate,
        Step::BundleConnect,
        Step::BundleFiles,
        Step::AgentCreate,
        Step::AgentFiles,
        Step::ProvisionCa,
        Step::ProvisionPrompt,
        Step::ProvisionSkills,
        Step::BundleStart,
        Step::AgentStart,
        Step::BundleVerify,
        Step::BundleHealth,
        Step::AgentVerify,
        Step::ProvisionGit,
        Step::ProvisionSupervise,
        Step::Complete,
    ];

    /// The name `BOTTLE_FAILPOINT` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Step::Network => "network",
            Step::EgressNetwork => "egress-network",
            Step::BundleCreate => "bundle-create",
            Step::BundleConnect => "bundle-connect",
            Step::BundleFiles => "bundle-files",
            Step::AgentCreate => "agent-create",
            Step::AgentFiles => "agent-files",
            Step::ProvisionCa => "provision-ca",
            Step::ProvisionPrompt => "provision-prompt",
            Step::ProvisionSkills => "provision-skills",
            Step::BundleStart => "bundle-start",
            Step::AgentStart => "agent-start",
            Step::BundleVerify => "bundle-verify",
            Step::BundleHealth => "bundle-health",
            Step::AgentVerify => "agent-verify",
            Step::ProvisionGit => "provision-git",
            Step::ProvisionSupervise => "provision-supervise",
            Step::Complete => "complete",
        }
    }

    /// The step named `name`.
    pub fn parse(name: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.name() == name)
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable for failure injection.
pub const FAILPOINT_ENV: &str = "BOTTLE_FAILPOINT";

/// How long a `:sleep` failpoint waits before failing anyway.
const FAILPOINT_SLEEP: Duration = Duration::from_secs(600);

/// A parsed `BOTTLE_FAILPOINT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failpoint {
    /// The step after which the launch fails.
    pub step: Step,
    /// Wait (to be killed) instead of failing at once.
    pub sleep: bool,
}

impl Failpoint {
    /// Parses a `BOTTLE_FAILPOINT` value; unknown steps are an error so a
    /// typo cannot silently test nothing.
    pub fn parse(value: &str) -> Result<Option<Failpoint>, DockerError> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let (step, sleep) = match value.split_once(':') {
            Some((step, "sleep")) => (step, true),
            Some(_) => {
                return Err(DockerError::UnknownFailpoint {
                    value: value.to_string(),
                });
            }
            None => (value, false),
        };
        let Some(step) = Step::parse(step) else {
            return Err(DockerError::UnknownFailpoint {
                value: value.to_string(),
            });
        };
        Ok(Some(Failpoint { step, sleep }))
    }

    /// Reads `BOTTLE_FAILPOINT`.
    pub fn from_env() -> Result<Option<Failpoint>, DockerError> {
        Failpoint::parse(&std::env::var(FAILPOINT_ENV).unwrap_or_default())
    }
}

/// What a failed launch must take down, newest last.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    Container(String),
    Network(String),
    EgressIfUnused,
    StateDir,
    /// Only the files a bundle-only launch writes (the state dir is shared
    /// with the microVM backend's own files).
    BundleFiles,
}

/// What a launch brings up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchMode {
    /// The whole bottle: bundle and agent container. The bottle network
    /// gives the host no address.
    Bottle,
    /// Only the bundle, for a microVM bottle whose traffic smolvm dials
    /// from the host: the bottle network (still internal) gives the host
    /// its gateway address so the host reaches the bundle's pinned `.2`,
    /// the resources carry [`crate::names::MANAGED_FOR_VM`], and the steps
    /// end at `bundle-health`, which also checks the host can connect.
    BundleForVm,
}

/// Settings of one launch that come from the backend's options.
pub struct LaunchSettings {
    /// Progress lines (provisioning notes).
    pub progress: Option<Progress>,
    /// How long to wait for the bundle's health check.
    pub health_timeout: Duration,
    /// Failure injection.
    pub failpoint: Option<Failpoint>,
}

struct Launch<'a, D> {
    engine: &'a Engine,
    settings: &'a LaunchSettings,
    plan: &'a Plan<D>,
    bundle: &'a BundleData,
    paths: StatePaths,
    labels: BottleLabels,
    mode: LaunchMode,
    undo: Vec<Undo>,
    /// Held from ensuring the egress network until the bundle holds an
    /// endpoint on it, so `stop` elsewhere cannot remove it in between.
    egress_lock: Option<lifecycle::EgressLock>,
}

/// Launches the bottle `plan` describes; on failure everything created so
/// far is removed before the error is returned.
pub fn launch(
    engine: &Engine,
    settings: &LaunchSettings,
    plan: &DockerPlan,
) -> Result<DockerBottle, DockerError> {
    if plan.backend != BackendKind::Docker {
        return Err(DockerError::PlanData {
            detail: format!("the plan is for the {} backend", plan.backend),
        });
    }
    let bundle = &plan.backend_data.bundle;
    let mut launch = Launch::begin(engine, settings, plan, bundle, LaunchMode::Bottle)?;
    let result = data::write_plan(&launch.paths, plan).and_then(|()| launch.run());
    launch.finish(result)
}

/// Launches only the bundle of `plan` ([`LaunchMode::BundleForVm`]): the
/// steps up to `bundle-health`, unwound the same way on failure.
pub fn launch_bundle<D>(
    engine: &Engine,
    settings: &LaunchSettings,
    plan: &Plan<D>,
    bundle: &BundleData,
) -> Result<(), DockerError> {
    let mut launch = Launch::begin(engine, settings, plan, bundle, LaunchMode::BundleForVm)?;
    let result = launch.run_bundle();
    launch.finish(result)
}

impl<'a, D> Launch<'a, D> {
    fn begin(
        engine: &'a Engine,
        settings: &'a LaunchSettings,
        plan: &'a Plan<D>,
        bundle: &'a BundleData,
        mode: LaunchMode,
    ) -> Result<Launch<'a, D>, DockerError> {
        if bundle.version != data::STATE_LAYOUT_VERSION {
            return Err(DockerError::PlanData {
                detail: format!(
                    "version {} (this bottle reads {})",
                    bundle.version,
                    data::STATE_LAYOUT_VERSION
                ),
            });
        }
        if lifecycle::bottle_resources_exist(engine, &plan.slug)? {
            return Err(DockerError::AlreadyExists {
                name: plan.bottle.clone(),
            });
        }
        let paths = StatePaths::new(&plan.state_dir);
        let owner = Owner::current();
        let labels = BottleLabels {
            name: plan.bottle.clone(),
            agent: plan.agent.clone(),
            slug: plan.slug.clone(),
            owner,
            state_dir: plan.state_dir.display().to_string(),
            detached: bundle.detached,
            bundle_ip: bundle.ip.to_string(),
        };
        Ok(Launch {
            engine,
            settings,
            plan,
            bundle,
            paths,
            labels,
            mode,
            // From here on the state dir (or, for a bundle alone, the bundle's
            // files in it) is this launch's to remove on failure.
            undo: vec![match mode {
                LaunchMode::Bottle => Undo::StateDir,
                LaunchMode::BundleForVm => Undo::BundleFiles,
            }],
            egress_lock: None,
        })
    }

    /// Unwinds a failed launch.
    fn finish<T>(&mut self, result: Result<T, DockerError>) -> Result<T, DockerError> {
        match result {
            Ok(value) => Ok(value),
            Err(err) => {
                self.egress_lock = None;
                let failures = self.unwind();
                for failure in failures {
                    self.note(&format!("unwinding: {failure}"));
                }
                Err(err)
            }
        }
    }
}

impl<D> Launch<'_, D> {
    fn note(&self, line: &str) {
        if let Some(progress) = &self.settings.progress {
            progress(line);
        }
    }

    /// The labels of a resource of `role`; a bundle launched for a microVM
    /// is marked so the docker backend's list, stop and cleanup leave it
    /// to the smolmachines backend.
    fn labels_for(&self, role: &str) -> std::collections::HashMap<String, String> {
        let mut labels = self.labels.for_role(role);
        if self.mode == LaunchMode::BundleForVm {
            labels.insert(
                crate::names::LABEL_MANAGED.to_string(),
                crate::names::MANAGED_FOR_VM.to_string(),
            );
        }
        labels
    }

    /// Ends a step: fails here if the failpoint names it.
    fn step_done(&self, step: Step) -> Result<(), DockerError> {
        match &self.settings.failpoint {
            Some(fp) if fp.step == step => {
                if fp.sleep {
                    std::thread::sleep(FAILPOINT_SLEEP);
                }
                Err(DockerError::Failpoint {
                    step: step.name().to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    /// The bundle steps alone (a microVM's bundle): the bottle network,
    /// the egress network, and the bundle running, verified and healthy.
    fn run_bundle(&mut self) -> Result<(), DockerError> {
        self.prepare_bundle()?;
        let bundle = self.bundle.container.clone();
        self.block(&format!("start {bundle}"), async {
            self.engine.docker.start_container(&bundle, None).await
        })?;
        self.egress_lock = None;
        self.step_done(Step::BundleStart)?;
        self.check_bundle()
    }

    /// Up to `bundle-files`: the networks and the bundle container, created
    /// and filled but not started. Leaves the egress lock held.
    fn prepare_bundle(&mut self) -> Result<(), DockerError> {
        data::write_owner(&self.paths, self.labels.owner)?;
        self.write_stage()?;
        data::create_private_dir(&self.paths.logs())?;
        data::create_private_dir(&self.paths.requests())?;
        let names = (self.bundle.network.clone(), self.bundle.container.clone());
        let (network, bundle) = (&names.0, &names.1);

        self.create_network(network)?;
        self.step_done(Step::Network)?;

        // Exclusive until the bundle is attached: Docker does not keep
        // network names unique, so two launches that both saw no egress
        // network would each create one, and every later launch would
        // fail on the ambiguous name.
        self.egress_lock = Some(lifecycle::egress_lock());
        self.ensure_egress_network()?;
        self.step_done(Step::EgressNetwork)?;

        self.create_bundle(bundle)?;
        self.step_done(Step::BundleCreate)?;

        self.block("connect the bundle to the egress network", async {
            self.engine
                .docker
                .connect_network(
                    EGRESS_NETWORK,
                    NetworkConnectRequest {
                        container: bundle.clone(),
                        endpoint_config: None,
                    },
                )
                .await
        })?;
        self.step_done(Step::BundleConnect)?;

        self.write_bundle_files(bundle)?;
        self.step_done(Step::BundleFiles)?;
        Ok(())
    }

    /// Writes the bundle's CA and, for the operator to read, its config
    /// into the state dir. Done at launch, not at prepare, so a declined
    /// plan leaves nothing behind.
    fn write_stage(&self) -> Result<(), DockerError> {
        let ca =
            bottle_bundle_files::generate_ca(&self.plan.bottle).map_err(|err| DockerError::Ca {
                detail: err.to_string(),
            })?;
        data::write_file(&self.paths.ca_cert(), ca.cert_pem.as_bytes(), 0o644)?;
        data::write_file(&self.paths.ca_key(), ca.key_pem.as_bytes(), 0o600)?;
        let config = serde_json::to_vec_pretty(&config::bundle_config(self.plan, self.bundle))
            .map_err(|err| DockerError::PlanData {
                detail: err.to_string(),
            })?;
        data::write_file(&self.paths.bundle_config(), &config, 0o600)
    }

    /// `bundle-verify` and `bundle-health` of a started bundle.
    fn check_bundle(&mut self) -> Result<(), DockerError> {
        let (network, bundle) = (self.bundle.network.clone(), self.bundle.container.clone());
        let (network, bundle) = (&network, &bundle);
        self.verify_bundle(network, bundle)?;
        self.step_done(Step::BundleVerify)?;

        self.wait_healthy(bundle)?;
        if self.mode == LaunchMode::BundleForVm {
            self.wait_host_reaches(bundle)?;
        }
        self.step_done(Step::BundleHealth)?;
        Ok(())
    }

    fn block<T>(
        &self,
        action: &str,
        future: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, DockerError> {
        self.engine
            .block_on(future)
            .map_err(DockerError::api(action.to_string()))
    }

    fn create_network(&mut self, network: &str) -> Result<(), DockerError> {
        let labels = self.labels_for(role::NETWORK);
        let request = match self.mode {
            LaunchMode::Bottle => {
                config::internal_network(network, &self.bundle.subnet, self.bundle.gateway, labels)
            }
            LaunchMode::BundleForVm => {
                config::vm_bundle_network(network, &self.bundle.subnet, self.bundle.gateway, labels)
            }
        };
        self.block(&format!("create network {network}"), async {
            self.engine.docker.create_network(request).await
        })?;
        self.undo.push(Undo::Network(network.to_string()));
        self.check_network(network)
    }

    /// Fails closed unless the network is internal, has no host address
    /// (for a bundle alone: has one, see [`LaunchMode::BundleForVm`]) and
    /// has the planned subnet.
    fn check_network(&self, network: &str) -> Result<(), DockerError> {
        let inspect = self.block(&format!("inspect network {network}"), async {
            self.engine.docker.inspect_network(network, None).await
        })?;
        let refuse = |what: String| Err(DockerError::IsolationUnconfirmed { what });
        if inspect.internal != Some(true) {
            return refuse(format!("network {network} is not internal"));
        }
        let inhibit = inspect
            .options
            .as_ref()
            .and_then(|o| o.get(OPT_INHIBIT_IPV4))
            .map(String::as_str);
        match self.mode {
            LaunchMode::Bottle if inhibit != Some("true") => {
                return refuse(format!(
                    "network {network} gives the host an address on the bridge ({OPT_INHIBIT_IPV4} is not set)"
                ));
            }
            LaunchMode::BundleForVm if inhibit == Some("true") => {
                return refuse(format!(
                    "network {network} gives the host no address on the bridge ({OPT_INHIBIT_IPV4} is set), so smolvm could not dial the bundle"
                ));
            }
            _ => {}
        }
        let subnets: Vec<String> = inspect
            .ipam
            .and_then(|i| i.config)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| c.subnet)
            .collect();
        if subnets != [self.bundle.subnet.clone()] {
            return refuse(format!(
                "network {network} has subnets {subnets:?}, planned {}",
                self.bundle.subnet
            ));
        }
        Ok(())
    }

    fn ensure_egress_network(&mut self) -> Result<(), DockerError> {
        let exists = match self
            .engine
            .block_on(self.engine.docker.inspect_network(EGRESS_NETWORK, None))
        {
            Ok(_) => true,
            Err(err) if is_not_found(&err) => false,
            Err(err) => {
                return Err(DockerError::api(format!(
                    "inspect network {EGRESS_NETWORK}"
                ))(err));
            }
        };
        if !exists {
            let created = self
                .engine
                .block_on(self.engine.docker.create_network(config::egress_network()));
            match created {
                Ok(_) => {}
                // Another launch created it meanwhile.
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 409, ..
                }) => {}
                Err(err) => {
                    return Err(DockerError::api(format!("create network {EGRESS_NETWORK}"))(err));
                }
            }
        }
        self.undo.push(Undo::EgressIfUnused);
        Ok(())
    }

    fn create_bundle(&mut self, bundle: &str) -> Result<(), DockerError> {
        let logs = self.paths.logs().display().to_string();
        let requests = self.paths.requests().display().to_string();
        let body =
            config::bundle_container(self.bundle, &logs, &requests, self.labels_for(role::BUNDLE));
        let options = CreateContainerOptionsBuilder::default()
            .name(bundle)
            .build();
        self.block(&format!("create container {bundle}"), async {
            self.engine
                .docker
                .create_container(Some(options), body)
                .await
        })?;
        self.undo.push(Undo::Container(bundle.to_string()));
        Ok(())
    }

    fn write_bundle_files(&self, bundle: &str) -> Result<(), DockerError> {
        let (uid, gid) = self.bundle.user;
        let owner = Ownership {
            uid: u64::from(uid),
            gid: u64::from(gid),
        };
        let bundle_config = config::bundle_config(self.plan, self.bundle);
        let json =
            serde_json::to_vec_pretty(&bundle_config).map_err(|err| DockerError::PlanData {
                detail: err.to_string(),
            })?;
        let read =
            |path: std::path::PathBuf| std::fs::read(&path).map_err(DockerError::io("read", path));
        let cert = read(self.paths.ca_cert())?;
        let key = read(self.paths.ca_key())?;
        let mut tar = TarBuilder::new();
        tar.dir(
            &entry_name(bottle_core::bundle::BUNDLE_RUN_DIR),
            0o700,
            owner,
        )?;
        tar.file(
            &entry_name(bottle_core::bundle::BUNDLE_CONFIG_PATH),
            &json,
            0o600,
            owner,
        )?;
        tar.file(&entry_name(BUNDLE_CA_CERT), &cert, 0o644, owner)?;
        tar.file(&entry_name(BUNDLE_CA_KEY), &key, 0o600, owner)?;
        tar.dir(&entry_name(BUNDLE_CREDENTIALS_DIR), 0o700, owner)?;
        for (credential, file) in self
            .bundle
            .credentials
            .iter()
            .zip(&bundle_config.credentials)
        {
            let secret = read_secret(credential)?;
            tar.file(&entry_name(&file.file), &secret, 0o600, owner)?;
        }
        if !self.bundle.git.is_empty() {
            tar.dir(
                &entry_name(config::BUNDLE_GIT_CREDENTIALS_DIR),
                0o700,
                owner,
            )?;
            tar.dir("var/lib/bottle", 0o700, owner)?;
            tar.dir(&entry_name(config::BUNDLE_GIT_MIRRORS), 0o700, owner)?;
        }
        for (repo, served) in self.bundle.git.iter().zip(&bundle_config.git) {
            if let (Some(source), Some(file)) = (&repo.credential, &served.credential_file) {
                let secret = std::fs::read(source).map_err(|e| DockerError::Credential {
                    name: format!("git {}", repo.name),
                    detail: format!("{}: {e}", source.display()),
                })?;
                tar.file(&entry_name(file), &secret, 0o600, owner)?;
            }
        }
        upload(self.engine, bundle, tar.finish()?)
    }

    /// Fails closed unless the bundle sits at its pinned address on the
    /// (still internal) bottle network and also on the egress network.
    fn verify_bundle(&self, network: &str, bundle: &str) -> Result<(), DockerError> {
        self.check_network(network)?;
        let inspect = self.block(&format!("inspect container {bundle}"), async {
            self.engine.docker.inspect_container(bundle, None).await
        })?;
        let networks = inspect
            .network_settings
            .and_then(|n| n.networks)
            .unwrap_or_default();
        let ip = networks.get(network).and_then(|e| e.ip_address.clone());
        if ip.as_deref() != Some(&self.bundle.ip.to_string()) {
            return Err(DockerError::IsolationUnconfirmed {
                what: format!(
                    "the bundle is at {} on {network}, not at the pinned {}",
                    ip.unwrap_or_else(|| "no address".into()),
                    self.bundle.ip
                ),
            });
        }
        if !networks.contains_key(EGRESS_NETWORK) {
            return Err(DockerError::IsolationUnconfirmed {
                what: format!("the bundle is not on {EGRESS_NETWORK}"),
            });
        }
        Ok(())
    }

    /// Polls the proxy's health endpoint on the bundle's bottle-network
    /// address, from inside the bundle (works wherever the Engine API does,
    /// including daemons whose container addresses the host cannot reach).
    fn wait_healthy(&self, bundle: &str) -> Result<(), DockerError> {
        let addr = format!("{}:{}", self.bundle.ip, bottle_core::bundle::PROXY_PORT);
        let argv = [
            BUNDLE_BINARY_PATH.to_string(),
            "health".to_string(),
            "--addr".to_string(),
            addr.clone(),
        ];
        let deadline = Instant::now() + self.settings.health_timeout;
        let mut last;
        loop {
            let state = self.block(&format!("inspect container {bundle}"), async {
                self.engine.docker.inspect_container(bundle, None).await
            })?;
            let state = state.state.unwrap_or_default();
            if state.running != Some(true) {
                return Err(self.unhealthy(
                    bundle,
                    format!("the bundle exited (code {})", state.exit_code.unwrap_or(-1)),
                ));
            }
            match self
                .engine
                .block_on(exec_captured(self.engine, bundle, &argv, None))
            {
                Ok(out) if out.exit_code == 0 => return Ok(()),
                Ok(out) => {
                    last = String::from_utf8_lossy(&out.stderr).trim().to_string();
                }
                // The container may be going down; the next inspect says.
                Err(err) => last = err.message(),
            }
            if Instant::now() >= deadline {
                return Err(self.unhealthy(
                    bundle,
                    format!(
                        "no healthy answer from {addr} within {} s (last: {last})",
                        self.settings.health_timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls a TCP connection from the host to the bundle's proxy port,
    /// the path smolvm's gateway takes for the guest's traffic.
    fn wait_host_reaches(&self, bundle: &str) -> Result<(), DockerError> {
        let addr = std::net::SocketAddr::from((self.bundle.ip, bottle_core::bundle::PROXY_PORT));
        let deadline = Instant::now() + self.settings.health_timeout;
        loop {
            let last = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            if Instant::now() >= deadline {
                return Err(self.unhealthy(
                    bundle,
                    format!(
                        "the host cannot connect to {addr} within {} s (last: {last}); smolvm dials the bundle from the host",
                        self.settings.health_timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn unhealthy(&self, bundle: &str, reason: String) -> DockerError {
        DockerError::BundleUnhealthy {
            name: self.plan.bottle.clone(),
            reason,
            logs: container_logs(self.engine, bundle, 50),
        }
    }

    /// Removes what this launch created, newest first. Returns what could
    /// not be removed (best effort: every undo is tried).
    fn unwind(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        while let Some(undo) = self.undo.pop() {
            let result = match &undo {
                Undo::Container(name) => lifecycle::remove_container(self.engine, name).map(drop),
                Undo::Network(name) => lifecycle::remove_network(self.engine, name).map(drop),
                Undo::EgressIfUnused => lifecycle::remove_egress_if_unused(self.engine).map(drop),
                Undo::StateDir => data::remove_state_dir(&self.paths.root).map(drop),
                Undo::BundleFiles => data::remove_bundle_files(&self.paths.root).map(drop),
            };
            if let Err(err) = result {
                failures.push(err.message());
            }
        }
        failures
    }
}

/// The agent container's steps: a docker bottle's plan only.
impl<'a> Launch<'a, crate::data::DockerPlanData> {
    /// The agent container's part of the plan.
    fn agent(&self) -> &'a AgentData {
        &self.plan.backend_data.agent
    }

    fn run(&mut self) -> Result<DockerBottle, DockerError> {
        let data = self.agent();
        self.prepare_bundle()?;
        let (network, agent) = (self.bundle.network.clone(), data.container.clone());
        let (network, agent) = (&network, &agent);
        let bundle = self.bundle.container.clone();

        self.create_agent(agent)?;
        self.step_done(Step::AgentCreate)?;

        let arch = data.arch.clone();
        let pause = pause_elf(&arch).ok_or(DockerError::UnsupportedArch { arch })?;
        let mut tar = TarBuilder::new();
        tar.dir(&entry_name("/.bottle"), 0o755, Ownership::ROOT)?;
        tar.file(&entry_name(PAUSE_PATH), &pause, 0o755, Ownership::ROOT)?;
        upload(self.engine, agent, tar.finish()?)?;
        self.step_done(Step::AgentFiles)?;

        self.provision_ca(agent)?;
        self.step_done(Step::ProvisionCa)?;

        self.provision_prompt(agent)?;
        self.step_done(Step::ProvisionPrompt)?;

        self.provision_skills(agent)?;
        self.step_done(Step::ProvisionSkills)?;

        let (bundle_started, agent_started) = self.engine.block_on(async {
            tokio::join!(
                self.engine.docker.start_container(&bundle, None),
                self.engine.docker.start_container(agent, None)
            )
        });
        bundle_started.map_err(DockerError::api(format!("start {bundle}")))?;
        self.egress_lock = None;
        self.step_done(Step::BundleStart)?;
        agent_started.map_err(DockerError::api(format!("start {agent}")))?;
        self.step_done(Step::AgentStart)?;

        self.check_bundle()?;

        self.verify_agent(network, agent)?;
        self.step_done(Step::AgentVerify)?;

        if self.bundle.git.is_empty() {
            self.note("git: no repositories configured, skipped");
        } else {
            let names: Vec<&str> = self.bundle.git.iter().map(|r| r.name.as_str()).collect();
            self.note(&format!(
                "git: {} served by git-gate at http://{}:{}/<name>.git (GIT_GATE_URL)",
                names.join(", "),
                self.bundle.ip,
                bottle_core::bundle::GIT_GATE_PORT
            ));
        }
        self.step_done(Step::ProvisionGit)?;

        self.provision_supervise(agent)?;
        self.step_done(Step::ProvisionSupervise)?;

        data::write_file(&self.paths.launched(), b"1\n", 0o600)?;
        self.step_done(Step::Complete)?;

        Ok(DockerBottle {
            engine: self.engine.clone(),
            name: self.plan.bottle.clone(),
            container: agent.clone(),
            default_command: data.default_command.clone(),
            image: data.image_ref.clone(),
            user: (!data.user.is_empty()).then(|| data.user.clone()),
        })
    }

    fn create_agent(&mut self, agent: &str) -> Result<(), DockerError> {
        let resolv = self.paths.agent_resolv_conf();
        data::write_file(&resolv, config::AGENT_RESOLV_CONF.as_bytes(), 0o644)?;
        let body = config::agent_container(
            self.plan,
            &resolv.display().to_string(),
            self.labels.for_role(role::AGENT),
        );
        let options = CreateContainerOptionsBuilder::default().name(agent).build();
        self.block(&format!("create container {agent}"), async {
            self.engine
                .docker
                .create_container(Some(options), body)
                .await
        })?;
        self.undo.push(Undo::Container(agent.to_string()));
        Ok(())
    }

    fn provision_ca(&self, agent: &str) -> Result<(), DockerError> {
        let cert_path = self.paths.ca_cert();
        let cert = std::fs::read(&cert_path).map_err(DockerError::io("read", cert_path))?;
        let mut tar = TarBuilder::new();
        tar.dir("etc/bottle", 0o755, Ownership::ROOT)?;
        tar.file(&entry_name(AGENT_CA_PATH), &cert, 0o644, Ownership::ROOT)?;
        upload(self.engine, agent, tar.finish()?)?;
        match download_file(self.engine, agent, SYSTEM_TRUST_BUNDLE)? {
            Some((mut bundle, mode)) => {
                if !bundle.ends_with(b"\n") && !bundle.is_empty() {
                    bundle.push(b'\n');
                }
                bundle.extend_from_slice(&cert);
                let mut tar = TarBuilder::new();
                tar.file(
                    &entry_name(SYSTEM_TRUST_BUNDLE),
                    &bundle,
                    mode,
                    Ownership::ROOT,
                )?;
                upload(self.engine, agent, tar.finish()?)?;
                self.note(&format!(
                    "ca: installed at {AGENT_CA_PATH} and appended to {SYSTEM_TRUST_BUNDLE}"
                ));
            }
            None => self.note(&format!(
                "ca: installed at {AGENT_CA_PATH} (the image has no {SYSTEM_TRUST_BUNDLE})"
            )),
        }
        Ok(())
    }

    fn provision_supervise(&self, agent: &str) -> Result<(), DockerError> {
        let address = self.bundle.ip.to_string();
        let mcp = bottle_core::bundle::mcp_config(&address);
        let mut tar = TarBuilder::new();
        tar.dir("etc/bottle", 0o755, Ownership::ROOT)?;
        tar.file(
            &entry_name(bottle_core::bundle::AGENT_MCP_CONFIG),
            mcp.as_bytes(),
            0o644,
            Ownership::ROOT,
        )?;
        upload(self.engine, agent, tar.finish()?)?;
        self.note(&format!(
            "supervise: MCP at {} (MCP_SUPERVISE_URL), config in {}",
            bottle_core::bundle::supervise_url(&address),
            bottle_core::bundle::AGENT_MCP_CONFIG
        ));
        Ok(())
    }

    fn provision_prompt(&self, agent: &str) -> Result<(), DockerError> {
        let Some(prompt) = &self.agent().prompt else {
            self.note("prompt: none configured, skipped");
            return Ok(());
        };
        let contents = std::fs::read(prompt).map_err(DockerError::io("read the prompt", prompt))?;
        let owner = container_owner(self.engine, agent)?;
        let mut tar = TarBuilder::new();
        tar.file(&entry_name(AGENT_PROMPT_PATH), &contents, 0o644, owner)?;
        upload(self.engine, agent, tar.finish()?)?;
        self.note(&format!("prompt: copied to {AGENT_PROMPT_PATH}"));
        Ok(())
    }

    fn provision_skills(&self, agent: &str) -> Result<(), DockerError> {
        if self.agent().skills.is_empty() {
            self.note("skills: none configured, skipped");
            return Ok(());
        }
        let owner = container_owner(self.engine, agent)?;
        let mut tar = TarBuilder::new();
        for skill in &self.agent().skills {
            let name = skill
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "skill".into());
            tar.host_path(
                skill,
                &format!("{}/{name}", entry_name(AGENT_SKILLS_DIR)),
                owner,
            )?;
        }
        upload(self.engine, agent, tar.finish()?)?;
        self.note(&format!(
            "skills: {} copied under {AGENT_SKILLS_DIR}",
            self.agent().skills.len()
        ));
        Ok(())
    }

    /// Fails closed unless the agent runs on the bottle network only, at
    /// its pinned address, with every capability dropped and no privilege
    /// gain.
    fn verify_agent(&self, network: &str, agent: &str) -> Result<(), DockerError> {
        self.check_network(network)?;
        let inspect = self.block(&format!("inspect container {agent}"), async {
            self.engine.docker.inspect_container(agent, None).await
        })?;
        let refuse = |what: String| Err(DockerError::IsolationUnconfirmed { what });
        if inspect.state.as_ref().and_then(|s| s.running) != Some(true) {
            return refuse("the agent container is not running".into());
        }
        let networks = inspect
            .network_settings
            .and_then(|n| n.networks)
            .unwrap_or_default();
        let names: Vec<&String> = networks.keys().collect();
        if names != [network] {
            return refuse(format!(
                "the agent is on networks {names:?}, not only {network}"
            ));
        }
        let ip = networks.get(network).and_then(|e| e.ip_address.clone());
        if ip.as_deref() != Some(&self.agent().ip.to_string()) {
            return refuse(format!(
                "the agent is at {}, not at the pinned {}",
                ip.unwrap_or_default(),
                self.agent().ip
            ));
        }
        let host = inspect.host_config.unwrap_or_default();
        if !host.cap_drop.unwrap_or_default().iter().any(|c| c == "ALL") {
            return refuse("the agent keeps capabilities".into());
        }
        if !host
            .security_opt
            .unwrap_or_default()
            .iter()
            .any(|o| o.starts_with("no-new-privileges"))
        {
            return refuse("the agent may gain privileges".into());
        }
        if host.privileged == Some(true) {
            return refuse("the agent is privileged".into());
        }
        Ok(())
    }
}

/// Reads a credential's secret on the host.
fn read_secret(credential: &crate::data::CredentialRef) -> Result<Vec<u8>, DockerError> {
    let err = |detail: String| DockerError::Credential {
        name: credential.name.clone(),
        detail,
    };
    match (&credential.file, &credential.env) {
        (Some(path), _) => std::fs::read(path).map_err(|e| err(format!("{}: {e}", path.display()))),
        (None, Some(var)) => std::env::var(var)
            .map(String::into_bytes)
            .map_err(|_| err(format!("environment variable {var} is not set"))),
        (None, None) => Err(err("it has no source".into())),
    }
}

/// The last `lines` of a container's output, for error messages.
pub fn container_logs(engine: &Engine, container: &str, lines: usize) -> String {
    let options = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail(&lines.to_string())
        .build();
    engine.block_on(async {
        let mut stream = engine.docker.logs(container, Some(options));
        let mut text = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(chunk.as_ref()));
        }
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failpoints_parse_and_refuse_unknown_steps() {
        assert_eq!(Failpoint::parse("").unwrap(), None);
        assert_eq!(
            Failpoint::parse("bundle-start").unwrap(),
            Some(Failpoint {
                step: Step::BundleStart,
                sleep: false
            })
        );
        assert_eq!(
            Failpoint::parse("agent-create:sleep").unwrap(),
            Some(Failpoint {
                step: Step::AgentCreate,
                sleep: true
            })
        );
        assert!(matches!(
            Failpoint::parse("bundle-strat"),
            Err(DockerError::UnknownFailpoint { .. })
        ));
        assert!(matches!(
            Failpoint::parse("network:nap"),
            Err(DockerError::UnknownFailpoint { .. })
        ));
    }

    #[test]
    fn step_names_are_unique_and_parse_back() {
        for step in Step::ALL {
            assert_eq!(Step::parse(step.name()), Some(step));
        }
        let mut names: Vec<&str> = Step::ALL.map(Step::name).to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Step::ALL.len());
    }

    #[test]
    fn secrets_come_from_files_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut credential = crate::data::CredentialRef {
            name: "k".into(),
            host: "h".into(),
            header: "x".into(),
            format: "{}".into(),
            file: Some(file),
            env: None,
        };
        assert_eq!(read_secret(&credential).unwrap(), b"s3cret\n");
        credential.file = None;
        credential.env = Some("BOTTLE_DOCKER_TEST_UNSET_VARIABLE".into());
        let err = read_secret(&credential).unwrap_err();
        assert!(err.message().contains("BOTTLE_DOCKER_TEST_UNSET_VARIABLE"));
    }

    #[test]
    fn the_step_table_lists_every_step_in_launch_order() {
        let table: Vec<&str> = include_str!("launch.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//! | `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        assert_eq!(table, Step::ALL.map(Step::name));
    }
}
