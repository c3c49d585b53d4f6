//! `bottle requests` / `approve` / `deny` against a state dir holding
//! request files as the bundle's supervise daemon writes them (no backend).

use std::path::{Path, PathBuf};

use bottle_core::requests::{self, Ask, REQUESTS_VERSION, Request, Status};
use bottle_test_support::temp_state_root;
use predicates::prelude::*;

use crate::bottle;

/// Files a pending request for bottle `slug`, as supervise does; returns
/// the queue directory.
fn file_request(state: &Path, slug: &str, n: u64, ask: Ask) -> PathBuf {
    let dir = requests::requests_dir(&state.join("bottle").join(slug));
    std::fs::create_dir_all(&dir).unwrap();
    requests::write_request(
        &dir,
        &Request {
            v: REQUESTS_VERSION,
            id: format!("{slug}-{n}"),
            bottle: format!("bot-bottle-{slug}"),
            ask,
            reason: "need the docs".into(),
            created: bottle_core::time::now_rfc3339(),
            status: Status::Pending,
            decision_reason: None,
        },
    )
    .unwrap();
    dir
}

fn egress(host: &str) -> Ask {
    Ask::Egress { host: host.into() }
}

#[test]
fn requests_lists_pending_requests_of_every_bottle() {
    let state = temp_state_root();
    file_request(state.path(), "claude", 1, egress("docs.rs"));
    file_request(
        state.path(),
        "codex",
        1,
        Ask::Push {
            repo: "app".into(),
            git_ref: "refs/heads/fix".into(),
        },
    );
    bottle(state.path())
        .arg("requests")
        .assert()
        .success()
        .stdout(predicate::str::contains("ID"))
        .stdout(
            predicate::str::is_match(r"claude-1\s+bot-bottle-claude\s+egress\s+docs\.rs\s+pending")
                .unwrap(),
        )
        .stdout(predicate::str::contains("codex-1"))
        .stdout(predicate::str::contains("app refs/heads/fix"));

    let output = bottle(state.path())
        .args(["requests", "claude", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let list: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "only that bottle's");
    assert_eq!(list[0]["id"], "claude-1");
    assert_eq!(list[0]["kind"], "egress");
    assert_eq!(list[0]["detail"]["host"], "docs.rs");
    assert_eq!(list[0]["status"], "pending");
}

#[test]
fn approve_records_the_decision_once() {
    let state = temp_state_root();
    let dir = file_request(state.path(), "claude", 1, egress("docs.rs"));
    bottle(state.path())
        .args(["approve", "claude-1"])
        .assert()
        .success()
        .stdout(predicate::str::contains("approved claude-1"))
        .stdout(predicate::str::contains("docs.rs is allowed"));
    let decision = requests::read_decision(&dir, "claude-1").unwrap().unwrap();
    assert_eq!(decision.decision, Status::Approved);

    bottle(state.path())
        .arg("requests")
        .assert()
        .success()
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains("no pending requests"));
    bottle(state.path())
        .args(["requests", "--all"])
        .assert()
        .success()
        .stdout(predicate::str::contains("approved"));

    // A decision is final.
    bottle(state.path())
        .args(["deny", "claude-1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-Q003]"))
        .stderr(predicate::str::contains("already approved"));
    assert_eq!(
        requests::read_decision(&dir, "claude-1")
            .unwrap()
            .unwrap()
            .decision,
        Status::Approved
    );
}

#[test]
fn deny_keeps_the_reason_for_the_agent() {
    let state = temp_state_root();
    let dir = file_request(
        state.path(),
        "claude",
        2,
        Ask::Notify {
            message: "tests pass".into(),
        },
    );
    bottle(state.path())
        .args(["deny", "claude-2", "--reason", "use the mirror"])
        .assert()
        .success()
        .stdout(predicate::str::contains("denied claude-2"));
    let request = requests::read_request(&dir, "claude-2").unwrap().unwrap();
    assert_eq!(request.status, Status::Denied);
    assert_eq!(request.decision_reason.as_deref(), Some("use the mirror"));
}

#[test]
fn unknown_or_malformed_ids_are_one_clear_error() {
    let state = temp_state_root();
    file_request(state.path(), "claude", 1, egress("docs.rs"));
    bottle(state.path())
        .args(["approve", "claude-9"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "error[BOT-Q001]: no request claude-9",
        ))
        .stderr(predicate::str::contains("fix: run `bottle requests`"));
    bottle(state.path())
        .args(["approve", "../../etc/passwd"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-Q002]"));
    // Nothing was decided by the failed attempts.
    assert_eq!(
        requests::pending(&requests::requests_dir(
            &state.path().join("bottle").join("claude")
        ))
        .unwrap()
        .len(),
        1
    );
}

#[test]
fn agent_text_cannot_forge_table_rows() {
    let state = temp_state_root();
    file_request(
        state.path(),
        "claude",
        1,
        Ask::Notify {
            message: "hi\nclaude-2  bot-bottle-x  egress  evil  approved".into(),
        },
    );
    let output = bottle(state.path()).arg("requests").output().unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
}
