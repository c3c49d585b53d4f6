//! [`DockerBackend`]: the [`BottleBackend`] over the Docker Engine API.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use bottle_core::backend::{
    BackendError, BackendKind, Bottle, BottleBackend, BottleInfo, BottleLauncher, CleanupItem,
    CleanupPass, CleanupReport, StopProgress,
};
use bottle_core::checkout::RepoKind;
use bottle_core::disk::format_size;
use bottle_core::isolation::{self, Isolation};
use bottle_core::manifest::{self, CredentialSource};
use bottle_core::slug::slug_of;
use bottle_core::{BottleSpec, Plan};
use bottle_net::{HostRoutes, Ipv4Net, SubnetPool};

use crate::bottle::DockerBottle;
use crate::client::Engine;
use crate::data::{
    self, AgentData, BundleData, CredentialRef, DockerPlan, DockerPlanData, GitRef,
    STATE_LAYOUT_VERSION, StatePaths,
};
use crate::error::{DockerError, is_not_found};
use crate::images::{self, Progress};
use crate::launch::{self, Failpoint, LaunchSettings};
use crate::lifecycle;
use crate::names::ResourceNames;
use crate::pause::pause_elf;
use crate::storage::LayerCap;
use crate::toolbox::InBoxAgent;
use bottle_core::timeline::Timeline;

/// How long `launch` waits for the bundle to answer by default.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(15);

/// How the CLI configures the docker backend.
#[derive(Clone)]
pub struct DockerOptions {
    /// Root of every bottle's state dir (`bottle_core::state::state_root`);
    /// `cleanup` looks for abandoned stage dirs here.
    pub state_root: PathBuf,
    /// The static `bottle-bundle` binary. `None`: `BOTTLE_BUNDLE_BIN`, then
    /// `bottle-bundle` next to the running program.
    pub bundle_bin: Option<PathBuf>,
    /// Receives build output and provisioning notes, one line at a time;
    /// `None` is quiet. The CLI passes a printer when stderr is a terminal.
    pub progress: Option<Progress>,
    /// Leave bottles running after the launching process exits
    /// (`bottle start --detach`); recorded in the plan and the labels.
    pub detach: bool,
    /// The daemon to talk to (`unix:///...`, `tcp://...`). `None`:
    /// `DOCKER_HOST`, then the local socket. Bind mounts (the bundle's log
    /// dir, the agent's resolv.conf) need the daemon on this machine.
    pub docker_host: Option<String>,
    /// How long to wait for the bundle's health check.
    pub health_timeout: Duration,
    /// Failure injection (tests): a `BOTTLE_FAILPOINT` value that takes
    /// precedence over the environment variable. It can only make a launch
    /// fail.
    pub failpoint: Option<String>,
    /// Test hook: the DNS server the agent's embedded resolver forwards to,
    /// instead of the bundle's own address. The DNS test points it at a
    /// recording server to prove nothing reaches it. Loopback addresses
    /// are refused (dockerd would query those from the host's namespace).
    pub dns_upstream: Option<Ipv4Addr>,
    /// Set when the operator interrupts the launch (the CLI's ^C handler):
    /// the launch fails after the step it is in and unwinds.
    pub interrupt: bottle_core::undo::Interrupt,
    /// Where bottle subnets come from. `None`: [`SUBNET_POOL_ENV`], then
    /// `192.168.0.0/16`.
    pub subnet_pool: Option<SubnetPool>,
    /// `bottle start --timings`: each launch step ends a lap here and the
    /// Engine's round trips are counted into it.
    pub timeline: Option<Timeline>,
    /// The name gVisor is registered under in the daemon. `None`:
    /// [`isolation::GVISOR_RUNTIME_ENV`], then `runsc`. Whatever the name, a gVisor
    /// box is confirmed to run under gVisor after its launch.
    pub gvisor_runtime: Option<String>,
}

/// The environment variable naming the range bottle subnets come from
/// (`a.b.c.d/len`, a `/24` to a `/8`), when [`DockerOptions::subnet_pool`]
/// does not.
pub const SUBNET_POOL_ENV: &str = "BOTTLE_SUBNET_POOL";

