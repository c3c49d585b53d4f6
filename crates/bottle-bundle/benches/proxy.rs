//! Bundle proxy benchmark: through the bundle vs direct vs Debian's
//! tinyproxy, all on loopback, in one run.
//!
//! `cargo bench -p bottle-bundle --bench proxy` (add `-- --quick` for a
//! smaller run; set `BOTTLE_BUNDLE_BIN` to measure another build of the
//! binary, e.g. the static one, and `BOTTLE_BUNDLE_BASELINE_BIN` to measure
//! a second one, e.g. main's, in the same rounds; `-- --latency-only` runs
//! the latency rows alone). Prints a Markdown report; `docs/PERF.md` ("Bundle proxy")
//! records the figures. Every loop is bounded in count and in time.
//!
//! Paths measured:
//! - direct: client → upstream (TLS to the upstream's own CA).
//! - tinyproxy: client → `CONNECT` tunnel → upstream (TLS end to end; the
//!   proxy only copies bytes).
//! - bundle: client → `CONNECT` → TLS terminated by the bundle with the
//!   bottle CA → scanning → egress (in-process) → new TLS to the upstream.
//!   There is no pass-through mode: every allowed tunnel is intercepted.
//!
//! Every leg speaks HTTP/1.1 (the upstream offers no ALPN), except the
//! HTTP/2 row: there the client offers `h2` and a second upstream listener
//! answers HTTP/2 only, so each path is HTTP/2 end to end.
//!
//! The bulk rows also give the CPU seconds per GB moved of the proxy's
//! process (the bundle, tinyproxy) and of this process (the client and the
//! upstream), from `/proc/<pid>/stat`: on a machine with few cores the
//! three share them, which bounds what any proxy can reach.

#![expect(clippy::print_stdout, reason = "a benchmark prints its table")]
#![expect(
    clippy::unwrap_used,
    reason = "a benchmark harness: any failure must abort the run loudly"
)]

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bottle_bundle::allowlist::Host;
use bottle_bundle::ca::LeafMinter;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "api.allowed.test";

/// A body of `remaining` bytes served from one shared 64 KiB buffer.
struct Repeat {
    remaining: u64,
    chunk: Bytes,
}

impl Body for Repeat {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = this.remaining.min(this.chunk.len() as u64) as usize;
        this.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(this.chunk.slice(..n)))))
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// Text-like filler (lowercase words), so scanning sees realistic bytes.
fn filler(len: usize) -> Bytes {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let c = (x % 27) as u8;
        out.push(if c == 26 { b' ' } else { b'a' + c });
    }
    Bytes::from(out)
}

async fn upstream_handler(
    req: Request<Incoming>,
    chunk: Bytes,
) -> Result<Response<http_body_util::Either<Repeat, http_body_util::Empty<Bytes>>>, hyper::Error> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_string();
    // Drain uploads without keeping them.
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        frame?;
    }
    let n: u64 = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Ok(Response::new(http_body_util::Either::Left(Repeat {
        remaining: n,
        chunk,
    })))
}

async fn serve_upstream<I>(io: I, chunk: Bytes)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| upstream_handler(req, chunk.clone()));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

struct Upstream {
    http: SocketAddr,
    https: SocketAddr,
    /// HTTPS with ALPN `h2`, answering HTTP/2 only.
    https_h2: SocketAddr,
    root_pem: String,
}

async fn serve_upstream_h2<I>(io: I, chunk: Bytes)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| upstream_handler(req, chunk.clone()));
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .initial_stream_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// The HTTP/2 flow-control windows of the bench's own HTTP/2 ends, the
/// size the bundle uses, so no leg is held to the 64 KiB default.
const H2_WINDOW: u32 = 8 * 1024 * 1024;

