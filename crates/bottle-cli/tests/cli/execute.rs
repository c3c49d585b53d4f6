//! `bottle execute` on a docker bottle: the call's outputs and exit code
//! pass through, `--json` prints the result and exits 0, a sandbox error
//! prints its code and fix and exits 1, and the in-box agent a command
//! started ends with it.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image), `BOTTLE_BUNDLE_BIN`
//! and `BOTTLE_TOOLBOX_BIN`; skips with a line unless
//! `BOTTLE_REQUIRE_DOCKER=1`.

use std::path::PathBuf;

use predicates::prelude::*;

use crate::bottle;

const IMAGE: &str = "bottle-demo-agent:cli-execute";

/// Stops the test's bottle however the test ends.
struct Stopper {
    state: PathBuf,
    manifest: PathBuf,
    name: String,
}

impl Stopper {
    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.state);
        cmd.arg("--manifest")
            .arg(&self.manifest)
            .args(["--backend", "docker"]);
        cmd
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        let _ = self.bottle().args(["stop", "--wait", &self.name]).output();
    }
}

#[test]
fn execute_passes_the_calls_exit_code_through_and_prints_json() {
    let test = "execute_passes_the_calls_exit_code_through_and_prints_json";
    let _serial = crate::one_launch_at_a_time();
    let Some(_engine) =
        crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN", "BOTTLE_TOOLBOX_BIN"])
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        format!(
            "[agents.coder]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\"]\n\n[agents.coder.egress]\nallow = [\"api.example.com\"]\n"
        ),
    )
    .unwrap();
    let world = Stopper {
        state: dir.path().join("state"),
        manifest,
        name: format!("execute-{}", std::process::id()),
    };
    world
        .bottle()
        .args(["start", "coder", "--name", &world.name, "--yes", "--detach"])
        .assert()
        .success();

    world
        .bottle()
        .args(["execute", &world.name, "--"])
        .args(["sh", "-c", "echo to-out; echo to-err >&2; exit 7"])
        .assert()
        .code(7)
        .stdout("to-out\n")
        .stderr("to-err\n");

    let out = world
        .bottle()
        .args([
            "--json",
            "execute",
            &world.name,
            "--stdin-file",
            "-",
            "--",
            "cat",
        ])
        .write_stdin("bytes in")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    // The result's own serde shape (outputs in base64).
    let result: bottle_core::sandbox::ToolResult = serde_json::from_slice(&out).unwrap();
    assert_eq!(result.exit_code, 0);
    assert_eq!(result.stdout, b"bytes in");
    assert!(result.evidence_hash.starts_with("sha256:"));

    world
        .bottle()
        .args(["execute", &world.name, "--deadline", "300ms", "--"])
        .args(["sleep", "60"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("error[BOT-X003]").and(predicate::str::contains("fix:")));

    // Each `bottle execute` started its own in-box agent; none outlives
    // the command that started it.
    bottle_test_support::wait_until(
        "the in-box agents of finished commands to exit",
        std::time::Duration::from_secs(20),
        || {
            let out = world
                .bottle()
                .args(["exec", &world.name, "--", "sh", "-c"])
                .arg("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
                .output()
                .unwrap();
            !String::from_utf8_lossy(&out.stdout).contains("/.bottle/toolbox")
        },
    );
}
