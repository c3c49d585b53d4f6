//! A stopped bottle's audit logs are kept until `bottle cleanup
//! --logs-older-than` prunes them, once confirmed; plain `cleanup` keeps
//! them.
//!
//! `cleanup` asks a backend too: these cases need Docker (whose orphans of
//! dead launches `cleanup` removes, as any run of it does), and skip
//! without it unless `BOTTLE_REQUIRE_DOCKER=1`.

use bottle_test_support::temp_state_root;
use predicates::prelude::*;

use crate::bottle;
use crate::exit_codes::docker_reachable;

#[test]
fn cleanup_keeps_audit_logs_unless_told_how_old_to_prune() {
    let test = "cleanup_keeps_audit_logs_unless_told_how_old_to_prune";
    if !docker_reachable(test) {
        return;
    }
    let state = temp_state_root();
    let kept = state.path().join("bottle/retained_logs/claude");
    let old = kept.join("2020-01-01T00:00:00.000Z");
    let recent = kept.join(bottle_core::time::now_rfc3339_millis());
    for run in [&old, &recent] {
        std::fs::create_dir_all(run).unwrap();
        std::fs::write(run.join("audit.jsonl"), "{}\n").unwrap();
    }
    // Confirmed: the host may hold other leftovers of this install (the
    // shared egress network no bottle uses), which it may remove.
    bottle(state.path())
        .args(["--backend", "docker", "--yes", "cleanup"])
        .assert()
        .success();
    assert!(old.is_dir() && recent.is_dir(), "plain cleanup keeps logs");
    // Listed, then refused without a terminal to confirm on: nothing goes.
    bottle(state.path())
        .args(["--backend", "docker", "cleanup", "--logs-older-than", "30d"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cleanup would remove:\n"))
        .stderr(predicate::str::contains(format!(
            "\n  audit log {}\n",
            old.display()
        )))
        .stderr(predicate::str::contains(
            "fix: pass --yes to clean up without confirming",
        ));
    assert!(old.is_dir(), "an unconfirmed cleanup pruned");
    bottle(state.path())
        .args([
            "--backend",
            "docker",
            "--yes",
            "cleanup",
            "--logs-older-than",
            "30d",
        ])
        .assert()
        .success()
        .stderr(predicate::str::contains(format!(
            "removed audit log {}",
            old.display()
        )));
    assert!(!old.exists(), "a run stopped years ago is pruned");
    assert!(recent.is_dir(), "a run stopped just now is kept");
}
