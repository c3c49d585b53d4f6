//! The traits every backend implements, and the types they exchange.
//!
//! The traits are synchronous and object-safe so the CLI can hold a
//! `Box<dyn BottleBackend>` chosen at run time. A backend that talks to an
//! async API (bollard) owns its own runtime and blocks on it internally.

use std::fmt;
use std::io::Write;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::copy::{CopyIn, GuestPath};
use crate::error::Coded;
use crate::plan::Plan;
use crate::sandbox::{ResetReport, SandboxError, ToolCall, ToolResult, ToolboxStream};
use crate::spec::BottleSpec;

/// Which backend runs a bottle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A container on a per-bottle `--internal` Docker bridge.
    Docker,
    /// A libkrun microVM driven through the `smolvm` CLI.
    Smolmachines,
}

impl BackendKind {
    /// Every backend, in the order `bottle doctor` reports them.
    pub const ALL: [BackendKind; 2] = [BackendKind::Docker, BackendKind::Smolmachines];

    /// The name used by `--backend` and `BOT_BOTTLE_BACKEND`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Docker => "docker",
            BackendKind::Smolmachines => "smolmachines",
        }
    }

    /// Whether the backend can pass host device nodes into a bottle.
    pub fn supports_devices(self) -> bool {
        matches!(self, BackendKind::Docker)
    }

    /// Parses a `--backend` / `BOT_BOTTLE_BACKEND` value.
    pub fn parse(value: &str) -> Option<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == value)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of failure a backend reports; the CLI maps it to an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The host cannot run this backend (no daemon, no KVM, wrong version).
    Preflight,
    /// Something the operator named does not exist: a bottle, or the
    /// agent's image. Bad input, not a backend failure.
    NotFound,
    /// The request is valid but this backend cannot honour it.
    Unsupported,
    /// Isolation could not be confirmed, so the bottle was refused.
    IsolationUnconfirmed,
    /// A launch running at the same time took what this launch's plan
    /// chose (a subnet) before it created anything: a fresh plan may
    /// succeed.
    PlanTaken,
    /// Anything else that went wrong while driving the backend.
    Failed,
}

/// The one error type that crosses the [`BottleBackend`] boundary.
///
/// Each backend crate keeps its own typed error and converts it into this at
/// the trait boundary ([`BackendError::from_coded`]), keeping its stable code
/// and its fix. Displays as the message alone; the fix is [`Coded::fix`].
#[derive(Debug)]
pub struct BackendError {
    /// Stable code of the underlying error, e.g. `BOT-D003`.
    pub code: &'static str,
    /// What failed, as a lowercase fragment ("could not create network ...").
    pub message: String,
    /// What the operator should do next; empty when nothing can be said.
    pub fix: String,
    /// Classification for exit codes.
    pub kind: BackendErrorKind,
    /// The underlying cause, if any.
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl BackendError {
    /// A new error without an underlying cause.
    pub fn new(
        kind: BackendErrorKind,
        code: &'static str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        BackendError {
            code,
            message: message.into(),
            fix: fix.into(),
            kind,
            source: None,
        }
    }

    /// Wraps a crate's typed error: its code, message and fix, with the
    /// error itself kept as the cause.
    pub fn from_coded<E>(kind: BackendErrorKind, err: E) -> Self
    where
        E: Coded + std::error::Error + Send + Sync + 'static,
    {
        BackendError::new(
            kind,
            err.code(),
            err.to_string(),
            err.fix().unwrap_or_default(),
        )
        .with_source(err)
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl Coded for BackendError {
    fn code(&self) -> &'static str {
        self.code
    }

    fn fix(&self) -> Option<String> {
        Some(self.fix.clone()).filter(|fix| !fix.is_empty())
    }
}

/// The result of a non-interactive command run inside a bottle.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutput {
    /// The command's exit code inside the bottle.
    pub exit_code: i32,
    /// Everything the command wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything the command wrote to stderr.
    pub stderr: Vec<u8>,
}

