//! The gate's HTTP side: the daemon, its connections, routing a request to
//! its endpoint, and the audit lines and plain-text refusals.
//!
//! Here: the daemon and the request dispatch. `setup`: limits, runtime,
//! repository checks and the work dir; `route`: which repository and
//! endpoint a request names; `advertise`: `info/refs` (refreshing a mirror
//! first); `fetch`: upload-pack; `push`: the push pre-check and
//! receive-pack; `pipe`: the streaming between request, git and response.

mod advertise;
mod fetch;
mod pipe;
mod push;
mod route;
mod setup;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Instant;

use bottle_core::bundle::BundleConfig;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::route::{Endpoint, git_protocol, route};
use self::setup::GateRepo;
pub use self::setup::{GateLimits, GitRuntime};
use super::command::{Git, Service};
use super::push_rules::RuntimePushRules;
use crate::BundleError;
use crate::audit::{AUDIT_VERSION, AuditLog, AuditRecord, Decision};
use crate::body::{BoxBody, full};
use crate::daemons::{Daemon, bind};
use crate::io::IdleIo;
use bottle_core::time::now_rfc3339_millis;

/// The daemon's name in audit lines, errors and logs.
const DAEMON: &str = "git-gate";

/// The git-gate daemon's shared state.
#[derive(Debug)]
pub struct GitGate {
    bottle: String,
    repos: BTreeMap<String, Arc<GateRepo>>,
    /// Refs the operator approved at run time (supervise), merged into a
    /// repository's rules for every push.
    push_rules: RuntimePushRules,
    audit: AuditLog,
    git: Git,
    work_dir: PathBuf,
    remove_work_dir: bool,
    results_dir: PathBuf,
    limits: GateLimits,
    slots: Arc<Semaphore>,
    port: AtomicU16,
    seq: AtomicU64,
}

impl Drop for GitGate {
    fn drop(&mut self) {
        if self.remove_work_dir {
            let _ = std::fs::remove_dir_all(&self.work_dir);
        }
    }
}

impl GitGate {
    /// Makes pushes also allow the refs `rules` holds (now and later):
    /// the set supervise adds the operator's push approvals to.
    pub fn share_push_rules(&mut self, rules: RuntimePushRules) {
        self.push_rules = rules;
    }

