//! Static binaries for the images bottle builds locally (`FROM scratch`).

use std::path::PathBuf;

use anyhow::bail;

use crate::process::{cargo, describe_exit, watch, workspace_root};

/// The only target the static binaries are built for.
pub(crate) const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `target/`.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The static binaries and where they end up.
pub(crate) struct StaticBinaries {
    /// The sidecar bundle.
    pub bundle: PathBuf,
    /// The sandbox-escape probe (`cargo xtask sandbox-escape` copies it
    /// into bottles and runs it on the host as the positive control).
    pub probe: PathBuf,
    /// The in-box agent of the sandbox interface.
    pub toolbox: PathBuf,
}

/// Builds the static binaries in release mode. With an explicit `--target`,
/// RUSTFLAGS reach only the target crates, not build scripts or proc macros,
/// which cannot be linked statically.
pub(crate) fn run() -> anyhow::Result<StaticBinaries> {
    let dir = build(&["bottle-bundle", "bottle-probe", "bottle-toolbox"])?;
    let bundle = dir.join("bottle-bundle");
    let probe = dir.join("bottle-probe");
    let toolbox = dir.join("bottle-toolbox");
    for binary in [&bundle, &probe, &toolbox] {
        if !binary.is_file() {
            bail!("{} was not produced", binary.display());
        }
    }
    Ok(StaticBinaries {
        bundle,
        probe,
        toolbox,
    })
}

/// Builds `packages` statically; returns the directory the binaries are in.
pub(crate) fn build(packages: &[&str]) -> anyhow::Result<PathBuf> {
    let mut args = vec!["build", "--release", "--target", STATIC_TARGET];
    for package in packages {
        args.extend(["-p", package]);
    }
    let out = watch(
        cargo()
            .args(&args)
            .env("RUSTFLAGS", "-C target-feature=+crt-static"),
    )?;
    if !out.success() {
        bail!(
            "building the static binaries failed ({})",
            describe_exit(&out)
        );
    }
    Ok(target_dir().join(STATIC_TARGET).join("release"))
}
