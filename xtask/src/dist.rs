//! Static binaries for the images bottle builds locally (`FROM scratch`).

use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::process::{cargo, workspace_root};

/// The only target the static binaries are built for.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The static binaries and where they end up.
pub struct StaticBinaries {
    /// The sidecar bundle.
    pub bundle: PathBuf,
}

/// Builds the static binaries in release mode. With an explicit `--target`,
/// RUSTFLAGS reach only the target crates, not build scripts or proc macros,
/// which cannot be linked statically.
pub fn run() -> anyhow::Result<StaticBinaries> {
    let status = cargo()
        .args([
            "build",
            "--release",
            "--target",
            STATIC_TARGET,
            "-p",
            "bottle-bundle",
        ])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status()
        .context("could not run cargo")?;
    if !status.success() {
        bail!("building the static binaries failed ({status})");
    }
    let dir = target_dir().join(STATIC_TARGET).join("release");
    let bundle = dir.join("bottle-bundle");
    if !bundle.is_file() {
        bail!("{} was not produced", bundle.display());
    }
    Ok(StaticBinaries { bundle })
}
