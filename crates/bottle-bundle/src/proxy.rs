//! The agent-facing proxy: `HTTP_PROXY` / `HTTPS_PROXY` for the bottle.
//!
//! - `CONNECT host:port` to an allowed destination is answered `200` and the
//!   tunnel is intercepted: the proxy terminates TLS with a leaf for `host`
//!   minted from the bottle's CA, checks that the SNI names the same host,
//!   then serves the requests inside over HTTP/2 or HTTP/1.1, whichever
//!   ALPN settled (each one's `:authority` or `Host` must name the CONNECT
//!   host too: no domain fronting). A tunnel that does not start with a TLS
//!   record is read as plain HTTP/1.1.
//! - `GET http://host/...` (absolute form) is forwarded as plain HTTP.
//! - `GET /__bottle/health` (origin form) is answered `200 ok` directly.
//!
//! Every forwarded request is scanned for secrets (target, headers, the body
//! as it streams behind a hold-back window, or decoded first when it has a
//! `Content-Encoding`) and then handed to [`Egress`] in-process, as a
//! request and a streaming body (HTTP/2 trailers and two-way streaming pass
//! through as sent); the proxy itself never dials anything. One audit line
//! per decision, that is one per HTTP/2 stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bottle_core::bundle::{BundleConfig, BundleLimits};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::BundleError;
use crate::allowlist::{Denial, Host, HostSet, Policy, Verdict, normalize_host, parse_authority};
use crate::audit::{AuditLog, AuditRecord, Decision, redact_path};
use crate::body::{
    AuditGuard, BoxBody, FindingSlot, MeteredBody, ScanBody, blocked as blocked_by, boxed,
    first_frame_read, full,
};
use crate::ca::LeafMinter;
use crate::egress::{Destination, Egress, Outcome, Scheme};
use crate::encoding::{self, Refusal, Scanned};
use crate::io::{IdleIo, Prefixed, ReadBuffered};
use crate::scan::{Finding, Scanner};
use crate::websocket;

mod denied_tunnel;
use denied_tunnel::DeniedTunnel;

/// The path the proxy answers itself, for readiness probes.
pub const HEALTH_PATH: &str = "/__bottle/health";

/// The proxy daemon's shared state.
pub struct Proxy {
    bottle: String,
    policy: Policy,
    /// Hosts whose requests have their secrets masked, not refused.
    redact: HostSet,
    scanner: Scanner,
    minter: LeafMinter,
    audit: AuditLog,
    egress: Arc<Egress>,
    limits: BundleLimits,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("bottle", &self.bottle)
            .finish_non_exhaustive()
    }
}

/// Ports on which a tunnel must start with TLS.
const TLS_PORTS: [u16; 2] = [443, 8443];

/// The most HTTP/2 streams one tunnel may have open at once. An HTTP/1.1
/// connection carries one request at a time; this keeps one HTTP/2 tunnel
/// from being worth more than a few dozen connections.
const H2_MAX_STREAMS: u32 = 64;

/// Streams a client may reset before the server has handled them, and
/// streams the server may reset for protocol errors, before the whole
/// connection is closed (the HTTP/2 "rapid reset" flood).
const H2_MAX_RESETS: usize = 32;

/// Flow-control windows of every HTTP/2 leg the bundle speaks: large enough
/// that a single stream is not held to the 64 KiB default window.
pub(crate) const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// See [`H2_STREAM_WINDOW`]; the connection window covers all streams.
pub(crate) const H2_CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;

/// The protocol ALPN settled inside an intercepted tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TunnelProtocol {
    Http1,
    Http2,
}

/// Where a request is going, after normalisation.
#[derive(Debug, Clone)]
struct Target {
    scheme: Scheme,
    host: Host,
    port: u16,
    rule: String,
}

