//! `bottle serve` through the real binary: its socket (owner-only, never
//! taken from a live server, gone after SIGTERM), its JSON errors and
//! statuses, the Python client's calls written as bottle writes them, and
//! (Docker) boot, list and shutdown of a real bottle, and the Python
//! client's demo end to end.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt as _;
use bottle_core::sandbox::ToolCall;
use serde_json::{Value, json};

use crate::{bottle, repo_root};

const WAIT: Duration = Duration::from_secs(30);

/// A `bottle serve` child, ended with SIGTERM when dropped.
pub(crate) struct Serve {
    child: Child,
    socket: PathBuf,
}

impl Serve {
    /// `bottle serve --socket <dir>/serve.sock` with `state` as its state
    /// root, once its socket answers.
    fn start(state: &Path, dir: &Path, backend: Option<&str>) -> Serve {
        Serve::start_with(state, dir, backend, |_| {})
    }

    /// Like [`Serve::start`], with `adjust` run on the command first (the
    /// environment of a backend's double).
    pub(crate) fn start_with(
        state: &Path,
        dir: &Path,
        backend: Option<&str>,
        adjust: impl FnOnce(&mut std::process::Command),
    ) -> Serve {
        let socket = dir.join("run/serve.sock");
        let mut cmd = std::process::Command::cargo_bin("bottle").unwrap();
        cmd.env("XDG_STATE_HOME", state)
            .env_remove("BOT_BOTTLE_BACKEND")
            .env_remove("BOTTLE_MANIFEST")
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(backend) = backend {
            cmd.args(["--backend", backend]);
        }
        adjust(&mut cmd);
        let child = cmd.spawn().unwrap();
        let serve = Serve { child, socket };
        bottle_test_support::wait_until("bottle serve answers", WAIT, || {
            UnixStream::connect(&serve.socket).is_ok()
        });
        serve
    }

    /// One request, `Connection: close`; the status and the JSON body.
    fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Value) {
        let mut stream = UnixStream::connect(&self.socket).unwrap();
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: bottle\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let text = String::from_utf8(answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        (status, serde_json::from_str(body).unwrap())
    }

    fn error_code(answer: &(u16, Value)) -> (u16, &str) {
        (
            answer.0,
            answer.1["error"]["code"].as_str().unwrap_or("none"),
        )
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        bottle_test_support::wait_for("bottle serve ends on SIGTERM", WAIT, || {
            self.child.try_wait().unwrap()
        })
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.terminate();
        }
    }
}

#[test]
fn the_socket_is_owner_only_refuses_a_second_server_and_goes_with_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut serve = Serve::start(&state, dir.path(), None);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&serve.socket), 0o600);
    assert_eq!(mode(serve.socket.parent().unwrap()), 0o700);

    let second = bottle(&state)
        .args(["serve", "--socket"])
        .arg(&serve.socket)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("error[BOT-C041]"), "{stderr}");
    assert_eq!(serve.request("GET", "/v1/health", None).0, 200);

    assert!(serve.terminate().success());
    assert!(!serve.socket.exists(), "the socket outlived the server");
}

/// `bottle serve`'s bounds (`serve::conn`): a request head must be whole
/// within 10 s of its first byte, and 64 connections are held at once.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 64;

/// Whether the server closed `stream`: a read sees its end (or a reset).
fn closed_by_server(stream: &mut UnixStream) -> bool {
    let mut buf = [0u8; 256];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn half_sent_heads_are_closed_and_connections_past_the_bound_wait_their_turn() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let serve = Serve::start(&state, dir.path(), None);
    // Every slot held by a client that stopped half-way through its head.
    let started = std::time::Instant::now();
    let mut stalled: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let mut s = UnixStream::connect(&serve.socket).unwrap();
            s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: bot")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            s
        })
        .collect();
    // The next one is not served while they hold the slots...
    let mut waiting = UnixStream::connect(&serve.socket).unwrap();
    waiting
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: bottle\r\nConnection: close\r\n\r\n")
        .unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut answer = Vec::new();
    let early = waiting.read_to_end(&mut answer);
    assert!(
        early.is_err() && answer.is_empty(),
        "served past the bound: {early:?} {:?}",
        String::from_utf8_lossy(&answer)
    );
    // ...the server closes every stalled one once its head is overdue...
    bottle_test_support::wait_until(
        "the stalled connections to be closed",
        HEAD_TIMEOUT + Duration::from_secs(5),
        || {
            stalled.retain_mut(|s| !closed_by_server(s));
            stalled.is_empty()
        },
    );
    let took = started.elapsed();
    assert!(took >= HEAD_TIMEOUT - Duration::from_secs(1), "{took:?}");
    // ...and the waiting one gets its turn.
    waiting
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    answer.clear();
    waiting.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(serve.request("GET", "/v1/health", None).0, 200);
}

