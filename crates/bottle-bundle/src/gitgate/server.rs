//! The gate's HTTP side: routing, the streaming pipes between a request,
//! a git process and the response, and the audit lines.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bottle_core::bundle::{BundleConfig, BundleGitRepo, BundleLimits};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore, mpsc};

use super::command::{Git, Invocation, Service, upstream_protocol_ok};
use super::hook::{self, HookResult, HookSpec};
use super::pktline;
use super::push_rules::{Refusal, RefusalKind, RepoPolicy, RuntimePushRules, merged_repo};
use super::runtime::BUNDLE_GIT;
use super::upstream;
use crate::BundleError;
use crate::audit::{AUDIT_VERSION, AuditLog, AuditRecord, Decision, now_rfc3339};
use crate::body::{BoxBody, BoxError, boxed, full};
use crate::daemons::{Daemon, bind};
use crate::io::IdleIo;

/// The daemon's name in audit lines, errors and logs.
const DAEMON: &str = "git-gate";
/// Response bytes of a receive-pack kept to read its report-status.
const TEE_MAX: usize = 1 << 20;
/// Stderr bytes kept from a git process.
const STDERR_MAX: usize = 64 * 1024;
/// Compressed bytes decoded at a time (bounds what one step can inflate).
const INFLATE_STEP: usize = 4096;
/// Decoded bytes handed on at a time.
const INFLATE_OUT: usize = 256 * 1024;

/// Sizes and times the gate enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateLimits {
    /// Largest push (decoded request body), also git's
    /// `receive.maxInputSize`.
    pub max_push_bytes: u64,
    /// Largest upload-pack request (decoded; the fetch negotiation).
    pub max_request_bytes: u64,
    /// Largest command list at the start of a push.
    pub max_command_bytes: usize,
    /// Git processes serving requests at once; more requests wait.
    pub max_concurrent: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Time to send a request head (and keep-alive idle time).
    pub header_read_timeout: Duration,
    /// Time a connection may move no bytes mid-request.
    pub idle_timeout: Duration,
    /// Time an upstream fetch may take (mirror mode).
    pub upstream_timeout: Duration,
}

impl GateLimits {
    /// The bundle's connection limits plus the gate's own sizes.
    pub fn from_bundle(l: &BundleLimits) -> Self {
        Self {
            max_push_bytes: 2 << 30,
            max_request_bytes: 256 << 20,
            max_command_bytes: 4 << 20,
            max_concurrent: 8,
            max_connections: l.max_connections.clamp(1, 256),
            max_header_bytes: l.max_header_bytes,
            header_read_timeout: Duration::from_millis(l.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(l.idle_timeout_ms),
            upstream_timeout: Duration::from_secs(600),
        }
    }
}

/// Where git, the hook program and the gate's scratch files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRuntime {
    /// The git binary.
    pub git: PathBuf,
    /// The program the `pre-receive` hook runs (`<program> git-hook`): the
    /// `bottle-bundle` binary.
    pub hook_program: PathBuf,
    /// The gate's work dir (hooks, hook results, `HOME` for git).
    pub work_dir: PathBuf,
    /// Remove the work dir when the gate is dropped.
    pub remove_work_dir: bool,
}

static WORK_SEQ: AtomicU64 = AtomicU64::new(0);