impl DockerOptions {
    /// Defaults for a state root: quiet, attached, local daemon, 15 s.
    pub fn new(state_root: impl Into<PathBuf>) -> DockerOptions {
        DockerOptions {
            state_root: state_root.into(),
            bundle_bin: None,
            progress: None,
            detach: false,
            docker_host: None,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            failpoint: None,
            dns_upstream: None,
            interrupt: bottle_core::undo::Interrupt::default(),
            subnet_pool: None,
            timeline: None,
            gvisor_runtime: None,
        }
    }
}

impl std::fmt::Debug for DockerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerOptions")
            .field("state_root", &self.state_root)
            .field("bundle_bin", &self.bundle_bin)
            .field("progress", &self.progress.is_some())
            .field("detach", &self.detach)
            .field("docker_host", &self.docker_host)
            .field("health_timeout", &self.health_timeout)
            .field("failpoint", &self.failpoint)
            .field("dns_upstream", &self.dns_upstream)
            .field("timeline", &self.timeline.is_some())
            .field("gvisor_runtime", &self.gvisor_runtime)
            .finish()
    }
}

/// The docker backend. Connects to the daemon on first use.
pub struct DockerBackend {
    options: DockerOptions,
    engine: OnceLock<Engine>,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl DockerBackend {
    /// A backend with `options`. Does not contact the daemon yet
    /// ([`BottleBackend::preflight`] does).
    pub fn new(mut options: DockerOptions) -> Result<DockerBackend, BackendError> {
        if options.state_root.as_os_str().is_empty() || !options.state_root.is_absolute() {
            return Err(DockerError::BadOption {
                option: "state_root".into(),
                detail: format!("{:?} is not an absolute path", options.state_root),
            }
            .into());
        }
        if let Some(ip) = options.dns_upstream
            && (ip.is_loopback() || ip.is_unspecified())
        {
            return Err(DockerError::BadOption {
                option: "dns_upstream".into(),
                detail: format!("{ip} is a loopback or unspecified address, which dockerd would query from the host's network namespace"),
            }
            .into());
        }
        if let Some(value) = &options.failpoint {
            Failpoint::parse(value).map_err(DockerError::from)?;
        }
        if options.subnet_pool.is_none() {
            options.subnet_pool = subnet_pool_from_env(std::env::var_os(SUBNET_POOL_ENV))?;
        }
        if options.gvisor_runtime.is_none() {
            options.gvisor_runtime = Some(isolation::gvisor_runtime_name(
                std::env::var(isolation::GVISOR_RUNTIME_ENV).ok().as_deref(),
            ));
        }
        Ok(DockerBackend {
            options,
            engine: OnceLock::new(),
        })
    }

    /// The name of the daemon's gVisor runtime this backend asks for.
    pub fn gvisor_runtime(&self) -> &str {
        self.options
            .gvisor_runtime
            .as_deref()
            .unwrap_or(isolation::GVISOR_RUNTIME)
    }

    /// The options this backend was made with.
    pub fn options(&self) -> &DockerOptions {
        &self.options
    }

    /// How long a launch waits for the bundle's health check.
    pub(crate) fn health_timeout(&self) -> Duration {
        self.options.health_timeout
    }

    /// The connection, made on first use.
    pub fn engine(&self) -> Result<&Engine, DockerError> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let engine = Engine::connect(self.options.docker_host.as_deref())?
            .counting_into(self.options.timeline.clone());
        Ok(self.engine.get_or_init(|| engine))
    }

    /// Builds the demo agent image from `examples/demo-agent/` and the
    /// static busybox at `busybox`, tagged `tag`.
    pub fn build_demo_agent(
        &self,
        demo_dir: &Path,
        busybox: &Path,
        tag: &str,
    ) -> Result<String, BackendError> {
        let engine = self.engine()?;
        let facts = images::build_demo_agent(
            engine,
            demo_dir,
            busybox,
            tag,
            self.options.progress.as_ref(),
        )?;
        Ok(facts.id)
    }

    fn progress(&self, line: &str) {
        if let Some(progress) = &self.options.progress {
            progress(line);
        }
    }

