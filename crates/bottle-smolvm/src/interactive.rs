//! Running a command attached to the operator's terminal.
//!
//! [`bottle_core::exec::CommandRunner`] captures output, which an
//! interactive agent session cannot use. Until bottle-core grows an
//! interactive variant, this trait is the seam, so tests substitute it like
//! the capturing runner.

use std::io;

use bottle_core::exec::CommandSpec;

/// Runs a command with the terminal's stdin, stdout and stderr.
pub trait InteractiveRunner: Send + Sync {
    /// Runs `spec` attached to this process's stdio; returns its exit code
    /// (128 + signal when killed by one).
    fn run_interactive(&self, spec: &CommandSpec) -> io::Result<i32>;
}

/// The real runner.
#[derive(Debug, Clone, Copy, Default)]
pub struct TerminalRunner;

impl InteractiveRunner for TerminalRunner {
    fn run_interactive(&self, spec: &CommandSpec) -> io::Result<i32> {
        use std::os::unix::process::ExitStatusExt as _;
        #[expect(
            clippy::disallowed_methods,
            reason = "CommandRunner captures output; an interactive session needs the terminal (to move into bottle-core::exec)"
        )]
        let mut command = std::process::Command::new(&spec.program);
        command.args(&spec.args).envs(&spec.env);
        if let Some(cwd) = &spec.cwd {
            command.current_dir(cwd);
        }
        let status = command.status()?;
        Ok(status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1))
    }
}

/// Whether stdin is a terminal (then `machine exec` gets `-t`).
pub fn stdin_is_tty() -> bool {
    use std::io::IsTerminal as _;
    io::stdin().is_terminal()
}