impl Proxy {
    /// Builds the proxy; every request it lets through goes to `egress`.
    pub fn new(
        config: &BundleConfig,
        audit: AuditLog,
        egress: Arc<Egress>,
    ) -> Result<Self, BundleError> {
        let policy = Policy::new(&config.allow, &config.ports)?.for_agent(&config.agent);
        let minter = LeafMinter::from_files(&config.ca_cert, &config.ca_key)?;
        Ok(Self {
            bottle: config.bottle.clone(),
            policy,
            redact: HostSet::new(&config.redact)?,
            scanner: Scanner::new()?,
            minter,
            audit,
            egress,
            limits: config.limits.clone(),
        })
    }

    /// Also allows what `rules` allows (operator approvals through
    /// supervise), from now on.
    pub fn share_runtime_rules(&mut self, rules: crate::allowlist::RuntimeRules) {
        self.policy.share_runtime(rules);
    }

    fn http1(&self) -> hyper::server::conn::http1::Builder {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(self.limits.header_read_timeout_ms))
            .max_header_size(self.limits.max_header_bytes)
            .max_buf_size((self.limits.max_header_bytes + 8192).max(64 * 1024));
        b
    }

    /// The HTTP/2 server for tunnels that negotiated h2, held to what
    /// [`Self::http1`] holds HTTP/1.1 to: the same header bytes, a bounded
    /// number of streams, and a bound on reset streams. A silent connection
    /// is closed by the idle timeout of the socket underneath; no keep-alive
    /// pings, which would keep it busy.
    fn http2(&self) -> hyper::server::conn::http2::Builder<TokioExecutor> {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(self.limits.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(H2_MAX_STREAMS)
            .max_pending_accept_reset_streams(H2_MAX_RESETS)
            .max_local_error_reset_streams(H2_MAX_RESETS)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW);
        b
    }

    /// Serves connections from `listener` until it fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<(), BundleError> {
        let slots = Arc::new(Semaphore::new(self.limits.max_connections.max(1)));
        loop {
            let (stream, _, permit) =
                crate::accept::next_connection(&listener, &slots, "proxy").await?;
            let this = self.clone();
            // The connection's slot goes with each request, so a tunnel
            // the connection becomes holds it after hyper lets go.
            let slot = ConnectionSlot(Arc::new(permit));
            tokio::spawn(async move {
                let io = TokioIo::new(IdleIo::new(
                    stream,
                    Duration::from_millis(this.limits.idle_timeout_ms),
                ));
                let svc_this = this.clone();
                let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(slot.clone());
                    let this = svc_this.clone();
                    async move { Ok::<_, std::convert::Infallible>(this.outer(req).await) }
                });
                let _ = this.http1().serve_connection(io, svc).with_upgrades().await;
            });
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per audit field; a builder would only add noise"
    )]
    fn record(
        &self,
        decision: Decision,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
        reason: &str,
        rule: &str,
    ) -> AuditRecord {
        AuditRecord {
            v: crate::audit::AUDIT_VERSION,
            time: bottle_core::time::now_rfc3339_millis(),
            bottle: self.bottle.clone(),
            daemon: "proxy".into(),
            decision,
            host: host.into(),
            port,
            method: method.into(),
            path: redact_path(path),
            status: 0,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            reason: reason.into(),
            rule: rule.into(),
            count: 1,
            truncated: false,
            hosts: Vec::new(),
        }
    }

    /// Answers locally and writes the audit line for it.
    fn refuse(
        &self,
        status: StatusCode,
        mut rec: AuditRecord,
        start: Instant,
        message: &str,
    ) -> Response<BoxBody> {
        rec.status = status.as_u16();
        rec.duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.audit.write(rec);
        text(status, message)
    }

    fn deny(
        &self,
        d: &Denial,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
        start: Instant,
    ) -> Response<BoxBody> {
        let rec = self.record(Decision::Deny, host, port, method, path, d.reason, &d.rule);
        self.refuse(StatusCode::FORBIDDEN, rec, start, &d.message)
    }

    /// Once the audit log cannot be written nothing is let through: every
    /// request gets a 503 naming [`crate::audit::AUDIT_UNAVAILABLE`].
    fn refuse_unaudited(&self) -> Option<Response<BoxBody>> {
        self.audit.is_degraded().then(|| {
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                crate::audit::AUDIT_UNAVAILABLE_MESSAGE,
            )
        })
    }

    /// Requests on the agent-facing socket: CONNECT, absolute-form, health.
    async fn outer(self: Arc<Self>, req: Request<Incoming>) -> Response<BoxBody> {
        let start = Instant::now();
        let method = req.method().as_str().to_string();
        let health = req.method() == Method::GET
            && req.uri().authority().is_none()
            && req.uri().path() == HEALTH_PATH;
        if !health && let Some(refusal) = self.refuse_unaudited() {
            return refusal;
        }
        if req.method() == Method::CONNECT {
            return self.connect(req, start);
        }
        let uri = req.uri().clone();
        let pq = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let Some(authority) = uri.authority() else {
            if req.method() == Method::GET && uri.path() == HEALTH_PATH {
                return text(StatusCode::OK, "ok");
            }
            let rec = self.record(
                Decision::Deny,
                "",
                0,
                &method,
                &pq,
                "not_a_proxy_request",
                "",
            );
            return self.refuse(
                StatusCode::BAD_REQUEST,
                rec,
                start,
                "bottle: this is the bottle's egress proxy; send requests through it (HTTP_PROXY / HTTPS_PROXY)",
            );
        };
        let (scheme, default_port) = match uri.scheme_str() {
            Some("http") => (Scheme::Http, 80),
            Some("https") => (Scheme::Https, 443),
            other => {
                let rec = self.record(
                    Decision::Deny,
                    authority.as_str(),
                    0,
                    &method,
                    &pq,
                    "bad_scheme",
                    "",
                );
                let msg = format!(
                    "bottle: the proxy forwards http and https only, not {}",
                    other.unwrap_or("?")
                );
                return self.refuse(StatusCode::BAD_REQUEST, rec, start, &msg);
            }
        };
        if authority.as_str().contains('@') {
            let rec = self.record(Decision::Deny, "", 0, &method, &pq, "userinfo", "");
            return self.refuse(
                StatusCode::BAD_REQUEST,
                rec,
                start,
                "bottle: credentials in proxy URLs are not allowed",
            );
        }
        let (host, port) = match parse_authority(authority.as_str(), Some(default_port)) {
            Ok(hp) => hp,
            Err(e) => {
                return self.deny(
                    &Denial::bad_host(&e),
                    authority.as_str(),
                    0,
                    &method,
                    &pq,
                    start,
                );
            }
        };
        if let Some(f) = self.scanner.scan(authority.as_str().as_bytes()) {
            return self.blocked_name(&host.to_string(), port, &method, &pq, f, start);
        }
        let rule = match self.policy.check(&host, port) {
            Verdict::Allow { rule } => rule,
            Verdict::Deny(d) => return self.deny(&d, &host.to_string(), port, &method, &pq, start),
        };
        // A Host header naming another host than the URI is domain fronting
        // in plain HTTP: refuse it rather than guess which one was meant.
        if let Some(named) = req.headers().get(header::HOST) {
            let same = named
                .to_str()
                .ok()
                .and_then(|n| parse_authority(n, Some(port)).ok())
                .is_some_and(|(h, _)| h == host);
            if !same {
                let rec = self.record(
                    Decision::Deny,
                    &host.to_string(),
                    port,
                    &method,
                    &pq,
                    "host_mismatch",
                    &rule,
                );
                let msg = format!(
                    "bottle: the request is for {host} but its Host header names {} (domain fronting is not allowed)",
                    String::from_utf8_lossy(named.as_bytes())
                );
                return self.refuse(StatusCode::MISDIRECTED_REQUEST, rec, start, &msg);
            }
        }
        let target = Target {
            scheme,
            host,
            port,
            rule,
        };
        self.forward(req, target, start).await
    }

    /// A destination name that itself carries a secret (exfiltration
    /// through a subdomain that a suffix rule would allow).
    fn blocked_name(
        &self,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
        f: Finding,
        start: Instant,
    ) -> Response<BoxBody> {
        let rec = self.record(
            Decision::BlockedSecret,
            host,
            port,
            method,
            path,
            &f.reason(),
            "",
        );
        self.refuse(
            StatusCode::FORBIDDEN,
            rec,
            start,
            &secret_in_name_message(&f),
        )
    }

    fn connect(self: Arc<Self>, req: Request<Incoming>, start: Instant) -> Response<BoxBody> {
        let raw = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let (host, port) = match parse_authority(&raw, None) {
            Ok(hp) => hp,
            Err(e) => return self.deny(&Denial::bad_host(&e), &raw, 0, "CONNECT", "", start),
        };
        let host_s = host.to_string();
        if let Some(f) = self.scanner.scan(raw.as_bytes()) {
            return self.open_denied_tunnel(
                req,
                DeniedTunnel::secret_in_name(host, port, &f),
                start,
            );
        }
        let rule = match self.policy.check(&host, port) {
            Verdict::Allow { rule } => rule,
            Verdict::Deny(d) => {
                return self.open_denied_tunnel(req, DeniedTunnel::by_policy(host, port, d), start);
            }
        };
        let mut rec = self.record(
            Decision::Allow,
            &host_s,
            port,
            "CONNECT",
            "",
            "tunnel",
            &rule,
        );
        rec.status = 200;
        self.audit.write(rec);
        if let Some(refusal) = self.refuse_unaudited() {
            return refusal;
        }
        let target = Target {
            scheme: Scheme::Https,
            host,
            port,
            rule,
        };
        let this = self.clone();
        open_tunnel(req, move |io| this.intercept(io, target))
    }

    async fn intercept(
        self: Arc<Self>,
        mut io: TokioIo<hyper::upgrade::Upgraded>,
        mut target: Target,
    ) {
        let handshake_limit = Duration::from_millis(self.limits.header_read_timeout_ms);
        let host_s = target.host.to_string();
        // Handshake trouble is an error; a fronted SNI or plain bytes to a
        // TLS port are denials.
        let fail = |reason: &str, status: u16| {
            let decision = if matches!(reason, "sni_mismatch" | "tunnel_not_tls") {
                Decision::Deny
            } else {
                Decision::Error
            };
            let mut rec = self.record(
                decision,
                &host_s,
                target.port,
                "CONNECT",
                "",
                reason,
                &target.rule,
            );
            rec.status = status;
            self.audit.write(rec);
        };
        let mut first = [0u8; 1];
        let n = match tokio::time::timeout(handshake_limit, io.read(&mut first)).await {
            Ok(Ok(n)) => n,
            _ => return,
        };
        if n == 0 {
            return;
        }
        // rustls reads 4 KiB at a time; an upload reads through a buffer.
        let io = ReadBuffered::new(Prefixed::new(Bytes::copy_from_slice(&first[..n]), io));
        if first[0] != 0x16 {
            if TLS_PORTS.contains(&target.port) {
                // Plain bytes to a TLS port: whatever they are, they are not
                // what the operator allowed, and a credential must not
                // follow them in the clear.
                fail("tunnel_not_tls", 403);
                let mut io = io;
                let _ = io
                    .write_all(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nbottle: this tunnel goes to a TLS port, but the client did not start TLS; use https://\n",
                    )
                    .await;
                let _ = io.shutdown().await;
                return;
            }
            // Not a TLS handshake record: plain HTTP inside the tunnel.
            target.scheme = Scheme::Http;
            self.serve_tunnel(io, target, TunnelProtocol::Http1).await;
            return;
        }
        let acceptor =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
        let start = match tokio::time::timeout(handshake_limit, acceptor).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return fail("tls_handshake_failed", 0),
            Err(_) => return fail("tls_handshake_timeout", 0),
        };
        let sni = start.client_hello().server_name().map(str::to_string);
        let sni_ok = match (&sni, &target.host) {
            (Some(s), h) => normalize_host(s).as_ref() == Ok(h),
            (None, Host::Ip(_)) => true,
            (None, Host::Name(_)) => false,
        };
        if !sni_ok {
            // Domain fronting: TLS names one host, CONNECT another.
            return fail("sni_mismatch", 0);
        }
        let config = match self.minter.server_config(&target.host) {
            Ok(c) => c,
            Err(e) => {
                crate::log!("proxy: {e}");
                return fail("leaf_mint_failed", 0);
            }
        };
        let tls = match tokio::time::timeout(handshake_limit, start.into_stream(config)).await {
            Ok(Ok(t)) => t,
            Ok(Err(_)) => return fail("tls_handshake_failed", 0),
            Err(_) => return fail("tls_handshake_timeout", 0),
        };
        let protocol = match tls.get_ref().1.alpn_protocol() {
            Some(b"h2") => TunnelProtocol::Http2,
            _ => TunnelProtocol::Http1,
        };
        self.serve_tunnel(tls, target, protocol).await;
    }

    async fn serve_tunnel<I>(self: Arc<Self>, io: I, target: Target, protocol: TunnelProtocol)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let this = self.clone();
        let svc = hyper::service::service_fn(move |req| {
            let this = this.clone();
            let target = target.clone();
            async move { Ok::<_, std::convert::Infallible>(this.inner(req, target).await) }
        });
        let io = TokioIo::new(io);
        let _ = match protocol {
            TunnelProtocol::Http1 => self.http1().serve_connection(io, svc).with_upgrades().await,
            TunnelProtocol::Http2 => self.http2().serve_connection(io, svc).await,
        };
    }

    /// A request inside an intercepted tunnel.
    async fn inner(self: Arc<Self>, req: Request<Incoming>, target: Target) -> Response<BoxBody> {
        if let Some(refusal) = self.refuse_unaudited() {
            return refusal;
        }
        let start = Instant::now();
        // The audit line's fields, built only for a refusal: an allowed
        // request's are built once, in `forward`.
        let refused = |reason: &str| {
            let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
            self.record(
                Decision::Deny,
                &target.host.to_string(),
                target.port,
                req.method().as_str(),
                pq,
                reason,
                &target.rule,
            )
        };
        if req.method() == Method::CONNECT {
            return self.refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                refused("nested_connect"),
                start,
                "bottle: CONNECT inside a tunnel is not allowed",
            );
        }
        // The request's authority (an absolute URI, HTTP/2's `:authority`)
        // and its Host header must each name the CONNECT host; at least one
        // of them must be there.
        let uri_authority = req
            .uri()
            .authority()
            .map(|a| std::borrow::Cow::Borrowed(a.as_str()));
        let host_header = req
            .headers()
            .get(header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()));
        let names_target =
            |n: &str| parse_authority(n, Some(target.port)).is_ok_and(|(h, _)| h == target.host);
        let mismatch = [&uri_authority, &host_header]
            .into_iter()
            .flatten()
            .find(|n| !names_target(n));
        let named = mismatch.or(uri_authority.as_ref()).or(host_header.as_ref());
        if named.is_none() || mismatch.is_some() {
            let msg = format!(
                "bottle: this tunnel is for {}; the request names {} (domain fronting is not allowed)",
                target.host,
                named.map_or("no host", |n| n.as_ref())
            );
            return self.refuse(
                StatusCode::MISDIRECTED_REQUEST,
                refused("host_mismatch"),
                start,
                &msg,
            );
        }
        self.forward(req, target, start).await
    }

    /// Refuses a request whose body could not be let through: a secret in
    /// it, or a body that cannot be scanned (see [`encoding`]).
    fn unscannable(
        &self,
        refusal: &Refusal,
        target: &Target,
        method: &str,
        pq: &str,
        start: Instant,
    ) -> Response<BoxBody> {
        let decision = match refusal {
            Refusal::Secret(_) => Decision::BlockedSecret,
            Refusal::ClientFailed => Decision::Error,
            _ => Decision::Deny,
        };
        let rec = self.record(
            decision,
            &target.host.to_string(),
            target.port,
            method,
            pq,
            &refusal.reason(),
            &target.rule,
        );
        let message = match refusal {
            Refusal::Secret(f) => format!(
                "bottle: request blocked: it carries what looks like a credential ({}); the bottle does not let secrets leave",
                f.reason()
            ),
            other => format!("bottle: request refused: {other}"),
        };
        self.refuse(refusal.status(), rec, start, &message)
    }

    /// Scans a request's target and headers. Blocking, the first secret
    /// refuses the request; redacting, each is masked in `parts` in place
    /// and its kind recorded in `finding`, unless masking cannot clean it.
    /// Returns the target as it leaves (masked), for the audit line.
    fn scan_head(
        &self,
        parts: &mut http::request::Parts,
        redacting: bool,
        finding: &FindingSlot,
    ) -> Result<String, Finding> {
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        if !redacting {
            if let Some(f) = self.scanner.scan_target(&pq) {
                return Err(f);
            }
            for (name, value) in &parts.headers {
                if let Some(f) = self.scanner.scan_header(name.as_str(), value.as_bytes()) {
                    return Err(f);
                }
            }
            return Ok(pq);
        }
        let mut redacted = std::collections::BTreeSet::new();
        let (masked_pq, kinds) = self.scanner.redact_target(&pq)?;
        if !kinds.is_empty() {
            let mut uri = parts.uri.clone().into_parts();
            // Masks write letters and `*`: always a valid target.
            uri.path_and_query = masked_pq.parse().ok();
            if let Ok(masked) = http::Uri::from_parts(uri) {
                parts.uri = masked;
            }
            redacted.extend(kinds);
        }
        for (name, value) in &mut parts.headers {
            let (masked, kinds) = self
                .scanner
                .redact_header(name.as_str(), value.as_bytes())?;
            if !kinds.is_empty() {
                if let Ok(masked) = HeaderValue::from_bytes(&masked) {
                    *value = masked;
                }
                redacted.extend(kinds);
            }
        }
        // What leaves must be clean, whatever a mask failed to write.
        let leaves = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        if let Some(f) = self.scanner.scan_target(&leaves) {
            return Err(f);
        }
        for (name, value) in &parts.headers {
            if let Some(f) = self.scanner.scan_header(name.as_str(), value.as_bytes()) {
                return Err(f);
            }
        }
        if let Ok(mut found) = finding.lock() {
            found.redacted.extend(redacted);
        }
        Ok(leaves)
    }

    /// Scans and forwards one request to egress; streams the response back.
    async fn forward(
        &self,
        req: Request<Incoming>,
        target: Target,
        start: Instant,
    ) -> Response<BoxBody> {
        let method = req.method().as_str().to_string();
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let host_s = target.host.to_string();
        let blocked = |kind: String| {
            let rec = self.record(
                Decision::BlockedSecret,
                &host_s,
                target.port,
                &method,
                &pq,
                &kind,
                &target.rule,
            );
            self.refuse(
                StatusCode::FORBIDDEN,
                rec,
                start,
                &format!("bottle: request blocked: it carries what looks like a credential ({kind}); the bottle does not let secrets leave"),
            )
        };
        if req.headers().contains_key(header::TRANSFER_ENCODING)
            && req.headers().contains_key(header::CONTENT_LENGTH)
        {
            // Ambiguous framing is how requests get smuggled: refuse it.
            let rec = self.record(
                Decision::Deny,
                &host_s,
                target.port,
                &method,
                &pq,
                "ambiguous_framing",
                &target.rule,
            );
            return self.refuse(
                StatusCode::BAD_REQUEST,
                rec,
                start,
                "bottle: a request may not carry both Content-Length and Transfer-Encoding",
            );
        }
        let redacting = self.redact.contains(&target.host);
        let (mut parts, body) = req.into_parts();
        let finding: FindingSlot = Arc::default();
        let pq = match self.scan_head(&mut parts, redacting, &finding) {
            Ok(pq) => pq,
            Err(f) => return blocked(f.reason()),
        };
        if websocket::is_upgrade(&parts.method, parts.version, &parts.headers) {
            return self
                .websocket(parts, target, start, &pq, redacting, finding)
                .await;
        }
        let codings = match encoding::codings(&parts.headers) {
            Ok(c) => c,
            Err(refusal) => return self.unscannable(&refusal, &target, &method, &pq, start),
        };
        let up = Arc::new(AtomicU64::new(0));
        let client_failed = Arc::new(AtomicBool::new(false));
        let body = if codings.is_empty() {
            boxed(ScanBody::new(
                body,
                &self.scanner,
                redacting,
                up.clone(),
                finding.clone(),
                client_failed.clone(),
            ))
        } else {
            match encoding::buffer_and_scan(body, &self.scanner, codings, redacting).await {
                Ok(Scanned::AsSent(body)) => {
                    let len = http_body::Body::size_hint(&body).lower();
                    up.store(len, Ordering::Relaxed);
                    body
                }
                Ok(Scanned::Redacted { body, len, kinds }) => {
                    parts.headers.remove(header::CONTENT_ENCODING);
                    parts.headers.insert(header::CONTENT_LENGTH, len.into());
                    if let Ok(mut found) = finding.lock() {
                        found.redacted.extend(kinds);
                    }
                    up.store(len, Ordering::Relaxed);
                    body
                }
                Err(refusal) => return self.unscannable(&refusal, &target, &method, &pq, start),
            }
        };
        // A secret found in the body, or the agent's own body broken, stops
        // the body the proxy feeds egress: those are the proxy's to name.
        let body_stopped =
            || blocked_by(&finding).is_some() || client_failed.load(Ordering::Relaxed);
        let body_refusal = || {
            if let Some(f) = blocked_by(&finding) {
                return blocked(f.reason());
            }
            let rec = self.record(
                Decision::Error,
                &host_s,
                target.port,
                &method,
                &pq,
                "bad_request_body",
                &target.rule,
            );
            self.refuse(StatusCode::BAD_REQUEST, rec, start, "bottle: the request body could not be read (malformed chunked encoding or the client went away)")
        };
        let Ok(body) = first_frame_read(body).await else {
            return body_refusal();
        };
        let to = Destination {
            scheme: target.scheme,
            host: &target.host,
            port: target.port,
        };
        let answer = self.egress.send(parts, body, to).await;
        let (decision, reason, rule) = match answer.outcome {
            Outcome::Forwarded => (Decision::Allow, "allowed", target.rule.clone()),
            Outcome::Refused {
                decision,
                reason,
                rule,
            } => {
                if body_stopped() {
                    return body_refusal();
                }
                (decision, reason, rule)
            }
        };
        let (parts, body) = answer.response.into_parts();
        let mut rec = self.record(decision, &host_s, target.port, &method, &pq, reason, &rule);
        rec.status = parts.status.as_u16();
        let guard = AuditGuard::new(self.audit.clone(), rec, start, up, finding);
        Response::from_parts(parts, boxed(MeteredBody::new(body, guard)))
    }
}

