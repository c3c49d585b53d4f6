//! The crate's error type and its stable codes (`BOT-D…`).
//!
//! Every variant displays what failed and knows what the operator should do
//! next ([`Coded::fix`]); the trait boundary turns it into a
//! [`BackendError`] keeping both and the code.

use std::io;
use std::path::PathBuf;

use bottle_core::Coded;
use bottle_core::backend::{BackendError, BackendErrorKind};

/// Everything that can go wrong in the docker backend.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The Docker daemon cannot be reached.
    #[error("cannot reach the docker daemon at {endpoint}: {source}")]
    Connect {
        /// Where we tried to connect.
        endpoint: String,
        /// The client's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// The daemon speaks an API older than the one this backend needs.
    #[error(
        "the docker daemon speaks engine api {found}, older than the {} this backend needs",
        crate::api_version::DOCKER_MIN_API
    )]
    ApiTooOld {
        /// The daemon's API version.
        found: String,
    },
    /// A Docker Engine API call failed.
    #[error("could not {action}: {}", api_detail(source))]
    Api {
        /// What we were doing ("create network bot-bottle-x").
        action: String,
        /// The client's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// The manifest names an image that is not in the local image store.
    #[error("image {reference} is not in the local image store")]
    ImageNotFound {
        /// The reference.
        reference: String,
    },
    /// A Dockerfile build failed.
    #[error("could not build image {tag}: {detail}")]
    Build {
        /// The image being built.
        tag: String,
        /// The daemon's error and the tail of the build output.
        detail: String,
    },
    /// A file needed on the host could not be read or written.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        /// What we were doing ("read the build context").
        action: String,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The static `bottle-bundle` binary is nowhere to be found.
    #[error(
        "the static bottle-bundle binary was not found (looked at: {})",
        searched.join(", ")
    )]
    BundleBinaryMissing {
        /// The places searched, in order.
        searched: Vec<String>,
    },
    /// The `bottle-bundle` binary is dynamically linked and would not run
    /// in an image without a libc.
    #[error(
        "{} is dynamically linked; the bundle image has no libc to load it with",
        path.display()
    )]
    BundleBinaryNotStatic {
        /// The binary.
        path: PathBuf,
    },
    /// Git's runtime files (for the bundle's git-gate) could not be
    /// collected on the host.
    #[error("cannot put git into the bundle image for git-gate: {detail}")]
    GitRuntime {
        /// What failed (the bundle's own message).
        detail: String,
    },
    /// A bottle with this name already has Docker resources.
    #[error("bottle {name} already exists")]
    AlreadyExists {
        /// The bottle.
        name: String,
    },
    /// No bottle with this name.
    #[error("no docker bottle named {name}")]
    NotFound {
        /// The bottle.
        name: String,
    },
    /// The bottle exists but its agent container is not running.
    #[error("bottle {name} is not running (agent container is {state})")]
    NotRunning {
        /// The bottle.
        name: String,
        /// Docker's state of the agent container.
        state: String,
    },
    /// The plan's docker section is missing or not ours.
    #[error("the plan has no usable docker section: {detail}")]
    PlanData {
        /// What is wrong with it.
        detail: String,
    },
    /// The per-bottle CA could not be generated.
    #[error("could not generate the bottle's CA: {detail}")]
    Ca {
        /// The bundle crate's error, rendered.
        detail: String,
    },
    /// The agent container refused what every box receives
    /// (`bottle_core::agent_box::agent_files`).
    #[error("the agent container {container} refused bottle's files for it: {reason}")]
    AgentFilesRefused {
        /// The agent container.
        container: String,
        /// The daemon's reason (a read-only directory, no room left).
        reason: String,
    },
    /// The box stopped while a command ran in it, and the command's
    /// output did not end with it.
    #[error("the box {container} {how} while the command ran in it")]
    BoxStopped {
        /// The agent container.
        container: String,
        /// How it ended ("was killed at its memory limit (out of memory)").
        how: String,
    },
    /// A credential's secret could not be read on the host.
    #[error("could not read credential {name}: {detail}")]
    Credential {
        /// The credential's name.
        name: String,
        /// Why.
        detail: String,
    },
    /// No subnet could be chosen.
    #[error(transparent)]
    Subnet(#[from] bottle_net::NetError),
    /// A bottle's audit log could not be kept when its state dir went.
    #[error(transparent)]
    RetainedLogs(#[from] bottle_core::audit_files::RetainedLogsError),
    /// The operator interrupted the launch; it unwound.
    #[error(transparent)]
    Interrupted(#[from] bottle_core::undo::Interrupted),
    /// The bottle's record could not be read, written or advanced.
    #[error(transparent)]
    Record(#[from] bottle_core::life::RecordError),
    /// A warm pool entry's files could not be read or written.
    #[error(transparent)]
    Pool(#[from] bottle_core::pool::PoolError),
    /// A working checkout's mirror could not be made, or its sync record
    /// written.
    #[error(transparent)]
    Checkout(#[from] bottle_core::checkout::CheckoutError),
    /// `bottle commit` was given a name the Engine cannot tag.
    #[error("{image:?} cannot name the committed image: {why}")]
    BadImageName {
        /// What was given.
        image: String,
        /// Why not.
        why: String,
    },
    /// `bottle commit` of a bottle whose image has no command at all.
    #[error(
        "the bottle's image {image} has neither an entrypoint nor a command, and the Engine makes no container (so no committed configuration) of such an image"
    )]
    CommitNoCommand {
        /// The bottle's image.
        image: String,
    },
    /// `bottle commit` could not read or filter the agent's filesystem.
    #[error("could not commit the bottle: {detail}")]
    Commit {
        /// What went wrong.
        detail: String,
    },
    /// Isolation could not be positively confirmed; the launch was refused.
    #[error("isolation not confirmed, bottle refused: {what}")]
    IsolationUnconfirmed {
        /// What could not be confirmed.
        what: String,
    },
    /// The bundle exited, or did not say it was ready (nor answer its health check) in time.
    #[error(
        "the bundle of {name} did not become healthy: {reason}\n  bundle logs:\n{}",
        bundle_logs(logs)
    )]
    BundleUnhealthy {
        /// The bottle.
        name: String,
        /// Why the wait ended.
        reason: String,
        /// The tail of the bundle's logs.
        logs: String,
    },
    /// `BOTTLE_FAILPOINT` made the launch fail after this step.
    #[error("launch failed on purpose after step {step} (BOTTLE_FAILPOINT)")]
    Failpoint {
        /// The step.
        step: String,
    },
    /// `BOTTLE_FAILPOINT` names no step of the launch.
    #[error(transparent)]
    UnknownFailpoint(#[from] bottle_core::launch_steps::UnknownFailpoint),
    /// The operator's terminal could not be set up or read.
    #[error("could not {action}: {detail}")]
    Terminal {
        /// What we were doing.
        action: String,
        /// The error.
        detail: String,
    },
    /// The daemon runs on a CPU architecture this backend has no keep-alive
    /// program for.
    #[error("the docker daemon runs on {arch}, which has no bottle keep-alive program")]
    UnsupportedArch {
        /// Docker's architecture name.
        arch: String,
    },
    /// `limits.disk` is set and the daemon's storage cannot cap a
    /// container's writable layer: the bottle is refused rather than run
    /// uncapped.
    #[error(
        "limits.disk ({size}) cannot be enforced: {storage} cannot limit a container's writable layer{}",
        engine_said.as_deref().map(|said| format!(" (the docker daemon said: {said})")).unwrap_or_default()
    )]
    DiskCapUnsupported {
        /// The cap asked for, for people.
        size: String,
        /// The daemon's storage, e.g. `overlay2 on extfs`.
        storage: String,
        /// The daemon's refusal of the container, when it was the one to
        /// tell (overlay2 on xfs without `pquota`).
        engine_said: Option<String>,
    },
    /// The upstream trust asks for the host's system store and there is none.
    #[error(
        "upstream trust {trust} needs the host's system trust store, and none of {candidates} exists"
    )]
    NoSystemTrustStore {
        /// The trust asked for.
        trust: String,
        /// The paths looked at.
        candidates: String,
    },
    /// An `egress.upstream_ca` file (or the system store) could not be
    /// read at launch, or holds no PEM certificate.
    #[error("upstream CA {path}: {detail}")]
    UpstreamCa {
        /// The host file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The host cannot snapshot the agent's writable layer, so the bottle
    /// has no reset.
    #[error("{why}")]
    ResetUnavailable {
        /// Why, a lowercase fragment.
        why: String,
    },
    /// The agent's layer stayed mounted after its container was killed.
    #[error("the agent's layer {} is still mounted after its container was killed", upper.display())]
    ResetMounted {
        /// The layer's upper directory.
        upper: PathBuf,
    },
    /// Copying the golden snapshot failed.
    #[error("could not copy {} to {}: {detail}", from.display(), to.display())]
    ResetCopy {
        /// The tree copied.
        from: PathBuf,
        /// Where to.
        to: PathBuf,
        /// What `cp` said.
        detail: String,
    },
    /// The agent container is not in the state a reset needs.
    #[error("{what}")]
    ResetState {
        /// What is wrong, a lowercase fragment.
        what: String,
    },
    /// Neither the command given nor the image has a command to run.
    #[error("no command given and image {image} has no entrypoint or cmd")]
    NoCommand {
        /// The image.
        image: String,
    },
    /// A backend option or environment variable is invalid.
    #[error("invalid docker backend option {option}: {detail}")]
    BadOption {
        /// The option.
        option: String,
        /// Why it is refused.
        detail: String,
    },
    /// A bottle without a golden snapshot cannot wait in the pool: its
    /// claim could not check the box's three sources.
    #[error("{bottle} has no golden snapshot, so it cannot be checked again when claimed")]
    PoolNeedsReset {
        /// The bottle.
        bottle: String,
    },
    /// The async runtime could not be started.
    #[error("could not start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    /// The plan's subnet was free when it was made and is not any more:
    /// another launch (or anyone) created a network overlapping it since.
    #[error(
        "subnet {subnet} of network {network} was taken after the plan was made, by a launch running at the same time or a network created meanwhile"
    )]
    SubnetTaken {
        /// The planned subnet.
        subnet: String,
        /// The bottle network that could not be created.
        network: String,
    },
    /// The manifest asks for gVisor and the daemon has no gVisor runtime
    /// registered under the name bottle asks for.
    #[error(
        "isolation = \"gvisor\" needs the docker daemon's `{runtime}` runtime, and the daemon has none (its runtimes: {registered})"
    )]
    GvisorMissing {
        /// The runtime name bottle asks for.
        runtime: String,
        /// The runtimes the daemon has, comma separated.
        registered: String,
    },
    /// The daemon's gVisor runtime is registered in a way that cannot run a
    /// bottle's box, or would weaken it.
    #[error(
        "the docker daemon's `{runtime}` runtime ({path}) cannot run a gVisor bottle: {problems}"
    )]
    GvisorUnfit {
        /// The runtime's name.
        runtime: String,
        /// Its binary, as the daemon reports it.
        path: String,
        /// Every reason, `; `-separated.
        problems: String,
    },
    /// After the launch the box was not found running under gVisor (the
    /// Engine's record, the host's processes or the box's kernel said
    /// otherwise): the bottle was refused and unwound.
    #[error("the agent's box is not running under gVisor: {what}")]
    NotUnderGvisor {
        /// What was found instead.
        what: String,
    },
    /// The shared egress network has no address left for another bundle.
    #[error(
        "the egress network {network} ({subnets}) has no free address for another bundle: {bundles} bundles hold one"
    )]
    EgressAddressesExhausted {
        /// The network's name.
        network: String,
        /// Its subnets, comma separated.
        subnets: String,
        /// How many containers are on it.
        bundles: usize,
    },
}

