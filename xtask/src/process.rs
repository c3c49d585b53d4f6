//! How xtask runs programs: through the workspace's one runner
//! ([`bottle_core::exec::SystemRunner`]), from the workspace root.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};

/// The workspace root (xtask lives one level below it).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// `program`, to be run from the workspace root.
pub(crate) fn command(program: impl Into<OsString>) -> CommandSpec {
    CommandSpec::new(program).cwd(workspace_root())
}

/// `cargo`, as the one running xtask.
pub(crate) fn cargo() -> CommandSpec {
    command(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs `spec` with its output captured. `Err` only when it could not be
/// started (or ran past its time bound); a non-zero exit is in the output.
pub(crate) fn capture(spec: &CommandSpec) -> anyhow::Result<CommandOutput> {
    SystemRunner
        .run(spec)
        .with_context(|| format!("could not run `{}`", spec.argv().join(" ")))
}

/// Runs `spec` in the operator's terminal, so its progress shows.
pub(crate) fn watch(spec: CommandSpec) -> anyhow::Result<CommandOutput> {
    capture(&spec.inherit_streams())
}

/// How an exit reads in a message: `exit 3`, or `killed by a signal`.
pub(crate) fn describe_exit(output: &CommandOutput) -> String {
    output
        .code
        .map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}"))
}
