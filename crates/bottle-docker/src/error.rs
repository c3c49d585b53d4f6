//! The crate's error type and its stable codes (`BOT-D…`).
//!
//! Every variant knows what failed ([`DockerError::message`]) and what the
//! operator should do next ([`DockerError::fix`]); the trait boundary turns
//! it into a [`BackendError`] keeping both and the code.

use std::fmt;
use std::io;
use std::path::PathBuf;

use bottle_core::Coded;
use bottle_core::backend::{BackendError, BackendErrorKind};

/// Everything that can go wrong in the docker backend.
#[derive(Debug)]
pub enum DockerError {
    /// The Docker daemon cannot be reached.
    Connect {
        /// Where we tried to connect.
        endpoint: String,
        /// The client's error.
        source: bollard::errors::Error,
    },
    /// The daemon speaks an API older than the one this backend needs.
    ApiTooOld {
        /// The daemon's API version.
        found: String,
    },
    /// A Docker Engine API call failed.
    Api {
        /// What we were doing ("create network bot-bottle-x").
        action: String,
        /// The client's error.
        source: bollard::errors::Error,
    },
    /// The manifest names an image that is not in the local image store.
    ImageNotFound {
        /// The reference.
        reference: String,
    },
    /// A Dockerfile build failed.
    Build {
        /// The image being built.
        tag: String,
        /// The daemon's error and the tail of the build output.
        detail: String,
    },
    /// A file needed on the host could not be read or written.
    Io {
        /// What we were doing ("read the build context").
        action: String,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The static `bottle-bundle` binary is nowhere to be found.
    BundleBinaryMissing {
        /// The places searched, in order.
        searched: Vec<String>,
    },
    /// The `bottle-bundle` binary is dynamically linked and would not run
    /// in an image without a libc.
    BundleBinaryNotStatic {
        /// The binary.
        path: PathBuf,
    },
    /// Git's runtime files (for the bundle's git-gate) could not be
    /// collected on the host.
    GitRuntime {
        /// What failed (the bundle's own message).
        detail: String,
    },
    /// A bottle with this name already has Docker resources.
    AlreadyExists {
        /// The bottle.
        name: String,
    },
    /// No bottle with this name.
    NotFound {
        /// The bottle.
        name: String,
    },
    /// The bottle exists but its agent container is not running.
    NotRunning {
        /// The bottle.
        name: String,
        /// Docker's state of the agent container.
        state: String,
    },
    /// The plan's docker section is missing or not ours.
    PlanData {
        /// What is wrong with it.
        detail: String,
    },
    /// The per-bottle CA could not be generated.
    Ca {
        /// The bundle crate's error, rendered.
        detail: String,
    },
    /// A credential's secret could not be read on the host.
    Credential {
        /// The credential's name.
        name: String,
        /// Why.
        detail: String,
    },
    /// No subnet could be chosen.
    Subnet(bottle_net::NetError),
    /// Isolation could not be positively confirmed; the launch was refused.
    IsolationUnconfirmed {
        /// What could not be confirmed.
        what: String,
    },
    /// The bundle did not answer its health check in time.
    BundleUnhealthy {
        /// The bottle.
        name: String,
        /// Why the wait ended.
        reason: String,
        /// The tail of the bundle's logs.
        logs: String,
    },
    /// `BOTTLE_FAILPOINT` made the launch fail after this step.
    Failpoint {
        /// The step.
        step: String,
    },
    /// `BOTTLE_FAILPOINT` names no step of the launch.
    UnknownFailpoint {
        /// The value given.
        value: String,
    },
    /// The operator's terminal could not be set up or read.
    Terminal {
        /// What we were doing.
        action: String,
        /// The error.
        detail: String,
    },
    /// The daemon runs on a CPU architecture this backend has no keep-alive
    /// program for.
    UnsupportedArch {
        /// Docker's architecture name.
        arch: String,
    },
    /// Neither the command given nor the image has a command to run.
    NoCommand {
        /// The image.
        image: String,
    },
    /// A backend option or environment variable is invalid.
    BadOption {
        /// The option.
        option: String,
        /// Why it is refused.
        detail: String,
    },
    /// The async runtime could not be started.
    Runtime(io::Error),
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

    /// What failed, as a lowercase fragment.
    pub fn message(&self) -> String {
        match self {
            DockerError::Connect { endpoint, source } => {
                format!("cannot reach the docker daemon at {endpoint}: {source}")
            }
            DockerError::ApiTooOld { found } => format!(
                "the docker daemon speaks engine api {found}, older than the {} this backend needs",
                bottle_core::requirements::DOCKER_MIN_API
            ),
            DockerError::Api { action, source } => {
                format!("could not {action}: {}", api_detail(source))
            }
            DockerError::ImageNotFound { reference } => {
                format!("image {reference} is not in the local image store")
            }
            DockerError::Build { tag, detail } => format!("could not build image {tag}: {detail}"),
            DockerError::GitRuntime { detail } => {
                format!("cannot put git into the bundle image for git-gate: {detail}")
            }
            DockerError::Io {
                action,
                path,
                source,
            } => format!("could not {action} {}: {source}", path.display()),
            DockerError::BundleBinaryMissing { searched } => format!(
                "the static bottle-bundle binary was not found (looked at: {})",
                searched.join(", ")
            ),
            DockerError::BundleBinaryNotStatic { path } => format!(
                "{} is dynamically linked; the bundle image has no libc to load it with",
                path.display()
            ),
            DockerError::AlreadyExists { name } => {
                format!("bottle {name} already exists")
            }
            DockerError::NotFound { name } => format!("no docker bottle named {name}"),
            DockerError::NotRunning { name, state } => {
                format!("bottle {name} is not running (agent container is {state})")
            }
            DockerError::PlanData { detail } => {
                format!("the plan has no usable docker section: {detail}")
            }
            DockerError::Ca { detail } => format!("could not generate the bottle's CA: {detail}"),
            DockerError::Credential { name, detail } => {
                format!("could not read credential {name}: {detail}")
            }
            DockerError::Subnet(err) => err.to_string(),
            DockerError::IsolationUnconfirmed { what } => {
                format!("isolation not confirmed, bottle refused: {what}")
            }
            DockerError::BundleUnhealthy { name, reason, logs } => {
                let logs = if logs.trim().is_empty() {
                    "(the bundle wrote no logs)".to_string()
                } else {
                    logs.trim_end().to_string()
                };
                format!(
                    "the bundle of {name} did not become healthy: {reason}\n  bundle logs:\n{logs}"
                )
            }
            DockerError::Failpoint { step } => {
                format!("launch failed on purpose after step {step} (BOTTLE_FAILPOINT)")
            }
            DockerError::UnknownFailpoint { value } => format!(
                "BOTTLE_FAILPOINT={value:?} names no launch step (steps: {})",
                crate::launch::Step::ALL
                    .map(crate::launch::Step::name)
                    .join(", ")
            ),
            DockerError::Terminal { action, detail } => format!("could not {action}: {detail}"),
            DockerError::UnsupportedArch { arch } => {
                format!("the docker daemon runs on {arch}, which has no bottle keep-alive program")
            }
            DockerError::NoCommand { image } => {
                format!("no command given and image {image} has no entrypoint or cmd")
            }
            DockerError::BadOption { option, detail } => {
                format!("invalid docker backend option {option}: {detail}")
            }
            DockerError::Runtime(err) => format!("could not start the async runtime: {err}"),
        }
    }

    /// What the operator should do next.
    pub fn fix(&self) -> String {
        match self {
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
                "build it with `{BUNDLE_BUILD_HINT}` and point BOTTLE_BUNDLE_BIN at target/x86_64-unknown-linux-gnu/release/bottle-bundle (or put it next to the bottle binary)"
            ),
            DockerError::AlreadyExists { name } => format!(
                "attach to it with `bottle exec {name}`, or remove it with `bottle stop {name}`; use --name to run a second bottle of the same agent"
            ),
            DockerError::NotFound { .. } => "list running bottles with `bottle list`".into(),
            DockerError::NotRunning { name, .. } => format!("remove it with `bottle stop {name}` and start it again"),
            DockerError::PlanData { .. } => "prepare the plan again with the docker backend (`bottle start`)".into(),
            DockerError::Ca { .. } => "check that the state directory is writable and try again".into(),
            DockerError::Credential { .. } => "make sure the credential's file exists and is readable, or that its environment variable is set".into(),
            DockerError::Subnet(_) => String::new(),
            DockerError::IsolationUnconfirmed { .. } => "nothing was left running; check `docker info` (the daemon must support internal bridge networks) and report this if it persists".into(),
            DockerError::BundleUnhealthy { .. } => "read the bundle logs above; `bottle doctor` checks the bundle binary and the daemon".into(),
            DockerError::Failpoint { .. } | DockerError::UnknownFailpoint { .. } => "unset BOTTLE_FAILPOINT".into(),
            DockerError::Terminal { .. } => "run the command from a terminal, or use `bottle exec` without a TTY".into(),
            DockerError::UnsupportedArch { .. } => "use an x86_64 or aarch64 docker host, or the smolmachines backend".into(),
            DockerError::NoCommand { .. } => "set `command` for the agent in the manifest, or pass the command to run".into(),
            DockerError::BadOption { .. } => "correct or unset the option".into(),
            DockerError::Runtime(_) => "check the process limits (threads, file descriptors)".into(),
        }
    }

