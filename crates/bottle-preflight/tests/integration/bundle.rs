//! The bundle check: it names the binary `bottle` will use, in the lookup
//! order, and fails a missing, dynamic or non-ELF one with the fix.

use bottle_core::BackendKind;
use bottle_preflight::Status;
use bottle_preflight::bundle::check_bundle;
use bottle_test_support::RecordingRunner;

use crate::support::FakeHost;

/// A minimal x86-64 ELF with one program header of type `segment_type`
/// (3 is `PT_INTERP`, the dynamic loader; 1 is a loadable segment).
pub(crate) fn elf(segment_type: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; 64 + 56];
    bytes[..4].copy_from_slice(b"\x7fELF");
    bytes[4] = 2; // 64-bit
    bytes[5] = 1; // little-endian
    bytes[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    bytes[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
    bytes[64..68].copy_from_slice(&segment_type.to_le_bytes());
    bytes
}

pub(crate) fn write(host: &FakeHost, host_path: &str, bytes: &[u8]) {
    let path = host.path(host_path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn an_installed_static_bundle_is_found_beside_bottle() {
    let host = FakeHost::new();
    write(&host, "/opt/b/lib/bottle/bottle-bundle", &elf(1));
    host.mkdir("/opt/b/bin");
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.exe = Some("/opt/b/bin/bottle".into());
    let check = check_bundle(&ctx).unwrap();
    assert_eq!(
        (check.status, check.message.as_str()),
        (
            Status::Ok,
            "/opt/b/bin/../lib/bottle/bottle-bundle (static)"
        )
    );
}

#[test]
fn the_variable_wins_over_the_installation() {
    let host = FakeHost::new();
    write(&host, "/opt/b/lib/bottle/bottle-bundle", &elf(1));
    write(&host, "/elsewhere/bottle-bundle", &elf(3));
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Smolmachines);
    ctx.exe = Some("/opt/b/bin/bottle".into());
    ctx.bundle_bin = Some("/elsewhere/bottle-bundle".into());
    let check = check_bundle(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail, "{check:?}");
    assert!(check.message.contains("dynamically linked"), "{check:?}");
    assert!(
        check.message.starts_with("/elsewhere/bottle-bundle"),
        "{check:?}"
    );
}

#[test]
fn a_script_is_not_a_bundle() {
    let host = FakeHost::new();
    write(&host, "/b/bottle-bundle", b"#!/bin/sh\n");
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.bundle_bin = Some("/b/bottle-bundle".into());
    let check = check_bundle(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail, "{check:?}");
    assert!(check.message.contains("not an x86-64 ELF"), "{check:?}");
}

#[test]
fn a_missing_bundle_names_every_place_looked_at_and_the_install_step() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.exe = Some("/usr/local/bin/bottle".into());
    let check = check_bundle(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail, "{check:?}");
    assert!(
        check
            .message
            .contains("/usr/local/bin/../lib/bottle/bottle-bundle"),
        "{check:?}"
    );
    assert!(
        check
            .remediation
            .as_deref()
            .is_some_and(|fix| fix.contains("cargo xtask install")),
        "{check:?}"
    );
}