impl Proxy {
    /// A WebSocket handshake whose head was scanned: sent on over HTTP/1.1
    /// without the agent's extension offer; a `101` switches both sides
    /// and hands them to the relay, which audits the socket when it ends.
    /// Any other answer goes back as an ordinary response.
    async fn websocket(
        &self,
        mut parts: http::request::Parts,
        target: Target,
        start: Instant,
        pq: &str,
        redacting: bool,
        finding: FindingSlot,
    ) -> Response<BoxBody> {
        let method = parts.method.as_str().to_string();
        let host_s = target.host.to_string();
        let failed = |status: StatusCode, reason: &str, message: &str| {
            let rec = self.record(
                Decision::Error,
                &host_s,
                target.port,
                &method,
                pq,
                reason,
                &target.rule,
            );
            self.refuse(status, rec, start, message)
        };
        let Some(agent_side) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            // hyper serves every HTTP/1.1 connection of the proxy with
            // upgrades; without a handle there is nothing to switch.
            return failed(
                StatusCode::BAD_REQUEST,
                "websocket_unavailable",
                "bottle: this connection cannot switch to a WebSocket",
            );
        };
        parts.headers.remove(websocket::SEC_WEBSOCKET_EXTENSIONS);
        let to = Destination {
            scheme: target.scheme,
            host: &target.host,
            port: target.port,
        };
        let answer = self.egress.upgrade(parts, to).await;
        let (decision, reason, rule) = match answer.outcome {
            Outcome::Forwarded => (Decision::Allow, "websocket", target.rule.clone()),
            Outcome::Refused {
                decision,
                reason,
                rule,
            } => (decision, reason, rule),
        };
        let mut response = answer.response;
        let mut rec = self.record(decision, &host_s, target.port, &method, pq, reason, &rule);
        rec.status = response.status().as_u16();
        let up = Arc::new(AtomicU64::new(0));
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            let guard = AuditGuard::new(self.audit.clone(), rec, start, up, finding);
            let (parts, body) = response.into_parts();
            return Response::from_parts(parts, boxed(MeteredBody::new(body, guard)));
        }
        if response
            .headers()
            .contains_key(websocket::SEC_WEBSOCKET_EXTENSIONS)
        {
            // Nothing was offered: an extension would hide payloads (a
            // compressed frame) from the scan.
            return failed(
                StatusCode::BAD_GATEWAY,
                "websocket_extension",
                "bottle: the upstream agreed to a WebSocket extension that was not offered",
            );
        }
        let upstream_side = hyper::upgrade::on(&mut response);
        let guard = AuditGuard::new(self.audit.clone(), rec, start, up.clone(), finding.clone());
        let relay = websocket::relay::Relay {
            scanner: self.scanner.clone(),
            redacting,
            findings: finding,
            up,
            down: guard.down(),
            max_message: self.limits.websocket_max_message_bytes,
            idle: Duration::from_millis(self.limits.idle_timeout_ms),
        };
        tokio::spawn(async move {
            let _guard = guard;
            match tokio::try_join!(agent_side, upstream_side) {
                Ok((agent, upstream)) => {
                    relay.run(TokioIo::new(agent), TokioIo::new(upstream)).await
                }
                Err(e) => crate::log!("proxy: a WebSocket did not switch: {e}"),
            }
        });
        let (mut parts, _) = response.into_parts();
        parts.extensions = http::Extensions::new();
        websocket::set_upgrade_headers(&mut parts.headers);
        Response::from_parts(parts, crate::body::empty())
    }
}

fn secret_in_name_message(f: &Finding) -> String {
    format!(
        "bottle: request blocked: the destination name carries what looks like a credential ({})",
        f.reason()
    )
}

/// One accepted connection's place under `max_connections`, shared by
/// its requests: released when the connection and any tunnel it became
/// have ended.
#[derive(Clone)]
struct ConnectionSlot(#[expect(dead_code, reason = "held, never read")] Arc<OwnedSemaphorePermit>);

/// Answers a CONNECT `200` and hands the connection, once hyper lets go of
/// it, to `serve`; the tunnel keeps the connection's slot.
fn open_tunnel<F, Fut>(req: Request<Incoming>, serve: F) -> Response<BoxBody>
where
    F: FnOnce(TokioIo<hyper::upgrade::Upgraded>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slot = req.extensions().get::<ConnectionSlot>().cloned();
    tokio::spawn(async move {
        let _slot = slot;
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => serve(TokioIo::new(upgraded)).await,
            Err(e) => crate::log!("proxy: CONNECT upgrade failed: {e}"),
        }
    });
    Response::new(boxed(http_body_util::Empty::<Bytes>::new()))
}

fn text(status: StatusCode, message: &str) -> Response<BoxBody> {
    let mut resp = Response::new(full(format!("{message}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
