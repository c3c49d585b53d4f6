//! Bringing a loopback alias up and down, per platform.
//!
//! On Linux the kernel routes all of `127.0.0.0/8` to `lo`, so any
//! `127.0.0.N` can be bound and published to without configuration: both
//! operations are no-ops and no process is spawned. macOS's `lo0` answers
//! only for `127.0.0.1` until an alias is added with
//! `ifconfig lo0 alias 127.0.0.N up`, which needs root.
//!
//! The argv is built here, in one place, and run through a
//! [`CommandRunner`] so tests check its shape on any host.

use std::net::Ipv4Addr;

use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec};

use crate::error::NetError;

/// macOS's `ifconfig`, by absolute path so that `PATH` cannot substitute
/// it and a sudoers rule can name it.
pub const IFCONFIG: &str = "/sbin/ifconfig";

/// What macOS's `ifconfig lo0 -alias` prints when the alias is not there
/// (`EADDRNOTAVAIL` from `SIOCDIFADDR`), e.g. after a reboot.
const ALIAS_ABSENT: &str = "Can't assign requested address";

/// How this host makes a loopback alias usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopbackPlatform {
    /// All of `127.0.0.0/8` is already loopback: nothing to do. Used on
    /// every host that is not macOS.
    Linux,
    /// Each alias is added to `lo0` with `ifconfig`.
    MacOs {
        /// Run `ifconfig` through `sudo -n` because we are not root. `-n`
        /// makes a missing credential fail fast with a clear error instead
        /// of a password prompt hidden behind captured output.
        sudo: bool,
    },
}

impl LoopbackPlatform {
    /// The platform this process runs on.
    pub fn current() -> LoopbackPlatform {
        #[cfg(target_os = "macos")]
        {
            LoopbackPlatform::MacOs {
                sudo: !nix::unistd::geteuid().is_root(),
            }
        }
        #[cfg(not(target_os = "macos"))]
        {
            LoopbackPlatform::Linux
        }
    }

    /// The command that brings `address` up, or `None` if nothing needs to
    /// run.
    pub fn add_command(self, address: Ipv4Addr) -> Option<CommandSpec> {
        self.ifconfig([
            "lo0".to_string(),
            "alias".into(),
            address.to_string(),
            "up".into(),
        ])
    }

    /// The command that takes `address` down, or `None` if nothing needs to
    /// run.
    pub fn remove_command(self, address: Ipv4Addr) -> Option<CommandSpec> {
        self.ifconfig(["lo0".to_string(), "-alias".into(), address.to_string()])
    }

    fn ifconfig<const N: usize>(self, args: [String; N]) -> Option<CommandSpec> {
        match self {
            LoopbackPlatform::Linux => None,
            LoopbackPlatform::MacOs { sudo: false } => Some(CommandSpec::new(IFCONFIG).args(args)),
            LoopbackPlatform::MacOs { sudo: true } => {
                Some(CommandSpec::new("sudo").args(["-n", IFCONFIG]).args(args))
            }
        }
    }

    /// Brings `address` up. Adding an alias that is already there succeeds.
    pub(crate) fn add(
        self,
        address: Ipv4Addr,
        runner: &dyn CommandRunner,
    ) -> Result<(), CommandFailure> {
        let Some(spec) = self.add_command(address) else {
            return Ok(());
        };
        match runner.run(&spec) {
            Ok(output) if output.success() => Ok(()),
            Ok(output) => Err(CommandFailure::exited(
                &spec,
                &output,
                self.add_fix(&output, address),
            )),
            Err(err) => Err(CommandFailure::not_run(&spec, &err)),
        }
    }

    /// Takes `address` down. Removing an alias that is not there succeeds:
    /// the goal, no alias, is reached.
    pub(crate) fn remove(
        self,
        address: Ipv4Addr,
        runner: &dyn CommandRunner,
    ) -> Result<(), CommandFailure> {
        let Some(spec) = self.remove_command(address) else {
            return Ok(());
        };
        match runner.run(&spec) {
            Ok(output) if output.success() => Ok(()),
            Ok(output) if output.stderr_text().contains(ALIAS_ABSENT) => Ok(()),
            Ok(output) => Err(CommandFailure::exited(
                &spec,
                &output,
                format!(
                    "{}remove it by hand with `sudo {IFCONFIG} lo0 -alias {address}`, then run `bottle cleanup`",
                    sudo_hint(&output)
                ),
            )),
            Err(err) => Err(CommandFailure::not_run(&spec, &err)),
        }
    }

