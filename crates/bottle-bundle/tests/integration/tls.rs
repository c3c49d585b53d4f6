//! TLS interception: the agent trusts the bottle CA; SNI, CONNECT and Host
//! must agree.

use bottle_bundle::Decision;
use tokio::io::AsyncWriteExt;

use crate::support::{ALLOWED, Env, OTHER_ALLOWED, Options, read_response, tls_client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_host_over_https_is_intercepted_and_forwarded() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("POST /v1/things HTTP/1.1\r\nHost: {ALLOWED}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.text().starts_with("POST /v1/things\n"));
    assert!(resp.text().ends_with("hello"));
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, b"hello");
    let audit = env.audit();
    let req = audit.iter().find(|r| r.method == "POST").unwrap();
    assert_eq!(req.decision, Decision::Allow);
    assert_eq!(req.bytes_up, 5);
    assert!(
        audit
            .iter()
            .any(|r| r.method == "CONNECT" && r.reason == "tunnel")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_requests_share_one_tunnel() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
    for i in 0..3 {
        tls.write_all(format!("GET /n/{i} HTTP/1.1\r\nHost: {ALLOWED}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let resp = read_response(&mut tls).await;
        assert_eq!(resp.status, 200);
        assert!(resp.text().starts_with(&format!("GET /n/{i}\n")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_that_differs_from_connect_is_refused() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let s = env.connect(&authority).await.unwrap();
    let res = tls_client(&env.ca_pem, s, OTHER_ALLOWED).await;
    assert!(res.is_err(), "handshake with a fronted SNI must fail");
    assert!(env.upstream.seen().is_empty());
    assert!(
        bottle_test_support::eventually_async(std::time::Duration::from_secs(5), || {
            env.audit()
                .iter()
                .any(|r| r.reason == "sni_mismatch" && r.decision == Decision::Deny)
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_header_that_differs_from_connect_is_refused() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("GET / HTTP/1.1\r\nHost: {OTHER_ALLOWED}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 421, "{}", resp.text());
    assert!(resp.text().contains("domain fronting"));
    // Case and port do not matter; the name does.
    let resp = env
        .https(
            &authority,
            b"GET / HTTP/1.1\r\nHost: API.ALLOWED.TEST:443\r\nConnection: close\r\n\r\n",
        )
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(env.upstream.seen().len(), 1);
    assert!(env.audit().iter().any(|r| r.reason == "host_mismatch"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_inside_a_tunnel_is_forwarded_as_http() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let mut s = env.connect(&format!("{ALLOWED}:{port}")).await.unwrap();
    s.write_all(
        format!("GET /plain HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let resp = read_response(&mut s).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.text().starts_with("GET /plain\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_with_an_untrusted_certificate_is_an_error() {
    // The upstream's cert is for api.allowed.test; reaching it as
    // other.allowed.test must fail verification at egress.
    let env = Env::start(Options::default()).await;
    let authority = format!("{OTHER_ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("GET / HTTP/1.1\r\nHost: {OTHER_ALLOWED}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    let audit = env.audit();
    let line = audit.iter().find(|r| r.method == "GET").unwrap();
    assert_eq!(line.decision, Decision::Error);
    assert_eq!(line.reason, "tls_name_mismatch");
    assert!(resp.text().contains("not valid for"), "{}", resp.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_signed_by_an_unknown_ca_names_the_issuer_and_the_fix() {
    // A TLS-inspecting network: the upstream's chain ends at a CA the
    // bundle was not given.
    let env = Env::start_configured(Options::default(), |config| {
        config.upstream_roots.clear();
    })
    .await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("GET / HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    let body = resp.text();
    assert!(
        body.contains(&format!("TLS to {ALLOWED} failed"))
            && body.contains("unknown CA (UnknownIssuer)")
            && body.contains("egress.upstream_ca")
            && body.contains("egress.upstream_trust = \"system\""),
        "{body}"
    );
    let audit = env.audit();
    let line = audit.iter().find(|r| r.method == "GET").unwrap();
    assert_eq!(line.decision, Decision::Error);
    assert_eq!(line.reason, "tls_unknown_issuer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_ca_alone_without_web_roots_is_trusted() {
    let env = Env::start_configured(Options::default(), |config| {
        config.upstream_web_roots = false;
    })
    .await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("GET /ok HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
}
