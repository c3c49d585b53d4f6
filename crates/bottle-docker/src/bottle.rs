//! A running docker bottle: exec (captured or on the operator's terminal),
//! tool calls through the in-box agent, and `bottle cp` both ways
//! ([`crate::copy`]), all through the Engine API.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bottle_core::backend::{BackendError, Bottle, ExecOutput};
use bottle_core::copy::{CopyIn, GuestPath};
use bottle_core::sandbox::{ResetReport, SandboxError, ToolCall, ToolResult, ToolboxStream};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::client::Engine;
use crate::error::DockerError;
use crate::reset::DockerResetSubstrate;
use crate::toolbox::InBoxAgent;
use crate::tty;

/// A running bottle's agent container.
#[derive(Debug, Clone)]
pub struct DockerBottle {
    pub(crate) engine: Engine,
    pub(crate) name: String,
    pub(crate) container: String,
    /// The image's entrypoint + cmd, run when no command is given.
    pub(crate) default_command: Vec<String>,
    pub(crate) image: String,
    /// Who the agent's commands run as (`None`: the image's root).
    pub(crate) user: Option<String>,
    /// What the launch could not do, for the operator (already escaped).
    pub(crate) warnings: Vec<String>,
    /// The channel to the in-box agent, opened by the first `execute`.
    pub(crate) toolbox: InBoxAgent,
    /// The bundle container's name (a halted reset stops it too).
    pub(crate) bundle: String,
    /// The bottle's state dir (its golden snapshot and baseline).
    pub(crate) state_dir: PathBuf,
    /// For a gVisor box, the runtime's binary its sandbox must run
    /// (`None`: the container tier).
    pub(crate) gvisor_binary: Option<PathBuf>,
}

impl DockerBottle {
    /// The user every exec names: the container's own user is the
    /// keep-alive's, never the agent's.
    fn exec_user(&self) -> &str {
        self.user.as_deref().unwrap_or("0:0")
    }

    fn command(&self, argv: &[String]) -> Result<Vec<String>, DockerError> {
        let argv = if !argv.is_empty() {
            argv.to_vec()
        } else if self.default_command.is_empty() {
            return Err(DockerError::NoCommand {
                image: self.image.clone(),
            });
        } else {
            self.default_command.clone()
        };
        Ok(self.in_box(argv))
    }

    /// `argv` as the Engine must start it in this box: in a gVisor box
    /// under the in-box agent's system-call filter, which gVisor does not
    /// give the processes the Engine execs
    /// ([`bottle_core::sandbox::FILTERED`]).
    fn in_box(&self, argv: Vec<String>) -> Vec<String> {
        if self.gvisor_binary.is_some() {
            bottle_core::sandbox::filtered_argv(&argv)
        } else {
            argv
        }
    }

    /// The agent container's name.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// The bottle's state dir.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// How [`Bottle::reset`] snapshots, reverts and reads this bottle.
    pub fn reset_substrate(&self) -> DockerResetSubstrate {
        DockerResetSubstrate::new(
            self.engine.clone(),
            &self.name,
            &self.container,
            &self.bundle,
            &self.state_dir,
            self.gvisor_binary.clone(),
        )
    }
}

/// Runs `argv` in `container` to completion, keeping stdout and stderr
/// apart (the daemon multiplexes them when there is no TTY).
pub async fn exec_captured(
    engine: &Engine,
    container: &str,
    argv: &[String],
    user: Option<&str>,
) -> Result<ExecOutput, DockerError> {
    let docker = &engine.docker;
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                attach_stdin: Some(false),
                tty: Some(false),
                cmd: Some(argv.to_vec()),
                user: user.map(str::to_string),
                ..CreateExecOptions::default()
            },
        )
        .await
        .map_err(DockerError::api(format!("create an exec in {container}")))?;
    let started = docker
        .start_exec(&exec.id, None)
        .await
        .map_err(DockerError::api(format!("start an exec in {container}")))?;
    let mut out = ExecOutput::default();
    if let StartExecResults::Attached { mut output, .. } = started {
        while let Some(chunk) = output.next().await {
            match chunk.map_err(DockerError::api(format!(
                "read exec output from {container}"
            )))? {
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message } => {
                    out.stdout.extend_from_slice(&message);
                }
                bollard::container::LogOutput::StdErr { message } => {
                    out.stderr.extend_from_slice(&message);
                }
                bollard::container::LogOutput::StdIn { .. } => {}
            }
        }
    }
    out.exit_code = exit_code(engine, &exec.id, container).await?;
    Ok(out)
}

