//! A denied CONNECT is answered inside the tunnel, where curl, pip, npm
//! and git show it: `403`, the denial as text, a reason phrase, and
//! nothing sent towards the denied host.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bottle_bundle::Decision;
use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec, SystemRunner};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::support::{AGENT, ALLOWED, Env, Options};

const DENIED: &str = "denied.example";

/// A listener standing where the denied host would be, counting the
/// connections it is offered (there must be none).
struct WouldBeHost {
    port: u16,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl WouldBeHost {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        Self {
            port,
            connections,
            task,
        }
    }
}

impl Drop for WouldBeHost {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A bundle whose resolve maps the denied name onto `host`, on a port the
/// policy allows: only the host rule stands between the agent and it.
async fn bundle_beside(host: &WouldBeHost) -> Env {
    let mut opts = Options::default();
    opts.resolve.insert(DENIED.into(), "127.0.0.1".into());
    opts.extra_ports.push(host.port);
    Env::start(opts).await
}

fn curl(env: &Env, args: &[&str]) -> CommandOutput {
    let ca = Path::new(&env.config.ca_cert).to_path_buf();
    let spec = CommandSpec::new("curl")
        .args(["-sS", "--max-time", "20", "--proxy"])
        .arg(format!("http://{}", env.proxy()))
        .arg("--cacert")
        .arg(ca)
        .args(args)
        .timeout(Duration::from_secs(30));
    tokio::task::block_in_place(|| SystemRunner.run(&spec)).unwrap()
}

fn assert_names_the_way_out(text: &str, host: &str) {
    assert!(text.contains(host), "{text}");
    assert!(text.contains(&format!("agent \"{AGENT}\"'s")), "{text}");
    assert!(text.contains("request_egress"), "{text}");
    assert!(text.contains("/etc/bottle/mcp.json"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_shows_the_denial_of_an_https_url() {
    let host = WouldBeHost::start().await;
    let env = bundle_beside(&host).await;
    let url = format!("https://{DENIED}:{}/x?token=abc", host.port);

    let out = curl(&env, &["-w", "\n%{http_code}", &url]);
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let stdout = out.stdout_text();
    assert!(stdout.ends_with("\n403"), "{stdout}");
    assert_names_the_way_out(&stdout, DENIED);
    assert!(
        stdout.contains(&format!(
            "adds \"{DENIED}\" to [agents.{AGENT}.egress] allow in bottle.toml"
        )),
        "{stdout}"
    );

    let out = curl(&env, &["-f", &url]);
    assert_eq!(out.code, Some(22), "{}", out.stderr_text());

    let out = curl(&env, &["-I", &url]);
    assert!(
        out.stdout_text().contains(&format!(
            "HTTP/1.1 403 Blocked by bottle: {DENIED} not in allowlist"
        )),
        "{}",
        out.stdout_text()
    );

    assert_eq!(host.connections.load(Ordering::SeqCst), 0);
    assert!(env.upstream.seen().is_empty());
    let audit = env.audit();
    let connect = audit
        .iter()
        .find(|r| r.method == "CONNECT")
        .unwrap_or_else(|| panic!("no CONNECT line in {audit:?}"));
    assert_eq!(connect.decision, Decision::Deny);
    assert_eq!(connect.host, DENIED);
    assert_eq!(connect.reason, "host_not_allowed");
    assert_eq!(connect.rule, DENIED);
    assert_eq!(connect.status, 403);
    let inner = audit
        .iter()
        .find(|r| r.method == "GET")
        .unwrap_or_else(|| panic!("no line for the request inside in {audit:?}"));
    assert_eq!(inner.decision, Decision::Deny);
    assert_eq!(inner.host, DENIED);
    assert_eq!(inner.path, "/x?token=…");
    assert_eq!(inner.reason, "host_not_allowed");
    assert_eq!(inner.status, 403);
    assert!(
        audit
            .iter()
            .any(|r| r.method == "HEAD" && r.path == "/x?token=…"),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_shows_the_denial_of_an_ip_literal_and_a_port() {
    let host = WouldBeHost::start().await;
    let env = bundle_beside(&host).await;

    let out = curl(
        &env,
        &[
            "-w",
            "\n%{http_code}",
            &format!("https://127.0.0.1:{}/", host.port),
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let stdout = out.stdout_text();
    assert!(stdout.ends_with("\n403"), "{stdout}");
    assert_names_the_way_out(&stdout, "127.0.0.1");

    let out = curl(&env, &["-i", &format!("https://{ALLOWED}:22/")]);
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let stdout = out.stdout_text();
    assert!(
        stdout.contains("HTTP/1.1 403 Blocked by bottle: port 22 not allowed"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("agent \"{AGENT}\"'s")), "{stdout}");
    assert!(stdout.contains("request_egress"), "{stdout}");
    assert!(
        stdout.contains(&format!("add 22 to [agents.{AGENT}.egress] ports")),
        "{stdout}"
    );

    assert_eq!(host.connections.load(Ordering::SeqCst), 0);
    assert!(env.upstream.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_through_a_denied_connect_gets_the_denial_then_closes() {
    let host = WouldBeHost::start().await;
    let env = bundle_beside(&host).await;
    let (resp, mut stream) = env
        .plain_in_tunnel(
            &format!("{DENIED}:443"),
            format!("POST /upload HTTP/1.1\r\nHost: {DENIED}\r\nContent-Length: 5\r\n\r\nhello")
                .as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        resp.reason,
        format!("Blocked by bottle: {DENIED} not in allowlist")
    );
    assert_eq!(
        resp.header("content-type").as_deref(),
        Some("text/plain; charset=utf-8")
    );
    assert_names_the_way_out(&resp.text(), DENIED);

    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "the tunnel closes after the answer: {closed:?} {rest:?}"
    );
    assert_eq!(host.connections.load(Ordering::SeqCst), 0);
    let audit = env.audit();
    assert!(
        audit
            .iter()
            .any(|r| r.method == "POST" && r.path == "/upload" && r.decision == Decision::Deny),
        "{audit:?}"
    );
}
