//! The `smolvm` CLI wrapper: every argv is built here, in one place, and run
//! through [`bottle_core::exec::CommandRunner`] so tests substitute the
//! program.
//!
//! The shapes follow smolvm's clap definitions in `src/cli/machine.rs`
//! (`CreateCmd`, `StartCmd`, `StopCmd`, `DeleteCmd`, `ExecCmd`, `CpCmd`,
//! `LsCmd`) and `src/cli/pack.rs` (`PackCreateCmd`), version by version; see
//! [`SmolvmVersion`] for where they changed.
//!
//! ## Telling smolvm's failures from the guest's
//!
//! `machine exec` exits with the guest command's code, and smolvm's own
//! failures (machine not running, agent unreachable) print `Error: …` and
//! exit 1: the same code as a guest `exit 1`. Matching on `Error:` is not
//! enough, since a guest command may print that too. So every guest command
//! runs under a small `sh` wrapper that prints a per-call random marker and
//! the command's exit code as the last line of stderr ([`exec_wrapper`]).
//! The marker present means the guest ran and its code is the one reported;
//! absent means smolvm itself failed. The marker line is removed before the
//! output is handed back, so stdout is byte-exact and stderr is the
//! command's own. (A guest process that outlives the command and writes to
//! stderr afterwards lands after the marker; it is kept, not lost.)

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec, PipedChild};
use bottle_core::sandbox::TOOLBOX_PATH;
use serde::Deserialize;

use crate::error::SmolvmError;
use crate::version::{Capabilities as _, SmolvmVersion};

/// The program name looked up on `PATH`.
pub const SMOLVM: &str = "smolvm";

/// The storage disk smolvm gives a machine created without `--storage`
/// (`DEFAULT_STORAGE_SIZE_GIB` in smolvm's `src/data/storage.rs`, 20 from
/// 0.8.0 through 1.9.3).
pub const SMOLVM_DEFAULT_STORAGE_GIB: u64 = 20;

/// One smolvm invocation, before it becomes an argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmolvmCommand {
    /// `smolvm --version`.
    Version,
    /// `smolvm machine create` from a packed `.smolmachine`.
    Create {
        /// The machine name.
        name: String,
        /// The `.smolmachine` sidecar.
        from: PathBuf,
        /// The egress allowlist (`--allow-cidr`, repeated). Dropped by smolvm
        /// 0.8.0 to 1.7.x together with `--from`; the state-DB patch covers it.
        allow_cidrs: Vec<String>,
        /// The VM's storage disk in GiB (`--storage`): where everything the
        /// workload writes lands (its container's overlay upper lives on
        /// `/storage`), so it caps what the agent can write. `None`:
        /// smolvm's default ([`SMOLVM_DEFAULT_STORAGE_GIB`]).
        storage_gib: Option<u64>,
    },
    /// `smolvm machine start --name NAME`.
    Start {
        /// The machine name.
        name: String,
    },
    /// `smolvm machine stop --name NAME`.
    Stop {
        /// The machine name.
        name: String,
    },
    /// `smolvm machine delete`, forced (no prompt).
    Delete {
        /// The machine name.
        name: String,
    },
    /// `smolvm machine exec --name NAME [-e K=V]… [-w DIR] [-i] [-t] -- argv…`.
    Exec {
        /// The machine name.
        name: String,
        /// The command.
        argv: Vec<String>,
        /// Extra environment for the command.
        env: Vec<(String, String)>,
        /// Working directory in the guest.
        workdir: Option<String>,
        /// Keep stdin open (`-i`).
        interactive: bool,
        /// Allocate a TTY (`-t`).
        tty: bool,
    },
    /// `smolvm machine cp HOST NAME:GUEST`.
    CopyIn {
        /// The machine name.
        name: String,
        /// Host source.
        host: PathBuf,
        /// Guest destination.
        guest: String,
    },
    /// `smolvm machine ls --json`.
    List,
    /// `smolvm machine data-dir -n NAME` (since 0.5.15): where the
    /// machine's disks are.
    DataDir {
        /// The machine name.
        name: String,
    },
    /// `smolvm pack create --image REF -o OUT`: writes `OUT` (a launcher
    /// stub) and `OUT.smolmachine` (the sidecar `machine create --from`
    /// takes).
    PackCreate {
        /// A registry reference (the only source `pack create` reads).
        image: String,
        /// Output path without the `.smolmachine` suffix.
        output: PathBuf,
    },
}

