//! The one place xtask spawns processes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// A command run from the workspace root.
pub fn command(program: &str) -> Command {
    #[expect(
        clippy::disallowed_methods,
        reason = "xtask is a build tool; this is its one spawning point"
    )]
    let mut command = Command::new(program);
    command.current_dir(workspace_root());
    command
}

/// `cargo`, as the one running xtask.
pub fn cargo() -> Command {
    command(&std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}
