//! One worker thread per bottle, holding that bottle's `Box<dyn Bottle>`
//! across requests, so the in-box agent's channel stays open between
//! calls. A worker runs its bottle's calls one at a time, in order; the
//! workers of different bottles run side by side.
//!
//! Why a thread that owns the bottle rather than a lock around it: a
//! `dyn Bottle` need not be `Send`, and backends block on their own
//! runtimes, which must not run on the server's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use bottle_core::sandbox::reset::{ResetFiles, halted};
use bottle_core::sandbox::{ResetReport, ToolCall, ToolResult};
use bottle_core::{BackendKind, Bottle, slug};
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

/// How a worker finds its bottle (tests give their own).
/// Finds a bottle by name, with the backend it runs on.
type AttachFn = dyn Fn(&str) -> Result<(Box<dyn Bottle>, BackendKind), ApiError> + Send + Sync;
type Attach = Arc<AttachFn>;

/// The workers, by bottle name.
pub(crate) struct Bottles {
    attach: Attach,
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
    /// Workers that find their bottles on the backends `global` names.
    pub(crate) fn new(global: Global, state_root: PathBuf) -> Bottles {
        Bottles::with_attach(
            state_root,
            Arc::new(move |name: &str| {
                crate::lookup::find_bottle_and_backend(&global, name).map_err(|failure| {
                    // Bad input to a lookup is a name no backend has.
                    let status = if failure.exit == crate::failure::EXIT_USAGE {
                        StatusCode::NOT_FOUND
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    ApiError::from_failure(failure, status)
                })
            }),
        )
    }

    fn with_attach(state_root: PathBuf, attach: Attach) -> Bottles {
        Bottles {
            attach,
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
        let (attach, state_root, owned) = (
            Arc::clone(&self.attach),
            self.state_root.clone(),
            name.to_string(),
        );
        std::thread::Builder::new()
            .name(format!("serve-{name}"))
            .spawn(move || work(&*attach, &state_root, &owned, &jobs))
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
fn work(attach: &AttachFn, state_root: &Path, name: &str, jobs: &mpsc::Receiver<Job>) {
    let files = ResetFiles::new(state_root.join(slug::slug_of(name)));
    let mut bottle: Option<(Box<dyn Bottle>, BackendKind)> = None;
    let mut preparers: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Execute(call, reply) => {
                let result = refuse_halted(name, &files)
                    .and_then(|()| attached(attach, name, &mut bottle))
                    .and_then(|bottle| bottle.execute(&call).map_err(ApiError::from));
                let _ = reply.send(result);
            }
            Job::Reset(reply) => {
                let result = attached(attach, name, &mut bottle)
                    .and_then(|bottle| bottle.reset().map_err(ApiError::from));
                let verified = result.as_ref().is_ok_and(|report| report.verified);
                let _ = reply.send(result);
                // The next reset's standby, made beside this worker's
                // calls: on a handle sharing this one's channel where the
                // backend gives one (the first call after that reset then
                // starts no in-box agent), else by a preparer process.
                if let (true, Some((bottle, kind))) = (verified, bottle.as_ref()) {
                    preparers.retain(|preparer| !preparer.is_finished());
                    match bottle.background_preparer() {
                        Some(prepare) => {
                            let log = files.golden_dir().join(crate::reset::PREPARE_LOG);
                            let (owned, name) = (prepare, bottle.name().to_string());
                            let spawned = std::thread::Builder::new()
                                .name(format!("prepare-{name}"))
                                .spawn(move || crate::reset::log_prepared(&log, &name, owned()));
                            preparers.extend(spawned.ok());
                        }
                        None if bottle.reset_is_preparable() => {
                            let _ = crate::reset::spawn_prepare(bottle.name(), *kind);
                        }
                        None => {}
                    }
                }
            }
            Job::Close(reply) => {
                // A standby half made when the server ends would be left
                // behind: its preparation finishes first.
                for preparer in preparers.drain(..) {
                    let _ = preparer.join();
                }
                drop(bottle.take());
                let _ = reply.send(());
                return;
            }
        }
    }
}

/// The bottle, attached on first use.
fn attached<'b>(
    attach: &AttachFn,
    name: &str,
    bottle: &'b mut Option<(Box<dyn Bottle>, BackendKind)>,
) -> Result<&'b dyn Bottle, ApiError> {
    if bottle.is_none() {
        *bottle = Some(attach(name)?);
    }
    bottle
        .as_ref()
        .map(|(bottle, _)| bottle.as_ref())
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bottle_core::backend::{BackendError, ExecOutput};

