//! The crate's error type and its stable codes (`BOT-K…`, K for krun).
//!
//! Every error displays what failed and knows what to do next
//! ([`Coded::fix`]). At the [`bottle_core::BottleBackend`] boundary it
//! becomes a [`BackendError`] that keeps the code, the message and the fix
//! apart.

use std::io;
use std::path::PathBuf;

use bottle_core::Coded;
use bottle_core::backend::{BackendError, BackendErrorKind};

use crate::version::SmolvmVersion;

/// Everything that can go wrong while driving smolvm.
#[derive(Debug, thiserror::Error)]
pub enum SmolvmError {
    /// The `smolvm` program is not on `PATH` (or not executable).
    #[error("could not run {program:?}: {source}")]
    NotInstalled {
        /// The program that was looked up.
        program: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },
    /// smolvm ran but failed on its own (not a guest command's failure).
    #[error("`{}` failed with {}{}", argv.join(" "), exit_text(*code), stderr_suffix(stderr))]
    Failed {
        /// The argv that failed.
        argv: Vec<String>,
        /// Its exit code, `None` if killed by a signal.
        code: Option<i32>,
        /// What it wrote to stderr (its `Error: …` line).
        stderr: String,
    },
    /// `smolvm --version` said something we cannot read.
    #[error("could not read the smolvm version from {:?}", output.trim())]
    BadVersion {
        /// What it printed.
        output: String,
    },
    /// This smolvm does not enforce an egress allowlist at all.
    #[error(
        "smolvm {version} does not enforce an egress allowlist (only 1.1.3 and later do, smolvm PR #427), so a bottle would have no network boundary"
    )]
    VersionUnenforced {
        /// The version found.
        version: SmolvmVersion,
    },
    /// smolvm's output was not in the shape its source says it is.
    #[error("unexpected output from `{}`: {detail}", argv.join(" "))]
    BadOutput {
        /// The argv whose output it was.
        argv: Vec<String>,
        /// What is wrong with it.
        detail: String,
    },
    /// Neither `HOME` nor the platform's data directory could be found.
    #[error("cannot locate smolvm's state database: {detail}")]
    StateDbPath {
        /// What is missing.
        detail: String,
    },
    /// smolvm's state database is not where smolvm keeps it.
    #[error(
        "smolvm's state database {} does not exist, so the allowlist cannot be confirmed",
        path.display()
    )]
    StateDbMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The state database could not be opened, read or written.
    #[error("could not {action} smolvm's state database {}: {source}", path.display())]
    StateDb {
        /// What we were doing.
        action: String,
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The machine has no row in smolvm's state database.
    #[error(
        "machine {machine:?} has no record in {}, so its allowlist cannot be confirmed",
        path.display()
    )]
    StateRowMissing {
        /// The database file.
        path: PathBuf,
        /// The machine.
        machine: String,
    },
    /// The machine's row does not hold a JSON object.
    #[error(
        "the record of machine {machine:?} in {} is not usable: {detail}",
        path.display()
    )]
    StateRecordInvalid {
        /// The database file.
        path: PathBuf,
        /// The machine.
        machine: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The allowlist read back after the patch is not the one written.
    #[error(
        "the egress policy of machine {machine:?} did not persist in {}: wrote {wanted}, read back {found}",
        path.display()
    )]
    AllowlistNotPersisted {
        /// The database file.
        path: PathBuf,
        /// The machine.
        machine: String,
        /// The policy we wrote.
        wanted: String,
        /// The policy we read back.
        found: String,
    },
    /// The image export is not a `docker save` archive we can serve.
    #[error("the image export is not a usable docker-save archive: {detail}")]
    ImageArchive {
        /// What is wrong with it.
        detail: String,
    },
    /// A file or directory could not be used.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        /// What we were doing ("write", "create directory", ...).
        action: String,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The local OCI registry could not be served.
    #[error("local image registry: could not {action}: {source}")]
    Registry {
        /// What we were doing.
        action: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `machine exec` ended without the exit-code marker our wrapper prints,
    /// so the guest command's exit code is unknown.
    #[error(
        "`smolvm machine exec` in {machine:?} ended (code {}) before the command's exit code was reported: {}",
        code.map_or_else(|| "none".to_string(), |c| c.to_string()),
        stderr.trim()
    )]
    ExecMarkerMissing {
        /// The machine.
        machine: String,
        /// smolvm's exit code.
        code: Option<i32>,
        /// What smolvm wrote to stderr.
        stderr: String,
    },
    /// The address the bundle serves the agent on cannot be a one-address
    /// allowlist under smolvm's egress gateway.
    #[error("the bundle address {address} cannot be the bottle's allowlist: {reason}")]
    BundleAddress {
        /// The address.
        address: String,
        /// Why it was refused.
        reason: String,
    },
    /// No machine of that name exists.
    #[error("no smolvm machine named {machine:?}")]
    VmMissing {
        /// The machine.
        machine: String,
    },
    /// A guest-side step of the launch (provisioning) failed.
    #[error("could not provision the bottle ({step}): {}", detail.trim())]
    Provision {
        /// The step.
        step: String,
        /// What the guest said.
        detail: String,
    },
    /// `bottle cp`'s side in the guest (its `sh` and `tar`, run as the
    /// agent's user) failed.
    #[error("could not {what} in {machine}: {}", detail.trim())]
    Copy {
        /// The machine.
        machine: String,
        /// What the copy was doing.
        what: String,
        /// What the guest said.
        detail: String,
    },
    /// A machine of that name already exists.
    #[error("a smolvm machine named {machine:?} already exists")]
    AlreadyExists {
        /// The machine.
        machine: String,
    },
    /// `bottle commit` of a microVM bottle: there is nothing an image can
    /// be made of that both the Engine and smolvm would start.
    #[error(
        "a smolmachines bottle cannot be committed to an image: its filesystem is the microVM's own disks, not a container layer the Docker Engine can commit, and smolvm makes no image of a running machine"
    )]
    CommitUnsupported,
    /// The manifest asks for an isolation tier the smolmachines backend
    /// does not run: its microVM is already the box's own kernel.
    #[error(
        "agent {agent:?} asks for isolation = \"{isolation}\", which the smolmachines backend does not run: its box is a libkrun microVM with a kernel of its own, not a container whose runtime could be gVisor"
    )]
    IsolationUnsupported {
        /// The agent.
        agent: String,
        /// The tier asked for.
        isolation: String,
    },
    /// `BOTTLE_FAILPOINT` made the launch fail after this step.
    #[error("launch failed on purpose after step {step} (BOTTLE_FAILPOINT)")]
    Failpoint {
        /// The step.
        step: String,
    },
    /// `BOTTLE_FAILPOINT` names no step of the microVM's launch or its
    /// bundle's.
    #[error(transparent)]
    UnknownFailpoint(bottle_core::launch_steps::UnknownFailpoint),
    /// The bottle's record could not be read, written or advanced.
    #[error(transparent)]
    Record(#[from] bottle_core::life::RecordError),
    /// A warm pool entry's files could not be read or written.
    #[error(transparent)]
    Pool(#[from] bottle_core::pool::PoolError),
    /// A bottle without a golden snapshot cannot wait in the pool: its
    /// claim could not check the machine against its baseline.
    #[error("{bottle} has no golden snapshot, so it cannot be checked again when claimed")]
    PoolNeedsReset {
        /// The bottle.
        bottle: String,
    },
    /// A collaborator (the bundle host, the host check) failed; its error is
    /// passed through unchanged.
    #[error(transparent)]
    External(BackendError),
}

impl SmolvmError {
    /// How the CLI should classify this failure.
    pub fn kind(&self) -> BackendErrorKind {
        match self {
            SmolvmError::NotInstalled { .. }
            | SmolvmError::BadVersion { .. }
            | SmolvmError::VersionUnenforced { .. } => BackendErrorKind::Preflight,
            SmolvmError::StateDbPath { .. }
            | SmolvmError::StateDbMissing { .. }
            | SmolvmError::StateRowMissing { .. }
            | SmolvmError::StateRecordInvalid { .. }
            | SmolvmError::AllowlistNotPersisted { .. }
            | SmolvmError::BundleAddress { .. } => BackendErrorKind::IsolationUnconfirmed,
            SmolvmError::VmMissing { .. } => BackendErrorKind::NotFound,
            SmolvmError::CommitUnsupported => BackendErrorKind::Unsupported,
            SmolvmError::IsolationUnsupported { .. } | SmolvmError::PoolNeedsReset { .. } => {
                BackendErrorKind::Unsupported
            }
            SmolvmError::External(err) => err.kind,
            _ => BackendErrorKind::Failed,
        }
    }
}

impl Coded for SmolvmError {
    fn code(&self) -> &'static str {
        match self {
            SmolvmError::NotInstalled { .. } => "BOT-K001",
            SmolvmError::Failed { .. } => "BOT-K002",
            SmolvmError::BadVersion { .. } => "BOT-K003",
            SmolvmError::VersionUnenforced { .. } => "BOT-K004",
            SmolvmError::BadOutput { .. } => "BOT-K005",
            SmolvmError::StateDbPath { .. } => "BOT-K010",
            SmolvmError::StateDbMissing { .. } => "BOT-K011",
            SmolvmError::StateDb { .. } => "BOT-K012",
            SmolvmError::StateRowMissing { .. } => "BOT-K013",
            SmolvmError::StateRecordInvalid { .. } => "BOT-K014",
            SmolvmError::AllowlistNotPersisted { .. } => "BOT-K015",
            // K020 named the removed Smolfile renderer, K030 the removed Docker
            // image source: never reuse them.
            SmolvmError::ImageArchive { .. } => "BOT-K031",
            SmolvmError::Registry { .. } => "BOT-K032",
            SmolvmError::Io { .. } => "BOT-K040",
            SmolvmError::ExecMarkerMissing { .. } => "BOT-K050",
            SmolvmError::BundleAddress { .. } => "BOT-K060",
            SmolvmError::VmMissing { .. } => "BOT-K070",
            SmolvmError::Provision { .. } => "BOT-K071",
            SmolvmError::AlreadyExists { .. } => "BOT-K072",
            SmolvmError::Failpoint { .. } => "BOT-K074",
            SmolvmError::UnknownFailpoint(_) => "BOT-K075",
            SmolvmError::Record(err) => err.code(),
            SmolvmError::Pool(err) => err.code(),
            SmolvmError::Copy { .. } => "BOT-K094",
            SmolvmError::CommitUnsupported => "BOT-K095",
            SmolvmError::IsolationUnsupported { .. } => "BOT-K096",
            SmolvmError::PoolNeedsReset { .. } => "BOT-K097",
            SmolvmError::External(err) => err.code,
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            SmolvmError::NotInstalled { .. } => {
                "install smolvm 1.1.3 or later (https://smolmachines.com/install.sh) and make sure it is on PATH, or pick the docker backend".into()
            }
            SmolvmError::Failed { .. } => {
                "read smolvm's message above; `smolvm machine ls` shows what exists, `bottle cleanup` removes leftovers".into()
            }
            SmolvmError::BadVersion { .. } => {
                "check that `smolvm --version` runs and prints `smolvm X.Y.Z`".into()
            }
            SmolvmError::VersionUnenforced { .. } => {
                "upgrade smolvm to 1.1.3 or later; there is no override, because an unenforced allowlist is no sandbox".into()
            }
            SmolvmError::BadOutput { .. } => {
                "report this smolvm version to the bottle maintainers; the output format may have changed".into()
            }
            SmolvmError::StateDbPath { .. } => {
                "set HOME (or XDG_DATA_HOME, or SMOLVM_DATA_DIR on Linux) the way smolvm sees it".into()
            }
            SmolvmError::StateDbMissing { .. } => {
                "run bottle with the same HOME, XDG_DATA_HOME and SMOLVM_DATA_DIR as smolvm; `smolvm machine ls` creates the database".into()
            }
            SmolvmError::StateDb { .. } => {
                "check that the database is writable by you; if a smolvm server holds a long write lock, retry once it is idle".into()
            }
            SmolvmError::StateRowMissing { .. } => {
                "the machine was deleted or smolvm keeps its state elsewhere; check SMOLVM_DATA_DIR and run `bottle cleanup`".into()
            }
            SmolvmError::StateRecordInvalid { .. } => {
                "delete the machine with `bottle cleanup` and start again; report the smolvm version if it recurs".into()
            }
            SmolvmError::AllowlistNotPersisted { .. } => {
                "the bottle was not started; stop any process rewriting smolvm's state (a `smolvm serve` instance) and retry, or report the smolvm version".into()
            }
            SmolvmError::ImageArchive { .. } => {
                "rebuild the agent image; report the Docker version if it recurs".into()
            }
            SmolvmError::Io { .. } => {
                "check that the directory exists, is writable by you and has free space".into()
            }
            SmolvmError::Registry { .. } => {
                "check that binding a loopback port is allowed on this host".into()
            }
            SmolvmError::ExecMarkerMissing { .. } => {
                "check that the machine is running (`smolvm machine ls`) and that its image has /bin/sh".into()
            }
            SmolvmError::BundleAddress { .. } => {
                "the bundle host must publish the bundle on a per-bottle, non-loopback address (its docker bridge IP)".into()
            }
            SmolvmError::VmMissing { .. } => "run `bottle list` to see the bottles that exist".into(),
            SmolvmError::CommitUnsupported => {
                "to keep an environment, run the agent on the docker backend (`--backend docker`) and `bottle commit` that bottle, or bake what it needs into the agent image's build".into()
            }
            SmolvmError::Provision { .. } => {
                "check that the agent image has /bin/sh, mkdir and cat; `bottle cleanup` removes what the launch left".into()
            }
            SmolvmError::AlreadyExists { .. } => {
                "stop the running bottle with `bottle stop NAME`, or remove leftovers with `bottle cleanup`".into()
            }
            SmolvmError::PoolNeedsReset { .. } => {
                "a pooled bottle needs reset's golden snapshot, taken at launch when the in-box agent is installed: install `bottle-toolbox` (`cargo xtask install`, or BOTTLE_TOOLBOX_BIN), or start bottles cold".into()
            }
            SmolvmError::Copy { .. } => {
                "`bottle cp` on smolmachines runs the agent image's /bin/sh and tar (busybox's will do) as the agent's user: check that the image has them and that the agent's user can read or write the path".into()
            }
            SmolvmError::IsolationUnsupported { .. } => {
                "remove `isolation` from the agent (a microVM needs no other tier), or run it with --backend docker, where isolation = \"gvisor\" runs the box under gVisor".into()
            }
            SmolvmError::Failpoint { .. } | SmolvmError::UnknownFailpoint(_) => {
                "unset BOTTLE_FAILPOINT".into()
            }
            SmolvmError::Record(err) => return err.fix(),
            SmolvmError::Pool(err) => return err.fix(),
            SmolvmError::External(err) => return err.fix(),
        };
        Some(fix)
    }
}

