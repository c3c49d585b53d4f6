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

    // The launch put the agent there, execute-only, on a read-only mount.
    let installed = sh(&*bottle, "stat -c '%a' /.bottle/toolbox");
    assert_eq!(text(&installed.stdout), "111\n");
    let mounted = sh(&*bottle, "grep ' /.bottle ' /proc/mounts");
    assert!(text(&mounted.stdout).contains(" ro,"), "{mounted:?}");
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

    // Not even root in the box (which owns `/`) can put a program of its
    // own where the host starts the in-box agent: the mount can be neither
    // written nor renamed away.
    let docker_bottle = fx
        .backend
        .attach_bottle(&format!("bot-bottle-{name}"))
        .unwrap();
    let engine = fx.backend.engine().unwrap();
    for attempt in [
        "rm -f /.bottle/toolbox",
        "cp /bin/sh /.bottle/toolbox",
        "mv /.bottle /bottle-moved",
        "chmod 755 /.bottle/toolbox",
    ] {
        let tried = engine
            .block_on(bottle_docker::bottle::exec_captured(
                engine,
                docker_bottle.container(),
                &["sh".to_string(), "-c".to_string(), attempt.to_string()],
                Some("0:0"),
            ))
            .unwrap();
        assert_ne!(tried.exit_code, 0, "{attempt} worked as root in the box");
    }
    // The agent may end the in-box agent (its own user's process): the
    // call in flight fails, and the next one starts the one from the mount
    // again.
    let killed = sh(
        &*attached,
        "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline)\" in '/.bottle/toolbox '*) kill -9 ${p#/proc/};; esac; done",
    );
    assert_eq!(killed.exit_code, 0, "{}", text(&killed.stderr));
    bottle_test_support::wait_until("the in-box agent to die", Duration::from_secs(10), || {
        toolbox_processes(&*attached) == 0
    });
    let err = attached
        .execute(&ToolCall::argv(["echo", "lost"]))
        .unwrap_err();
    assert_eq!(err.code(), "BOT-X004", "{err}");
    let again = attached
        .execute(&ToolCall::argv(["echo", "still"]))
        .unwrap();
    assert_eq!(text(&again.stdout), "still\n");

    // A bottle whose container is gone cannot start an agent; that is not
    // a bottle without one (BOT-X001). The first call finds its channel
    // broken, the next one the container gone.
    fx.backend.stop(&format!("bot-bottle-{name}")).unwrap();
    assert!(attached.execute(&ToolCall::argv(["true"])).is_err());
    let err = attached.execute(&ToolCall::argv(["true"])).unwrap_err();
    assert_eq!(err.code(), "BOT-X002", "{err}");
}

/// What a forging attack's log says, once its last round is done.
fn attack_log(bottle: &dyn bottle_core::Bottle, log: &str) -> String {
    let mut said = String::new();
    bottle_test_support::wait_until("the attack to finish", Duration::from_secs(30), || {
        said = text(&sh(bottle, &format!("cat {log} 2>/dev/null")).stdout).to_string();
        said.ends_with("done\n")
    });
    said
}

/// A call's outcome: the real one, or a `BOT-X` error; never the forged.
fn real_or_refused(
    outcome: Result<bottle_core::sandbox::ToolResult, SandboxError>,
    real: &[u8],
    exit_code: i32,
) {
    match outcome {
        Ok(result) => {
            assert!(
                !text(&result.stdout).contains(bottle_test_support::forge::FORGED),
                "a forged result was taken: {result:?}"
            );
            assert_eq!((result.exit_code, &result.stdout[..]), (exit_code, real));
        }
        Err(err) => assert!(err.code().starts_with("BOT-X"), "{err}"),
    }
}

#[test]
fn the_agent_cannot_forge_or_plant_a_tool_result() {
    let test = "the_agent_cannot_forge_or_plant_a_tool_result";
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
    let name = name("forge");
    let (_guard, bottle) = fx.start(&name);
    the_agent_is_kept_off_the_channel(&*bottle);
}

/// The forged-result and planted-frame attacks of issue 25 against
/// `bottle`'s in-box agent (a container's or a gVisor box's).
pub(crate) fn the_agent_is_kept_off_the_channel(bottle: &dyn bottle_core::Bottle) {
    // The attack of issue 25, from inside the call itself: while the call
    // runs, the agent (the call's own user) writes a forged answer into
    // the in-box agent's stdout, then the call prints its real output.
    let attack = bottle_test_support::forge::attack_script(
        bottle_test_support::forge::IN_BOX,
        "/tmp/forge.log",
        1,
        "0",
    );
    let call = ToolCall::argv([
        "sh".to_string(),
        "-c".to_string(),
        format!("( {attack} ) > /dev/null 2>&1 & sleep 0.3; echo real-output; exit 3"),
    ]);
    real_or_refused(bottle.execute(&call), b"real-output\n", 3);
    let said = attack_log(bottle, "/tmp/forge.log");
    // The attack found the in-box agent and was refused; the same write
    // to a process of its own uid went through, so the method works.
    assert!(
        said.contains(": denied\n") && !said.contains("toolbox: not found"),
        "{said}"
    );
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with("toolbox") && l.ends_with("wrote")),
        "{said}"
    );
    assert!(said.contains("control: wrote\n"), "{said}");

    // Planted ahead: a process the first call leaves behind keeps writing
    // forged answers into the channel the bottle keeps open, while later
    // calls (a program, then a built-in tool) are sent.
    let attack = bottle_test_support::forge::attack_script(
        bottle_test_support::forge::IN_BOX,
        "/tmp/plant.log",
        10,
        "0.1",
    );
    let planter = ToolCall::argv([
        "sh".to_string(),
        "-c".to_string(),
        format!("( {attack} ) > /dev/null 2>&1 &"),
    ]);
    real_or_refused(bottle.execute(&planter), b"", 0);
    for _ in 0..5 {
        real_or_refused(
            bottle.execute(&ToolCall::argv(["echo", "real-later"])),
            b"real-later\n",
            0,
        );
        real_or_refused(
            bottle.execute(&ToolCall::tool(
                "read_file",
                serde_json::json!({"path": "/etc/hostname"}),
            )),
            &sh(bottle, "cat /etc/hostname").stdout,
            0,
        );
    }
    let said = attack_log(bottle, "/tmp/plant.log");
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with("toolbox") && l.ends_with("wrote")),
        "{said}"
    );
    assert!(said.contains("control: wrote\n"), "{said}");
}
