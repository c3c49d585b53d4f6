//! supervise: the MCP server through which the agent asks the operator for
//! what it cannot do alone.
//!
//! Transport: MCP "streamable HTTP" reduced to what a tools-only server
//! needs. `POST /mcp` carries one JSON-RPC 2.0 message (or a batch) and is
//! answered with `application/json` (a valid streamable-HTTP reply), or
//! `202 Accepted` with no body when it held only notifications. `GET /mcp`
//! (a server-to-client event stream) is `405`: this server never pushes.
//! Bodies are capped at [`MAX_BODY_BYTES`]; see [`mcp`] for the methods.
//!
//! Tools: `request_egress {host, reason}`, `request_push {repo, ref,
//! reason}`, `notify {message}` each write a request into the bottle's
//! queue ([`bottle_core::requests`], a directory shared with the host) and
//! return its id at once, saying it is pending; `request_status {id}`
//! reads where it stands. Nothing is approved by default or by timeout.
//!
//! `request_push` is refused at once (a tool error) when the repository is
//! not one git-gate serves or is read-only, or the ref is not a ref name;
//! the ref is normalised the way push globs read it (`main` is
//! `refs/heads/main`, a name starting with `refs/` is a full ref name). A
//! ref the rules already let through files nothing and says so.
//!
//! The operator answers with `bottle approve ID` / `bottle deny ID`, which
//! write a decision file. The daemon polls the queue every
//! [`POLL_INTERVAL`]; an approved egress host is added to the
//! [`RuntimeRules`] the running proxy and egress daemons share, and an
//! approved push adds that exact ref of that repository to the
//! [`RuntimePushRules`] git-gate merges into the repository's push globs
//! (no force push, no deletion unless the manifest allows them; never for
//! a repository the manifest does not list read-write). Both take effect
//! without a restart, and every decision gets an audit line (daemon
//! `supervise`, reason `operator_approved` / `operator_denied`; `host` is
//! the host or repository, `rule` the host or full ref name, `path` the
//! request id). After a bundle restart the queue is read again, so
//! approvals persist for the bottle's life.

pub mod mcp;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bottle_core::bundle::{BundleConfig, BundleGitRepo, BundleLimits};
use bottle_core::manifest::GitMode;
use bottle_core::requests::{self, Ask, REQUESTS_VERSION, Request, Status};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request as HttpRequest, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::BundleError;
use crate::allowlist::{Host, Policy, RuntimeRules, Verdict, normalize_host};
use crate::audit::{AuditLog, AuditRecord, Decision};
use crate::body::{BoxBody, full};
use crate::daemons::{Daemon, bind};
use crate::gitgate::push_rules::{RepoPolicy, RuntimePushRules, merged_repo, normalize_push_ref};
use crate::io::IdleIo;
use mcp::{CallError, Tools, arg, opt_arg, tool_result};

const DAEMON: &str = "supervise";
/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
/// Largest POST body accepted.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// How often the queue is read for the operator's decisions.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Most requests one bottle may have pending; more are refused until the
/// operator answers some (a runaway agent cannot fill the host's disk).
pub const MAX_PENDING: usize = 100;
/// Connections served at once.
const MAX_CONNECTIONS: usize = 64;

/// The supervise daemon's state.
pub struct Supervise {
    bottle: String,
    prefix: String,
    dir: PathBuf,
    policy: Policy,
    ports: Vec<u16>,
    runtime: RuntimeRules,
    /// The repositories git-gate serves, by name (empty without git-gate).
    repos: BTreeMap<String, BundleGitRepo>,
    push_rules: RuntimePushRules,
    audit: AuditLog,
    limits: BundleLimits,
    /// Serialises id allocation and the write of the request file.
    next: Mutex<u64>,
    /// Decisions already acted on (by id).
    applied: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Supervise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervise")
            .field("bottle", &self.bottle)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn config_err(detail: String) -> BundleError {
    BundleError::ConfigInvalid {
        path: "requests_dir".into(),
        detail,
    }
}

impl Supervise {
    /// Builds the daemon's state; `runtime` is the rule list the proxy and
    /// egress share, `push_rules` the ref set git-gate merges into its push
    /// globs. Fails when the config has no usable `requests_dir`.
    pub fn new(
        config: &BundleConfig,
        audit: AuditLog,
        runtime: RuntimeRules,
        push_rules: RuntimePushRules,
    ) -> Result<Self, BundleError> {
        let Some(dir) = &config.requests_dir else {
            return Err(config_err(
                "supervise_listen is set but requests_dir is not; the backend must mount the bottle's request queue"
                    .into(),
            ));
        };
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| config_err(format!("cannot create {}: {e}", dir.display())))?;
        let existing =
            requests::ids(&dir).map_err(|e| config_err(format!("cannot read the queue: {e}")))?;
        let next = existing
            .iter()
            .map(|id| requests::sequence(id))
            .max()
            .unwrap_or(0)
            + 1;
        let mut policy = Policy::new(&config.allow, &config.ports)?;
        policy.share_runtime(runtime.clone());
        let repos = if config.git_gate_listen.is_some() {
            config
                .git
                .iter()
                .map(|r| (r.name.clone(), r.clone()))
                .collect()
        } else {
            BTreeMap::new()
        };
        let prefix = bottle_core::slug::slugify(bottle_core::slug::slug_of(&config.bottle))
            .unwrap_or_else(|_| "bottle".into());
        Ok(Self {
            bottle: config.bottle.clone(),
            prefix,
            dir,
            policy,
            ports: config.ports.clone(),
            runtime,
            repos,
            push_rules,
            audit,
            limits: config.limits.clone(),
            next: Mutex::new(next),
            applied: Mutex::new(HashSet::new()),
        })
    }

