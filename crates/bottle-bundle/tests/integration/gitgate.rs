//! git-gate with the real `git` client: the bundle library on loopback
//! serves bare repositories this test creates; clone, fetch and allowed
//! pushes work, everything else is refused with a message git prints, the
//! repository is left as it was, and every request is in the audit log.
//! Mirror mode runs against an upstream that is `git http-backend` behind
//! a small HTTP server here, which demands the credential the gate holds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bottle_bundle::gitgate::pktline;
use bottle_bundle::gitgate::upstream::base64;
use bottle_bundle::{AuditRecord, Decision, RunningBundle};
use bottle_core::bundle::{BundleConfig, BundleGitRepo};
use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec, SystemRunner};
use bottle_core::manifest::GitMode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Runs git (the host's, from `PATH`) with a private home and config, no
/// proxy and no prompts. Blocking, so it runs outside the async workers
/// that serve the gate.
fn git_in(dir: &Path, home: &Path, args: &[&str]) -> CommandOutput {
    let mut spec = CommandSpec::new("git")
        .args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", home.join(".gitconfig"))
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "agent")
        .env("GIT_AUTHOR_EMAIL", "agent@bottle.invalid")
        .env("GIT_COMMITTER_NAME", "agent")
        .env("GIT_COMMITTER_EMAIL", "agent@bottle.invalid")
        .env("LC_ALL", "C")
        .env("no_proxy", "*")
        .env("NO_PROXY", "*");
    spec.cwd = Some(dir.to_path_buf());
    tokio::task::block_in_place(|| SystemRunner.run(&spec)).unwrap()
}

/// Like [`git_in`], failing the test unless git succeeds.
fn git_ok(dir: &Path, home: &Path, args: &[&str]) -> String {
    let out = git_in(dir, home, args);
    assert!(
        out.success(),
        "git {args:?} failed: {}{}",
        out.stdout_text(),
        out.stderr_text()
    );
    out.stdout_text()
}

/// Every ref of a bare repository and its value.
fn refs(home: &Path, bare: &Path) -> BTreeMap<String, String> {
    let text = git_ok(
        bare,
        home,
        &["for-each-ref", "--format=%(refname) %(objectname)", "refs/"],
    );
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(r, o)| (r.to_string(), o.to_string()))
        .collect()
}

/// A scratch dir with a home for git and bare repositories.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        let s = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(s.home()).unwrap();
        s
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn home(&self) -> PathBuf {
        self.path().join("home")
    }

    /// A bare repository `<name>.git` whose `main` has two commits and
    /// whose `agent/existing` points at `main`.
    fn bare(&self, name: &str) -> PathBuf {
        let home = self.home();
        let bare = self.path().join(format!("{name}.git"));
        let seed = self.path().join(format!("{name}-seed"));
        git_ok(
            self.path(),
            &home,
            &["init", "-q", "--bare", "-b", "main", bare.to_str().unwrap()],
        );
        git_ok(
            self.path(),
            &home,
            &["init", "-q", "-b", "main", seed.to_str().unwrap()],
        );
        for n in 1..=2 {
            std::fs::write(seed.join("README"), format!("{name} {n}\n")).unwrap();
            git_ok(&seed, &home, &["add", "README"]);
            git_ok(&seed, &home, &["commit", "-q", "-m", &format!("seed {n}")]);
        }
        git_ok(
            &seed,
            &home,
            &[
                "push",
                "-q",
                bare.to_str().unwrap(),
                "main",
                "main:refs/heads/agent/existing",
            ],
        );
        bare
    }
}

fn served(name: &str, path: &Path, mode: GitMode) -> BundleGitRepo {
    BundleGitRepo {
        name: name.into(),
        path_in_bundle: path.display().to_string(),
        upstream: None,
        mode,
        push: if mode == GitMode::ReadWrite {
            vec!["agent/*".into()]
        } else {
            Vec::new()
        },
        allow_force: false,
        allow_delete: false,
        credential_file: None,
    }
}

/// The bundle library with git-gate on 127.0.0.1.
struct Gate {
    bundle: RunningBundle,
    audit: PathBuf,
}

impl Gate {
    async fn start(dir: &Path, repos: Vec<BundleGitRepo>) -> Self {
        Self::start_with(dir, repos, None).await
    }

    /// With supervise on, its queue in `requests`.
    async fn start_with(dir: &Path, repos: Vec<BundleGitRepo>, requests: Option<&Path>) -> Self {
        let run = dir.join("run");
        std::fs::create_dir_all(&run).unwrap();
        let ca = bottle_bundle::generate_ca("gitgate-test").unwrap();
        std::fs::write(run.join("ca.pem"), &ca.cert_pem).unwrap();
        std::fs::write(run.join("ca.key"), &ca.key_pem).unwrap();
        let audit = run.join("audit.jsonl");
        // From JSON, so fields other daemons add get their defaults.
        let mut config: BundleConfig = serde_json::from_str(MINIMAL).unwrap();
        config.bottle = "gitgate-test".into();
        config.proxy_listen = "127.0.0.1:0".into();
        config.ports = vec![443];
        config.ca_cert = run.join("ca.pem").display().to_string();
        config.ca_key = run.join("ca.key").display().to_string();
        config.audit_log = audit.display().to_string();
        config.git_gate_listen = Some("127.0.0.1:0".into());
        config.git = repos;
        config.git_hook_program = Some(env!("CARGO_BIN_EXE_bottle-bundle").into());
        if let Some(requests) = requests {
            config.supervise_listen = Some("127.0.0.1:0".into());
            config.requests_dir = Some(requests.display().to_string());
        }
        let bundle = bottle_bundle::start(config).await.unwrap();
        Self { bundle, audit }
    }

