//! Secret scanning: blocked before anything leaves, audited.

use std::time::Duration;

use bottle_bundle::Decision;
use tokio::io::AsyncWriteExt;

use crate::support::{ALLOWED, Env, Options, read_response};

const AWS: &str = "AKIAIOSFODNN7EXAMPLE";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_split_across_body_chunks_is_blocked_before_any_of_it_leaves() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
    tls.write_all(
        format!("POST /upload HTTP/1.1\r\nHost: {ALLOWED}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let filler = "z".repeat(5000);
    let (a, b) = AWS.split_at(9);
    let first = format!("{filler} key={a}");
    tls.write_all(format!("{:x}\r\n{first}\r\n", first.len()).as_bytes())
        .await
        .unwrap();
    tls.flush().await.unwrap();
    // The body streams: the filler reaches the upstream while the agent
    // still holds the rest of the key.
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            env.upstream.received().len() >= filler.len() - 100
        })
        .await,
        "the start of the body was not forwarded: {} bytes",
        env.upstream.received().len()
    );
    let second = format!("{b} more");
    // The proxy may already have aborted; a write error here is fine.
    let _ = tls
        .write_all(format!("{:x}\r\n{second}\r\n0\r\n\r\n", second.len()).as_bytes())
        .await;
    let resp = read_response(&mut tls).await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("aws_access_key_id"), "{}", resp.text());
    let received = env.upstream.received();
    let key_starts_at = filler.len() + " key=".len();
    assert!(
        received.len() <= key_starts_at && first.as_bytes().starts_with(&received),
        "the upstream received {} bytes, ending {:?}; the key starts at byte {key_starts_at}",
        received.len(),
        String::from_utf8_lossy(&received[received.len().saturating_sub(20)..])
    );
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            env.audit().iter().any(|r| {
                r.decision == Decision::BlockedSecret && r.reason == "secret:aws_access_key_id"
            })
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_tokens_in_paths_and_header_values_are_blocked_hashes_pass() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let token = "Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz";
    let get = |path: &str, header: &str| {
        format!(
            "GET http://{ALLOWED}:{port}{path} HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n{header}Connection: close\r\n\r\n"
        )
    };
    let blocked = [
        (
            get(&format!("/v1/{token}/x"), ""),
            "secret:high_entropy_path",
        ),
        (
            get("/v1/x", &format!("X-Trace: {token}\r\n")),
            "secret:high_entropy_header",
        ),
    ];
    for (req, reason) in &blocked {
        let resp = env.raw(req.as_bytes()).await;
        assert_eq!(resp.status, 403, "{reason}: {}", resp.text());
        assert!(
            resp.text().contains(reason.trim_start_matches("secret:")),
            "{}",
            resp.text()
        );
    }
    assert!(env.upstream.seen().is_empty(), "{:?}", env.upstream.seen());
    let allowed = [
        "/packages/3b/12/0e6bd0a7cd1b4d1b2e8fbbc6f7b7f0f1e3fa5e6c5d6a3f1e0c2a9b8d7c6e5f4a/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.whl",
        "/repos/o/r/commits/3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a",
        "/uploads/123e4567-e89b-12d3-a456-426614174000",
    ];
    for path in allowed {
        let resp = env
            .raw(
                get(
                    path,
                    "If-None-Match: \"W/Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz\"\r\n",
                )
                .as_bytes(),
            )
            .await;
        assert_eq!(resp.status, 200, "{path}: {}", resp.text());
    }
    assert_eq!(env.upstream.seen().len(), allowed.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_in_headers_and_queries_are_blocked() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let cases = [
        (
            format!(
                "GET http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nX-Token: ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789\r\nConnection: close\r\n\r\n"
            ),
            "secret:github_token",
        ),
        (
            format!(
                "GET http://{ALLOWED}:{port}/?k=sk-ant-api03-abcdefghijklmnopqrstuvwxyz HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n"
            ),
            "secret:anthropic_key",
        ),
        (
            format!(
                "GET http://{ALLOWED}:{port}/?t=Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n"
            ),
            "secret:high_entropy_query",
        ),
        (
            format!(
                "POST http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nContent-Length: 34\r\nConnection: close\r\n\r\n-----BEGIN RSA PRIVATE KEY-----\nab"
            ),
            "secret:private_key",
        ),
    ];
    for (req, reason) in &cases {
        let resp = env.raw(req.as_bytes()).await;
        assert_eq!(resp.status, 403, "{reason}: {}", resp.text());
    }
    assert!(env.upstream.seen().is_empty(), "{:?}", env.upstream.seen());
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            let audit = env.audit();
            cases.iter().all(|(_, reason)| {
                audit
                    .iter()
                    .any(|r| r.decision == Decision::BlockedSecret && r.reason == *reason)
            })
        })
        .await,
        "{:?}",
        env.audit()
    );
    // A clean request on the same bundle still works.
    let resp = env
        .raw(format!("GET http://{ALLOWED}:{port}/?ref=3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_in_an_allowed_subdomain_is_blocked() {
    let opts = Options {
        allow: vec!["*.allowed.test".into()],
        ..Options::default()
    };
    let env = Env::start(opts).await;
    let err = env
        .connect(&format!("{AWS}.allowed.test:443"))
        .await
        .unwrap_err();
    assert_eq!(err.status, 403);
    assert!(err.text().contains("destination name"), "{}", err.text());
    let audit = env.audit();
    assert_eq!(audit.last().unwrap().decision, Decision::BlockedSecret);
}
