//! What the CLI does with an error: its stable code, its exit code, and the
//! text the operator sees.
//!
//! Exit codes (documented in README.md):
//! 0 ok · 1 other failure · 2 bad input (usage, manifest, a bottle or an
//! image that does not exist) · 3 preflight failed (host cannot run the
//! backend) · 4 backend failure · 5 refused because isolation could not be
//! confirmed · 6 not available yet · 7 the operator declined · 10 escape
//! detected (xtask) · 130 the launch was interrupted and unwound.

use std::process::ExitCode;

use bottle_core::backend::{BackendError, BackendErrorKind};
use bottle_core::{Coded, ManifestError};

/// Exit code: bad input.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code: the host cannot run the backend.
pub(crate) const EXIT_PREFLIGHT: u8 = 3;
/// Exit code: the backend failed.
pub(crate) const EXIT_BACKEND: u8 = 4;
/// Exit code: isolation could not be confirmed.
pub(crate) const EXIT_ISOLATION: u8 = 5;
/// Exit code: the command's backend has not landed yet.
pub(crate) const EXIT_UNAVAILABLE: u8 = 6;
/// Exit code: the operator answered no.
pub(crate) const EXIT_DECLINED: u8 = 7;
/// Exit code: the operator interrupted the launch (^C, `SIGTERM`), which
/// unwound; 128 + `SIGINT`, as a shell reports a process ^C ended.
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

/// An error on its way to the operator.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Stable code, if the error has one.
    pub code: Option<&'static str>,
    /// What failed, with its causes appended.
    pub message: String,
    /// What the operator should do next, printed once after the message.
    pub fix: Option<String>,
    /// The process exit code.
    pub exit: u8,
}

impl Failure {
    /// A failure with a code and exit status.
    pub(crate) fn new(code: &'static str, exit: u8, message: impl Into<String>) -> Failure {
        Failure {
            code: Some(code),
            message: message.into(),
            fix: None,
            exit,
        }
    }

    /// The same failure with what the operator should do next.
    pub(crate) fn with_fix(mut self, fix: impl Into<String>) -> Failure {
        self.fix = Some(fix.into());
        self
    }

    /// A library's typed error: its code, message and fix.
    pub(crate) fn coded<E: Coded + std::fmt::Display>(err: &E, exit: u8) -> Failure {
        Failure {
            code: Some(err.code()),
            message: err.to_string(),
            fix: err.fix(),
            exit,
        }
    }

    /// The process exit code.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.exit)
    }
}

impl From<ManifestError> for Failure {
    fn from(err: ManifestError) -> Failure {
        Failure::coded(&err, EXIT_USAGE)
    }
}

impl From<bottle_core::spec::SpecError> for Failure {
    fn from(err: bottle_core::spec::SpecError) -> Failure {
        Failure::coded(&err, EXIT_USAGE)
    }
}

impl From<bottle_core::state::StateDirError> for Failure {
    fn from(err: bottle_core::state::StateDirError) -> Failure {
        Failure::coded(&err, EXIT_USAGE)
    }
}

/// The exit code of a kind of backend failure. The CLI's own failures of
/// the same kind (no backend has the bottle) take theirs from here too.
pub(crate) fn exit_for(kind: BackendErrorKind) -> u8 {
    match kind {
        BackendErrorKind::Preflight => EXIT_PREFLIGHT,
        BackendErrorKind::IsolationUnconfirmed => EXIT_ISOLATION,
        // A bottle or image that is not there was named by the operator.
        BackendErrorKind::NotFound => EXIT_USAGE,
        BackendErrorKind::Failed | BackendErrorKind::PlanTaken => EXIT_BACKEND,
        BackendErrorKind::Unsupported => EXIT_UNAVAILABLE,
    }
}

impl From<BackendError> for Failure {
    fn from(err: BackendError) -> Failure {
        let mut failure = Failure::coded(&err, exit_for(err.kind));
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            // The first cause is usually the backend's typed error, whose
            // text is the message itself; backends also often spell a
            // cause into their message already.
            let text = cause.to_string();
            if !text.is_empty() && !failure.message.contains(&text) {
                failure.message.push_str(&format!(": {text}"));
            }
            source = cause.source();
        }
        failure
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Failure {
        Failure {
            code: None,
            message: format!("{err:#}"),
            fix: None,
            exit: 1,
        }
    }
}