impl SmolvmCommand {
    /// The arguments (without the program) for `version`.
    pub fn args(&self, version: SmolvmVersion) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |a: &dyn AsRef<std::ffi::OsStr>| args.push(a.as_ref().to_os_string());
        match self {
            SmolvmCommand::Version => push(&"--version"),
            SmolvmCommand::Create {
                name,
                from,
                allow_cidrs,
                storage_gib,
            } => {
                push(&"machine");
                push(&"create");
                if version.name_is_a_flag() {
                    push(&"--name");
                    push(name);
                }
                push(&"--from");
                push(from);
                // `CreateCmd --storage` (GiB), honoured with `--from` in
                // every version bottle supports (`run_from_smolmachine`
                // passes it to the machine's record and disks).
                if let Some(gib) = storage_gib {
                    push(&"--storage");
                    push(&gib.to_string());
                }
                // --net is implied by --allow-cidr, and said explicitly so the
                // record's `network` is true even where the flag is dropped.
                push(&"--net");
                for cidr in allow_cidrs {
                    push(&"--allow-cidr");
                    push(cidr);
                }
                if !version.name_is_a_flag() {
                    push(name);
                }
            }
            SmolvmCommand::Start { name } => {
                for a in ["machine", "start", "--name", name] {
                    push(&a);
                }
            }
            SmolvmCommand::Stop { name } => {
                for a in ["machine", "stop", "--name", name] {
                    push(&a);
                }
            }
            SmolvmCommand::Delete { name } => {
                push(&"machine");
                push(&"delete");
                if version.name_is_a_flag() {
                    push(&"--name");
                }
                push(name);
                push(&"-f");
            }
            SmolvmCommand::Exec {
                name,
                argv,
                env,
                workdir,
                interactive,
                tty,
            } => {
                // `ExecCmd` has `--name` with no short form.
                for a in ["machine", "exec", "--name", name] {
                    push(&a);
                }
                for (key, value) in env {
                    push(&"-e");
                    push(&format!("{key}={value}"));
                }
                if let Some(dir) = workdir {
                    push(&"-w");
                    push(dir);
                }
                if *interactive {
                    push(&"-i");
                }
                if *tty {
                    push(&"-t");
                }
                push(&"--");
                for a in argv {
                    push(a);
                }
            }
            SmolvmCommand::CopyIn { name, host, guest } => {
                push(&"machine");
                push(&"cp");
                push(host);
                push(&format!("{name}:{guest}"));
            }
            SmolvmCommand::List => {
                for a in ["machine", "ls", "--json"] {
                    push(&a);
                }
            }
            SmolvmCommand::DataDir { name } => {
                for a in ["machine", "data-dir", "-n", name] {
                    push(&a);
                }
            }
            SmolvmCommand::PackCreate { image, output } => {
                for a in ["pack", "create", "--image", image, "-o"] {
                    push(&a);
                }
                push(output);
            }
        }
        args
    }
}

/// One machine as `machine ls --json` reports it. Only the fields the
/// backend reads; smolvm's others (cpus, memory_mib, mounts, ports, ...) are
/// ignored, and none of them is the allowlist: the state DB is the only
/// place to check that.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MachineEntry {
    /// The machine name.
    pub name: String,
    /// `created`, `running`, `stopped`, `failed`, `unreachable` (HEAD adds
    /// `frozen`).
    #[serde(default)]
    pub state: Option<String>,
    /// The VMM's pid, when running.
    #[serde(default)]
    pub pid: Option<i64>,
    /// Creation time as smolvm prints it (a number or a string).
    #[serde(default)]
    pub created_at: Option<serde_json::Value>,
}

impl MachineEntry {
    /// The state, or `unknown`.
    pub fn state(&self) -> &str {
        self.state.as_deref().unwrap_or("unknown")
    }

