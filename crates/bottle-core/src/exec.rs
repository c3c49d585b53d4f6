//! The one place in the workspace that spawns host processes.
//!
//! Everything that runs an external program (`smolvm`, `ifconfig`, `git`,
//! `cargo` for xtask, an interactive `smolvm machine exec`) builds a
//! [`CommandSpec`] and hands it to a [`CommandRunner`]. Tests substitute a
//! runner that records the calls and returns canned output, so argv shapes
//! are tested without the program installed.
//!
//! [`SystemRunner`] drains stdout and stderr on their own threads while
//! another writes stdin, so a child that writes a lot before it reads its
//! input cannot deadlock against us; an optional time bound kills the child
//! and reports [`ExecError::TimedOut`] with what it wrote so far.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where a child's standard streams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Streams {
    /// stdout and stderr are captured into [`CommandOutput`]; stdin is
    /// [`CommandSpec::stdin`] or empty.
    #[default]
    Captured,
    /// stdin, stdout and stderr are this process's own: an interactive
    /// session, or a build whose progress the operator watches. Bytes in
    /// [`CommandSpec::stdin`] still replace the inherited stdin.
    Inherited,
}

/// A program invocation: argv, extra environment, working directory, where
/// its streams go and how long it may take.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandSpec {
    /// The program (looked up on `PATH` unless it contains a slash).
    pub program: OsString,
    /// Arguments, not including the program.
    pub args: Vec<OsString>,
    /// Variables added to (or overriding) the inherited environment.
    pub env: BTreeMap<OsString, OsString>,
    /// Inherited variables the child does not get (e.g. `GIT_DIR`, which
    /// would point git elsewhere than the command says).
    pub env_removed: BTreeSet<OsString>,
    /// Working directory, if not the current one.
    pub cwd: Option<PathBuf>,
    /// Bytes written to the child's stdin (then closed).
    pub stdin: Option<Vec<u8>>,
    /// Captured or inherited stdio.
    pub streams: Streams,
    /// Killed, and [`ExecError::TimedOut`] returned, after this long.
    pub timeout: Option<Duration>,
}

impl CommandSpec {
    /// A command with no arguments yet.
    pub fn new(program: impl Into<OsString>) -> Self {
        CommandSpec {
            program: program.into(),
            ..CommandSpec::default()
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable for the child.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Keeps the inherited variable `key` from the child.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        let key = key.into();
        self.env.remove(&key);
        self.env_removed.insert(key);
        self
    }

    /// Runs the child in `dir`.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Writes `bytes` to the child's stdin, then closes it.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(bytes.into());
        self
    }

    /// Gives the child this process's stdin, stdout and stderr.
    pub fn inherit_streams(mut self) -> Self {
        self.streams = Streams::Inherited;
        self
    }

    /// Kills the child if it has not finished after `limit`.
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// The argv as lossy strings, for messages and tests.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    fn program_name(&self) -> String {
        self.program.to_string_lossy().into_owned()
    }
}

/// What a finished process left behind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    /// Exit code; `None` if killed by a signal.
    pub code: Option<i32>,
    /// Captured stdout (empty when inherited).
    pub stdout: Vec<u8>,
    /// Captured stderr (empty when inherited).
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    /// True when the process exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout as lossy UTF-8.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as lossy UTF-8.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Why a command did not run to completion. [`CommandRunner::run`] returns
/// it inside an [`io::Error`] of the matching kind ([`ExecError::of`] gets it
/// back), so callers that only report an I/O failure need not know it.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program could not be started (not found, not executable).
    #[error("{program}: {source}")]
    Spawn {
        /// The program, as given.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The program outlived [`CommandSpec::timeout`] and was killed.
    #[error("{program} did not finish within {limit:?} and was killed")]
    TimedOut {
        /// The program, as given.
        program: String,
        /// The time bound it ran past.
        limit: Duration,
        /// What it had written before it was killed.
        output: CommandOutput,
    },
    /// Feeding stdin or waiting for the child failed.
    #[error("{program}: {source}")]
    Io {
        /// The program, as given.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl ExecError {
    /// The [`ExecError`] inside an error from [`CommandRunner::run`], if it
    /// came from [`SystemRunner`].
    pub fn of(err: &io::Error) -> Option<&ExecError> {
        err.get_ref()?.downcast_ref()
    }

    /// The I/O kind it travels as: the spawn failure's own kind (so
    /// `NotFound` stays `NotFound`), or [`io::ErrorKind::TimedOut`].
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            ExecError::Spawn { source, .. } | ExecError::Io { source, .. } => source.kind(),
            ExecError::TimedOut { .. } => io::ErrorKind::TimedOut,
        }
    }
}

