//! Integration tests of the real `bottle` binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

mod audit_logs;
mod catalogue;
mod checkout;
mod commands;
mod commit;
mod cp;
mod e2e;
mod example;
mod execute;
mod exit_codes;
mod interrupted;
mod pool;
mod ports;
mod real_agent;
mod real_clients;
mod requests;
mod reset;
mod serve;
mod session;
mod smolmachines;
mod stop;
mod terminal;
mod timings;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bottle_docker::client::Engine;

/// Launches choose subnets, and the Docker-backed cases assert on their
/// own bottles' resources: every test module that starts bottles takes
/// this first, so one launch runs at a time in this process.
static LAUNCHES: Mutex<()> = Mutex::new(());

/// Holds [`LAUNCHES`] (a failed test's poison is not this test's problem).
fn one_launch_at_a_time() -> MutexGuard<'static, ()> {
    LAUNCHES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Docker Engine with the demo agent image built as `image`, once the
/// environment names every static binary in `binaries`; or a printed skip
/// (a failure under `BOTTLE_REQUIRE_DOCKER=1`) saying what is missing.
fn docker_with_demo_image(test: &str, image: &str, binaries: &[&str]) -> Option<Engine> {
    let skip = |why: String| {
        bottle_test_support::skip_docker_test(test, why);
        None
    };
    for var in binaries {
        if std::env::var_os(var).is_none() {
            return skip(format!("{var} is not set"));
        }
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        return skip("/bin/busybox is missing (apt-get install busybox-static)".into());
    }
    let engine = match Engine::connect(None) {
        Ok(engine) => engine,
        Err(err) => return skip(format!("Docker is not reachable: {err}")),
    };
    if let Err(err) = engine.block_on(engine.docker.ping()) {
        return skip(format!("Docker is not reachable: {err}"));
    }
    let demo = repo_root().join("examples/demo-agent");
    bottle_docker::images::build_demo_agent(&engine, &demo, busybox, image, None)
        .unwrap_or_else(|err| panic!("the demo agent image: {err}"));
    Some(engine)
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