impl From<bottle_core::launch_steps::StepStop> for SmolvmError {
    fn from(stop: bottle_core::launch_steps::StepStop) -> SmolvmError {
        match stop {
            bottle_core::launch_steps::StepStop::Interrupted(err) => {
                SmolvmError::External(BackendError::from_coded(BackendErrorKind::Failed, err))
            }
            bottle_core::launch_steps::StepStop::Failpoint { step } => SmolvmError::Failpoint {
                step: step.to_string(),
            },
        }
    }
}

impl From<SmolvmError> for BackendError {
    fn from(err: SmolvmError) -> Self {
        if let SmolvmError::External(inner) = err {
            return inner;
        }
        BackendError::from_coded(err.kind(), err)
    }
}

/// How a process ended, for [`SmolvmError::Failed`].
fn exit_text(code: Option<i32>) -> String {
    code.map_or_else(|| "a signal".to_string(), |c| format!("code {c}"))
}

/// `: <stderr>` when smolvm said anything.
fn stderr_suffix(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

/// Shorthand for an I/O error on a path.
pub(crate) fn io_err(action: &str, path: impl Into<PathBuf>, source: io::Error) -> SmolvmError {
    SmolvmError::Io {
        action: action.to_string(),
        path: path.into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<SmolvmError> {
        let io = || io::Error::other("boom");
        let text = || "x".to_string();
        vec![
            SmolvmError::NotInstalled {
                program: text(),
                source: io(),
            },
            SmolvmError::Failed {
                argv: vec![text()],
                code: Some(1),
                stderr: text(),
            },
            SmolvmError::BadVersion { output: text() },
            SmolvmError::VersionUnenforced {
                version: SmolvmVersion::new(1, 1, 2),
            },
            SmolvmError::BadOutput {
                argv: vec![text()],
                detail: text(),
            },
            SmolvmError::StateDbPath { detail: text() },
            SmolvmError::StateDbMissing { path: "/x".into() },
            SmolvmError::StateDb {
                action: text(),
                path: "/x".into(),
                source: rusqlite::Error::QueryReturnedNoRows,
            },
            SmolvmError::StateRowMissing {
                path: "/x".into(),
                machine: text(),
            },
            SmolvmError::StateRecordInvalid {
                path: "/x".into(),
                machine: text(),
                detail: text(),
            },
            SmolvmError::AllowlistNotPersisted {
                path: "/x".into(),
                machine: text(),
                wanted: text(),
                found: text(),
            },
            SmolvmError::ImageArchive { detail: text() },
            SmolvmError::Io {
                action: text(),
                path: "/x".into(),
                source: io(),
            },
            SmolvmError::Registry {
                action: text(),
                source: io(),
            },
            SmolvmError::ExecMarkerMissing {
                machine: text(),
                code: None,
                stderr: text(),
            },
            SmolvmError::BundleAddress {
                address: text(),
                reason: text(),
            },
            SmolvmError::VmMissing { machine: text() },
            SmolvmError::Provision {
                step: text(),
                detail: text(),
            },
            SmolvmError::AlreadyExists { machine: text() },
            SmolvmError::Copy {
                machine: text(),
                what: text(),
                detail: text(),
            },
            SmolvmError::CommitUnsupported,
            SmolvmError::PoolNeedsReset { bottle: text() },
            SmolvmError::IsolationUnsupported {
                agent: text(),
                isolation: text(),
            },
            SmolvmError::Failpoint { step: text() },
            SmolvmError::UnknownFailpoint(bottle_core::launch_steps::UnknownFailpoint {
                value: text(),
                steps: text(),
            }),
            SmolvmError::Record(bottle_core::life::RecordError::Missing { dir: "/x".into() }),
            SmolvmError::External(BackendError::new(
                BackendErrorKind::Failed,
                "BOT-D003",
                "could not x",
                "check x",
            )),
        ]
    }

    #[test]
    fn every_variant_is_a_message_with_a_separate_fix_kept_across_the_boundary() {
        for err in every_variant() {
            let message = err.to_string();
            // Lowercase prose; a leading name like BOTTLE_FAILPOINT is fine.
            let mut chars = message.chars();
            let capitalised = chars.next().is_some_and(char::is_uppercase)
                && chars.next().is_some_and(char::is_lowercase);
            assert!(!capitalised, "{message}");
            assert!(!message.contains("fix:"), "{message}");
            let fix = err.fix().unwrap_or_default();
            assert!(!fix.is_empty(), "{message}");
            let (code, kind) = (err.code(), err.kind());
            let backend: BackendError = err.into();
            assert_eq!((backend.code, backend.kind), (code, kind));
            assert_eq!(backend.message, message);
            assert_eq!(backend.fix, fix);
        }
    }

    #[test]
    fn a_missing_state_row_leaves_isolation_unconfirmed() {
        let err = SmolvmError::StateRowMissing {
            path: "/x/smolvm.db".into(),
            machine: "bot-bottle-a".into(),
        };
        assert_eq!(err.code(), "BOT-K013");
        assert_eq!(err.kind(), BackendErrorKind::IsolationUnconfirmed);
    }

    #[test]
    fn the_version_refusal_is_a_preflight_failure() {
        let err = SmolvmError::VersionUnenforced {
            version: SmolvmVersion::new(1, 1, 2),
        };
        assert_eq!(err.kind(), BackendErrorKind::Preflight);
        assert!(err.to_string().contains("1.1.2"));
        assert!(err.fix().is_some_and(|fix| fix.contains("no override")));
    }
}
