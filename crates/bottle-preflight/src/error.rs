//! The preflight error type and its stable codes (`BOT-P…`).
//!
//! A host that lacks something (no `/dev/kvm`, no daemon) is a failed
//! [`Check`], not an error. Errors are for I/O nobody expected (a
//! `/proc/modules` that exists but cannot be read) and for a backend refusing
//! to start because a check failed ([`PreflightError::Failed`]).

use std::path::PathBuf;

use bottle_core::Coded;
use bottle_core::backend::{BackendError, BackendErrorKind};

use crate::check::{Check, Status};

/// What can go wrong while checking the host.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// A host file that exists could not be read.
    #[error("could not read {}: {source}", path.display())]
    Read {
        /// The file, under the host root.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A host path could not be inspected (stat, access, existence).
    #[error("could not inspect {}: {source}", path.display())]
    Inspect {
        /// The path, under the host root.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel release string is not `major.minor...`.
    #[error("could not parse kernel release {content:?} from {}", path.display())]
    KernelRelease {
        /// The file read.
        path: PathBuf,
        /// What it contained.
        content: String,
    },
    /// At least one check failed, so the selected backend cannot run.
    #[error("preflight failed: {}", failed_summary(.checks))]
    Failed {
        /// The failed checks.
        checks: Vec<Check>,
    },
}

impl Coded for PreflightError {
    fn code(&self) -> &'static str {
        match self {
            PreflightError::Read { .. } => "BOT-P001",
            PreflightError::Inspect { .. } => "BOT-P002",
            PreflightError::KernelRelease { .. } => "BOT-P003",
            PreflightError::Failed { .. } => "BOT-P004",
        }
    }

    fn fix(&self) -> Option<String> {
        Some(match self {
            PreflightError::Read { .. } => "check that this user can read it".into(),
            PreflightError::Inspect { .. } => "check that this user can reach the path".into(),
            PreflightError::KernelRelease { .. } => {
                "report this kernel release string to the bottle maintainers".into()
            }
            PreflightError::Failed { checks } => failed_fix(checks),
        })
    }
}

fn failed_summary(checks: &[Check]) -> String {
    checks
        .iter()
        .map(|check| format!("{}: {}", check.id, check.message))
        .collect::<Vec<_>>()
        .join("; ")
}

fn failed_fix(checks: &[Check]) -> String {
    let fixes: Vec<&str> = checks
        .iter()
        .filter_map(|check| check.remediation.as_deref())
        .collect();
    if fixes.is_empty() {
        "run `bottle doctor` for details".to_owned()
    } else {
        fixes.join("; ")
    }
}

/// `Ok(())` unless a check failed; a backend's `preflight()` ends with this.
pub fn require(checks: &[Check]) -> Result<(), PreflightError> {
    let failed: Vec<Check> = checks
        .iter()
        .filter(|check| check.status == Status::Fail)
        .cloned()
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::Failed { checks: failed })
    }
}

impl From<PreflightError> for BackendError {
    fn from(err: PreflightError) -> Self {
        BackendError::from_coded(BackendErrorKind::Preflight, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn require_passes_warnings_and_collects_failures() {
        let ok = Check::new("a", "A", Status::Ok, "fine".into());
        let warn = Check::new("b", "B", Status::Warn, "hmm".into());
        assert!(require(&[ok.clone(), warn.clone()]).is_ok());

        let fail = Check::new("kvm.device", "KVM", Status::Fail, "no /dev/kvm".into())
            .with_remediation("sudo modprobe kvm_intel");
        let err = require(&[ok, warn, fail]).unwrap_err();
        assert_eq!(err.code(), "BOT-P004");
        assert_eq!(err.to_string(), "preflight failed: kvm.device: no /dev/kvm");
        assert_eq!(err.fix().as_deref(), Some("sudo modprobe kvm_intel"));
        let backend: BackendError = err.into();
        assert_eq!(backend.kind, BackendErrorKind::Preflight);
        assert_eq!(backend.message, "preflight failed: kvm.device: no /dev/kvm");
        assert_eq!(backend.fix, "sudo modprobe kvm_intel");
    }

    #[test]
    fn io_errors_keep_message_and_fix_apart_at_the_backend_boundary() {
        let err = PreflightError::Read {
            path: "/proc/modules".into(),
            source: std::io::Error::other("boom"),
        };
        let backend: BackendError = err.into();
        assert_eq!(backend.code, "BOT-P001");
        assert_eq!(backend.message, "could not read /proc/modules: boom");
        assert_eq!(backend.fix, "check that this user can read it");
    }
}