    fn prepare_inner(&self, spec: &BottleSpec) -> Result<DockerPlan, DockerError> {
        let engine = self.engine()?;
        let names = ResourceNames::for_slug(&spec.slug);
        let plan = Plan::from_spec(spec, BackendKind::Docker, spec.agent.memory_bytes());

        let info = engine
            .block_on(engine.docker.info())
            .map_err(DockerError::api("read the daemon's info"))?;
        // A cap the storage cannot enforce refuses the bottle before any
        // image is built: running it uncapped is not what was asked.
        let layer_cap = LayerCap::of_info(&info);
        if let (Some(bytes), LayerCap::Unsupported { storage }) = (plan.disk_bytes, &layer_cap) {
            return Err(DockerError::DiskCapUnsupported {
                size: format_size(bytes),
                storage: storage.clone(),
                engine_said: None,
            });
        }

        // A gVisor box needs the daemon's runsc, registered so it can run
        // one: refused here, before anything is built or created.
        let gvisor = match spec.agent.isolation {
            Isolation::Container => None,
            Isolation::Gvisor => Some(crate::gvisor::runtime_of(
                &info,
                self.gvisor_runtime(),
                &crate::gvisor::host_binary,
            )?),
        };

        // Images next: a missing image or bundle binary should fail before
        // anything is resolved further.
        let (image_ref, image) = self.agent_image(engine, spec)?;
        let (bundle, subnet) = self.prepare_bundle(spec, self.options.detach)?;
        let arch = info.architecture.unwrap_or_default();
        if pause_elf(&arch).is_none() {
            return Err(DockerError::UnsupportedArch { arch });
        }
        let agent = AgentData {
            ip: subnet.agent_ip,
            container: names.agent.clone(),
            image_id: image.id.clone(),
            image_ref: image_ref.clone(),
            user: image.user.clone(),
            default_command: image.default_command.clone(),
            arch,
            storage: layer_cap.storage().to_string(),
            dns_upstream: self.options.dns_upstream.unwrap_or(bundle.ip),
            runtime: gvisor.as_ref().map(|runtime| runtime.name.clone()),
            runtime_binary: gvisor.as_ref().map(|runtime| runtime.binary.clone()),
            env: bottle_core::agent::agent_env_of(
                spec,
                bundle.ip,
                &bottle_core::agent::OwnAddresses {
                    hostname: Some(crate::config::AGENT_HOSTNAME.into()),
                    address: Some(subnet.agent_ip),
                },
            ),
            prompt: spec.agent.prompt.as_deref().map(|p| spec.resolve(p)),
            skills: spec.agent.skills.iter().map(|s| spec.resolve(s)).collect(),
        };
        let data = DockerPlanData { bundle, agent };
        let mut plan = plan.with_data(data);
        plan.image = format!("{image_ref} ({})", short_id(&image.id));
        plan.backend_lines = backend_lines(&plan.backend_data);
        if let Some(runtime) = &gvisor {
            plan.backend_lines.extend(gvisor_lines(runtime, &plan));
        }
        plan.backend_lines
            .push(("disk".into(), layer_cap.plan_line(plan.disk_bytes)));
        // Nothing is written yet: the CA, the bundle config and the plan go
        // into the state dir at launch, so a declined plan leaves nothing.
        Ok(plan)
    }

