//! The host programs the gate runs (`ip`, `bottle`, `dockerd`, the probe),
//! behind one trait so the pure parts can be tested with a fake, and with a
//! time bound on every run.

use std::time::Duration;

use anyhow::{Context as _, bail};
use bottle_core::exec::{CommandRunner as _, ExecError, SystemRunner};

use crate::process::command;

/// What a finished program left.
#[derive(Debug, Clone, Default)]
pub(crate) struct Output {
    /// Exit code; `None` when killed by a signal or the time bound.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// True when the time bound ran out and the program was killed.
    pub timed_out: bool,
}

impl Output {
    /// Exit code 0.
    pub(crate) fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// One program to run.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Killed after this long.
    pub timeout: Duration,
}

impl Run {
    /// `program args...` with a 30 s bound.
    pub(crate) fn new<S: AsRef<str>>(program: &str, args: &[S]) -> Run {
        Run {
            program: program.to_string(),
            args: args.iter().map(|a| a.as_ref().to_string()).collect(),
            env: Vec::new(),
            timeout: Duration::from_secs(30),
        }
    }

    /// With another time bound.
    pub(crate) fn timeout(mut self, timeout: Duration) -> Run {
        self.timeout = timeout;
        self
    }

    /// With an extra environment variable.
    pub(crate) fn env(mut self, key: &str, value: &str) -> Run {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// The command line, for messages.
    pub(crate) fn display(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Runs host programs.
pub(crate) trait Sys: Send + Sync {
    /// Runs `run` to completion (or its time bound). `Err` only when it
    /// could not be started.
    fn output(&self, run: &Run) -> anyhow::Result<Output>;

    /// Runs `program args` and returns its stdout; a non-zero exit is an
    /// error carrying stderr.
    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        checked(
            self.output(&Run::new(program, args))?,
            &Run::new(program, args),
        )
    }
}

/// Stdout of a successful run, or an error saying what failed.
pub(crate) fn checked(out: Output, run: &Run) -> anyhow::Result<String> {
    if out.timed_out {
        bail!(
            "`{}` did not finish within {:?}",
            run.display(),
            run.timeout
        );
    }
    if !out.success() {
        bail!(
            "`{}` failed ({}): {}",
            run.display(),
            out.code
                .map_or_else(|| "killed".to_string(), |c| format!("exit {c}")),
            out.stderr.trim()
        );
    }
    Ok(out.stdout)
}

/// Runs real processes through the workspace's one runner.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RealSys;

impl Sys for RealSys {
    fn output(&self, run: &Run) -> anyhow::Result<Output> {
        let mut spec = command(&run.program).args(&run.args).timeout(run.timeout);
        for (key, value) in &run.env {
            spec = spec.env(key, value);
        }
        let (out, timed_out) = match SystemRunner.run(&spec) {
            Ok(out) => (out, false),
            Err(err) => match ExecError::of(&err) {
                Some(ExecError::TimedOut { output, .. }) => (output.clone(), true),
                _ => {
                    return Err(err)
                        .with_context(|| format!("could not start `{}`", run.display()));
                }
            },
        };
        Ok(Output {
            code: out.code,
            stdout: out.stdout_text(),
            stderr: out.stderr_text(),
            timed_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_exit_codes_are_captured() {
        let out = RealSys
            .output(&Run::new("sh", &["-c", "echo out; echo err >&2; exit 3"]))
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        let err = checked(out, &Run::new("sh", &["x"])).unwrap_err();
        assert!(err.to_string().contains("exit 3"), "{err}");
        assert_eq!(RealSys.run("echo", &["hi"]).unwrap(), "hi\n");
    }

    #[test]
    fn a_program_past_its_bound_is_killed() {
        let out = RealSys
            .output(&Run::new("sleep", &["30"]).timeout(Duration::from_millis(200)))
            .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.code, None);
    }
}