    fn http1(&self) -> hyper::server::conn::http1::Builder {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout)
            .max_buf_size((self.limits.max_header_bytes + 8192).max(64 * 1024));
        b
    }

    /// Serves connections from `listener` until it fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<(), BundleError> {
        if let Ok(addr) = listener.local_addr() {
            self.port.store(addr.port(), Ordering::Relaxed);
        }
        let conns = Arc::new(Semaphore::new(self.limits.max_connections.max(1)));
        loop {
            let (stream, _, permit) =
                crate::accept::next_connection(&listener, &conns, DAEMON).await?;
            let this = self.clone();
            tokio::spawn(async move {
                let io = TokioIo::new(IdleIo::new(stream, this.limits.idle_timeout));
                let svc_this = this.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let this = svc_this.clone();
                    async move { Ok::<_, std::convert::Infallible>(this.handle(req).await) }
                });
                let _ = this.http1().serve_connection(io, svc).await;
                drop(permit);
            });
        }
    }

    /// Answers one request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<BoxBody> {
        if self.audit.is_degraded() {
            // Nothing is fetched or pushed unaudited.
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                crate::audit::AUDIT_UNAVAILABLE_MESSAGE,
            );
        }
        let start = Instant::now();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let method = req.method().clone();
        let (segment, endpoint) = match route(&method, &path, &query) {
            Ok(r) => r,
            Err((status, message)) => {
                let entry = Entry::new(Decision::Deny, "", method.as_str(), &path, "not_found");
                return self.refuse(entry, status, &message, start);
            }
        };
        let Some(repo) = self.lookup(segment) else {
            let shown: String = segment.chars().take(100).collect();
            let known: Vec<&str> = self.repos.keys().map(String::as_str).collect();
            let message = format!(
                "there is no repository {shown:?} here (repositories: {}); fix: use $GIT_GATE_URL/<name>.git with a name from the manifest's git list",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
            let entry = Entry::new(
                Decision::Deny,
                &shown,
                endpoint.method(),
                &path,
                "unknown_repo",
            );
            return self.refuse(entry, StatusCode::NOT_FOUND, &message, start);
        };
        let protocol = git_protocol(&req);
        match endpoint {
            Endpoint::InfoRefs(service) => {
                self.info_refs(&repo, service, protocol, &path, start).await
            }
            Endpoint::Rpc(Service::UploadPack) => {
                self.upload_pack(repo, req, protocol, path, start).await
            }
            Endpoint::Rpc(Service::ReceivePack) => self.receive_pack(repo, req, path, start).await,
        }
    }

    fn lookup(&self, segment: &str) -> Option<Arc<GateRepo>> {
        segment
            .strip_suffix(".git")
            .and_then(|n| self.repos.get(n))
            .or_else(|| self.repos.get(segment))
            .cloned()
    }

    fn write_audit(&self, e: Entry, status: StatusCode, start: Instant) {
        self.audit.write(AuditRecord {
            v: AUDIT_VERSION,
            time: now_rfc3339_millis(),
            bottle: self.bottle.clone(),
            daemon: DAEMON.into(),
            decision: e.decision,
            host: e.repo,
            port: self.port.load(Ordering::Relaxed),
            method: e.method,
            path: e.path,
            status: status.as_u16(),
            bytes_up: e.bytes_up,
            bytes_down: e.bytes_down,
            duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
            reason: e.reason,
            rule: e.refs,
            count: 1,
            truncated: false,
            hosts: Vec::new(),
        });
    }

    /// Answers with a text message (git shows it to the agent as
    /// `remote: ...` for info/refs) and writes the audit line.
    fn refuse(
        &self,
        entry: Entry,
        status: StatusCode,
        message: &str,
        start: Instant,
    ) -> Response<BoxBody> {
        self.write_audit(entry, status, start);
        text(status, message)
    }

    async fn permit(&self) -> Result<OwnedSemaphorePermit, Response<BoxBody>> {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| text(StatusCode::SERVICE_UNAVAILABLE, "the gate is shutting down"))
    }
}

/// Fields of one audit line.
struct Entry {
    decision: Decision,
    repo: String,
    method: String,
    path: String,
    reason: String,
    refs: String,
    bytes_up: u64,
    bytes_down: u64,
}

impl Entry {
    fn new(decision: Decision, repo: &str, method: &str, path: &str, reason: &str) -> Self {
        Self {
            decision,
            repo: repo.into(),
            method: method.into(),
            path: path.chars().take(512).collect(),
            reason: reason.into(),
            refs: String::new(),
            bytes_up: 0,
            bytes_down: 0,
        }
    }
}

fn text(status: StatusCode, message: &str) -> Response<BoxBody> {
    let mut resp = Response::new(full(format!("bottle git-gate: {message}\n")));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

fn git_response(content_type: &str, body: BoxBody) -> Response<BoxBody> {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Builds the git-gate daemon for the supervisor, or `None` when the config
/// has no `git_gate_listen`. `push_rules` is the set supervise adds the
/// operator's push approvals to.
pub fn daemon(
    config: &BundleConfig,
    audit: &AuditLog,
    push_rules: &RuntimePushRules,
) -> Result<Option<Daemon>, BundleError> {
    let Some(listen) = &config.git_gate_listen else {
        return Ok(None);
    };
    let addr = crate::daemons::listen_addr(DAEMON, listen)?;
    let mut gate = GitGate::new(
        config,
        audit.clone(),
        GitRuntime::for_bundle(config.git_hook_program.as_deref())?,
        GateLimits::from_bundle(&config.limits),
    )?;
    gate.share_push_rules(push_rules.clone());
    let gate = Arc::new(gate);
    let listener = bind(DAEMON, addr)?;
    let addr = listener.local_addr().map_err(|source| BundleError::Bind {
        daemon: DAEMON,
        addr: addr.to_string(),
        source,
    })?;
    Ok(Some(Daemon {
        name: DAEMON,
        addr,
        listener,
        serve: Arc::new(move |l| Box::pin(gate.clone().serve(l))),
    }))
}
