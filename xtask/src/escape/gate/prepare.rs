//! What the run builds and makes before it starts: the bottle CLI, the
//! smolmachines agent image, the temp dir, the smolvm wrapper.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::SMOL_AGENT_IMAGE;
use crate::dist;
use crate::escape::smol::{self, SysRunner};
use crate::escape::sys::{Run, Sys};
use crate::escape::teardown;
use crate::process::{cargo, describe_exit, watch};

pub(super) fn smolvm_of(target: &smol::Target, sys: &Arc<dyn Sys>) -> bottle_smolvm::Smolvm {
    bottle_smolvm::Smolvm::with_program(
        target.program.clone().into_os_string(),
        Arc::new(SysRunner(sys.clone())),
    )
}

/// Builds the demo agent image from `context` with the Engine, as
/// [`SMOL_AGENT_IMAGE`].
pub(super) fn build_agent_image(sys: &Arc<dyn Sys>, context: &Path) -> anyhow::Result<()> {
    let run = Run::new(
        "docker",
        &[
            "build".to_string(),
            "--quiet".to_string(),
            "--tag".to_string(),
            SMOL_AGENT_IMAGE.to_string(),
            context.display().to_string(),
        ],
    )
    .timeout(Duration::from_secs(600));
    crate::escape::sys::checked(sys.output(&run)?, &run)?;
    Ok(())
}

pub(super) fn build_cli() -> anyhow::Result<PathBuf> {
    let out = watch(cargo().args(["build", "--quiet", "-p", "bottle-cli"]))?;
    if !out.success() {
        bail!("building the bottle CLI failed ({})", describe_exit(&out));
    }
    Ok(dist::target_dir().join("debug").join("bottle"))
}

pub(super) fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("bottle-escape-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let cleanup = dir.clone();
    teardown::register("remove the run's temp dir", move || {
        let _ = std::fs::remove_dir_all(&cleanup);
    });
    Ok(dir)
}
