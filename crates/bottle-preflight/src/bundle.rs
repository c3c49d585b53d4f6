//! The bundle check: which static `bottle-bundle` binary `bottle` will
//! build its bundle image from, in the order bottle-core's
//! [`bundle_binary_candidates`] gives, and that it is a static executable
//! (the image is `FROM scratch`: there is no libc to load a dynamic one).

use std::path::PathBuf;

use bottle_core::bundle_binary::{BUNDLE_BIN_ENV, bundle_binary_candidates, elf_needs_interpreter};

use crate::check::{Check, Status};
use crate::error::PreflightError;
use crate::host::Context;

/// Stable id of the bundle check.
pub const ID: &str = "bundle.binary";
pub(crate) const TITLE: &str = "Bundle binary";

const INSTALL: &str = "install bottle with its bundle: `cargo xtask install` from a clone \
     (or build the static bundle with `cargo xtask dist` and set BOTTLE_BUNDLE_BIN to \
     target/x86_64-unknown-linux-gnu/release/bottle-bundle)";

/// Finds the bundle binary the way `bottle start` does and judges it. Every
/// backend needs it (a microVM's bundle is a container too), so a missing
/// or dynamic one fails.
pub fn check_bundle(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    let candidates = bundle_binary_candidates(ctx.bundle_bin.as_deref(), ctx.exe.as_deref());
    check_static_binary(
        ctx,
        &candidates,
        &StaticBinary {
            id: ID,
            title: TITLE,
            env: BUNDLE_BIN_ENV,
            install: INSTALL,
            short: Status::Fail,
            dynamic: "the bundle image has no libc to load it",
            not_elf: "",
        },
    )
}

/// How to judge one static binary bottle puts into boxes.
pub(crate) struct StaticBinary {
    pub id: &'static str,
    pub title: &'static str,
    /// The variable that names it.
    pub env: &'static str,
    /// The remediation when it is missing or not static.
    pub install: &'static str,
    /// The status when it is missing or not static.
    pub short: Status,
    /// Why a dynamic one is not good enough.
    pub dynamic: &'static str,
    /// Appended to "is not an x86-64 ELF executable" (e.g. what follows).
    pub not_elf: &'static str,
}

/// The first of `candidates` that exists, judged as `binary` says: `Ok`
/// when it is a static ELF, `binary.short` otherwise.
pub(crate) fn check_static_binary(
    ctx: &Context<'_>,
    candidates: &[PathBuf],
    binary: &StaticBinary,
) -> Result<Check, PreflightError> {
    let short = |message: String| {
        Check::new(binary.id, binary.title, binary.short, message).with_remediation(binary.install)
    };
    let Some((shown, path)) = first_file(ctx, candidates)? else {
        let searched: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
        return Ok(short(if searched.is_empty() {
            format!(
                "not found: {} is not set and bottle's own path is unknown",
                binary.env
            )
        } else {
            format!("not found (looked at: {})", searched.join(", "))
        }));
    };
    let bytes = std::fs::read(&path).map_err(|source| PreflightError::Read {
        path: path.clone(),
        source,
    })?;
    let shown = shown.display();
    Ok(match elf_needs_interpreter(&bytes) {
        Some(false) => Check::new(
            binary.id,
            binary.title,
            Status::Ok,
            format!("{shown} (static)"),
        ),
        Some(true) => short(format!("{shown} is dynamically linked; {}", binary.dynamic)),
        None => short(format!(
            "{shown} is not an x86-64 ELF executable{}",
            binary.not_elf
        )),
    })
}

/// The first candidate that is a file under the context's root: the path
/// as bottle names it, and where it is read.
pub(crate) fn first_file(
    ctx: &Context<'_>,
    candidates: &[PathBuf],
) -> Result<Option<(PathBuf, PathBuf)>, PreflightError> {
    for candidate in candidates {
        let path = ctx.root.join(candidate);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => return Ok(Some((candidate.clone(), path))),
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(PreflightError::Inspect { path, source }),
        }
    }
    Ok(None)
}
