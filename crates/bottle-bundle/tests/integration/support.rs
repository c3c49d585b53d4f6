//! Test harness: a real bundle on ephemeral loopback ports, real upstream
//! HTTP and HTTPS servers, raw-socket and TLS clients.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bottle_bundle::allowlist::Host;
use bottle_bundle::ca::LeafMinter;
use bottle_bundle::{AuditRecord, RunningBundle};
use bottle_core::bundle::{BundleConfig, BundleCredential, BundleLimits};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Host names the tests map onto 127.0.0.1 with `resolve`.
pub(crate) const ALLOWED: &str = "api.allowed.test";
pub(crate) const OTHER_ALLOWED: &str = "other.allowed.test";
/// The manifest's name for the bottle's agent.
pub(crate) const AGENT: &str = "claude";

/// A request as the upstream saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub version: hyper::Version,
    pub trailers: Vec<(String, String)>,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// Upstream HTTP + HTTPS echo servers on 127.0.0.1.
pub(crate) struct Upstream {
    pub http: SocketAddr,
    pub https: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Every request body byte that arrived, complete requests or not.
    pub received: Arc<Mutex<Vec<u8>>>,
    /// TCP connections accepted, on either port, whatever they carried.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    pub root_pem: PathBuf,
    /// The leaf for `ALLOWED` the upstreams present, for other test
    /// servers behind the bundle.
    pub leaf: Arc<rustls::ServerConfig>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The upstream's response body: bytes, and trailers for gRPC.
type EchoBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn pairs(headers: &hyper::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

async fn echo(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    received: Arc<Mutex<Vec<u8>>>,
) -> Result<Response<EchoBody>, hyper::Error> {
    let method = req.method().to_string();
    let version = req.version();
    let grpc = req
        .headers()
        .get("content-type")
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"));
    let path = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    let headers = pairs(req.headers());
    // Frame by frame into `received`, so that bytes of a body the proxy
    // aborts half-way are on record too.
    let mut incoming = req.into_body();
    let mut body = Vec::new();
    let mut trailers = Vec::new();
    while let Some(frame) = incoming.frame().await {
        let frame = frame?;
        if let Some(data) = frame.data_ref() {
            received.lock().unwrap().extend_from_slice(data);
            body.extend_from_slice(data);
        }
        if let Some(t) = frame.trailers_ref() {
            trailers = pairs(t);
        }
    }
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        headers: headers.clone(),
        body: body.clone(),
        version,
        trailers,
    });
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n])).boxed()));
    }
    if grpc {
        // A gRPC server answers the message back and puts the status in
        // trailers.
        let mut status = hyper::HeaderMap::new();
        status.insert("grpc-status", "0".parse().unwrap());
        let body = Full::new(Bytes::from(body))
            .with_trailers(async move { Some(Ok(status)) })
            .boxed();
        let mut resp = Response::new(body);
        resp.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        return Ok(resp);
    }
    let mut text = format!("{method} {path}\n");
    let mut auth = String::new();
    for (k, v) in &headers {
        text.push_str(&format!("{k}: {v}\n"));
        if k == "authorization" {
            auth = v.clone();
        }
    }
    text.push('\n');
    let mut out = text.into_bytes();
    out.extend_from_slice(&body);
    let mut resp = Response::new(Full::new(Bytes::from(out)).boxed());
    if !auth.is_empty() {
        resp.headers_mut()
            .insert("x-echo-authorization", auth.parse().unwrap());
    }
    Ok(resp)
}

async fn serve_conn<I>(io: I, seen: Arc<Mutex<Vec<Seen>>>, received: Arc<Mutex<Vec<u8>>>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| echo(req, seen.clone(), received.clone()));
    // HTTP/1.1 or HTTP/2 (by ALPN on TLS, prior knowledge in the clear),
    // as a real server would.
    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

impl Upstream {
    pub(crate) async fn start(dir: &Path) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let received: Arc<Mutex<Vec<u8>>> = Arc::default();
        let ca = bottle_bundle::generate_ca("upstream-test").unwrap();
        let root_pem = dir.join("upstream-root.pem");
        std::fs::write(&root_pem, &ca.cert_pem).unwrap();
        let minter = LeafMinter::new(&ca.cert_pem, &ca.key_pem).unwrap();
        let leaf = minter.server_config(&Host::Name(ALLOWED.into())).unwrap();
        let mut tls_cfg = (*leaf).clone();
        tls_cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_cfg));

        let http_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let https_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = http_l.local_addr().unwrap();
        let https = https_l.local_addr().unwrap();
        let accepted: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (s1, r1, a1) = (seen.clone(), received.clone(), accepted.clone());
        let t1 = tokio::spawn(async move {
            while let Ok((s, _)) = http_l.accept().await {
                a1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(serve_conn(s, s1.clone(), r1.clone()));
            }
        });
        let (s2, r2, a2) = (seen.clone(), received.clone(), accepted.clone());
        let t2 = tokio::spawn(async move {
            while let Ok((s, _)) = https_l.accept().await {
                a2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let (seen, received) = (s2.clone(), r2.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(s).await {
                        serve_conn(tls, seen, received).await;
                    }
                });
            }
        });
        Self {
            http,
            https,
            seen,
            received,
            accepted,
            root_pem,
            leaf,
            tasks: vec![t1, t2],
        }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn received(&self) -> Vec<u8> {
        self.received.lock().unwrap().clone()
    }

    pub(crate) fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A bundle under test, its files and the upstream.
