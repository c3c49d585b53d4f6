//! Egress: the only code in the bottle that dials the internet, called by
//! the proxy in-process.
//!
//! The proxy holds the [`Egress`] value and hands it each request it has
//! scanned, with the destination it checked ([`Destination`]). There is no
//! socket between them, so no other process in the bundle (git-gate's git
//! subprocesses included) can use egress as a credential-injecting relay.
//! Egress does not trust the proxy's checks: it re-checks the allowlist
//! (defence in depth), resolves the name (config `resolve` overrides first,
//! then DNS), refuses to dial an address it must never reach, injects the
//! configured credential (and audits that it did, by the credential's name),
//! and streams the response back with any injected secret masked out. What
//! it refused it audits itself and reports to the proxy as a typed
//! [`Outcome`].
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
//! Here: the request path. `resolve`: the guarded resolver and the address
//! refusal; `credentials`: injection and masking; `upstream`: the client,
//! its TLS roots, and what a failed dial answers; `headers`: the headers
//! that never cross to an upstream.

mod credentials;
mod headers;
mod resolve;
mod upstream;

use std::time::Instant;

use bottle_core::bundle::BundleConfig;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode, Uri};

use self::credentials::Credentials;
pub(crate) use self::headers::strip_hop_by_hop;
pub use self::resolve::{DialRefused, GuardedResolver, ResolveFailed, is_forbidden_address};
pub use self::upstream::upstream_tls;
use self::upstream::{UpstreamClient, classify_upstream_error};
use crate::BundleError;
use crate::allowlist::{Host, Policy, Verdict};
use crate::audit::{AuditLog, AuditRecord, Decision, redact_path};
use crate::body::{BoxBody, full};

/// The scheme of the upstream leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP (absolute-form requests, plain bytes in a tunnel).
    Http,
    /// HTTPS: egress opens its own TLS to the upstream and verifies it.
    Https,
}

impl Scheme {
    /// The URI scheme.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    /// The port a URI leaves out for this scheme.
    fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// Where the proxy asks egress to send a request.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    /// The upstream leg's scheme.
    pub scheme: Scheme,
    /// The host the proxy allowed.
    pub host: &'a Host,
    /// Its port.
    pub port: u16,
}

/// What egress did with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Sent upstream; the response is the upstream's.
    Forwarded,
    /// Answered by egress itself, and audited as `daemon: egress` (unless
    /// the audit log is down, which is why it refused).
    Refused {
        /// The audit decision.
        decision: Decision,
        /// The machine-readable reason.
        reason: &'static str,
        /// The rule that would allow it, or the one that allowed the host.
        rule: String,
    },
}

/// Egress's answer to one request: the response for the agent and what
/// happened, for the proxy's audit line.
#[derive(Debug)]
pub struct Answer {
    /// The response, streaming, with any injected credential masked out.
    pub response: Response<BoxBody>,
    /// Forwarded or refused, and why.
    pub outcome: Outcome,
}

/// What egress saw of a request, for the audit line of its answer.
struct Seen<'a> {
    host: &'a str,
    port: u16,
    method: &'a str,
    path: &'a str,
    start: Instant,
}

/// Everything egress needs, built once at start.
pub struct Egress {
    bottle: String,
    policy: Policy,
    audit: AuditLog,
    client: UpstreamClient,
    /// HTTP/1.1 only, for WebSocket handshakes.
    upgrade_client: UpstreamClient,
    credentials: Credentials,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("bottle", &self.bottle)
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// Builds egress: policy, credentials (read now, so a missing secret
    /// stops the bundle instead of failing later), TLS roots and the
    /// resolver.
    pub fn new(config: &BundleConfig, audit: AuditLog) -> Result<Self, BundleError> {
        let policy = Policy::new(&config.allow, &config.ports)?.for_agent(&config.agent);
        let credentials = Credentials::load(&config.credentials)?;
        let client = upstream::client(config, upstream::Versions::Any)?;
        let upgrade_client = upstream::client(config, upstream::Versions::Http1)?;
        Ok(Self {
            bottle: config.bottle.clone(),
            policy,
            audit,
            client,
            upgrade_client,
            credentials,
        })
    }

    /// Also allows what `rules` allows (operator approvals through
    /// supervise), from now on.
    pub fn share_runtime_rules(&mut self, rules: crate::allowlist::RuntimeRules) {
        self.policy.share_runtime(rules);
    }

    /// Answers a request egress does not forward (`message` is the body the
    /// agent reads) and writes its audit line: every such answer is audited.
    fn refuse(
        &self,
        seen: &Seen<'_>,
        status: StatusCode,
        decision: Decision,
        reason: &'static str,
        rule: String,
        message: String,
    ) -> Answer {
        self.audit.write(AuditRecord {
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
            rule: rule.clone(),
            count: 1,
            truncated: false,
            hosts: Vec::new(),
        });
        Answer {
            response: generated(status, reason, message),
            outcome: Outcome::Refused {
                decision,
                reason,
                rule,
            },
        }
    }

    /// Writes the line of a credential put on a request: which one (its
    /// manifest name) and for which host, never its value. It is written
    /// when egress decides to send it, before the upstream answers: the
    /// request's own line says how that went.
    fn audit_injection(&self, seen: &Seen<'_>, name: &str, rule: &str) {
        self.audit.write(AuditRecord {
            v: crate::audit::AUDIT_VERSION,
            time: bottle_core::time::now_rfc3339_millis(),
            bottle: self.bottle.clone(),
            daemon: "egress".into(),
            decision: Decision::Inject,
            host: seen.host.into(),
            port: seen.port,
            method: seen.method.into(),
            path: redact_path(seen.path),
            status: 0,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            reason: format!("credential:{name}"),
            rule: rule.into(),
            count: 1,
            truncated: false,
            hosts: Vec::new(),
        });
    }

