//! A running microVM bottle: exec (captured or on the operator's terminal)
//! and `bottle cp` both ways ([`crate::copy`]), all through `smolvm machine
//! exec`; tool calls
//! through the in-box agent, behind one long-lived `machine exec -i`; and
//! the verified reset ([`crate::reset`]).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use bottle_core::backend::{BackendError, BackendErrorKind, Bottle, CommitReport, ExecOutput};
use bottle_core::copy::{CopyIn, GuestPath};
use bottle_core::exec::PipedChild;
use bottle_core::sandbox::reset::ResetFiles;
use bottle_core::sandbox::{
    ResetReport, SandboxError, TOOLBOX_PATH, ToolCall, ToolResult, Toolbox, ToolboxStream,
};

use crate::cli::Smolvm;
use crate::error::SmolvmError;
use crate::interactive::{InteractiveRunner, stdin_is_tty};
use crate::reset::VmReset;
use crate::statedb::EgressPolicy;

/// Where a microVM bottle's sandbox state is: its state dir (golden disks,
/// baseline, halt record, audit log), smolvm's state database, and the
/// egress policy every start must find in it.
#[derive(Debug, Clone)]
pub struct SandboxPlace {
    /// The bottle's state dir.
    pub state_dir: PathBuf,
    /// smolvm's state database.
    pub db: PathBuf,
    /// The bundle's `/32`, the only allowlist a start accepts.
    pub policy: EgressPolicy,
}

/// A running microVM bottle.
pub struct SmolvmBottle {
    pub(crate) machine: String,
    pub(crate) smolvm: Arc<Smolvm>,
    pub(crate) db: PathBuf,
    pub(crate) policy: EgressPolicy,
    state_dir: PathBuf,
    pub(crate) toolbox: Toolbox,
    /// The `machine exec -i` the in-box agent runs behind, while it runs.
    toolbox_child: Mutex<Option<PipedChild>>,
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
        place: SandboxPlace,
        env: Vec<(String, String)>,
        default_command: Vec<String>,
        interactive: Arc<dyn InteractiveRunner>,
    ) -> SmolvmBottle {
        let files = ResetFiles::new(&place.state_dir);
        SmolvmBottle {
            toolbox: Toolbox::new(machine.clone(), Some(files.audit_log())),
            toolbox_child: Mutex::new(None),
            machine,
            smolvm,
            db: place.db,
            policy: place.policy,
            state_dir: place.state_dir,
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
    /// The bottle's reset records.
    pub fn reset_files(&self) -> ResetFiles {
        ResetFiles::new(&self.state_dir)
    }

    /// Starts the in-box agent behind `machine exec -i`, keeping the child
    /// to end it later; the channel is its stdin and stdout.
    pub(crate) fn open_toolbox(&self) -> Result<ToolboxStream, SandboxError> {
        let present = self.smolvm.exec(
            &self.machine,
            &[
                "test".to_string(),
                "-x".to_string(),
                TOOLBOX_PATH.to_string(),
            ],
            &self.env,
        );
        let boot = |why: String| SandboxError::Boot {
            bottle: self.machine.clone(),
            why,
        };
        match present {
            Ok(out) if out.exit_code == 0 => {}
            Ok(_) => {
                return Err(SandboxError::NotAvailable {
                    bottle: self.machine.clone(),
                    what: "execute".into(),
                    why: format!("the in-box agent {TOOLBOX_PATH} is not in the bottle"),
                    fix: "install `bottle-toolbox` where bottle finds it (`cargo xtask install`, or set BOTTLE_TOOLBOX_BIN to the static binary), then `bottle stop` this bottle and start a new one".into(),
                });
            }
            Err(err) => return Err(boot(err.to_string())),
        }
        let mut child = self
            .smolvm
            .spawn_toolbox(&self.machine, &self.env)
            .map_err(|err| boot(err.to_string()))?;
        let to_agent = std::mem::replace(&mut child.stdin, Box::new(std::io::sink()));
        let from_agent = std::mem::replace(&mut child.stdout, Box::new(std::io::empty()));
        // Replacing a previous child kills it.
        *self
            .toolbox_child
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(child);
        Ok(ToolboxStream {
            to_agent,
            from_agent,
        })
    }

    /// Ends the in-box agent's `machine exec` and forgets its channel (the
    /// guest agent kills a command whose client is gone).
    pub(crate) fn end_toolbox(&self) {
        self.toolbox.forget();
        if let Some(mut child) = self
            .toolbox_child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            child.kill();
        }
    }

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

    fn copy_in(&self, copy: &CopyIn, dest: &GuestPath) -> Result<(), BackendError> {
        crate::copy::copy_in(&self.smolvm, &self.machine, &self.env, copy, dest)
    }

    fn copy_out(&self, path: &GuestPath, out: &mut dyn Write) -> Result<(), BackendError> {
        crate::copy::copy_out(&self.smolvm, &self.machine, &self.env, path, out)
    }

    fn execute(&self, call: &ToolCall) -> Result<ToolResult, SandboxError> {
        self.toolbox.execute(call, || self.open_toolbox())
    }

    fn reset(&self) -> Result<ResetReport, SandboxError> {
        let files = self.reset_files();
        let substrate = VmReset::new(self, files.golden_dir());
        bottle_core::sandbox::reset::reset(&substrate, &files)
    }

    /// A microVM reverts its disks at reset: a standby machine would double
    /// the bottle's memory, and smolvm cannot move a machine's network to
    /// another (docs/design/standby-reset.md).
    fn prepare_reset(&self) -> Result<String, BackendError> {
        Ok("a microVM resets by restoring its disks: nothing to prepare".into())
    }

    fn reset_is_preparable(&self) -> bool {
        false
    }

    fn commit(&self, _image: &str) -> Result<CommitReport, BackendError> {
        Err(SmolvmError::CommitUnsupported.into())
    }

    fn connect_port(&self, port: u16) -> Result<ToolboxStream, BackendError> {
        let mut child = self.smolvm.spawn_relay(&self.machine, &self.env, port)?;
        let to_box = std::mem::replace(&mut child.stdin, Box::new(std::io::sink()));
        let from_box = std::mem::replace(&mut child.stdout, Box::new(std::io::empty()));
        Ok(ToolboxStream {
            to_agent: to_box,
            // The reader holds the `machine exec`: dropping it ends the
            // relay.
            from_agent: Box::new(HeldReader {
                reader: from_box,
                _child: child,
            }),
        })
    }
}

/// A child's stdout that keeps the child: dropping it kills the child.
struct HeldReader {
    reader: Box<dyn std::io::Read + Send>,
    _child: bottle_core::exec::PipedChild,
}

impl std::io::Read for HeldReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(buf)
    }
}
