//! `cargo xtask test`: every test of the workspace, with the static
//! binaries and the Debian agent image the Docker tests need built first,
//! and the example's build context completed.

use std::path::Path;
use std::process::ExitCode;

use crate::process::{cargo, watch, workspace_root};
use crate::{agent_image, demo, dist};

/// Builds the static binaries and the agent image, then runs `cargo test
/// --workspace` with their paths in the environment. Extra arguments go to
/// `cargo test`.
pub(crate) fn run(extra: &[String]) -> anyhow::Result<ExitCode> {
    let binaries = dist::run()?;
    let debian_image = agent_image::ensure()?;
    // The CLI's tests start examples/bottle.toml as written; without a
    // busybox they skip (or fail under BOTTLE_REQUIRE_DOCKER) and say why.
    if let Err(err) = demo::complete_example_context(
        &workspace_root().join(demo::EXAMPLE_CONTEXT),
        Path::new(demo::HOST_BUSYBOX),
    ) {
        eprintln!("warning: examples/bottle.toml's build context is incomplete: {err:#}");
    }
    let tests = cargo()
        .args(["test", "--workspace"])
        .args(extra)
        .env("BOTTLE_BUNDLE_BIN", &binaries.bundle)
        .env("BOTTLE_TOOLBOX_BIN", &binaries.toolbox)
        .env(agent_image::TAG_ENV, debian_image);
    Ok(if watch(tests)?.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