    use super::*;

    /// What the fake bottles did, in order.
    #[derive(Default)]
    struct Log {
        attaches: AtomicUsize,
        drops: AtomicUsize,
        events: Mutex<Vec<String>>,
        /// Released when bottle `b` ran a call.
        b_ran: (Mutex<bool>, std::sync::Condvar),
    }

    impl Log {
        fn event(&self, text: String) {
            self.events.lock().unwrap().push(text);
        }
    }

    struct FakeBottle {
        name: String,
        log: Arc<Log>,
    }

    impl Drop for FakeBottle {
        fn drop(&mut self) {
            self.log.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Bottle for FakeBottle {
        fn name(&self) -> &str {
            &self.name
        }
        fn exec(&self, _: &[String]) -> Result<ExecOutput, BackendError> {
            unreachable!("serve runs calls through execute")
        }
        fn exec_interactive(&self, _: &[String]) -> Result<i32, BackendError> {
            unreachable!("serve runs calls through execute")
        }
        fn exec_piped(&self, _: &[String]) -> Result<i32, BackendError> {
            unreachable!("serve runs calls through execute")
        }
        fn copy_in(
            &self,
            _: &bottle_core::copy::CopyIn,
            _: &bottle_core::copy::GuestPath,
        ) -> Result<(), BackendError> {
            unreachable!("serve copies nothing")
        }
        fn copy_out(
            &self,
            _: &bottle_core::copy::GuestPath,
            _: &mut dyn std::io::Write,
        ) -> Result<(), BackendError> {
            unreachable!("serve copies nothing")
        }
        fn execute(
            &self,
            call: &ToolCall,
        ) -> Result<ToolResult, bottle_core::sandbox::SandboxError> {
            let what = call.summary();
            self.log.event(format!("{} enter {what}", self.name));
            if what == "wait-for-b" {
                // Bottle b's call must run while this one holds bottle a.
                let (ran, changed) = &self.log.b_ran;
                let guard = ran.lock().unwrap();
                let (guard, timeout) = changed
                    .wait_timeout_while(guard, Duration::from_secs(30), |ran| !*ran)
                    .unwrap();
                assert!(*guard && !timeout.timed_out(), "b never ran beside a");
            }
            if self.name.ends_with("-b") {
                *self.log.b_ran.0.lock().unwrap() = true;
                self.log.b_ran.1.notify_all();
            }
            self.log.event(format!("{} leave {what}", self.name));
            Ok(ToolResult {
                exit_code: 0,
                stdout: what.into_bytes(),
                stderr: Vec::new(),
                truncated: false,
                duration: Duration::ZERO,
                evidence_hash: String::new(),
            })
        }
        fn reset(
            &self,
        ) -> Result<bottle_core::sandbox::ResetReport, bottle_core::sandbox::SandboxError> {
            unreachable!("the worker tests run calls only")
        }
        fn prepare_reset(&self) -> Result<String, BackendError> {
            unreachable!("the worker tests run calls only")
        }
        fn commit(&self, _: &str) -> Result<bottle_core::CommitReport, BackendError> {
            unreachable!("serve commits nothing")
        }
        fn connect_port(
            &self,
            _: u16,
        ) -> Result<bottle_core::sandbox::ToolboxStream, BackendError> {
            unreachable!("serve publishes no port")
        }
    }

    fn bottles(state_root: &Path) -> (Arc<Bottles>, Arc<Log>) {
        let log = Arc::new(Log::default());
        let attach_log = Arc::clone(&log);
        let bottles = Bottles::with_attach(
            state_root.to_path_buf(),
            Arc::new(move |name: &str| {
                attach_log.attaches.fetch_add(1, Ordering::SeqCst);
                let bottle = Box::new(FakeBottle {
                    name: name.to_string(),
                    log: Arc::clone(&attach_log),
                }) as Box<dyn Bottle>;
                Ok((bottle, BackendKind::Docker))
            }),
        );
        (Arc::new(bottles), log)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn one_bottle_is_attached_once_and_kept_until_closed() {
        let root = tempfile::tempdir().unwrap();
        let (bottles, log) = bottles(root.path());
        runtime().block_on(async {
            for word in ["one", "two", "three"] {
                let result = bottles
                    .execute("bot-bottle-a", ToolCall::argv([word]))
                    .await
                    .unwrap();
                assert_eq!(result.stdout, word.as_bytes());
            }
            assert_eq!(log.attaches.load(Ordering::SeqCst), 1);
            assert_eq!(log.drops.load(Ordering::SeqCst), 0);
            bottles.close("bot-bottle-a").await;
            assert_eq!(log.drops.load(Ordering::SeqCst), 1);
            bottles
                .execute("bot-bottle-a", ToolCall::argv(["again"]))
                .await
                .unwrap();
            assert_eq!(log.attaches.load(Ordering::SeqCst), 2);
        });
    }

    #[test]
    fn calls_to_one_bottle_run_in_turn_and_bottles_side_by_side() {
        let root = tempfile::tempdir().unwrap();
        let (bottles, log) = bottles(root.path());
        runtime().block_on(async {
            let (a, queued, b) = (
                Arc::clone(&bottles),
                Arc::clone(&bottles),
                Arc::clone(&bottles),
            );
            let first = tokio::spawn(async move {
                a.execute("bot-bottle-a", ToolCall::argv(["wait-for-b"]))
                    .await
            });
            // Queued behind the first on the same bottle, once it entered.
            let entered = |log: &Log| {
                log.events
                    .lock()
                    .unwrap()
                    .contains(&"bot-bottle-a enter wait-for-b".to_string())
            };
            let log_for_wait = Arc::clone(&log);
            tokio::task::spawn_blocking(move || {
                bottle_test_support::wait_until(
                    "a's first call starts",
                    Duration::from_secs(30),
                    || entered(&log_for_wait),
                );
            })
            .await
            .unwrap();
            let second = tokio::spawn(async move {
                queued
                    .execute("bot-bottle-a", ToolCall::argv(["after"]))
                    .await
            });
            b.execute("bot-bottle-b", ToolCall::argv(["beside"]))
                .await
                .unwrap();
            first.await.unwrap().unwrap();
            second.await.unwrap().unwrap();
        });
        let events = log.events.lock().unwrap().clone();
        let at = |e: &str| events.iter().position(|x| x == e).unwrap();
        assert!(
            at("bot-bottle-a leave wait-for-b") < at("bot-bottle-a enter after"),
            "{events:?}"
        );
        assert!(
            at("bot-bottle-b enter beside") < at("bot-bottle-a leave wait-for-b"),
            "{events:?}"
        );
    }

    #[test]
    fn a_halted_bottle_runs_no_call_and_names_must_be_bottle_names() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a")).unwrap();
        std::fs::write(
            root.path().join("a/halted.json"),
            r#"{"time":"2026-11-24T09:00:00.000Z","reason":"diverged:open_fds"}"#,
        )
        .unwrap();
        let (bottles, log) = bottles(root.path());
        let err = runtime()
            .block_on(bottles.execute("bot-bottle-a", ToolCall::argv(["true"])))
            .unwrap_err();
        assert_eq!(
            (err.status, err.code.as_str()),
            (StatusCode::CONFLICT, "BOT-C043")
        );
        assert!(err.message.contains("diverged:open_fds"), "{}", err.message);
        assert_eq!(log.attaches.load(Ordering::SeqCst), 0);

        assert_eq!(canonical("a").unwrap(), "bot-bottle-a");
        assert_eq!(canonical("bot-bottle-a").unwrap(), "bot-bottle-a");
        for bad in ["", "A", "a..b", "../x", "a b"] {
            assert_eq!(
                canonical(bad).unwrap_err().status,
                StatusCode::NOT_FOUND,
                "{bad:?}"
            );
        }
    }
}