impl GitRuntime {
    /// Inside the bundle: `/usr/bin/git`, `hook_program` (default: this
    /// executable) as the hook program, and a fresh work dir under the
    /// temp dir (`/tmp`).
    pub fn for_bundle(hook_program: Option<&str>) -> Result<Self, BundleError> {
        // A configured program is checked by `GitGate::new` like any other.
        let configured = hook_program.map(PathBuf::from);
        let hook_program = configured
            .or_else(|| std::env::current_exe().ok().filter(|p| p.is_absolute()))
            // No /proc (a bare chroot): argv[0] when it is absolute.
            .or_else(|| {
                std::env::args_os()
                    .next()
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
            })
            .ok_or_else(|| BundleError::GitRuntime {
                detail: "cannot tell where the bottle-bundle binary is (no /proc/self/exe, argv[0] is relative)".into(),
            })?;
        let work_dir = std::env::temp_dir().join(format!(
            "bottle-git-gate-{}-{}",
            std::process::id(),
            WORK_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        Ok(Self {
            git: PathBuf::from(BUNDLE_GIT),
            hook_program,
            work_dir,
            remove_work_dir: true,
        })
    }
}

/// One repository the gate serves.
#[derive(Debug)]
struct GateRepo {
    config: BundleGitRepo,
    policy: RepoPolicy,
    path: PathBuf,
    /// Serialises upstream fetches and pushes into a mirror.
    lock: Arc<Mutex<()>>,
}

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

/// Whether a repository name is one the gate can serve.
fn is_repo_name(name: &str) -> bool {
    name.len() <= 100
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn repo_err(repo: &str, detail: impl Into<String>) -> BundleError {
    BundleError::GitRepo {
        repo: repo.to_string(),
        detail: detail.into(),
    }
}

fn runtime_err(detail: impl Into<String>) -> BundleError {
    BundleError::GitRuntime {
        detail: detail.into(),
    }
}

fn check_repo(repo: &BundleGitRepo) -> Result<(), BundleError> {
    let name = &repo.name;
    if !is_repo_name(name) {
        return Err(repo_err(
            name,
            "the name must be letters, digits, \".\", \"_\" and \"-\", starting with a letter or digit",
        ));
    }
    let path = Path::new(&repo.path_in_bundle);
    if !path.is_absolute() {
        return Err(repo_err(
            name,
            format!("path_in_bundle {:?} is not absolute", repo.path_in_bundle),
        ));
    }
    match &repo.upstream {
        None => {
            if !path.join("HEAD").is_file() || !path.join("objects").is_dir() {
                return Err(repo_err(
                    name,
                    format!("no bare repository at {}", path.display()),
                ));
            }
        }
        Some(url) => {
            if !upstream_protocol_ok(url) {
                return Err(repo_err(
                    name,
                    format!("upstream {url:?} is not an https://, http:// or file:// URL"),
                ));
            }
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    repo_err(
                        name,
                        format!(
                            "cannot create the mirror's directory {}: {e}",
                            parent.display()
                        ),
                    )
                })?;
            }
            if let Some(file) = &repo.credential_file {
                upstream::read_auth_header(Path::new(file)).map_err(|detail| {
                    BundleError::Credential {
                        name: format!("git:{name}"),
                        path: file.clone(),
                        detail,
                    }
                })?;
            }
        }
    }
    if repo.upstream.is_none() && repo.credential_file.is_some() {
        return Err(repo_err(
            name,
            "credential_file is set but there is no upstream to send it to",
        ));
    }
    Ok(())
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    f.write_all(data)
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

impl GitGate {
    /// Checks the repositories, git and the hook program, and sets up the
    /// work dir. Fails (fail closed: the bundle does not start) when a
    /// host repository is not mounted, a credential cannot be read, or
    /// git is missing.
    pub fn new(
        config: &BundleConfig,
        audit: AuditLog,
        runtime: GitRuntime,
        limits: GateLimits,
    ) -> Result<Self, BundleError> {
        let mut repos = BTreeMap::new();
        for repo in &config.git {
            check_repo(repo)?;
            let policy = RepoPolicy::new(repo)?;
            let entry = Arc::new(GateRepo {
                config: repo.clone(),
                policy,
                path: PathBuf::from(&repo.path_in_bundle),
                lock: Arc::new(Mutex::new(())),
            });
            if repos.insert(repo.name.clone(), entry).is_some() {
                return Err(repo_err(&repo.name, "the name is used twice"));
            }
        }
        if !runtime.git.is_file() {
            return Err(runtime_err(format!(
                "git is not at {}; the bundle image must carry the files git_runtime_files() lists",
                runtime.git.display()
            )));
        }
        let program = runtime.hook_program.display().to_string();
        if !runtime.hook_program.is_absolute()
            || !runtime.hook_program.is_file()
            || program.len() > 120
            || program.chars().any(char::is_whitespace)
        {
            return Err(runtime_err(format!(
                "the hook program {program:?} must be an existing file at an absolute path of at most 120 characters without spaces (it goes into a #! line)"
            )));
        }
        let hooks_dir = runtime.work_dir.join("hooks");
        let results_dir = runtime.work_dir.join("results");
        let setup = || -> std::io::Result<()> {
            create_private_dir(&hooks_dir)?;
            create_private_dir(&results_dir)?;
            write_file(
                &hooks_dir.join("pre-receive"),
                hook::script(&runtime.hook_program).as_bytes(),
                0o755,
            )
        };
        setup().map_err(|e| {
            runtime_err(format!(
                "cannot set up the work dir {}: {e}",
                runtime.work_dir.display()
            ))
        })?;
        Ok(Self {
            bottle: config.bottle.clone(),
            repos,
            push_rules: RuntimePushRules::default(),
            audit,
            git: Git {
                program: runtime.git,
                home: runtime.work_dir.clone(),
                hooks_dir,
            },
            work_dir: runtime.work_dir,
            remove_work_dir: runtime.remove_work_dir,
            results_dir,
            slots: Arc::new(Semaphore::new(limits.max_concurrent.max(1))),
            limits,
            port: AtomicU16::new(0),
            seq: AtomicU64::new(0),
        })
    }