/// One running (or half-dead) bottle, as `bottle list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BottleInfo {
    /// The bottle's name, `bot-bottle-<slug>` on every backend.
    pub name: String,
    /// The agent from the manifest that runs in it.
    pub agent: String,
    /// The backend that runs it.
    pub backend: BackendKind,
    /// Backend-reported state: running, exited, created, ...
    pub state: String,
    /// The bundle's agent-facing address (IP literal), if known.
    pub bundle_address: Option<String>,
    /// RFC 3339 creation time, if the backend knows it.
    pub created: Option<String>,
    /// Requests waiting for the operator's answer (supervise).
    pub pending_requests: usize,
    /// Whether the bundle can still write the audit log (read from the
    /// host's state dir, like `pending_requests`).
    #[serde(default)]
    pub audit: crate::audit_files::AuditHealth,
    /// Whether the agent of a detached bottle still runs in its session
    /// (read from the host's state dir); `None` when the bottle has no
    /// session (started attached).
    #[serde(default)]
    pub agent_running: Option<bool>,
    /// The bottle's published ports whose forwarder runs (read from the
    /// host's state dir, like `pending_requests`).
    #[serde(default)]
    pub ports: Vec<OpenPort>,
}

/// A published port of a running bottle, as `bottle list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenPort {
    /// The port inside the box.
    pub port: u16,
    /// Where the host listens for it: `127.0.0.1:<host port>`.
    pub listen: String,
}

/// What `cleanup` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupReport {
    /// One line per resource removed: "container bot-bottle-x-agent", ...
    pub removed: Vec<String>,
    /// Resources that could not be removed, with the reason.
    pub failed: Vec<String>,
    /// What was kept on purpose, one line each: `audit log <dir>` (a
    /// stopped bottle's record, `bottle logs` reads it).
    #[serde(default)]
    pub kept: Vec<String>,
}

impl CleanupReport {
    /// Takes in `other`'s lines; a resource already reported removed is
    /// reported once.
    pub fn merge(&mut self, other: CleanupReport) {
        for line in other.removed {
            if !self.removed.contains(&line) {
                self.removed.push(line);
            }
        }
        self.failed.extend(other.failed);
        self.kept.extend(other.kept);
    }
}

/// What `bottle commit` made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitReport {
    /// The image's reference, as the operator named it.
    pub image: String,
    /// Its ID.
    pub id: String,
    /// What of bottle's was taken out of the agent's filesystem, one line
    /// each (`/etc/bottle`, the bottle's CA from `/etc/ssl/certs/...`).
    pub removed: Vec<String>,
}

/// One thing `cleanup` would remove, and why, as the operator confirms it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupItem {
    /// What it is: `bottle`, `state dir`, `pool entry`, `network`, `image`,
    /// `vm`, `bundle`.
    pub kind: String,
    /// Its name (a bottle's, a path, an image's tag).
    pub name: String,
    /// Why it is left over, one line.
    pub why: String,
}

impl CleanupItem {
    /// An item of `kind`.
    pub fn new(kind: &str, name: impl Into<String>, why: impl Into<String>) -> CleanupItem {
        CleanupItem {
            kind: kind.to_string(),
            name: name.into(),
            why: why.into(),
        }
    }

    /// One line for the operator: `image bottle-bundle:1a2b: why`.
    pub fn line(&self) -> String {
        format!("{} {} ({})", self.kind, self.name, self.why)
    }
}

/// One pass of a backend's cleanup: what it found and, when the operator
/// approved a list, which of those to remove now. A backend walks its
/// leftovers once, the same way for the list it shows and for the removal,
/// so the two cannot drift apart; an item is removed only when the
/// operator approved it *and* it still qualifies when the removal runs.
#[derive(Debug)]
pub struct CleanupPass<'a> {
    approved: Option<&'a [CleanupItem]>,
    /// Everything found.
    pub found: Vec<CleanupItem>,
    /// What the removal did.
    pub report: CleanupReport,
}

impl<'a> CleanupPass<'a> {
    /// A pass that only lists.
    pub fn listing() -> CleanupPass<'static> {
        CleanupPass {
            approved: None,
            found: Vec::new(),
            report: CleanupReport::default(),
        }
    }

    /// A pass that removes what it finds of `approved` (by kind and name).
    pub fn removing(approved: &'a [CleanupItem]) -> CleanupPass<'a> {
        CleanupPass {
            approved: Some(approved),
            found: Vec::new(),
            report: CleanupReport::default(),
        }
    }

    /// Records `item` as found; whether to remove it now.
    pub fn found(&mut self, item: CleanupItem) -> bool {
        let remove = self.approved.is_some_and(|approved| {
            approved
                .iter()
                .any(|a| a.kind == item.kind && a.name == item.name)
        });
        self.found.push(item);
        remove
    }
}