#[test]
fn a_request_whose_body_is_coming_is_not_cut_at_the_heads_bound() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let serve = Serve::start(&state, dir.path(), None);
    // The head promises a body that is slow to come: the request is being
    // answered, so the head's bound does not cut it (its body has a bound of
    // its own, 60 s, answered with a 408 `BOT-C048`), and other clients
    // are served meanwhile.
    let mut slow = UnixStream::connect(&serve.socket).unwrap();
    slow.write_all(b"POST /v1/bottles HTTP/1.1\r\nHost: bottle\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    slow.set_read_timeout(Some(HEAD_TIMEOUT + Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 64];
    let waited = slow.read(&mut buf);
    assert!(
        matches!(&waited, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a request whose body is on its way was cut at the head's bound: {waited:?}"
    );
    assert_eq!(serve.request("GET", "/v1/health", None).0, 200);
}

#[test]
fn errors_are_json_with_a_code_and_a_fitting_status() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let serve = Serve::start(&state, dir.path(), None);

    let health = serve.request("GET", "/v1/health", None);
    assert_eq!((health.0, &health.1["status"]), (200, &json!("ok")));

    let cases: [(&str, &str, &[u8], u16, &str); 6] = [
        (
            "POST",
            "/v1/bottles/x/execute",
            b"{not json",
            400,
            "BOT-C042",
        ),
        // A call without its deadline is not a call.
        (
            "POST",
            "/v1/bottles/x/execute",
            br#"{"command":{"argv":["true"]}}"#,
            400,
            "BOT-C042",
        ),
        (
            "POST",
            "/v1/bottles",
            br#"{"manifest":"bottle.toml","agent":"a"}"#,
            400,
            "BOT-C042",
        ),
        (
            "POST",
            "/v1/bottles",
            br#"{"manifest":"/nowhere/bottle.toml","agent":"a"}"#,
            400,
            "BOT-M001",
        ),
        (
            "POST",
            "/v1/bottles/Not..A..Name/reset",
            b"",
            404,
            "BOT-C004",
        ),
        ("GET", "/v2/bottles", b"", 404, "BOT-C045"),
    ];
    for (method, path, body, status, code) in cases {
        let answer = serve.request(method, path, Some(body));
        assert_eq!(
            Serve::error_code(&answer),
            (status, code),
            "{method} {path}: {}",
            answer.1
        );
        assert!(answer.1["error"]["fix"].is_string(), "{}", answer.1);
    }

    // A declared body over the limit is refused before it is sent.
    let mut stream = UnixStream::connect(&serve.socket).unwrap();
    stream
        .write_all(b"POST /v1/bottles/x/execute HTTP/1.1\r\nHost: bottle\r\nContent-Length: 100000000\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 413");
}

#[test]
fn the_python_client_writes_calls_as_bottle_does() {
    let mut call = ToolCall::tool(
        "write_file",
        json!({"z": 1, "path": "/tmp/é", "content": "a\u{1}\n\"/\u{7f}", "list": [true, null]}),
    );
    call.env.insert("B".into(), "2".into());
    call.env.insert("A".into(), "\u{e9}".into());
    call.cwd = Some("/tmp".into());
    call.stdin = vec![0, 255, 10];
    call.deadline = Duration::from_millis(1500);
    let script = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
import sandbox_client as c
call = json.loads(sys.stdin.read())
body = c.call_json(call["command"], call["env"], call["cwd"],
                   __import__("base64").b64decode(call["stdin"]), call["deadline"])
sys.stdout.buffer.write(body + b"\n")
sys.stdout.buffer.write(c.evidence_hash(body, 3, b"out", b"err", True).encode())
"#;
    let serde = serde_json::to_vec(&call).unwrap();
    let out = assert_cmd::Command::new("python3")
        .args(["-c", script])
        .arg(repo_root().join("examples"))
        .write_stdin(serde.clone())
        .output()
        .expect("python3 runs (.ci/setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (python, hash) = text.split_once('\n').unwrap();
    assert_eq!(python.as_bytes(), serde.as_slice());
    assert_eq!(
        hash,
        bottle_core::sandbox::evidence_hash(&call, 3, b"out", b"err", true)
    );
}

/// A docker world: the demo agent image and a manifest with the agent
/// `echo`, or a printed skip.
struct DockerWorld {
    dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

const IMAGE: &str = "bottle-demo-agent:cli-serve";

impl DockerWorld {
    fn setup(test: &str) -> Option<DockerWorld> {
        let serial = crate::one_launch_at_a_time();
        crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN", "BOTTLE_TOOLBOX_BIN"])?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bottle.toml"),
            format!(
                "[agents.echo]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\", \"-c\", \"sleep 100000\"]\n\n[agents.echo.egress]\nallow = [\"api.example.com\"]\n"
            ),
        )
        .unwrap();
        Some(DockerWorld {
            dir,
            _serial: serial,
        })
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn manifest(&self) -> PathBuf {
        self.dir.path().join("bottle.toml")
    }

    /// Stops `name` with the CLI when dropped, whatever the test did.
    fn stop_on_drop(&self, name: &str) -> impl Drop + '_ {
        struct Stop<'a>(&'a DockerWorld, String);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                let _ = bottle(&self.0.state())
                    .args(["--backend", "docker", "--quiet", "stop", "--wait", &self.1])
                    .output();
            }
        }
        Stop(self, name.to_string())
    }
}