    /// The creation time as text, if smolvm gave one.
    pub fn created(&self) -> Option<String> {
        match &self.created_at {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// A guest command's result, smolvm's own failures already separated out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GuestOutput {
    /// The guest command's exit code.
    pub exit_code: i32,
    /// Its stdout, byte-exact.
    pub stdout: Vec<u8>,
    /// Its stderr, with the wrapper's marker line removed.
    pub stderr: Vec<u8>,
}

/// The `smolvm` CLI.
pub struct Smolvm {
    program: OsString,
    runner: Arc<dyn CommandRunner>,
    env: BTreeMap<OsString, OsString>,
    version: OnceLock<SmolvmVersion>,
}

impl std::fmt::Debug for Smolvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Smolvm")
            .field("program", &self.program)
            .field("env", &self.env)
            .field("version", &self.version.get())
            .finish_non_exhaustive()
    }
}

impl Smolvm {
    /// The `smolvm` on `PATH`, run through `runner`.
    pub fn new(runner: Arc<dyn CommandRunner>) -> Smolvm {
        Smolvm::with_program(SMOLVM, runner)
    }

    /// A specific program (a path to smolvm, or a test double).
    pub fn with_program(program: impl Into<OsString>, runner: Arc<dyn CommandRunner>) -> Smolvm {
        Smolvm {
            program: program.into(),
            runner,
            env: BTreeMap::new(),
            version: OnceLock::new(),
        }
    }

