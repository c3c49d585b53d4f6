//! `/dev/kvm`, access and module checks against fake roots.

use bottle_core::BackendKind;
use bottle_core::Coded as _;
use std::os::unix::fs::MetadataExt as _;

use bottle_preflight::kvm::{check_access, check_cpu, check_device, check_group, check_module};
use bottle_preflight::kvm_guest::check_guest;
use bottle_preflight::{Status, run_all};

use bottle_test_support::RecordingRunner;

use crate::support::{FakeHost, find, is_root};

const INTEL: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme vmx sse\n";
const AMD_NO_SVM: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse\n";

#[test]
fn missing_device_fails_with_modprobe_for_this_cpu() {
    let host = FakeHost::new();
    host.write("/proc/cpuinfo", INTEL);
    let runner = RecordingRunner::refusing();
    let check = check_device(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        "no /dev/kvm: kvm is not available on this host"
    );
    let fix = check.remediation.unwrap();
    assert!(
        fix.starts_with("load the kvm module for this CPU: `sudo modprobe kvm_intel`"),
        "{fix}"
    );
    assert!(fix.contains("nested virtualisation"), "{fix}");
}

#[test]
fn missing_device_on_nixos_suggests_configuration() {
    let host = FakeHost::new();
    host.write("/proc/cpuinfo", INTEL);
    host.write("/etc/NIXOS", "");
    let runner = RecordingRunner::refusing();
    let check = check_device(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Fail);
    let fix = check.remediation.unwrap();
    assert!(
        fix.starts_with("add to /etc/nixos/configuration.nix:\n  boot.kernelModules = [ \"kvm-intel\" ];\nthen run `sudo nixos-rebuild switch`"),
        "{fix}"
    );
}

#[test]
fn missing_device_is_only_a_warning_for_the_docker_backend() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let check = check_device(&host.ctx(&runner, BackendKind::Docker)).unwrap();
    assert_eq!(check.status, Status::Warn);
    assert!(
        check
            .message
            .ends_with("(only the smolmachines backend needs kvm)"),
        "{}",
        check.message
    );
    // Unknown CPU: both modules are named.
    assert!(
        check
            .remediation
            .unwrap()
            .contains("`sudo modprobe kvm_amd` (AMD)")
    );
}

#[test]
fn regular_file_is_not_a_kvm_device() {
    let host = FakeHost::new();
    host.write("/dev/kvm", "");
    let runner = RecordingRunner::refusing();
    let check = check_device(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        "/dev/kvm exists but is a regular file, not a character device"
    );
}

#[test]
fn char_device_passes() {
    if !is_root() {
        println!("skip: char_device_passes needs root to mknod a device node");
        return;
    }
    let host = FakeHost::new();
    let path = host.mkdir("/dev").join("kvm");
    let dev = nix::sys::stat::makedev(10, 232);
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o660);
    if let Err(err) = nix::sys::stat::mknod(&path, nix::sys::stat::SFlag::S_IFCHR, mode, dev) {
        println!("skip: char_device_passes could not mknod ({err}); no CAP_MKNOD here");
        return;
    }
    let runner = RecordingRunner::refusing();
    let ctx = host.ctx(&runner, BackendKind::Smolmachines);
    let check = check_device(&ctx).unwrap();
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert_eq!(check.message, "/dev/kvm is a character device (10:232)");
    // Root may open any device node.
    assert_eq!(check_access(&ctx).unwrap().status, Status::Ok);
}

#[test]
fn accessible_device_passes_access() {
    let host = FakeHost::new();
    host.write("/dev/kvm", "");
    host.chmod("/dev/kvm", 0o600);
    let runner = RecordingRunner::refusing();
    let check = check_access(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Ok);
    assert_eq!(check.message, "this user can read and write /dev/kvm");
    assert_eq!(check.remediation, None);
}

#[test]
fn access_is_skipped_without_a_device() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let check = check_access(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Skip);
    assert_eq!(check.message, "no /dev/kvm to open (see kvm.device)");
}

#[test]
fn loaded_vendor_module_passes() {
    let host = FakeHost::new();
    host.write(
        "/proc/modules",
        "kvm_amd 200704 0 - Live 0x0000000000000000\nkvm 1318912 1 kvm_amd, Live 0x0000000000000000\nccp 118784 1 kvm_amd, Live 0x0000000000000000\n",
    );
    let runner = RecordingRunner::refusing();
    let check = check_module(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Ok);
    assert_eq!(check.message, "kvm_amd is loaded");
}

