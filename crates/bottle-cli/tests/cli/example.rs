//! `examples/bottle.toml` as README's reader meets it: `bottle` run in
//! `examples/` with no `--manifest`, checked, planned and (with Docker)
//! started detached and stopped, as written. Its agent image builds from
//! `examples/demo-agent/`, whose static busybox README's set-up (`cargo
//! xtask install`, and `cargo xtask test` for these tests) copies in.

use std::path::PathBuf;

use bottle_docker::client::Engine;
use predicates::prelude::*;

use crate::{bottle, repo_root};

fn examples() -> PathBuf {
    repo_root().join("examples")
}

#[test]
fn the_example_checks_and_plans_as_written() {
    let state = bottle_test_support::temp_state_root();
    bottle(state.path())
        .current_dir(examples())
        .arg("check")
        .assert()
        .success();
    bottle(state.path())
        .current_dir(examples())
        .args(["plan", "demo"])
        .assert()
        .success()
        .stdout(predicate::str::contains("demo.bottle.test"));
}

/// Stops the bottle however the test ends, so a failed assertion leaves
/// nothing running.
struct Started<'a> {
    state: &'a std::path::Path,
    name: String,
}

impl Started<'_> {
    fn stop(&self) -> std::process::Output {
        bottle(self.state)
            .current_dir(examples())
            .args(["stop", &self.name])
            .output()
            .unwrap()
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.stop();
        }
    }
}

fn agent_container_exists(engine: &Engine, name: &str) -> bool {
    let container = format!("{}-agent", bottle_core::slug::bottle_name(name));
    match engine.block_on(engine.docker.inspect_container(&container, None)) {
        Ok(_) => true,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => false,
        Err(err) => panic!("inspect container {container}: {err}"),
    }
}

#[test]
fn the_example_starts_detached_and_stops_as_written() {
    let test = "the_example_starts_detached_and_stops_as_written";
    let _serial = crate::one_launch_at_a_time();
    if std::env::var_os("BOTTLE_BUNDLE_BIN").is_none() {
        bottle_test_support::skip_docker_test(
            test,
            format!(
                "BOTTLE_BUNDLE_BIN is not set (build the static bundle with `{}`)",
                bottle_docker::BUNDLE_BUILD_HINT
            ),
        );
        return;
    }
    let engine = match Engine::connect(None) {
        Ok(engine) => engine,
        Err(err) => {
            bottle_test_support::skip_docker_test(test, format!("Docker is not reachable: {err}"));
            return;
        }
    };
    if let Err(err) = engine.block_on(engine.docker.ping()) {
        bottle_test_support::skip_docker_test(test, format!("Docker is not reachable: {err}"));
        return;
    }
    let busybox = examples().join("demo-agent/busybox");
    if !busybox.is_file() {
        bottle_test_support::skip_docker_test(
            test,
            format!(
                "{} is missing: README's set-up (`cargo xtask install`; `cargo xtask test`) copies it in",
                busybox.display()
            ),
        );
        return;
    }

    let state = bottle_test_support::temp_state_root();
    let started = Started {
        state: state.path(),
        name: format!("example-{}", std::process::id()),
    };
    let start = bottle(state.path())
        .current_dir(examples())
        .args([
            "--yes",
            "start",
            "demo",
            "--detach",
            "--name",
            &started.name,
        ])
        .output()
        .unwrap();
    assert!(
        start.status.success(),
        "bottle start demo: {}",
        String::from_utf8_lossy(&start.stderr)
    );
    // The example's own image: busybox's `id`, as its unprivileged agent.
    bottle(state.path())
        .current_dir(examples())
        .args(["exec", &started.name, "--", "id", "-u"])
        .assert()
        .success()
        .stdout("1000\n");
    assert!(agent_container_exists(&engine, &started.name));

    let stop = started.stop();
    assert!(
        stop.status.success(),
        "bottle stop: {}",
        String::from_utf8_lossy(&stop.stderr)
    );
    assert!(
        !agent_container_exists(&engine, &started.name),
        "stop left the agent container"
    );
}
