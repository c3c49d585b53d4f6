//! A start the operator interrupts (^C, `SIGTERM`) while it launches
//! unwinds: no container, network or state dir (with its CA key) is left,
//! and `start` exits 130. The launch is paused after it wrote the CA key
//! and created the bundle container (`BOTTLE_FAILPOINT=bundle-files:sleep`)
//! and interrupted there.
//!
//! Needs Docker and `BOTTLE_BUNDLE_BIN`; skips without them unless
//! `BOTTLE_REQUIRE_DOCKER=1`.

use std::path::PathBuf;
use std::time::Duration;

use bottle_docker::client::Engine;
use bottle_test_support::{skip_docker_test, temp_state_root, wait_for, wait_until};
use nix::sys::signal::Signal;

use crate::bottle;

/// Docker's containers and networks whose names start with `prefix`.
pub(crate) fn docker_objects(engine: &Engine, prefix: &str) -> Vec<String> {
    let containers = engine
        .block_on(
            engine.docker.list_containers(Some(
                bollard::query_parameters::ListContainersOptionsBuilder::default()
                    .all(true)
                    .build(),
            )),
        )
        .unwrap()
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .map(|n| n.trim_start_matches('/').to_string());
    let networks = engine
        .block_on(
            engine
                .docker
                .list_networks(None::<bollard::query_parameters::ListNetworksOptions>),
        )
        .unwrap()
        .into_iter()
        .filter_map(|n| n.name);
    containers
        .chain(networks)
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn interrupted_start_unwinds(test: &str, signal: Signal) {
    let _serial = crate::one_launch_at_a_time();
    let Some(bundle) = std::env::var_os("BOTTLE_BUNDLE_BIN").map(PathBuf::from) else {
        skip_docker_test(test, "BOTTLE_BUNDLE_BIN is not set");
        return;
    };
    let engine = match Engine::connect(None) {
        Ok(engine) if engine.block_on(engine.docker.ping()).is_ok() => engine,
        _ => {
            skip_docker_test(test, "Docker is not reachable");
            return;
        }
    };
    // The agent's image is only inspected before the pause: the bundle
    // image serves.
    let image = bottle_docker::images::ensure_bundle_image(&engine, &bundle, &[], None)
        .unwrap_or_else(|err| panic!("{test}: the bundle image: {err}"));
    let state = temp_state_root();
    let manifest = state.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        format!("[agents.coder]\nimage = \"{image}\"\ncommand = [\"/x\"]\n"),
    )
    .unwrap();
    let name = format!("interrupted-{}-{}", signal as i32, std::process::id());
    let machine = bottle_core::slug::bottle_name(&name);
    let state_dir = state.path().join("bottle").join(&name);

    #[expect(
        clippy::disallowed_methods,
        reason = "the test signals the launching process, so it holds its child"
    )]
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("bottle"))
        .env("XDG_STATE_HOME", state.path())
        .env("BOTTLE_BUNDLE_BIN", &bundle)
        .env("BOTTLE_FAILPOINT", "bundle-files:sleep")
        .env_remove("BOT_BOTTLE_BACKEND")
        .arg("--manifest")
        .arg(&manifest)
        .args(["--backend", "docker", "--yes", "start", "coder", "--detach"])
        .args(["--name", &name])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let bundle_container = format!("{machine}-bundle");
    wait_until(
        "the launch to write the CA key and create the bundle",
        Duration::from_secs(120),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the launch ended before the pause"
            );
            state_dir.join("ca/ca-key.pem").is_file()
                && docker_objects(&engine, &bundle_container).contains(&bundle_container)
        },
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, signal).unwrap();
    let status = wait_for(
        "the interrupted start to exit",
        Duration::from_secs(60),
        || child.try_wait().unwrap(),
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let left = docker_objects(&engine, &machine);
    let state_left = state_dir.exists();
    if !left.is_empty() || state_left {
        // Whatever the outcome, leave the shared daemon clean.
        let _ = bottle(state.path())
            .args(["--backend", "docker", "stop", "--wait", &name])
            .output();
    }
    assert_eq!(status.code(), Some(130), "{status:?}: {stderr}");
    assert!(stderr.contains("error[BOT-S007]"), "{stderr}");
    assert!(left.is_empty(), "left in Docker: {left:?}");
    assert!(!state_left, "the state dir (and its CA key) was left");
}

#[test]
fn a_start_interrupted_by_ctrl_c_unwinds_and_leaves_nothing() {
    interrupted_start_unwinds(
        "a_start_interrupted_by_ctrl_c_unwinds_and_leaves_nothing",
        Signal::SIGINT,
    );
}

#[test]
fn a_start_terminated_by_sigterm_unwinds_and_leaves_nothing() {
    interrupted_start_unwinds(
        "a_start_terminated_by_sigterm_unwinds_and_leaves_nothing",
        Signal::SIGTERM,
    );
}
