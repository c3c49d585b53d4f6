//! One run against this machine's real `/`: every check answers, none hits
//! unexpected I/O. What the host has is not asserted unless CI says so.
//! (The docker backend's checks, which `bottle doctor` adds, are run
//! against the real daemon by bottle-docker's and the CLI's tests.)

use bottle_core::BackendKind;
use bottle_core::exec::SystemRunner;
use bottle_preflight::{Context, Report, Status, all_ids, run_all};

use crate::support::find;

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|value| value == "1")
}

#[test]
fn real_host_returns_a_check_per_id() {
    for backend in BackendKind::ALL {
        let ctx = Context::from_host(&SystemRunner, backend);
        let checks = run_all(&ctx, &[]);
        println!("backend {backend}:\n{}", Report::new(&checks));
        let ids: Vec<&str> = checks.iter().map(|check| check.id).collect();
        assert_eq!(ids, all_ids(&[]));
        for check in &checks {
            assert!(
                !check.message.starts_with("check could not run"),
                "{check:#?}"
            );
        }
        serde_json::to_string(&checks).unwrap();

        if backend == BackendKind::Smolmachines {
            let kvm_ok = ["kvm.device", "kvm.access"]
                .iter()
                .all(|id| find(&checks, id).status == Status::Ok);
            if required("BOTTLE_REQUIRE_KVM") {
                assert!(
                    kvm_ok,
                    "BOTTLE_REQUIRE_KVM=1 but kvm is not usable:\n{}",
                    Report::new(&checks)
                );
            } else if !kvm_ok {
                println!(
                    "note: no usable kvm on this host; set BOTTLE_REQUIRE_KVM=1 to make that a failure"
                );
            }
        }
    }
}

/// Whether this machine's CPU advertises VT-x or AMD-V.
fn host_has_hardware_virtualisation() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|text| {
        text.lines()
            .filter(|line| line.starts_with("flags"))
            .any(|line| {
                line.split_whitespace()
                    .any(|flag| flag == "vmx" || flag == "svm")
            })
    })
}

#[test]
fn without_hardware_virtualisation_microvm_guests_are_refused() {
    if host_has_hardware_virtualisation() {
        println!("skip: this host's cpu has vmx or svm; kvm here can run guests");
        return;
    }
    let ctx = Context::from_host(&SystemRunner, BackendKind::Smolmachines);
    let checks = run_all(&ctx, &[]);
    println!("{}", Report::new(&checks));
    assert!(bottle_preflight::is_fatal(&checks));
    if std::path::Path::new("/dev/kvm").exists() {
        let cpu = find(&checks, "kvm.cpu");
        assert_eq!(cpu.status, Status::Fail, "{cpu:#?}");
        assert!(
            cpu.message.contains("microVM guests cannot run"),
            "{}",
            cpu.message
        );
    }
}

#[test]
fn the_test_guest_runs_through_this_hosts_kvm_api() {
    use bottle_preflight::kvm_guest::{GUEST_BOUND, GuestOutcome, run_guest};

    if std::env::consts::ARCH != "x86_64" {
        println!("skip: the test guest is x86-64 code");
        return;
    }
    let outcome = run_guest(std::path::Path::new("/dev/kvm"), GUEST_BOUND);
    println!("test guest on this host: {outcome:?}");
    match &outcome {
        GuestOutcome::NoAccess(errno) => {
            println!("skip: cannot open /dev/kvm here ({errno})");
        }
        // Where /dev/kvm opens, every step up to KVM_RUN must work.
        GuestOutcome::Refused { .. } => panic!("the KVM API refused a step: {outcome:?}"),
        _ if host_has_hardware_virtualisation() => {
            assert_eq!(outcome, GuestOutcome::Clean);
        }
        _ => {}
    }
}
