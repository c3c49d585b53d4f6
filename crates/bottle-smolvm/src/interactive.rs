//! Running a command attached to the operator's terminal.
//!
//! The seam is its own trait because an interactive session wants an exit
//! code as a shell reports it, not captured output; the real runner is
//! [`bottle_core::exec::SystemRunner`] with inherited streams.

use std::io;

use bottle_core::exec::{CommandSpec, SystemRunner};

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
        let (status, _) = SystemRunner.run_to_status(&spec.clone().inherit_streams())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_the_shell_s() {
        let sh = |script: &str| CommandSpec::new("sh").arg("-c").arg(script);
        assert_eq!(TerminalRunner.run_interactive(&sh("exit 7")).unwrap(), 7);
        assert_eq!(
            TerminalRunner.run_interactive(&sh("kill -9 $$")).unwrap(),
            128 + 9
        );
    }
}