fn listed(serve: &Serve) -> Vec<String> {
    let (status, list) = serve.request("GET", "/v1/bottles", None);
    assert_eq!(status, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

/// Waits (bounded) until `full` is no longer listed, failing if it is
/// listed in any state but `stopping` meanwhile: a shut-down bottle runs
/// nothing.
fn wait_until_unlisted(serve: &Serve, full: &str) {
    bottle_test_support::wait_until(
        &format!("{full} to be gone"),
        std::time::Duration::from_secs(60),
        || {
            let (status, list) = serve.request("GET", "/v1/bottles", None);
            assert_eq!(status, 200, "{list}");
            let this = list
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["name"] == full)
                .cloned();
            if let Some(this) = &this {
                assert_eq!(
                    this["state"], "stopping",
                    "{full} after its shutdown: {this}"
                );
            }
            this.is_none()
        },
    );
}

#[test]
fn boot_list_and_shutdown_a_docker_bottle() {
    let test = "boot_list_and_shutdown_a_docker_bottle";
    let Some(world) = DockerWorld::setup(test) else {
        return;
    };
    let serve = Serve::start(&world.state(), world.dir.path(), Some("docker"));
    let name = format!("serve-{}", std::process::id());
    let _stop = world.stop_on_drop(&name);
    let boot = json!({"manifest": world.manifest(), "agent": "echo", "name": name});
    let (status, booted) = serve.request("POST", "/v1/bottles", Some(boot.to_string().as_bytes()));
    assert_eq!(status, 200, "{booted}");
    let full = format!("bot-bottle-{name}");
    assert_eq!(booted["name"], full.as_str());
    assert!(listed(&serve).contains(&full));

    let unknown = json!({"manifest": world.manifest(), "agent": "nope"});
    let refused = serve.request("POST", "/v1/bottles", Some(unknown.to_string().as_bytes()));
    assert_eq!(refused.0, 400, "{}", refused.1);

    let gone = serve.request(
        "POST",
        "/v1/bottles/serve-never-booted/execute",
        Some(br#"{"command":{"argv":["true"]},"deadline":1000}"#),
    );
    assert_eq!(gone.0, 404, "{}", gone.1);

    let (status, stopped) = serve.request("DELETE", &format!("/v1/bottles/{name}"), None);
    assert_eq!(status, 200, "{stopped}");
    // `stop` returns with the boxes gone; the rest follows, listed as
    // stopping until then.
    wait_until_unlisted(&serve, &full);
    let again = serve.request("DELETE", &format!("/v1/bottles/{name}"), None);
    assert_eq!(again.0, 404, "{}", again.1);
}

/// The IDs of the execs the Engine lists for `container` (`None`: no such
/// container) and whether it is paused.
fn execs_of(container: &str) -> Option<(Vec<String>, bool)> {
    let engine = bottle_docker::client::Engine::connect(None).unwrap();
    let inspect = engine
        .block_on(engine.docker.inspect_container(container, None))
        .ok()?;
    let paused = inspect.state.and_then(|state| state.paused) == Some(true);
    Some((inspect.exec_ids.unwrap_or_default(), paused))
}

#[test]
fn the_server_prepares_the_next_reset_beside_its_calls_with_the_channel_open() {
    let test = "the_server_prepares_the_next_reset_beside_its_calls_with_the_channel_open";
    let Some(world) = DockerWorld::setup(test) else {
        return;
    };
    let serve = Serve::start(&world.state(), world.dir.path(), Some("docker"));
    let name = format!("serve-ahead-{}", std::process::id());
    let _stop = world.stop_on_drop(&name);
    let boot = json!({"manifest": world.manifest(), "agent": "echo", "name": name});
    let (status, booted) = serve.request("POST", "/v1/bottles", Some(boot.to_string().as_bytes()));
    assert_eq!(status, 200, "{booted}");
    let standby = format!("bot-bottle-{name}-agent-standby");
    let agent = format!("bot-bottle-{name}-agent");
    let call = || {
        let (status, result) = serve.request(
            "POST",
            &format!("/v1/bottles/{name}/execute"),
            Some(br#"{"command":{"argv":["true"]},"deadline":10000}"#),
        );
        assert_eq!((status, &result["exit_code"]), (200, &json!(0)), "{result}");
    };
    let reset = || {
        let (status, report) = serve.request("POST", &format!("/v1/bottles/{name}/reset"), None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["verified"], true, "{report}");
        report["method"].as_str().unwrap().to_string()
    };
    // Waits (bounded) for a paused standby with `execs` execs; its IDs.
    let standby_waits = |execs: usize| {
        let mut ids = Vec::new();
        bottle_test_support::wait_until(
            &format!("a paused standby with {execs} exec(s)"),
            Duration::from_secs(60),
            || match execs_of(&standby) {
                Some((found, true)) if found.len() == execs => {
                    ids = found;
                    true
                }
                _ => false,
            },
        );
        ids
    };

    // The worker calls; the standby `start` had prepared (a process of
    // its own, no channel) is swapped in.
    call();
    standby_waits(0);
    assert_eq!(reset(), "standby");
    // The worker prepares the next one itself, its in-box agent started
    // with the worker's channel open.
    let ahead = standby_waits(1);
    assert_eq!(reset(), "standby");
    call();
    call();
    assert_eq!(
        execs_of(&agent).map(|(execs, _)| execs),
        Some(ahead),
        "the calls after the reset made an exec of their own"
    );
    // The worker's preparation says so in the bottle's log (once it is
    // done: after the standby it recorded, it removes the retired box).
    let log = world
        .state()
        .join(format!("bottle/{name}/golden/prepare.log"));
    bottle_test_support::wait_until("the preparation's line", Duration::from_secs(60), || {
        std::fs::read_to_string(&log).is_ok_and(|log| log.contains("channel open"))
    });

    let (status, stopped) = serve.request("DELETE", &format!("/v1/bottles/{name}"), None);
    assert_eq!(status, 200, "{stopped}");
    wait_until_unlisted(&serve, &format!("bot-bottle-{name}"));
}

/// Runs `examples/sandbox_client.py`'s demo against `serve`, booting agent
/// `agent` of `manifest` as bottle `name`, and checks every step passed.
pub(crate) fn run_python_demo(serve: &Serve, manifest: &Path, agent: &str, name: &str) {
    let out = assert_cmd::Command::new("python3")
        .arg(repo_root().join("examples/sandbox_client.py"))
        .arg("--socket")
        .arg(&serve.socket)
        .arg("--manifest")
        .arg(manifest)
        .args(["--agent", agent, "--name", name])
        .timeout(Duration::from_secs(600))
        .output()
        .expect("python3 runs (.ci/setup installs it)");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for step in [
        "booted",
        "echo: hello from the bottle",
        "sleep 30: killed at its deadline (BOT-X003)",
        "reset: verified",
        "is gone",
        "shut down",
        "ok",
    ] {
        assert!(stdout.contains(step), "no {step:?} in:\n{stdout}");
    }
}

#[test]
fn the_python_client_demo_runs_against_a_docker_bottle() {
    let test = "the_python_client_demo_runs_against_a_docker_bottle";
    let Some(world) = DockerWorld::setup(test) else {
        return;
    };
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        bottle_test_support::skip_docker_test(test, "BOTTLE_TOOLBOX_BIN is not set");
        return;
    }
    let serve = Serve::start(&world.state(), world.dir.path(), Some("docker"));
    let name = format!("serve-py-{}", std::process::id());
    let _stop = world.stop_on_drop(&name);
    run_python_demo(&serve, &world.manifest(), "echo", &name);
    wait_until_unlisted(&serve, &format!("bot-bottle-{name}"));
}