    /// Resolves the bundle of `spec` (its image, network and pinned
    /// address) without creating anything: for a docker bottle and for a
    /// microVM's bundle alike, with the subnet it chose. `detached`: the
    /// bottle outlives the process that launches it.
    pub(crate) fn prepare_bundle(
        &self,
        spec: &BottleSpec,
        detached: bool,
    ) -> Result<(BundleData, bottle_net::BottleSubnet), DockerError> {
        let engine = self.engine()?;
        lifecycle::finish_if_stopping(engine, &self.options.state_root, &spec.slug);
        if lifecycle::bottle_resources_exist(engine, &spec.slug)? {
            return Err(DockerError::AlreadyExists {
                name: spec.name.clone(),
            });
        }
        let names = ResourceNames::for_slug(&spec.slug);
        let bundle_bin = images::find_bundle_binary(self.options.bundle_bin.as_deref())?;
        // git-gate runs the host's git: only bottles with repositories
        // need it (and need it installed).
        let git_files = if spec.agent.git.is_empty() {
            Vec::new()
        } else {
            images::git_runtime_files(&bottle_core::exec::SystemRunner)?
        };
        let image = images::ensure_bundle_image_with(
            engine,
            &bundle_bin,
            &git_files,
            self.options.progress.as_ref(),
            Some(&self.options.state_root),
        )?;
        let pool = self.options.subnet_pool.unwrap_or_default();
        let subnet = choose_subnet(engine, &pool, &spec.slug)?;
        let bundle = BundleData {
            version: STATE_LAYOUT_VERSION,
            network: names.network.clone(),
            subnet: subnet.network.to_string(),
            gateway: subnet.gateway,
            ip: subnet.bundle_ip,
            container: names.bundle.clone(),
            image,
            credentials: credential_refs(spec),
            git: git_refs(spec),
            upstream_ca: upstream_ca_files(spec, Path::new("/"))?,
            upstream_web_roots: spec.upstream_trust.web_roots(),
            detached,
            user: (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            ),
        };
        Ok((bundle, subnet))
    }

    pub(crate) fn agent_image(
        &self,
        engine: &Engine,
        spec: &BottleSpec,
    ) -> Result<(String, images::ImageFacts), DockerError> {
        if let Some(reference) = &spec.agent.image {
            return Ok((reference.clone(), images::inspect_image(engine, reference)?));
        }
        let Some(build) = &spec.agent.build else {
            return Err(DockerError::PlanData {
                detail: format!("agent {} has neither image nor build", spec.agent_name),
            });
        };
        let context_dir = spec.resolve(&build.context);
        // Tagged after the agent, not the bottle: every bottle of an agent
        // (a warm pool's entries, `--name`d ones) shares one build and one
        // tag, so none leaves a tag of its own behind.
        let agent =
            bottle_core::slug::slugify(&spec.agent_name).unwrap_or_else(|_| spec.slug.clone());
        let tag = format!("bottle-agent-{agent}:latest");
        self.progress(&format!(
            "building agent image {tag} from {}",
            context_dir.display()
        ));
        let context = images::context_tar(&context_dir)?;
        let args = build
            .args
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let facts = images::build_from_tar(
            engine,
            context,
            build.dockerfile.as_deref().unwrap_or("Dockerfile"),
            &tag,
            &args,
            &std::collections::HashMap::new(),
            self.options.progress.as_ref(),
        )?;
        Ok((tag, facts))
    }

    fn attach_inner(&self, name: &str) -> Result<DockerBottle, DockerError> {
        let engine = self.engine()?;
        let names = ResourceNames::for_slug(slug_of(name));
        let inspect = match engine.block_on(engine.docker.inspect_container(&names.agent, None)) {
            Ok(inspect) => inspect,
            Err(err) if is_not_found(&err) => {
                return Err(DockerError::NotFound {
                    name: names.bottle.clone(),
                });
            }
            Err(err) => {
                return Err(DockerError::api(format!(
                    "inspect container {}",
                    names.agent
                ))(err));
            }
        };
        let labels = inspect
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels.get(crate::names::LABEL_MANAGED).map(String::as_str) != Some("1") {
            return Err(DockerError::NotFound {
                name: names.bottle.clone(),
            });
        }
        let state_dir = PathBuf::from(
            labels
                .get(crate::names::LABEL_STATE_DIR)
                .map(String::as_str)
                .unwrap_or_default(),
        );
        let state = inspect.state.unwrap_or_default();
        if state.running != Some(true) {
            let halted = bottle_core::sandbox::reset::halted(
                &bottle_core::sandbox::ResetFiles::new(&state_dir),
            );
            return Err(DockerError::NotRunning {
                name: names.bottle.clone(),
                state: match halted {
                    Some(halt) => format!("halted: {}", halt.reason),
                    None => state.status.map(|s| s.to_string()).unwrap_or_default(),
                },
            });
        }
        // The plan says what the box is (its tier, its gVisor binary): a
        // bottle whose plan cannot be read is not driven on a guess.
        let plan = data::read_plan(&StatePaths::new(&state_dir))?;
        let gvisor_binary = data::gvisor_binary_of(&plan)?;
        let agent = Some(plan.backend_data.agent);
        let user = labels
            .get(crate::names::LABEL_AGENT_USER)
            .filter(|u| !u.is_empty())
            .cloned();
        Ok(DockerBottle {
            user,
            engine: engine.clone(),
            name: names.bottle.clone(),
            container: names.agent.clone(),
            default_command: agent
                .as_ref()
                .map(|a| a.default_command.clone())
                .unwrap_or_default(),
            image: agent
                .map(|a| a.image_ref)
                .unwrap_or_else(|| inspect.image.unwrap_or_default()),
            warnings: Vec::new(),
            toolbox: InBoxAgent::new(&names.bottle, &self.options.state_root.join(slug_of(name))),
            bundle: names.bundle.clone(),
            state_dir,
            gvisor_binary,
        })
    }

