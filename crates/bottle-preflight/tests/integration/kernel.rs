//! The kernel check and `kernel_version` against fake roots.

use bottle_core::BackendKind;
use bottle_core::Coded as _;
use bottle_preflight::kernel::check_kernel;
use bottle_preflight::{Status, kernel_version};

use bottle_test_support::RecordingRunner;

use crate::support::FakeHost;

#[test]
fn modern_kernel_passes() {
    let host = FakeHost::new();
    host.write("/proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
    assert_eq!(kernel_version(&host.root()).unwrap(), Some((6, 8)));
    let runner = RecordingRunner::refusing();
    let check = check_kernel(&host.ctx(&runner, BackendKind::Docker)).unwrap();
    assert_eq!(check.status, Status::Ok);
    assert_eq!(
        check.message,
        "linux 6.8.0-45-generic (>= 5.4, as the /dev/pts TIOCSTI rule of the device policy needs)"
    );
}

#[test]
fn boundary_kernel_passes() {
    let host = FakeHost::new();
    host.write("/proc/sys/kernel/osrelease", "5.4.0-228-generic\n");
    let runner = RecordingRunner::refusing();
    let check = check_kernel(&host.ctx(&runner, BackendKind::Docker)).unwrap();
    assert_eq!(check.status, Status::Ok);
}

#[test]
fn old_kernel_warns() {
    let host = FakeHost::new();
    host.write("/proc/sys/kernel/osrelease", "4.19.0-27-amd64\n");
    assert_eq!(kernel_version(&host.root()).unwrap(), Some((4, 19)));
    let runner = RecordingRunner::refusing();
    let check = check_kernel(&host.ctx(&runner, BackendKind::Docker)).unwrap();
    assert_eq!(check.status, Status::Warn);
    assert_eq!(
        check.message,
        "linux 4.19.0-27-amd64 is older than 5.4, which the /dev/pts TIOCSTI rule of the device policy needs"
    );
    assert!(check.remediation.is_some());
}

#[test]
fn missing_release_is_unknown_not_an_error() {
    let host = FakeHost::new();
    assert_eq!(kernel_version(&host.root()).unwrap(), None);
    let runner = RecordingRunner::refusing();
    let check = check_kernel(&host.ctx(&runner, BackendKind::Docker)).unwrap();
    assert_eq!(check.status, Status::Warn);
    assert_eq!(
        check.message,
        "no /proc/sys/kernel/osrelease, so the kernel version is unknown"
    );
}

#[test]
fn garbage_release_is_an_error() {
    let host = FakeHost::new();
    host.write("/proc/sys/kernel/osrelease", "banana\n");
    let err = kernel_version(&host.root()).unwrap_err();
    assert_eq!(err.code(), "BOT-P003");
    assert!(
        err.to_string()
            .starts_with("could not parse kernel release \"banana\""),
        "{err}"
    );
}

#[test]
fn not_checked_off_linux() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.os = "macos".into();
    let check = check_kernel(&ctx).unwrap();
    assert_eq!(check.status, Status::Skip);
}