/// Whether the daemon refused a network because its subnet overlaps one in
/// use (dockerd: 403 "Pool overlaps with other one on this address space").
pub(crate) fn is_pool_overlap(err: &bollard::errors::Error) -> bool {
    matches!(
        err,
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.contains("Pool overlaps")
    )
}

/// Whether the daemon could not give a container an address on `network`
/// because its pool is used up (dockerd, at the start: "no available IPv4
/// addresses on this network's address pools: NAME (ID)").
pub(crate) fn is_address_pool_full(err: &bollard::errors::Error, network: &str) -> bool {
    matches!(
        err,
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.contains("no available IPv4 addresses")
                && message.contains(&format!(": {network} ("))
    )
}

/// How to build the static bundle binary.
pub const BUNDLE_BUILD_HINT: &str = "RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build --release --target x86_64-unknown-linux-gnu -p bottle-bundle";

impl DockerError {
    /// Builds an [`DockerError::Api`] for `action`.
    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> Self {
        let action = action.into();
        move |source| DockerError::Api { action, source }
    }

    /// Builds an [`DockerError::Io`] for `action` on `path`.
    pub(crate) fn io(
        action: impl Into<String>,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        let action = action.into();
        let path = path.into();
        move |source| DockerError::Io {
            action,
            path,
            source,
        }
    }