    /// Makes pushes also allow the refs `rules` holds (now and later):
    /// the set supervise adds the operator's push approvals to.
    pub fn share_push_rules(&mut self, rules: RuntimePushRules) {
        self.push_rules = rules;
    }

    /// A repository's rules with the operator's run-time approvals merged
    /// in: the config goes to the hook, the policy checks the command list.
    fn effective_rules(&self, repo: &GateRepo) -> (BundleGitRepo, RepoPolicy) {
        let merged = merged_repo(&repo.config, &self.push_rules);
        if merged.push.len() == repo.config.push.len() {
            return (merged, repo.policy.clone());
        }
        match RepoPolicy::new(&merged) {
            Ok(policy) => (merged, policy),
            // Approved refs are escaped into literal globs, so this is not
            // expected; the manifest's rules still hold.
            Err(e) => {
                eprintln!("bottle-bundle: git-gate: ignoring run-time push approvals: {e}");
                (repo.config.clone(), repo.policy.clone())
            }
        }
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
        self.audit.write(&AuditRecord {
            v: AUDIT_VERSION,
            time: now_rfc3339(),
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

    async fn info_refs(
        &self,
        repo: &GateRepo,
        service: Service,
        protocol: Option<String>,
        path: &str,
        start: Instant,
    ) -> Response<BoxBody> {
        let name = repo.config.name.as_str();
        let entry = |d, reason: &str| Entry::new(d, name, "advertise", path, reason);
        if service == Service::ReceivePack && !repo.policy.writable() {
            let message = format!(
                "repository {name} is read-only: pushing is not allowed; fix: push nowhere, or ask the operator to make it read-write with a push list"
            );
            return self.refuse(
                entry(Decision::Deny, "read_only"),
                StatusCode::FORBIDDEN,
                &message,
                start,
            );
        }
        let _permit = match self.permit().await {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        if let Some(url) = &repo.config.upstream {
            let _lock = repo.lock.lock().await;
            if let Err(e) = self.refresh(repo, url).await {
                let message = format!(
                    "could not fetch {name} from its upstream: {e}; fix: retry later, or ask the operator to check the upstream and its credential"
                );
                return self.refuse(
                    entry(Decision::Error, "upstream_fetch_failed"),
                    StatusCode::BAD_GATEWAY,
                    &message,
                    start,
                );
            }
        }
        let inv = match service {
            Service::UploadPack => self.git.upload_pack(&repo.path, true, protocol.as_deref()),
            Service::ReceivePack => self.git.receive_pack(
                &repo.path,
                true,
                &repo.policy,
                self.limits.max_push_bytes,
                None,
            ),
        };
        let out = match inv.output().await {
            Ok(o) if o.success() => o,
            Ok(o) => {
                let message = format!(
                    "git {} failed on {name}: {}",
                    service.name(),
                    o.stderr_text().trim()
                );
                return self.refuse(
                    entry(Decision::Error, "git_failed"),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &message,
                    start,
                );
            }
            Err(e) => {
                let message = format!("could not run git for {name}: {e}");
                return self.refuse(
                    entry(Decision::Error, "git_failed"),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &message,
                    start,
                );
            }
        };
        // As git http-backend: protocol v2 advertisements carry no
        // `# service=` preamble.
        let v2 = protocol
            .as_deref()
            .is_some_and(|p| p.split(':').any(|kv| kv == "version=2"));
        let mut body = Vec::with_capacity(out.stdout.len() + 40);
        if !v2 {
            body.extend(pktline::pkt(
                format!("# service={}\n", service.name()).as_bytes(),
            ));
            body.extend_from_slice(pktline::FLUSH);
        }
        body.extend_from_slice(&out.stdout);
        let mut e = entry(Decision::Allow, "allowed");
        e.bytes_down = body.len() as u64;
        self.write_audit(e, StatusCode::OK, start);
        git_response(
            &format!("application/x-{}-advertisement", service.name()),
            full(body),
        )
    }

    async fn refresh(&self, repo: &GateRepo, url: &str) -> Result<(), String> {
        let auth = match &repo.config.credential_file {
            Some(file) => Some(
                upstream::read_auth_header(Path::new(file))
                    .map_err(|e| format!("the credential file cannot be read ({e})"))?,
            ),
            None => None,
        };
        tokio::time::timeout(
            self.limits.upstream_timeout,
            upstream::refresh(&self.git, &repo.path, url, auth.as_deref()),
        )
        .await
        .map_err(|_| "the upstream took too long".to_string())?
    }

    async fn upload_pack(
        self: Arc<Self>,
        repo: Arc<GateRepo>,
        req: Request<Incoming>,
        protocol: Option<String>,
        path: String,
        start: Instant,
    ) -> Response<BoxBody> {
        let name = repo.config.name.clone();
        let input = match BodyInput::new(req, Service::UploadPack, self.limits.max_request_bytes) {
            Ok(i) => i,
            Err((status, message)) => {
                let entry = Entry::new(Decision::Deny, &name, "fetch", &path, "bad_request");
                return self.refuse(entry, status, &message, start);
            }
        };
        let permit = match self.permit().await {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        let inv = self.git.upload_pack(&repo.path, false, protocol.as_deref());
        let gate = self.clone();
        let p = path.clone();
        let done = move |d: PipeDone| {
            let method = if contains(&d.sniff, b"command=ls-refs") {
                "ls-refs"
            } else {
                "fetch"
            };
            let (decision, reason) = match (&d.input_error, d.code) {
                (Some(e), _) => (Decision::Error, format!("request_failed: {e}")),
                (None, Some(0)) => (Decision::Allow, "allowed".to_string()),
                (None, code) => (
                    Decision::Error,
                    format!(
                        "upload_pack_failed: exit {code:?}: {}",
                        String::from_utf8_lossy(&d.stderr).trim()
                    ),
                ),
            };
            let mut e = Entry::new(decision, &name, method, &p, &reason);
            e.bytes_up = d.bytes_in;
            e.bytes_down = d.bytes_out;
            gate.write_audit(e, StatusCode::OK, start);
        };
        match pipe(&inv, Vec::new(), input, true, (permit, None), done) {
            Ok(body) => git_response(
                &format!("application/x-{}-result", Service::UploadPack.name()),
                body,
            ),
            Err(e) => {
                let entry = Entry::new(
                    Decision::Error,
                    &repo.config.name,
                    "fetch",
                    &path,
                    "git_failed",
                );
                self.refuse(
                    entry,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("could not run git upload-pack: {e}"),
                    start,
                )
            }
        }
    }

    async fn receive_pack(
        self: Arc<Self>,
        repo: Arc<GateRepo>,
        req: Request<Incoming>,
        path: String,
        start: Instant,
    ) -> Response<BoxBody> {
        let name = repo.config.name.clone();
        let deny = |reason: &str| Entry::new(Decision::Deny, &name, "push", &path, reason);
        if !repo.policy.writable() {
            let message = format!(
                "repository {name} is read-only: pushing is not allowed; fix: push nowhere, or ask the operator to make it read-write with a push list"
            );
            return self.refuse(deny("read_only"), StatusCode::FORBIDDEN, &message, start);
        }
        let mut input = match BodyInput::new(req, Service::ReceivePack, self.limits.max_push_bytes)
        {
            Ok(i) => i,
            Err((status, message)) => {
                return self.refuse(deny("bad_request"), status, &message, start);
            }
        };
        let permit = match self.permit().await {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        let mut head = Vec::new();
        let cmds = loop {
            match pktline::parse_commands(&head) {
                Ok(Some((cmds, _))) => break cmds,
                Ok(None) => {}
                Err(e) => {
                    let message = format!("the push request is malformed: {e}");
                    return self.refuse(
                        deny(RefusalKind::Malformed.as_str()),
                        StatusCode::BAD_REQUEST,
                        &message,
                        start,
                    );
                }
            }
            if head.len() > self.limits.max_command_bytes {
                let message = format!(
                    "the push's command list is over {} bytes; fix: push fewer refs at once",
                    self.limits.max_command_bytes
                );
                return self.refuse(
                    deny(RefusalKind::Malformed.as_str()),
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &message,
                    start,
                );
            }
            match input.next().await {
                Ok(Some(chunk)) => head.extend_from_slice(&chunk),
                Ok(None) => {
                    return self.refuse(
                        deny(RefusalKind::Malformed.as_str()),
                        StatusCode::BAD_REQUEST,
                        "the push request ended inside its command list",
                        start,
                    );
                }
                Err(e) => {
                    return self.refuse(
                        deny(RefusalKind::Malformed.as_str()),
                        StatusCode::BAD_REQUEST,
                        &e,
                        start,
                    );
                }
            }
        };
        let refs = cmds
            .updates
            .iter()
            .map(|u| u.refname.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        if !cmds.wants_report() {
            let mut e = deny(RefusalKind::Malformed.as_str());
            e.refs = refs;
            return self.refuse(
                e,
                StatusCode::BAD_REQUEST,
                "the push does not ask for report-status; fix: push with a git client",
                start,
            );
        }
        let mut refusals: Vec<Refusal> = if cmds.push_cert {
            cmds.updates
                .iter()
                .map(|u| Refusal {
                    kind: RefusalKind::Malformed,
                    refname: u.refname.clone(),
                    message: "signed pushes are not supported; fix: push without --signed".into(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let (rules, policy) = self.effective_rules(&repo);
        refusals.extend(cmds.updates.iter().filter_map(|u| policy.check(u).err()));
        if let Some(first) = refusals.first() {
            // Read the rest so the client sees our answer rather than a
            // broken pipe; the cap and the idle timeout bound this.
            while let Ok(Some(_)) = input.next().await {}
            let mut e = deny(&format!("{}: {}", first.kind.as_str(), first.refname));
            e.refs = refs;
            e.bytes_up = input.seen;
            let body = pktline::refusal_response(&cmds, &refusals);
            e.bytes_down = body.len() as u64;
            self.write_audit(e, StatusCode::OK, start);
            return git_response(
                &format!("application/x-{}-result", Service::ReceivePack.name()),
                full(body),
            );
        }
        let lock = match &repo.config.upstream {
            Some(_) => Some(repo.lock.clone().lock_owned().await),
            None => None,
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let result_file = self.results_dir.join(format!("{seq}.json"));
        let spec = HookSpec {
            repo: rules,
            git: self.git.program.clone(),
            result_file: result_file.clone(),
        };
        let spec = match serde_json::to_string(&spec) {
            Ok(s) => s,
            Err(e) => {
                return self.refuse(
                    Entry::new(Decision::Error, &name, "push", &path, "internal"),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("could not encode the hook's instructions: {e}"),
                    start,
                );
            }
        };
        let inv = self.git.receive_pack(
            &repo.path,
            false,
            &policy,
            self.limits.max_push_bytes,
            Some(&spec),
        );
        let sideband = cmds.sideband().is_some();
        let gate = self.clone();
        let p = path.clone();
        let n = name.clone();
        let r = refs.clone();
        let done = move |d: PipeDone| {
            let hook: Option<HookResult> = std::fs::read(&result_file)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let _ = std::fs::remove_file(&result_file);
            let report = pktline::parse_report(&d.tee, sideband);
            let (decision, reason) = push_verdict(&d, hook.as_ref(), &report);
            let mut e = Entry::new(decision, &n, "push", &p, &reason);
            e.refs = r;
            e.bytes_up = d.bytes_in;
            e.bytes_down = d.bytes_out;
            gate.write_audit(e, StatusCode::OK, start);
        };
        match pipe(&inv, head, input, false, (permit, lock), done) {
            Ok(body) => git_response(
                &format!("application/x-{}-result", Service::ReceivePack.name()),
                body,
            ),
            Err(e) => {
                let mut entry = Entry::new(Decision::Error, &name, "push", &path, "git_failed");
                entry.refs = refs;
                self.refuse(
                    entry,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("could not run git receive-pack: {e}"),
                    start,
                )
            }
        }
    }
}

/// The audit decision for a push that went to receive-pack.
fn push_verdict(
    d: &PipeDone,
    hook: Option<&HookResult>,
    report: &pktline::Report,
) -> (Decision, String) {
    if let Some(first) = hook.and_then(|h| h.refused.first()) {
        let decision = if first.kind == RefusalKind::UpstreamPushFailed {
            Decision::Error
        } else {
            Decision::Deny
        };
        return (
            decision,
            format!("{}: {}", first.kind.as_str(), first.refname),
        );
    }
    if let Some((refname, Some(why))) = report.refs.iter().find(|(_, ng)| ng.is_some()) {
        return (Decision::Deny, format!("receive_pack: {why}: {refname}"));
    }
    if let Some(e) = &d.input_error {
        return (Decision::Error, format!("request_failed: {e}"));
    }
    match report.unpack.as_deref() {
        Some("ok") => {}
        Some(other) => return (Decision::Error, format!("unpack_failed: {other}")),
        None if report.refs.is_empty() && d.code == Some(0) => {
            // Nothing to report: a push with no updates.
            return (Decision::Allow, "allowed".into());
        }
        None => {
            return (
                Decision::Error,
                format!(
                    "receive_pack_failed: exit {:?}: {}",
                    d.code,
                    String::from_utf8_lossy(&d.stderr).trim()
                ),
            );
        }
    }
    if d.code != Some(0) {
        return (
            Decision::Error,
            format!("receive_pack_failed: exit {:?}", d.code),
        );
    }
    let forwarded = hook.is_some_and(|h| h.forwarded);
    (
        Decision::Allow,
        if forwarded {
            "allowed: forwarded upstream".into()
        } else {
            "allowed".into()
        },
    )
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

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    InfoRefs(Service),
    Rpc(Service),
}

impl Endpoint {
    fn method(self) -> &'static str {
        match self {
            Self::InfoRefs(_) => "advertise",
            Self::Rpc(Service::UploadPack) => "fetch",
            Self::Rpc(Service::ReceivePack) => "push",
        }
    }
}

/// Splits `/<repo>/<endpoint>`; errors are (status, message for git).
fn route<'a>(
    method: &Method,
    path: &'a str,
    query: &str,
) -> Result<(&'a str, Endpoint), (StatusCode, String)> {
    let not_found = || {
        (
            StatusCode::NOT_FOUND,
            format!(
                "nothing at {path}; this is the bottle's git gate: it serves $GIT_GATE_URL/<name>.git over git's smart HTTP protocol only"
            ),
        )
    };
    let rest = path.strip_prefix('/').ok_or_else(not_found)?;
    let (segment, tail) = rest.split_once('/').ok_or_else(not_found)?;
    if segment.is_empty() {
        return Err(not_found());
    }
    let endpoint = match tail {
        "info/refs" => {
            let service = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("service="))
                .and_then(Service::parse)
                .ok_or_else(|| {
                    (
                        StatusCode::FORBIDDEN,
                        "only git's smart HTTP protocol is served; fix: use a git client newer than 1.6.6".to_string(),
                    )
                })?;
            Endpoint::InfoRefs(service)
        }
        "git-upload-pack" => Endpoint::Rpc(Service::UploadPack),
        "git-receive-pack" => Endpoint::Rpc(Service::ReceivePack),
        _ => return Err(not_found()),
    };
    let want = match endpoint {
        Endpoint::InfoRefs(_) => Method::GET,
        Endpoint::Rpc(_) => Method::POST,
    };
    if *method != want && !(want == Method::GET && *method == Method::HEAD) {
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} takes {want}, not {method}"),
        ));
    }
    Ok((segment, endpoint))
}

/// The client's `Git-Protocol` header, if it is plain `key=value:...`.
fn git_protocol<B>(req: &Request<B>) -> Option<String> {
    let value = req.headers().get("git-protocol")?.to_str().ok()?;
    let ok = value.len() <= 256
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b':' | b'.' | b'_' | b'-'));
    ok.then(|| value.to_string())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
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

/// A request body, gunzipped when the client says so, capped in size.
struct BodyInput {
    body: Incoming,
    gzip: Option<flate2::write::GzDecoder<Vec<u8>>>,
    pending: Bytes,
    ended: bool,
    limit: u64,
    seen: u64,
    sniff: Vec<u8>,
}

type HttpError = (StatusCode, String);

impl BodyInput {
    fn new(req: Request<Incoming>, service: Service, limit: u64) -> Result<Self, HttpError> {
        let want = format!("application/x-{}-request", service.name());
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !ct.eq_ignore_ascii_case(&want) {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("expected Content-Type {want}, got {ct:?}"),
            ));
        }
        let encoding = req
            .headers()
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("identity")
            .trim()
            .to_ascii_lowercase();
        let gzip = match encoding.as_str() {
            "identity" | "" => None,
            "gzip" | "x-gzip" => Some(flate2::write::GzDecoder::new(Vec::new())),
            other => {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("Content-Encoding {other:?} is not supported (gzip is)"),
                ));
            }
        };
        Ok(Self {
            body: req.into_body(),
            gzip,
            pending: Bytes::new(),
            ended: false,
            limit,
            seen: 0,
            sniff: Vec::new(),
        })
    }

    fn count(&mut self, chunk: &[u8]) -> Result<(), String> {
        self.seen += chunk.len() as u64;
        if self.sniff.len() < 64 {
            let take = (64 - self.sniff.len()).min(chunk.len());
            self.sniff.extend_from_slice(&chunk[..take]);
        }
        if self.seen > self.limit {
            return Err(format!(
                "the request body is over the gate's limit of {} bytes",
                self.limit
            ));
        }
        Ok(())
    }

    /// The next decoded chunk; `Ok(None)` at the end.
    async fn next(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            if let Some(dec) = &mut self.gzip {
                while !self.pending.is_empty() && dec.get_ref().len() < INFLATE_OUT {
                    let step = self.pending.split_to(self.pending.len().min(INFLATE_STEP));
                    dec.write_all(&step)
                        .map_err(|e| format!("the gzip request body is invalid: {e}"))?;
                }
                let out = std::mem::take(dec.get_mut());
                if !out.is_empty() {
                    self.count(&out)?;
                    return Ok(Some(Bytes::from(out)));
                }
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.frame().await {
                None => {
                    self.ended = true;
                    if let Some(dec) = &mut self.gzip {
                        dec.try_finish()
                            .map_err(|e| format!("the gzip request body is invalid: {e}"))?;
                        let out = std::mem::take(dec.get_mut());
                        if !out.is_empty() {
                            self.count(&out)?;
                            return Ok(Some(Bytes::from(out)));
                        }
                    }
                    return Ok(None);
                }
                Some(Err(e)) => return Err(format!("reading the request body failed: {e}")),
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    if self.gzip.is_some() {
                        self.pending = data;
                        continue;
                    }
                    self.count(&data)?;
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// The response body: chunks of git's stdout.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// How a piped git process ended.
#[derive(Debug, Default)]
struct PipeDone {
    code: Option<i32>,
    bytes_in: u64,
    bytes_out: u64,
    /// The first [`TEE_MAX`] bytes of stdout.
    tee: Vec<u8>,
    stderr: Vec<u8>,
    input_error: Option<String>,
    /// The first decoded request bytes.
    sniff: Vec<u8>,
}

type Guards = (OwnedSemaphorePermit, Option<OwnedMutexGuard<()>>);

/// Runs `inv` with `head` and then `input` on its stdin and its stdout as
/// the returned body; `done` runs (before the body ends) once the process
/// has exited. `kill_on_gone`: kill it when the client goes away (a fetch);
/// otherwise let it finish (a push must not stop half-way).
fn pipe(
    inv: &Invocation,
    head: Vec<u8>,
    mut input: BodyInput,
    kill_on_gone: bool,
    guards: Guards,
    done: impl FnOnce(PipeDone) + Send + 'static,
) -> std::io::Result<BoxBody> {
    let mut child = inv.spawn_piped()?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("the child's pipes are missing"));
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _guards = guards;
        let feed = async {
            let mut fed = head.len() as u64;
            let mut error = None;
            if stdin.write_all(&head).await.is_ok() {
                loop {
                    match input.next().await {
                        Ok(Some(chunk)) => {
                            fed += chunk.len() as u64;
                            if stdin.write_all(&chunk).await.is_err() {
                                // The process stopped reading: it has
                                // answered (or failed) already.
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            error = Some(e);
                            break;
                        }
                    }
                }
            }
            // Closing stdin: a cut-off request makes git fail cleanly.
            drop(stdin);
            (fed, error, std::mem::take(&mut input.sniff))
        };
        let sender = &tx;
        let pump = async {
            let mut tee = Vec::new();
            let mut out = 0u64;
            let mut client = true;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if tee.len() < TEE_MAX {
                    let take = (TEE_MAX - tee.len()).min(n);
                    tee.extend_from_slice(&buf[..take]);
                }
                if client {
                    if sender.send(Bytes::copy_from_slice(&buf[..n])).await.is_ok() {
                        out += n as u64;
                    } else {
                        client = false;
                        if kill_on_gone {
                            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                                // Not yet reaped, so the pid is still ours.
                                let _ = nix::sys::signal::kill(
                                    nix::unistd::Pid::from_raw(pid),
                                    nix::sys::signal::Signal::SIGKILL,
                                );
                            }
                            break;
                        }
                    }
                }
            }
            (out, tee)
        };
        let errs = async {
            let mut kept = Vec::new();
            let mut buf = vec![0u8; 8192];
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let take = STDERR_MAX.saturating_sub(kept.len()).min(n);
                        kept.extend_from_slice(&buf[..take]);
                    }
                }
            }
            kept
        };
        let ((bytes_in, input_error, sniff), (bytes_out, tee), stderr) =
            tokio::join!(feed, pump, errs);
        let code = child.wait().await.ok().and_then(|s| s.code());
        done(PipeDone {
            code,
            bytes_in,
            bytes_out,
            tee,
            stderr,
            input_error,
            sniff,
        });
        // The body ends only now, after the audit line is written.
        drop(tx);
    });
    Ok(boxed(ChannelBody(rx)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(
            route(&get, "/demo.git/info/refs", "service=git-upload-pack").unwrap(),
            ("demo.git", Endpoint::InfoRefs(Service::UploadPack))
        );
        assert_eq!(
            route(&post, "/demo/git-receive-pack", "").unwrap(),
            ("demo", Endpoint::Rpc(Service::ReceivePack))
        );
        assert_eq!(
            route(&get, "/demo.git/info/refs", "").unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            route(&get, "/demo.git/git-upload-pack", "").unwrap_err().0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        for p in [
            "/",
            "/demo.git",
            "//info/refs",
            "/demo.git/HEAD",
            "/a/b/info/refs",
        ] {
            assert_eq!(
                route(&get, p, "service=git-upload-pack").unwrap_err().0,
                StatusCode::NOT_FOUND,
                "{p}"
            );
        }
    }

    #[test]
    fn repo_names() {
        assert!(is_repo_name("demo"));
        assert!(is_repo_name("my-repo.v2_x"));
        assert!(!is_repo_name(".hidden"));
        assert!(!is_repo_name("a/b"));
        assert!(!is_repo_name(""));
        assert!(!is_repo_name(".."));
    }

    #[test]
    fn verdicts() {
        let ok = PipeDone {
            code: Some(0),
            ..PipeDone::default()
        };
        let report = pktline::Report {
            unpack: Some("ok".into()),
            refs: vec![("refs/heads/a".into(), None)],
            messages: String::new(),
        };
        assert_eq!(
            push_verdict(&ok, None, &report),
            (Decision::Allow, "allowed".into())
        );
        let hook = HookResult {
            refused: vec![hook::HookRefusal {
                refname: "refs/heads/a".into(),
                kind: RefusalKind::NonFastForward,
                message: String::new(),
            }],
            forwarded: false,
        };
        assert_eq!(
            push_verdict(&ok, Some(&hook), &report),
            (Decision::Deny, "non_fast_forward: refs/heads/a".into())
        );
        let ng = pktline::Report {
            unpack: Some("ok".into()),
            refs: vec![("refs/heads/a".into(), Some("failed to lock".into()))],
            messages: String::new(),
        };
        assert_eq!(push_verdict(&ok, None, &ng).0, Decision::Deny);
        let bad = pktline::Report {
            unpack: Some("index-pack abnormal exit".into()),
            ..pktline::Report::default()
        };
        assert_eq!(push_verdict(&ok, None, &bad).0, Decision::Error);
    }
}
