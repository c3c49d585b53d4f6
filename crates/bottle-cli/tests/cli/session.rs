//! A detached bottle's agent session through the real `bottle` binary, on
//! the docker backend and on smolmachines against `fake-smolvm`: `start -d`
//! runs the agent under a holder that outlives it, `attach` joins it
//! (through a pty this test opens, and without a terminal), the detach key
//! leaves the agent running, a resize reaches it, its exit is kept, and
//! `stop` ends the holder.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image) and
//! `BOTTLE_BUNDLE_BIN`; skips with a line unless `BOTTLE_REQUIRE_DOCKER=1`.
//! The smolmachines runs set up `fake-smolvm` as `smolmachines.rs` does.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt as _;
use bottle_test_support::{wait_for, wait_until};
use predicates::prelude::*;
use serde_json::Value;

use crate::bottle;

const WAIT: Duration = Duration::from_secs(60);
const IMAGE: &str = "bottle-demo-agent:cli-session";

/// The agent: a marker, then each input line echoed; `size` runs `stty
/// size`, `quit` exits 7.
const AGENT: &str = "echo agent-ready-marker; while read line; do case $line in size) stty size ;; quit) exit 7 ;; *) echo got:$line ;; esac; done";

/// Where a world's bottle runs.
enum Backend {
    Docker,
    /// The smolmachines backend, with this `fake-smolvm` as `smolvm`.
    FakeSmolvm(PathBuf),
}