    /// The classification the CLI maps to an exit code.
    pub fn kind(&self) -> BackendErrorKind {
        match self {
            DockerError::Connect { .. }
            | DockerError::ApiTooOld { .. }
            | DockerError::BundleBinaryMissing { .. }
            | DockerError::BundleBinaryNotStatic { .. }
            | DockerError::GvisorMissing { .. }
            | DockerError::GvisorUnfit { .. } => BackendErrorKind::Preflight,
            DockerError::NotFound { .. } | DockerError::ImageNotFound { .. } => {
                BackendErrorKind::NotFound
            }
            DockerError::BadImageName { .. } => BackendErrorKind::NotFound,
            DockerError::CommitNoCommand { .. } => BackendErrorKind::Unsupported,
            DockerError::UnsupportedArch { .. }
            | DockerError::DiskCapUnsupported { .. }
            | DockerError::ResetUnavailable { .. }
            | DockerError::PoolNeedsReset { .. } => BackendErrorKind::Unsupported,
            DockerError::IsolationUnconfirmed { .. }
            | DockerError::BundleUnhealthy { .. }
            | DockerError::NotUnderGvisor { .. } => BackendErrorKind::IsolationUnconfirmed,
            DockerError::SubnetTaken { .. } => BackendErrorKind::PlanTaken,
            _ => BackendErrorKind::Failed,
        }
    }
}