    /// The queue directory.
    pub fn requests_dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn allowed_now(&self, host: &Host) -> bool {
        self.ports
            .iter()
            .any(|p| matches!(self.policy.check(host, *p), Verdict::Allow { .. }))
    }

    /// The repository `repo` names (`name` or `name.git`) if a push to it
    /// can be approved at all, else why not.
    fn push_target(&self, repo: &str) -> Result<&BundleGitRepo, String> {
        let found = self
            .repos
            .get(repo)
            .or_else(|| repo.strip_suffix(".git").and_then(|n| self.repos.get(n)));
        match found {
            None => {
                let known: Vec<&str> = self.repos.keys().map(String::as_str).collect();
                Err(format!(
                    "there is no repository {repo:?} behind git-gate (repositories: {}); fix: ask for a repository from that list",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ))
            }
            Some(r) if r.mode != GitMode::ReadWrite => Err(format!(
                "repository {} is read-only and a push to it cannot be approved while the bottle runs; fix: ask the operator to make it read-write in the manifest",
                r.name
            )),
            Some(r) => Ok(r),
        }
    }

    /// Writes a new request, or returns the pending one that asks the same.
    fn submit(&self, ask: Ask, reason: &str) -> Result<Value, CallError> {
        let tool_err = |e: requests::RequestError| CallError::Tool(format!("supervise: {e}"));
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let pending = requests::pending(&self.dir).map_err(tool_err)?;
        if let Some(same) = pending.iter().find(|r| r.ask == ask) {
            return Ok(pending_result(same, true));
        }
        if pending.len() >= MAX_PENDING {
            return Err(CallError::Tool(format!(
                "{} requests are already waiting for the operator; wait for answers (request_status) before asking again",
                pending.len()
            )));
        }
        let request = Request {
            v: REQUESTS_VERSION,
            id: format!("{}-{}", self.prefix, *next),
            bottle: self.bottle.clone(),
            ask,
            reason: requests::clip(reason),
            created: bottle_core::time::now_rfc3339(),
            status: Status::Pending,
            decision_reason: None,
        };
        requests::write_request(&self.dir, &request).map_err(tool_err)?;
        *next += 1;
        Ok(pending_result(&request, false))
    }

    fn status(&self, id: &str) -> Result<Value, CallError> {
        if !requests::valid_id(id) {
            return Err(CallError::Tool(format!(
                "{id:?} is not a request id (ids look like {}-1)",
                self.prefix
            )));
        }
        match requests::read_request(&self.dir, id) {
            Ok(Some(r)) => {
                let text = match r.status {
                    Status::Pending => format!("request {id} is pending operator approval"),
                    Status::Approved => format!("request {id} was approved by the operator"),
                    Status::Denied => format!(
                        "request {id} was denied by the operator{}",
                        r.decision_reason
                            .as_deref()
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default()
                    ),
                };
                Ok(tool_result(&text, request_json(&r)))
            }
            Ok(None) => Err(CallError::Tool(format!("no request {id} in this bottle"))),
            Err(e) => Err(CallError::Tool(format!("supervise: {e}"))),
        }
    }

    /// Acts on decisions not seen yet; returns how many it acted on.
    pub fn apply_decisions(&self) -> usize {
        let ids = match requests::decided_ids(&self.dir) {
            Ok(ids) => ids,
            Err(e) => {
                crate::log!("supervise: {e}");
                return 0;
            }
        };
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let mut count = 0;
        for id in ids {
            if applied.contains(&id) {
                continue;
            }
            let request = match requests::read_request(&self.dir, &id) {
                Ok(Some(r)) if r.status != Status::Pending => r,
                // A decision for a request we never wrote: nothing to do.
                Ok(_) => {
                    applied.insert(id);
                    continue;
                }
                Err(e) => {
                    crate::log!("supervise: {e}");
                    applied.insert(id);
                    continue;
                }
            };
            self.apply(&request);
            applied.insert(id);
            count += 1;
        }
        count
    }