pub(crate) struct Env {
    pub _dir: tempfile::TempDir,
    pub upstream: Upstream,
    pub bundle: RunningBundle,
    pub ca_pem: String,
    pub config: BundleConfig,
}

pub(crate) struct Options {
    pub allow: Vec<String>,
    pub extra_ports: Vec<u16>,
    pub credentials: Vec<(String, String, String, String)>, // host, header, format, secret
    pub limits: BundleLimits,
    pub nameservers: Vec<String>,
    pub resolve: BTreeMap<String, String>,
    /// `allow` rules whose secrets are redacted instead of blocked.
    pub redact: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        let mut resolve = BTreeMap::new();
        resolve.insert(ALLOWED.to_string(), "127.0.0.1".to_string());
        resolve.insert(OTHER_ALLOWED.to_string(), "127.0.0.1".to_string());
        Self {
            allow: vec![ALLOWED.into(), OTHER_ALLOWED.into()],
            extra_ports: vec![],
            credentials: vec![],
            limits: BundleLimits {
                header_read_timeout_ms: 5_000,
                idle_timeout_ms: 20_000,
                ..BundleLimits::default()
            },
            nameservers: vec![],
            resolve,
            redact: vec![],
        }
    }
}

pub(crate) fn base_config(
    dir: &Path,
    upstream: &Upstream,
    opts: &Options,
) -> (BundleConfig, String) {
    let ca = bottle_bundle::generate_ca("test").unwrap();
    let ca_cert = dir.join("ca.pem");
    let ca_key = dir.join("ca.key");
    std::fs::write(&ca_cert, &ca.cert_pem).unwrap();
    std::fs::write(&ca_key, &ca.key_pem).unwrap();
    let mut credentials = Vec::new();
    for (i, (host, header, format, secret)) in opts.credentials.iter().enumerate() {
        let file = dir.join(format!("cred{i}"));
        std::fs::write(&file, format!("{secret}\n")).unwrap();
        credentials.push(BundleCredential {
            name: format!("cred{i}"),
            host: host.clone(),
            header: header.clone(),
            format: format.clone(),
            file: file.display().to_string(),
        });
    }
    let mut ports = vec![80, 443, upstream.http.port(), upstream.https.port()];
    ports.extend(&opts.extra_ports);
    let config = BundleConfig {
        version: bottle_core::bundle::BUNDLE_CONFIG_VERSION,
        bottle: "test".into(),
        agent: AGENT.into(),
        proxy_listen: "127.0.0.1:0".into(),
        allow: opts.allow.clone(),
        ports,
        credentials,
        ca_cert: ca_cert.display().to_string(),
        ca_key: ca_key.display().to_string(),
        audit_log: dir.join("audit.jsonl").display().to_string(),
        resolve: opts.resolve.clone(),
        redact: opts.redact.clone(),
        upstream_roots: vec![upstream.root_pem.display().to_string()],
        upstream_web_roots: true,
        nameservers: opts.nameservers.clone(),
        limits: opts.limits.clone(),
        git_gate_listen: None,
        git: Vec::new(),
        supervise_listen: None,
        requests_dir: None,
        git_hook_program: None,
        relays: Vec::new(),
    };
    (config, ca.cert_pem)
}

impl Env {
    pub(crate) async fn start(opts: Options) -> Self {
        Self::start_configured(opts, |_| {}).await
    }

    /// Starts a bundle that writes its audit log at `log`.
    pub(crate) async fn start_with_audit_log(opts: Options, log: &Path) -> Self {
        let log = log.display().to_string();
        Self::start_configured(opts, |config| config.audit_log = log).await
    }

    pub(crate) async fn start_configured(
        opts: Options,
        adjust: impl FnOnce(&mut BundleConfig),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let upstream = Upstream::start(dir.path()).await;
        let (mut config, ca_pem) = base_config(dir.path(), &upstream, &opts);
        adjust(&mut config);
        let bundle = bottle_bundle::start(config.clone()).await.unwrap();
        Self {
            _dir: dir,
            upstream,
            bundle,
            ca_pem,
            config,
        }
    }

    pub(crate) fn proxy(&self) -> SocketAddr {
        self.bundle.proxy_addr
    }

