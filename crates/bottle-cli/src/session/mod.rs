//! A detached bottle's agent session, held on the host like dtach or
//! abduco: `bottle start --detach` spawns `bottle __session-host`, which
//! puts the agent's interactive exec on a pty of its own and serves that
//! pty on a unix socket in the bottle's state dir; `bottle attach` joins it.
//!
//! Why on the host, not in the box: the holder reuses the backends'
//! existing interactive exec (`Bottle::exec_interactive`) unchanged, so one
//! design serves docker and smolmachines alike and the agent's box gains no
//! new process or listener. The holder is its own session leader (setsid)
//! with the pty as its controlling terminal, so the operator's terminal
//! closing does not reach it, and a size set on the pty reaches the
//! interactive exec as SIGWINCH from the kernel, just as a real terminal's
//! does. Several clients may attach at once: all see the output, any may
//! type, the last resize wins (like tmux; nothing to arbitrate).
//!
//! The session's files (`bottle_core::state::SessionPaths`) live in an
//! owner-only directory: the socket, the holder's identity (so `stop` ends
//! it and `list` tells whether the agent runs), and once the agent exits
//! its exit code and last output.

pub(crate) mod attach;
mod frame;
pub(crate) mod host;

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bottle_core::BackendKind;
use bottle_core::exec::{CommandRunner, CommandSpec};
use bottle_core::process::Owner;
use bottle_core::state::SessionPaths;

use crate::failure::{EXIT_BACKEND, Failure};
use crate::spawn_self::spawn_self;

/// The hidden subcommand the holder runs as.
pub(crate) const HOST_SUBCOMMAND: &str = "__session-host";

/// How long `start` waits for the holder to serve its socket.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// How long `stop` lets the holder end on SIGTERM before SIGKILL.
const END_WITHIN: Duration = Duration::from_secs(10);

/// Scrollback kept for a client that attaches later.
const SCROLLBACK_BYTES: usize = 64 * 1024;

/// The holder's invocation: this `bottle`, on the bottle's backend, running
/// `command` (the manifest's; empty lets the backend pick the image's).
pub(crate) fn host_spec(
    bottle_exe: &Path,
    kind: BackendKind,
    name: &str,
    command: &[String],
) -> CommandSpec {
    CommandSpec::new(bottle_exe)
        .args(["--backend", kind.as_str(), HOST_SUBCOMMAND, name, "--"])
        .args(command)
        // Holds no directory the operator may want to unmount.
        .cwd("/")
}

/// The named pipe the holder writes one byte to once it serves its socket
/// and the agent's command runs: `start` waits on it (and on the holder's
/// exit) rather than polling.
pub(crate) fn ready_pipe(paths: &SessionPaths) -> PathBuf {
    paths.dir.join("ready")
}

/// The holder's side of [`ready_pipe`]: one byte once it serves and the
/// agent runs. Best effort: a `start` that is gone has no reader, and
/// nothing waits.
pub(crate) fn signal_ready(paths: &SessionPaths) {
    signal_ready_at(&ready_pipe(paths));
}

/// Writes the one byte of readiness to the named pipe `pipe` (a session
/// holder's, a forwarder's); best effort, like [`signal_ready`].
pub(crate) fn signal_ready_at(pipe: &Path) {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    if let Ok(pipe) = rustix::fs::open(pipe, flags, Mode::empty()) {
        let _ = rustix::io::write(&pipe, b"1");
    }
}