    /// Launches and returns the concrete bottle (the trait returns it boxed).
    pub fn launch_bottle(&self, plan: &DockerPlan) -> Result<DockerBottle, BackendError> {
        let engine = self.engine()?;
        Ok(launch::launch(engine, &self.launch_settings()?, plan)?)
    }

    /// The settings of a launch: progress, health timeout, failpoint.
    pub(crate) fn launch_settings(&self) -> Result<LaunchSettings, DockerError> {
        Ok(LaunchSettings {
            progress: self.options.progress.clone(),
            health_timeout: self.options.health_timeout,
            step_ends: bottle_core::launch_steps::StepEnds {
                timeline: self.options.timeline.clone(),
                interrupt: self.options.interrupt.clone(),
                failpoint: match &self.options.failpoint {
                    Some(value) => Failpoint::parse(value)?,
                    None => Failpoint::from_env()?,
                },
            },
            ca_surveys: crate::cache::CaSurveyCache::new(&self.options.state_root),
        })
    }

    /// Finds a running bottle (concrete type).
    pub fn attach_bottle(&self, name: &str) -> Result<DockerBottle, BackendError> {
        Ok(self.attach_inner(name)?)
    }
}

/// The subnet pool [`SUBNET_POOL_ENV`] names, if it is set.
fn subnet_pool_from_env(
    value: Option<std::ffi::OsString>,
) -> Result<Option<SubnetPool>, DockerError> {
    let Some(value) = value else {
        return Ok(None);
    };
    value
        .to_str()
        .ok_or_else(|| "it is not UTF-8".to_string())
        .and_then(|text| text.parse::<SubnetPool>().map_err(|e| e.to_string()))
        .map(Some)
        .map_err(|detail| DockerError::BadOption {
            option: SUBNET_POOL_ENV.into(),
            detail: format!("{value:?}: {detail}"),
        })
}

/// The slug's subnet from `pool`, skipping every subnet an existing Docker
/// network or a host route overlaps.
pub(crate) fn choose_subnet(
    engine: &Engine,
    pool: &SubnetPool,
    slug: &str,
) -> Result<bottle_net::BottleSubnet, DockerError> {
    let networks = engine
        .block_on(engine.docker.list_networks(None))
        .map_err(DockerError::api("list networks"))?;
    let taken: Vec<Ipv4Net> = networks
        .iter()
        .filter_map(|n| n.ipam.as_ref()?.config.as_ref())
        .flatten()
        .filter_map(|c| c.subnet.as_deref())
        .filter_map(parse_cidr)
        .collect();
    let routes = HostRoutes::read(Path::new("/"))?;
    Ok(pool.choose(slug, &|net| {
        taken.iter().any(|t| t.overlaps(&net)) || routes.overlaps(net)
    })?)
}

/// The spec's credentials as the bundle reads them at launch (sources,
/// never secrets).
pub(crate) fn credential_refs(spec: &BottleSpec) -> Vec<CredentialRef> {
    spec.agent
        .credentials
        .iter()
        .map(|c| CredentialRef {
            name: c.name.clone(),
            host: c.host.clone(),
            header: c.header.clone(),
            format: c.format.clone().unwrap_or_else(|| "{}".into()),
            file: match &c.source {
                CredentialSource::File(path) => Some(expand_home(spec, path)),
                CredentialSource::Env(_) => None,
            },
            env: match &c.source {
                CredentialSource::Env(var) => Some(var.clone()),
                CredentialSource::File(_) => None,
            },
        })
        .collect()
}

