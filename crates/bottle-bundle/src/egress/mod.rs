//! The egress daemon: the proxy's internal upstream and the only code in the
//! bottle that dials the internet.
//!
//! It listens on loopback only (it refuses any other address), takes each
//! already-decrypted request from the proxy with its destination in
//! [`TARGET_HEADER`] / [`SCHEME_HEADER`], re-checks the allowlist (defence in
//! depth), resolves the name (config `resolve` overrides first, then DNS),
//! refuses to dial an address it must never reach, injects the configured
//! credential, and streams the response back with any injected secret
//! masked out.
//!
//! **Which addresses are refused.** Loopback, unspecified, link-local (cloud
//! metadata at 169.254.169.254 included), private (RFC 1918, CGNAT, IPv6
//! ULA), multicast/reserved, and every address of the bundle's own
//! interfaces. The check runs on the *resolved* addresses, so a name that
//! resolves (or re-resolves, DNS rebinding) to one of them is refused. Two
//! sources are operator-chosen and therefore exempt: an IP literal listed
//! verbatim in `allow`, and an address given for a name in the config's
//! `resolve` map (the operator wrote that mapping; the agent cannot). Tests
//! use exactly that second path to reach servers on 127.0.0.1.
//!
//! Here: the daemon and its request service. `resolve`: the guarded
//! resolver and the address refusal; `credentials`: injection and masking;
//! `upstream`: the client, its TLS roots, and what a failed dial answers;
//! `headers`: the headers of the proxy-to-egress hop.

mod credentials;
mod headers;
mod resolve;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bottle_core::bundle::BundleConfig;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use self::credentials::Credentials;
pub(crate) use self::headers::strip_hop_by_hop;
pub use self::headers::{
    DECISION_HEADER, REASON_HEADER, RULE_HEADER, SCHEME_HEADER, TARGET_HEADER,
};
pub use self::resolve::{DialRefused, GuardedResolver, ResolveFailed, is_forbidden_address};
pub use self::upstream::upstream_tls;
use self::upstream::{UpstreamClient, classify_upstream_error};
use crate::BundleError;
use crate::allowlist::{Host, Policy, Verdict, parse_authority};
use crate::audit::{AuditLog, AuditRecord, Decision, redact_path};
use crate::body::{BoxBody, boxed, full};
use crate::io::IdleIo;
use crate::proxy::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};

/// What egress saw of a request, for the audit line of its answer.
struct Seen<'a> {
    host: &'a str,
    port: u16,
    method: &'a str,
    path: &'a str,
    start: Instant,
}

/// Everything the egress daemon needs, built once at start.
pub struct Egress {
    bottle: String,
    policy: Policy,
    audit: AuditLog,
    client: UpstreamClient,
    credentials: Credentials,
    limits: bottle_core::bundle::BundleLimits,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("bottle", &self.bottle)
            .finish_non_exhaustive()
    }
}

/// Checks that egress may listen on `addr` (loopback only).
pub fn check_egress_listen(addr: &SocketAddr) -> Result<(), BundleError> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(BundleError::EgressNotLoopback {
            addr: addr.to_string(),
        })
    }
}

impl Egress {
    /// Builds the daemon's state: policy, credentials (read now, so a
    /// missing secret stops the bundle instead of failing later), TLS roots
    /// and the resolver.
    pub fn new(config: &BundleConfig, audit: AuditLog) -> Result<Self, BundleError> {
        let policy = Policy::new(&config.allow, &config.ports)?.for_agent(&config.agent);
        let credentials = Credentials::load(&config.credentials)?;
        let client = upstream::client(config)?;
        Ok(Self {
            bottle: config.bottle.clone(),
            policy,
            audit,
            client,
            credentials,
            limits: config.limits.clone(),
        })
    }

    /// Also allows what `rules` allows (operator approvals through
    /// supervise), from now on.
    pub fn share_runtime_rules(&mut self, rules: crate::allowlist::RuntimeRules) {
        self.policy.share_runtime(rules);
    }