struct World {
    dir: tempfile::TempDir,
    name: String,
    backend: Backend,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl World {
    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.state());
        cmd.arg("--manifest")
            .arg(self.dir.path().join("bottle.toml"));
        match &self.backend {
            Backend::Docker => cmd.args(["--backend", "docker"]),
            Backend::FakeSmolvm(fake) => {
                let root = self.dir.path();
                cmd.env("HOME", root.join("home"))
                    .env("XDG_CACHE_HOME", root.join("cache"))
                    .env("SMOLVM_DATA_DIR", root.join("smolvm"))
                    .env_remove("XDG_DATA_HOME")
                    .env("BOTTLE_SMOLVM", fake)
                    .env("BOTTLE_TEST_FAKE_SMOLVM_NO_KVM", "1")
                    .env("FAKE_SMOLVM_VERSION", "1.9.3")
                    .env("FAKE_SMOLVM_MODE", "")
                    .args(["--backend", "smolmachines"])
            }
        };
        cmd
    }

    /// `bottle attach` as a process whose stdio the test chooses.
    fn attach(&self, stdio: impl Fn() -> Stdio) -> Child {
        let mut cmd = std::process::Command::cargo_bin("bottle").unwrap();
        cmd.env("XDG_STATE_HOME", self.state())
            .env_remove("BOT_BOTTLE_BACKEND")
            .args(["attach", &self.name])
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .unwrap()
    }

    fn session_file(&self, file: &str) -> PathBuf {
        self.state()
            .join("bottle")
            .join(&self.name)
            .join("session")
            .join(file)
    }

    fn listed(&self) -> Value {
        let out = self.bottle().args(["--json", "list"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        all.into_iter()
            .find(|b| b["name"] == format!("bot-bottle-{}", self.name).as_str())
            .unwrap_or_else(|| panic!("{} is not listed", self.name))
    }
}

/// The world of `test`: its bottle on docker, or on smolmachines against
/// `fake-smolvm` when `fake_smolvm`; or a printed skip.
fn setup(test: &str, prefix: &str, fake_smolvm: bool) -> Option<World> {
    let serial = crate::one_launch_at_a_time();
    crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN"])?;
    let dir = tempfile::tempdir().unwrap();
    for sub in ["state", "home", "cache", "smolvm"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let backend = if fake_smolvm {
        let fake = crate::smolmachines::fake_smolvm();
        if !crate::smolmachines::sandbox_available_in(dir.path(), &fake, test) {
            return None;
        }
        Backend::FakeSmolvm(fake)
    } else {
        Backend::Docker
    };
    std::fs::write(
        dir.path().join("bottle.toml"),
        format!(
            "[agents.echo]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\", \"-c\", {AGENT:?}]\n\n[agents.echo.egress]\nallow = [\"api.example.com\"]\n"
        ),
    )
    .unwrap();
    Some(World {
        dir,
        name: format!("{prefix}-{}", std::process::id()),
        backend,
        _serial: serial,
    })
}

/// Everything read from `from`, as it arrives.
fn collect(mut from: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    seen
}

fn wait_for_text(seen: &Mutex<Vec<u8>>, text: &str) {
    wait_for_text_asking(seen, text, || {});
}

/// Like [`wait_for_text`], calling `ask` on every poll; names what was
/// seen when the text never comes.
fn wait_for_text_asking(seen: &Mutex<Vec<u8>>, text: &str, mut ask: impl FnMut()) {
    let shown = |seen: &Mutex<Vec<u8>>| String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    let found = bottle_test_support::eventually(WAIT, || {
        ask();
        shown(seen).contains(text)
    });
    assert!(found, "no {text:?} in the attach output: {:?}", shown(seen));
}

fn set_size(pty: &std::fs::File, rows: u16, cols: u16) {
    rustix::termios::tcsetwinsize(
        pty,
        rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .unwrap();
}

/// Asks the agent for its size every tenth poll (a fifth of a second), so
/// the answers cannot pile up faster than it gives them.
fn ask_size(pty: &std::fs::File, polls: &mut u32) {
    if polls.is_multiple_of(10) {
        let mut pty = pty;
        pty.write_all(b"size\r").unwrap();
    }
    *polls += 1;
}

/// A pty: the test's side, and the terminal side for `bottle attach`.
fn open_pty() -> (std::fs::File, std::os::fd::OwnedFd) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    (std::fs::File::from(master), slave)
}

fn holder_pid(world: &World) -> u32 {
    let holder: Value =
        serde_json::from_slice(&std::fs::read(world.session_file("holder.json")).unwrap()).unwrap();
    u32::try_from(holder["pid"].as_u64().unwrap()).unwrap()
}

/// Gone, or a zombie nobody reaped yet: either way it runs nothing.
pub(crate) fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_detached_agent_runs_in_a_session_that_attach_joins() {
    let test = "a_detached_agent_runs_in_a_session_that_attach_joins";
    if let Some(world) = setup(test, "session", false) {
        attach_round_trip(&world);
    }
}

#[test]
fn a_detached_agent_runs_in_a_session_that_attach_joins_on_smolmachines() {
    let test = "a_detached_agent_runs_in_a_session_that_attach_joins_on_smolmachines";
    if let Some(world) = setup(test, "session-vm", true) {
        attach_round_trip(&world);
    }
}

/// `start -d`, then attach through a terminal and without one, to the
/// agent's exit, then `stop`.
fn attach_round_trip(world: &World) {
    let _guard = scopeguard(world);
    let full = format!("bot-bottle-{}", world.name);

    // `start -d` returns (its process ends) with the name on stdout and the
    // next commands on stderr; the agent keeps running without it.
    world
        .bottle()
        .args(["--yes", "start", "echo", "--name", &world.name, "--detach"])
        .assert()
        .success()
        .stdout(format!("{full}\n"))
        .stderr(predicate::str::contains(format!("bottle attach {full}")))
        .stderr(predicate::str::contains(format!("bottle stop {full}")));
    assert_eq!(world.listed()["agent_running"], true);
    let holder = holder_pid(world);

    // Through a terminal: the marker, typed input and its echo, a resize,
    // then the detach key.
    let (pty, terminal) = open_pty();
    set_size(&pty, 30, 100);
    let mut attach = world.attach(|| Stdio::from(terminal.try_clone().unwrap()));
    drop(terminal);
    let seen = collect(pty.try_clone().unwrap());
    wait_for_text(&seen, "agent-ready-marker");
    (&pty).write_all(b"hello\r").unwrap();
    wait_for_text(&seen, "got:hello");
    let mut polls = 0;
    wait_for_text_asking(&seen, "30 100", || ask_size(&pty, &mut polls));
    set_size(&pty, 41, 123);
    wait_for_text_asking(&seen, "41 123", || ask_size(&pty, &mut polls));
    (&pty).write_all(b"\x10\x11").unwrap();
    let status = wait_for("attach to detach", WAIT, || attach.try_wait().unwrap());
    assert!(status.success(), "{status:?}");
    wait_for_text(&seen, "detached from");
    assert_eq!(
        world.listed()["agent_running"],
        true,
        "detaching ended the agent"
    );

    // Without a terminal: the scrollback first, then the relay; the agent
    // exits 7 and attach exits with it.
    let mut attach = world.attach(Stdio::piped);
    let seen = collect(attach.stdout.take().unwrap());
    wait_for_text(&seen, "got:hello");
    let mut stdin = attach.stdin.take().unwrap();
    stdin.write_all(b"again\n").unwrap();
    wait_for_text(&seen, "got:again");
    stdin.write_all(b"quit\n").unwrap();
    let status = wait_for("the agent to exit", WAIT, || attach.try_wait().unwrap());
    assert_eq!(status.code(), Some(7));
    wait_until("the holder to exit", WAIT, || !process_runs(holder));
    assert_eq!(world.listed()["agent_running"], false);

    // An exited agent: attach shows its last output and its code.
    let mut again = world.bottle();
    again
        .args(["attach", &world.name])
        .assert()
        .code(7)
        .stdout(predicate::str::contains("got:again"))
        .stderr(predicate::str::contains("exited with code 7"));

    world
        .bottle()
        .args(["stop", &world.name])
        .assert()
        .success();
}

#[test]
fn stop_ends_a_running_session_holder_that_kept_no_inherited_fd() {
    let test = "stop_ends_a_running_session_holder_that_kept_no_inherited_fd";
    let Some(world) = setup(test, "session-stop", false) else {
        return;
    };
    let _guard = scopeguard(&world);
    // Started the way `flock LOCK bottle start -d` or a shell holding a
    // file open starts it: with a descriptor inherited, not close-on-exec.
    let inherited = world.dir.path().join("inherited");
    let mut start = assert_cmd::Command::new("sh");
    start
        .env("XDG_STATE_HOME", world.state())
        .env_remove("BOT_BOTTLE_BACKEND")
        .args(["-c", "exec 9>>\"$0\"; exec \"$@\""])
        .arg(&inherited)
        .arg(assert_cmd::cargo::cargo_bin("bottle"))
        .arg("--manifest")
        .arg(world.dir.path().join("bottle.toml"))
        .args(["--backend", "docker", "--yes", "--quiet", "start", "echo"])
        .args(["--name", &world.name, "-d"]);
    start.assert().success();
    let holder = holder_pid(&world);
    assert!(process_runs(holder));
    let held: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{holder}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.unwrap().path()).ok())
        .collect();
    assert!(
        !held.contains(&inherited),
        "the holder kept the descriptor its starter inherited: {held:?}"
    );
    world
        .bottle()
        .args(["stop", &world.name])
        .assert()
        .success();
    // `stop` returns once the agent's container is gone; its finisher ends the
    // holder.
    wait_until("the session holder to end", WAIT, || !process_runs(holder));
    wait_until("the session's files to go", WAIT, || {
        !world.session_file("session.sock").exists()
    });
}