#[test]
fn unloading_module_does_not_count() {
    let host = FakeHost::new();
    host.write(
        "/proc/modules",
        "kvm_intel 409600 0 - Unloading 0x0000000000000000\n",
    );
    host.write("/proc/cpuinfo", INTEL);
    let runner = RecordingRunner::refusing();
    let check = check_module(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert_eq!(check.message, "neither kvm_intel nor kvm_amd is loaded");
}

#[test]
fn built_in_vendor_module_passes_without_proc_modules() {
    let host = FakeHost::new();
    host.mkdir("/sys/module/kvm_intel/parameters");
    let runner = RecordingRunner::refusing();
    let check = check_module(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Ok);
    assert_eq!(check.message, "kvm_intel is built into the kernel");
}

#[test]
fn other_kvm_provider_with_a_device_passes() {
    let host = FakeHost::new();
    host.mkdir("/sys/module/kvm/parameters");
    host.mkdir("/sys/module/kvm_pvm/parameters");
    host.write("/dev/kvm", "");
    let runner = RecordingRunner::refusing();
    let check = check_module(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Ok);
    assert_eq!(
        check.message,
        "neither kvm_intel nor kvm_amd is loaded, but /dev/kvm exists: kvm is provided by kvm_pvm"
    );
}

#[test]
fn no_module_and_no_virtualisation_flag_points_at_firmware() {
    let host = FakeHost::new();
    host.write("/proc/modules", "ext4 1000 1 - Live 0x0\n");
    host.write("/proc/cpuinfo", AMD_NO_SVM);
    let runner = RecordingRunner::refusing();
    let check = check_module(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Fail);
    let fix = check.remediation.unwrap();
    assert!(
        fix.starts_with("this CPU does not advertise hardware virtualisation (no vmx or svm flag): enable virtualisation (VT-x / AMD-V) in the firmware"),
        "{fix}"
    );
    assert!(
        fix.ends_with("then load the kvm module for this CPU: `sudo modprobe kvm_amd`"),
        "{fix}"
    );
}

#[test]
fn unreadable_proc_modules_is_an_error_not_a_verdict() {
    let host = FakeHost::new();
    // A directory where a file should be: reading it fails with EISDIR.
    host.mkdir("/proc/modules");
    let runner = RecordingRunner::refusing();
    let ctx = host.ctx(&runner, BackendKind::Smolmachines);
    let err = check_module(&ctx).unwrap_err();
    assert_eq!(err.code(), "BOT-P001");
    assert!(err.to_string().starts_with("could not read "), "{err}");
    let module = run_all(&ctx, &[])
        .into_iter()
        .find(|c| c.id == "kvm.module")
        .unwrap();
    assert_eq!(module.status, Status::Fail);
    assert!(
        module
            .message
            .starts_with("check could not run: error[BOT-P001]"),
        "{}",
        module.message
    );
}

#[test]
fn macos_skips_every_kvm_check() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Smolmachines);
    ctx.os = "macos".into();
    ctx.arch = "aarch64".into();
    let checks = run_all(&ctx, &[]);
    for id in [
        "kvm.device",
        "kvm.access",
        "kvm.module",
        "kvm.cpu",
        "kvm.group",
        "kvm.guest",
    ] {
        let check = find(&checks, id);
        assert_eq!(check.status, Status::Skip, "{check:?}");
        assert_eq!(
            check.message,
            "not needed on macos: smolvm uses Hypervisor.framework"
        );
    }
}

const AMD_NO_SVM_DEVICE: &str =
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse hypervisor\n";

#[test]
fn kvm_without_a_virtualisation_flag_cannot_run_guests() {
    let host = FakeHost::new();
    host.write("/dev/kvm", "");
    host.write("/proc/cpuinfo", AMD_NO_SVM_DEVICE);
    let runner = RecordingRunner::refusing();
    let check = check_cpu(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        "/dev/kvm exists but the cpu has no vmx or svm flag: kvm here is emulated or nested without hardware virtualisation, and microVM guests cannot run on it"
    );
    let fix = check.remediation.unwrap();
    assert!(fix.contains("--backend docker"), "{fix}");
    let docker = check_cpu(&host.ctx(&runner, BackendKind::Docker)).unwrap();
    assert_eq!(docker.status, Status::Warn);
}

