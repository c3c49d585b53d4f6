//! The platform check: bottle runs on Linux and macOS only.

use bottle_core::BackendKind;

use crate::check::{Check, Status};
use crate::host::{Context, Platform};

/// Stable id of the platform check.
pub const ID: &str = "platform";
pub(crate) const TITLE: &str = "platform";

/// Reports the OS and architecture, failing on platforms bottle does not run.
pub fn check_platform(ctx: &Context<'_>) -> Check {
    let (os, arch) = (ctx.os.as_str(), ctx.arch.as_str());
    let found = format!("{os} {arch}");
    match ctx.platform() {
        Platform::Other => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("bottle runs on linux and macos, not {os} ({arch})"),
        )
        .with_remediation("run bottle on a Linux host (x86_64 or aarch64) or on a Mac"),
        Platform::Linux
            if ctx.backend == BackendKind::Smolmachines
                && !matches!(arch, "x86_64" | "aarch64") =>
        {
            Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("{found}: smolvm ships linux builds for x86_64 and aarch64 only"),
            )
            .with_remediation("use the docker backend on this machine (--backend docker)")
        }
        Platform::MacOs if ctx.backend == BackendKind::Smolmachines && arch != "aarch64" => {
            Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("{found}: libkrun on macos needs apple silicon (aarch64)"),
            )
            .with_remediation("use the docker backend on this machine (--backend docker)")
        }
        Platform::Linux | Platform::MacOs => Check::new(ID, TITLE, Status::Ok, found),
    }
}
