//! Integration tests of the docker backend against the real daemon. Each
//! test skips with a printed line when Docker or the static bundle binary
//! (`BOTTLE_BUNDLE_BIN`) is missing, and fails instead under
//! `BOTTLE_REQUIRE_DOCKER=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

mod ca;
mod copy;
mod devices;
mod disk;
mod execute;
mod failure;
mod git;
mod gvisor;
mod isolation;
mod lifecycle;
mod pools;
mod ports;
mod reset;
mod stop;
mod supervise;
mod support;