    /// Serves connections from `listener` until it fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<(), BundleError> {
        let local = listener.local_addr().map_err(|e| BundleError::Daemon {
            daemon: "egress".into(),
            detail: e.to_string(),
        })?;
        check_egress_listen(&local)?;
        let slots = Arc::new(Semaphore::new(self.limits.max_connections.max(1)));
        loop {
            let (stream, peer, permit) =
                crate::accept::next_connection(&listener, &slots, "egress").await?;
            if !peer.ip().is_loopback() {
                continue;
            }
            let this = self.clone();
            tokio::spawn(async move {
                let io = TokioIo::new(IdleIo::new(
                    stream,
                    Duration::from_millis(this.limits.idle_timeout_ms),
                ));
                let svc = hyper::service::service_fn(move |req| {
                    let this = this.clone();
                    async move { Ok::<_, std::convert::Infallible>(this.handle(req).await) }
                });
                // The proxy sends HTTP/1.1, or HTTP/2 with prior knowledge
                // for the requests the agent made over HTTP/2.
                let mut server = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                server
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_millis(90_000));
                server
                    .http2()
                    .timer(TokioTimer::new())
                    .initial_stream_window_size(H2_STREAM_WINDOW)
                    .initial_connection_window_size(H2_CONNECTION_WINDOW);
                let _ = server.serve_connection(io, svc).await;
                drop(permit);
            });
        }
    }

    fn generated(
        &self,
        status: StatusCode,
        decision: Decision,
        reason: &str,
        rule: &str,
        message: String,
    ) -> Response<BoxBody> {
        let mut resp = Response::new(full(format!("{message}\n")));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let dec = match decision {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
            Decision::BlockedSecret => "blocked_secret",
            Decision::Error => "error",
        };
        h.insert(DECISION_HEADER, HeaderValue::from_static(dec));
        if let Ok(v) = HeaderValue::from_str(reason) {
            h.insert(REASON_HEADER, v);
        }
        if let Ok(v) = HeaderValue::from_str(rule) {
            h.insert(RULE_HEADER, v);
        }
        resp
    }

    /// Answers a request egress does not forward (`message` is the body the
    /// agent reads) and writes its audit line: every such answer is audited.
    fn refuse(
        &self,
        seen: &Seen<'_>,
        status: StatusCode,
        decision: Decision,
        reason: &str,
        rule: &str,
        message: String,
    ) -> Response<BoxBody> {
        self.audit.write(&AuditRecord {
            v: crate::audit::AUDIT_VERSION,
            time: bottle_core::time::now_rfc3339_millis(),
            bottle: self.bottle.clone(),
            daemon: "egress".into(),
            decision,
            host: seen.host.into(),
            port: seen.port,
            method: seen.method.into(),
            path: redact_path(seen.path),
            status: status.as_u16(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: u64::try_from(seen.start.elapsed().as_millis()).unwrap_or(u64::MAX),
            reason: reason.into(),
            rule: rule.into(),
            count: 1,
            truncated: false,
        });
        self.generated(status, decision, reason, rule, message)
    }

    /// Handles one request from the proxy.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<BoxBody> {
        if self.audit.is_degraded() {
            // Nothing is let through unaudited.
            return self.generated(
                StatusCode::SERVICE_UNAVAILABLE,
                Decision::Error,
                crate::audit::AUDIT_UNAVAILABLE,
                "",
                crate::audit::AUDIT_UNAVAILABLE_MESSAGE.to_string(),
            );
        }
        let start = Instant::now();
        let method = req.method().to_string();
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let target = req
            .headers()
            .get(TARGET_HEADER)
            .and_then(|v| v.to_str().ok());
        let scheme = req
            .headers()
            .get(SCHEME_HEADER)
            .and_then(|v| v.to_str().ok());
        let (host, port, scheme) = match (target.map(|t| parse_authority(t, None)), scheme) {
            (Some(Ok((h, p))), Some(s @ ("http" | "https"))) => (h, p, s.to_string()),
            _ => {
                let msg = "bottle: egress takes requests from the bottle proxy only".to_string();
                return self.refuse(
                    &Seen {
                        host: "",
                        port: 0,
                        method: &method,
                        path: &pq,
                        start,
                    },
                    StatusCode::BAD_REQUEST,
                    Decision::Deny,
                    "not_from_proxy",
                    "",
                    msg,
                );
            }
        };
        let host_s = host.to_string();
        let seen = Seen {
            host: &host_s,
            port,
            method: &method,
            path: &pq,
            start,
        };
        let rule = match self.policy.check(&host, port) {
            Verdict::Allow { rule } => rule,
            Verdict::Deny(d) => {
                return self.refuse(
                    &seen,
                    StatusCode::FORBIDDEN,
                    Decision::Deny,
                    d.reason,
                    &d.rule,
                    d.message,
                );
            }
        };
        if scheme != "https" && self.credentials.has(&host_s) {
            // The agent cannot see the credential, but it would decide that
            // it travels in the clear: a credential goes only on a TLS leg
            // whose certificate egress verifies.
            return self.refuse(
                &seen,
                StatusCode::FORBIDDEN,
                Decision::Deny,
                "credential_needs_tls",
                &rule,
                format!(
                    "bottle: the bundle adds a credential for {host_s} and sends it only over TLS; use https://{} instead of plain HTTP",
                    host.authority_form()
                ),
            );
        }
        let authority = match (scheme.as_str(), port) {
            ("https", 443) | ("http", 80) => host.authority_form(),
            _ => format!("{}:{port}", host.authority_form()),
        };
        let uri: Uri = match format!("{scheme}://{authority}{pq}").parse() {
            Ok(u) => u,
            Err(_) => {
                return self.refuse(
                    &seen,
                    StatusCode::BAD_REQUEST,
                    Decision::Error,
                    "bad_uri",
                    &rule,
                    "bottle: request target is not a valid URI".into(),
                );
            }
        };
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(header::HOST, v);
        }
        self.credentials.inject(&host_s, &mut parts.headers);
        parts.uri = uri;
        // The upstream connection's ALPN picks HTTP/2 or HTTP/1.1, whatever
        // the hop spoke.
        parts.version = http::Version::HTTP_11;
        let upstream_req = Request::from_parts(parts, boxed(body));
        match self.client.request(upstream_req).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let body = self.credentials.mask(&host_s, &mut parts.headers, body);
                Response::from_parts(parts, body)
            }
            Err(e) => {
                let (status, decision, reason, message) = classify_upstream_error(&e, &host_s);
                self.refuse(&seen, status, decision, reason, &rule, message)
            }
        }
    }

    /// Names of the credentials injected for `host` (for tests and logs).
    pub fn credential_names(&self, host: &Host) -> Vec<String> {
        self.credentials.names(&host.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_listen_must_be_loopback() {
        assert!(check_egress_listen(&"127.0.0.1:9099".parse().unwrap()).is_ok());
        assert!(check_egress_listen(&"[::1]:9099".parse().unwrap()).is_ok());
        let e = check_egress_listen(&"0.0.0.0:9099".parse().unwrap()).unwrap_err();
        use bottle_core::Coded;
        assert_eq!(e.code(), "BOT-B006");
    }
}
