//! Bounds: header size, slow clients, malformed input.

use std::time::Duration;

use bottle_core::bundle::BundleLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{ALLOWED, Env, Options};

fn short_limits() -> Options {
    Options {
        limits: BundleLimits {
            header_read_timeout_ms: 300,
            idle_timeout_ms: 2_000,
            max_header_bytes: 4096,
            ..BundleLimits::default()
        },
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431() {
    let env = Env::start(short_limits()).await;
    let big = "a".repeat(8000);
    let resp = env
        .raw(format!("GET http://{ALLOWED}/ HTTP/1.1\r\nHost: {ALLOWED}\r\nX-Big: {big}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 431);
    // Inside an intercepted tunnel too.
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("GET / HTTP/1.1\r\nHost: {ALLOWED}\r\nX-Big: {big}\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 431);
    assert!(env.upstream.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_is_disconnected_after_the_header_timeout() {
    let env = Env::start(short_limits()).await;
    let mut s = TcpStream::connect(env.proxy()).await.unwrap();
    s.write_all(b"GET http://api.allowed.test/ HTTP/1.1\r\nHost: api")
        .await
        .unwrap();
    // Keep trickling bytes; the head never completes.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        loop {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                },
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    if s.write_all(b"a").await.is_err() {
                        return true;
                    }
                }
            }
        }
    })
    .await;
    assert_eq!(
        closed,
        Ok(true),
        "the proxy must close a slowloris connection"
    );
    // A stalled TLS handshake inside CONNECT is bounded the same way.
    let mut tunnel = env
        .connect(&format!("{ALLOWED}:{}", env.upstream.https.port()))
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(10), tunnel.read(&mut buf)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_and_the_proxy_keeps_serving() {
    let env = Env::start(Options::default()).await;
    for junk in [
        &b"\x00\x01\x02garbage\r\n\r\n"[..],
        b"GET http://api.allowed.test/ HTTP/1.1\r\nHost api.allowed.test\r\n\r\n",
        b"GET  HTTP/1.1\r\n\r\n",
        b"CONNECT api.allowed.test HTTP/1.1\r\n\r\n",
        b"CONNECT [::1 HTTP/1.1\r\n\r\n",
        b"GET http://api.allowed.test:99999/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://user@api.allowed.test/ HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n",
        b"GET ftp://api.allowed.test/ HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n",
        // Its chunked body is broken: egress dials the live upstream (an
        // unreachable one would be a 502 before the body is read), and the
        // body's failure is the proxy's 400.
        format!("POST http://api.allowed.test:{port}/ HTTP/1.1\r\nHost: api.allowed.test:{port}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nzz", port = env.upstream.http.port()).as_bytes(),
    ] {
        let resp = env.raw(junk).await;
        assert!(
            (400..500).contains(&resp.status),
            "{:?} -> {} {}",
            String::from_utf8_lossy(junk),
            resp.status,
            resp.text()
        );
    }
    let resp = env
        .raw(b"GET /__bottle/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 200);
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://{ALLOWED}:{port}/after HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways() {
    let env = Env::start(Options::default()).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
    let n = 8 * 1024 * 1024;
    tls.write_all(
        format!("GET /bytes/{n} HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let resp = crate::support::read_response(&mut tls).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body.len(), n);
    let up = vec![b'q'; 4 * 1024 * 1024];
    let mut tls = env.tls(&authority, ALLOWED).await.unwrap();
    tls.write_all(format!("PUT /up HTTP/1.1\r\nHost: {ALLOWED}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", up.len()).as_bytes())
        .await
        .unwrap();
    tls.write_all(&up).await.unwrap();
    // A TLS stream's write_all can return while the last records still sit
    // in rustls's send buffer (the socket was full at the time); only
    // flush pushes them out. Without it the proxy waits for a body tail
    // that was never sent until its idle timeout answers 400 / 504.
    tls.flush().await.unwrap();
    let resp = crate::support::read_response(&mut tls).await;
    assert_eq!(resp.status, 200);
    let seen = env.upstream.seen();
    assert_eq!(seen.last().unwrap().body.len(), up.len());
}

/// `max_connections` counts a tunnel for as long as it lasts, not only
/// until the CONNECT is answered: with one slot, an open tunnel keeps the
/// next connection waiting, and closing the tunnel lets it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_tunnel_keeps_its_connection_slot() {
    let env = Env::start(Options {
        limits: BundleLimits {
            max_connections: 1,
            ..BundleLimits::default()
        },
        ..Options::default()
    })
    .await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let mut tunnel = env.tls(&authority, ALLOWED).await.unwrap();
    tunnel
        .write_all(format!("GET /first HTTP/1.1\r\nHost: {ALLOWED}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let resp = crate::support::read_response(&mut tunnel).await;
    assert_eq!(resp.status, 200, "{}", resp.text());

    let port = env.upstream.http.port();
    let request = format!(
        "GET http://{ALLOWED}:{port}/second HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n"
    );
    let second = env.raw(request.as_bytes());
    tokio::pin!(second);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut second)
            .await
            .is_err(),
        "a second connection was served while the tunnel held the only slot"
    );
    drop(tunnel);
    let resp = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second connection is served once the tunnel closed");
    assert_eq!(resp.status, 200, "{}", resp.text());
}
