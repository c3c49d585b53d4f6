//! HTTP/2 inside intercepted tunnels: ALPN on the agent's leg, HTTP/2 to
//! egress and on to an upstream that offers it, with the same host checks,
//! secret scanning and audit as HTTP/1.1.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bottle_bundle::Decision;
use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{HeaderMap, Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;

use crate::support::{ALLOWED, Env, OTHER_ALLOWED, Options, tls_client_alpn};

const GITHUB_TOKEN: &str = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";

/// A request body the test feeds frame by frame, as a streaming client does.
struct ChannelBody(mpsc::Receiver<Frame<Bytes>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|f| f.map(Ok))
    }
}

/// A body of `frames`, all sent at once.
fn frames(frames: Vec<Frame<Bytes>>) -> ChannelBody {
    let (tx, rx) = mpsc::channel(frames.len().max(1));
    for f in frames {
        tx.try_send(f).unwrap();
    }
    ChannelBody(rx)
}

/// An HTTP/2-only client (ALPN offers `h2` alone) through the proxy's
/// tunnel to `ALLOWED` on the upstream's HTTPS port.
async fn h2_client(env: &Env) -> hyper::client::conn::http2::SendRequest<ChannelBody> {
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let s = env.connect(&authority).await.unwrap();
    let tls = tls_client_alpn(&env.ca_pem, s, ALLOWED, vec![b"h2".to_vec()])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

fn request(
    env: &Env,
    method: &str,
    host: &str,
    path: &str,
    body: ChannelBody,
) -> Request<ChannelBody> {
    Request::builder()
        .method(method)
        .uri(format!(
            "https://{host}:{}{path}",
            env.upstream.https.port()
        ))
        .version(Version::HTTP_2)
        .body(body)
        .unwrap()
}

async fn send(env: &Env, req: Request<ChannelBody>) -> Response<Incoming> {
    let mut client = h2_client(env).await;
    client.ready().await.unwrap();
    client.send_request(req).await.unwrap()
}

/// Waits for an audit line of the proxy that `pred` accepts.
async fn audited(env: &Env, pred: impl Fn(&bottle_bundle::AuditRecord) -> bool) -> bool {
    bottle_test_support::eventually_async(Duration::from_secs(5), || {
        env.audit().iter().any(|r| r.daemon == "proxy" && pred(r))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_http2_through_the_proxy_speaks_http2_on_both_legs() {
    let env = Env::start(Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &env.ca_pem).unwrap();
    let url = format!("https://{ALLOWED}:{}/curl", env.upstream.https.port());
    let spec = CommandSpec::new("curl")
        .args(["-sS", "--http2", "-o", "/dev/null", "-w", "%{http_version}"])
        .arg("--proxy")
        .arg(format!("http://{}", env.proxy()))
        .arg("--cacert")
        .arg(&ca)
        .arg(&url)
        .timeout(Duration::from_secs(30));
    let out = tokio::task::spawn_blocking(move || SystemRunner.run(&spec))
        .await
        .unwrap()
        .expect("this test needs the host's curl");
    assert!(out.success(), "curl failed: {}", out.stderr_text());
    assert_eq!(out.stdout_text(), "2", "curl's %{{http_version}}");
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/curl");
    assert_eq!(seen[0].version, Version::HTTP_2, "the upstream leg");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_only_client_gets_its_response_and_an_audit_line() {
    let env = Env::start(Options::default()).await;
    let resp = send(
        &env,
        request(&env, "GET", ALLOWED, "/h2/only", frames(vec![])),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"GET /h2/only\n"), "{body:?}");
    assert_eq!(env.upstream.seen()[0].version, Version::HTTP_2);
    assert!(
        audited(&env, |r| r.decision == Decision::Allow
            && r.method == "GET"
            && r.path == "/h2/only"
            && r.status == 200
            && r.host == ALLOWED)
        .await,
        "{:?}",
        env.audit()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_shaped_exchange_streams_and_returns_trailers() {
    let env = Env::start(Options::default()).await;
    let (tx, rx) = mpsc::channel(4);
    let mut req = request(&env, "POST", ALLOWED, "/pkg.Svc/Call", ChannelBody(rx));
    req.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    req.headers_mut().insert("te", "trailers".parse().unwrap());
    let mut client = h2_client(&env).await;
    client.ready().await.unwrap();
    let pending = tokio::spawn(client.send_request(req));
    // The body streams: one message now, the next once the first is on its
    // way, then the end.
    tx.send(Frame::data(Bytes::from_static(b"\0\0\0\0\x05hello")))
        .await
        .unwrap();
    tx.send(Frame::data(Bytes::from_static(b"\0\0\0\0\x05world")))
        .await
        .unwrap();
    drop(tx);
    let resp = pending.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..]),
        "the response trailers reach the client"
    );
    assert_eq!(
        collected.to_bytes(),
        Bytes::from_static(b"\0\0\0\0\x05hello\0\0\0\0\x05world")
    );
    let seen = env.upstream.seen();
    assert_eq!(seen[0].version, Version::HTTP_2);
    assert_eq!(seen[0].header("te"), vec!["trailers".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authority_naming_another_host_is_misdirected() {
    let env = Env::start(Options::default()).await;
    let resp = send(
        &env,
        request(&env, "GET", OTHER_ALLOWED, "/", frames(vec![])),
    )
    .await;
    assert_eq!(resp.status(), 421);
    assert!(env.upstream.seen().is_empty());
    assert!(
        audited(&env, |r| r.decision == Decision::Deny
            && r.reason == "host_mismatch")
        .await,
        "{:?}",
        env.audit()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_in_an_h2_body_is_blocked() {
    let env = Env::start(Options::default()).await;
    let body = frames(vec![Frame::data(Bytes::from(format!(
        "token={GITHUB_TOKEN}"
    )))]);
    let resp = send(&env, request(&env, "POST", ALLOWED, "/upload", body)).await;
    assert_eq!(resp.status(), 403);
    assert!(!String::from_utf8_lossy(&env.upstream.received()).contains(GITHUB_TOKEN));
    assert!(
        audited(&env, |r| r.decision == Decision::BlockedSecret
            && r.path == "/upload")
        .await,
        "{:?}",
        env.audit()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_in_an_h2_request_trailer_is_blocked() {
    let env = Env::start(Options::default()).await;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-token", GITHUB_TOKEN.parse().unwrap());
    let body = frames(vec![
        Frame::data(Bytes::from_static(b"harmless")),
        Frame::trailers(trailers),
    ]);
    let resp = send(&env, request(&env, "POST", ALLOWED, "/trailer", body)).await;
    assert_eq!(resp.status(), 403);
    assert!(
        env.upstream
            .seen()
            .iter()
            .all(|s| s.trailers.iter().all(|(_, v)| v != GITHUB_TOKEN)),
        "the trailer must not reach the upstream"
    );
    assert!(
        audited(&env, |r| r.decision == Decision::BlockedSecret
            && r.path == "/trailer")
        .await,
        "{:?}",
        env.audit()
    );
}
