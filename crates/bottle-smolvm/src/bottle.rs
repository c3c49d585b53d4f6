//! A running microVM bottle: exec (captured or on the operator's terminal)
//! and copying files in, all through `smolvm machine exec`/`cp`.

use std::path::Path;
use std::sync::Arc;

use bottle_core::backend::{BackendError, BackendErrorKind, Bottle, ExecOutput};

use crate::cli::Smolvm;
use crate::error::SmolvmError;
use crate::interactive::{InteractiveRunner, stdin_is_tty};

/// A running microVM bottle.
pub struct SmolvmBottle {
    machine: String,
    smolvm: Arc<Smolvm>,
    env: Vec<(String, String)>,
    default_command: Vec<String>,
    interactive: Arc<dyn InteractiveRunner>,
    /// What the launch could not do, for the operator (already escaped).
    warnings: Vec<String>,
}

impl std::fmt::Debug for SmolvmBottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmolvmBottle")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}

impl SmolvmBottle {
    /// The running `machine`: every command carries `env`; an interactive
    /// session given no command runs `default_command` on `interactive`.
    pub(crate) fn new(
        machine: String,
        smolvm: Arc<Smolvm>,
        env: Vec<(String, String)>,
        default_command: Vec<String>,
        interactive: Arc<dyn InteractiveRunner>,
    ) -> SmolvmBottle {
        SmolvmBottle {
            machine,
            smolvm,
            env,
            default_command,
            interactive,
            warnings: Vec::new(),
        }
    }

    /// The same bottle, carrying its launch's warnings.
    pub(crate) fn with_warnings(mut self, warnings: Vec<String>) -> SmolvmBottle {
        self.warnings = warnings;
        self
    }

    /// The environment every command in this bottle runs with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl SmolvmBottle {
    /// Runs `argv` (or the agent's default command) with this process's
    /// stdio, as `machine exec -i`, with `-t` when `tty`.
    fn attached(&self, argv: &[String], tty: bool) -> Result<i32, BackendError> {
        let argv = if argv.is_empty() {
            self.default_command.clone()
        } else {
            argv.to_vec()
        };
        if argv.is_empty() {
            return Err(BackendError::new(
                BackendErrorKind::Failed,
                "BOT-K092",
                "the agent has no command and its image names none",
                "set `command` for the agent in the manifest",
            ));
        }
        let spec = self
            .smolvm
            .exec_interactive_spec(&self.machine, &argv, &self.env, tty)?;
        self.interactive.run_interactive(&spec).map_err(|source| {
            SmolvmError::NotInstalled {
                program: spec.program.to_string_lossy().into_owned(),
                source,
            }
            .into()
        })
    }
}

impl Bottle for SmolvmBottle {
    fn name(&self) -> &str {
        &self.machine
    }

    fn launch_warnings(&self) -> &[String] {
        &self.warnings
    }

    fn exec(&self, argv: &[String]) -> Result<ExecOutput, BackendError> {
        let out = self.smolvm.exec(&self.machine, argv, &self.env)?;
        Ok(ExecOutput {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    fn exec_interactive(&self, argv: &[String]) -> Result<i32, BackendError> {
        self.attached(argv, stdin_is_tty())
    }

    fn exec_piped(&self, argv: &[String]) -> Result<i32, BackendError> {
        self.attached(argv, false)
    }

    fn copy_in(&self, host_path: &Path, guest_dir: &str) -> Result<(), BackendError> {
        let name = host_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Failed,
                    "BOT-K093",
                    format!("{} has no file name to copy under", host_path.display()),
                    "name a file or a directory",
                )
            })?;
        let guest = format!("{}/{name}", guest_dir.trim_end_matches('/'));
        Ok(self.smolvm.copy_in(&self.machine, host_path, &guest)?)
    }
}
