//! One worker thread per bottle, holding that bottle's `Box<dyn Bottle>`
//! across requests, so the in-box agent's channel stays open between
//! calls. A worker runs its bottle's calls one at a time, in order; the
//! workers of different bottles run side by side.
//!
//! Why a thread that owns the bottle rather than a lock around it: a
//! `dyn Bottle` need not be `Send`, and backends block on their own
//! runtimes, which must not run on the server's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc;

use bottle_core::sandbox::reset::{ResetFiles, halted};
use bottle_core::sandbox::{ResetReport, ToolCall, ToolResult};
use bottle_core::{Bottle, slug};
use hyper::StatusCode;
use tokio::sync::oneshot;

use super::error::ApiError;
use crate::args::Global;

/// What a worker is asked to do.
enum Job {
    Execute(Box<ToolCall>, oneshot::Sender<Result<ToolResult, ApiError>>),
    Reset(oneshot::Sender<Result<ResetReport, ApiError>>),
    /// Drop the bottle (its channel closes) and end, before a shutdown.
    Close(oneshot::Sender<()>),
}

/// The workers, by bottle name.
pub(crate) struct Bottles {
    global: Global,
    state_root: PathBuf,
    workers: Mutex<HashMap<String, mpsc::Sender<Job>>>,
}

/// `bot-bottle-<slug>` for `name` in either form, or 404 when it cannot
/// name a bottle at all.
pub(crate) fn canonical(name: &str) -> Result<String, ApiError> {
    let slug = slug::slug_of(name);
    if slug::slugify(slug).as_deref() != Ok(slug) {
        return Err(no_bottle(name));
    }
    Ok(slug::bottle_name(slug))
}

fn no_bottle(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "BOT-C004",
        format!("no bottle named {name}"),
        "see `GET /v1/bottles`",
    )
}

impl Bottles {
    pub(crate) fn new(global: Global, state_root: PathBuf) -> Bottles {
        Bottles {
            global,
            state_root,
            workers: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `call` in the bottle `name` (canonical).
    pub(crate) async fn execute(&self, name: &str, call: ToolCall) -> Result<ToolResult, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.send(name, Job::Execute(Box::new(call), reply))?;
        answer.await.unwrap_or_else(|_| Err(worker_ended(name)))
    }

    /// Resets the bottle `name` (canonical).
    pub(crate) async fn reset(&self, name: &str) -> Result<ResetReport, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.send(name, Job::Reset(reply))?;
        answer.await.unwrap_or_else(|_| Err(worker_ended(name)))
    }

    /// Ends the worker of `name`, if any, once its queued calls ran.
    pub(crate) async fn close(&self, name: &str) {
        let worker = self.lock().remove(name);
        if let Some(worker) = worker {
            let (reply, answer) = oneshot::channel();
            if worker.send(Job::Close(reply)).is_ok() {
                let _ = answer.await;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<Job>>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives `job` to the worker of `name`, starting one when there is
    /// none or the last one ended.
    fn send(&self, name: &str, job: Job) -> Result<(), ApiError> {
        let mut workers = self.lock();
        let job = match workers.get(name) {
            Some(worker) => match worker.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (sender, jobs) = mpsc::channel();
        let (global, state_root, owned) = (
            self.global.clone(),
            self.state_root.clone(),
            name.to_string(),
        );
        std::thread::Builder::new()
            .name(format!("serve-{name}"))
            .spawn(move || work(&global, &state_root, &owned, &jobs))
            .map_err(|err| {
                ApiError::internal(format!("cannot start a worker for {name}: {err}"))
            })?;
        sender.send(job).map_err(|_| worker_ended(name))?;
        workers.insert(name.to_string(), sender);
        Ok(())
    }
}

fn worker_ended(name: &str) -> ApiError {
    ApiError::internal(format!("the worker of {name} ended during the request"))
}

/// A worker: attaches to the bottle on its first job and keeps it.
fn work(global: &Global, state_root: &std::path::Path, name: &str, jobs: &mpsc::Receiver<Job>) {
    let files = ResetFiles::new(state_root.join(slug::slug_of(name)));
    let mut bottle: Option<Box<dyn Bottle>> = None;
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Execute(call, reply) => {
                let result = refuse_halted(name, &files)
                    .and_then(|()| attached(global, name, &mut bottle))
                    .and_then(|bottle| bottle.execute(&call).map_err(ApiError::from));
                let _ = reply.send(result);
            }
            Job::Reset(reply) => {
                let result = attached(global, name, &mut bottle)
                    .and_then(|bottle| bottle.reset().map_err(ApiError::from));
                let _ = reply.send(result);
            }
            Job::Close(reply) => {
                drop(bottle.take());
                let _ = reply.send(());
                return;
            }
        }
    }
}

/// The bottle, attached on first use.
fn attached<'b>(
    global: &Global,
    name: &str,
    bottle: &'b mut Option<Box<dyn Bottle>>,
) -> Result<&'b dyn Bottle, ApiError> {
    if bottle.is_none() {
        let found = crate::commands::find_bottle(global, name).map_err(|failure| {
            // Bad input to a lookup is a name no backend has.
            let status = if failure.exit == crate::failure::EXIT_USAGE {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            ApiError::from_failure(failure, status)
        })?;
        *bottle = Some(found);
    }
    bottle
        .as_deref()
        .ok_or_else(|| ApiError::internal("the bottle vanished from its worker"))
}

/// A halted bottle runs no more calls (its reset already refuses).
fn refuse_halted(name: &str, files: &ResetFiles) -> Result<(), ApiError> {
    match halted(files) {
        None => Ok(()),
        Some(halt) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "BOT-C043",
            format!("{name} was halted at {}: {}", halt.time, halt.reason),
            format!(
                "do not trust what ran in it: read `bottle logs {name}`, then shut it down (`DELETE /v1/bottles/{name}`) and boot a new one"
            ),
        )),
    }
}
