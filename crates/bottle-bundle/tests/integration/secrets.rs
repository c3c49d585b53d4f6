//! Secret scanning: blocked before anything leaves, audited.

use std::io::Write;
use std::time::Duration;

use bottle_bundle::Decision;
use tokio::io::AsyncWriteExt;

use crate::support::{ALLOWED, Env, OTHER_ALLOWED, Options, read_response};

const AWS: &str = "AKIAZ7Q3HN2XK5WJ4T6M";

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
    // still holds the rest of the key, all but the scanner's hold-back.
    let window = bottle_bundle::scan::Scanner::new().unwrap().window();
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            env.upstream.received().len() >= first.len() - window
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

/// A body refused at its first bytes opens no upstream connection at all
/// (not even a TCP connect with nothing sent): the upstream of an allowed
/// host learns nothing of a request the bundle refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_at_the_start_of_a_body_opens_no_upstream_connection() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let body = format!("key={AWS}");
    let req = format!(
        "POST http://{ALLOWED}:{port}/up HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let resp = env.raw(req.as_bytes()).await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    // The positive control: the same request without the secret connects.
    let clean = "key=nothing";
    let req = format!(
        "POST http://{ALLOWED}:{port}/up HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{clean}",
        clean.len()
    );
    let resp = env.raw(req.as_bytes()).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        env.upstream.accepted(),
        1,
        "only the clean request may reach the upstream: {:?}",
        env.upstream.seen()
    );
}

/// The same inside an intercepted tunnel: no upstream connection for a
/// refused request; its clean requests share one kept-alive connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_dials_upstream_only_for_clean_requests() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
    let post = |body: &str| {
        format!(
            "POST /up HTTP/1.1\r\nHost: {ALLOWED}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    tls.write_all(post(&format!("key={AWS}")).as_bytes())
        .await
        .unwrap();
    let resp = read_response(&mut tls).await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert_eq!(env.upstream.accepted(), 0, "{:?}", env.upstream.seen());
    // Clean requests on a new tunnel.
    let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
    for i in 0..3 {
        tls.write_all(post(&format!("key=nothing-{i}")).as_bytes())
            .await
            .unwrap();
        let resp = read_response(&mut tls).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    assert_eq!(env.upstream.seen().len(), 3);
    assert_eq!(
        env.upstream.accepted(),
        1,
        "one upstream connection for the tunnel's three requests"
    );
}

/// A gzip stream of `data`.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A brotli stream of uncompressed meta-blocks, one per part: contiguous
/// once decoded, separated by block headers on the wire (so a key split
/// across parts is not in the encoded bytes). Bits are packed from the least
/// significant end; the first header follows WBITS (one 0 bit).
fn brotli_stored(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        assert!(!part.is_empty() && part.len() <= 1 << 16);
        // ISLAST=0, MNIBBLES=4 (00), MLEN-1 (16 bits), ISUNCOMPRESSED=1.
        let header = ((part.len() as u32 - 1) << 3) | (1 << 19);
        let bits = if i == 0 { header << 1 } else { header };
        out.extend_from_slice(&bits.to_le_bytes()[..3]);
        out.extend_from_slice(part);
    }
    // ISLAST=1, ISLASTEMPTY=1.
    out.push(0b11);
    out
}

/// A plain-HTTP POST through the proxy with the given body and headers.
fn post(port: u16, path: &str, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST http://{ALLOWED}:{port}{path} HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_bodies_are_scanned_decoded_and_bounded() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let text = format!(
        "{} key={AWS} {}",
        "lorem ipsum ".repeat(500),
        "dolor ".repeat(500)
    );
    let split = text.find(AWS).unwrap() + 8;
    let hidden_gzip = gzip(text.as_bytes());
    let hidden_br = brotli_stored(&[&text.as_bytes()[..split], &text.as_bytes()[split..]]);
    for encoded in [&hidden_gzip, &hidden_br] {
        assert!(
            !String::from_utf8_lossy(encoded).contains(AWS),
            "the key is hidden"
        );
    }
    // 64 gzip members of 1 MiB of zeros each: ~64 KiB on the wire.
    let bomb = gzip(&vec![0; 1 << 20]).repeat(64);
    let cases = [
        ("gzip", hidden_gzip, 403, "secret:aws_access_key_id"),
        ("br", hidden_br, 403, "secret:aws_access_key_id"),
        ("gzip", bomb, 413, "body_too_large_to_scan"),
        (
            "gzip",
            b"this is not gzip".to_vec(),
            400,
            "undecodable_body",
        ),
        (
            "zstd",
            b"anything".to_vec(),
            415,
            "unsupported_content_encoding",
        ),
    ];
    for (coding, body, status, reason) in &cases {
        let req = post(
            port,
            "/up",
            &format!("Content-Encoding: {coding}\r\n"),
            body,
        );
        let resp = env.raw(&req).await;
        assert_eq!(resp.status, *status, "{reason}: {}", resp.text());
    }
    assert!(
        env.upstream.received().is_empty() && env.upstream.seen().is_empty(),
        "nothing reached the upstream: {:?}",
        env.upstream.seen()
    );
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            let audit = env.audit();
            cases
                .iter()
                .all(|(_, _, _, reason)| audit.iter().any(|r| r.reason == *reason))
        })
        .await,
        "{:?}",
        env.audit()
    );
    // A clean encoded body goes through as the agent sent it.
    let clean = gzip("nothing to see here ".repeat(1000).as_bytes());
    let resp = env
        .raw(&post(port, "/up", "Content-Encoding: gzip\r\n", &clean))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, clean);
    assert_eq!(seen[0].header("content-encoding"), vec!["gzip".to_string()]);
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
                "POST http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nContent-Length: 97\r\nConnection: close\r\n\r\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"
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
    let host = format!("{AWS}.allowed.test");
    let resp = env
        .https(
            &format!("{host}:443"),
            format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 403);
    assert!(resp.text().contains("destination name"), "{}", resp.text());
    assert!(env.upstream.seen().is_empty());
    let audit = env.audit();
    let decisions: Vec<_> = audit
        .iter()
        .map(|r| (r.method.as_str(), r.decision))
        .collect();
    assert_eq!(
        decisions,
        [
            ("CONNECT", Decision::BlockedSecret),
            ("GET", Decision::BlockedSecret)
        ]
    );
}