/// Spawns the holder for the launched bottle `name` and waits until it
/// serves its socket and the agent's command runs; a command that could
/// not start is reported with its exit code and what it printed, a holder
/// that dies first with its log.
pub(crate) fn spawn_host(
    runner: &dyn CommandRunner,
    paths: &SessionPaths,
    kind: BackendKind,
    name: &str,
    command: &[String],
) -> Result<(), Failure> {
    let failed = |detail: String| {
        Failure::new(
            "BOT-C010",
            EXIT_BACKEND,
            format!("the agent session of {name} did not start: {detail}"),
        )
        .with_fix(
            "the bottle was removed; `bottle doctor` checks this host, and `bottle start` without --detach runs the agent on this terminal",
        )
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&paths.dir)
        .map_err(|err| failed(format!("cannot create {}: {err}", paths.dir.display())))?;
    // Opened for reading before the holder exists, so its byte always
    // finds a reader.
    let (ready, _held_open) = open_ready_pipe(&ready_pipe(paths)).map_err(|err| {
        failed(format!(
            "cannot make {}: {err}",
            ready_pipe(paths).display()
        ))
    })?;
    let spawned = spawn_self(
        runner,
        |exe| host_spec(exe, kind, name, command),
        &paths.log(),
    );
    let waited = spawned.map(|pid| wait_ready(&ready, Owner { pid, start: 0 }, READY_WITHIN));
    let _ = std::fs::remove_file(ready_pipe(paths));
    match waited.map_err(&failed)? {
        Ready::Serving => Ok(()),
        Ready::Exited => match did_not_start(paths, command) {
            Some(failure) => Err(failure),
            None => {
                let log = std::fs::read_to_string(paths.log()).unwrap_or_default();
                let log = bottle_core::display::escape_for_terminal(log.trim()).into_owned();
                Err(failed(format!("the session holder exited: {log}")))
            }
        },
        Ready::TimedOut => Err(failed(format!(
            "the session holder did not serve {} within {READY_WITHIN:?}",
            paths.socket().display()
        ))),
    }
}

/// How much of what a command that could not start printed goes into the
/// error (the OCI runtime's reason fits easily).
const CAUSE_BYTES: usize = 1024;

/// The failure of an agent's command that ended without ever running
/// (the holder wrote its exit code and never its `started` marker).
fn did_not_start(paths: &SessionPaths, command: &[String]) -> Option<Failure> {
    if paths.started().exists() {
        return None;
    }
    let code = std::fs::read_to_string(paths.exit_code()).ok()?;
    let output = std::fs::read(paths.scrollback()).unwrap_or_default();
    let tail = &output[output.len().saturating_sub(CAUSE_BYTES)..];
    let cause = String::from_utf8_lossy(tail);
    let cause = bottle_core::display::escape_for_terminal(cause.trim()).into_owned();
    let shown = if command.is_empty() {
        "the image's default command".to_string()
    } else {
        format!("`{}`", command.join(" "))
    };
    Some(
        Failure::new(
            "BOT-C014",
            EXIT_BACKEND,
            format!(
                "the agent's command {} did not start (exit {}): {cause}",
                bottle_core::display::escape_for_terminal(&shown),
                code.trim()
            ),
        )
        .with_fix(
            "check `command` in the manifest: the program must exist in the image and be executable by its user; the bottle was removed",
        ),
    )
}

/// A fresh named pipe at `path` (owner-only; [`ready_pipe`] for a
/// session), opened for reading without blocking (no writer is needed to
/// open it), and a write end we hold ourselves: with a writer always
/// there, a writer that comes and goes without its byte leaves no hang-up
/// for `poll` to report again and again, and the wait sleeps until a byte
/// or the holder's exit.
pub(crate) fn open_ready_pipe(
    path: &Path,
) -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    let _ = std::fs::remove_file(path);
    rustix::fs::mkfifoat(rustix::fs::CWD, path, Mode::RUSR | Mode::WUSR)?;
    let open = |flags| {
        rustix::fs::open(
            path,
            flags | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let read = open(OFlags::RDONLY)?;
    let write = open(OFlags::WRONLY)?;
    Ok((read, write))
}

/// How waiting for the holder ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ready {
    /// It wrote its byte: it serves its socket.
    Serving,
    /// It exited without writing it.
    Exited,
    /// Neither happened within the bound.
    TimedOut,
}

