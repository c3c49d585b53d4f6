//! The gVisor check against a fake daemon's `GET /info` and a recorded
//! `runsc --version`.

use bottle_core::BackendKind;
use bottle_preflight::docker::INFO_REQUEST;
use bottle_preflight::gvisor::check_gvisor;
use bottle_preflight::{Check, Status};
use bottle_test_support::RecordingRunner;

use crate::support::{FakeDocker, FakeHost, http};

/// `GET /info`'s runtimes as Docker 20.10 reports them with Debian's runsc
/// registered the way `.ci/setup` does.
const INFO_RUNSC: &str = r#"{"ID":"x","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--platform=ptrace","--network=host","--file-access=shared","--overlay2=none","--oci-seccomp"]}},"DefaultRuntime":"runc"}"#;

fn check_with(info: &str, runner: &RecordingRunner) -> (Check, Vec<Vec<String>>) {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(&socket, Some(http("200 OK", info)));
    let check = check_gvisor(&host.ctx(runner, BackendKind::Docker));
    assert_eq!(server.request(), INFO_REQUEST);
    (check, runner.calls())
}

#[test]
fn debians_runsc_is_reported_with_its_platform_and_known_gaps() {
    let runner = RecordingRunner::printing("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n");
    let (check, calls) = check_with(INFO_RUNSC, &runner);
    assert_eq!(calls, [["/usr/bin/runsc", "--version"]]);
    assert_eq!(check.status, Status::Warn, "{check:?}");
    for part in [
        "runsc 0.0~20221219.0 at /usr/bin/runsc",
        "platform ptrace, network host, file access shared",
        "systrap",
        "AT_NO_AUTOMOUNT",
        "google/gvisor#10704",
        "SO_RCVTIMEO",
    ] {
        assert!(check.message.contains(part), "{part}: {}", check.message);
    }
    assert!(check.remediation.unwrap().contains("gvisor.dev"));
}

#[test]
fn a_current_build_passes() {
    let runner = RecordingRunner::printing("runsc version release-20261116.0\n");
    let (check, _) = check_with(INFO_RUNSC, &runner);
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert_eq!(
        check.message,
        "`runsc`: runsc release-20261116.0 at /usr/bin/runsc (platform ptrace, network host, file access shared)"
    );
}

#[test]
fn no_runtime_and_an_unfit_one_warn_with_the_fix() {
    let runner = RecordingRunner::refusing();
    let (check, calls) = check_with(r#"{"Runtimes":{"runc":{"path":"runc"}}}"#, &runner);
    assert!(calls.is_empty(), "nothing is run without a runtime");
    assert_eq!(check.status, Status::Warn);
    assert!(
        check.message.contains("no `runsc` runtime (it has: runc)"),
        "{}",
        check.message
    );
    let fix = check.remediation.unwrap();
    for step in ["apt-get install runsc", "daemon.json", "kill -HUP"] {
        assert!(fix.contains(step), "{fix}");
    }

    let (check, _) = check_with(
        r#"{"Runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=host"]}}}"#,
        &RecordingRunner::refusing(),
    );
    assert_eq!(check.status, Status::Warn);
    assert!(check.message.contains("--file-access"), "{}", check.message);
    assert!(check.message.contains("BOT-D091"), "{}", check.message);
}

#[test]
fn a_binary_that_is_not_runsc_warns() {
    let runner = RecordingRunner::printing("runc version 1.1.5\n");
    let (check, _) = check_with(INFO_RUNSC, &runner);
    assert_eq!(check.status, Status::Warn);
    assert!(
        check.message.contains("may not be gVisor"),
        "{}",
        check.message
    );
}

#[test]
fn an_unreachable_daemon_is_not_checked() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let check = check_gvisor(&host.ctx(&runner, BackendKind::Docker));
    assert_eq!(check.status, Status::Skip, "{check:?}");
}