    fn apply(&self, r: &Request) {
        let approved = r.status == Status::Approved;
        let (host, mut rule) = match &r.ask {
            Ask::Egress { host } => (host.clone(), host.clone()),
            Ask::Push { repo, git_ref } => (repo.clone(), git_ref.clone()),
            Ask::Notify { .. } => (String::new(), String::new()),
        };
        let mut reason = if approved {
            "operator_approved"
        } else {
            "operator_denied"
        };
        // The bundle normalised the host when it wrote the request; a file
        // edited by hand may still be bad.
        if approved
            && let Ask::Egress { host } = &r.ask
            && let Err(e) = self.runtime.allow(host)
        {
            crate::log!("supervise: cannot allow {host}: {e}");
            reason = "operator_approved_invalid_host";
        }
        // Checked again on approval: the file may be edited by hand, or
        // the manifest changed since the request (a restarted bundle).
        if approved && let Ask::Push { repo, git_ref } = &r.ask {
            let target = self
                .push_target(repo)
                .and_then(|t| normalize_push_ref(git_ref).map(|full| (t.name.clone(), full)));
            match target {
                Ok((name, full)) => {
                    self.push_rules.allow(&name, &full);
                    rule = full;
                }
                Err(e) => {
                    crate::log!("supervise: cannot allow the push {}: {e}", r.id);
                    reason = "operator_approved_not_pushable";
                }
            }
        }
        self.audit.write(AuditRecord {
            v: crate::audit::AUDIT_VERSION,
            time: bottle_core::time::now_rfc3339_millis(),
            bottle: self.bottle.clone(),
            daemon: DAEMON.into(),
            decision: if approved && reason == "operator_approved" {
                Decision::Allow
            } else {
                Decision::Deny
            },
            host,
            port: 0,
            method: r.ask.kind().into(),
            path: r.id.clone(),
            status: 0,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            reason: reason.into(),
            rule,
            count: 1,
            truncated: false,
            hosts: Vec::new(),
        });
    }

    fn http1(&self) -> hyper::server::conn::http1::Builder {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(self.limits.header_read_timeout_ms))
            .max_header_size(self.limits.max_header_bytes)
            .max_buf_size((self.limits.max_header_bytes + 8192).max(64 * 1024));
        b
    }

    /// Serves MCP on `listener` and watches the queue, until the listener
    /// fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<(), BundleError> {
        let watcher = self.clone();
        let watch = async move {
            loop {
                let this = watcher.clone();
                let _ = tokio::task::spawn_blocking(move || this.apply_decisions()).await;
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        };
        tokio::select! {
            res = self.accept_loop(listener) => res,
            () = watch => Ok(()),
        }
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) -> Result<(), BundleError> {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let (stream, _, permit) =
                crate::accept::next_connection(&listener, &slots, DAEMON).await?;
            let this = self.clone();
            tokio::spawn(async move {
                let io = TokioIo::new(IdleIo::new(
                    stream,
                    Duration::from_millis(this.limits.idle_timeout_ms),
                ));
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

    async fn handle(self: Arc<Self>, req: HttpRequest<Incoming>) -> Response<BoxBody> {
        if self.audit.is_degraded() {
            // No request is queued, and no approval applied, unaudited.
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                crate::audit::AUDIT_UNAVAILABLE_MESSAGE,
            );
        }
        if req.uri().path() != MCP_PATH {
            return plain(
                StatusCode::NOT_FOUND,
                "bottle supervise: the MCP endpoint is POST /mcp",
            );
        }
        if req.method() != Method::POST {
            let mut resp = plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "bottle supervise: only POST is served (no server-sent event stream)",
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return resp;
        }
        let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                let too_big = e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some();
                let (status, msg) = if too_big {
                    (
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("request body larger than {MAX_BODY_BYTES} bytes"),
                    )
                } else {
                    (
                        StatusCode::BAD_REQUEST,
                        format!("cannot read the body: {e}"),
                    )
                };
                return json_response(
                    status,
                    &json!({"jsonrpc": "2.0", "id": null,
                        "error": {"code": mcp::INVALID_REQUEST, "message": msg}}),
                );
            }
        };
        let this = self.clone();
        let answer = tokio::task::spawn_blocking(move || mcp::handle_body(&body, &*this)).await;
        match answer {
            Ok(Some(v)) => json_response(StatusCode::OK, &v),
            Ok(None) => {
                let mut r = Response::new(full(Bytes::new()));
                *r.status_mut() = StatusCode::ACCEPTED;
                r
            }
            Err(e) => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": -32603, "message": format!("internal error: {e}")}}),
            ),
        }
    }
}