    fn url(&self, repo: &str) -> String {
        format!("http://{}/{repo}", self.bundle.git_gate_addr.unwrap())
    }

    fn audit(&self) -> Vec<AuditRecord> {
        self.bundle.flush_audit();
        bottle_bundle::read_audit(&self.audit)
            .unwrap()
            .into_iter()
            .filter(|r| r.daemon == "git-gate")
            .collect()
    }

    /// The audit lines of one repository and method.
    fn lines(&self, repo: &str, method: &str) -> Vec<AuditRecord> {
        self.audit()
            .into_iter()
            .filter(|r| r.host == repo && r.method == method)
            .collect()
    }
}

/// The fields a config must have.
const MINIMAL: &str = r#"{"version":1,"bottle":"","proxy_listen":"",
"allow":[],"ports":[],"credentials":[],"ca_cert":"","ca_key":"","audit_log":""}"#;

fn assert_refused(out: &CommandOutput, needles: &[&str]) {
    let err = out.stderr_text();
    assert!(!out.success(), "git succeeded: {err}");
    for needle in needles {
        assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
    }
}

/// Clones `work` through the gate and adds one commit on top of `main`.
fn clone_and_commit(s: &Scratch, gate: &Gate, as_dir: &str) -> PathBuf {
    let home = s.home();
    let clone = s.path().join(as_dir);
    git_ok(
        s.path(),
        &home,
        &[
            "clone",
            "-q",
            &gate.url("work.git"),
            clone.to_str().unwrap(),
        ],
    );
    std::fs::write(clone.join("change"), format!("{as_dir}\n")).unwrap();
    git_ok(&clone, &home, &["add", "change"]);
    git_ok(&clone, &home, &["commit", "-q", "-m", "agent change"]);
    clone
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_fetch_and_a_push_to_an_allowed_branch_work() {
    let s = Scratch::new();
    let home = s.home();
    let bare = s.bare("work");
    let gate = Gate::start(s.path(), vec![served("work", &bare, GitMode::ReadWrite)]).await;

    let clone = clone_and_commit(&s, &gate, "clone");
    assert_eq!(
        std::fs::read_to_string(clone.join("README")).unwrap(),
        "work 2\n"
    );

    // The push lands in the bare repository.
    let out = git_in(&clone, &home, &["push", "origin", "HEAD:agent/x"]);
    assert!(out.success(), "{}", out.stderr_text());
    let head = git_ok(&clone, &home, &["rev-parse", "HEAD"]);
    assert_eq!(refs(&home, &bare)["refs/heads/agent/x"], head.trim());
    // A fast-forward of an existing allowed branch too.
    git_ok(
        &clone,
        &home,
        &["push", "-q", "origin", "HEAD:agent/existing"],
    );
    assert_eq!(refs(&home, &bare)["refs/heads/agent/existing"], head.trim());

    // Someone else moves main on the host; fetch brings it.
    let seed = s.path().join("work-seed");
    std::fs::write(seed.join("README"), "work 3\n").unwrap();
    git_ok(&seed, &home, &["commit", "-q", "-am", "seed 3"]);
    git_ok(
        &seed,
        &home,
        &["push", "-q", bare.to_str().unwrap(), "main"],
    );
    git_ok(&clone, &home, &["fetch", "-q", "origin"]);
    assert_eq!(
        git_ok(&clone, &home, &["rev-parse", "origin/main"]),
        git_ok(&seed, &home, &["rev-parse", "HEAD"])
    );

    // Audit: the clone's and the fetch's requests, and both pushes.
    let fetches = gate.lines("work", "fetch");
    assert!(fetches.len() >= 2, "{fetches:#?}");
    assert!(fetches.iter().all(|r| r.decision == Decision::Allow));
    let pushes = gate.lines("work", "push");
    assert_eq!(pushes.len(), 2, "{pushes:#?}");
    assert!(pushes.iter().all(|r| r.decision == Decision::Allow));
    assert_eq!(pushes[0].rule, "refs/heads/agent/x");
    assert_eq!(pushes[1].rule, "refs/heads/agent/existing");
    assert!(
        pushes
            .iter()
            .all(|r| r.path == "/work.git/git-receive-pack")
    );
    assert!(!gate.lines("work", "advertise").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_outside_the_rules_are_refused_and_change_nothing() {
    let s = Scratch::new();
    let home = s.home();
    let bare = s.bare("work");
    let gate = Gate::start(s.path(), vec![served("work", &bare, GitMode::ReadWrite)]).await;
    let before = refs(&home, &bare);
    let clone = clone_and_commit(&s, &gate, "clone");

    // To main: not an allowed branch; the gate answers before any object
    // lands, and git shows why.
    let out = git_in(&clone, &home, &["push", "origin", "HEAD:main"]);
    assert_refused(
        &out,
        &[
            "[remote rejected] HEAD -> main",
            "bottle git-gate: pushing to refs/heads/main in work is not allowed (push list: agent/*)",
        ],
    );
    assert_eq!(refs(&home, &bare), before);

    // One allowed and one refused ref: the whole push is refused.
    let out = git_in(
        &clone,
        &home,
        &["push", "origin", "HEAD:agent/y", "HEAD:main"],
    );
    assert_refused(
        &out,
        &[
            "[remote rejected] HEAD -> main",
            "[remote rejected] HEAD -> agent/y",
        ],
    );
    assert_eq!(refs(&home, &bare), before);

    // A tag: only `refs/tags/...` globs allow tags.
    git_ok(&clone, &home, &["tag", "v1"]);
    let out = git_in(&clone, &home, &["push", "origin", "v1"]);
    assert_refused(&out, &["[remote rejected] v1 -> v1", "tag refs/tags/v1"]);
    assert_eq!(refs(&home, &bare), before);

    // A force-push to an allowed branch: the hook sees it is not a
    // fast-forward once the objects are there, and refuses.
    git_ok(&clone, &home, &["reset", "-q", "--hard", "HEAD~2"]);
    std::fs::write(clone.join("other"), "rewritten\n").unwrap();
    git_ok(&clone, &home, &["add", "other"]);
    git_ok(&clone, &home, &["commit", "-q", "-m", "rewrite"]);
    let out = git_in(
        &clone,
        &home,
        &["push", "--force", "origin", "HEAD:agent/existing"],
    );
    assert_refused(
        &out,
        &[
            "[remote rejected] HEAD -> agent/existing",
            "is not a fast-forward and force pushes are not allowed",
        ],
    );
    assert_eq!(refs(&home, &bare), before);

    // Deleting an allowed branch.
    let out = git_in(&clone, &home, &["push", "origin", ":agent/existing"]);
    assert_refused(
        &out,
        &[
            "[remote rejected] agent/existing",
            "deleting refs/heads/agent/existing in work is not allowed",
        ],
    );
    assert_eq!(refs(&home, &bare), before);

    let pushes = gate.lines("work", "push");
    let reasons: Vec<&str> = pushes.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "ref_not_allowed: refs/heads/main",
            "ref_not_allowed: refs/heads/main",
            "tag_not_allowed: refs/tags/v1",
            "non_fast_forward: refs/heads/agent/existing",
            "delete_not_allowed: refs/heads/agent/existing",
        ],
        "{pushes:#?}"
    );
    assert!(pushes.iter().all(|r| r.decision == Decision::Deny));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refs_tags_glob_lets_the_agent_push_its_tags_and_no_others() {
    let s = Scratch::new();
    let home = s.home();
    let bare = s.bare("work");
    let mut repo = served("work", &bare, GitMode::ReadWrite);
    repo.push = vec!["agent/*".into(), "refs/tags/agent-*".into()];
    let gate = Gate::start(s.path(), vec![repo]).await;
    let clone = clone_and_commit(&s, &gate, "clone");
    let head = git_ok(&clone, &home, &["rev-parse", "HEAD"]);

    git_ok(&clone, &home, &["tag", "agent-v1"]);
    let out = git_in(&clone, &home, &["push", "origin", "agent-v1"]);
    assert!(out.success(), "{}", out.stderr_text());
    assert_eq!(refs(&home, &bare)["refs/tags/agent-v1"], head.trim());

    // A tag outside the glob, and a tag named like an allowed branch: a
    // branch glob never reaches tags.
    let before = refs(&home, &bare);
    for tag in ["v1", "agent/x"] {
        git_ok(&clone, &home, &["tag", tag]);
        let out = git_in(&clone, &home, &["push", "origin", tag]);
        assert_refused(&out, &[&format!("tag refs/tags/{tag}")]);
    }
    assert_eq!(refs(&home, &bare), before);

    let pushes = gate.lines("work", "push");
    let decisions: Vec<(Decision, &str)> = pushes
        .iter()
        .map(|r| (r.decision, r.reason.as_str()))
        .collect();
    assert_eq!(
        decisions,
        [
            (Decision::Allow, "allowed"),
            (Decision::Deny, "tag_not_allowed: refs/tags/v1"),
            (Decision::Deny, "tag_not_allowed: refs/tags/agent/x"),
        ],
        "{pushes:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_and_read_only_repositories_refuse() {
    let s = Scratch::new();
    let home = s.home();
    let work = s.bare("work");
    let docs = s.bare("docs");
    // Present on disk but not listed: the gate must not serve it.
    let secret = s.bare("secret");
    let gate = Gate::start(
        s.path(),
        vec![
            served("work", &work, GitMode::ReadWrite),
            served("docs", &docs, GitMode::ReadOnly),
        ],
    )
    .await;
    let secret_before = refs(&home, &secret);

    let out = git_in(
        s.path(),
        &home,
        &["clone", &gate.url("secret.git"), "stolen"],
    );
    assert_refused(&out, &["not found", "there is no repository"]);
    assert!(!s.path().join("stolen").exists());
    // Pushing to it fails the same way; it stays unchanged.
    let clone = clone_and_commit(&s, &gate, "clone");
    let out = git_in(
        &clone,
        &home,
        &["push", &gate.url("secret.git"), "HEAD:agent/x"],
    );
    assert_refused(&out, &["not found"]);
    assert_eq!(refs(&home, &secret), secret_before);
    // Paths that try to leave the served set are not found either.
    let out = git_in(
        s.path(),
        &home,
        &[
            "ls-remote",
            &format!("{}/../secret.git", gate.url("work.git")),
        ],
    );
    assert!(!out.success(), "{}", out.stdout_text());

    // A read-only repository clones, but refuses every push.
    let docs_before = refs(&home, &docs);
    let ro = s.path().join("docs-clone");
    git_ok(
        s.path(),
        &home,
        &["clone", "-q", &gate.url("docs.git"), ro.to_str().unwrap()],
    );
    std::fs::write(ro.join("x"), "x\n").unwrap();
    git_ok(&ro, &home, &["add", "x"]);
    git_ok(&ro, &home, &["commit", "-q", "-m", "x"]);
    let out = git_in(&ro, &home, &["push", "origin", "HEAD:agent/x"]);
    assert_refused(&out, &["repository docs is read-only", "403"]);
    assert_eq!(refs(&home, &docs), docs_before);

    let unknown: Vec<AuditRecord> = gate
        .audit()
        .into_iter()
        .filter(|r| r.reason == "unknown_repo")
        .collect();
    assert!(
        unknown
            .iter()
            .any(|r| r.host == "secret.git" && r.decision == Decision::Deny),
        "{unknown:#?}"
    );
    assert!(
        gate.audit()
            .iter()
            .any(|r| r.host == "docs" && r.reason == "read_only" && r.decision == Decision::Deny)
    );
    assert!(
        gate.lines("docs", "fetch")
            .iter()
            .any(|r| r.decision == Decision::Allow)
    );
}

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
struct UpstreamSeen {
    path: String,
    authorization: Option<String>,
}

/// A smart-HTTP git server: `git http-backend` (CGI) behind hyper, serving
/// the bare repositories in `root`, and answering 401 to any request
/// without the expected `Authorization` header.
struct GitUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<UpstreamSeen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GitUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Backend {
    root: PathBuf,
    home: PathBuf,
    expected: String,
    seen: Arc<Mutex<Vec<UpstreamSeen>>>,
}

impl GitUpstream {
    async fn start(root: &Path, home: &Path, expected: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<UpstreamSeen>>> = Arc::default();
        let backend = Arc::new(Backend {
            root: root.to_path_buf(),
            home: home.to_path_buf(),
            expected: expected.to_string(),
            seen: seen.clone(),
        });
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let backend = backend.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let backend = backend.clone();
                        async move { backend.serve(req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, seen, task }
    }

    fn seen(&self) -> Vec<UpstreamSeen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Backend {
    async fn serve(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let authorization = header("authorization");
        let path = req.uri().path().to_string();
        self.seen.lock().unwrap().push(UpstreamSeen {
            path: path.clone(),
            authorization: authorization.clone(),
        });
        if authorization.as_deref() != Some(self.expected.as_str()) {
            let mut resp = Response::new(Full::new(Bytes::from_static(b"credentials needed\n")));
            *resp.status_mut() = hyper::StatusCode::UNAUTHORIZED;
            resp.headers_mut().insert(
                "www-authenticate",
                hyper::header::HeaderValue::from_static("Basic realm=\"test\""),
            );
            return Ok(resp);
        }
        let mut spec = CommandSpec::new("git")
            .arg("http-backend")
            .env("GIT_PROJECT_ROOT", &self.root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("HOME", &self.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("REMOTE_USER", "gate")
            .env("REQUEST_METHOD", req.method().as_str())
            .env("PATH_INFO", &path)
            .env("QUERY_STRING", req.uri().query().unwrap_or(""));
        for (var, name) in [
            ("CONTENT_TYPE", "content-type"),
            ("HTTP_CONTENT_ENCODING", "content-encoding"),
            ("GIT_PROTOCOL", "git-protocol"),
        ] {
            if let Some(v) = header(name) {
                spec = spec.env(var, v);
            }
        }
        let body = req.into_body().collect().await?.to_bytes().to_vec();
        spec = spec.env("CONTENT_LENGTH", body.len().to_string());
        spec.stdin = Some(body);
        let out = tokio::task::spawn_blocking(move || SystemRunner.run(&spec))
            .await
            .unwrap()
            .unwrap();
        Ok(cgi_response(&out.stdout))
    }
}

/// Turns a CGI answer (headers, blank line, body) into a response.
fn cgi_response(raw: &[u8]) -> Response<Full<Bytes>> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            raw.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        })
        .unwrap_or((raw.len(), raw.len()));
    let head = String::from_utf8_lossy(&raw[..split.0]).into_owned();
    let mut resp = Response::new(Full::new(Bytes::copy_from_slice(&raw[split.1..])));
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            let code: u16 = v.split(' ').next().unwrap().parse().unwrap();
            *resp.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
        } else {
            resp.headers_mut().insert(
                hyper::header::HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
                hyper::header::HeaderValue::from_str(v).unwrap(),
            );
        }
    }
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_mode_injects_the_credential_and_forwards_allowed_pushes() {
    let s = Scratch::new();
    let home = s.home();
    let upstream_root = s.path().join("upstream");
    std::fs::create_dir_all(&upstream_root).unwrap();
    let origin = s.bare("origin");
    let up_bare = upstream_root.join("origin.git");
    std::fs::rename(&origin, &up_bare).unwrap();
    let secret = "s3cret-upstream-token";
    let expected = format!("Basic {}", base64(format!("gate:{secret}").as_bytes()));
    let upstream = GitUpstream::start(&upstream_root, &home, &expected).await;

    let credential = s.path().join("run-credential");
    std::fs::write(&credential, format!("gate:{secret}\n")).unwrap();
    let mirror = s.path().join("mirrors/mirror.git");
    let repo = BundleGitRepo {
        name: "mirror".into(),
        path_in_bundle: mirror.display().to_string(),
        upstream: Some(format!("http://{}/origin.git", upstream.addr)),
        mode: GitMode::ReadWrite,
        push: vec!["agent/*".into()],
        allow_force: false,
        allow_delete: false,
        credential_file: Some(credential.display().to_string()),
    };
    let gate = Gate::start(s.path(), vec![repo]).await;

    // The agent clones through the gate; GIT_TRACE_CURL shows every header
    // its git sent and received.
    let clone = s.path().join("mclone");
    let out = git_in(
        s.path(),
        &home,
        &["clone", &gate.url("mirror.git"), clone.to_str().unwrap()],
    );
    assert!(out.success(), "{}", out.stderr_text());
    assert_eq!(
        std::fs::read_to_string(clone.join("README")).unwrap(),
        "origin 2\n"
    );

    // The upstream saw the gate's credential on every request.
    let seen = upstream.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|r| r.authorization.as_deref() == Some(expected.as_str())),
        "{seen:#?}"
    );
    assert!(seen.iter().all(|r| r.path.starts_with("/origin.git/")));

    // The agent's side never carries it: not in what git traced, not in
    // its clone's config, not in the mirror's config.
    let mut spec_env_trace = git_in_traced(&clone, &home, &["fetch", "origin"]);
    spec_env_trace.push_str(&std::fs::read_to_string(clone.join(".git/config")).unwrap());
    spec_env_trace.push_str(&std::fs::read_to_string(mirror.join("config")).unwrap());
    assert!(spec_env_trace.contains("GET /mirror.git/info/refs"));
    for leak in [secret, expected.as_str(), "Authorization"] {
        assert!(
            !spec_env_trace.contains(leak),
            "{leak:?} reached the agent's side"
        );
    }

    // An allowed push goes on to the upstream.
    std::fs::write(clone.join("change"), "m\n").unwrap();
    git_ok(&clone, &home, &["add", "change"]);
    git_ok(&clone, &home, &["commit", "-q", "-m", "mirror change"]);
    let head = git_ok(&clone, &home, &["rev-parse", "HEAD"]);
    let out = git_in(&clone, &home, &["push", "origin", "HEAD:agent/m"]);
    assert!(out.success(), "{}", out.stderr_text());
    assert_eq!(refs(&home, &up_bare)["refs/heads/agent/m"], head.trim());
    assert_eq!(refs(&home, &mirror)["refs/heads/agent/m"], head.trim());

    // A push to main is refused; neither the upstream nor the mirror moves.
    let up_before = refs(&home, &up_bare);
    let mirror_before = refs(&home, &mirror);
    let out = git_in(&clone, &home, &["push", "origin", "HEAD:main"]);
    assert_refused(
        &out,
        &[
            "[remote rejected] HEAD -> main",
            "refs/heads/main in mirror is not allowed",
        ],
    );
    assert_eq!(refs(&home, &up_bare), up_before);
    assert_eq!(refs(&home, &mirror), mirror_before);

    let pushes = gate.lines("mirror", "push");
    let reasons: Vec<&str> = pushes.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "allowed: forwarded upstream",
            "ref_not_allowed: refs/heads/main"
        ]
    );
    assert!(!gate.lines("mirror", "fetch").is_empty());
}