/// How far [`BottleBackend::begin_stop`] took a bottle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopProgress {
    /// The bottle is gone; the report says what was removed.
    Stopped(CleanupReport),
    /// The agent can no longer run or reach anything (its box is gone) and
    /// the bottle is durably recorded as stopping; what remains (networks,
    /// files) is [`BottleBackend::stop`]'s to finish, run by a detached
    /// finisher or, if that dies, by `cleanup`. The report says what went.
    Stopping(CleanupReport),
}

/// A backend: finds its bottles, stops them and cleans up after them.
/// Object-safe, so commands that work on any bottle hold a
/// `Box<dyn BottleBackend>`; launching is [`BottleLauncher`].
pub trait BottleBackend {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Refuses early when the host cannot run this backend.
    fn preflight(&self) -> Result<(), BackendError>;

    /// Finds a running bottle by name (for `bottle exec`).
    fn attach(&self, name: &str) -> Result<Box<dyn Bottle>, BackendError>;

    /// Every bottle this backend is running.
    fn list_active(&self) -> Result<Vec<BottleInfo>, BackendError>;

    /// Stops a bottle and removes everything it owns; finishes a bottle
    /// [`begin_stop`](Self::begin_stop) left stopping.
    fn stop(&self, name: &str) -> Result<CleanupReport, BackendError>;

    /// The part of a stop the operator waits for: at least until the agent
    /// can no longer run or reach anything, and the rest recorded so that
    /// a crash before [`stop`](Self::stop) finishes it is finished by
    /// `cleanup`. A backend without a faster first part stops the bottle
    /// whole.
    fn begin_stop(&self, name: &str) -> Result<StopProgress, BackendError> {
        self.stop(name).map(StopProgress::Stopped)
    }

    /// Finishes a stop [`begin_stop`](Self::begin_stop) left
    /// [`StopProgress::Stopping`], and only that: a bottle no longer
    /// recorded as stopping (finished by another, or a new bottle of the
    /// same name) is left alone. Run by the detached finisher.
    fn finish_stop(&self, name: &str) -> Result<CleanupReport, BackendError> {
        self.stop(name)
    }

    /// What `cleanup` would remove now, removing nothing: only what this
    /// install (this state root) made, and nothing in use.
    fn cleanup_plan(&self) -> Result<Vec<CleanupItem>, BackendError>;

    /// Removes the items of `approved` (a [`cleanup_plan`](Self::cleanup_plan)
    /// the operator confirmed) that still qualify; nothing else.
    fn cleanup_approved(&self, approved: &[CleanupItem]) -> Result<CleanupReport, BackendError>;

    /// Removes everything [`cleanup_plan`](Self::cleanup_plan) finds,
    /// unconfirmed (for callers that confirmed otherwise, and tests).
    fn cleanup_orphans(&self) -> Result<CleanupReport, BackendError> {
        let plan = self.cleanup_plan()?;
        self.cleanup_approved(&plan)
    }
}

/// A backend that launches bottles from plans it prepared, with its own
/// typed plan data.
pub trait BottleLauncher: BottleBackend {
    /// What `prepare` resolves for `launch`.
    type PlanData: Clone + fmt::Debug + Serialize + DeserializeOwned;

    /// Resolves everything a launch needs (images, subnet, addresses) into
    /// a plan, without creating anything: the operator may still decline.
    fn prepare(&self, spec: &BottleSpec) -> Result<Plan<Self::PlanData>, BackendError>;

    /// Starts the bottle the plan describes. On failure everything created
    /// so far is removed before the error is returned.
    fn launch(&self, plan: &Plan<Self::PlanData>) -> Result<Box<dyn Bottle>, BackendError>;
}

/// [`Bottle::background_preparer`]'s work: says in one line what it did.
pub type BackgroundPreparer = Box<dyn FnOnce() -> Result<String, BackendError> + Send>;

/// A running bottle.
pub trait Bottle {
    /// `bot-bottle-<slug>`.
    fn name(&self) -> &str;

    /// What the launch of this bottle could not do (e.g. trust its CA in
    /// every store), one line each, safe for the terminal. Empty for a
    /// bottle found by `attach`.
    fn launch_warnings(&self) -> &[String] {
        &[]
    }

    /// Runs a command to completion, keeping stdout and stderr apart.
    fn exec(&self, argv: &[String]) -> Result<ExecOutput, BackendError>;

