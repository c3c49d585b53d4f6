//! `Bottle::execute`: tool calls through the in-box agent, over one
//! attached exec kept for the bottle's life.

use std::time::Duration;

use bottle_core::sandbox::{SandboxError, ToolCall};
use bottle_core::{BottleBackend, Coded};

use crate::support::{self, name, sh};

/// How many `/.bottle/toolbox` processes run in the box.
fn toolbox_processes(bottle: &dyn bottle_core::Bottle) -> usize {
    let out = sh(
        bottle,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^/.bottle/toolbox' || true",
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The box's listening sockets: TCP (v4 and v6) in state LISTEN (`0A`) and
/// unix sockets that accept connections (flag `00010000`).
fn listeners(bottle: &dyn bottle_core::Bottle) -> String {
    let out = sh(
        bottle,
        "awk '$4 == \"0A\"' /proc/net/tcp /proc/net/tcp6; awk '$4 == \"00010000\"' /proc/net/unix",
    );
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[test]
fn tool_calls_run_through_one_in_box_agent_as_the_agents_user() {
    let test = "tool_calls_run_through_one_in_box_agent_as_the_agents_user";
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        support::unavailable(
            test,
            "BOTTLE_TOOLBOX_BIN is not set (`cargo xtask dist` builds the static bottle-toolbox)",
        );
        return;
    }
    let Some(fx) = support::setup(test) else {
        return;
    };
    let name = name("execute");
    let (_guard, bottle) = fx.start(&name);

    // The launch put the agent there, root's and read-only to the agent.
    let installed = sh(&*bottle, "stat -c '%u %a' /.bottle/toolbox");
    assert_eq!(text(&installed.stdout), "0 755\n");
    let listening_before = listeners(&*bottle);
    assert_eq!(toolbox_processes(&*bottle), 0);

    // The exit code and both streams, kept apart.
    let result = bottle
        .execute(&ToolCall::argv([
            "sh",
            "-c",
            "echo to-out; echo to-err >&2; exit 3",
        ]))
        .unwrap();
    assert_eq!(result.exit_code, 3);
    assert_eq!(result.stdout, b"to-out\n");
    assert_eq!(result.stderr, b"to-err\n");

    // The call's evidence is in the bottle's audit log.
    let log = fx
        .state
        .path()
        .join(bottle_core::slug::slugify(&name).unwrap())
        .join("logs/audit.jsonl");
    let lines = std::fs::read_to_string(&log).unwrap();
    let recorded: Vec<serde_json::Value> = lines
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &serde_json::Value| l["daemon"] == "sandbox")
        .collect();
    assert_eq!(recorded.len(), 1, "{lines}");
    assert_eq!(recorded[0]["evidence"], result.evidence_hash.as_str());
    assert_eq!(recorded[0]["reason"], "exit_3");

    // Binary stdin comes back byte for byte.
    let mut cat = ToolCall::argv(["cat"]);
    cat.stdin = (0..=255u8).cycle().take(100_000).collect();
    let result = bottle.execute(&cat).unwrap();
    assert_eq!(result.exit_code, 0);
    assert_eq!(result.stdout, cat.stdin);

    // Environment and working directory.
    let mut env_cwd = ToolCall::argv(["sh", "-c", "echo \"$CALL_VAR\"; pwd"]);
    env_cwd
        .env
        .insert("CALL_VAR".into(), "from the call".into());
    env_cwd.cwd = Some("/tmp".into());
    let result = bottle.execute(&env_cwd).unwrap();
    assert_eq!(text(&result.stdout), "from the call\n/tmp\n");

    // The built-in tools.
    let written = bottle
        .execute(&ToolCall::tool(
            "write_file",
            serde_json::json!({"path": "/tmp/tool.txt", "content": "written by a tool\n"}),
        ))
        .unwrap();
    assert_eq!(written.exit_code, 0, "{}", text(&written.stderr));
    let read = bottle
        .execute(&ToolCall::tool(
            "read_file",
            serde_json::json!({"path": "/tmp/tool.txt"}),
        ))
        .unwrap();
    assert_eq!(text(&read.stdout), "written by a tool\n");

    // The agent's user, as `exec` runs it.
    let id = bottle.execute(&ToolCall::argv(["id", "-u"])).unwrap();
    let exec_id = sh(&*bottle, "id -u");
    assert_eq!(text(&id.stdout), text(&exec_id.stdout));
    assert_eq!(text(&id.stdout), "1000\n");

    // Past its deadline a call is killed, and its process is gone.
    let mut slow = ToolCall::argv(["sleep", "4321"]);
    slow.deadline = Duration::from_millis(300);
    let err = bottle.execute(&slow).unwrap_err();
    assert!(
        matches!(err, SandboxError::ToolTimeout { .. }),
        "{err}: {err:?}"
    );
    assert_eq!(err.code(), "BOT-X003");
    bottle_test_support::wait_until(
        "the timed-out call's process to be gone",
        Duration::from_secs(10),
        || {
            let ps = sh(
                &*bottle,
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
            );
            !text(&ps.stdout).contains("sleep 4321")
        },
    );

    // Every call so far went through one agent, which listens on nothing.
    assert_eq!(toolbox_processes(&*bottle), 1);
    assert_eq!(listeners(&*bottle), listening_before);

    // Letting the bottle go ends its agent; a bottle found by `attach`
    // starts its own.
    drop(bottle);
    let attached = fx.backend.attach(&format!("bot-bottle-{name}")).unwrap();
    bottle_test_support::wait_until(
        "the dropped bottle's agent to exit",
        Duration::from_secs(10),
        || toolbox_processes(&*attached) == 0,
    );
    let again = attached
        .execute(&ToolCall::argv(["echo", "again"]))
        .unwrap();
    assert_eq!(text(&again.stdout), "again\n");
    assert_eq!(toolbox_processes(&*attached), 1);
}
