//! One run against this machine's real `/`: every check answers, none hits
//! unexpected I/O. What the host has is not asserted unless CI says so.

use bottle_core::BackendKind;
use bottle_core::exec::SystemRunner;
use bottle_preflight::{ALL_IDS, Context, Report, Status, run_all};

use crate::support::find;

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|value| value == "1")
}

#[test]
fn real_host_returns_a_check_per_id() {
    for backend in BackendKind::ALL {
        let ctx = Context::from_host(&SystemRunner, backend);
        let checks = run_all(&ctx);
        println!("backend {backend}:\n{}", Report::new(&checks));
        let ids: Vec<&str> = checks.iter().map(|check| check.id).collect();
        assert_eq!(ids, ALL_IDS);
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
        if backend == BackendKind::Docker {
            let docker_ok = find(&checks, "docker.daemon").status == Status::Ok;
            if bottle_test_support::docker_required() {
                assert!(
                    docker_ok,
                    "BOTTLE_REQUIRE_DOCKER=1 but docker is not usable:\n{}",
                    Report::new(&checks)
                );
            } else if !docker_ok {
                println!(
                    "note: no usable docker daemon on this host; set BOTTLE_REQUIRE_DOCKER=1 to make that a failure"
                );
            }
        }
    }
}
