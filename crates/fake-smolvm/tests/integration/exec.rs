//! `machine exec -i`/`-t` stream while the guest command runs, as smolvm's
//! interactive session does (`interactive_session` in its agent client):
//! output as it is written, input as it comes, to its end; with `-t` the
//! command has the caller's terminal.

use std::io::Write as _;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bottle_test_support::{eventually, wait_for};

use crate::{artifact, fake};

const WAIT: Duration = Duration::from_secs(30);

/// Starts machine `m` of the double under `dir`; `false` (with a skip line)
/// where the double cannot confine guest commands (no user namespaces).
fn started_machine(dir: &Path, test: &str) -> bool {
    let from = artifact(dir);
    let create = ["machine", "create", "--name", "m", "--from"];
    let out = fake(
        dir,
        "1.9.3",
        &[&create[..], &[from.to_str().unwrap()]].concat(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let out = fake(dir, "1.9.3", &["machine", "start", "--name", "m"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let out = fake(
        dir,
        "1.9.3",
        &["machine", "exec", "--name", "m", "--", "true"],
    );
    if out.code != Some(0) {
        bottle_test_support::skip_docker_test(test, out.stderr_text());
        return false;
    }
    true
}

/// `machine exec --name m FLAGS -- sh -c SCRIPT` under `dir`, running, with
/// the stdio `stdio` makes.
fn spawn_exec(dir: &Path, flags: &[&str], script: &str, stdio: impl Fn() -> Stdio) -> Child {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test streams into the double while it runs, so it holds the child"
    )]
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_fake-smolvm"));
    command
        .args(["machine", "exec", "--name", "m"])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .env("HOME", dir.join("home"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("SMOLVM_DATA_DIR", "")
        .env("FAKE_SMOLVM_VERSION", "1.9.3")
        .env("FAKE_SMOLVM_MODE", "")
        .stdin(stdio())
        .stdout(stdio())
        .stderr(stdio())
        .spawn()
        .unwrap()
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
    let shown = || String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        eventually(WAIT, || shown().contains(text)),
        "no {text:?} from the guest: {:?}",
        shown()
    );
}

#[test]
fn interactive_exec_streams_both_ways_while_the_guest_runs() {
    let test = "interactive_exec_streams_both_ways_while_the_guest_runs";
    let dir = tempfile::tempdir().unwrap();
    if !started_machine(dir.path(), test) {
        return;
    }
    let mut exec = spawn_exec(
        dir.path(),
        &["-i"],
        "echo ready; read line; echo got:$line; wc -c; echo end >&2; exit 3",
        Stdio::piped,
    );
    let stdout = collect(exec.stdout.take().unwrap());
    let stderr = collect(exec.stderr.take().unwrap());
    // Before any input: a double that reads its stdin to the end first
    // shows nothing yet.
    wait_for_text(&stdout, "ready\n");
    let mut stdin = exec.stdin.take().unwrap();
    stdin.write_all(b"hello\n").unwrap();
    wait_for_text(&stdout, "got:hello\n");
    // The rest, larger than a pipe holds, counted to its end.
    stdin.write_all(&vec![b'x'; 1 << 20]).unwrap();
    drop(stdin);
    let status = wait_for("the guest to exit", WAIT, || exec.try_wait().unwrap());
    assert_eq!(status.code(), Some(3));
    wait_for_text(&stdout, "got:hello\n1048576\n");
    wait_for_text(&stderr, "end\n");
}

#[test]
fn a_tty_exec_runs_on_the_callers_terminal() {
    let test = "a_tty_exec_runs_on_the_callers_terminal";
    let dir = tempfile::tempdir().unwrap();
    if !started_machine(dir.path(), test) {
        return;
    }
    let (master, terminal) = open_pty();
    rustix::termios::tcsetwinsize(
        &master,
        rustix::termios::Winsize {
            ws_row: 33,
            ws_col: 77,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .unwrap();
    let mut exec = spawn_exec(
        dir.path(),
        &["-i", "-t"],
        "test -t 0 && stty size; read line; echo got:$line; exit 5",
        || Stdio::from(terminal.try_clone().unwrap()),
    );
    drop(terminal);
    let seen = collect(master.try_clone().unwrap());
    wait_for_text(&seen, "33 77");
    (&master).write_all(b"typed\r").unwrap();
    wait_for_text(&seen, "got:typed");
    let status = wait_for("the guest to exit", WAIT, || exec.try_wait().unwrap());
    assert_eq!(status.code(), Some(5));
}

/// A pty, both sides close-on-exec so that no other test's child inherits
/// them: the test's side, and the terminal side for the double.
fn open_pty() -> (std::fs::File, std::os::fd::OwnedFd) {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let terminal = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    (std::fs::File::from(master), terminal)
}