async fn start_upstream(dir: &Path) -> Upstream {
    let ca = bottle_bundle::generate_ca("bench-upstream").unwrap();
    std::fs::write(dir.join("upstream-root.pem"), &ca.cert_pem).unwrap();
    let minter = LeafMinter::new(&ca.cert_pem, &ca.key_pem).unwrap();
    let mut cfg = (*minter.server_config(&Host::Name(HOST.into())).unwrap()).clone();
    let mut cfg_h2 = cfg.clone();
    cfg.alpn_protocols.clear();
    cfg_h2.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let acceptor_h2 = tokio_rustls::TlsAcceptor::from(Arc::new(cfg_h2));
    let chunk = filler(64 * 1024);
    let http_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let https_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let https_h2_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = Upstream {
        http: http_l.local_addr().unwrap(),
        https: https_l.local_addr().unwrap(),
        https_h2: https_h2_l.local_addr().unwrap(),
        root_pem: ca.cert_pem,
    };
    let c2 = chunk.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = https_h2_l.accept().await {
            let _ = s.set_nodelay(true);
            let acceptor = acceptor_h2.clone();
            let chunk = c2.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    serve_upstream_h2(tls, chunk).await;
                }
            });
        }
    });
    let c1 = chunk.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = http_l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(serve_upstream(s, c1.clone()));
        }
    });
    tokio::spawn(async move {
        while let Ok((s, _)) = https_l.accept().await {
            let _ = s.set_nodelay(true);
            let acceptor = acceptor.clone();
            let chunk = chunk.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    serve_upstream(tls, chunk).await;
                }
            });
        }
    });
    up
}

fn tls_connector(root_pem: &str, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(root_pem.as_bytes()).unwrap())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut cfg = cfg;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Direct,
    Tinyproxy(SocketAddr),
    Bundle(SocketAddr),
    /// A second bundle binary (`BOTTLE_BUNDLE_BASELINE_BIN`), e.g. main's,
    /// measured in the same rounds as `Bundle`.
    Baseline(SocketAddr),
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Tinyproxy(_) => "tinyproxy",
            Via::Bundle(_) => "bundle",
            Via::Baseline(_) => "bundle (baseline)",
        }
    }
}

struct Ctx {
    up: Upstream,
    upstream_tls: tokio_rustls::TlsConnector,
    bottle_tls: tokio_rustls::TlsConnector,
    /// The same trust, offering ALPN `h2`.
    upstream_tls_h2: tokio_rustls::TlsConnector,
    bottle_tls_h2: tokio_rustls::TlsConnector,
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn connect_tunnel(proxy: SocketAddr, authority: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await? == 0 {
            return Err(std::io::Error::other("proxy closed during CONNECT"));
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        return Err(std::io::Error::other(format!(
            "CONNECT refused: {}",
            String::from_utf8_lossy(&head)
        )));
    }
    Ok(s)
}

async fn open_https(ctx: &Ctx, via: Via) -> std::io::Result<Tls> {
    open_tls(ctx, via, false).await
}

/// A TLS connection to the upstream through `via`; `h2`: to the HTTP/2
/// listener, offering ALPN `h2`.
async fn open_tls(ctx: &Ctx, via: Via, h2: bool) -> std::io::Result<Tls> {
    let (addr, upstream_tls, bottle_tls) = if h2 {
        (ctx.up.https_h2, &ctx.upstream_tls_h2, &ctx.bottle_tls_h2)
    } else {
        (ctx.up.https, &ctx.upstream_tls, &ctx.bottle_tls)
    };
    let port = addr.port();
    let (tcp, connector) = match via {
        Via::Direct => {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            (s, upstream_tls)
        }
        Via::Tinyproxy(p) => (
            connect_tunnel(p, &format!("127.0.0.1:{port}")).await?,
            upstream_tls,
        ),
        Via::Bundle(p) | Via::Baseline(p) => (
            connect_tunnel(p, &format!("{HOST}:{port}")).await?,
            bottle_tls,
        ),
    };
    let name = ServerName::try_from(HOST.to_string()).map_err(std::io::Error::other)?;
    connector.connect(name, tcp).await
}

async fn open_http(ctx: &Ctx, via: Via) -> std::io::Result<(TcpStream, String)> {
    let port = ctx.up.http.port();
    let (addr, prefix) = match via {
        Via::Direct => (ctx.up.http, String::new()),
        Via::Tinyproxy(p) => (p, format!("http://127.0.0.1:{port}")),
        Via::Bundle(p) | Via::Baseline(p) => (p, format!("http://{HOST}:{port}")),
    };
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok((s, prefix))
}

/// Sends one request and reads the response body (content-length framed),
/// keeping the connection usable. Returns body bytes read.
async fn request<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    head: &str,
    upload: Option<(&Bytes, u64)>,
    buf: &mut Vec<u8>,
) -> std::io::Result<u64> {
    s.write_all(head.as_bytes()).await?;
    if let Some((chunk, total)) = upload {
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
    }
    s.flush().await?;
    let mut filled = 0;
    let header_end = loop {
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = s.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed before the response head"));
        }
        filled += n;
        if let Some(p) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head_text = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
    if !head_text.starts_with("http/1.1 200") {
        return Err(std::io::Error::other(format!(
            "bad response: {}",
            head_text.lines().next().unwrap_or("")
        )));
    }
    let len: u64 = head_text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no content-length"))?;
    let mut got = (filled - header_end) as u64;
    while got < len {
        let n = s.read(&mut buf[..]).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed mid-body"));
        }
        got += n as u64;
    }
    Ok(len)
}