    /// Sends one request the proxy has checked and scanned to `to`, and
    /// returns the upstream's response (or egress's own refusal).
    ///
    /// `parts` are the request as the agent sent it: egress removes the
    /// hop-by-hop headers, sets `Host` and the URI from `to`, and injects
    /// the credential; `body` streams as the proxy's scan lets it.
    pub async fn send(&self, parts: Parts, body: BoxBody, to: Destination<'_>) -> Answer {
        self.dispatch(parts, body, to, false).await
    }

    /// Sends a WebSocket handshake the proxy has checked and scanned to
    /// `to`, over HTTP/1.1 (an upgrade cannot ride HTTP/2), asking to
    /// switch to `websocket`. A `101` answer keeps the upstream's upgrade
    /// handle in its extensions (`hyper::upgrade::on`).
    pub async fn upgrade(&self, parts: Parts, to: Destination<'_>) -> Answer {
        self.dispatch(parts, crate::body::empty(), to, true).await
    }

    async fn dispatch(
        &self,
        mut parts: Parts,
        body: BoxBody,
        to: Destination<'_>,
        websocket: bool,
    ) -> Answer {
        let start = Instant::now();
        let host_s = to.host.to_string();
        let method = parts.method.as_str().to_string();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let seen = Seen {
            host: &host_s,
            port: to.port,
            method: &method,
            path: &pq,
            start,
        };
        if self.audit.is_degraded() {
            // Nothing is let through unaudited.
            return Answer {
                response: generated(
                    StatusCode::SERVICE_UNAVAILABLE,
                    crate::audit::AUDIT_UNAVAILABLE,
                    crate::audit::AUDIT_UNAVAILABLE_MESSAGE.to_string(),
                ),
                outcome: Outcome::Refused {
                    decision: Decision::Error,
                    reason: crate::audit::AUDIT_UNAVAILABLE,
                    rule: String::new(),
                },
            };
        }
        let rule = match self.policy.check(to.host, to.port) {
            Verdict::Allow { rule } => rule,
            Verdict::Deny(d) => {
                return self.refuse(
                    &seen,
                    StatusCode::FORBIDDEN,
                    Decision::Deny,
                    d.reason,
                    d.rule,
                    d.message,
                );
            }
        };
        if to.scheme != Scheme::Https && self.credentials.has(&host_s) {
            // The agent cannot see the credential, but it would decide that
            // it travels in the clear: a credential goes only on a TLS leg
            // whose certificate egress verifies.
            let message = format!(
                "bottle: the bundle adds a credential for {host_s} and sends it only over TLS; use https://{} instead of plain HTTP",
                to.host.authority_form()
            );
            return self.refuse(
                &seen,
                StatusCode::FORBIDDEN,
                Decision::Deny,
                "credential_needs_tls",
                rule,
                message,
            );
        }
        let authority = if to.port == to.scheme.default_port() {
            to.host.authority_form()
        } else {
            format!("{}:{}", to.host.authority_form(), to.port)
        };
        let uri: Uri = match format!("{}://{authority}{pq}", to.scheme.as_str()).parse() {
            Ok(u) => u,
            Err(_) => {
                return self.refuse(
                    &seen,
                    StatusCode::BAD_REQUEST,
                    Decision::Error,
                    "bad_uri",
                    rule,
                    "bottle: request target is not a valid URI".into(),
                );
            }
        };
        strip_hop_by_hop(&mut parts.headers);
        // What hyper's server attached to the agent's request (an upgrade
        // handle, HTTP/2's extended-CONNECT protocol) is not for the
        // upstream's client to act on.
        parts.extensions = http::Extensions::new();
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(header::HOST, v);
        }
        for name in self.credentials.inject(&host_s, &mut parts.headers) {
            self.audit_injection(&seen, name, &rule);
        }
        parts.uri = uri;
        // The upstream connection's ALPN picks HTTP/2 or HTTP/1.1, whatever
        // the agent spoke; an upgrade goes over HTTP/1.1 only.
        parts.version = http::Version::HTTP_11;
        let client = if websocket {
            crate::websocket::set_upgrade_headers(&mut parts.headers);
            &self.upgrade_client
        } else {
            &self.client
        };
        match client.request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let body = self.credentials.mask(&host_s, &mut parts.headers, body);
                Answer {
                    response: Response::from_parts(parts, body),
                    outcome: Outcome::Forwarded,
                }
            }
            Err(e) => {
                let (status, decision, reason, message) = classify_upstream_error(&e, &host_s);
                self.refuse(&seen, status, decision, reason, rule, message)
            }
        }
    }

    /// Names of the credentials injected for `host` (for tests and logs).
    pub fn credential_names(&self, host: &Host) -> Vec<String> {
        self.credentials.names(&host.to_string())
    }
}

/// A response egress makes itself: `message` as plain text, with the TLS
/// failure's reason phrase when `reason` names one.
fn generated(status: StatusCode, reason: &str, message: String) -> Response<BoxBody> {
    let mut resp = Response::new(full(format!("{message}\n")));
    *resp.status_mut() = status;
    if let Some(phrase) = upstream::tls_reason_phrase(reason) {
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(phrase));
    }
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
