//! supervise: a real MCP client round trip over HTTP, malformed JSON-RPC,
//! and the operator's approve / deny paths changing the running proxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_bundle::{Decision, RunningBundle};
use bottle_core::requests::{self, Status};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::{Options, Resp, Upstream, base_config, read_response};

/// Mapped onto the upstream with `resolve` but not in `allow`: only an
/// operator approval can open it.
const WANTED: &str = "docs.supervise.test";
const OTHER: &str = "other.supervise.test";

struct Sup {
    dir: tempfile::TempDir,
    upstream: Upstream,
    bundle: RunningBundle,
    audit_log: PathBuf,
}

impl Sup {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let upstream = Upstream::start(dir.path()).await;
        let mut opts = Options::default();
        for host in [WANTED, OTHER] {
            opts.resolve.insert(host.into(), "127.0.0.1".into());
        }
        let (mut config, _) = base_config(dir.path(), &upstream, &opts);
        config.supervise_listen = Some("127.0.0.1:0".into());
        config.requests_dir = Some(dir.path().join("requests").display().to_string());
        let audit_log = PathBuf::from(&config.audit_log);
        let bundle = bottle_bundle::start(config).await.unwrap();
        Self {
            dir,
            upstream,
            bundle,
            audit_log,
        }
    }

    fn requests(&self) -> PathBuf {
        self.dir.path().join("requests")
    }

    fn mcp_addr(&self) -> SocketAddr {
        self.bundle.supervise_addr.unwrap()
    }

    async fn client(&self) -> Client {
        Client {
            s: TcpStream::connect(self.mcp_addr()).await.unwrap(),
            next_id: 0,
        }
    }

    /// A plain-HTTP GET through the proxy to `host` (mapped to the
    /// upstream); returns the status.
    async fn through_proxy(&self, host: &str) -> u16 {
        let port = self.upstream.http.port();
        let mut s = TcpStream::connect(self.bundle.proxy_addr).await.unwrap();
        s.write_all(
            format!(
                "GET http://{host}:{port}/hello HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        read_response(&mut s).await.status
    }

    fn audit_has(&self, reason: &str, host: &str) -> bool {
        bottle_bundle::read_audit(&self.audit_log)
            .unwrap()
            .iter()
            .any(|r| r.daemon == "supervise" && r.reason == reason && r.host == host)
    }

    /// Waits (bounded) until the bundle has audited a decision.
    async fn wait_for_audit(&self, reason: &str, host: &str) {
        let what = format!("a supervise audit line {reason} for {host}");
        bottle_test_support::wait_for_async(&what, Duration::from_secs(10), || {
            self.audit_has(reason, host).then_some(())
        })
        .await;
    }
}

/// A minimal MCP client speaking streamable HTTP over one keep-alive
/// connection.
struct Client {
    s: TcpStream,
    next_id: u64,
}

impl Client {
    async fn post(&mut self, body: &str) -> Resp {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: bundle\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.s.write_all(head.as_bytes()).await.unwrap();
        self.s.write_all(body.as_bytes()).await.unwrap();
        read_response(&mut self.s).await
    }

    async fn json(&mut self, body: &str) -> Value {
        let resp = self.post(body).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(
            resp.header("content-type").as_deref(),
            Some("application/json")
        );
        serde_json::from_slice(&resp.body).unwrap()
    }

    async fn rpc(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let v = self
            .json(
                &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                    .to_string(),
            )
            .await;
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["id"], id);
        v
    }

    async fn call(&mut self, tool: &str, args: Value) -> Value {
        let v = self
            .rpc("tools/call", json!({"name": tool, "arguments": args}))
            .await;
        v["result"].clone()
    }

    async fn request_egress(&mut self, host: &str) -> String {
        let r = self
            .call(
                "request_egress",
                json!({"host": host, "reason": "read the docs"}),
            )
            .await;
        assert_eq!(r["isError"], false, "{r}");
        r["structuredContent"]["id"].as_str().unwrap().to_string()
    }

    async fn status(&mut self, id: &str) -> Value {
        self.call("request_status", json!({"id": id}))
            .await
            .get("structuredContent")
            .cloned()
            .unwrap()
    }
}