impl From<ExecError> for io::Error {
    fn from(err: ExecError) -> io::Error {
        io::Error::new(err.kind(), err)
    }
}

/// Runs commands to completion.
pub trait CommandRunner: Send + Sync {
    /// Runs `spec` and waits for it. An `Err` means it could not be started
    /// (not found, not executable) or ran past its time bound, never that it
    /// exited non-zero; [`ExecError::of`] says which.
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput>;

    /// Starts `spec` and returns its PID without waiting for it: stdin
    /// reads as empty and stdout and stderr append to `log`, so the child
    /// holds nothing of ours (no terminal, no pipe) and outlives us. Its
    /// [`CommandSpec::stdin`], streams and time bound do not apply.
    fn spawn_detached(&self, spec: &CommandSpec, log: &Path) -> io::Result<u32>;

    /// Starts `spec` with its stdin and stdout piped to us and its stderr
    /// discarded, for a long-lived child we talk to over those two streams
    /// (the sandbox's in-box agent behind `smolvm machine exec -i`). Its
    /// [`CommandSpec::stdin`], streams and time bound do not apply.
    fn spawn_piped(&self, spec: &CommandSpec) -> io::Result<PipedChild>;
}

/// A child started by [`CommandRunner::spawn_piped`]: its two streams, and
/// a way to end it. Dropping it kills the child.
pub struct PipedChild {
    /// The child's stdin.
    pub stdin: Box<dyn io::Write + Send>,
    /// The child's stdout.
    pub stdout: Box<dyn Read + Send>,
    child: Option<std::process::Child>,
}

impl PipedChild {
    /// A child made of two given streams and no process (a test double's).
    pub fn from_streams(
        stdin: Box<dyn io::Write + Send>,
        stdout: Box<dyn Read + Send>,
    ) -> PipedChild {
        PipedChild {
            stdin,
            stdout,
            child: None,
        }
    }

    /// Closes the child's stdin, waits for it to end and returns its exit
    /// code: `None` when a signal ended it, or when there is no process
    /// (a test double's).
    pub fn wait(&mut self) -> io::Result<Option<i32>> {
        self.stdin = Box::new(io::sink());
        match self.child.take() {
            Some(mut child) => Ok(child.wait()?.code()),
            None => Ok(None),
        }
    }

    /// Kills the child and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PipedChild {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for PipedChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipedChild")
            .field("pid", &self.child.as_ref().map(std::process::Child::id))
            .finish_non_exhaustive()
    }
}

/// The real runner: spawns host processes.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        Ok(self.run_to_status(spec)?.1)
    }

    fn spawn_detached(&self, spec: &CommandSpec, log: &Path) -> io::Result<u32> {
        let program = spec.program_name();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut command = command_for(spec);
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Dropping the handle neither kills nor waits for the child; once we
        // exit, init (or the nearest subreaper) reaps it.
        let child = command
            .spawn()
            .map_err(|source| ExecError::Spawn { program, source })?;
        Ok(child.id())
    }

    fn spawn_piped(&self, spec: &CommandSpec) -> io::Result<PipedChild> {
        let program = spec.program_name();
        let mut child = command_for(spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ExecError::Spawn { program, source })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the child's pipes were not created"));
        };
        Ok(PipedChild {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            child: Some(child),
        })
    }
}

/// The process `spec` names, with its arguments, environment and working
/// directory; the caller sets its streams.
fn command_for(spec: &CommandSpec) -> std::process::Command {
    #[expect(
        clippy::disallowed_methods,
        reason = "this is the one sanctioned place that spawns processes"
    )]
    let mut command = std::process::Command::new(&spec.program);
    for key in &spec.env_removed {
        command.env_remove(key);
    }
    command.args(&spec.args).envs(&spec.env);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    command
}

