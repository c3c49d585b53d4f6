//! The in-box agent of a docker bottle: the static `bottle-toolbox` a
//! launch puts at [`TOOLBOX_PATH`], and what `execute` answers in a bottle
//! that has none.
//!
//! A missing binary does not fail the launch: the in-box agent serves the
//! sandbox interface and isolates nothing, so a bottle without it is as
//! safe, only unable to `execute`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::query_parameters::ContainerArchiveInfoOptionsBuilder;
use bottle_core::audit_files::AUDIT_LOG_FILE;
use bottle_core::bundle_binary::TOOLBOX_BIN_ENV;
use bottle_core::sandbox::{
    OpenedChannel, SandboxError, TOOLBOX_PATH, ToolCall, ToolResult, Toolbox,
};

use crate::client::Engine;
use crate::data::StatePaths;
use crate::error::{DockerError, is_not_found};
use crate::reset::{ChannelProcess, channel_process};

/// A docker bottle's channel to its in-box agent, shared by the clones of
/// the bottle so they reuse one agent process.
#[derive(Clone)]
pub(crate) struct InBoxAgent {
    toolbox: Arc<Toolbox>,
    /// Set once the binary was found in the box: it lives on the box's
    /// read-only mount, which a reset does not touch, so the channel a
    /// reset makes the next call open again needs no second look. Also
    /// says that this handle calls the agent, so the standby it prepares
    /// gets a channel opened ahead.
    installed: Arc<AtomicBool>,
    /// The channel opened ahead into a waiting standby, by its ID.
    ahead: Arc<Mutex<Option<(String, OpenedChannel)>>>,
}

impl std::fmt::Debug for InBoxAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InBoxAgent")
    }
}

impl InBoxAgent {
    /// The channel of `bottle`, whose calls are recorded in the audit log
    /// under `state_dir`.
    pub(crate) fn new(bottle: &str, state_dir: &Path) -> InBoxAgent {
        let log = StatePaths::new(state_dir).logs().join(AUDIT_LOG_FILE);
        InBoxAgent {
            toolbox: Arc::new(Toolbox::new(bottle, Some(log))),
            installed: Arc::new(AtomicBool::new(false)),
            ahead: Arc::new(Mutex::new(None)),
        }
    }

    /// True once this handle started the agent: a handle that calls.
    pub(crate) fn calls(&self) -> bool {
        self.installed.load(Ordering::Relaxed)
    }

    /// Starts the agent in `standby` (its ID; running, before it waits) as
    /// `user` by `argv` and keeps the greeted channel for the reset that
    /// swaps that box in ([`InBoxAgent::swapped_in`]). Returns the agent's
    /// process on the host, which the standby's checks leave out.
    pub(crate) fn open_ahead(
        &self,
        engine: &Engine,
        standby: &str,
        user: &str,
        argv: &[String],
    ) -> Result<ChannelProcess, DockerError> {
        let mut exec = None;
        let opened = self
            .toolbox
            .open_ahead(|| {
                let (stream, id) =
                    crate::toolbox_stream::open_exec(engine, standby, user, argv.to_vec())
                        .map_err(|err| SandboxError::Boot {
                            bottle: self.toolbox.bottle().to_string(),
                            why: format!("in its standby {standby}: {err}"),
                        })?;
                exec = Some(id);
                Ok(stream)
            })
            .map_err(|err| DockerError::ResetState {
                what: format!("cannot open the in-box agent's channel into the standby: {err}"),
            })?;
        let exec = exec.unwrap_or_default();
        let process = channel_process(exec_pid(engine, &exec, standby)?)?;
        *self.ahead_lock() = Some((standby.to_string(), opened));
        Ok(process)
    }

    /// After a reset swapped `standby` (its ID) in: the channel opened
    /// ahead into it becomes this bottle's. Any other is dropped.
    pub(crate) fn swapped_in(&self, standby: Option<&str>) {
        let ahead = self.ahead_lock().take();
        if let (Some((id, opened)), Some(standby)) = (ahead, standby)
            && id == standby
        {
            self.toolbox.adopt(opened);
        }
    }

