//! The in-box agent check: it names the binary a launch will put into
//! boxes, in the lookup order, and only warns when it is missing or not
//! static (a bottle runs without it; `bottle execute` does not).

use bottle_core::BackendKind;
use bottle_preflight::Status;
use bottle_preflight::toolbox::check_toolbox;
use bottle_test_support::RecordingRunner;

use crate::bundle::{elf, write};
use crate::support::FakeHost;

#[test]
fn an_installed_static_toolbox_is_found_beside_bottle() {
    let host = FakeHost::new();
    write(&host, "/opt/b/lib/bottle/bottle-toolbox", &elf(1));
    host.mkdir("/opt/b/bin");
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.exe = Some("/opt/b/bin/bottle".into());
    let check = check_toolbox(&ctx).unwrap();
    assert_eq!(
        (check.status, check.message.as_str()),
        (
            Status::Ok,
            "/opt/b/bin/../lib/bottle/bottle-toolbox (static)"
        )
    );
}

#[test]
fn a_dynamic_toolbox_named_by_the_variable_warns() {
    let host = FakeHost::new();
    write(&host, "/opt/b/lib/bottle/bottle-toolbox", &elf(1));
    write(&host, "/elsewhere/bottle-toolbox", &elf(3));
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.exe = Some("/opt/b/bin/bottle".into());
    ctx.toolbox_bin = Some("/elsewhere/bottle-toolbox".into());
    let check = check_toolbox(&ctx).unwrap();
    assert_eq!(check.status, Status::Warn, "{check:?}");
    assert!(
        check
            .message
            .starts_with("/elsewhere/bottle-toolbox is dynamically linked"),
        "{check:?}"
    );
}

#[test]
fn a_missing_toolbox_warns_with_every_place_looked_at_and_the_install_step() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.exe = Some("/usr/local/bin/bottle".into());
    let check = check_toolbox(&ctx).unwrap();
    assert_eq!(check.status, Status::Warn, "{check:?}");
    assert!(
        check
            .message
            .contains("/usr/local/bin/../lib/bottle/bottle-toolbox"),
        "{check:?}"
    );
    let fix = check.remediation.unwrap_or_default();
    assert!(
        fix.contains("cargo xtask install") && fix.contains("BOTTLE_TOOLBOX_BIN"),
        "{fix}"
    );
}
