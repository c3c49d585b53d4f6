//! Starting this `bottle` again, detached: the helpers a command leaves
//! running after it returns (a pool's refiller, a stop's finisher, a
//! reset's preparer, a session's holder, a forwarder).

use std::path::Path;

use bottle_core::exec::{CommandRunner, CommandSpec};

/// Spawns this `bottle` binary, invoked as `spec_of` says given its path,
/// detached through `runner` with its output to `log`; its pid, or why it
/// could not be started.
pub(crate) fn spawn_self(
    runner: &dyn CommandRunner,
    spec_of: impl FnOnce(&Path) -> CommandSpec,
    log: &Path,
) -> Result<u32, String> {
    let exe =
        std::env::current_exe().map_err(|err| format!("cannot find this bottle binary: {err}"))?;
    runner
        .spawn_detached(&spec_of(&exe), log)
        .map_err(|err| err.to_string())
}