/// AWS's documented example key: no secret.
const AWS_EXAMPLE: &str = "AKIAIOSFODNN7EXAMPLE";

/// A bundle where `ALLOWED` redacts and `OTHER_ALLOWED` blocks.
async fn redacting_env() -> Env {
    Env::start(Options {
        redact: vec![ALLOWED.into()],
        ..Options::default()
    })
    .await
}

/// A model API call whose history carries a secret, on a host that
/// redacts: it goes on with the secret masked in place (same length), in
/// the body, a header and the query, and the audit line says `redacted`
/// with the kinds; a documented example key is masked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacting_host_gets_the_request_with_every_secret_masked() {
    let env = redacting_env().await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let github = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"the tool printed {AWS_EXAMPLE} and {AWS}"}}]}}"#
    );
    let request = format!(
        "POST /v1/messages?k={AWS} HTTP/1.1\r\nHost: {ALLOWED}\r\nX-Debug: {github}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let resp = env.https(&authority, request.as_bytes()).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let seen = &seen[0];
    let masked = |len: usize| format!("REDACTED{}", "*".repeat(len - 8));
    let expected = body
        .replace(AWS_EXAMPLE, &masked(20))
        .replace(AWS, &masked(20));
    assert_eq!(String::from_utf8_lossy(&seen.body), expected);
    assert_eq!(seen.path, format!("/v1/messages?k={}", masked(20)));
    assert_eq!(seen.header("x-debug"), [masked(github.len())]);
    let received = String::from_utf8_lossy(&env.upstream.received()).into_owned();
    for secret in [AWS, AWS_EXAMPLE, github] {
        assert!(!received.contains(secret), "{secret} reached the upstream");
    }
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            env.audit().iter().any(|r| {
                r.decision == Decision::Redacted
                    && r.reason == "secret:aws_access_key_id,github_token"
                    && r.path == "/v1/messages?k=…"
            })
        })
        .await,
        "{:?}",
        env.audit()
    );
}

/// On a redacting host a secret split across chunks is masked whole, and
/// no byte of it reaches the upstream, wherever the split falls; gzip
/// bodies go on decoded and masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redaction_lets_no_byte_of_a_split_or_encoded_secret_through() {
    let env = redacting_env().await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let key = format!("sk-ant-api03-{}", "Zq7".repeat(30));
    let filler = "z".repeat(3000);
    let text = format!("{filler} history: {key} end");
    let at = text.find(&key).unwrap();
    for split in [at - 1, at + 3, at + 20, at + key.len() - 1] {
        let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
        tls.write_all(
            format!("POST /up HTTP/1.1\r\nHost: {ALLOWED}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        for part in [&text[..split], &text[split..]] {
            tls.write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes())
                .await
                .unwrap();
            tls.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tls.write_all(b"0\r\n\r\n").await.unwrap();
        let resp = read_response(&mut tls).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let encoded = gzip(text.as_bytes());
    let resp = env
        .https(
            &authority,
            &[
                format!(
                    "POST /gz HTTP/1.1\r\nHost: {ALLOWED}\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    encoded.len()
                )
                .into_bytes(),
                encoded,
            ]
            .concat(),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 5, "{seen:?}");
    let expected = format!(
        "{filler} history: REDACTED{} end",
        "*".repeat(key.len() - 8)
    );
    for request in &seen {
        assert_eq!(
            String::from_utf8_lossy(&request.body),
            expected,
            "{}",
            request.path
        );
    }
    assert!(
        seen[4].header("content-encoding").is_empty(),
        "sent decoded"
    );
    // The longest run of the key's characters on the wire: its prefix
    // `sk-` is the most a split may show before the scanner knows.
    let received = String::from_utf8_lossy(&env.upstream.received()).into_owned();
    assert!(!received.contains("sk-ant"), "part of the key leaked");
    assert!(!received.contains("Zq7"), "part of the key leaked");
}

/// A documented example key is no secret where the host blocks: the
/// request goes through unchanged; a real-shaped one is refused as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_host_refuses_real_keys_and_lets_documented_examples_pass() {
    let env = redacting_env().await;
    let port = env.upstream.http.port();
    let send = |key: &str| {
        let body = format!("aws_access_key_id={key}");
        format!(
            "POST http://{OTHER_ALLOWED}:{port}/up HTTP/1.1\r\nHost: {OTHER_ALLOWED}:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let resp = env.raw(send(AWS_EXAMPLE).as_bytes()).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        String::from_utf8_lossy(&env.upstream.seen()[0].body),
        format!("aws_access_key_id={AWS_EXAMPLE}")
    );
    let resp = env.raw(send(AWS).as_bytes()).await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("aws_access_key_id"), "{}", resp.text());
    assert_eq!(env.upstream.seen().len(), 1);
}