impl Tools for Supervise {
    fn call(&self, name: &str, args: &Map<String, Value>) -> Result<Value, CallError> {
        match name {
            "request_egress" => {
                let raw = arg(args, "host")?;
                let reason = opt_arg(args, "reason")?;
                let host = match normalize_host(raw.trim()) {
                    Ok(Host::Name(n)) => Host::Name(n),
                    Ok(Host::Ip(_)) => {
                        return Err(CallError::Tool(
                            "ask for a host name, not an IP address (IP literals can only be allowed in the manifest)".into(),
                        ));
                    }
                    Err(e) => {
                        return Err(CallError::Tool(format!(
                            "{e}; give a bare host name like docs.rs (no scheme, port or path)"
                        )));
                    }
                };
                if self.allowed_now(&host) {
                    return Ok(tool_result(
                        &format!("{host} is already allowed; use it through the proxy"),
                        json!({"host": host.to_string(), "status": "allowed"}),
                    ));
                }
                self.submit(
                    Ask::Egress {
                        host: host.to_string(),
                    },
                    reason,
                )
            }
            "request_push" => {
                let repo = arg(args, "repo")?;
                let git_ref = arg(args, "ref")?;
                let reason = opt_arg(args, "reason")?;
                let (repo, git_ref) = (repo.trim(), git_ref.trim());
                if repo.is_empty() || git_ref.is_empty() || repo.len() > 200 || git_ref.len() > 400
                {
                    return Err(CallError::Tool(
                        "repo and ref must be non-empty (ref like refs/heads/fix-1)".into(),
                    ));
                }
                let target = self.push_target(repo).map_err(CallError::Tool)?;
                let refname = normalize_push_ref(git_ref).map_err(CallError::Tool)?;
                let merged = merged_repo(target, &self.push_rules);
                if let Ok(policy) = RepoPolicy::new(&merged)
                    && let Some(glob) = policy.matching_glob(&refname)
                {
                    return Ok(tool_result(
                        &format!(
                            "{refname} in {} is already pushable (push rule {glob}); push through git-gate",
                            target.name
                        ),
                        json!({"repo": target.name, "ref": refname, "status": "allowed"}),
                    ));
                }
                self.submit(
                    Ask::Push {
                        repo: target.name.clone(),
                        git_ref: refname,
                    },
                    reason,
                )
            }
            "notify" => {
                let message = arg(args, "message")?;
                if message.trim().is_empty() {
                    return Err(CallError::Tool("the message is empty".into()));
                }
                self.submit(
                    Ask::Notify {
                        message: requests::clip(message),
                    },
                    "",
                )
            }
            "request_status" => self.status(arg(args, "id")?),
            other => Err(CallError::Params(format!(
                "unknown tool {other:?}; tools/list names the tools"
            ))),
        }
    }
}

fn request_json(r: &Request) -> Value {
    json!({
        "id": r.id,
        "kind": r.ask.kind(),
        "status": r.status,
        "reason": r.decision_reason,
    })
}

fn pending_result(r: &Request, existing: bool) -> Value {
    let what = match &r.ask {
        Ask::Egress { host } => format!("egress to {host}"),
        Ask::Push { repo, git_ref } => format!("a push of {git_ref} to {repo}"),
        Ask::Notify { .. } => "your message".into(),
    };
    let again = if existing { " (asked already)" } else { "" };
    tool_result(
        &format!(
            "request {id} for {what} is pending operator approval{again}; the operator answers with `bottle approve {id}` or `bottle deny {id}`. Nothing is approved by timeout: poll request_status with id {id}.",
            id = r.id
        ),
        request_json(r),
    )
}

fn plain(status: StatusCode, text: &str) -> Response<BoxBody> {
    let mut r = Response::new(full(format!("{text}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response<BoxBody> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Builds the supervise daemon for the supervisor, or `None` when the
/// config has no `supervise_listen`. `runtime` and `push_rules` are the
/// sets approvals go to (shared with the proxy, egress and git-gate).
pub fn daemon(
    config: &BundleConfig,
    audit: &AuditLog,
    runtime: &RuntimeRules,
    push_rules: &RuntimePushRules,
) -> Result<Option<Daemon>, BundleError> {
    let Some(listen) = &config.supervise_listen else {
        return Ok(None);
    };
    let addr = crate::daemons::listen_addr(DAEMON, listen)?;
    let supervise = Arc::new(Supervise::new(
        config,
        audit.clone(),
        runtime.clone(),
        push_rules.clone(),
    )?);
    // Decisions taken while the bundle was down count from the first poll.
    supervise.apply_decisions();
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
        serve: Arc::new(move |l| Box::pin(supervise.clone().serve(l))),
    }))
}