    fn add_fix(self, output: &CommandOutput, address: Ipv4Addr) -> String {
        format!(
            "{}check that `sudo {IFCONFIG} lo0 alias {address} up` works in this terminal, then start the bottle again",
            sudo_hint(output)
        )
    }
}

fn sudo_hint(output: &CommandOutput) -> &'static str {
    if output.stderr_text().contains("password is required") {
        "sudo needs a password: run `sudo -v` first, or allow `/sbin/ifconfig lo0 *` without a password in sudoers; otherwise "
    } else {
        ""
    }
}

/// A failed `ifconfig`, before it is turned into an add or remove error.
#[derive(Debug)]
pub(crate) struct CommandFailure {
    pub(crate) command: String,
    pub(crate) detail: String,
    pub(crate) fix: String,
}

impl CommandFailure {
    fn exited(spec: &CommandSpec, output: &CommandOutput, fix: String) -> CommandFailure {
        let status = match output.code {
            Some(code) => format!("exited with code {code}"),
            None => "was killed by a signal".to_string(),
        };
        let stderr = output.stderr_text();
        let stderr = stderr.trim();
        CommandFailure {
            command: spec.argv().join(" "),
            detail: if stderr.is_empty() {
                status
            } else {
                format!("{status}: {stderr}")
            },
            fix,
        }
    }

    fn not_run(spec: &CommandSpec, err: &std::io::Error) -> CommandFailure {
        CommandFailure {
            command: spec.argv().join(" "),
            detail: format!("could not be run: {err}"),
            fix: format!(
                "check that {} exists (it ships with macOS) and is executable",
                spec.program.to_string_lossy()
            ),
        }
    }

    pub(crate) fn into_add_error(self, address: Ipv4Addr) -> NetError {
        NetError::AliasAdd {
            address,
            command: self.command,
            detail: self.detail,
            fix: self.fix,
        }
    }

    pub(crate) fn into_remove_error(self, address: Ipv4Addr) -> NetError {
        NetError::AliasRemove {
            address,
            command: self.command,
            detail: self.detail,
            fix: self.fix,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 20);

    #[test]
    fn macos_argv_shapes() {
        let root = LoopbackPlatform::MacOs { sudo: false };
        assert_eq!(
            root.add_command(ADDR).unwrap().argv(),
            ["/sbin/ifconfig", "lo0", "alias", "127.0.0.20", "up"]
        );
        assert_eq!(
            root.remove_command(ADDR).unwrap().argv(),
            ["/sbin/ifconfig", "lo0", "-alias", "127.0.0.20"]
        );
        let user = LoopbackPlatform::MacOs { sudo: true };
        assert_eq!(
            user.add_command(ADDR).unwrap().argv(),
            [
                "sudo",
                "-n",
                "/sbin/ifconfig",
                "lo0",
                "alias",
                "127.0.0.20",
                "up"
            ]
        );
        assert_eq!(
            user.remove_command(ADDR).unwrap().argv(),
            [
                "sudo",
                "-n",
                "/sbin/ifconfig",
                "lo0",
                "-alias",
                "127.0.0.20"
            ]
        );
    }

    #[test]
    fn linux_runs_nothing() {
        assert_eq!(LoopbackPlatform::Linux.add_command(ADDR), None);
        assert_eq!(LoopbackPlatform::Linux.remove_command(ADDR), None);
    }

    #[test]
    fn current_platform_matches_the_target() {
        let current = LoopbackPlatform::current();
        if cfg!(target_os = "macos") {
            assert!(matches!(current, LoopbackPlatform::MacOs { .. }));
        } else {
            assert_eq!(current, LoopbackPlatform::Linux);
        }
    }
}