/// The daemon's own message when it sent one, else the client's error.
fn api_detail(err: &bollard::errors::Error) -> String {
    match err {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => format!("{message} (http {status_code})"),
        other => other.to_string(),
    }
}

/// True when the daemon answered 404 (no such container, network, image).
pub(crate) fn is_not_found(err: &bollard::errors::Error) -> bool {
    matches!(
        err,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

impl Coded for DockerError {
    fn code(&self) -> &'static str {
        match self {
            DockerError::Connect { .. } => "BOT-D001",
            DockerError::ApiTooOld { .. } => "BOT-D002",
            DockerError::Api { .. } => "BOT-D003",
            DockerError::Runtime(_) => "BOT-D004",
            DockerError::BadOption { .. } => "BOT-D005",
            DockerError::ImageNotFound { .. } => "BOT-D010",
            DockerError::Build { .. } => "BOT-D011",
            DockerError::Io { .. } => "BOT-D012",
            DockerError::BundleBinaryMissing { .. } => "BOT-D020",
            DockerError::BundleBinaryNotStatic { .. } => "BOT-D021",
            DockerError::UnsupportedArch { .. } => "BOT-D022",
            DockerError::GitRuntime { .. } => "BOT-D023",
            DockerError::AlreadyExists { .. } => "BOT-D030",
            DockerError::NotFound { .. } => "BOT-D031",
            DockerError::NotRunning { .. } => "BOT-D032",
            DockerError::NoCommand { .. } => "BOT-D033",
            DockerError::PlanData { .. } => "BOT-D040",
            DockerError::Ca { .. } => "BOT-D041",
            DockerError::Credential { .. } => "BOT-D042",
            DockerError::AgentFilesRefused { .. } => "BOT-D043",
            DockerError::BoxStopped { .. } => "BOT-D044",
            DockerError::Subnet(err) => err.code(),
            DockerError::RetainedLogs(err) => err.code(),
            DockerError::Interrupted(err) => err.code(),
            DockerError::Record(err) => err.code(),
            DockerError::Pool(err) => err.code(),
            DockerError::Checkout(err) => err.code(),
            DockerError::IsolationUnconfirmed { .. } => "BOT-D050",
            DockerError::BadImageName { .. } => "BOT-D095",
            DockerError::CommitNoCommand { .. } => "BOT-D096",
            DockerError::Commit { .. } => "BOT-D097",
            DockerError::BundleUnhealthy { .. } => "BOT-D051",
            DockerError::Failpoint { .. } => "BOT-D060",
            DockerError::UnknownFailpoint(_) => "BOT-D061",
            DockerError::Terminal { .. } => "BOT-D070",
            DockerError::DiskCapUnsupported { .. } => "BOT-D080",
            DockerError::NoSystemTrustStore { .. } => "BOT-D081",
            DockerError::UpstreamCa { .. } => "BOT-D082",
            DockerError::GvisorMissing { .. } => "BOT-D090",
            DockerError::GvisorUnfit { .. } => "BOT-D091",
            DockerError::NotUnderGvisor { .. } => "BOT-D092",
            DockerError::ResetUnavailable { .. } => "BOT-D100",
            DockerError::ResetMounted { .. } => "BOT-D101",
            DockerError::ResetCopy { .. } => "BOT-D102",
            DockerError::ResetState { .. } => "BOT-D103",
            DockerError::SubnetTaken { .. } => "BOT-D150",
            DockerError::EgressAddressesExhausted { .. } => "BOT-D151",
            DockerError::PoolNeedsReset { .. } => "BOT-D131",
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            DockerError::Connect { .. } => "start the docker daemon (e.g. `sudo systemctl start docker`), check DOCKER_HOST, and make sure your user may use the socket (the `docker` group)".into(),
            DockerError::ApiTooOld { .. } => "upgrade docker to 20.10 or newer".into(),
            DockerError::Api { .. } => "check `docker info` and the daemon's log; run `bottle cleanup` if a previous bottle left resources behind".into(),
            DockerError::ImageNotFound { reference } => format!(
                "no registry is used: build or load the image locally first (`docker build -t {reference} DIR` or `docker load`), or give the agent a [build] context instead of image"
            ),
            DockerError::Build { .. } => "fix the Dockerfile or its context; no registry is reachable, so base images must already be local (or use FROM scratch)".into(),
            DockerError::Io { .. } => "check that the path exists and that you may read and write it".into(),
            DockerError::GitRuntime { .. } => "install git on the host (Debian: `apt-get install git`), or remove the agent's git repositories from the manifest".into(),
            DockerError::BundleBinaryMissing { .. } | DockerError::BundleBinaryNotStatic { .. } => format!(
                "install bottle with its bundle (`cargo xtask install` from a clone), or build it with `{BUNDLE_BUILD_HINT}` and point BOTTLE_BUNDLE_BIN at target/x86_64-unknown-linux-gnu/release/bottle-bundle"
            ),
            DockerError::AlreadyExists { name } => format!(
                "join its agent with `bottle attach {name}`, or remove it with `bottle stop {name}`; use --name to run a second bottle of the same agent"
            ),
            DockerError::NotFound { .. } => "list running bottles with `bottle list`".into(),
            DockerError::NotRunning { name, .. } => format!("remove it with `bottle stop {name}` and start it again"),
            DockerError::PlanData { .. } => "prepare the plan again with the docker backend (`bottle start`)".into(),
            DockerError::Ca { .. } => "check that the state directory is writable and try again".into(),
            DockerError::AgentFilesRefused { .. } => "check that the agent image's /etc is writable and the Docker host has room, then start again".into(),
            DockerError::BoxStopped { .. } => "the bottle's box is gone: `bottle stop` it and start it again; if it ran out of memory, raise `memory` under the agent's [limits]".into(),
            DockerError::Credential { .. } => "make sure the credential's file exists and is readable, or that its environment variable is set".into(),
            DockerError::Subnet(err) => return err.fix(),
            DockerError::RetainedLogs(err) => return err.fix(),
            DockerError::Interrupted(err) => return err.fix(),
            DockerError::Record(err) => return err.fix(),
            DockerError::Pool(err) => return err.fix(),
            DockerError::Checkout(err) => return err.fix(),
            DockerError::IsolationUnconfirmed { .. } => "nothing was left running; check `docker info` (the daemon must support internal bridge networks) and report this if it persists".into(),
            DockerError::BundleUnhealthy { .. } => "read the bundle logs above; `bottle doctor` checks the bundle binary and the daemon".into(),
            DockerError::Failpoint { .. } | DockerError::UnknownFailpoint(_) => "unset BOTTLE_FAILPOINT".into(),
            DockerError::Terminal { .. } => "run the command from a terminal, or use `bottle exec` without a TTY".into(),
            DockerError::UnsupportedArch { .. } => "use an x86_64 or aarch64 docker host, or the smolmachines backend".into(),
            DockerError::DiskCapUnsupported { .. } => "remove `disk` from the agent's [agents.<name>.limits] to run with the writable layer uncapped, or put Docker's data root (/var/lib/docker) on xfs mounted with `pquota` (or use the btrfs or zfs storage driver)".into(),
            DockerError::NoSystemTrustStore { .. } => "install the distribution's CA bundle (Debian: `apt-get install ca-certificates`), or set egress.upstream_trust = \"web\" and name your network's CA in egress.upstream_ca".into(),
            DockerError::UpstreamCa { .. } => "make egress.upstream_ca name a readable PEM file holding the CA certificate (`bottle check` says which)".into(),
            DockerError::GvisorMissing { .. } => crate::runsc::GVISOR_FIX.into(),
            DockerError::GvisorUnfit { runtime, .. } => format!(
                "register `{runtime}` in /etc/docker/daemon.json as bottle's CI does ({}) and reload the daemon without restarting it: `kill -HUP $(pidof dockerd)`; or set isolation = \"container\"",
                crate::runsc::GVISOR_DAEMON_JSON
            ),
            DockerError::NotUnderGvisor { .. } => "nothing was left running; check that the daemon's `runsc` runtime is gVisor's runsc (`bottle doctor`, `docker info`) and report this if it persists".into(),
            DockerError::ResetUnavailable { .. } => "run bottle as root on the daemon's host with the overlay2 storage driver (`docker info`), then stop the bottle and start it again".into(),
            DockerError::ResetMounted { .. } | DockerError::ResetState { .. } => "read `docker inspect` of the agent container and the daemon's log; stop the bottle and start a new one".into(),
            DockerError::ResetCopy { .. } => "check the free space and the permissions under the state dir and /var/lib/docker; stop the bottle and start a new one".into(),
            DockerError::PoolNeedsReset { .. } => "the pool needs reset's golden snapshot: run bottle as root on the daemon's host with the overlay2 storage driver (`bottle doctor`), or start bottles cold".into(),
            DockerError::NoCommand { .. } => "set `command` for the agent in the manifest, or pass the command to run".into(),
            DockerError::BadOption { .. } => "correct or unset the option".into(),
            DockerError::BadImageName { .. } => "name the image like `my-env:v2` (letters, digits, `.`, `_`, `-`, `/`, and a `:tag`)".into(),
            DockerError::CommitNoCommand { .. } => "give the agent image a CMD (the manifest's `command` still overrides it) and start the bottle from it again".into(),
            DockerError::Commit { .. } => "check `docker info` and the free space of the daemon's data root, then commit again; the bottle is unchanged".into(),
            DockerError::SubnetTaken { .. } => "start the bottle again: a new plan picks a free subnet (`bottle start -y` re-plans by itself); if it keeps happening, widen the pool with BOTTLE_SUBNET_POOL (e.g. 10.213.0.0/16)".into(),
            DockerError::EgressAddressesExhausted { network, .. } => format!(
                "stop bottles you no longer need (`bottle list`, `bottle stop NAME`); or, with no bottle running, remove {network} (`docker network rm {network}`) after giving dockerd larger `default-address-pools` in /etc/docker/daemon.json, so the next launch creates it from them"
            ),
            DockerError::Runtime(_) => "check the process limits (threads, file descriptors)".into(),
        };
        Some(fix)
    }
}

impl From<bottle_core::launch_steps::StepStop> for DockerError {
    fn from(stop: bottle_core::launch_steps::StepStop) -> DockerError {
        match stop {
            bottle_core::launch_steps::StepStop::Interrupted(err) => DockerError::Interrupted(err),
            bottle_core::launch_steps::StepStop::Failpoint { step } => DockerError::Failpoint {
                step: step.to_string(),
            },
        }
    }
}

impl From<DockerError> for BackendError {
    fn from(err: DockerError) -> BackendError {
        BackendError::from_coded(err.kind(), err)
    }
}

/// The bundle's logs as the unhealthy error quotes them.
fn bundle_logs(logs: &str) -> &str {
    if logs.trim().is_empty() {
        "(the bundle wrote no logs)"
    } else {
        logs.trim_end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<DockerError> {
        let bollard = || bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "boom".into(),
        };
        let io = || io::Error::other("boom");
        let text = || "x".to_string();
        vec![
            DockerError::Connect {
                endpoint: text(),
                source: bollard(),
            },
            DockerError::ApiTooOld { found: text() },
            DockerError::Api {
                action: text(),
                source: bollard(),
            },
            DockerError::ImageNotFound { reference: text() },
            DockerError::Build {
                tag: text(),
                detail: text(),
            },
            DockerError::Io {
                action: text(),
                path: "/x".into(),
                source: io(),
            },
            DockerError::BundleBinaryMissing {
                searched: vec![text()],
            },
            DockerError::BundleBinaryNotStatic { path: "/x".into() },
            DockerError::GitRuntime { detail: text() },
            DockerError::AlreadyExists { name: text() },
            DockerError::NotFound { name: text() },
            DockerError::NotRunning {
                name: text(),
                state: text(),
            },
            DockerError::PlanData { detail: text() },
            DockerError::Ca { detail: text() },
            DockerError::Credential {
                name: text(),
                detail: text(),
            },
            DockerError::Subnet(bottle_net::NetError::SubnetsExhausted {
                candidates: 1,
                pool: bottle_net::SubnetPool::default().range(),
            }),
            DockerError::Interrupted(bottle_core::undo::Interrupted { step: text() }),
            DockerError::Record(bottle_core::life::RecordError::Missing { dir: "/x".into() }),
            DockerError::Pool(bottle_core::pool::PoolError::Record {
                path: "/x".into(),
                detail: text(),
            }),
            DockerError::Checkout(bottle_core::checkout::CheckoutError::Mirror {
                checkout: "/x".into(),
                detail: text(),
            }),
            DockerError::RetainedLogs(bottle_core::audit_files::RetainedLogsError {
                action: "keep the audit log in",
                path: "/x".into(),
                source: io(),
            }),
            DockerError::IsolationUnconfirmed { what: text() },
            DockerError::BadImageName {
                image: text(),
                why: text(),
            },
            DockerError::CommitNoCommand { image: text() },
            DockerError::Commit { detail: text() },
            DockerError::BundleUnhealthy {
                name: text(),
                reason: text(),
                logs: String::new(),
            },
            DockerError::Failpoint { step: text() },
            DockerError::UnknownFailpoint(bottle_core::launch_steps::UnknownFailpoint {
                value: text(),
                steps: text(),
            }),
            DockerError::Terminal {
                action: text(),
                detail: text(),
            },
            DockerError::UnsupportedArch { arch: text() },
            DockerError::DiskCapUnsupported {
                size: text(),
                storage: text(),
                engine_said: Some(text()),
            },
            DockerError::ResetUnavailable { why: text() },
            DockerError::ResetMounted { upper: "/x".into() },
            DockerError::ResetCopy {
                from: "/x".into(),
                to: "/y".into(),
                detail: text(),
            },
            DockerError::ResetState { what: text() },
            DockerError::PoolNeedsReset { bottle: text() },
            DockerError::NoCommand { image: text() },
            DockerError::BadOption {
                option: text(),
                detail: text(),
            },
            DockerError::Runtime(io()),
            DockerError::SubnetTaken {
                subnet: text(),
                network: text(),
            },
            DockerError::EgressAddressesExhausted {
                network: text(),
                subnets: text(),
                bundles: 1,
            },
            DockerError::GvisorMissing {
                runtime: text(),
                registered: text(),
            },
            DockerError::GvisorUnfit {
                runtime: text(),
                path: text(),
                problems: text(),
            },
            DockerError::NotUnderGvisor { what: text() },
        ]
    }

    #[test]
    fn every_variant_is_a_lowercase_fragment_with_a_separate_fix() {
        for err in every_variant() {
            let message = err.to_string();
            // Lowercase prose; a leading name like BOTTLE_FAILPOINT is fine.
            let mut chars = message.chars();
            let capitalised = chars.next().is_some_and(char::is_uppercase)
                && chars.next().is_some_and(char::is_lowercase);
            assert!(!capitalised, "{message}");
            assert!(!message.ends_with('.'), "{message}");
            assert!(!message.contains("fix:"), "{message}");
            let fix = err.fix().unwrap_or_default();
            assert!(!fix.is_empty(), "{message}");
            assert!(err.code().starts_with("BOT-"), "{message}");
            let code = err.code();
            let backend: BackendError = err.into();
            assert_eq!(backend.code, code);
            assert_eq!(backend.message, message);
            assert_eq!(backend.fix, fix);
        }
    }

    #[test]
    fn isolation_failures_are_classified_as_such() {
        let err = DockerError::BundleUnhealthy {
            name: "b".into(),
            reason: "timed out".into(),
            logs: "boom".into(),
        };
        assert_eq!(err.kind(), BackendErrorKind::IsolationUnconfirmed);
        assert!(err.to_string().contains("boom"));
    }

    #[test]
    fn a_taken_subnet_says_a_fresh_plan_may_succeed() {
        let err = DockerError::SubnetTaken {
            subnet: "192.168.40.0/24".into(),
            network: "bot-bottle-x".into(),
        };
        assert_eq!(err.kind(), BackendErrorKind::PlanTaken);
    }

    #[test]
    fn full_pools_are_told_apart_from_other_refusals() {
        let refusal =
            |status_code, message: &str| bollard::errors::Error::DockerResponseServerError {
                status_code,
                message: message.into(),
            };
        let overlap = refusal(403, "Pool overlaps with other one on this address space");
        let full = refusal(
            500,
            "no available IPv4 addresses on this network's address pools: bot-bottle-egress (abc)",
        );
        let other = refusal(500, "something else");
        assert!(is_pool_overlap(&overlap) && !is_pool_overlap(&full) && !is_pool_overlap(&other));
        assert!(is_address_pool_full(&full, "bot-bottle-egress"));
        assert!(!is_address_pool_full(&full, "bot-bottle-x"));
        assert!(!is_address_pool_full(&overlap, "bot-bottle-egress"));
        assert!(!is_address_pool_full(&other, "bot-bottle-egress"));
    }
}