    /// Runs a command attached to the operator's terminal (TTY, raw mode,
    /// window resize) and returns its exit code.
    fn exec_interactive(&self, argv: &[String]) -> Result<i32, BackendError>;

    /// [`Self::exec_interactive`] for an agent's session: `started` is
    /// called once the command is known to run, before it ends; a command
    /// that cannot start (not found, not executable) returns its exit code
    /// without the call, and its error is in its output. A backend that
    /// cannot tell calls `started` as the exec begins.
    fn exec_session(
        &self,
        argv: &[String],
        started: &mut dyn FnMut(),
    ) -> Result<i32, BackendError> {
        started();
        self.exec_interactive(argv)
    }

    /// Runs a command with this process's stdin, stdout and stderr passed
    /// through as byte streams, without a terminal (`docker exec -i`):
    /// stdin streams in until its end, which the command sees as EOF;
    /// output streams out as it comes. Returns the command's exit code.
    fn exec_piped(&self, argv: &[String]) -> Result<i32, BackendError>;

    /// Copies `copy` into the bottle at `dest`, by `docker cp`'s rules
    /// ([`crate::copy::guest::place`]), owned by the agent's user and with
    /// the times `copy` carries. Never follows a symbolic link inside the
    /// box and never writes under what bottle owns there: the backend
    /// checks the way with [`crate::copy::guest::walk`] where the agent
    /// cannot change it before the write, or writes with no more than the
    /// agent's own rights (each backend says which, `docs/SECURITY.md`).
    fn copy_in(&self, copy: &CopyIn, dest: &GuestPath) -> Result<(), BackendError>;

    /// Writes the box's tar archive of `path` to `out`: the entry itself (a
    /// final link not followed) and, for a directory, what is below it.
    /// What it writes is the box's word: the caller checks every entry
    /// before writing any ([`crate::copy::host`]). A path that does not
    /// exist is [`crate::copy::CopyError::Missing`].
    fn copy_out(&self, path: &GuestPath, out: &mut dyn Write) -> Result<(), BackendError>;

    /// Runs one tool call through the in-box agent (started on the first
    /// call and kept), as the agent's user.
    fn execute(&self, call: &ToolCall) -> Result<ToolResult, SandboxError>;

    /// Returns the box to its golden snapshot and verifies the revert from
    /// three sources; any divergence halts the bottle.
    fn reset(&self) -> Result<ResetReport, SandboxError>;

    /// Prepares, off the reset's path, what the next reset needs (a docker
    /// box's standby, `docs/design/standby-reset.md`); slow, so a caller
    /// runs it in the background after a launch or a reset. Says in one
    /// line what it did, for a log.
    fn prepare_reset(&self) -> Result<String, BackendError>;

    /// Whether [`Bottle::prepare_reset`] can make anything ready for this
    /// bottle's next reset, so a caller starts no preparer for one that
    /// cannot (a microVM restores its disks: nothing waits off the path).
    fn reset_is_preparable(&self) -> bool {
        true
    }

    /// [`Bottle::prepare_reset`] on a handle that shares this one's
    /// channel to the in-box agent, to run on another thread while this
    /// one keeps calling (the sandbox server): what it prepares may then
    /// hold the channel this handle's first call after the next reset
    /// takes. `None` when the preparation gains nothing from sharing this
    /// handle (the caller may run it in another process).
    fn background_preparer(&self) -> Option<BackgroundPreparer> {
        None
    }

    /// Makes the image `image` of the agent's filesystem as it is now, with
    /// the configuration of the image the bottle started from (user,
    /// entrypoint, command, environment, working dir, exposed ports,
    /// labels) and nothing bottle put into the box: its files, its CA, its
    /// environment, its entrypoint. A backend that cannot says why
    /// ([`BackendErrorKind::Unsupported`]).
    fn commit(&self, image: &str) -> Result<CommitReport, BackendError>;

    /// Opens one connection to `port` on the box's own loopback, for a
    /// published port: the in-box agent's relay
    /// ([`crate::port_relay`]) run as the agent's user over the stream
    /// the backend already has (an attached exec, `machine exec -i`), so
    /// the box gains no listener and no route. What the host writes
    /// reaches the port; what comes back starts with the relay's status
    /// line ([`crate::port_relay::read_status`]). Dropping the stream ends
    /// the relay.
    fn connect_port(&self, port: u16) -> Result<ToolboxStream, BackendError>;
}