#[test]
fn attach_to_a_bottle_without_a_session_says_how() {
    let state = tempfile::tempdir().unwrap();
    // A bottle that does not exist is no bottle, not a missing session.
    bottle(state.path())
        .args(["attach", "nothing-here"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("BOT-C004"))
        .stderr(predicate::str::contains(
            "no bottle named bot-bottle-nothing-here",
        ));
    // A bottle (its state dir) started without a session.
    std::fs::create_dir_all(state.path().join("bottle").join("attached-one")).unwrap();
    bottle(state.path())
        .args(["attach", "attached-one"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("BOT-C013"))
        .stderr(predicate::str::contains(
            "bot-bottle-attached-one has no agent session",
        ))
        .stderr(predicate::str::contains("bottle start --detach"));
}

/// Stops the bottle when the test ends, however it ends.
fn scopeguard(world: &World) -> impl Drop + '_ {
    struct Stop<'a>(&'a World);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .bottle()
                .args(["--quiet", "stop", "--wait", &self.0.name])
                .output();
        }
    }
    Stop(world)
}

/// `start -d` of a command that is not in the image exits non-zero naming
/// the command and the Engine's cause, and leaves no bottle behind.
#[test]
fn a_detached_start_of_a_missing_command_fails_and_leaves_nothing() {
    let Some(world) = setup(
        "a_detached_start_of_a_missing_command_fails_and_leaves_nothing",
        "missing",
        false,
    ) else {
        return;
    };
    std::fs::write(
        world.dir.path().join("bottle.toml"),
        format!("[agents.echo]\nimage = \"{IMAGE}\"\ncommand = [\"/no/such/agent\", \"--flag\"]\n"),
    )
    .unwrap();
    let _stop = scopeguard(&world);
    let out = world
        .bottle()
        .args(["--yes", "start", "echo", "--detach", "--name", &world.name])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("BOT-C014"), "{stderr}");
    assert!(stderr.contains("`/no/such/agent --flag`"), "{stderr}");
    assert!(stderr.contains("no such file or directory"), "{stderr}");
    assert!(stderr.contains("the bottle was removed"), "{stderr}");
    let list = world.bottle().args(["--json", "list"]).output().unwrap();
    let all: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
    assert!(
        !all.iter()
            .any(|b| b["name"] == format!("bot-bottle-{}", world.name).as_str()),
        "{all:?}"
    );
    assert!(!world.state().join("bottle").join(&world.name).exists());
}