/// The exit code of a finished exec. The output stream can end a moment
/// before the daemon records the exit, so this asks again briefly.
async fn exit_code(engine: &Engine, exec_id: &str, container: &str) -> Result<i32, DockerError> {
    for _ in 0..200 {
        let inspect = engine
            .docker
            .inspect_exec(exec_id)
            .await
            .map_err(DockerError::api(format!("inspect an exec in {container}")))?;
        if inspect.running != Some(true) {
            return Ok(inspect
                .exit_code
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(DockerError::Terminal {
        action: format!("read the exit code of an exec in {container}"),
        detail: "the daemon still reports it running after its output ended".into(),
    })
}

/// Resolves once `container` no longer runs, with how it ended. An exec's
/// output does not always end with its box: under runsc 20221219 an exec
/// in a box the OOM killer ended never returns (the daemon waits on a
/// process in a sandbox that is gone; `docker exec` hangs the same way).
/// Never resolves when the Engine cannot be asked, so a failed watch
/// cannot end a command that still runs.
async fn box_stopped(engine: &Engine, container: &str) -> String {
    let options = bollard::query_parameters::WaitContainerOptionsBuilder::default()
        .condition("not-running")
        .build();
    let mut wait = engine.docker.wait_container(container, Some(options));
    match wait.next().await {
        Some(Ok(_)) | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => {}
        _ => std::future::pending::<()>().await,
    }
    match engine.docker.inspect_container(container, None).await {
        Ok(inspect) => {
            let state = inspect.state.unwrap_or_default();
            match (state.oom_killed, state.exit_code) {
                (Some(true), _) => "was killed at its memory limit (out of memory)".into(),
                (_, Some(code)) => format!("stopped (exit code {code})"),
                (_, None) => "stopped".into(),
            }
        }
        Err(_) => "is gone".into(),
    }
}

/// Runs `exec`, an exec in `container`, to its end, or ends it with
/// [`DockerError::BoxStopped`] when the box stops and the exec does not end
/// within [`OUTPUT_AFTER_STOP`].
async fn until_box_stops<T>(
    engine: &Engine,
    container: &str,
    exec: impl std::future::Future<Output = Result<T, DockerError>>,
) -> Result<T, DockerError> {
    tokio::pin!(exec);
    tokio::select! {
        done = &mut exec => done,
        how = box_stopped(engine, container) => {
            match tokio::time::timeout(OUTPUT_AFTER_STOP, exec).await {
                Ok(done) => done,
                Err(_) => Err(DockerError::BoxStopped {
                    container: container.to_string(),
                    how,
                }),
            }
        }
    }
}

/// How long an exec's output may go on after its box stopped before the
/// exec is given up: under runc the output ends with the box, a moment
/// after the Engine records the stop.
const OUTPUT_AFTER_STOP: Duration = Duration::from_secs(2);

impl DockerBottle {
    /// `argv` on the operator's terminal (when there is one); `started`
    /// is told once the Engine has seen its process.
    fn interactive(
        &self,
        argv: &[String],
        started: Option<&mut dyn FnMut()>,
    ) -> Result<i32, BackendError> {
        let argv = self.command(argv)?;
        let terminal = tty::stdin_and_stdout_are_terminals();
        Ok(attached(
            &self.engine,
            &self.container,
            &argv,
            self.exec_user(),
            terminal,
            started,
        )?)
    }
}

impl Bottle for DockerBottle {
    fn launch_warnings(&self) -> &[String] {
        &self.warnings
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn exec(&self, argv: &[String]) -> Result<ExecOutput, BackendError> {
        let argv = self.command(argv)?;
        Ok(self.engine.block_on(until_box_stops(
            &self.engine,
            &self.container,
            exec_captured(&self.engine, &self.container, &argv, Some(self.exec_user())),
        ))?)
    }

    fn exec_interactive(&self, argv: &[String]) -> Result<i32, BackendError> {
        self.interactive(argv, None)
    }

    fn exec_session(
        &self,
        argv: &[String],
        started: &mut dyn FnMut(),
    ) -> Result<i32, BackendError> {
        self.interactive(argv, Some(started))
    }

    fn exec_piped(&self, argv: &[String]) -> Result<i32, BackendError> {
        let argv = self.command(argv)?;
        Ok(attached(
            &self.engine,
            &self.container,
            &argv,
            self.exec_user(),
            false,
            None,
        )?)
    }

    fn copy_in(&self, copy: &CopyIn, dest: &GuestPath) -> Result<(), BackendError> {
        crate::copy::copy_in(
            &self.engine,
            &self.name,
            &self.container,
            &self.state_dir,
            copy,
            dest,
        )
    }

    fn copy_out(&self, path: &GuestPath, out: &mut dyn Write) -> Result<(), BackendError> {
        crate::copy::copy_out(&self.engine, &self.name, &self.container, path, out)
    }

    fn execute(&self, call: &ToolCall) -> Result<ToolResult, SandboxError> {
        self.toolbox.execute(
            &self.engine,
            &self.name,
            &self.container,
            self.exec_user(),
            &self.in_box(vec![bottle_core::sandbox::TOOLBOX_PATH.to_string()]),
            call,
        )
    }

    fn reset(&self) -> Result<ResetReport, SandboxError> {
        // The revert ends the in-box agent with every process of the box
        // (a restart) or leaves it frozen in the retired box (a standby).
        self.toolbox.forget();
        let substrate = self.reset_substrate();
        let report = bottle_core::sandbox::reset::reset(&substrate, substrate.files());
        // Only a verified box gets the channel opened into it ahead.
        let swapped_in = report.as_ref().ok().and_then(|_| substrate.swapped_in());
        self.toolbox.swapped_in(swapped_in.as_deref());
        report
    }

    /// A handle that calls the agent also starts it in the standby with
    /// its channel open, so its first call after the reset starts none.
    fn prepare_reset(&self) -> Result<String, BackendError> {
        let substrate = self.reset_substrate();
        let argv = self.in_box(vec![bottle_core::sandbox::TOOLBOX_PATH.to_string()]);
        let open_ahead = |standby: &str| {
            self.toolbox
                .open_ahead(&self.engine, standby, self.exec_user(), &argv)
        };
        let open_channel: Option<crate::reset::OpenChannel<'_>> =
            self.toolbox.calls().then_some(&open_ahead);
        Ok(match substrate.prepare_standby(open_channel)? {
            crate::reset::StandbyPrepared::Waiting { channel_open } => format!(
                "a verified standby waits as {}{}",
                substrate.standby_name(),
                if channel_open {
                    ", its in-box agent's channel open"
                } else {
                    ""
                }
            ),
            crate::reset::StandbyPrepared::NotUsed(why) => {
                format!("no standby: {why}; the next reset restarts the box")
            }
        })
    }

    fn background_preparer(&self) -> Option<bottle_core::backend::BackgroundPreparer> {
        let shared = self.clone();
        Some(Box::new(move || shared.prepare_reset()))
    }

    fn connect_port(&self, port: u16) -> Result<ToolboxStream, BackendError> {
        Ok(crate::toolbox_stream::open_argv(
            &self.engine,
            &self.container,
            self.exec_user(),
            bottle_core::port_relay::relay_argv(port),
        )?)
    }

    fn commit(&self, image: &str) -> Result<bottle_core::backend::CommitReport, BackendError> {
        let source = crate::commit::CommitSource {
            engine: &self.engine,
            container: &self.container,
            image: &self.image,
            state_dir: &self.state_dir,
        };
        Ok(crate::commit::commit(&source, image)?)
    }
}

/// Runs `argv` attached to this process's stdio. With `use_tty` the exec
/// gets a TTY on the operator's terminal: raw mode is restored on every
/// way out (return, error, panic, SIGTERM/SIGHUP to `bottle`) and the
/// exec's TTY follows the terminal's size. Without, stdin and the two
/// output streams pass through as bytes.
fn attached(
    engine: &Engine,
    container: &str,
    argv: &[String],
    user: &str,
    use_tty: bool,
    started: Option<&mut dyn FnMut()>,
) -> Result<i32, DockerError> {
    // Dropped at the end of this function, after the exec, whatever happens.
    let _raw = if use_tty {
        Some(tty::RawMode::enable()?)
    } else {
        None
    };
    engine.block_on(attached_async(
        engine, container, argv, user, use_tty, started,
    ))
}

/// How long an exec's start is watched for its process (or its failure to
/// start) before the session is told it runs anyway.
const START_WATCH: Duration = Duration::from_secs(10);

/// Waits until the Engine has seen the exec's process (a pid, running or
/// already exited) and calls `started`; an exec that ended with no process
/// (an executable not found or not executable: the OCI runtime's 126)
/// never started, and `started` is not called.
async fn watch_start(
    engine: &Engine,
    exec_id: &str,
    container: &str,
    started: &mut dyn FnMut(),
) -> Result<(), DockerError> {
    let deadline = tokio::time::Instant::now() + START_WATCH;
    let mut pause = Duration::from_millis(2);
    loop {
        let inspect = engine
            .docker
            .inspect_exec(exec_id)
            .await
            .map_err(DockerError::api(format!("inspect an exec in {container}")))?;
        if inspect.pid.is_some_and(|pid| pid > 0) {
            started();
            return Ok(());
        }
        if inspect.running != Some(true) && inspect.exit_code.is_some() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            // The daemon says neither: do not call a running agent dead.
            started();
            return Ok(());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

async fn attached_async(
    engine: &Engine,
    container: &str,
    argv: &[String],
    user: &str,
    use_tty: bool,
    started: Option<&mut dyn FnMut()>,
) -> Result<i32, DockerError> {
    use tokio::signal::unix::{SignalKind, signal};
    // Watched before the first size is read, so a resize in between (a
    // session holder's client attaching as the agent starts) is not lost.
    let mut winch = signal(SignalKind::window_change()).map_err(|err| DockerError::Terminal {
        action: "watch for terminal signals".into(),
        detail: err.to_string(),
    })?;
    let docker = &engine.docker;
    let env = use_tty.then(|| {
        vec![format!(
            "TERM={}",
            std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())
        )]
    });
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(use_tty),
                cmd: Some(argv.to_vec()),
                user: Some(user.to_string()),
                env,
                ..CreateExecOptions::default()
            },
        )
        .await
        .map_err(DockerError::api(format!("create an exec in {container}")))?;
    let begun = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: false,
                tty: use_tty,
                output_capacity: None,
            }),
        )
        .await
        .map_err(DockerError::api(format!("start an exec in {container}")))?;
    let StartExecResults::Attached { mut output, input } = begun else {
        return exit_code(engine, &exec.id, container).await;
    };
    if let Some(started) = started {
        watch_start(engine, &exec.id, container, started).await?;
    }
    let resize = |size: Option<(u16, u16)>| {
        let id = exec.id.clone();
        async move {
            if let Some((rows, cols)) = size {
                // A failed resize only garbles the layout; not worth failing.
                let _ = docker
                    .resize_exec(
                        &id,
                        bollard::exec::ResizeExecOptions {
                            height: rows,
                            width: cols,
                        },
                    )
                    .await;
            }
        }
    };
    if use_tty {
        resize(tty::window_size()).await;
    }
    let signal_err = |err: std::io::Error| DockerError::Terminal {
        action: "watch for terminal signals".into(),
        detail: err.to_string(),
    };
    // Only with a TTY: these handlers replace the default "terminate" for
    // the rest of the process, which is wanted only while raw mode needs
    // undoing.
    let mut term = if use_tty {
        Some(signal(SignalKind::terminate()).map_err(signal_err)?)
    } else {
        None
    };
    let mut hup = if use_tty {
        Some(signal(SignalKind::hangup()).map_err(signal_err)?)
    } else {
        None
    };
    let session = async {
        let (stdin_rx, pump) = tty::StdinPump::start();
        // Input is written by its own task: a command that fills its output
        // before it reads all its input (`cat` of a large file) would
        // otherwise wait on us while we wait on it. Both end with the
        // output, or when the box stopped and this future is dropped.
        let writer = AbortOnDrop(tokio::spawn(forward_stdin(stdin_rx, input, use_tty)));
        let mut stdout = std::io::stdout();
        let mut stderr = std::io::stderr();
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    None => break,
                    Some(Err(err)) => {
                        return Err(DockerError::api(format!("read exec output from {container}"))(err));
                    }
                    Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                        let _ = stderr.write_all(&message).and_then(|()| stderr.flush());
                    }
                    Some(Ok(other)) => {
                        let _ = stdout.write_all(other.as_ref()).and_then(|()| stdout.flush());
                    }
                },
                _ = winch.recv() => {
                    if use_tty {
                        resize(tty::window_size()).await;
                    }
                }
                _ = maybe_recv(&mut term) => return Ok(128 + 15),
                _ = maybe_recv(&mut hup) => return Ok(128 + 1),
            }
        }
        drop((pump, writer));
        exit_code(engine, &exec.id, container).await
    };
    until_box_stops(engine, container, session).await
}

/// A task aborted when this is dropped: the input writer of an exec whose
/// session ended, however it ended.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Copies the operator's input into the exec until it ends, then passes
/// the end on: a TTY sees it as ^D, a pipe as EOF (the write half closes).
async fn forward_stdin(
    mut stdin: tokio::sync::mpsc::Receiver<Vec<u8>>,
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    use_tty: bool,
) {
    while let Some(bytes) = stdin.recv().await {
        if input.write_all(&bytes).await.is_err() {
            return;
        }
    }
    if use_tty {
        let _ = input.write_all(&[4]).await;
    } else {
        let _ = input.shutdown().await;
    }
}

async fn maybe_recv(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}