    fn ahead_lock(&self) -> std::sync::MutexGuard<'_, Option<(String, OpenedChannel)>> {
        self.ahead.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the channel: a reset ends the agent's process with the box,
    /// so the next call starts a new one.
    pub(crate) fn forget(&self) {
        self.toolbox.forget();
    }

    /// Runs `call` over the channel, starting the agent in `container` as
    /// `user` by `argv` when there is none yet.
    pub(crate) fn execute(
        &self,
        engine: &Engine,
        bottle: &str,
        container: &str,
        user: &str,
        argv: &[String],
        call: &ToolCall,
    ) -> Result<ToolResult, SandboxError> {
        self.toolbox.execute(call, || {
            let boot = |err: DockerError| SandboxError::Boot {
                bottle: bottle.to_string(),
                why: err.to_string(),
            };
            if !self.installed.load(Ordering::Relaxed) {
                if !installed(engine, container).map_err(boot)? {
                    return Err(not_installed(bottle));
                }
                self.installed.store(true, Ordering::Relaxed);
            }
            crate::toolbox_stream::open_argv(engine, container, user, argv.to_vec()).map_err(boot)
        })
    }
}

/// The host pid of the running exec `exec` in `container`. The daemon
/// records it once the runtime's exec call returned, which may come after
/// the process already answered its hello: asked again, bounded.
fn exec_pid(engine: &Engine, exec: &str, container: &str) -> Result<u32, DockerError> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let pid = engine
            .block_on(engine.docker.inspect_exec(exec))
            .map_err(DockerError::api(format!(
                "inspect the in-box agent's exec in {container}"
            )))?
            .pid
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid > 0);
        match pid {
            Some(pid) => return Ok(pid),
            None if Instant::now() > deadline => {
                return Err(DockerError::ResetState {
                    what: format!(
                        "the daemon names no process for the in-box agent in {container}"
                    ),
                });
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// True if the container has the in-box agent (a stat; the binary is not
/// downloaded). A container that is gone is an error, not a bottle without
/// the agent: the stat answers both with a bare 404, so the container is
/// asked for then.
fn installed(engine: &Engine, container: &str) -> Result<bool, DockerError> {
    let options = ContainerArchiveInfoOptionsBuilder::default()
        .path(TOOLBOX_PATH)
        .build();
    match engine.block_on(
        engine
            .docker
            .get_container_archive_info(container, Some(options)),
    ) {
        Ok(_) => Ok(true),
        Err(err) if is_not_found(&err) => {
            engine
                .block_on(engine.docker.inspect_container(container, None))
                .map_err(DockerError::api(format!("inspect container {container}")))?;
            Ok(false)
        }
        Err(err) => Err(DockerError::api(format!(
            "look for {TOOLBOX_PATH} in {container}"
        ))(err)),
    }
}

/// `execute` in a bottle launched without the in-box agent.
pub(crate) fn not_installed(bottle: &str) -> SandboxError {
    SandboxError::NotAvailable {
        bottle: bottle.to_string(),
        what: "execute".into(),
        why: format!(
            "the bottle has no in-box agent at {TOOLBOX_PATH} (no static bottle-toolbox was found when it was launched)"
        ),
        fix: format!(
            "install bottle with `cargo xtask install`, or set {TOOLBOX_BIN_ENV} to a static bottle-toolbox (`cargo xtask dist` builds one); `bottle doctor` shows which one is found; then `bottle stop {bottle}` and start it again"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_agent_says_how_to_install_it() {
        let err = not_installed("bot-bottle-x");
        assert_eq!(bottle_core::Coded::code(&err), "BOT-X001");
        let fix = bottle_core::Coded::fix(&err).unwrap();
        assert!(
            fix.contains("cargo xtask install") && fix.contains("BOTTLE_TOOLBOX_BIN"),
            "{fix}"
        );
    }
}