fn get_head(prefix: &str, path: &str) -> String {
    format!("GET {prefix}{path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n")
}

/// Bulk download: `reps` downloads of `size` bytes on one connection.
async fn bulk_download(ctx: &Ctx, via: Via, tls: bool, size: u64, reps: u32) -> f64 {
    let mut buf = vec![0u8; 256 * 1024];
    let start = Instant::now();
    let mut total = 0u64;
    if tls {
        let mut s = open_https(ctx, via).await.unwrap();
        for _ in 0..reps {
            total += request(
                &mut s,
                &get_head("", &format!("/bytes/{size}")),
                None,
                &mut buf,
            )
            .await
            .unwrap();
        }
    } else {
        // tinyproxy closes client connections after each response: one
        // connection per download for every path, to compare like with like.
        for _ in 0..reps {
            let (mut s, prefix) = open_http(ctx, via).await.unwrap();
            total += request(
                &mut s,
                &get_head(&prefix, &format!("/bytes/{size}")),
                None,
                &mut buf,
            )
            .await
            .unwrap();
        }
    }
    total as f64 / start.elapsed().as_secs_f64() / 1e6
}

/// Bulk download over HTTP/2: `reps` downloads of `size` bytes, one stream
/// at a time on one connection.
async fn bulk_download_h2(ctx: &Ctx, via: Via, size: u64, reps: u32) -> f64 {
    use http_body_util::BodyExt;
    let tls = open_tls(ctx, via, true).await.unwrap();
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "{} did not settle HTTP/2",
        via.name()
    );
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(H2_WINDOW)
            .initial_connection_window_size(H2_WINDOW)
            .handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tls))
            .await
            .unwrap();
    let driver = tokio::spawn(conn);
    let start = Instant::now();
    let mut total = 0u64;
    for _ in 0..reps {
        let req = Request::get(format!("https://{HOST}/bytes/{size}"))
            .body(http_body_util::Empty::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                total += data.len() as u64;
            }
        }
    }
    let mbps = total as f64 / start.elapsed().as_secs_f64() / 1e6;
    drop(send);
    driver.abort();
    mbps
}

