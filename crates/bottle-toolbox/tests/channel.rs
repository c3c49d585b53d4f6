//! The host's end (`bottle_core::sandbox::Toolbox`) driving the real
//! in-box agent as a child process, over its stdin and stdout: the same
//! channel a backend opens inside a box.

#![expect(
    clippy::unwrap_used,
    reason = "test harness helpers outside #[test] fns: a failure must fail the test loudly"
)]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bottle_core::Coded;
use bottle_core::sandbox::{SandboxError, ToolCall, Toolbox, ToolboxStream};

fn spawn_agent() -> (Child, ToolboxStream) {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test holds the agent's pipes and kills it, as a backend's stream would end"
    )]
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_bottle-toolbox"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stream = ToolboxStream {
        to_agent: Box::new(child.stdin.take().unwrap()),
        from_agent: Box::new(child.stdout.take().unwrap()),
    };
    (child, stream)
}

fn toolbox(log: Option<std::path::PathBuf>) -> (Toolbox, std::sync::Mutex<Vec<Child>>) {
    (
        Toolbox::new("bot-bottle-test", log),
        std::sync::Mutex::new(Vec::new()),
    )
}

fn open(
    children: &std::sync::Mutex<Vec<Child>>,
) -> impl FnOnce() -> Result<ToolboxStream, SandboxError> + '_ {
    move || {
        let (child, stream) = spawn_agent();
        children.lock().unwrap().push(child);
        Ok(stream)
    }
}

#[test]
fn calls_run_with_their_stdin_env_and_cwd_and_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let (toolbox, children) = toolbox(Some(log.clone()));
    let mut call = ToolCall::argv([
        "sh",
        "-c",
        "cat; printf ' %s %s' \"$GREETING\" \"$(pwd)\"; echo oops >&2; exit 3",
    ]);
    call.stdin = b"\x00binary\xff".to_vec();
    call.env.insert("GREETING".into(), "hello".into());
    call.cwd = Some(dir.path().to_str().unwrap().into());
    let result = toolbox.execute(&call, open(&children)).unwrap();
    let mut expected = b"\x00binary\xff hello ".to_vec();
    expected.extend_from_slice(dir.path().to_str().unwrap().as_bytes());
    assert_eq!(result.stdout, expected);
    assert_eq!(result.stderr, b"oops\n");
    assert_eq!(result.exit_code, 3);
    assert_eq!(
        result.evidence_hash,
        bottle_core::sandbox::evidence_hash(&call, 3, &result.stdout, &result.stderr, false)
    );
    // The second call reuses the agent.
    toolbox
        .execute(&ToolCall::argv(["true"]), open(&children))
        .unwrap();
    assert_eq!(children.lock().unwrap().len(), 1);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["evidence"], result.evidence_hash.as_str());
    assert_eq!(lines[0]["reason"], "exit_3");
}

#[test]
fn a_call_past_its_deadline_is_killed_with_what_it_started() {
    let (toolbox, children) = toolbox(None);
    let mut call = ToolCall::argv(["sh", "-c", "sleep 30 & sleep 30"]);
    call.deadline = Duration::from_millis(300);
    let started = Instant::now();
    let err = toolbox.execute(&call, open(&children)).unwrap_err();
    assert!(matches!(err, SandboxError::ToolTimeout { .. }), "{err}");
    assert_eq!(err.code(), "BOT-X003");
    // Bounded by the deadline, not by the background sleep holding stdout.
    assert!(started.elapsed() < Duration::from_secs(10));
    // The channel still works.
    let result = toolbox
        .execute(&ToolCall::argv(["echo", "after"]), open(&children))
        .unwrap();
    assert_eq!(result.stdout, b"after\n");
}

#[test]
fn bad_calls_are_tool_errors_and_builtins_run_without_a_program() {
    let dir = tempfile::tempdir().unwrap();
    let (toolbox, children) = toolbox(None);
    let missing = toolbox
        .execute(&ToolCall::argv(["/nonexistent/program"]), open(&children))
        .unwrap_err();
    assert_eq!(missing.code(), "BOT-X004");
    let unknown = toolbox
        .execute(
            &ToolCall::tool("format_disk", serde_json::json!({})),
            open(&children),
        )
        .unwrap_err();
    assert!(
        unknown.to_string().contains("no built-in tool"),
        "{unknown}"
    );
    let path = dir.path().join("notes.txt");
    let wrote = toolbox
        .execute(
            &ToolCall::tool(
                "write_file",
                serde_json::json!({"path": path, "content": "one\n"}),
            ),
            open(&children),
        )
        .unwrap();
    assert_eq!(wrote.exit_code, 0);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");
    // One agent served all of them.
    assert_eq!(children.lock().unwrap().len(), 1);
}

