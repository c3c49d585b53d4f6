//! `cargo xtask test`: every test of the workspace, with the static
//! binaries the Docker tests need built first.

use std::process::ExitCode;

use crate::dist;
use crate::process::{cargo, watch};

/// Builds the static binaries, then runs `cargo test --workspace` with their
/// paths in the environment. Extra arguments go to `cargo test`.
pub(crate) fn run(extra: &[String]) -> anyhow::Result<ExitCode> {
    let binaries = dist::run()?;
    let tests = cargo()
        .args(["test", "--workspace"])
        .args(extra)
        .env("BOTTLE_BUNDLE_BIN", &binaries.bundle);
    Ok(if watch(tests)?.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
