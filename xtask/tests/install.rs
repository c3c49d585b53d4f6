//! `cargo xtask install --prefix <tmp>` end to end: it builds `bottle` and
//! the static bundle in release and lays them out so that the installed
//! `bottle doctor`, with no `BOTTLE_BUNDLE_BIN`, names the installed bundle
//! and finds it static.
//!
//! This is the slow test it looks like: it builds `bottle` statically in
//! release (the bundle is `cargo xtask dist`'s build, already there under
//! `cargo xtask test`). It runs where that static toolchain is set up,
//! which `BOTTLE_BUNDLE_BIN` says (`cargo xtask test` sets it); elsewhere it
//! prints why it skips, and fails instead when `BOTTLE_REQUIRE_DOCKER=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Building `bottle` in release on a small machine.
const INSTALL_BOUND: Duration = Duration::from_secs(30 * 60);

fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test drives the real xtask binary and the bottle it installs"
    )]
    Command::new(program)
}

#[test]
fn install_lays_out_bottle_and_a_bundle_its_doctor_finds() {
    if std::env::var_os("BOTTLE_BUNDLE_BIN").is_none() {
        bottle_test_support::skip_docker_test(
            "cargo xtask install",
            "BOTTLE_BUNDLE_BIN is not set (the static toolchain is not set up; run under `cargo xtask test`)",
        );
        return;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let prefix = tempfile::tempdir().unwrap();
    let mut child = command(env!("CARGO_BIN_EXE_xtask"))
        .current_dir(workspace)
        .arg("install")
        .arg("--prefix")
        .arg(prefix.path())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = None;
    bottle_test_support::eventually(INSTALL_BOUND, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the install did not finish within {INSTALL_BOUND:?}");
    };
    assert!(status.success(), "cargo xtask install: {status}");

    let bottle = prefix.path().join("bin/bottle");
    let bundle = prefix.path().join("lib/bottle/bottle-bundle");
    assert!(bundle.is_file(), "{} is missing", bundle.display());
    let doctor = command(&bottle)
        .args(["doctor", "--json"])
        .env_remove("BOTTLE_BUNDLE_BIN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let checks: Vec<Value> = serde_json::from_slice(&doctor.stdout).unwrap_or_else(|e| {
        panic!(
            "bottle doctor printed no JSON ({e}): {}",
            String::from_utf8_lossy(&doctor.stdout)
        )
    });
    let check = checks
        .iter()
        .find(|c| c["id"] == "bundle.binary")
        .expect("doctor has a bundle.binary check");
    assert_eq!(check["status"], "ok", "{check:#}");
    let expected = format!(
        "{}/bin/../lib/bottle/bottle-bundle (static)",
        prefix.path().display()
    );
    assert_eq!(check["message"], expected.as_str(), "{check:#}");
}
