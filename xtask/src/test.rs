//! `cargo xtask test`: every test of the workspace, with the static
//! binaries the Docker tests need built first.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::dist;
use crate::process::cargo;

/// Builds the static binaries, then runs `cargo test --workspace` with their
/// paths in the environment. Extra arguments go to `cargo test`.
pub fn run(extra: &[String]) -> anyhow::Result<ExitCode> {
    let binaries = dist::run()?;
    let status = cargo()
        .args(["test", "--workspace"])
        .args(extra)
        .env("BOTTLE_BUNDLE_BIN", &binaries.bundle)
        .status()
        .context("could not run cargo test")?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    })
}