    /// Sets an environment variable for every smolvm invocation (tests point
    /// `HOME` and `XDG_DATA_HOME` at a temp dir this way).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Smolvm {
        self.env.insert(key.into(), value.into());
        self
    }

    /// An environment variable as smolvm sees it: set with [`Smolvm::env`],
    /// else inherited from this process.
    pub fn lookup_env(&self, key: &str) -> Option<String> {
        match self.env.get(std::ffi::OsStr::new(key)) {
            Some(value) => Some(value.to_string_lossy().into_owned()),
            None => std::env::var(key).ok(),
        }
    }

    /// The program run.
    pub fn program(&self) -> &OsString {
        &self.program
    }

    /// The runner used.
    pub fn runner(&self) -> &Arc<dyn CommandRunner> {
        &self.runner
    }

    /// The full invocation for `command`, once the version is known.
    pub fn spec(&self, command: &SmolvmCommand, version: SmolvmVersion) -> CommandSpec {
        let mut spec = CommandSpec::new(self.program.clone()).args(command.args(version));
        spec.env.extend(self.env.clone());
        spec
    }

    /// `smolvm --version`, read once and cached.
    pub fn version(&self) -> Result<SmolvmVersion, SmolvmError> {
        if let Some(v) = self.version.get() {
            return Ok(*v);
        }
        // The version argv does not depend on the version.
        let spec = self.spec(&SmolvmCommand::Version, SmolvmVersion::new(0, 0, 0));
        let out = self.run_spec(&spec)?;
        let output = out.stdout_text();
        let version = SmolvmVersion::parse(&output).ok_or(SmolvmError::BadVersion { output })?;
        Ok(*self.version.get_or_init(|| version))
    }

    /// Runs `command`; a non-zero exit is [`SmolvmError::Failed`].
    pub fn run(&self, command: &SmolvmCommand) -> Result<CommandOutput, SmolvmError> {
        let spec = self.spec(command, self.version()?);
        self.run_spec(&spec)
    }

    fn run_spec(&self, spec: &CommandSpec) -> Result<CommandOutput, SmolvmError> {
        let out = self.run_raw(spec)?;
        if out.success() {
            Ok(out)
        } else {
            Err(SmolvmError::Failed {
                argv: spec.argv(),
                code: out.code,
                stderr: out.stderr_text(),
            })
        }
    }

    fn run_raw(&self, spec: &CommandSpec) -> Result<CommandOutput, SmolvmError> {
        self.runner
            .run(spec)
            .map_err(|source| SmolvmError::NotInstalled {
                program: self.program.to_string_lossy().into_owned(),
                source,
            })
    }

    /// `machine create --from`.
    pub fn create(
        &self,
        name: &str,
        from: &Path,
        allow_cidrs: &[String],
        storage_gib: Option<u64>,
    ) -> Result<(), SmolvmError> {
        self.run(&SmolvmCommand::Create {
            name: name.into(),
            from: from.into(),
            allow_cidrs: allow_cidrs.to_vec(),
            storage_gib,
        })
        .map(drop)
    }

    /// `machine start`.
    pub fn start(&self, name: &str) -> Result<(), SmolvmError> {
        self.run(&SmolvmCommand::Start { name: name.into() })
            .map(drop)
    }

    /// `machine stop`.
    pub fn stop(&self, name: &str) -> Result<(), SmolvmError> {
        self.run(&SmolvmCommand::Stop { name: name.into() })
            .map(drop)
    }

    /// `machine delete -f`.
    pub fn delete(&self, name: &str) -> Result<(), SmolvmError> {
        self.run(&SmolvmCommand::Delete { name: name.into() })
            .map(drop)
    }

    /// `machine cp HOST NAME:GUEST`.
    pub fn copy_in(&self, name: &str, host: &Path, guest: &str) -> Result<(), SmolvmError> {
        self.run(&SmolvmCommand::CopyIn {
            name: name.into(),
            host: host.into(),
            guest: guest.into(),
        })
        .map(drop)
    }

    /// `machine ls --json`.
    pub fn list(&self) -> Result<Vec<MachineEntry>, SmolvmError> {
        let command = SmolvmCommand::List;
        let out = self.run(&command)?;
        parse_list(&out.stdout).map_err(|detail| SmolvmError::BadOutput {
            argv: self
                .spec(
                    &command,
                    self.version().unwrap_or(SmolvmVersion::new(0, 0, 0)),
                )
                .argv(),
            detail,
        })
    }

    /// `machine data-dir`: the directory holding the machine's disks.
    pub fn data_dir(&self, name: &str) -> Result<PathBuf, SmolvmError> {
        let command = SmolvmCommand::DataDir { name: name.into() };
        let out = self.run(&command)?;
        let text = out.stdout_text();
        let dir = PathBuf::from(text.trim());
        if dir.is_absolute() {
            Ok(dir)
        } else {
            Err(SmolvmError::BadOutput {
                argv: self.spec(&command, self.version()?).argv(),
                detail: format!("{:?} is not an absolute path", text.trim()),
            })
        }
    }

    /// The invocation that starts the in-box agent: `machine exec -i` of
    /// [`TOOLBOX_PATH`] with the bottle's environment, its stdin and
    /// stdout the agent's channel. No wrapper: nothing but frames may
    /// cross that channel.
    pub fn toolbox_spec(
        &self,
        name: &str,
        env: &[(String, String)],
    ) -> Result<CommandSpec, SmolvmError> {
        self.in_box_agent_spec(name, env, vec![TOOLBOX_PATH.to_string()])
    }

    /// `machine exec -i` of the in-box agent as `argv` (one of its modes).
    fn in_box_agent_spec(
        &self,
        name: &str,
        env: &[(String, String)],
        argv: Vec<String>,
    ) -> Result<CommandSpec, SmolvmError> {
        let command = SmolvmCommand::Exec {
            name: name.into(),
            argv,
            env: env.to_vec(),
            workdir: None,
            interactive: true,
            tty: false,
        };
        Ok(self.spec(&command, self.version()?))
    }

    /// Starts the in-box agent ([`Smolvm::toolbox_spec`]) as a long-lived
    /// child whose stdin and stdout are piped to us.
    pub fn spawn_toolbox(
        &self,
        name: &str,
        env: &[(String, String)],
    ) -> Result<PipedChild, SmolvmError> {
        self.spawn_in_box_agent(self.toolbox_spec(name, env)?)
    }

    /// Starts the in-box agent's relay to `port` on the guest's loopback
    /// (`bottle_core::port_relay`), its stdin and stdout piped to us: one
    /// published port's connection.
    pub fn spawn_relay(
        &self,
        name: &str,
        env: &[(String, String)],
        port: u16,
    ) -> Result<PipedChild, SmolvmError> {
        self.spawn_in_box_agent(self.in_box_agent_spec(
            name,
            env,
            bottle_core::port_relay::relay_argv(port),
        )?)
    }

    fn spawn_in_box_agent(&self, spec: CommandSpec) -> Result<PipedChild, SmolvmError> {
        self.runner
            .spawn_piped(&spec)
            .map_err(|source| SmolvmError::NotInstalled {
                program: self.program.to_string_lossy().into_owned(),
                source,
            })
    }

    /// `pack create`; returns the `.smolmachine` sidecar it wrote.
    pub fn pack_create(&self, image: &str, output: &Path) -> Result<PathBuf, SmolvmError> {
        let command = SmolvmCommand::PackCreate {
            image: image.into(),
            output: output.into(),
        };
        self.run(&command)?;
        let sidecar = sidecar_path(output);
        if sidecar.is_file() {
            Ok(sidecar)
        } else {
            Err(SmolvmError::BadOutput {
                argv: self.spec(&command, self.version()?).argv(),
                detail: format!("it did not write {}", sidecar.display()),
            })
        }
    }

    /// Runs `argv` in the guest to completion, keeping stdout and stderr
    /// apart and telling smolvm's own failure from the guest's exit code
    /// (see the module docs).
    pub fn exec(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<GuestOutput, SmolvmError> {
        let (spec, marker) = self.exec_spec(name, argv, env)?;
        let out = self.run_raw(&spec)?;
        guest_output(name, &spec, out, &marker)
    }

    /// Like [`Smolvm::exec`], waiting at most `limit`: `None` when the
    /// guest command was still running then. The `smolvm` client is
    /// killed; the guest command may keep running.
    pub fn exec_within(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
        limit: std::time::Duration,
    ) -> Result<Option<GuestOutput>, SmolvmError> {
        let (spec, marker) = self.exec_spec(name, argv, env)?;
        let spec = spec.timeout(limit);
        match self.runner.run(&spec) {
            Ok(out) => guest_output(name, &spec, out, &marker).map(Some),
            Err(err)
                if matches!(
                    bottle_core::exec::ExecError::of(&err),
                    Some(bottle_core::exec::ExecError::TimedOut { .. })
                ) =>
            {
                Ok(None)
            }
            Err(source) => Err(SmolvmError::NotInstalled {
                program: self.program.to_string_lossy().into_owned(),
                source,
            }),
        }
    }

    /// Runs `argv` in the guest with `input` as its stdin (`machine exec
    /// -i`, which streams it and then closes it), to completion, telling
    /// smolvm's failure from the guest's exit code like [`Smolvm::exec`].
    pub fn exec_input(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
        input: Vec<u8>,
    ) -> Result<GuestOutput, SmolvmError> {
        let (spec, marker) = self.wrapped_spec(name, argv, env, true)?;
        let spec = spec.stdin(input);
        let out = self.run_raw(&spec)?;
        guest_output(name, &spec, out, &marker)
    }

    /// Starts `argv` in the guest (`machine exec -i`, no wrapper) with its
    /// stdout piped to us, for output too large to hold (`bottle cp` out
    /// of a machine); its stderr is dropped, its exit code is
    /// [`PipedChild::wait`]'s.
    pub fn spawn_exec(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<PipedChild, SmolvmError> {
        let command = SmolvmCommand::Exec {
            name: name.into(),
            argv: argv.to_vec(),
            env: env.to_vec(),
            workdir: None,
            interactive: true,
            tty: false,
        };
        let spec = self.spec(&command, self.version()?);
        self.runner
            .spawn_piped(&spec)
            .map_err(|source| SmolvmError::NotInstalled {
                program: self.program.to_string_lossy().into_owned(),
                source,
            })
    }

    /// The wrapped `machine exec` invocation and its marker.
    fn exec_spec(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<(CommandSpec, String), SmolvmError> {
        self.wrapped_spec(name, argv, env, false)
    }

    /// [`exec_wrapper`] around `argv` as a `machine exec`, with `-i` when
    /// `interactive`.
    fn wrapped_spec(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
        interactive: bool,
    ) -> Result<(CommandSpec, String), SmolvmError> {
        let marker = format!("__bottle_rc_{}=", nonce());
        let command = SmolvmCommand::Exec {
            name: name.into(),
            argv: exec_wrapper(&marker, argv),
            env: env.to_vec(),
            workdir: None,
            interactive,
            tty: false,
        };
        Ok((self.spec(&command, self.version()?), marker))
    }

    /// The invocation for an interactive (TTY) exec; run it with an
    /// [`crate::interactive::InteractiveRunner`]. No wrapper: the exit code
    /// is the guest's unless smolvm printed `Error:` first, which the
    /// operator sees on their terminal.
    pub fn exec_interactive_spec(
        &self,
        name: &str,
        argv: &[String],
        env: &[(String, String)],
        tty: bool,
    ) -> Result<CommandSpec, SmolvmError> {
        let command = SmolvmCommand::Exec {
            name: name.into(),
            argv: argv.to_vec(),
            env: env.to_vec(),
            workdir: None,
            interactive: true,
            tty,
        };
        Ok(self.spec(&command, self.version()?))
    }
}

/// The guest's output from a finished wrapped exec, or smolvm's own
/// failure when the marker is missing.
fn guest_output(
    machine: &str,
    spec: &CommandSpec,
    out: CommandOutput,
    marker: &str,
) -> Result<GuestOutput, SmolvmError> {
    match split_marker(&out.stderr, marker.as_bytes()) {
        Some((exit_code, stderr)) => Ok(GuestOutput {
            exit_code,
            stdout: out.stdout,
            stderr,
        }),
        // No marker: the wrapper never ran or never finished, so this is
        // smolvm's own failure; its `Error:` line says why.
        None if !out.success() && out.stderr_text().contains("Error:") => {
            Err(SmolvmError::Failed {
                argv: spec.argv(),
                code: out.code,
                stderr: out.stderr_text(),
            })
        }
        None => Err(SmolvmError::ExecMarkerMissing {
            machine: machine.into(),
            code: out.code,
            stderr: out.stderr_text(),
        }),
    }
}

/// `OUT.smolmachine`: the sidecar `pack create -o OUT` writes.
pub fn sidecar_path(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_os_string();
    name.push(".smolmachine");
    PathBuf::from(name)
}

/// Parses `machine ls --json`: a pretty-printed array, `[]` when empty.
pub fn parse_list(stdout: &[u8]) -> Result<Vec<MachineEntry>, String> {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|err| format!("not a JSON array of machines: {err}"))
}

/// The guest argv that runs `argv` and reports its exit code after
/// `marker` on the last line of stderr. `"$@"` keeps every argument intact
/// (no re-quoting); a missing program gives sh's 127 like any shell.
pub fn exec_wrapper(marker: &str, argv: &[String]) -> Vec<String> {
    let script = r#"m=$1; shift; "$@"; rc=$?; printf '\n%s%d\n' "$m" "$rc" >&2; exit "$rc""#;
    let mut out = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "bottle-exec".to_string(),
        marker.to_string(),
    ];
    out.extend(argv.iter().cloned());
    out
}