/// The host files holding the CAs the bundle trusts for upstream TLS: the
/// manifest's `egress.upstream_ca`, then the system store under `root`
/// when the trust asks for it (found now, so a missing store fails the
/// plan rather than the launch).
pub(crate) fn upstream_ca_files(
    spec: &BottleSpec,
    root: &Path,
) -> Result<Vec<PathBuf>, DockerError> {
    let mut files: Vec<PathBuf> = spec
        .agent
        .egress
        .upstream_ca
        .iter()
        .map(|file| expand_home(spec, file))
        .collect();
    if spec.upstream_trust.system_store() {
        let store = bottle_core::upstream_trust::find_system_store(root).ok_or_else(|| {
            DockerError::NoSystemTrustStore {
                trust: spec.upstream_trust.to_string(),
                candidates: bottle_core::upstream_trust::SYSTEM_TRUST_STORES.join(", "),
            }
        })?;
        files.push(store);
    }
    Ok(files)
}

/// The spec's repositories as git-gate serves them.
pub(crate) fn git_refs(spec: &BottleSpec) -> Vec<GitRef> {
    spec.agent
        .git
        .iter()
        .map(|repo| {
            let remote = manifest::is_remote_git_url(&repo.url);
            let local_path = (!remote).then(|| expand_home(spec, &repo.url));
            let checkout =
                local_path.as_deref().and_then(RepoKind::of_path) == Some(RepoKind::Checkout);
            GitRef {
                name: repo.name.clone(),
                local_path,
                checkout,
                upstream: remote.then(|| repo.url.clone()),
                mode: repo.mode,
                push: repo.push.clone(),
                allow_force: repo.allow_force,
                allow_delete: repo.allow_delete,
                credential: repo.credential.as_deref().map(|c| expand_home(spec, c)),
            }
        })
        .collect()
}

fn parse_cidr(text: &str) -> Option<Ipv4Net> {
    let (addr, len) = text.split_once('/')?;
    Ipv4Net::new(addr.parse::<Ipv4Addr>().ok()?, len.parse().ok()?).ok()
}

fn short_id(id: &str) -> String {
    id.trim_start_matches("sha256:").chars().take(12).collect()
}

fn expand_home(spec: &BottleSpec, path: &str) -> PathBuf {
    match path.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(rest))
            .unwrap_or_else(|| spec.resolve(path)),
        None => spec.resolve(path),
    }
}

fn backend_lines(data: &DockerPlanData) -> Vec<(String, String)> {
    let DockerPlanData { bundle, agent } = data;
    vec![
        (
            "network".into(),
            format!(
                "{} ({}, internal, no host address)",
                bundle.network, bundle.subnet
            ),
        ),
        (
            "bundle".into(),
            format!(
                "{} at {} ({}), also on bot-bottle-egress",
                bundle.container, bundle.ip, bundle.image
            ),
        ),
        (
            "agent".into(),
            format!(
                "{} at {} as {}",
                agent.container,
                agent.ip,
                if agent.user.is_empty() {
                    "root (the image sets no user)"
                } else {
                    agent.user.as_str()
                }
            ),
        ),
        (
            "dns".into(),
            "none (empty resolv.conf; the embedded resolver only reaches the bundle)".into(),
        ),
        (
            "lifetime".into(),
            if bundle.detached {
                "detached: runs until `bottle stop`".into()
            } else {
                "stopped when this command exits".into()
            },
        ),
    ]
}