#[test]
fn the_agent_counts_open_descriptors_and_a_dead_agent_is_replaced() {
    let (toolbox, children) = toolbox(None);
    let fds = toolbox.count_open_fds(open(&children)).unwrap();
    assert!(fds.processes > 0 && fds.count > 0, "{fds:?}");
    children.lock().unwrap()[0].kill().unwrap();
    children.lock().unwrap()[0].wait().unwrap();
    let err = toolbox
        .execute(&ToolCall::argv(["true"]), open(&children))
        .unwrap_err();
    assert_eq!(err.code(), "BOT-X004");
    toolbox
        .execute(&ToolCall::argv(["true"]), open(&children))
        .unwrap();
    assert_eq!(children.lock().unwrap().len(), 2);
}

/// One of the agent's processes (left behind by a call, as the call's own
/// user) tries to write forged answers into the in-box agent's stdout:
/// during a call, and ahead of later ones on the kept channel. It is
/// refused, while the same write into a process of its own uid works, and
/// every call returns its real result.
#[test]
fn an_agent_process_cannot_forge_or_plant_a_result() {
    use bottle_test_support::forge;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("forge.log");
    let attack = forge::attack_script(
        env!("CARGO_BIN_EXE_bottle-toolbox"),
        log.to_str().unwrap(),
        12,
        "0.1",
    );
    let (toolbox, children) = toolbox(None);
    let call = ToolCall::argv([
        "sh".to_string(),
        "-c".to_string(),
        format!("( {attack} ) > /dev/null 2>&1 & sleep 0.3; echo real-output; exit 3"),
    ]);
    let result = toolbox.execute(&call, open(&children)).unwrap();
    assert_eq!(
        (result.exit_code, &result.stdout[..]),
        (3, &b"real-output\n"[..])
    );
    // Later calls on the same channel while the attack goes on.
    let mut said = String::new();
    bottle_test_support::wait_until("the attack to finish", Duration::from_secs(30), || {
        let result = toolbox
            .execute(&ToolCall::argv(["echo", "real-later"]), open(&children))
            .unwrap();
        assert_eq!(result.stdout, b"real-later\n");
        said = std::fs::read_to_string(&log).unwrap_or_default();
        said.ends_with("done\n")
    });
    assert_eq!(
        children.lock().unwrap().len(),
        1,
        "the channel was never broken"
    );
    assert!(!said.contains("toolbox: not found"), "{said}");
    assert!(
        said.lines()
            .filter(|l| l.starts_with("toolbox"))
            .all(|l| l.ends_with(": denied")),
        "{said}"
    );
    assert!(said.contains("control: wrote\n"), "{said}");
    assert!(!said.contains("control: denied"), "{said}");
}

/// Calls inherit the in-box agent's state: no capability, no way to gain
/// one (the agent gives up what it was started with: as root here).
#[test]
fn calls_hold_no_capability_and_cannot_gain_one() {
    let (toolbox, children) = toolbox(None);
    let result = toolbox
        .execute(
            &ToolCall::argv([
                "sh",
                "-c",
                "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status",
            ]),
            open(&children),
        )
        .unwrap();
    let status = String::from_utf8(result.stdout).unwrap();
    for line in status.lines() {
        let (field, value) = line.split_once(':').unwrap();
        let expected = if field == "NoNewPrivs" {
            "1"
        } else {
            "0000000000000000"
        };
        assert_eq!(value.trim(), expected, "{status}");
    }
    assert_eq!(status.lines().count(), 6, "{status}");
}

/// `bottle-toolbox connect PORT` with its stdin and stdout piped, as a
/// backend's exec would carry them.
fn spawn_relay(port: u16) -> Child {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test holds the relay's pipes, as a backend's exec stream would"
    )]
    std::process::Command::new(env!("CARGO_BIN_EXE_bottle-toolbox"))
        .args(["connect", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A published port's in-box end: the status line, then the connection's
/// bytes both ways; the client's end of input reaches the server as a
/// half-close and the server's answer still comes back.
#[test]
fn the_relay_connects_to_the_boxs_loopback_and_copies_both_ways() {
    use std::io::{Read as _, Write as _};
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let served = std::thread::spawn(move || {
        let (mut conn, peer) = server.accept().unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        conn.write_all(b"you said: ").unwrap();
        conn.write_all(&got).unwrap();
        peer
    });
    let mut relay = spawn_relay(port);
    let mut stdin = relay.stdin.take().unwrap();
    stdin.write_all(b"hello\x00world").unwrap();
    drop(stdin);
    let mut out = Vec::new();
    relay.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    assert!(relay.wait().unwrap().success());
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!(
            "{}\nyou said: hello\u{0}world",
            bottle_core::port_relay::CONNECTED
        )
    );
    assert!(served.join().unwrap().ip().is_loopback());
}

/// A port nothing listens on is said at once, on the status line, and the
/// relay exits: no hang.
#[test]
fn a_port_nothing_listens_on_is_refused_at_once() {
    use bottle_core::port_relay::{RelayStatus, read_status};
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let started = Instant::now();
    let mut relay = spawn_relay(port);
    let mut stdout = relay.stdout.take().unwrap();
    let status = read_status(&mut stdout).unwrap();
    assert!(
        matches!(&status, RelayStatus::Refused(why) if why.contains(&format!("port {port}"))),
        "{status:?}"
    );
    assert_eq!(relay.wait().unwrap().code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(5));
}
