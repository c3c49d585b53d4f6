//! Choosing and constructing a backend.

use bottle_core::backend::{BackendError, BackendErrorKind};
use bottle_core::{BackendKind, BottleBackend};

use crate::args::Global;
use crate::failure::{EXIT_USAGE, Failure};

/// The backend named by `--backend` / `BOT_BOTTLE_BACKEND`, default docker.
pub fn selected(global: &Global) -> Result<BackendKind, Failure> {
    match global.backend.as_deref() {
        None | Some("") => Ok(BackendKind::Docker),
        Some(name) => BackendKind::parse(name).ok_or_else(|| {
            Failure::new(
                "BOT-C001",
                EXIT_USAGE,
                format!(
                    "unknown backend {name:?} (from --backend or BOT_BOTTLE_BACKEND)\n  fix: use one of: {}",
                    BackendKind::ALL.map(BackendKind::as_str).join(", ")
                ),
            )
        }),
    }
}

/// Whether the operator chose a backend explicitly.
pub fn explicit(global: &Global) -> bool {
    global.backend.as_deref().is_some_and(|b| !b.is_empty())
}

/// Constructs a backend.
pub fn open(kind: BackendKind, _global: &Global) -> Result<Box<dyn BottleBackend>, BackendError> {
    match kind {
        BackendKind::Docker => Err(not_landed(kind, "issue 4")),
        BackendKind::Smolmachines => Err(not_landed(kind, "issue 5")),
    }
}

fn not_landed(kind: BackendKind, issue: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unsupported,
        "BOT-C002",
        format!("the {kind} backend is not available in this build yet (it lands with {issue})"),
        "run `bottle plan` and `bottle doctor` meanwhile",
    )
}