/// Runs git with `GIT_TRACE_CURL` on (headers only) and returns what it
/// printed, failing the test unless git succeeds.
fn git_in_traced(dir: &Path, home: &Path, args: &[&str]) -> String {
    let mut spec = CommandSpec::new("git")
        .args(args)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", home.join(".gitconfig"))
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_TRACE_CURL", "1")
        .env("GIT_TRACE_CURL_NO_DATA", "1")
        .env("no_proxy", "*")
        .env("NO_PROXY", "*");
    spec.cwd = Some(dir.to_path_buf());
    let out = tokio::task::block_in_place(|| SystemRunner.run(&spec)).unwrap();
    assert!(out.success(), "{}", out.stderr_text());
    out.stderr_text()
}

/// One MCP `tools/call` to supervise over HTTP; returns the tool result.
async fn mcp_call(gate: &Gate, tool: &str, args: serde_json::Value) -> serde_json::Value {
    use tokio::io::AsyncWriteExt;
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": args},
    })
    .to_string();
    let mut s = tokio::net::TcpStream::connect(gate.bundle.supervise_addr.unwrap())
        .await
        .unwrap();
    s.write_all(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: bundle\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let resp = crate::support::read_response(&mut s).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    v["result"].clone()
}

/// The text of a tool result.
fn tool_text(result: &serde_json::Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

impl Gate {
    /// Polls (at most 10 s) until supervise has audited `reason` for
    /// `repo`: the decision has been acted on by then.
    async fn wait_for_decision(&self, reason: &str, repo: &str) -> AuditRecord {
        let what = format!("a supervise audit line {reason} for {repo}");
        bottle_test_support::wait_for_async(&what, std::time::Duration::from_secs(10), || {
            bottle_bundle::read_audit(&self.audit)
                .unwrap()
                .into_iter()
                .find(|r| r.daemon == "supervise" && r.reason == reason && r.host == repo)
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_push_request_opens_exactly_that_ref_in_the_running_gate() {
    use bottle_core::requests::{self, Status};
    use serde_json::json;

    let s = Scratch::new();
    let home = s.home();
    let work = s.bare("work");
    let docs = s.bare("docs");
    let queue = s.path().join("requests");
    let gate = Gate::start_with(
        s.path(),
        vec![
            served("work", &work, GitMode::ReadWrite),
            served("docs", &docs, GitMode::ReadOnly),
        ],
        Some(&queue),
    )
    .await;
    let before = refs(&home, &work);
    let clone = clone_and_commit(&s, &gate, "clone");
    let head = git_ok(&clone, &home, &["rev-parse", "HEAD"]);

    let out = git_in(&clone, &home, &["push", "origin", "HEAD:main"]);
    assert_refused(&out, &["[remote rejected] HEAD -> main"]);

    // Refused at once: a repository the gate does not serve, a read-only
    // one, a glob instead of a ref. Nothing is filed for them.
    for (repo, git_ref, needle) in [
        ("secret", "main", "there is no repository \"secret\""),
        ("docs", "main", "repository docs is read-only"),
        ("work", "agent/*", "is not a ref git can push"),
    ] {
        let r = mcp_call(
            &gate,
            "request_push",
            json!({"repo": repo, "ref": git_ref, "reason": "r"}),
        )
        .await;
        assert_eq!(r["isError"], true, "{r}");
        assert!(tool_text(&r).contains(needle), "{r}");
    }
    assert!(requests::ids(&queue).unwrap().is_empty());
    // A ref the manifest already allows files nothing either.
    let r = mcp_call(
        &gate,
        "request_push",
        json!({"repo": "work", "ref": "agent/new", "reason": "r"}),
    )
    .await;
    assert_eq!(r["structuredContent"]["status"], "allowed", "{r}");

    let ask = |git_ref: &'static str| {
        let gate = &gate;
        async move {
            let r = mcp_call(
                gate,
                "request_push",
                json!({"repo": "work.git", "ref": git_ref, "reason": "release it"}),
            )
            .await;
            assert_eq!(r["isError"], false, "{r}");
            assert_eq!(r["structuredContent"]["status"], "pending", "{r}");
            r["structuredContent"]["id"].as_str().unwrap().to_string()
        }
    };
    let main_id = ask("main").await;
    let release_id = ask("refs/heads/release").await;
    let filed = requests::read_request(&queue, &main_id).unwrap().unwrap();
    assert_eq!(
        filed.ask,
        requests::Ask::Push {
            repo: "work".into(),
            git_ref: "refs/heads/main".into()
        }
    );
    // Still refused while pending.
    let out = git_in(&clone, &home, &["push", "origin", "HEAD:main"]);
    assert_refused(&out, &["[remote rejected] HEAD -> main"]);
    assert_eq!(refs(&home, &work), before);

    requests::decide(&queue, &release_id, Status::Denied, Some("not yet")).unwrap();
    requests::decide(&queue, &main_id, Status::Approved, None).unwrap();
    let approval = gate.wait_for_decision("operator_approved", "work").await;
    assert_eq!(approval.decision, Decision::Allow);
    assert_eq!(approval.rule, "refs/heads/main");
    assert_eq!(approval.path, main_id);
    gate.wait_for_decision("operator_denied", "work").await;

    // The same gate, not restarted: main now takes a fast-forward push.
    git_ok(&clone, &home, &["push", "-q", "origin", "HEAD:main"]);
    assert_eq!(refs(&home, &work)["refs/heads/main"], head.trim());

    // The denied ref stays closed.
    let out = git_in(&clone, &home, &["push", "origin", "HEAD:release"]);
    assert_refused(
        &out,
        &["pushing to refs/heads/release in work is not allowed"],
    );
    assert!(!refs(&home, &work).contains_key("refs/heads/release"));

    // The approval is not one to rewrite or delete main.
    git_ok(&clone, &home, &["reset", "-q", "--hard", "HEAD~2"]);
    std::fs::write(clone.join("other"), "rewritten\n").unwrap();
    git_ok(&clone, &home, &["add", "other"]);
    git_ok(&clone, &home, &["commit", "-q", "-m", "rewrite"]);
    let out = git_in(&clone, &home, &["push", "--force", "origin", "HEAD:main"]);
    assert_refused(
        &out,
        &["is not a fast-forward and force pushes are not allowed"],
    );
    let out = git_in(&clone, &home, &["push", "origin", ":main"]);
    assert_refused(&out, &["deleting refs/heads/main in work is not allowed"]);
    assert_eq!(refs(&home, &work)["refs/heads/main"], head.trim());

    let pushes = gate.lines("work", "push");
    let reasons: Vec<&str> = pushes.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "ref_not_allowed: refs/heads/main",
            "ref_not_allowed: refs/heads/main",
            "allowed",
            "ref_not_allowed: refs/heads/release",
            "non_fast_forward: refs/heads/main",
            "delete_not_allowed: refs/heads/main",
        ],
        "{pushes:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_approvals_are_reread_on_restart_and_never_open_other_repositories() {
    use bottle_core::requests::{self, Ask, REQUESTS_VERSION, Request, Status};

    let s = Scratch::new();
    let home = s.home();
    let work = s.bare("work");
    let docs = s.bare("docs");
    let queue = s.path().join("requests");
    std::fs::create_dir_all(&queue).unwrap();
    // Approvals recorded while no bundle ran: one the gate can honour,
    // and two (edited in by hand, or from an older manifest) it must not.
    for (n, repo) in [(1, "work"), (2, "docs"), (3, "secret")] {
        let id = format!("gitgate-test-{n}");
        requests::write_request(
            &queue,
            &Request {
                v: REQUESTS_VERSION,
                id: id.clone(),
                bottle: "gitgate-test".into(),
                ask: Ask::Push {
                    repo: repo.into(),
                    git_ref: "main".into(),
                },
                reason: String::new(),
                created: bottle_core::time::now_rfc3339(),
                status: Status::Pending,
                decision_reason: None,
            },
        )
        .unwrap();
        requests::decide(&queue, &id, Status::Approved, None).unwrap();
    }
    let gate = Gate::start_with(
        s.path(),
        vec![
            served("work", &work, GitMode::ReadWrite),
            served("docs", &docs, GitMode::ReadOnly),
        ],
        Some(&queue),
    )
    .await;

    // Read at start: main of work is pushable at once.
    let clone = clone_and_commit(&s, &gate, "clone");
    let head = git_ok(&clone, &home, &["rev-parse", "HEAD"]);
    git_ok(&clone, &home, &["push", "-q", "origin", "HEAD:main"]);
    assert_eq!(refs(&home, &work)["refs/heads/main"], head.trim());

    // The read-only repository still refuses every push.
    let docs_before = refs(&home, &docs);
    let out = git_in(&clone, &home, &["push", &gate.url("docs.git"), "HEAD:main"]);
    assert_refused(&out, &["repository docs is read-only"]);
    assert_eq!(refs(&home, &docs), docs_before);

    let audit = bottle_bundle::read_audit(&gate.audit).unwrap();
    let decided = |repo: &str| {
        audit
            .iter()
            .find(|r| r.daemon == "supervise" && r.host == repo)
            .cloned()
            .unwrap()
    };
    let ok = decided("work");
    assert_eq!(
        (ok.decision, ok.reason.as_str(), ok.rule.as_str()),
        (Decision::Allow, "operator_approved", "refs/heads/main")
    );
    for repo in ["docs", "secret"] {
        let refused = decided(repo);
        assert_eq!(
            (refused.decision, refused.reason.as_str()),
            (Decision::Deny, "operator_approved_not_pushable"),
            "{refused:?}"
        );
    }
}

/// One `POST /<repo>/git-receive-pack` with `body` as it is: what an agent
/// that crafts its own framing sends.
async fn raw_push(gate: &Gate, repo: &str, body: &[u8]) -> crate::support::Resp {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(gate.bundle.git_gate_addr.unwrap())
        .await
        .unwrap();
    let head = format!(
        "POST /{repo}/git-receive-pack HTTP/1.1\r\nHost: gate\r\nContent-Type: application/x-git-receive-pack-request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    crate::support::read_response(&mut s).await
}

/// A push request built packet by packet.
#[derive(Default)]
struct Framing(Vec<u8>);

impl Framing {
    fn line(mut self, text: &str) -> Self {
        self.0.extend(pktline::pkt(text.as_bytes()));
        self
    }

    fn flush(mut self) -> Self {
        self.0.extend_from_slice(pktline::FLUSH);
        self
    }

    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    /// A push certificate for `commands`, in the shape `git push --signed`
    /// sends (the signature is not checked by anyone before the refusal).
    fn certificate(self, commands: &[String]) -> Self {
        let mut f = self
            .line(&format!("push-cert\0{CAPS}"))
            .line("certificate version 0.1\n")
            .line("pusher agent <agent@bottle.invalid> 1700000000 +0000\n")
            .line("pushee http://gate/work.git\n")
            .line("nonce 1700000000-0123456789abcdef\n")
            .line("\n");
        for c in commands {
            f = f.line(&format!("{c}\n"));
        }
        f.line("-----BEGIN PGP SIGNATURE-----\n")
            .line("iQEzBAABCAAdFiEEbottlebottlebottlebottle\n")
            .line("-----END PGP SIGNATURE-----\n")
            .line("push-cert-end\n")
    }
}

const CAPS: &str = "report-status side-band-64k agent=git/2.47";
const ZERO: &str = "0000000000000000000000000000000000000000";

/// A clone with one new commit on `main`, and the pack that carries it.
struct NewCommit {
    old: String,
    new: String,
    pack: Vec<u8>,
}

fn new_commit(s: &Scratch, gate: &Gate) -> NewCommit {
    let home = s.home();
    let clone = clone_and_commit(s, gate, "crafted");
    let old = git_ok(&clone, &home, &["rev-parse", "origin/main"])
        .trim()
        .to_string();
    let new = git_ok(&clone, &home, &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let mut spec = CommandSpec::new("git")
        .args(["pack-objects", "--stdout", "--revs", "-q"])
        .env("HOME", &home)
        .env("GIT_CONFIG_NOSYSTEM", "1");
    spec.cwd = Some(clone);
    spec.stdin = Some(format!("{new}\n^{old}\n").into_bytes());
    let out = tokio::task::block_in_place(|| SystemRunner.run(&spec)).unwrap();
    assert!(out.success(), "{}", out.stderr_text());
    assert!(out.stdout.starts_with(b"PACK"));
    NewCommit {
        old,
        new,
        pack: out.stdout,
    }
}

/// The report and side-band text of a refusal the gate answered.
fn refusal(resp: &crate::support::Resp) -> pktline::Report {
    assert_eq!(resp.status, 200, "{}", resp.text());
    pktline::parse_report(&resp.body, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_pushes_are_refused_before_receive_pack_and_audited_with_their_refs() {
    let s = Scratch::new();
    let home = s.home();
    let bare = s.bare("work");
    let gate = Gate::start(s.path(), vec![served("work", &bare, GitMode::ReadWrite)]).await;
    let c = new_commit(&s, &gate);
    let before = refs(&home, &bare);
    let to_main = format!("{} {} refs/heads/main", c.old, c.new);
    let to_allowed = format!("{ZERO} {} refs/heads/agent/x", c.new);

    // To an allowed branch: the push rules alone would let it through.
    let body = Framing::default()
        .certificate(std::slice::from_ref(&to_allowed))
        .flush()
        .raw(&c.pack);
    let report = refusal(&raw_push(&gate, "work.git", &body.0).await);
    assert_eq!(
        report.refs,
        [(
            "refs/heads/agent/x".to_string(),
            Some("bottle: signed push".to_string())
        )]
    );
    assert!(
        report.messages.contains("signed pushes are not accepted"),
        "{}",
        report.messages
    );
    assert!(report.messages.contains("fix: push without --signed"));

    // To the protected branch, in the certificate.
    let body = Framing::default()
        .certificate(std::slice::from_ref(&to_main))
        .flush()
        .raw(&c.pack);
    let report = refusal(&raw_push(&gate, "work.git", &body.0).await);
    assert_eq!(report.refs.len(), 1, "{report:?}");
    assert_eq!(report.refs[0].0, "refs/heads/main");
    assert!(
        report
            .messages
            .contains("pushing to refs/heads/main in work is not allowed")
    );

    // An allowed ref in the certificate and the protected one after it.
    let body = Framing::default()
        .certificate(std::slice::from_ref(&to_allowed))
        .line(&to_main)
        .flush()
        .raw(&c.pack);
    let report = refusal(&raw_push(&gate, "work.git", &body.0).await);
    let named: Vec<&str> = report.refs.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(named, ["refs/heads/agent/x", "refs/heads/main"]);
    assert!(report.refs.iter().all(|(_, ng)| ng.is_some()));

    assert_eq!(refs(&home, &bare), before);
    let pushes = gate.lines("work", "push");
    let seen: Vec<(&str, &str)> = pushes
        .iter()
        .map(|r| (r.reason.as_str(), r.rule.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("signed_push: refs/heads/agent/x", "refs/heads/agent/x"),
            ("signed_push: refs/heads/main", "refs/heads/main"),
            (
                "signed_push: refs/heads/agent/x",
                "refs/heads/agent/x refs/heads/main"
            ),
        ],
        "{pushes:#?}"
    );
    assert!(pushes.iter().all(|r| r.decision == Decision::Deny));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shallow_pushes_work_and_framing_outside_the_grammar_is_refused() {
    let s = Scratch::new();
    let home = s.home();
    let bare = s.bare("work");
    let gate = Gate::start(s.path(), vec![served("work", &bare, GitMode::ReadWrite)]).await;

    // A push from a shallow clone sends `shallow` lines before its commands.
    let shallow = s.path().join("shallow");
    git_ok(
        s.path(),
        &home,
        &[
            "clone",
            "-q",
            "--depth",
            "1",
            &gate.url("work.git"),
            shallow.to_str().unwrap(),
        ],
    );
    std::fs::write(shallow.join("change"), "shallow\n").unwrap();
    git_ok(&shallow, &home, &["add", "change"]);
    git_ok(
        &shallow,
        &home,
        &["commit", "-q", "-m", "from a shallow clone"],
    );
    git_ok(
        &shallow,
        &home,
        &["push", "-q", "origin", "HEAD:agent/shallow"],
    );
    let head = git_ok(&shallow, &home, &["rev-parse", "HEAD"]);
    assert_eq!(refs(&home, &bare)["refs/heads/agent/shallow"], head.trim());

    let c = new_commit(&s, &gate);
    let before = refs(&home, &bare);
    let allowed = format!("{ZERO} {} refs/heads/agent/y", c.new);
    let first = format!("{allowed}\0{CAPS}\n");
    let garbled: Vec<(&str, Framing, &str)> = vec![
        (
            // receive-pack takes these anywhere; the grammar puts them first.
            "a shallow line after a command",
            Framing::default()
                .line(&first)
                .line(&format!("shallow {}", c.old))
                .flush()
                .raw(&c.pack),
            "a shallow line comes after a command",
        ),
        (
            // receive-pack reads capabilities from any line.
            "capabilities on a second line",
            Framing::default()
                .line(&first)
                .line(&format!("{ZERO} {} refs/heads/agent/z\0quiet", c.new))
                .flush()
                .raw(&c.pack),
            "capabilities are only allowed on the first command line",
        ),
        (
            "a garbled command",
            Framing::default()
                .line(&first)
                .line("delete everything")
                .flush()
                .raw(&c.pack),
            "\"delete everything\" is not an `old-oid new-oid refname` command",
        ),
        (
            "a delimiter packet",
            Framing::default()
                .line(&first)
                .raw(b"0001")
                .line(&format!("{} {} refs/heads/main", c.old, c.new))
                .flush()
                .raw(&c.pack),
            "unexpected delimiter packet in the command list",
        ),
        (
            "no packfile after the commands",
            Framing::default().line(&first).flush().raw(b"JUNKJUNK"),
            "is not a packfile",
        ),
    ];
    for (name, body, said) in garbled {
        let report = refusal(&raw_push(&gate, "work.git", &body.0).await);
        assert!(
            report.messages.contains(said),
            "{name}: {}",
            report.messages
        );
        assert!(report.messages.contains("fix:"), "{name}");
        assert!(report.refs.iter().all(|(_, ng)| ng.is_some()), "{name}");
    }

    // Without capabilities there is no report to shape: git's ERR packet.
    let body = Framing::default().line(&allowed).flush().raw(&c.pack);
    let resp = raw_push(&gate, "work.git", &body.0).await;
    assert_eq!(resp.status, 200);
    assert!(
        resp.text()
            .contains("ERR bottle git-gate: the push request is malformed: the first command line carries no capabilities"),
        "{}",
        resp.text()
    );

    assert_eq!(refs(&home, &bare), before);
    // Identical refusals are coalesced into one counted line (the refs are
    // the last one's), flushed when the one-second window closes.
    let pushes = bottle_test_support::wait_for_async(
        "the seven push decisions in the audit log",
        std::time::Duration::from_secs(10),
        || {
            let pushes = gate.lines("work", "push");
            (pushes.iter().map(|r| r.count).sum::<u64>() == 7).then_some(pushes)
        },
    )
    .await;
    let first = &pushes[0];
    assert_eq!(
        (first.reason.as_str(), first.rule.as_str(), first.count),
        ("allowed", "refs/heads/agent/shallow", 1),
        "{pushes:#?}"
    );
    let refused = &pushes[1..];
    assert!(
        refused.iter().all(|r| r.reason == "malformed_request"),
        "{pushes:#?}"
    );
    assert_eq!(refused[0].rule, "refs/heads/agent/y", "{pushes:#?}");
    assert_eq!(
        refused.iter().map(|r| r.count).sum::<u64>(),
        6,
        "{pushes:#?}"
    );
}