/// Bulk upload over TLS (the bundle scans every byte for secrets).
async fn bulk_upload(ctx: &Ctx, via: Via, size: u64, reps: u32) -> f64 {
    let chunk = filler(256 * 1024);
    let mut buf = vec![0u8; 64 * 1024];
    let mut s = open_https(ctx, via).await.unwrap();
    let start = Instant::now();
    for _ in 0..reps {
        let head = format!("PUT /up HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {size}\r\n\r\n");
        request(&mut s, &head, Some((&chunk, size)), &mut buf)
            .await
            .unwrap();
    }
    (size * u64::from(reps)) as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// One small HTTPS request through `via`, timed in ms: on `conn` when
/// given (kept alive), else on a fresh connection (CONNECT + TLS handshake).
async fn timed_request(ctx: &Ctx, via: Via, conn: Option<&mut Tls>, buf: &mut Vec<u8>) -> f64 {
    let head = get_head("", "/bytes/100");
    let t = Instant::now();
    match conn {
        Some(s) => request(s, &head, None, buf).await.unwrap(),
        None => {
            let mut s = open_https(ctx, via).await.unwrap();
            request(&mut s, &head, None, buf).await.unwrap()
        }
    };
    t.elapsed().as_secs_f64() * 1e3
}

/// p50 and p99 of `samples` (sorted in place).
fn p50_p99(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(samples, 0.5), percentile(samples, 0.99))
}

/// Small HTTPS requests, sequential, through every path of `vias` in
/// rounds: one request per path per round, in a new random order each round,
/// so every path is measured under the same conditions (the machine's load
/// moves the direct figure by more than the goal between passes). Returns,
/// per path, its own samples and its per-round difference to the first path
/// (direct); `fresh`: a new connection per request, else one kept-alive
/// connection per path.
async fn latency_rounds(
    ctx: &Ctx,
    vias: &[Via],
    fresh: bool,
    rounds: usize,
    limit: Duration,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = Instant::now() + limit;
    let mut conns: Vec<Option<Tls>> = Vec::with_capacity(vias.len());
    for via in vias {
        conns.push(if fresh {
            None
        } else {
            Some(open_https(ctx, *via).await.unwrap())
        });
    }
    // Warm-up: pools, the leaf cache, the upstream connection.
    for (via, conn) in vias.iter().zip(conns.iter_mut()) {
        for _ in 0..20 {
            timed_request(ctx, *via, conn.as_mut(), &mut buf).await;
        }
    }
    let mut out = vec![(Vec::with_capacity(rounds), Vec::with_capacity(rounds)); vias.len()];
    let mut this_round = vec![0.0; vias.len()];
    let mut order: Vec<usize> = (0..vias.len()).collect();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..rounds {
        if Instant::now() > deadline {
            break;
        }
        // A fresh order each round (Fisher-Yates on xorshift): a path that
        // always followed the same other path would inherit its wake-ups.
        for k in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(k, (seed % (k as u64 + 1)) as usize);
        }
        for &i in &order {
            this_round[i] = timed_request(ctx, vias[i], conns[i].as_mut(), &mut buf).await;
        }
        for (i, ms) in this_round.iter().enumerate() {
            out[i].0.push(*ms);
            out[i].1.push(ms - this_round[0]);
        }
    }
    out
}

/// Opens `n` HTTPS sessions through `via`, each completing one request,
/// and holds them all open together. Returns (held, seconds to open).
async fn hold_many(ctx: Arc<Ctx>, via: Via, n: usize, limit: Duration) -> (usize, f64, Vec<Tls>) {
    let start = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let ctx = ctx.clone();
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.ok()?;
            let mut buf = vec![0u8; 4096];
            let mut s = tokio::time::timeout(Duration::from_secs(30), open_https(&ctx, via))
                .await
                .ok()?
                .ok()?;
            request(&mut s, &get_head("", "/bytes/10"), None, &mut buf)
                .await
                .ok()?;
            Some(s)
        }));
    }
    let mut held = Vec::with_capacity(n);
    for t in tasks {
        let remaining = limit.saturating_sub(start.elapsed());
        if let Ok(Ok(Some(s))) = tokio::time::timeout(remaining, t).await {
            held.push(s);
        }
    }
    (held.len(), start.elapsed().as_secs_f64(), held)
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU seconds (user + system) `pid` has used so far; `None`: the self
/// process. `/proc/<pid>/stat` counts in USER_HZ, 100 per second on Linux.
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_string(),
        |p| format!("/proc/{p}/stat"),
    );
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // The command name (field 2) may hold spaces; fields after its `)`
    // start at field 3, so utime (14) and stime (15) are at 11 and 12.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Runs `work` (which returns MB/s after moving `bytes`) and returns its
