//! The in-box agent check: which static `bottle-toolbox` a launch puts
//! into each box for `bottle execute`, in the order bottle-core's
//! [`toolbox_binary_candidates`] gives, and that it is static (it runs in
//! any image, with or without a libc). A missing one only warns: a bottle
//! launches without it, as safe, and only `execute` is unavailable.

use bottle_core::bundle_binary::{TOOLBOX_BIN_ENV, toolbox_binary_candidates};

use crate::bundle::{StaticBinary, check_static_binary};
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
    check_static_binary(
        ctx,
        &candidates,
        &StaticBinary {
            id: ID,
            title: TITLE,
            env: TOOLBOX_BIN_ENV,
            install: INSTALL,
            short: Status::Warn,
            dynamic: "a launch leaves it out",
            not_elf: "; a launch leaves it out",
        },
    )
}
