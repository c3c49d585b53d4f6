//! The sandbox interface's error vocabulary: not available, boot error,
//! tool timeout, tool error, reset error, reset divergence.

use std::time::Duration;

use thiserror::Error;

use crate::error::Coded;
use crate::sandbox::reset::ResetReport;

/// Why a sandbox operation failed. Each variant has a stable code
/// (`BOT-X…`) and a fix.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// The bottle cannot offer the operation (no in-box agent binary, no
    /// golden snapshot, a backend or host that cannot do it).
    #[error("{bottle}: {what} is not available: {why}")]
    NotAvailable {
        /// The bottle.
        bottle: String,
        /// The operation (`execute`, `reset`).
        what: String,
        /// Why, a lowercase fragment.
        why: String,
        /// What to do about it.
        fix: String,
    },
    /// The bottle, or the in-box agent in it, did not come up.
    #[error("{bottle}: the in-box agent did not start: {why}")]
    Boot {
        /// The bottle.
        bottle: String,
        /// Why, a lowercase fragment.
        why: String,
    },
    /// A tool call ran past its deadline and was killed.
    #[error("{bottle}: `{call}` ran past its deadline of {} ms and was killed", deadline.as_millis())]
    ToolTimeout {
        /// The bottle.
        bottle: String,
        /// The call's summary, sanitized.
        call: String,
        /// The deadline it had.
        deadline: Duration,
    },
    /// A tool call could not be run (unknown tool, program not found, bad
    /// parameters, the channel broke).
    #[error("{bottle}: `{call}` could not run: {why}")]
    Tool {
        /// The bottle.
        bottle: String,
        /// The call's summary, sanitized.
        call: String,
        /// Why, a lowercase fragment.
        why: String,
    },
    /// The in-box agent's channel carried what the host did not ask for:
    /// a frame for another call, out of sequence, before a call was sent
    /// or after its answer. The channel was closed and the call has no
    /// result; the next call opens a new channel.
    #[error("{bottle}: `{call}` has no result: the in-box agent's channel {why}, so it was closed")]
    Channel {
        /// The bottle.
        bottle: String,
        /// The call's summary, sanitized.
        call: String,
        /// What the channel carried, a lowercase fragment.
        why: String,
    },
    /// Reverting to the golden snapshot failed; the bottle was halted.
    #[error("{bottle}: reset failed and the bottle was halted: {why}")]
    Reset {
        /// The bottle.
        bottle: String,
        /// Why, a lowercase fragment.
        why: String,
    },
    /// The revert ran, but a verification source disagrees with its
    /// baseline; the bottle was halted.
    #[error("{}: reset verification diverged ({}); the bottle was halted", report.bottle, report.divergence_summary())]
    ResetDivergence {
        /// Every source's expected and observed value.
        report: Box<ResetReport>,
    },
}

impl SandboxError {
    /// The exit code the CLI uses: 5 for a halted reset, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            SandboxError::Reset { .. } | SandboxError::ResetDivergence { .. } => 5,
            _ => 1,
        }
    }
}

impl Coded for SandboxError {
    fn code(&self) -> &'static str {
        match self {
            SandboxError::NotAvailable { .. } => "BOT-X001",
            SandboxError::Boot { .. } => "BOT-X002",
            SandboxError::ToolTimeout { .. } => "BOT-X003",
            SandboxError::Tool { .. } => "BOT-X004",
            SandboxError::Reset { .. } => "BOT-X005",
            SandboxError::ResetDivergence { .. } => "BOT-X006",
            SandboxError::Channel { .. } => "BOT-X007",
        }
    }

    fn fix(&self) -> Option<String> {
        Some(match self {
            SandboxError::NotAvailable { fix, .. } => fix.clone(),
            SandboxError::Boot { bottle, .. } => format!(
                "check that the bottle runs (`bottle list`) and that `bottle-toolbox` is installed (`bottle doctor`); `bottle stop {bottle}` and start it again"
            ),
            SandboxError::ToolTimeout { .. } => {
                "give the call a longer deadline, or make the tool finish sooner".into()
            }
            SandboxError::Tool { .. } => {
                "check the program exists in the agent's image and the parameters are right".into()
            }
            SandboxError::Channel { bottle, .. } => format!(
                "run the call again (it gets a new channel); something in the box wrote to the channel, so read `bottle logs {bottle}` and do not trust what the box printed outside a result"
            ),
            SandboxError::Reset { bottle, .. } => bottle_fix(bottle),
            SandboxError::ResetDivergence { report } => bottle_fix(&report.bottle),
        })
    }
}

fn bottle_fix(bottle: &str) -> String {
    format!(
        "the bottle is halted and kept for inspection: read `bottle logs {bottle}`, then `bottle stop {bottle}` and start a new one; do not trust what ran in it"
    )
}