/// The plan's lines for a gVisor box: the runtime it runs under, and its
/// limits as the Engine enforces them.
fn gvisor_lines(
    runtime: &crate::gvisor::GvisorRuntime,
    plan: &DockerPlan,
) -> Vec<(String, String)> {
    let limits = isolation::engine_limits(Isolation::Gvisor, plan.memory_bytes, plan.pids);
    vec![
        ("runtime".into(), runtime.describe()),
        (
            "gvisor".into(),
            format!(
                "memory cgroup {} MiB (gVisor's kernel included; past it the whole box is killed), {} processes per user in the box (RLIMIT_NPROC, gVisor's), pids cgroup {} host tasks (gVisor's threads)",
                limits.memory >> 20,
                limits.nproc.unwrap_or_default(),
                limits.pids
            ),
        ),
    ]
}

impl BottleLauncher for DockerBackend {
    type PlanData = DockerPlanData;

    fn prepare(&self, spec: &BottleSpec) -> Result<DockerPlan, BackendError> {
        Ok(self.prepare_inner(spec)?)
    }

    fn launch(&self, plan: &DockerPlan) -> Result<Box<dyn Bottle>, BackendError> {
        Ok(Box::new(self.launch_bottle(plan)?))
    }
}

impl BottleBackend for DockerBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    fn preflight(&self) -> Result<(), BackendError> {
        // Connecting asks the daemon its API version: that answer is the
        // check. Only a connection made earlier is asked again.
        let connected_before = self.engine.get().is_some();
        let engine = self.engine()?;
        if connected_before {
            engine
                .block_on(engine.docker.ping())
                .map_err(DockerError::api("ping the docker daemon"))?;
        }
        Ok(())
    }

    fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError> {
        Ok(Box::new(self.attach_inner(name)?))
    }

    fn list_active(&self) -> Result<Vec<BottleInfo>, BackendError> {
        Ok(lifecycle::list_active(
            self.engine()?,
            &self.options.state_root,
        )?)
    }

    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        Ok(lifecycle::stop(
            self.engine()?,
            &self.options.state_root,
            name,
        )?)
    }

    fn begin_stop(&self, name: &str) -> Result<StopProgress, BackendError> {
        Ok(lifecycle::begin_stop(
            self.engine()?,
            &self.options.state_root,
            name,
        )?)
    }

    fn finish_stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        Ok(lifecycle::finish_stop(
            self.engine()?,
            &self.options.state_root,
            name,
        )?)
    }

    fn cleanup_plan(&self) -> Result<Vec<CleanupItem>, BackendError> {
        let mut pass = CleanupPass::listing();
        self.cleanup_pass(&mut pass)?;
        Ok(pass.found)
    }

    fn cleanup_approved(&self, approved: &[CleanupItem]) -> Result<CleanupReport, BackendError> {
        let mut pass = CleanupPass::removing(approved);
        self.cleanup_pass(&mut pass)?;
        Ok(pass.report)
    }
}