#[test]
fn a_virtualisation_flag_passes_and_no_device_skips() {
    let host = FakeHost::new();
    host.write("/proc/cpuinfo", INTEL);
    let runner = RecordingRunner::refusing();
    let ctx = host.ctx(&runner, BackendKind::Smolmachines);
    let check = check_cpu(&ctx).unwrap();
    assert_eq!(check.status, Status::Skip);
    assert_eq!(check.message, "no /dev/kvm (see kvm.device)");
    host.write("/dev/kvm", "");
    assert_eq!(check_cpu(&ctx).unwrap().status, Status::Ok);
    // No x86 flags line (an arm cpuinfo): nothing to judge.
    host.write("/proc/cpuinfo", "processor\t: 0\nFeatures\t: fp asimd\n");
    assert_eq!(check_cpu(&ctx).unwrap().status, Status::Skip);
}

fn as_root(ctx: &mut bottle_preflight::Context<'_>) {
    ctx.identity = bottle_preflight::Identity {
        uid: 0,
        gid: 0,
        groups: vec![0],
    };
}

#[test]
fn root_only_device_fails_for_root_with_the_chgrp_fix() {
    let host = FakeHost::new();
    host.write("/dev/kvm", "");
    host.chmod("/dev/kvm", 0o600);
    host.write("/etc/group", "root:x:0:\nkvm:x:994:\n");
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Smolmachines);
    as_root(&mut ctx);
    let check = check_group(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail, "{check:?}");
    let gid = std::fs::metadata(host.path("/dev/kvm")).unwrap().gid();
    let owner = if gid == 0 {
        "root".to_owned()
    } else {
        format!("gid {gid}")
    };
    assert_eq!(
        check.message,
        format!(
            "/dev/kvm belongs to group {owner} with mode 0600: smolvm run as root drops each VM to its own uid keeping only the kvm group, so every machine start fails with EACCES"
        )
    );
    assert_eq!(
        check.remediation.unwrap(),
        "add the udev rule `KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\"` (e.g. in /etc/udev/rules.d/65-kvm.rules) and run `sudo udevadm trigger`; until the next boot, `sudo chgrp kvm /dev/kvm && sudo chmod 660 /dev/kvm` does the same"
    );
    // Not root: smolvm keeps the user's own access.
    let user = check_group(&host.ctx(&runner, BackendKind::Smolmachines)).unwrap();
    assert_eq!(user.status, Status::Skip);
}

#[test]
fn kvm_group_read_write_device_passes_for_root() {
    let host = FakeHost::new();
    host.write("/dev/kvm", "");
    host.chmod("/dev/kvm", 0o660);
    let gid = std::fs::metadata(host.path("/dev/kvm")).unwrap().gid();
    host.write("/etc/group", &format!("kvm:x:{gid}:\n"));
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Smolmachines);
    as_root(&mut ctx);
    let check = check_group(&ctx).unwrap();
    assert_eq!(check.status, Status::Ok, "{check:?}");
    // Group read-only is not enough.
    host.chmod("/dev/kvm", 0o640);
    assert_eq!(check_group(&ctx).unwrap().status, Status::Fail);
    // No kvm group at all: say to create it.
    host.chmod("/dev/kvm", 0o660);
    host.write("/etc/group", "root:x:0:\n");
    let check = check_group(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert!(
        check
            .remediation
            .unwrap()
            .starts_with("create the group (`sudo groupadd --system kvm`)")
    );
}

#[test]
fn a_device_that_is_not_kvm_fails_the_guest_smoke_test() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let ctx = host.ctx(&runner, BackendKind::Smolmachines);
    let check = check_guest(&ctx);
    assert_eq!(check.status, Status::Skip);
    assert_eq!(
        check.message,
        "no /dev/kvm to run a guest on (see kvm.device)"
    );
    host.write("/dev/kvm", "");
    let check = check_guest(&ctx);
    assert_eq!(check.status, Status::Fail, "{check:?}");
    assert_eq!(
        check.message,
        "KVM_GET_API_VERSION failed on /dev/kvm: not a kvm device"
    );
    assert_eq!(
        check_guest(&host.ctx(&runner, BackendKind::Docker)).status,
        Status::Warn
    );
}
