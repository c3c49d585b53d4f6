//! The gate's own negative control: `cargo xtask sandbox-escape --backend
//! smolmachines` against the `fake-smolvm` double, whose `machine exec`
//! runs the probe on the host. Nothing is isolated there, so the gate must
//! say so: exit 10 with escape rows. A gate that passed here would pass an
//! unconfined bottle.
//!
//! Needs root (the gate creates the canary interface and swaps
//! `/etc/resolv.conf`), the Docker Engine (the bundles are containers) and
//! `BOTTLE_BUNDLE_BIN` (the static toolchain the gate builds its bundle and
//! probe with is set up); it prints why it skips otherwise, and fails
//! instead when `BOTTLE_REQUIRE_DOCKER=1`. It never restarts dockerd
//! (`--skip-dockerd-restart`): other users of the Engine are left alone.
//! `BOTTLE_FAKE_SMOLVM` names a built double; otherwise it is built.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The whole gate run's bound (it builds, starts nine bottles, probes).
const RUN_BOUND: Duration = Duration::from_secs(45 * 60);

fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test drives the real xtask binary and cargo"
    )]
    Command::new(program)
}

/// Why the run cannot happen here (`None`: it can).
fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    if std::env::var_os("BOTTLE_BUNDLE_BIN").is_none() {
        return Some("BOTTLE_BUNDLE_BIN is not set (the static toolchain is not set up)".into());
    }
    let socket = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".into());
    if std::os::unix::net::UnixStream::connect(&socket).is_err() {
        return Some(format!("no Docker Engine at {socket}"));
    }
    None
}

#[test]
fn the_gate_reports_the_unconfined_fake_as_escaped() {
    if let Some(why) = missing() {
        bottle_test_support::skip_docker_test("the gate's negative control", why);
        return;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let fake = fake_smolvm::executable().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for sub in ["smolvm", "cache"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let stdout_path = dir.path().join("report.json");
    let mut child = command(env!("CARGO_BIN_EXE_xtask"))
        .current_dir(&workspace)
        .args([
            "sandbox-escape",
            "--backend",
            "smolmachines",
            "--json",
            "--skip-dockerd-restart",
        ])
        .env("BOTTLE_SMOLVM", &fake)
        .env("BOTTLE_TEST_FAKE_SMOLVM_NO_KVM", "1")
        .env("SMOLVM_DATA_DIR", dir.path().join("smolvm"))
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env_remove("XDG_DATA_HOME")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    bottle_test_support::eventually(RUN_BOUND, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the gate did not finish within {RUN_BOUND:?}");
    };
    let text = std::fs::read_to_string(&stdout_path).unwrap();
    let report: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the gate printed no JSON report ({e}): {text}"));
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    let escapes: Vec<String> = rows
        .iter()
        .filter(|r| r["verdict"] == "escape")
        .map(|r| format!("{} / {}", r["phase"], r["probe"]))
        .collect();
    assert_eq!(report["backend"], "smolmachines");
    assert_eq!(
        status.code(),
        Some(10),
        "the gate must exit 10 on the unconfined fake; summary {}, harness errors {}",
        report["summary"],
        report["harness_errors"]
    );
    // The probe ran on the host and reached the canaries from there.
    for probe in ["tcp-internet-v4-80", "tcp-host-loopback"] {
        assert!(
            rows.iter()
                .any(|r| r["probe"] == probe && r["verdict"] == "escape"),
            "{probe} is not an escape; escapes: {escapes:?}"
        );
    }
    eprintln!("the gate caught {} escapes on the fake", escapes.len());
}