impl DockerBackend {
    /// One walk over this install's leftovers: broken pool entries,
    /// orphaned bottles and state dirs, the unused egress network, and the
    /// bundle images of older binaries.
    fn cleanup_pass(&self, pass: &mut CleanupPass<'_>) -> Result<(), DockerError> {
        let engine = self.engine()?;
        let root = &self.options.state_root;
        lifecycle::cleanup_broken_pool_entries(engine, root, pass)?;
        lifecycle::cleanup(engine, root, pass)?;
        // Without the current binary there is no telling which image is
        // still wanted; then nothing is pruned.
        if let Ok(current) = images::find_bundle_binary(self.options.bundle_bin.as_deref()) {
            images::prune_bundle_images(engine, &current, root, pass)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subnet_pool_variable_is_a_range_or_a_bad_option() {
        assert_eq!(subnet_pool_from_env(None).unwrap(), None);
        let pool = subnet_pool_from_env(Some("10.213.0.0/16".into())).unwrap();
        assert_eq!(pool.map(|p| p.len()), Some(256));
        for bad in ["10.213.0.0", "10.213.0.0/25", "192.168.17.0/24", "nonsense"] {
            let err = subnet_pool_from_env(Some(bad.into())).unwrap_err();
            assert_eq!(bottle_core::Coded::code(&err), "BOT-D005", "{bad}");
            let message = err.to_string();
            assert!(message.contains(SUBNET_POOL_ENV), "{message}");
            assert!(message.contains(bad), "{message}");
        }
    }

    #[test]
    fn upstream_cas_resolve_next_to_the_manifest_and_the_system_store_follows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("corp-ca.pem"),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let manifest_path = dir.path().join("bottle.toml");
        let spec_with = |trust: &str| {
            let text = format!(
                "[agents.a]\nimage = \"x\"\negress.upstream_ca = [\"corp-ca.pem\"]\n\
                 egress.upstream_trust = \"{trust}\"\n"
            );
            let manifest = bottle_core::manifest::parse(&manifest_path, &text).unwrap();
            BottleSpec::new(&manifest, &manifest_path, "a", None, Path::new("/s")).unwrap()
        };
        let root = tempfile::tempdir().unwrap();

        let web = upstream_ca_files(&spec_with("web"), root.path()).unwrap();
        assert_eq!(web, [dir.path().join("corp-ca.pem")]);

        let err = upstream_ca_files(&spec_with("web+system"), root.path()).unwrap_err();
        assert!(
            matches!(err, DockerError::NoSystemTrustStore { .. }),
            "{err}"
        );
        assert_eq!(bottle_core::Coded::code(&err), "BOT-D081");

        let store = root.path().join("etc/pki/tls/certs/ca-bundle.crt");
        std::fs::create_dir_all(store.parent().unwrap()).unwrap();
        std::fs::write(&store, "").unwrap();
        let system = upstream_ca_files(&spec_with("system"), root.path()).unwrap();
        assert_eq!(
            system,
            [
                dir.path().join("corp-ca.pem"),
                std::fs::canonicalize(&store).unwrap()
            ]
        );
    }

    #[test]
    fn cidrs_parse() {
        assert_eq!(
            parse_cidr("172.17.0.0/16").map(|n| n.to_string()),
            Some("172.17.0.0/16".into())
        );
        assert_eq!(parse_cidr("fd00::/64"), None);
    }

    /// `bottle --manifest sub/bottle.toml` from the directory above `sub`:
    /// what Docker gets as bind sources is absolute.
    #[test]
    fn host_paths_are_absolute_when_the_manifest_path_is_relative() {
        let dir = tempfile::tempdir().unwrap();
        let sub = std::fs::canonicalize(dir.path()).unwrap().join("sub");
        for d in ["objects", "refs"] {
            std::fs::create_dir_all(sub.join("git/app.git").join(d)).unwrap();
        }
        std::fs::write(sub.join("git/app.git/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(
            sub.join("bottle.toml"),
            "[agents.a]\nimage = \"x\"\negress.allow = [\"api.example.com\"]\n\
             credentials = [{ name = \"k\", source = { file = \"keys/k\" }, \
             host = \"api.example.com\", header = \"x-api-key\" }]\n\
             [[agents.a.git]]\nname = \"app\"\nurl = \"git/app.git\"\n",
        )
        .unwrap();
        // Relative to the test's working directory: changing the process's
        // directory would race the other tests.
        let cwd = std::env::current_dir().unwrap();
        let mut relative: PathBuf =
            std::iter::repeat_n("..", cwd.components().count() - 1).collect();
        relative.push(sub.strip_prefix("/").unwrap().join("bottle.toml"));
        let manifest = manifest::load(&relative).unwrap();
        let spec = BottleSpec::new(&manifest, &relative, "a", None, dir.path()).unwrap();
        assert_eq!(
            git_refs(&spec)[0].local_path.as_deref(),
            Some(sub.join("git/app.git").as_path())
        );
        assert_eq!(
            credential_refs(&spec)[0].file.as_deref(),
            Some(sub.join("keys/k").as_path())
        );
    }

    #[test]
    fn relative_state_roots_are_refused() {
        let err = DockerBackend::new(DockerOptions::new("relative/state")).unwrap_err();
        assert_eq!(err.code, "BOT-D005");
    }

    #[test]
    fn plan_lines_say_what_the_operator_confirms() {
        let lines = backend_lines(&crate::config::tests::sample_data());
        let text: String = lines.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
        assert!(text.contains("internal, no host address"));
        assert!(text.contains("192.168.40.2"));
        assert!(text.contains("dns: none"));
    }
}