/// How long a killed child's output may take to close before we return what
/// it wrote (a process it left behind may hold the pipe open).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

impl SystemRunner {
    /// Like [`CommandRunner::run`], with the full exit status, which also
    /// names the signal that ended the child.
    pub fn run_to_status(
        &self,
        spec: &CommandSpec,
    ) -> Result<(ExitStatus, CommandOutput), ExecError> {
        let program = spec.program_name();
        let io_error = |source| ExecError::Io {
            program: program.clone(),
            source,
        };
        let inherit = spec.streams == Streams::Inherited;
        let output_stream = || {
            if inherit {
                Stdio::inherit()
            } else {
                Stdio::piped()
            }
        };

        let mut command = command_for(spec);
        command
            .stdout(output_stream())
            .stderr(output_stream())
            .stdin(match (&spec.stdin, inherit) {
                (Some(_), _) => Stdio::piped(),
                (None, true) => Stdio::inherit(),
                (None, false) => Stdio::null(),
            });
        let mut child = command.spawn().map_err(|source| ExecError::Spawn {
            program: program.clone(),
            source,
        })?;
        let deadline = spec.timeout.map(|limit| Instant::now() + limit);

        let stdin = child.stdin.take().zip(spec.stdin.clone()).map(feed);
        let stdout = child.stdout.take().map(Drain::start);
        let stderr = child.stderr.take().map(Drain::start);

        let Some(status) = wait(&mut child, deadline).map_err(io_error)? else {
            // Killed for its time bound: give back what it wrote.
            let _ = child.kill();
            let _ = child.wait();
            let grace = Instant::now() + DRAIN_GRACE;
            return Err(ExecError::TimedOut {
                program,
                limit: spec.timeout.unwrap_or_default(),
                output: CommandOutput {
                    code: None,
                    stdout: Drain::finish_any(stdout, Some(grace)).0,
                    stderr: Drain::finish_any(stderr, Some(grace)).0,
                },
            });
        };
        let (stdout, stdout_closed) = Drain::finish_any(stdout, deadline);
        let (stderr, stderr_closed) = Drain::finish_any(stderr, deadline);
        let output = CommandOutput {
            code: status.code(),
            stdout,
            stderr,
        };
        if !(stdout_closed && stderr_closed) {
            // It exited, but something it started still holds its output
            // open past the time bound.
            return Err(ExecError::TimedOut {
                program,
                limit: spec.timeout.unwrap_or_default(),
                output,
            });
        }
        if let Some(fed) = stdin {
            // The child is gone, so the writer has finished or failed
            // (unless something it left behind holds stdin unread: then,
            // under a time bound, the input no longer matters).
            let fed = match deadline {
                None => fed.recv().ok(),
                Some(until) => fed
                    .recv_timeout(until.saturating_duration_since(Instant::now()))
                    .ok(),
            };
            if let Some(Err(source)) = fed {
                return Err(io_error(source));
            }
        }
        Ok((status, output))
    }
}

/// Waits for `child`, until `deadline` if there is one; `None` when it
/// passed first.
fn wait(
    child: &mut std::process::Child,
    deadline: Option<Instant>,
) -> io::Result<Option<ExitStatus>> {
    let Some(deadline) = deadline else {
        return child.wait().map(Some);
    };
    // Most commands finish in milliseconds: poll fast first, then back off.
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Writes `bytes` to the child's stdin on its own thread, so that reading
/// its output can go on meanwhile; the receiver gets the outcome.
fn feed((mut pipe, bytes): (std::process::ChildStdin, Vec<u8>)) -> Receiver<io::Result<()>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = match pipe.write_all(&bytes) {
            // A child that exits without reading its stdin is not our error.
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        };
        drop(pipe);
        let _ = tx.send(result);
    });
    rx
}

/// One output pipe read to its end on its own thread, into a buffer that
/// can be taken early when the child had to be killed.
struct Drain {
    buffer: Arc<Mutex<Vec<u8>>>,
    closed: Receiver<()>,
}

