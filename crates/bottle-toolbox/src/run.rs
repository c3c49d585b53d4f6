//! Running one call: a program in its own process group, or a built-in
//! tool, with a deadline.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bottle_core::sandbox::Command;
use bottle_core::sandbox::call::OUTPUT_CAP;
use bottle_core::sandbox::wire::Reply;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::builtin;

/// Runs `command` and answers with its result.
pub(crate) fn exec(
    command: &Command,
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    stdin: Vec<u8>,
    deadline: Duration,
) -> Reply {
    let started = Instant::now();
    let outcome = match command {
        Command::Argv(argv) => run_program(argv, env, cwd, stdin, deadline),
        Command::Tool { name, params } => builtin::run(name, params, cwd),
    };
    match outcome {
        Ok(finished) => Reply::Exec {
            exit_code: finished.exit_code,
            stdout: finished.stdout.bytes,
            stderr: finished.stderr.bytes,
            truncated: finished.stdout.truncated || finished.stderr.truncated,
            timed_out: finished.timed_out,
            duration_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        },
        Err(message) => Reply::Error { message },
    }
}

/// What a call produced.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) exit_code: i32,
    pub(crate) stdout: Captured,
    pub(crate) stderr: Captured,
    pub(crate) timed_out: bool,
}

/// One output stream, kept up to [`OUTPUT_CAP`].
#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub(crate) bytes: Vec<u8>,
    pub(crate) truncated: bool,
}

fn run_program(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    stdin: Vec<u8>,
    deadline: Duration,
) -> Result<Finished, String> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| "the call names no program".to_string())?;
    #[expect(
        clippy::disallowed_methods,
        reason = "the in-box agent runs the orchestrator's programs inside the box; bottle-core's runner is for the host"
    )]
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .envs(env)
        .current_dir(working_dir(cwd))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so the deadline ends everything it started.
        .process_group(0);
    let mut child = command
        .spawn()
        .map_err(|err| format!("cannot run {program}: {err}"))?;
    let until = Instant::now() + deadline;
    let feeder = child.stdin.take().map(|mut pipe| {
        std::thread::spawn(move || {
            // A program that does not read its stdin closes the pipe: not
            // an error of the call.
            let _ = pipe.write_all(&stdin);
        })
    });
    let stdout = child.stdout.take().map(capture);
    let stderr = child.stderr.take().map(capture);
    let (status, mut timed_out) = wait_until(&mut child, until);
    // Output may still be held open by what the program left running; it
    // gets until the deadline, then the group is killed.
    let (stdout, late_out) = collect(stdout, until, &child);
    let (stderr, late_err) = collect(stderr, until, &child);
    timed_out |= late_out || late_err;
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    let exit_code = status.unwrap_or(128 + Signal::SIGKILL as i32);
    Ok(Finished {
        exit_code,
        stdout,
        stderr,
        timed_out,
    })
}

fn working_dir(cwd: Option<&str>) -> String {
    cwd.map(str::to_string)
        .or_else(|| {
            std::env::var("HOME")
                .ok()
                .filter(|home| std::path::Path::new(home).is_dir())
        })
        .unwrap_or_else(|| "/".into())
}

/// Waits for the child until `until`; at the deadline kills its group.
/// Returns its status (None if it could not be reaped) and whether the
/// deadline killed it.
fn wait_until(child: &mut Child, until: Instant) -> (Option<i32>, bool) {
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    // `wait` blocks, so a thread waits while this one keeps the deadline:
    // no polling interval adds to a call's latency.
    let waiter = {
        let mut child_wait = WaitHandle(pid);
        std::thread::spawn(move || {
            let _ = sender.send(child_wait.wait());
        })
    };
    let left = until.saturating_duration_since(Instant::now());
    match receiver.recv_timeout(left) {
        Ok(status) => {
            let _ = waiter.join();
            (status, false)
        }
        Err(_) => {
            kill_group(pid);
            let status = receiver.recv().ok().flatten();
            let _ = waiter.join();
            (status, true)
        }
    }
}

/// Waits for a pid with `waitpid`, so the `Child` stays with the caller
/// for killing. The status is the exit code (128 + n for signal n).
struct WaitHandle(u32);

impl WaitHandle {
    fn wait(&mut self) -> Option<i32> {
        let pid = Pid::from_raw(i32::try_from(self.0).ok()?);
        loop {
            match waitpid(pid, None) {
                Ok(WaitStatus::Exited(_, code)) => return Some(code),
                Ok(WaitStatus::Signaled(_, signal, _)) => return Some(128 + signal as i32),
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
            }
        }
    }
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

fn capture<R: Read + Send + 'static>(mut pipe: R) -> (JoinHandle<()>, mpsc::Receiver<Captured>) {
    let (sender, receiver) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut captured = Captured::default();
        let mut buf = [0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = OUTPUT_CAP.saturating_sub(captured.bytes.len());
                    captured.bytes.extend_from_slice(&buf[..n.min(room)]);
                    captured.truncated |= n > room;
                }
            }
        }
        let _ = sender.send(captured);
    });
    (handle, receiver)
}

/// The stream's bytes once it ends, or at the deadline after killing the
/// group (then `true`).
fn collect(
    stream: Option<(JoinHandle<()>, mpsc::Receiver<Captured>)>,
    until: Instant,
    child: &Child,
) -> (Captured, bool) {
    let Some((handle, receiver)) = stream else {
        return (Captured::default(), false);
    };
    let left = until.saturating_duration_since(Instant::now());
    let (captured, late) = match receiver.recv_timeout(left) {
        Ok(captured) => (captured, false),
        Err(_) => {
            kill_group(child.id());
            (receiver.recv().unwrap_or_default(), true)
        }
    };
    let _ = handle.join();
    (captured, late)
}
