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

/// How a command wants its backend set up.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mode {
    /// `bottle start --detach`: the bottle outlives this process.
    pub detach: bool,
}

/// Constructs a backend.
pub fn open(
    kind: BackendKind,
    global: &Global,
    mode: Mode,
) -> Result<Box<dyn BottleBackend>, BackendError> {
    let state_root =
        bottle_core::state::state_root(|key| std::env::var(key).ok()).map_err(|err| {
            BackendError::new(
                BackendErrorKind::Preflight,
                "BOT-S002",
                err.to_string(),
                "set HOME or XDG_STATE_HOME",
            )
        })?;
    match kind {
        BackendKind::Docker => {
            let mut options = bottle_docker::DockerOptions::new(state_root);
            options.detach = mode.detach;
            options.progress = progress(global);
            Ok(Box::new(bottle_docker::DockerBackend::new(options)?))
        }
        BackendKind::Smolmachines => Err(not_landed(kind, "issue 5")),
    }
}

/// Build output and provisioning notes go to stderr when it is a terminal
/// and the operator did not ask for quiet.
fn progress(global: &Global) -> Option<bottle_docker::Progress> {
    use std::io::IsTerminal as _;
    if global.quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    Some(std::sync::Arc::new(|line: &str| eprintln!("{line}")))
}

fn not_landed(kind: BackendKind, issue: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unsupported,
        "BOT-C002",
        format!("the {kind} backend is not available in this build yet (it lands with {issue})"),
        "run `bottle plan` and `bottle doctor` meanwhile",
    )
}
