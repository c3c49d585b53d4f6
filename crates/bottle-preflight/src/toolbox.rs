//! The in-box agent check: which static `bottle-toolbox` a launch puts
//! into each box for `bottle execute`, in the order bottle-core's
//! [`toolbox_binary_candidates`] gives, and that it is static (it runs in
//! any image, with or without a libc). A missing one only warns: a bottle
//! launches without it, as safe, and only `execute` is unavailable.

use bottle_core::bundle_binary::{
    TOOLBOX_BIN_ENV, elf_needs_interpreter, toolbox_binary_candidates,
};

use crate::bundle::first_file;
use crate::check::{Check, Status};
use crate::error::PreflightError;
use crate::host::Context;

/// Stable id of the in-box agent check.
pub const ID: &str = "toolbox.binary";
pub(crate) const TITLE: &str = "In-box agent binary";

const INSTALL: &str = "install bottle with its in-box agent: `cargo xtask install` from a clone \
     (or build it with `cargo xtask dist` and set BOTTLE_TOOLBOX_BIN to \
     target/x86_64-unknown-linux-gnu/release/bottle-toolbox); without it `bottle execute` is unavailable";

/// Finds the in-box agent the way a launch does and judges it; anything
/// short of a static ELF is a warning.
pub fn check_toolbox(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    let candidates = toolbox_binary_candidates(ctx.toolbox_bin.as_deref(), ctx.exe.as_deref());
    let Some((shown, path)) = first_file(ctx, &candidates)? else {
        let searched: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
        let message = if searched.is_empty() {
            format!("not found: {TOOLBOX_BIN_ENV} is not set and bottle's own path is unknown")
        } else {
            format!("not found (looked at: {})", searched.join(", "))
        };
        return Ok(Check::new(ID, TITLE, Status::Warn, message).with_remediation(INSTALL));
    };
    let bytes = std::fs::read(&path).map_err(|source| PreflightError::Read {
        path: path.clone(),
        source,
    })?;
    let shown = shown.display();
    Ok(match elf_needs_interpreter(&bytes) {
        Some(false) => Check::new(ID, TITLE, Status::Ok, format!("{shown} (static)")),
        Some(true) => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("{shown} is dynamically linked; a launch leaves it out"),
        )
        .with_remediation(INSTALL),
        None => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("{shown} is not an x86-64 ELF executable; a launch leaves it out"),
        )
        .with_remediation(INSTALL),
    })
}
