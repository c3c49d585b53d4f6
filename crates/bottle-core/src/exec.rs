//! The one place in the workspace that spawns host processes.
//!
//! Everything that runs an external program (`smolvm`, `ifconfig`, `git`)
//! builds a [`CommandSpec`] and hands it to a [`CommandRunner`]. Tests
//! substitute a runner that records the calls and returns canned output, so
//! argv shapes are tested without the program installed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;

/// A program invocation: argv, extra environment, working directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandSpec {
    /// The program (looked up on `PATH` unless it contains a slash).
    pub program: OsString,
    /// Arguments, not including the program.
    pub args: Vec<OsString>,
    /// Variables added to (or overriding) the inherited environment.
    pub env: BTreeMap<OsString, OsString>,
    /// Working directory, if not the current one.
    pub cwd: Option<PathBuf>,
    /// Bytes written to the child's stdin (then closed).
    pub stdin: Option<Vec<u8>>,
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

    /// The argv as lossy strings, for messages and tests.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }
}

/// What a finished process left behind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    /// Exit code; `None` if killed by a signal.
    pub code: Option<i32>,
    /// Captured stdout.
    pub stdout: Vec<u8>,
    /// Captured stderr.
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

/// Runs commands to completion, capturing their output.
pub trait CommandRunner: Send + Sync {
    /// Runs `spec` and waits for it. An `Err` means it could not be started
    /// (not found, not executable), never that it exited non-zero.
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput>;
}

/// The real runner: spawns host processes.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        use std::io::Write as _;

        #[expect(
            clippy::disallowed_methods,
            reason = "this is the one sanctioned place that spawns processes"
        )]
        let mut command = std::process::Command::new(&spec.program);
        command
            .args(&spec.args)
            .envs(&spec.env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if spec.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        if let Some(cwd) = &spec.cwd {
            command.current_dir(cwd);
        }
        let mut child = command.spawn()?;
        if let (Some(input), Some(mut stdin)) = (&spec.stdin, child.stdin.take()) {
            // A child that exits without reading its stdin is not our error.
            match stdin.write_all(input) {
                Err(err) if err.kind() != io::ErrorKind::BrokenPipe => return Err(err),
                _ => {}
            }
        }
        let output = child.wait_with_output()?;
        Ok(CommandOutput {
            code: output.status.code(),
            stdout: output.stdout,
            stderr: output.stderr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_runner_keeps_streams_apart() {
        let spec = CommandSpec::new("sh")
            .arg("-c")
            .arg("read x; echo out:$x; echo err >&2; exit 3");
        let spec = CommandSpec {
            stdin: Some(b"hello\n".to_vec()),
            ..spec
        };
        let out = SystemRunner.run(&spec).unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout_text(), "out:hello\n");
        assert_eq!(out.stderr_text(), "err\n");
    }

    #[test]
    fn missing_program_is_an_error_not_an_exit_code() {
        let err = SystemRunner
            .run(&CommandSpec::new("/nonexistent/bottle-test-binary"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn argv_shape() {
        let spec = CommandSpec::new("smolvm")
            .args(["machine", "ls"])
            .arg("--json");
        assert_eq!(spec.argv(), ["smolvm", "machine", "ls", "--json"]);
    }
}