impl Drain {
    fn start(mut pipe: impl Read + Send + 'static) -> Drain {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let (tx, closed) = mpsc::channel();
        let sink = Arc::clone(&buffer);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 64 * 1024];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => sink
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .extend_from_slice(&chunk[..n]),
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
        Drain { buffer, closed }
    }

    /// [`Drain::finish`] for a stream that may not be captured.
    fn finish_any(drain: Option<Drain>, until: Option<Instant>) -> (Vec<u8>, bool) {
        drain.map_or((Vec::new(), true), |drain| drain.finish(until))
    }

    /// What was read, and whether the pipe closed (by `until`, if given).
    fn finish(self, until: Option<Instant>) -> (Vec<u8>, bool) {
        let closed = match until {
            None => {
                // Ok or the reader's end: either way it will read no more.
                let _ = self.closed.recv();
                true
            }
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                !matches!(
                    self.closed.recv_timeout(left),
                    Err(RecvTimeoutError::Timeout)
                )
            }
        };
        let bytes =
            std::mem::take(&mut *self.buffer.lock().unwrap_or_else(PoisonError::into_inner));
        (bytes, closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound on tests that would otherwise hang if the runner regressed.
    const HANG_GUARD: Duration = Duration::from_secs(60);

    fn sh(script: &str) -> CommandSpec {
        CommandSpec::new("sh").arg("-c").arg(script)
    }

    #[test]
    fn system_runner_keeps_streams_apart() {
        let spec = sh("read x; echo out:$x; echo err >&2; exit 3").stdin("hello\n");
        let out = SystemRunner.run(&spec).unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout_text(), "out:hello\n");
        assert_eq!(out.stderr_text(), "err\n");
    }

    #[test]
    fn removed_variables_are_not_inherited() {
        // Any variable this test inherited that no shell sets by itself.
        let shell_managed = [
            "PATH", "PWD", "OLDPWD", "SHLVL", "_", "IFS", "PS1", "PS2", "PS4",
        ];
        let name = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .find(|n| {
                !shell_managed.contains(&n.as_str())
                    && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .unwrap_or_default();
        assert!(!name.is_empty(), "the test inherited no variable to remove");
        let script = format!("echo \"[${{{name}-unset}}]\"");
        let spec = sh(&script).env_remove(name.as_str());
        let out = SystemRunner.run(&spec).unwrap();
        assert_eq!(out.stdout_text(), "[unset]\n");
        // A variable set after it was removed is set.
        let out = SystemRunner.run(&spec.env(name.as_str(), "x")).unwrap();
        assert_eq!(out.stdout_text(), "[x]\n");
    }

    #[test]
    fn exit_codes_and_signals_are_reported() {
        assert_eq!(SystemRunner.run(&sh("exit 0")).unwrap().code, Some(0));
        assert_eq!(SystemRunner.run(&sh("exit 42")).unwrap().code, Some(42));
        let (status, out) = SystemRunner.run_to_status(&sh("kill -9 $$")).unwrap();
        assert_eq!(out.code, None);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    #[test]
    fn missing_program_is_an_error_naming_it() {
        let program = "/nonexistent/bottle-test-binary";
        let err = SystemRunner.run(&CommandSpec::new(program)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains(program), "{err}");
        assert!(
            matches!(ExecError::of(&err), Some(ExecError::Spawn { program: p, .. }) if p == program),
            "{err:?}"
        );
    }

    #[test]
    fn a_child_past_its_time_bound_is_killed_and_reported() {
        let started = Instant::now();
        let spec = sh("echo started; exec sleep 30").timeout(Duration::from_millis(300));
        let err = SystemRunner.run(&spec).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "not killed");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        match ExecError::of(&err) {
            Some(ExecError::TimedOut {
                program,
                limit,
                output,
            }) => {
                assert_eq!(program, "sh");
                assert_eq!(*limit, Duration::from_millis(300));
                assert_eq!(output.stdout_text(), "started\n");
            }
            other => panic!("not a timeout: {other:?}"),
        }
    }

    #[test]
    fn a_child_within_its_time_bound_finishes_normally() {
        let out = SystemRunner
            .run(&sh("echo quick").timeout(HANG_GUARD))
            .unwrap();
        assert_eq!(out.stdout_text(), "quick\n");
    }

    #[test]
    fn large_output_before_reading_large_input_does_not_deadlock() {
        // Both outputs overflow a pipe buffer many times before the child
        // reads a byte of its (also large) input: writing all of stdin
        // first, then reading, would block both sides forever.
        const SIZE: usize = 3 * 1024 * 1024;
        let spec = sh(&format!(
            "head -c {SIZE} /dev/zero; head -c {SIZE} /dev/zero >&2; wc -c"
        ))
        .stdin(vec![b'x'; SIZE])
        .timeout(HANG_GUARD);
        let out = SystemRunner.run(&spec).unwrap();
        assert!(out.success(), "{}", out.stderr_text());
        assert_eq!(out.stderr.len(), SIZE);
        let (zeros, count) = out.stdout.split_at(SIZE);
        assert!(zeros.iter().all(|b| *b == 0));
        assert_eq!(String::from_utf8_lossy(count).trim(), SIZE.to_string());
    }

    #[test]
    fn inherited_streams_are_this_process_own() {
        // `-ef`: the child's fd and ours are the same open file.
        let same_as_parent = "test /proc/self/fd/0 -ef /proc/$PPID/fd/0 \
             && test /proc/self/fd/1 -ef /proc/$PPID/fd/1 \
             && test /proc/self/fd/2 -ef /proc/$PPID/fd/2";
        let inherited = SystemRunner
            .run(&sh(same_as_parent).inherit_streams().timeout(HANG_GUARD))
            .unwrap();
        assert_eq!(inherited.code, Some(0));
        assert!(inherited.stdout.is_empty() && inherited.stderr.is_empty());
        let captured = SystemRunner
            .run(&sh(same_as_parent).timeout(HANG_GUARD))
            .unwrap();
        assert_eq!(
            captured.code,
            Some(1),
            "a captured child must not share our streams"
        );
    }

    #[test]
    fn given_stdin_replaces_the_inherited_one() {
        let spec = sh("read x; test \"$x\" = fed && test /proc/self/fd/1 -ef /proc/$PPID/fd/1")
            .stdin("fed\n")
            .inherit_streams()
            .timeout(HANG_GUARD);
        assert_eq!(SystemRunner.run(&spec).unwrap().code, Some(0));
    }

    #[test]
    fn a_child_that_ignores_its_stdin_is_not_an_error() {
        let spec = sh("exit 0").stdin(vec![0u8; 1024 * 1024]);
        assert!(SystemRunner.run(&spec).unwrap().success());
    }

    #[test]
    fn a_detached_child_outlives_the_call_and_writes_to_its_log() {
        let dir = std::env::temp_dir().join(format!("bottle-exec-detached-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let started = Instant::now();
        // It reads its (empty) stdin, so it cannot be waiting on ours.
        let pid = SystemRunner
            .spawn_detached(&sh("cat; sleep 1; echo done; echo err >&2"), &log)
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1), "it waited");
        assert!(pid > 0);
        let deadline = Instant::now() + HANG_GUARD;
        while std::fs::read_to_string(&log).unwrap_or_default() != "done\nerr\n" {
            assert!(
                Instant::now() < deadline,
                "the detached child never wrote its log"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_piped_child_answers_over_its_streams_and_dies_with_its_handle() {
        let mut child = SystemRunner
            .spawn_piped(&sh("read x; echo got:$x; cat"))
            .unwrap();
        child.stdin.write_all(b"one\n").unwrap();
        let mut line = [0u8; 7];
        child.stdout.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"got:one");
        let pid = child.child.as_ref().unwrap().id();
        drop(child);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "dropping the handle must kill and reap the child"
        );
    }

    #[test]
    fn argv_shape() {
        let spec = CommandSpec::new("smolvm")
            .args(["machine", "ls"])
            .arg("--json");
        assert_eq!(spec.argv(), ["smolvm", "machine", "ls", "--json"]);
    }
}
