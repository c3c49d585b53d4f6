//! The platform check for each OS and architecture branch.

use bottle_core::BackendKind;
use bottle_preflight::Status;
use bottle_preflight::platform::check_platform;

use bottle_test_support::RecordingRunner;

use crate::support::FakeHost;

fn platform(os: &str, arch: &str, backend: BackendKind) -> bottle_preflight::Check {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, backend);
    ctx.os = os.into();
    ctx.arch = arch.into();
    check_platform(&ctx)
}

#[test]
fn linux_and_macos_pass() {
    let check = platform("linux", "x86_64", BackendKind::Smolmachines);
    assert_eq!(
        (check.status, check.message.as_str()),
        (Status::Ok, "linux x86_64")
    );
    let check = platform("macos", "aarch64", BackendKind::Smolmachines);
    assert_eq!(
        (check.status, check.message.as_str()),
        (Status::Ok, "macos aarch64")
    );
    // Docker runs wherever Docker does.
    assert_eq!(
        platform("linux", "riscv64", BackendKind::Docker).status,
        Status::Ok
    );
}

#[test]
fn other_platforms_fail() {
    let check = platform("freebsd", "x86_64", BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        "bottle runs on linux and macos, not freebsd (x86_64)"
    );
    assert!(check.remediation.is_some());
}

#[test]
fn smolvm_architectures_warn() {
    let check = platform("linux", "riscv64", BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Warn);
    assert_eq!(
        check.message,
        "linux riscv64: smolvm ships linux builds for x86_64 and aarch64 only"
    );
    let check = platform("macos", "x86_64", BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Warn);
}
