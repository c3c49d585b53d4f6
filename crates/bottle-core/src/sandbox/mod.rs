//! The sandbox interface: an orchestrator outside the box boots a bottle,
//! runs tool calls in it, resets it to its golden snapshot with the reset
//! verified from three sources, and shuts it down.
//!
//! - [`call`]: [`ToolCall`], [`ToolResult`] and the evidence hash;
//! - [`wire`]: the length-prefixed JSON the in-box agent speaks;
//! - [`toolbox`]: the host's end of that channel, the same for every
//!   backend;
//! - [`reset`]: the golden snapshot, the revert and its verification;
//! - [`audit`]: the lines both leave in the bottle's audit log;
//! - [`error`]: the vocabulary (`BOT-X…`).
//!
//! Boot is a launch ([`crate::BottleLauncher::launch`]) and shutdown a stop
//! ([`crate::BottleBackend::stop`]); `execute` and `reset` are methods of
//! [`crate::Bottle`].

pub mod audit;
pub mod call;
pub mod error;
pub mod reset;
pub mod toolbox;
pub mod wire;

pub use call::{BUILTIN_TOOLS, Command, ToolCall, ToolResult, evidence_hash};
pub use error::SandboxError;
pub use reset::{
    Baseline, ResetFiles, ResetReport, ResetSubstrate, RevertMethod, Source, SourceCheck,
};
pub use toolbox::{
    FILTERED, OpenFds, OpenedChannel, TOOLBOX_MODE, TOOLBOX_PATH, Toolbox, ToolboxStream,
    filtered_argv,
};

/// The longest agent-chosen text a report or log line carries.
const SHOWN_MAX_CHARS: usize = 300;

/// Agent-chosen `text` made safe for the operator's terminal and one line,
/// cut to [`SHOWN_MAX_CHARS`].
pub(crate) fn shown(text: &str) -> String {
    let escaped = crate::display::escape_for_terminal(text);
    let mut chars = escaped.chars();
    let mut cut: String = chars.by_ref().take(SHOWN_MAX_CHARS).collect();
    if chars.next().is_some() {
        cut.push('…');
    }
    cut
}