/// result with the CPU seconds per GB of the proxy's process `proxy_pid`
/// (none for the direct path) and of this process.
async fn with_cpu<F: std::future::Future<Output = f64>>(
    proxy_pid: Option<u32>,
    bytes: u64,
    work: F,
) -> (f64, Option<f64>, f64) {
    let proxy_before = proxy_pid.map(|p| cpu_seconds(Some(p)));
    let own_before = cpu_seconds(None);
    let mbps = work.await;
    let gb = bytes as f64 / 1e9;
    let proxy = proxy_pid
        .zip(proxy_before)
        .map(|(p, before)| (cpu_seconds(Some(p)) - before) / gb);
    let own = (cpu_seconds(None) - own_before) / gb;
    (mbps, proxy, own)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[expect(
    clippy::disallowed_methods,
    reason = "the benchmark runs the bundle binary and tinyproxy as daemons and must hold their handles"
)]
fn spawn(program: &str, args: &[&str]) -> std::io::Result<Child> {
    std::process::Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_listening(addr: SocketAddr) -> bool {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// Starts the bundle binary `bin` as `name`, with the bottle CA in `dir`
/// (`ca.pem`, `ca.key`) and its own config and audit log.
fn start_bundle(dir: &Path, up: &Upstream, name: &str, bin: &str) -> (Killed, SocketAddr) {
    let proxy: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = serde_json::json!({
        "version": 1,
        "bottle": "bench",
        "proxy_listen": proxy.to_string(),
        "allow": [HOST],
        "ports": [up.http.port(), up.https.port(), up.https_h2.port()],
        "credentials": [],
        "ca_cert": dir.join("ca.pem"),
        "ca_key": dir.join("ca.key"),
        "audit_log": dir.join(format!("{name}-audit.jsonl")),
        "resolve": { HOST: "127.0.0.1" },
        "upstream_roots": [dir.join("upstream-root.pem")],
    });
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    println!("{name} binary: {bin}\n");
    let child = spawn(bin, &["run", "--config", path.to_str().unwrap()]).unwrap();
    (Killed(child), proxy)
}

fn start_tinyproxy(dir: &Path, up: &Upstream) -> Option<(Killed, SocketAddr)> {
    let bin = "/usr/bin/tinyproxy";
    if !Path::new(bin).exists() {
        println!("(tinyproxy not installed at {bin}: its rows are skipped)");
        return None;
    }
    let port = free_port();
    let conf = format!(
        "Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 2000\nAllow 127.0.0.1\n\
         ConnectPort {}\nConnectPort {}\nDisableViaHeader Yes\nLogLevel Critical\nLogFile \"{}\"\n",
        up.https.port(),
        up.https_h2.port(),
        dir.join("tinyproxy.log").display()
    );
    let conf_path = dir.join("tinyproxy.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = spawn(bin, &["-d", "-c", conf_path.to_str().unwrap()]).ok()?;
    Some((Killed(child), format!("127.0.0.1:{port}").parse().unwrap()))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // binary too, without it, and must not start a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "proxy benchmark: skipped (run it with `cargo bench -p bottle-bundle --bench proxy`)"
        );
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // `--latency-only`: the latency rows alone, for iterating on them.
    let latency_only = std::env::args().any(|a| a == "--latency-only");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(quick, latency_only));
}

async fn run(quick: bool, latency_only: bool) {
    let total_limit = Instant::now() + Duration::from_secs(600);
    let dir = tempfile::tempdir().unwrap();
    let up = start_upstream(dir.path()).await;
    let ca = bottle_bundle::generate_ca("bench").unwrap();
    std::fs::write(dir.path().join("ca.pem"), &ca.cert_pem).unwrap();
    std::fs::write(dir.path().join("ca.key"), &ca.key_pem).unwrap();
    let bottle_ca = ca.cert_pem;
    // BOTTLE_BUNDLE_BIN measures another build, e.g. the static release one.
    let bin = std::env::var("BOTTLE_BUNDLE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_bottle-bundle").to_string());
    let (bundle, bundle_addr) = start_bundle(dir.path(), &up, "bundle", &bin);
    let baseline = std::env::var("BOTTLE_BUNDLE_BASELINE_BIN")
        .ok()
        .map(|bin| start_bundle(dir.path(), &up, "baseline", &bin));
    let tiny = start_tinyproxy(dir.path(), &up);
    assert!(
        wait_listening(bundle_addr).await,
        "the bundle did not start"
    );
    if let Some((_, addr)) = &tiny {
        assert!(wait_listening(*addr).await, "tinyproxy did not start");
    }
    if let Some((_, addr)) = &baseline {
        assert!(
            wait_listening(*addr).await,
            "the baseline bundle did not start"
        );
    }
    let ctx = Arc::new(Ctx {
        upstream_tls: tls_connector(&up.root_pem, &[]),
        bottle_tls: tls_connector(&bottle_ca, &[]),
        upstream_tls_h2: tls_connector(&up.root_pem, &[b"h2"]),
        bottle_tls_h2: tls_connector(&bottle_ca, &[b"h2"]),
        up,
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bundle_pid = bundle.0.id();
    let tiny_pid = tiny.as_ref().map(|(c, _)| c.0.id());
    let baseline_pid = baseline.as_ref().map(|(c, _)| c.0.id());
    let (idle_rss, _) = rss_kib(bundle_pid);
    let tiny_idle = tiny_pid.map(|p| rss_kib(p).0);

    let mut vias = vec![Via::Direct, Via::Bundle(bundle_addr)];
    if let Some((_, addr)) = &tiny {
        vias.insert(1, Via::Tinyproxy(*addr));
    }
    if let Some((_, addr)) = &baseline {
        vias.push(Via::Baseline(*addr));
    }
    let (size, reps) = if quick {
        (16u64 << 20, 2)
    } else {
        (64u64 << 20, 4)
    };

    println!("## Bundle proxy benchmark\n");
    println!(
        "bulk: {reps} x {} MiB per path, one connection; latency: small (100 B) GETs\n",
        size >> 20
    );
    println!(
        "bulk rows: CPU s/GB is the proxy's process (bundle, tinyproxy) and this process (client and upstream)\n"
    );
    println!(
        "| workload | path | result | vs direct | proxy CPU s/GB | client+upstream CPU s/GB |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let proxy_pid = |via: Via| match via {
        Via::Bundle(_) => Some(bundle_pid),
        Via::Baseline(_) => baseline_pid,
        Via::Tinyproxy(_) => tiny_pid,
        Via::Direct => None,
    };
    let row = |label: &str, via: Via, (mbps, proxy, own): (f64, Option<f64>, f64), direct: f64| {
        println!(
            "| {label} | {} | {mbps:.0} | {:.2} | {} | {own:.2} |",
            via.name(),
            mbps / direct,
            proxy.map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
        );
    };
    if !latency_only {
        for (label, tls) in [
            ("bulk download, HTTPS (MB/s)", true),
            ("bulk download, plain HTTP (MB/s)", false),
        ] {
            let mut direct = f64::NAN;
            for via in &vias {
                if Instant::now() > total_limit {
                    break;
                }
                // Warm-up (pools, leaf cache), then the measured run.
                let _ = bulk_download(&ctx, *via, tls, 1 << 20, 1).await;
                let measured = with_cpu(
                    proxy_pid(*via),
                    size * u64::from(reps),
                    bulk_download(&ctx, *via, tls, size, reps),
                )
                .await;
                if *via == Via::Direct {
                    direct = measured.0;
                }
                row(label, *via, measured, direct);
            }
        }
        {
            let label = "bulk download, HTTPS, HTTP/2 (MB/s)";
            let mut direct = f64::NAN;
            for via in &vias {
                if Instant::now() > total_limit {
                    break;
                }
                let _ = bulk_download_h2(&ctx, *via, 1 << 20, 1).await;
                let measured = with_cpu(
                    proxy_pid(*via),
                    size * u64::from(reps),
                    bulk_download_h2(&ctx, *via, size, reps),
                )
                .await;
                if *via == Via::Direct {
                    direct = measured.0;
                }
                row(label, *via, measured, direct);
            }
        }
        {
            let label = "bulk upload, HTTPS (MB/s)";
            let mut direct = f64::NAN;
            for via in &vias {
                if Instant::now() > total_limit {
                    break;
                }
                let _ = bulk_upload(&ctx, *via, 1 << 20, 1).await;
                let measured = with_cpu(
                    proxy_pid(*via),
                    size / 2 * u64::from(reps),
                    bulk_upload(&ctx, *via, size / 2, reps),
                )
                .await;
                if *via == Via::Direct {
                    direct = measured.0;
                }
                row(label, *via, measured, direct);
            }
        }
    }
    println!();
    println!("| workload | path | result | vs direct |");
    println!("| --- | --- | --- | --- |");
    let (n_keep, n_fresh) = if quick { (300, 60) } else { (2000, 300) };
    println!(
        "latency rows: paths interleaved in rounds (one request each per round); \
         \"vs direct\" is the p50 / p99 of (path − direct) in the same round\n"
    );
    for (label, fresh, n) in [
        ("HTTPS request, kept-alive connection (ms)", false, n_keep),
        (
            "HTTPS request incl. CONNECT + TLS handshake (ms)",
            true,
            n_fresh,
        ),
    ] {
        let per_via = latency_rounds(&ctx, &vias, fresh, n, Duration::from_secs(120)).await;
        // The two bundles' own difference, paired by round: the steadiest
        // figure for whether a change helped.
        let bundle_minus_baseline = vias
            .iter()
            .position(|v| matches!(v, Via::Baseline(_)))
            .zip(vias.iter().position(|v| matches!(v, Via::Bundle(_))))
            .map(|(base, new)| {
                let mut d: Vec<f64> = per_via[new]
                    .0
                    .iter()
                    .zip(&per_via[base].0)
                    .map(|(n, b)| n - b)
                    .collect();
                p50_p99(&mut d).0
            });
        for (via, (mut own, mut added)) in vias.iter().zip(per_via) {
            let done = own.len();
            let (p50, p99) = p50_p99(&mut own);
            let vs_direct = if *via == Via::Direct {
                String::new()
            } else {
                let (a50, a99) = p50_p99(&mut added);
                format!("{a50:+.3} / {a99:+.3}")
            };
            println!(
                "| {label}, n={done} | {} | p50 {p50:.3} / p99 {p99:.3} | {vs_direct} |",
                via.name(),
            );
        }
        if let Some(d) = bundle_minus_baseline {
            println!("| {label} | bundle − baseline, p50 of per-round differences | {d:+.4} | |");
        }
    }
    if !latency_only {
        let n_conns = if quick { 300 } else { 1000 };
        for via in vias.iter().filter(|v| **v != Via::Direct) {
            let (held, secs, conns) =
                hold_many(ctx.clone(), *via, n_conns, Duration::from_secs(120)).await;
            let pid = proxy_pid(*via);
            let rss = pid.map(|p| rss_kib(p).0).unwrap_or(0);
            println!(
                "| {n_conns} concurrent HTTPS sessions held | {} | {held}/{n_conns} open in {secs:.1} s, RSS {} MiB while held | |",
                via.name(),
                rss / 1024
            );
            drop(conns);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, bundle_peak) = rss_kib(bundle_pid);
    println!(
        "| idle RSS after start (MiB) | bundle | {:.1} | |",
        idle_rss as f64 / 1024.0
    );
    if let Some(t) = tiny_idle {
        println!(
            "| idle RSS after start (MiB) | tinyproxy | {:.1} | |",
            t as f64 / 1024.0
        );
    }
    println!(
        "| peak RSS over the run (MiB) | bundle | {:.1} | |",
        bundle_peak as f64 / 1024.0
    );
    drop(tiny);
    drop(baseline);
    drop(bundle);
}
