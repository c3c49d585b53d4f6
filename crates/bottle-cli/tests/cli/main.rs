//! Integration tests of the real `bottle` binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

mod audit_logs;
mod catalogue;
mod commands;
mod example;
mod execute;
mod exit_codes;
mod interrupted;
mod real_agent;
mod requests;
mod reset;
mod serve;
mod session;
mod smolmachines;
mod terminal;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// Launches choose subnets, and the Docker-backed cases assert on their
/// own bottles' resources: every test module that starts bottles takes
/// this first, so one launch runs at a time in this process.
static LAUNCHES: Mutex<()> = Mutex::new(());

/// Holds [`LAUNCHES`] (a failed test's poison is not this test's problem).
fn one_launch_at_a_time() -> MutexGuard<'static, ()> {
    LAUNCHES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The repository root.
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root exists")
}

/// The `bottle` binary with a private state dir and no backend chosen.
fn bottle(state: &std::path::Path) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("bottle").expect("bottle binary is built");
    cmd.env("XDG_STATE_HOME", state)
        .env_remove("BOT_BOTTLE_BACKEND")
        .env_remove("BOTTLE_MANIFEST");
    cmd
}
