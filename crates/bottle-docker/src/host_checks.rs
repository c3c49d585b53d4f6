//! The docker backend's checks of this host for `bottle doctor`
//! ([`DockerHostChecks`], placed by `bottle_preflight::run_all`): does the
//! daemon answer on its unix socket, new enough (`docker.daemon`); can its
//! storage cap an agent's writable layer (`docker.disk_quota`); is its
//! gVisor runtime registered so it can run a bottle's box (`docker.gvisor`).
//!
//! They ask the daemon through bollard, the client the backend itself
//! uses, without negotiating a version (bollard sends `GET /version` and
//! `GET /info` unversioned, which any daemon answers in its own API), each
//! answer bounded by the context's timeout: a doctor must say what is on
//! the socket, whatever it is, rather than wait on it. The host is read
//! through the context's root, so the socket of a test is a path in its
//! temp dir.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{SystemInfo, SystemVersion};
use bottle_core::exec::CommandSpec;
use bottle_core::isolation::{GvisorBuild, Registration};
use bottle_preflight::host::exists;
use bottle_preflight::{Check, Context, HostChecks, Platform, PreflightError, Status, settle};

use crate::api_version::{DOCKER_MIN_API, DockerApiVersion};
use crate::client::DEFAULT_SOCKET;
use crate::runsc::GVISOR_FIX;
use crate::storage::LayerCap;

/// Stable id of the daemon check.
pub const DAEMON_ID: &str = "docker.daemon";
const DAEMON_TITLE: &str = "docker daemon";

/// Stable id of the storage check.
pub const DISK_QUOTA_ID: &str = "docker.disk_quota";
const DISK_QUOTA_TITLE: &str = "docker disk quota";

/// Stable id of the gVisor check.
pub const GVISOR_ID: &str = "docker.gvisor";
const GVISOR_TITLE: &str = "gvisor runtime";

/// The docker backend's checks, for `bottle_preflight::run_all`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DockerHostChecks;

impl HostChecks for DockerHostChecks {
    fn ids(&self) -> &'static [&'static str] {
        &[DAEMON_ID, DISK_QUOTA_ID, GVISOR_ID]
    }

    /// The storage and gVisor checks ask only a daemon that answered:
    /// otherwise the daemon check has already said why, and a second
    /// wait adds nothing. Every backend needs the daemon (smolmachines
    /// runs the bottle's bundle as a container), so an unreachable one is
    /// never softened.
    fn run(&self, ctx: &Context<'_>) -> Vec<Check> {
        let daemon = settle(DAEMON_ID, DAEMON_TITLE, true, check_daemon(ctx));
        if daemon.status == Status::Fail {
            let skip = |id, title| {
                Check::new(
                    id,
                    title,
                    Status::Skip,
                    "not checked: the docker daemon is not reachable".to_owned(),
                )
            };
            return vec![
                daemon,
                skip(DISK_QUOTA_ID, DISK_QUOTA_TITLE),
                skip(GVISOR_ID, GVISOR_TITLE),
            ];
        }
        // One `GET /info` serves both.
        let info = daemon_info(ctx);
        vec![daemon, check_disk_quota(&info), check_gvisor(ctx, &info)]
    }
}

/// Where `DOCKER_HOST` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket, as a host path.
    Unix(PathBuf),
    /// Anything else (`tcp://`, `ssh://`): not probed.
    Other(String),
}

/// Resolves a `DOCKER_HOST` value; unset or empty means [`DEFAULT_SOCKET`].
pub fn endpoint(docker_host: Option<&str>) -> Endpoint {
    match docker_host.map(str::trim) {
        None | Some("") => Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET)),
        Some(value) => match value.strip_prefix("unix://") {
            Some(path) => Endpoint::Unix(PathBuf::from(path)),
            None => Endpoint::Other(value.to_owned()),
        },
    }
}

/// The daemon's socket under the context's root, or the `DOCKER_HOST`
/// value that is not a unix socket.
fn socket(ctx: &Context<'_>) -> Result<PathBuf, String> {
    match endpoint(ctx.docker_host.as_deref()) {
        Endpoint::Unix(path) => Ok(ctx.root.join(path)),
        Endpoint::Other(value) => Err(value),
    }
}

/// Why the daemon could not be asked.
#[derive(Debug)]
enum AskError {
    Missing,
    Refused,
    Denied,
    Timeout,
    Io(String),
    Status(u16, String),
    /// Something answered, but not in HTTP.
    Malformed(String),
    Json(String),
}