fn request_file(dir: &Path, id: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join(format!("{id}.json"))).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_round_trip_files_a_pending_request() {
    let env = Sup::start().await;
    let mut c = env.client().await;

    let init = c
        .rpc(
            "initialize",
            json!({
                "protocolVersion": "2025-03-26",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            }),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-03-26");
    assert_eq!(init["result"]["serverInfo"]["name"], "bottle-supervise");
    assert!(init["result"]["capabilities"]["tools"].is_object());

    let note = c
        .post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    assert_eq!(note.status, 202);
    assert!(note.body.is_empty());

    let list = c.rpc("tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["request_egress", "request_push", "notify", "request_status"]
    );
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }

    let result = c
        .call(
            "request_egress",
            json!({"host": "Docs.Supervise.Test.", "reason": "read the docs"}),
        )
        .await;
    assert_eq!(result["isError"], false, "{result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("pending operator approval"), "{text}");
    assert!(text.contains("bottle approve test-1"), "{text}");
    assert_eq!(result["structuredContent"]["id"], "test-1");
    assert_eq!(result["structuredContent"]["status"], "pending");

    // The request is on disk for the host, host name normalised.
    let file = request_file(&env.requests(), "test-1");
    assert_eq!(file["kind"], "egress");
    assert_eq!(file["detail"]["host"], WANTED);
    assert_eq!(file["reason"], "read the docs");
    assert_eq!(file["status"], "pending");
    assert_eq!(file["bottle"], "test");

    // Asking again returns the same request; nothing is allowed yet.
    assert_eq!(c.request_egress(WANTED).await, "test-1");
    assert_eq!(requests::pending(&env.requests()).unwrap().len(), 1);
    assert_eq!(env.through_proxy(WANTED).await, 403);

    // A host the manifest already allows files nothing.
    let already = c
        .call(
            "request_egress",
            json!({"host": crate::support::ALLOWED, "reason": "x"}),
        )
        .await;
    assert_eq!(already["structuredContent"]["status"], "allowed");

    // No git-gate in this bundle: a push request is refused at once, and
    // files nothing (pushes are filed in gitgate.rs's tests).
    let push = c
        .call(
            "request_push",
            json!({"repo": "app", "ref": "refs/heads/fix-1", "reason": "done"}),
        )
        .await;
    assert_eq!(push["isError"], true, "{push}");
    let text = push["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("no repository \"app\" behind git-gate (repositories: none)"),
        "{text}"
    );
    let notify = c.call("notify", json!({"message": "tests pass"})).await;
    assert_eq!(notify["structuredContent"]["id"], "test-2");
    let file = request_file(&env.requests(), "test-2");
    assert_eq!(file["detail"]["message"], "tests pass");
    assert_eq!(c.status("test-2").await["status"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_rpc_gets_errors_not_a_crash() {
    let env = Sup::start().await;
    let mut c = env.client().await;
    let code = |v: &Value| v["error"]["code"].as_i64().unwrap();

    let v = c.json("{this is not json").await;
    assert_eq!(code(&v), -32700);
    assert_eq!(v["id"], Value::Null);
    // Same connection, next request: still served.
    let v = c.rpc("ping", json!({})).await;
    assert_eq!(v["result"], json!({}));

    let v = c.rpc("no/such/method", json!({})).await;
    assert_eq!(code(&v), -32601);
    let v = c.json(r#"{"jsonrpc":"2.0","id":7}"#).await;
    assert_eq!(code(&v), -32600);
    let v = c.json(r#"[1, 2]"#).await;
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(code(&v[0]), -32600);
    let v = c.json("[]").await;
    assert_eq!(code(&v), -32600);
    let v = c.call("request_egress", json!({"reason": "no host"})).await;
    assert_eq!(v, Value::Null, "a protocol error has no result");
    let v = c
        .rpc(
            "tools/call",
            json!({"name": "request_egress", "arguments": {"reason": "no host"}}),
        )
        .await;
    assert_eq!(code(&v), -32602);
    let v = c
        .rpc("tools/call", json!({"name": "rm_rf", "arguments": {}}))
        .await;
    assert_eq!(code(&v), -32602);

    // A bad host is a tool failure the model can read.
    let r = c
        .call(
            "request_egress",
            json!({"host": "https://x.test/path", "reason": "r"}),
        )
        .await;
    assert_eq!(r["isError"], true, "{r}");
    let r = c
        .call(
            "request_egress",
            json!({"host": "169.254.169.254", "reason": "r"}),
        )
        .await;
    assert_eq!(r["isError"], true, "{r}");
    let r = c
        .call("request_status", json!({"id": "../../etc/passwd"}))
        .await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        requests::ids(&env.requests()).unwrap().is_empty(),
        "nothing was filed"
    );

    // Batches: one answer per request, none for notifications.
    let v = c
        .json(
            r#"[{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
        )
        .await;
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["id"], "a");

    // Too large a body: refused, and the daemon still answers.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(300 * 1024)
    );
    let mut other = env.client().await;
    let resp = other.post(&big).await;
    assert_eq!(resp.status, 413);

    // GET (event stream) is not offered; other paths are 404.
    let mut s = TcpStream::connect(env.mcp_addr()).await.unwrap();
    s.write_all(
        b"GET /mcp HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let resp = read_response(&mut s).await;
    assert_eq!(resp.status, 405);
    assert_eq!(resp.header("allow").as_deref(), Some("POST"));
    let mut s = TcpStream::connect(env.mcp_addr()).await.unwrap();
    s.write_all(
        b"POST /other HTTP/1.1\r\nHost: b\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(read_response(&mut s).await.status, 404);

    let mut c = env.client().await;
    assert_eq!(c.rpc("ping", json!({})).await["result"], json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_opens_the_host_in_the_running_proxy() {
    let env = Sup::start().await;
    let mut c = env.client().await;
    let id = c.request_egress(WANTED).await;
    assert_eq!(env.through_proxy(WANTED).await, 403);

    let decided = requests::decide(&env.requests(), &id, Status::Approved, None).unwrap();
    assert_eq!(decided.status, Status::Approved);
    env.wait_for_audit("operator_approved", WANTED).await;

    // The same bundle, not restarted: the proxy and egress now allow it.
    assert_eq!(env.through_proxy(WANTED).await, 200);
    assert!(
        env.upstream.seen().iter().any(|s| s.path == "/hello"),
        "the request reached the upstream"
    );
    assert_eq!(c.status(&id).await["status"], "approved");
    assert_eq!(env.through_proxy(OTHER).await, 403, "only that host");

    let audit = bottle_bundle::read_audit(&env.audit_log).unwrap();
    let approval = audit
        .iter()
        .find(|r| r.daemon == "supervise" && r.reason == "operator_approved")
        .unwrap();
    assert_eq!(approval.decision, Decision::Allow);
    assert_eq!(approval.host, WANTED);
    assert_eq!(approval.path, id);
    assert!(audit.iter().any(|r| r.daemon == "proxy"
        && r.host == WANTED
        && r.decision == Decision::Allow
        && r.rule == WANTED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_keeps_the_host_closed_and_nothing_approves_itself() {
    let env = Sup::start().await;
    let mut c = env.client().await;
    let waiting = c.request_egress(OTHER).await;
    let denied = c.request_egress(WANTED).await;
    assert_ne!(waiting, denied);

    requests::decide(
        &env.requests(),
        &denied,
        Status::Denied,
        Some("use the mirror"),
    )
    .unwrap();
    // Once the denial is audited the watcher has read the queue after
    // both requests were filed: the other one is still only pending.
    env.wait_for_audit("operator_denied", WANTED).await;

    assert_eq!(env.through_proxy(WANTED).await, 403);
    let status = c.status(&denied).await;
    assert_eq!(status["status"], "denied");
    assert_eq!(status["reason"], "use the mirror");

    assert_eq!(c.status(&waiting).await["status"], "pending");
    assert_eq!(env.through_proxy(OTHER).await, 403);
    assert!(!env.audit_has("operator_approved", OTHER));
    let pending = requests::pending(&env.requests()).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, waiting);

    // A decision is final.
    let again = requests::decide(&env.requests(), &denied, Status::Approved, None);
    assert!(again.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_survive_a_bundle_restart() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start(dir.path()).await;
    let mut opts = Options::default();
    opts.resolve.insert(WANTED.into(), "127.0.0.1".into());
    let (mut config, _) = base_config(dir.path(), &upstream, &opts);
    config.supervise_listen = Some("127.0.0.1:0".into());
    let queue = dir.path().join("requests");
    config.requests_dir = Some(queue.display().to_string());
    std::fs::create_dir_all(&queue).unwrap();
    // An approval recorded while no bundle ran (e.g. before a restart).
    requests::write_request(
        &queue,
        &requests::Request {
            v: requests::REQUESTS_VERSION,
            id: "test-4".into(),
            bottle: "test".into(),
            ask: requests::Ask::Egress {
                host: WANTED.into(),
            },
            reason: String::new(),
            created: bottle_core::time::now_rfc3339(),
            status: Status::Pending,
            decision_reason: None,
        },
    )
    .unwrap();
    requests::decide(&queue, "test-4", Status::Approved, None).unwrap();

    let bundle = bottle_bundle::start(config).await.unwrap();
    let port = upstream.http.port();
    let mut s = TcpStream::connect(bundle.proxy_addr).await.unwrap();
    s.write_all(
        format!("GET http://{WANTED}:{port}/x HTTP/1.1\r\nHost: {WANTED}:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);

    // New ids continue after the existing ones.
    let mut c = Client {
        s: TcpStream::connect(bundle.supervise_addr.unwrap())
            .await
            .unwrap(),
        next_id: 0,
    };
    let r = c.call("notify", json!({"message": "hi"})).await;
    assert_eq!(r["structuredContent"]["id"], "test-5");
}