/// Waits until `holder` writes its byte to `pipe` or exits, woken by
/// either (the pipe, and a pidfd of the holder); where pidfds are missing
/// (Linux before 5.3), its exit is noticed within 20 ms.
pub(crate) fn wait_ready(pipe: &std::os::fd::OwnedFd, holder: Owner, within: Duration) -> Ready {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let deadline = Instant::now() + within;
    let pidfd = i32::try_from(holder.pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .and_then(|pid| {
            rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
        });
    loop {
        let mut byte = [0u8; 1];
        // An empty pipe reads EAGAIN (we hold a writer ourselves): only
        // the byte means ready.
        if rustix::io::read(pipe, &mut byte) == Ok(1) {
            return Ready::Serving;
        }
        if !holder.is_alive() {
            // Its byte may have come between the read and its exit.
            if rustix::io::read(pipe, &mut byte) == Ok(1) {
                return Ready::Serving;
            }
            return Ready::Exited;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ready::TimedOut;
        }
        let mut fds = vec![PollFd::new(pipe, PollFlags::IN)];
        let slice = match &pidfd {
            Some(fd) => {
                fds.push(PollFd::new(fd, PollFlags::IN));
                left
            }
            None => left.min(Duration::from_millis(20)),
        };
        let timeout = Timespec::try_from(slice).ok();
        let _ = poll(&mut fds, timeout.as_ref());
    }
}

/// Whether the bottle's agent runs under a session holder: `None` when the
/// bottle has no session (it was started attached, or before sessions).
pub(crate) fn agent_running(paths: &SessionPaths) -> Option<bool> {
    let holder = read_holder(paths)?;
    Some(holder.is_alive() && !paths.exit_code().exists())
}

fn read_holder(paths: &SessionPaths) -> Option<Owner> {
    let bytes = std::fs::read(paths.holder()).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Asks the bottle's session holder, if one runs, to end with the agent's
/// exec (SIGTERM to its process group), without waiting: `stop` calls it
/// first so the holder winds down while the bottle's containers go.
pub(crate) fn signal_end(paths: &SessionPaths) {
    if let Some((_, group)) = live_holder(paths) {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
    }
}

/// Ends the bottle's session holder, if one runs, with the agent's exec
/// (its process group): SIGTERM, then SIGKILL if it outlives
/// [`END_WITHIN`]; then removes the session's files, which no backend
/// knows of. `stop`, or its finisher, calls it before removing the rest of
/// the bottle.
pub(crate) fn end(paths: &SessionPaths) {
    end_holder(paths);
    // Best effort, like the rest of a stop: a leftover dir holds no secret.
    let _ = std::fs::remove_dir_all(&paths.dir);
}

/// The holder and its process group, if it runs. The holder is a session
/// leader, so its PID is its group's.
fn live_holder(paths: &SessionPaths) -> Option<(Owner, rustix::process::Pid)> {
    let holder = read_holder(paths)?;
    let pid = i32::try_from(holder.pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)?;
    holder.is_alive().then_some((holder, pid))
}

fn end_holder(paths: &SessionPaths) {
    use rustix::process::{Signal, kill_process_group};
    let Some((holder, group)) = live_holder(paths) else {
        return;
    };
    let _ = kill_process_group(group, Signal::TERM);
    if !exits_within(holder, group, END_WITHIN) {
        let _ = kill_process_group(group, Signal::KILL);
    }
}

/// Whether the process `holder` (PID `pid`) exits within `within`: waits
/// on a pidfd, woken by its exit rather than polling. Not our child, so
/// there is no `waitpid`; where pidfds are missing (Linux before 5.3), a
/// check every 20 ms.
pub(crate) fn exits_within(holder: Owner, pid: rustix::process::Pid, within: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let deadline = Instant::now() + within;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok();
    while holder.is_alive() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match &pidfd {
            Some(fd) => {
                let mut fds = [PollFd::new(fd, PollFlags::IN)];
                let timeout = Timespec::try_from(left).ok();
                let _ = poll(&mut fds, timeout.as_ref());
            }
            None => std::thread::sleep(left.min(Duration::from_millis(20))),
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_this_bottle_on_the_bottles_backend() {
        let spec = host_spec(
            Path::new("/usr/bin/bottle"),
            BackendKind::Smolmachines,
            "bot-bottle-demo",
            &["sh".into(), "-c".into(), "echo hi".into()],
        );
        assert_eq!(
            spec.argv(),
            [
                "/usr/bin/bottle",
                "--backend",
                "smolmachines",
                "__session-host",
                "bot-bottle-demo",
                "--",
                "sh",
                "-c",
                "echo hi"
            ]
        );
        assert_eq!(spec.cwd.as_deref(), Some(Path::new("/")));
    }

    #[test]
    fn spawning_goes_through_the_runner_detached() {
        let root = tempfile::tempdir().unwrap();
        let paths = SessionPaths::new(root.path(), "demo");
        let runner =
            bottle_test_support::RecordingRunner::failing_to_start(std::io::ErrorKind::NotFound);
        let err =
            spawn_host(&runner, &paths, BackendKind::Docker, "bot-bottle-demo", &[]).unwrap_err();
        assert_eq!(err.code, Some("BOT-C010"));
        let calls = runner.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0][1..],
            [
                "--backend",
                "docker",
                HOST_SUBCOMMAND,
                "bot-bottle-demo",
                "--"
            ]
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&paths.dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "the session dir is owner-only");
    }

    /// Spawns a shell script in place of the holder, through the real
    /// runner; the script gets the ready pipe's path as `$0`.
    struct StandIn {
        script: &'static str,
        pipe: PathBuf,
    }

    impl CommandRunner for StandIn {
        fn run(&self, spec: &CommandSpec) -> std::io::Result<bottle_core::exec::CommandOutput> {
            bottle_core::exec::SystemRunner.run(spec)
        }
        fn spawn_detached(&self, _: &CommandSpec, log: &Path) -> std::io::Result<u32> {
            let spec = CommandSpec::new("/bin/sh")
                .args(["-c", self.script])
                .arg(&self.pipe);
            bottle_core::exec::SystemRunner.spawn_detached(&spec, log)
        }
        fn spawn_piped(
            &self,
            spec: &CommandSpec,
        ) -> std::io::Result<bottle_core::exec::PipedChild> {
            bottle_core::exec::SystemRunner.spawn_piped(spec)
        }
    }

    fn spawn_stand_in(script: &'static str) -> Result<(), Failure> {
        let root = tempfile::tempdir().unwrap();
        let paths = SessionPaths::new(root.path(), "demo");
        let runner = StandIn {
            script,
            pipe: ready_pipe(&paths),
        };
        let spawned = spawn_host(&runner, &paths, BackendKind::Docker, "bot-bottle-demo", &[]);
        assert!(!ready_pipe(&paths).exists(), "the ready pipe is removed");
        spawned
    }

    #[test]
    fn a_holder_that_writes_its_byte_is_ready() {
        spawn_stand_in("printf 1 > \"$0\"").unwrap();
    }

    #[test]
    fn a_writer_that_leaves_without_the_byte_is_not_readiness() {
        spawn_stand_in("exec 3>\"$0\"; exec 3>&-; sleep 0.2; printf 1 > \"$0\"").unwrap();
        let err = spawn_stand_in("exec 3>\"$0\"; exec 3>&-; echo gone; exit 1").unwrap_err();
        assert!(
            err.message.contains("the session holder exited: gone"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_holder_that_dies_before_it_is_ready_is_reported_with_its_log() {
        let err = spawn_stand_in("echo 'no such bottle \x1b[31m'; exit 3").unwrap_err();
        assert_eq!(err.code, Some("BOT-C010"));
        let message = err.message;
        assert!(
            message.contains("the session holder exited: no such bottle"),
            "{message}"
        );
        assert!(!message.contains('\x1b'), "the log is escaped: {message}");
    }

    #[test]
    fn a_bottle_without_a_session_has_no_agent_state() {
        let root = tempfile::tempdir().unwrap();
        let paths = SessionPaths::new(root.path(), "demo");
        assert_eq!(agent_running(&paths), None);
        std::fs::create_dir_all(&paths.dir).unwrap();
        std::fs::write(
            paths.holder(),
            serde_json::to_vec(&Owner::current()).unwrap(),
        )
        .unwrap();
        assert_eq!(agent_running(&paths), Some(true));
        std::fs::write(paths.exit_code(), "0").unwrap();
        assert_eq!(agent_running(&paths), Some(false));
        // The holder recorded here is this test: not one to end.
        std::fs::remove_file(paths.holder()).unwrap();
        end(&paths);
        assert!(!paths.dir.exists(), "stop leaves the session's files");
    }
}
