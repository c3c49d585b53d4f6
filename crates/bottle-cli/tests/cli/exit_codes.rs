//! Exit codes by failure kind (README's table): naming a bottle or an image
//! that does not exist is bad input (2), not a backend failure (4), on
//! every command that takes one.
//!
//! The docker cases only read the daemon (no bottle of these names exists,
//! no image of this reference): they need Docker, and skip without it
//! unless `BOTTLE_REQUIRE_DOCKER=1`.

use bottle_test_support::temp_state_root;
use predicates::prelude::*;

use crate::bottle;

/// Exit code: bad input (README).
const EXIT_USAGE: i32 = 2;

/// A name no test run ever gives a bottle.
const NO_SUCH_BOTTLE: &str = "no-such-bottle-exit-codes";

/// Whether the Docker daemon answers, or a printed skip.
pub(crate) fn docker_reachable(test: &str) -> bool {
    let probe = bottle_docker::client::Engine::connect(None)
        .map_err(|err| err.to_string())
        .and_then(|engine| {
            engine
                .block_on(engine.docker.ping())
                .map(|_| ())
                .map_err(|err| format!("Docker is not reachable: {err}"))
        });
    bottle_test_support::require_docker(test, probe).is_some()
}

#[test]
fn logs_of_an_unknown_bottle_is_bad_input() {
    let state = temp_state_root();
    bottle(state.path())
        .args(["logs", NO_SUCH_BOTTLE])
        .assert()
        .code(EXIT_USAGE)
        .stderr(predicate::str::contains(NO_SUCH_BOTTLE))
        .stderr(predicate::str::contains("fix: "));
}

#[test]
fn an_unknown_bottle_is_bad_input_for_stop_exec_and_cp() {
    let test = "an_unknown_bottle_is_bad_input_for_stop_exec_and_cp";
    if !docker_reachable(test) {
        return;
    }
    let state = temp_state_root();
    let file = state.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let destination = format!("{NO_SUCH_BOTTLE}:/tmp");
    let commands: [Vec<&str>; 3] = [
        vec!["stop", NO_SUCH_BOTTLE],
        vec!["exec", NO_SUCH_BOTTLE, "--", "true"],
        vec!["cp", file.to_str().unwrap(), &destination],
    ];
    for args in commands {
        bottle(state.path())
            .args(["--backend", "docker"])
            .args(&args)
            .assert()
            .code(EXIT_USAGE)
            .stderr(predicate::str::contains(NO_SUCH_BOTTLE))
            .stderr(predicate::str::contains("fix: "));
    }
}

#[test]
fn a_missing_image_at_start_is_bad_input_and_writes_nothing() {
    let test = "a_missing_image_at_start_is_bad_input_and_writes_nothing";
    if !docker_reachable(test) {
        return;
    }
    let state = temp_state_root();
    let project = state.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("bottle.toml"),
        "[agents.coder]\nimage = \"bottle-test-no-such-image:missing\"\n",
    )
    .unwrap();
    bottle(state.path())
        .arg("--manifest")
        .arg(project.join("bottle.toml"))
        .args(["--backend", "docker", "--yes", "start", "coder"])
        .args(["--name", NO_SUCH_BOTTLE, "--detach"])
        .assert()
        .code(EXIT_USAGE)
        .stderr(predicate::str::contains("error[BOT-D010]"))
        .stderr(predicate::str::contains("fix: "));
    assert!(
        !state.path().join("bottle").exists(),
        "a refused start wrote state"
    );
}

#[test]
fn gvisor_on_a_daemon_without_the_runtime_is_refused_before_anything_exists() {
    let test = "gvisor_on_a_daemon_without_the_runtime_is_refused_before_anything_exists";
    if !docker_reachable(test) {
        return;
    }
    let state = temp_state_root();
    let project = state.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("bottle.toml"),
        "[agents.coder]\nimage = \"busybox:latest\"\nisolation = \"gvisor\"\n",
    )
    .unwrap();
    let name = format!("gvisor-missing-{}", std::process::id());
    bottle(state.path())
        .env(
            bottle_core::isolation::GVISOR_RUNTIME_ENV,
            "bottle-test-no-such-runtime",
        )
        .arg("--manifest")
        .arg(project.join("bottle.toml"))
        .args(["--backend", "docker", "--yes", "start", "coder"])
        .args(["--name", &name, "--detach"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("error[BOT-D090]"))
        .stderr(predicate::str::contains("bottle-test-no-such-runtime"))
        .stderr(predicate::str::contains("fix: "))
        .stderr(predicate::str::contains("kill -HUP"));
    assert!(
        !state.path().join("bottle").exists(),
        "a refused start wrote state"
    );
    let engine = bottle_docker::client::Engine::connect(None).unwrap();
    assert_eq!(
        crate::interrupted::docker_objects(&engine, &format!("bot-bottle-{name}")),
        Vec::<String>::new()
    );
}