/// A `start -d` killed after its bottle's containers run but before its
/// agent does lists as `incomplete`, and `cleanup` removes it.
#[test]
fn a_start_killed_before_its_agent_ran_lists_as_incomplete() {
    let Some(world) = setup(
        "a_start_killed_before_its_agent_ran_lists_as_incomplete",
        "killed",
        false,
    ) else {
        return;
    };
    let _stop = scopeguard(&world);
    let mut start = std::process::Command::cargo_bin("bottle").unwrap();
    start
        .env("XDG_STATE_HOME", world.state())
        .env_remove("BOT_BOTTLE_BACKEND")
        // Holds the launch once the agent's container runs, before the
        // agent does.
        .env("BOTTLE_FAILPOINT", "agent-verify:sleep")
        .arg("--manifest")
        .arg(world.dir.path().join("bottle.toml"))
        .args(["--backend", "docker", "--yes", "start", "echo", "--detach"])
        .args(["--name", &world.name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = start.spawn().unwrap();
    wait_until("the agent's container to run", WAIT, || {
        let out = world.bottle().args(["--json", "list"]).output().unwrap();
        let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        all.iter().any(|b| {
            b["name"] == format!("bot-bottle-{}", world.name).as_str() && b["state"] == "running"
        })
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let listed = world.listed();
    assert_eq!(listed["state"], "incomplete (running)", "{listed}");
    world.bottle().args(["--yes", "cleanup"]).assert().success();
    let out = world.bottle().args(["--json", "list"]).output().unwrap();
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !all.iter()
            .any(|b| b["name"] == format!("bot-bottle-{}", world.name).as_str()),
        "{all:?}"
    );
}

/// Starts the world's bottle detached, runs `between`, then resets it and
/// checks it says the agent runs again; `false` (with a skip line) when
/// this host cannot reset.
#[expect(clippy::print_stderr, reason = "the skip line of the test calling it")]
fn started_detached_and_reset(world: &World, between: impl FnOnce()) -> bool {
    world
        .bottle()
        .args(["--yes", "start", "echo", "--detach", "--name", &world.name])
        .assert()
        .success();
    between();
    let out = world
        .bottle()
        .args(["reset", &world.name])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(6) || stderr.contains("reset is unavailable") {
        eprintln!("skipping: this host cannot reset ({stderr})");
        return false;
    }
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("runs again in a new session"), "{stderr}");
    true
}

/// A reset of a bottle with a detached agent starts the agent's command
/// again in a new session, and says so; `--keep-stopped` leaves it
/// stopped.
#[test]
fn a_reset_starts_a_detached_agent_again() {
    let Some(world) = setup(
        "a_reset_starts_a_detached_agent_again",
        "reset-session",
        false,
    ) else {
        return;
    };
    let _stop = scopeguard(&world);
    let mut first = None;
    if !started_detached_and_reset(&world, || first = Some(holder_pid(&world))) {
        return;
    }
    let first = first.unwrap();
    wait_until("the new session's agent to run", WAIT, || {
        world.listed()["agent_running"] == true
    });
    assert_ne!(holder_pid(&world), first, "a new holder");
    let out = world
        .bottle()
        .args(["reset", &world.name, "--keep-stopped"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("stays stopped"), "{stderr}");
    assert_ne!(world.listed()["agent_running"], true);
}

/// A microVM's reset restores its disks: nothing waits off its path, so
/// neither a detached start nor a reset starts a preparer for it (none
/// writes the preparer's log).
#[test]
fn a_microvm_bottle_starts_no_reset_preparer() {
    let Some(world) = setup(
        "a_microvm_bottle_starts_no_reset_preparer",
        "reset-vm",
        true,
    ) else {
        return;
    };
    let _stop = scopeguard(&world);
    if !started_detached_and_reset(&world, || ()) {
        return;
    }
    let golden = world
        .state()
        .join("bottle")
        .join(&world.name)
        .join("golden");
    assert!(
        golden.is_dir(),
        "the reset's snapshot is at {}",
        golden.display()
    );
    assert!(
        !golden.join("prepare.log").exists(),
        "a preparer ran: {}",
        std::fs::read_to_string(golden.join("prepare.log")).unwrap_or_default()
    );
}