/// Finds the last marker line in `stderr`; returns the exit code and
/// stderr without the marker line (and without the newline the wrapper
/// put before it).
pub fn split_marker(stderr: &[u8], marker: &[u8]) -> Option<(i32, Vec<u8>)> {
    let at = stderr
        .windows(marker.len())
        .rposition(|window| window == marker)?;
    let digits_start = at + marker.len();
    let line_end = stderr[digits_start..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(stderr.len(), |p| digits_start + p);
    let code: i32 = std::str::from_utf8(&stderr[digits_start..line_end])
        .ok()?
        .parse()
        .ok()?;
    let before_end = if at > 0 && stderr[at - 1] == b'\n' {
        at - 1
    } else {
        at
    };
    let mut rest = stderr[..before_end].to_vec();
    let after = (line_end + 1).min(stderr.len());
    rest.extend_from_slice(&stderr[after..]);
    Some((code, rest))
}

/// 128 random bits as hex, for exec markers.
fn nonce() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !filled {
        // Uniqueness, not secrecy, is what the marker needs.
        use std::hash::{BuildHasher as _, Hasher as _};
        let state = std::collections::hash_map::RandomState::new();
        let mut h = state.build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        bytes[..8].copy_from_slice(&h.finish().to_le_bytes());
        bytes[8..].copy_from_slice(&state.build_hasher().finish().to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(command: &SmolvmCommand, version: SmolvmVersion) -> Vec<String> {
        command
            .args(version)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    const OLD: SmolvmVersion = SmolvmVersion::new(0, 8, 0);
    const NEW: SmolvmVersion = SmolvmVersion::new(1, 9, 3);

    #[test]
    fn create_takes_the_name_positionally_before_1_1_and_as_a_flag_after() {
        let create = SmolvmCommand::Create {
            name: "bot-bottle-a".into(),
            from: "/c/a.smolmachine".into(),
            allow_cidrs: vec!["192.168.7.2/32".into()],
            storage_gib: None,
        };
        assert_eq!(
            argv(&create, OLD),
            [
                "machine",
                "create",
                "--from",
                "/c/a.smolmachine",
                "--net",
                "--allow-cidr",
                "192.168.7.2/32",
                "bot-bottle-a"
            ]
        );
        assert_eq!(
            argv(&create, NEW),
            [
                "machine",
                "create",
                "--name",
                "bot-bottle-a",
                "--from",
                "/c/a.smolmachine",
                "--net",
                "--allow-cidr",
                "192.168.7.2/32"
            ]
        );
    }

    #[test]
    fn the_disk_cap_is_the_storage_disk_in_gib() {
        let create = SmolvmCommand::Create {
            name: "bot-bottle-a".into(),
            from: "/c/a.smolmachine".into(),
            allow_cidrs: vec!["192.168.7.2/32".into()],
            storage_gib: Some(10),
        };
        assert_eq!(
            argv(&create, NEW),
            [
                "machine",
                "create",
                "--name",
                "bot-bottle-a",
                "--from",
                "/c/a.smolmachine",
                "--storage",
                "10",
                "--net",
                "--allow-cidr",
                "192.168.7.2/32"
            ]
        );
    }

    #[test]
    fn delete_shapes() {
        let delete = SmolvmCommand::Delete { name: "m".into() };
        assert_eq!(argv(&delete, OLD), ["machine", "delete", "m", "-f"]);
        assert_eq!(
            argv(&delete, NEW),
            ["machine", "delete", "--name", "m", "-f"]
        );
    }

    #[test]
    fn start_stop_ls_cp_pack_shapes() {
        for v in [OLD, NEW] {
            assert_eq!(
                argv(&SmolvmCommand::Start { name: "m".into() }, v),
                ["machine", "start", "--name", "m"]
            );
            assert_eq!(
                argv(&SmolvmCommand::Stop { name: "m".into() }, v),
                ["machine", "stop", "--name", "m"]
            );
            assert_eq!(argv(&SmolvmCommand::List, v), ["machine", "ls", "--json"]);
            assert_eq!(
                argv(&SmolvmCommand::DataDir { name: "m".into() }, v),
                ["machine", "data-dir", "-n", "m"]
            );
            assert_eq!(
                argv(
                    &SmolvmCommand::CopyIn {
                        name: "m".into(),
                        host: "/h/ca.pem".into(),
                        guest: "/etc/bottle/ca.pem".into()
                    },
                    v
                ),
                ["machine", "cp", "/h/ca.pem", "m:/etc/bottle/ca.pem"]
            );
            assert_eq!(
                argv(
                    &SmolvmCommand::PackCreate {
                        image: "localhost:5000/bottle-agent:abc".into(),
                        output: "/c/abc".into()
                    },
                    v
                ),
                [
                    "pack",
                    "create",
                    "--image",
                    "localhost:5000/bottle-agent:abc",
                    "-o",
                    "/c/abc"
                ]
            );
            assert_eq!(argv(&SmolvmCommand::Version, v), ["--version"]);
        }
    }

    #[test]
    fn exec_puts_the_command_after_a_double_dash() {
        let exec = SmolvmCommand::Exec {
            name: "m".into(),
            argv: vec!["echo".into(), "--name".into(), "x".into()],
            env: vec![("HTTPS_PROXY".into(), "http://192.168.7.2:8888".into())],
            workdir: Some("/work".into()),
            interactive: true,
            tty: true,
        };
        assert_eq!(
            argv(&exec, NEW),
            [
                "machine",
                "exec",
                "--name",
                "m",
                "-e",
                "HTTPS_PROXY=http://192.168.7.2:8888",
                "-w",
                "/work",
                "-i",
                "-t",
                "--",
                "echo",
                "--name",
                "x"
            ]
        );
    }

    #[test]
    fn the_in_box_agent_runs_under_exec_i_without_a_wrapper_or_a_terminal() {
        use bottle_test_support::RecordingRunner;
        let runner = Arc::new(RecordingRunner::printing("smolvm 1.9.3\n"));
        let smolvm = Smolvm::with_program("smolvm", runner.clone());
        let env = [(
            "HTTPS_PROXY".to_string(),
            "http://192.168.7.2:8888".to_string(),
        )];
        smolvm.spawn_toolbox("bot-bottle-a", &env).unwrap();
        assert_eq!(
            runner.calls().last().unwrap(),
            &[
                "smolvm",
                "machine",
                "exec",
                "--name",
                "bot-bottle-a",
                "-e",
                "HTTPS_PROXY=http://192.168.7.2:8888",
                "-i",
                "--",
                "/.bottle/toolbox"
            ]
        );
    }

    #[test]
    fn marker_is_split_off_and_the_rest_kept() {
        let marker = b"__bottle_rc_abc=";
        let stderr = b"oops\n\n__bottle_rc_abc=3\n";
        assert_eq!(split_marker(stderr, marker), Some((3, b"oops\n".to_vec())));
        // No trailing newline from the command: the wrapper's own newline
        // is the one removed.
        let stderr = b"partial\n__bottle_rc_abc=0\n";
        assert_eq!(split_marker(stderr, marker), Some((0, b"partial".to_vec())));
        // A forged marker earlier in the output loses to the last one.
        let stderr = b"__bottle_rc_abc=0\n\n__bottle_rc_abc=1\n";
        assert_eq!(
            split_marker(stderr, marker),
            Some((1, b"__bottle_rc_abc=0\n".to_vec()))
        );
        // Late writes after the marker are kept.
        let stderr = b"\n__bottle_rc_abc=0\nlate\n";
        assert_eq!(split_marker(stderr, marker), Some((0, b"late\n".to_vec())));
        assert_eq!(split_marker(b"Error: machine not running\n", marker), None);
    }

    #[test]
    fn the_wrapper_reports_exit_codes_through_a_real_shell() {
        use bottle_core::exec::SystemRunner;
        let marker = "__bottle_rc_test=";
        let wrapped = exec_wrapper(
            marker,
            &[
                "sh".into(),
                "-c".into(),
                "printf out; printf err >&2; exit 7".into(),
            ],
        );
        let spec = CommandSpec::new(&wrapped[0]).args(&wrapped[1..]);
        let out = SystemRunner.run(&spec).unwrap();
        assert_eq!(out.code, Some(7));
        assert_eq!(out.stdout, b"out");
        assert_eq!(
            split_marker(&out.stderr, marker.as_bytes()),
            Some((7, b"err".to_vec()))
        );
    }

    #[test]
    fn ls_json_parses_and_ignores_unknown_fields() {
        let text = br#"[
  {
    "name": "bot-bottle-a",
    "state": "running",
    "cpus": 2,
    "memory_mib": 4096,
    "pid": 4242,
    "mounts": 0,
    "ports": 0,
    "created_at": 1766000000,
    "network": true
  }
]"#;
        let list = parse_list(text).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].name, "bot-bottle-a");
        assert_eq!(list[0].state(), "running");
        assert_eq!(list[0].created().as_deref(), Some("1766000000"));
        assert_eq!(parse_list(b"[]\n").unwrap(), Vec::new());
        assert!(parse_list(b"No machines found").is_err());
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
        assert_eq!(nonce().len(), 32);
    }
}