impl AskError {
    /// One line for a check that could not ask the daemon.
    fn summary(&self) -> String {
        match self {
            AskError::Missing => "no socket".to_owned(),
            AskError::Refused => "connection refused".to_owned(),
            AskError::Denied => "permission denied".to_owned(),
            AskError::Timeout => "timed out".to_owned(),
            AskError::Io(detail) | AskError::Malformed(detail) => detail.clone(),
            AskError::Status(code, body) => format!("HTTP {code}: {body}"),
            AskError::Json(detail) => format!("unexpected json: {detail}"),
        }
    }

    fn of_io(err: &io::Error) -> AskError {
        match err.kind() {
            io::ErrorKind::NotFound => AskError::Missing,
            io::ErrorKind::ConnectionRefused => AskError::Refused,
            io::ErrorKind::PermissionDenied => AskError::Denied,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => AskError::Timeout,
            _ => AskError::Io(err.to_string()),
        }
    }

    /// What bollard's error says of the socket: an I/O error's kind
    /// wherever it sits under the client's error (hyper wraps the
    /// connector's), else the daemon's answer or its JSON.
    fn of(err: bollard::errors::Error) -> AskError {
        use bollard::errors::Error;
        match err {
            Error::SocketNotFoundError(_) => AskError::Missing,
            Error::RequestTimeoutError => AskError::Timeout,
            Error::DockerResponseServerError {
                status_code,
                message,
            } => AskError::Status(status_code, snippet(&message)),
            Error::JsonDataError { message, .. } => AskError::Json(message),
            Error::JsonSerdeError { err } => AskError::Json(err.to_string()),
            Error::IOError { err } => AskError::of_io(&err),
            other => {
                let mut innermost: &(dyn std::error::Error + 'static) = &other;
                loop {
                    if let Some(io) = innermost.downcast_ref::<io::Error>() {
                        return AskError::of_io(io);
                    }
                    match innermost.source() {
                        Some(next) => innermost = next,
                        None => break,
                    }
                }
                // No I/O error under it: the connection worked and what
                // came back was not an HTTP answer (hyper's parse error).
                AskError::Malformed(innermost.to_string())
            }
        }
    }
}

/// The daemon's answer to `request`, asked over the unix socket `socket`
/// and waited for at most `timeout`.
fn ask<T, F, Fut>(socket: &Path, timeout: Duration, request: F) -> Result<T, AskError>
where
    F: FnOnce(Docker) -> Fut,
    Fut: Future<Output = Result<T, bollard::errors::Error>>,
{
    // bollard says only "not found" of a socket it cannot see; a
    // directory on the way this user may not enter is told apart here.
    match socket.try_exists() {
        Ok(true) => {}
        Ok(false) => return Err(AskError::Missing),
        Err(err) => return Err(AskError::of_io(&err)),
    }
    let Some(path) = socket.to_str() else {
        return Err(AskError::Io(format!(
            "{} is not a UTF-8 path",
            socket.display()
        )));
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| AskError::Io(format!("could not start a runtime: {err}")))?;
    // bollard's client must be made inside the runtime that drives it.
    runtime.block_on(async {
        let docker =
            Docker::connect_with_unix(path, timeout.as_secs().max(1), bollard::API_DEFAULT_VERSION)
                .map_err(AskError::of)?;
        match tokio::time::timeout(timeout, request(docker)).await {
            Ok(answer) => answer.map_err(AskError::of),
            Err(_) => Err(AskError::Timeout),
        }
    })
}

fn snippet(body: &str) -> String {
    let text = body.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Checks that the Docker daemon answers on its unix socket and speaks API
/// [`DOCKER_MIN_API`] or newer.
pub fn check_daemon(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    let check = |status, message: String| Check::new(DAEMON_ID, DAEMON_TITLE, status, message);
    let socket = match socket(ctx) {
        Ok(socket) => socket,
        Err(value) => {
            return Ok(check(
                Status::Warn,
                format!("DOCKER_HOST={value} is not a unix socket, so it was not probed"),
            )
            .with_remediation(
                "point DOCKER_HOST at the daemon's unix socket (unix:///var/run/docker.sock) to have it checked",
            ));
        }
    };
    let at = socket.display();
    let unreachable = |reason: String| -> Result<Check, PreflightError> {
        Ok(check(
            Status::Fail,
            format!("docker daemon not reachable: {reason}"),
        )
        .with_remediation(start_remediation(ctx)?))
    };
    let not_docker = format!(
        "make sure {at} is the docker daemon's socket, or set DOCKER_HOST to the right one"
    );
    let upgrade = format!("upgrade Docker Engine to 20.10 (api {DOCKER_MIN_API}) or newer");
    Ok(
        match ask(&socket, ctx.docker_timeout, |docker| async move {
            docker.version().await
        }) {
            Ok(SystemVersion {
                version,
                api_version: Some(api_version),
                ..
            }) => {
                let version = version.unwrap_or_else(|| "(no version)".to_owned());
                match DockerApiVersion::parse(&api_version) {
                    Some(api) if api >= DOCKER_MIN_API => check(
                        Status::Ok,
                        format!("docker {version} (api {api_version}) at {at}"),
                    ),
                    parsed => {
                        let why = if parsed.is_some() {
                            format!("older than {DOCKER_MIN_API}")
                        } else {
                            "not a version bottle understands".to_owned()
                        };
                        check(
                            Status::Warn,
                            format!("docker {version} at {at} speaks api {api_version}, {why}"),
                        )
                        .with_remediation(upgrade)
                    }
                }
            }
            Ok(SystemVersion {
                api_version: None, ..
            }) => check(
                Status::Fail,
                format!("docker daemon at {at} answered GET /version without an ApiVersion"),
            )
            .with_remediation(not_docker),
            Err(AskError::Missing) => unreachable(format!("no socket at {at}"))?,
            Err(AskError::Refused) => unreachable(format!(
                "nothing accepts connections on {at} (the daemon is not running)"
            ))?,
            Err(AskError::Denied) => check(
                Status::Fail,
                format!("docker daemon not reachable: permission denied on {at}"),
            )
            .with_remediation(
                "add this user to the docker group: `sudo usermod -aG docker $USER`, then log out and back in",
            ),
            Err(AskError::Timeout) => unreachable(format!(
                "{at} did not answer within {:?}",
                ctx.docker_timeout
            ))?,
            Err(AskError::Io(err)) => unreachable(format!("{at}: {err}"))?,
            Err(AskError::Status(code, body)) => check(
                Status::Fail,
                format!("docker daemon at {at} answered GET /version with HTTP {code}: {body}"),
            )
            .with_remediation("check the daemon's log (`journalctl -u docker`) and restart it"),
            Err(AskError::Malformed(detail)) => check(
                Status::Fail,
                format!("{at} did not answer like a docker daemon: {detail}"),
            )
            .with_remediation(not_docker),
            Err(AskError::Json(err)) => check(
                Status::Fail,
                format!("docker daemon at {at} answered GET /version with unexpected json: {err}"),
            )
            .with_remediation(not_docker),
        },
    )
}

/// The daemon's `GET /info`, or why it could not be had, in one line:
/// what the storage and gVisor checks judge.
pub fn daemon_info(ctx: &Context<'_>) -> Result<SystemInfo, String> {
    let socket =
        socket(ctx).map_err(|value| format!("DOCKER_HOST={value} is not a unix socket"))?;
    ask(&socket, ctx.docker_timeout, |docker| async move {
        docker.info().await
    })
    .map_err(|err| {
        format!(
            "the docker daemon did not answer GET /info ({})",
            err.summary()
        )
    })
}

/// What the daemon's storage can do with `limits.disk`, and Docker's data
/// root, from `GET /info`; `Err` says why the daemon could not be asked.
/// `bottle plan` reads it too, so the plan and the doctor agree.
pub fn storage(ctx: &Context<'_>) -> Result<(LayerCap, String), String> {
    Ok(storage_of(&daemon_info(ctx)?))
}

/// What `info` says of the storage: its [`LayerCap`] and Docker's data root.
fn storage_of(info: &SystemInfo) -> (LayerCap, String) {
    let root = match info.docker_root_dir.as_deref() {
        None | Some("") => "/var/lib/docker".to_owned(),
        Some(root) => root.to_owned(),
    };
    (LayerCap::of_info(info), root)
}

/// Checks whether the daemon's storage can cap a container's writable
/// layer, so that `limits.disk` holds. It cannot on the common overlay2 over
/// ext4; that is a warning, not a failure: bottles without `limits.disk`
/// run, but an agent can then fill the disk that holds Docker's data.
/// Judged from the daemon's `GET /info` (`Err`: why it was not had).
pub fn check_disk_quota(info: &Result<SystemInfo, String>) -> Check {
    let check =
        |status, message: String| Check::new(DISK_QUOTA_ID, DISK_QUOTA_TITLE, status, message);
    let (cap, root) = match info {
        Ok(info) => storage_of(info),
        Err(why) => return check(Status::Skip, format!("not checked: {why}")),
    };
    match cap {
        LayerCap::Enforced { storage } => check(
            Status::Ok,
            format!("{storage} caps an agent's writable layer where limits.disk is set"),
        ),
        LayerCap::IfPquota { storage } => check(
            Status::Ok,
            format!(
                "{storage} caps an agent's writable layer where limits.disk is set, if {root} is mounted with pquota (the daemon refuses such a bottle otherwise)"
            ),
        ),
        LayerCap::Unsupported { storage } => check(
            Status::Warn,
            format!(
                "{storage} cannot limit a container's writable layer: an agent can fill the disk holding {root}, and a bottle that sets limits.disk is refused"
            ),
        )
        .with_remediation(format!(
            "to cap agents' disk use, put {root} on xfs mounted with pquota (or use the btrfs or zfs storage driver), then set limits.disk"
        )),
    }
}

/// Checks the daemon's gVisor runtime: registered, fit (judged by
/// [`bottle_core::isolation::assess`], exactly as a launch judges it), its
/// build (`runsc --version`) and platform, and the build's known gaps.
/// gVisor is an optional tier: its absence is a warning, never a failure
/// (a manifest asking for it is refused at `bottle start` instead).
pub fn check_gvisor(ctx: &Context<'_>, info: &Result<SystemInfo, String>) -> Check {
    let name = bottle_core::isolation::gvisor_runtime_name(ctx.gvisor_runtime.as_deref());
    let name = name.as_str();
    let check = |status, message: String| Check::new(GVISOR_ID, GVISOR_TITLE, status, message);
    let runtimes = match info {
        Ok(info) => info.runtimes.clone().unwrap_or_default(),
        Err(why) => return check(Status::Skip, format!("not checked: {why}")),
    };
    let Some(entry) = runtimes.get(name) else {
        return check(
            Status::Warn,
            format!(
                "the daemon has no `{name}` runtime (it has: {}): bottles with isolation = \"gvisor\" are refused (BOT-D090)",
                crate::runsc::runtime_names(runtimes.keys())
            ),
        )
        .with_remediation(GVISOR_FIX);
    };
    let registration = Registration {
        path: entry.path.clone().unwrap_or_default(),
        args: entry.runtime_args.clone().unwrap_or_default(),
    };
    let setup = match bottle_core::isolation::assess(&registration) {
        Ok(setup) => setup,
        Err(unfit) => {
            return check(
                Status::Warn,
                format!(
                    "`{name}` ({}) cannot run a bottle's box: {} (BOT-D091)",
                    registration.path,
                    unfit.join("; ")
                ),
            )
            .with_remediation(GVISOR_FIX);
        }
    };
    let program = if registration.path.is_empty() {
        name.to_string()
    } else {
        registration.path.clone()
    };
    let version = ctx
        .runner
        .run(&CommandSpec::new(&program).arg("--version"))
        .ok()
        .filter(|out| out.success())
        .and_then(|out| GvisorBuild::parse(&out.stdout_text()));
    let Some(build) = version else {
        return check(
            Status::Warn,
            format!("`{program} --version` did not name a gVisor build: `{name}` may not be gVisor (a launch confirms it and refuses a box that is not)"),
        )
        .with_remediation(GVISOR_FIX);
    };
    let summary = format!(
        "`{name}`: runsc {} at {program} ({})",
        build.version,
        setup.describe()
    );
    let gaps = build.known_gaps(Some(&setup));
    if gaps.is_empty() {
        check(Status::Ok, summary)
    } else {
        check(
            Status::Warn,
            format!("{summary}; known gaps of this build: {}", gaps.join("; ")),
        )
        .with_remediation(
            "a current gVisor release (https://gvisor.dev/docs/user_guide/install/) has the systrap platform and its own network stack; register it as `runsc` without --network=host and reload dockerd with SIGHUP",
        )
    }
}

fn start_remediation(ctx: &Context<'_>) -> Result<String, PreflightError> {
    Ok(match ctx.platform() {
        Platform::MacOs => {
            "start Docker Desktop (or colima), or set DOCKER_HOST=unix://$HOME/.docker/run/docker.sock".to_owned()
        }
        _ if exists(&ctx.root, "/etc/NIXOS")? => "add to /etc/nixos/configuration.nix:\n  virtualisation.docker.enable = true;\n  users.users.<name>.extraGroups = [ \"docker\" ];\nthen run `sudo nixos-rebuild switch` and log out and back in".to_owned(),
        _ => "start the docker daemon: `sudo apt-get install docker.io && sudo systemctl start docker` (or run `dockerd &`); add this user to the docker group (`sudo usermod -aG docker $USER`, then log in again); if the daemon listens elsewhere, set DOCKER_HOST=unix:///path/to/docker.sock".to_owned(),
    })
}

#[cfg(test)]
mod tests;
