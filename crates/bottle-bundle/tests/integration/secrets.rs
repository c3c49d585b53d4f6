//! Secret scanning: blocked before anything leaves, audited.

use std::time::Duration;

use bottle_bundle::Decision;
use tokio::io::AsyncWriteExt;

use crate::support::{ALLOWED, Env, Options, read_response};

const AWS: &str = "AKIAIOSFODNN7EXAMPLE";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_split_across_body_chunks_is_blocked_and_audited() {
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
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = format!("{b} more");
    // The proxy may already have aborted; a write error here is fine.
    let _ = tls
        .write_all(format!("{:x}\r\n{second}\r\n0\r\n\r\n", second.len()).as_bytes())
        .await;
    let resp = read_response(&mut tls).await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("aws_access_key_id"), "{}", resp.text());
    assert!(
        env.upstream
            .seen()
            .iter()
            .all(|s| !String::from_utf8_lossy(&s.body).contains(AWS)),
        "the secret never reached the upstream"
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