    /// The audit log, its merging windows' counts written first.
    pub(crate) fn audit(&self) -> Vec<AuditRecord> {
        self.bundle.flush_audit();
        bottle_bundle::read_audit(Path::new(&self.config.audit_log)).unwrap()
    }

    /// Sends raw bytes to the proxy and reads the reply until it closes.
    pub(crate) async fn raw(&self, request: &[u8]) -> Resp {
        let mut s = TcpStream::connect(self.proxy()).await.unwrap();
        s.write_all(request).await.unwrap();
        read_response(&mut s).await
    }

    /// CONNECT to `authority`; returns the stream after a 200, or the refusal.
    pub(crate) async fn connect(&self, authority: &str) -> Result<TcpStream, Resp> {
        let mut s = TcpStream::connect(self.proxy()).await.unwrap();
        s.write_all(
            format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let head = read_head(&mut s).await;
        let resp = parse_head(&head);
        if resp.status == 200 {
            Ok(s)
        } else {
            // The refusal body follows; read it by content-length.
            let len = resp
                .header("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            s.read_exact(&mut body).await.unwrap();
            Err(Resp { body, ..resp })
        }
    }

    /// CONNECT + TLS (trusting the bottle CA) with the given SNI.
    pub(crate) async fn tls(
        &self,
        authority: &str,
        sni: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let s = self.connect(authority).await.map_err(|r| {
            std::io::Error::other(format!("CONNECT refused: {} {}", r.status, r.text()))
        })?;
        tls_client(&self.ca_pem, s, sni).await
    }

    /// CONNECT to `authority`, then one plain-HTTP request inside the
    /// tunnel; returns the response and the stream, to see it close.
    pub(crate) async fn plain_in_tunnel(
        &self,
        authority: &str,
        request: &[u8],
    ) -> (Resp, TcpStream) {
        let mut s = self
            .connect(authority)
            .await
            .unwrap_or_else(|r| panic!("CONNECT {authority} refused: {} {}", r.status, r.text()));
        s.write_all(request).await.unwrap();
        let resp = read_response(&mut s).await;
        (resp, s)
    }

    /// One HTTPS request through the proxy; returns the response.
    pub(crate) async fn https(&self, authority: &str, request: &[u8]) -> Resp {
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        let mut tls = self.tls(authority, host).await.unwrap();
        tls.write_all(request).await.unwrap();
        // Sends what rustls may still hold back after write_all.
        tls.flush().await.unwrap();
        read_response(&mut tls).await
    }
}

pub(crate) async fn tls_client(
    ca_pem: &str,
    s: TcpStream,
    sni: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tls_client_alpn(ca_pem, s, sni, Vec::new()).await
}

/// [`tls_client`] offering the ALPN protocols `alpn`.
pub(crate) async fn tls_client_alpn(
    ca_pem: &str,
    s: TcpStream,
    sni: &str,
    alpn: Vec<Vec<u8>>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let name = ServerName::try_from(sni.to_string()).unwrap();
    connector.connect(name, s).await
}

/// A parsed HTTP response.
#[derive(Debug, Clone, Default)]
pub(crate) struct Resp {
    pub status: u16,
    /// The status line's reason phrase.
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// Head and body as one string (for "never appears anywhere" checks).
    pub(crate) fn everything(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.headers {
            s.push_str(&format!("{k}: {v}\n"));
        }
        s.push_str(&self.text());
        s
    }
}

pub(crate) async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    head
}

pub(crate) fn parse_head(head: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut status_parts = status_line.splitn(3, ' ');
    let status = status_parts
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let reason = status_parts.next().unwrap_or("").to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Resp {
        status,
        reason,
        headers,
        body: Vec::new(),
    }
}

/// Reads one response: head, then a content-length or chunked body, or to EOF.
pub(crate) async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> Resp {
    let head = read_head(s).await;
    let mut resp = parse_head(&head);
    if let Some(len) = resp
        .header("content-length")
        .and_then(|l| l.parse::<usize>().ok())
    {
        let mut body = vec![0; len];
        let mut got = 0;
        while got < len {
            match s.read(&mut body[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        body.truncate(got);
        resp.body = body;
    } else if resp
        .header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), async {
            let mut buf = [0u8; 8192];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => raw.extend_from_slice(&buf[..n]),
                }
                if raw.ends_with(b"0\r\n\r\n") {
                    break;
                }
            }
        })
        .await;
        resp.body = dechunk(&raw);
    } else {
        let mut body = Vec::new();
        let _ = s.read_to_end(&mut body).await;
        resp.body = body;
    }
    resp
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..nl]);
        let Ok(size) = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        raw = &raw[nl + 2..];
        if size == 0 || raw.len() < size {
            out.extend_from_slice(&raw[..size.min(raw.len())]);
            break;
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or(&[]);
    }
    out
}