    /// The classification the CLI maps to an exit code.
    pub fn kind(&self) -> BackendErrorKind {
        match self {
            DockerError::Connect { .. }
            | DockerError::ApiTooOld { .. }
            | DockerError::BundleBinaryMissing { .. }
            | DockerError::BundleBinaryNotStatic { .. } => BackendErrorKind::Preflight,
            DockerError::NotFound { .. } => BackendErrorKind::NotFound,
            DockerError::UnsupportedArch { .. } => BackendErrorKind::Unsupported,
            DockerError::IsolationUnconfirmed { .. } | DockerError::BundleUnhealthy { .. } => {
                BackendErrorKind::IsolationUnconfirmed
            }
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

impl fmt::Display for DockerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())?;
        let fix = self.fix();
        if !fix.is_empty() {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DockerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DockerError::Connect { source, .. } | DockerError::Api { source, .. } => Some(source),
            DockerError::Io { source, .. } | DockerError::Runtime(source) => Some(source),
            DockerError::Subnet(err) => Some(err),
            _ => None,
        }
    }
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
            DockerError::Subnet(err) => err.code(),
            DockerError::IsolationUnconfirmed { .. } => "BOT-D050",
            DockerError::BundleUnhealthy { .. } => "BOT-D051",
            DockerError::Failpoint { .. } => "BOT-D060",
            DockerError::UnknownFailpoint { .. } => "BOT-D061",
            DockerError::Terminal { .. } => "BOT-D070",
        }
    }
}

impl From<DockerError> for BackendError {
    fn from(err: DockerError) -> BackendError {
        let base = BackendError::new(err.kind(), err.code(), err.message(), err.fix());
        base.with_source(err)
    }
}

impl From<bottle_net::NetError> for DockerError {
    fn from(err: bottle_net::NetError) -> Self {
        DockerError::Subnet(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_a_lowercase_fragment_with_a_fix() {
        let errors = [
            DockerError::ImageNotFound {
                reference: "x:1".into(),
            },
            DockerError::BundleBinaryMissing {
                searched: vec!["/a".into()],
            },
            DockerError::AlreadyExists { name: "b".into() },
            DockerError::IsolationUnconfirmed {
                what: "network is not internal".into(),
            },
            DockerError::Failpoint {
                step: "network".into(),
            },
        ];
        for err in errors {
            let message = err.message();
            assert!(
                message.starts_with(|c: char| !c.is_uppercase()),
                "{message}"
            );
            assert!(!message.ends_with('.'), "{message}");
            assert!(!err.fix().is_empty(), "{message}");
            assert!(err.code().starts_with("BOT-D"));
            let backend: BackendError = err.into();
            assert!(backend.to_string().contains("fix: "));
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
        assert!(err.message().contains("boom"));
    }
}
