//! A CONNECT to a destination the bottle denies, answered inside the tunnel.
//!
//! curl, pip, npm and git never show the body of a refused CONNECT (curl
//! prints only "CONNECT tunnel failed, response 403"), so an agent refused
//! that way learns nothing it can act on. A denied CONNECT is therefore
//! answered `200`; if the client then starts TLS, the proxy completes the
//! handshake itself with a leaf for the requested host minted from the
//! bottle's CA (which the box trusts), and answers the request inside with
//! `403`, the denial as a `text/plain` body and a reason phrase for tools
//! that print only the status line. A client that speaks plain HTTP in the
//! tunnel gets the same answer in plain HTTP.
//!
//! The denied host is never contacted: nothing here resolves a name, dials
//! or talks to egress. One request is answered, then the tunnel closes, so a
//! denied tunnel cannot be held open.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;

use super::{Proxy, secret_in_name_message};
use crate::allowlist::{Denial, Host};
use crate::audit::Decision;
use crate::body::BoxBody;
use crate::io::Prefixed;
use crate::scan::Finding;

/// Longest reason phrase sent (a name is at most 253 bytes; tools print
/// the status line on one terminal line).
const MAX_PHRASE_BYTES: usize = 120;

/// How much of a denied request's body is read (and dropped) before the
/// answer, so that closing the connection does not reset it under a client
/// still sending, which would lose the answer.
const MAX_DRAINED_BODY_BYTES: usize = 1 << 20;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// A denied destination and what every request to it is answered.
#[derive(Debug)]
pub(super) struct DeniedTunnel {
    host: Host,
    port: u16,
    decision: Decision,
    reason: String,
    rule: String,
    message: String,
    phrase: ReasonPhrase,
}

impl DeniedTunnel {
    /// A destination the allowlist does not allow.
    pub(super) fn by_policy(host: Host, port: u16, denial: Denial) -> Self {
        let detail = if denial.reason == "port_not_allowed" {
            format!("port {port} not allowed")
        } else {
            format!("{host} not in allowlist")
        };
        Self {
            phrase: reason_phrase(&detail),
            host,
            port,
            decision: Decision::Deny,
            reason: denial.reason.to_string(),
            rule: denial.rule,
            message: denial.message,
        }
    }

    /// A destination name that itself carries a secret.
    pub(super) fn secret_in_name(host: Host, port: u16, finding: &Finding) -> Self {
        Self {
            phrase: reason_phrase("destination name carries a credential"),
            host,
            port,
            decision: Decision::BlockedSecret,
            reason: finding.reason(),
            rule: String::new(),
            message: secret_in_name_message(finding),
        }
    }
}

/// `Blocked by bottle: <detail>`, kept to printable ASCII and bounded: the
/// detail comes from a name the agent chose.
fn reason_phrase(detail: &str) -> ReasonPhrase {
    let mut phrase = String::from("Blocked by bottle: ");
    for c in detail.chars() {
        if phrase.len() >= MAX_PHRASE_BYTES {
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            phrase.push(c);
        }
    }
    ReasonPhrase::try_from(phrase)
        .unwrap_or_else(|_| ReasonPhrase::from_static(b"Blocked by bottle"))
}

impl Proxy {
    /// Audits the CONNECT as denied (one line, as for any denial) and
    /// answers `200`; the tunnel then carries the denial to the client.
    pub(super) fn open_denied_tunnel(
        self: Arc<Self>,
        req: Request<Incoming>,
        tunnel: DeniedTunnel,
        start: Instant,
    ) -> Response<BoxBody> {
        let mut rec = self.record(
            tunnel.decision,
            &tunnel.host.to_string(),
            tunnel.port,
            "CONNECT",
            "",
            &tunnel.reason,
            &tunnel.rule,
        );
        rec.status = StatusCode::FORBIDDEN.as_u16();
        rec.duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.audit.write(rec);
        if let Some(refusal) = self.refuse_unaudited() {
            return refusal;
        }
        let this = self.clone();
        super::open_tunnel(req, move |io| this.serve_denied(io, tunnel))
    }

    /// TLS with a minted leaf if the client starts it, plain HTTP if not.
    async fn serve_denied(
        self: Arc<Self>,
        mut io: TokioIo<hyper::upgrade::Upgraded>,
        tunnel: DeniedTunnel,
    ) {
        let handshake_limit = Duration::from_millis(self.limits.header_read_timeout_ms);
        let mut first = [0u8; 1];
        let n = match tokio::time::timeout(handshake_limit, io.read(&mut first)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return,
        };
        let io = Prefixed::new(Bytes::copy_from_slice(&first[..n]), io);
        let tunnel = Arc::new(tunnel);
        if first[0] != TLS_HANDSHAKE {
            self.answer_denied(io, tunnel).await;
            return;
        }
        let mut config = match self.minter.server_config(&tunnel.host) {
            Ok(c) => (*c).clone(),
            Err(e) => {
                crate::log!("proxy: {e}");
                return;
            }
        };
        // The answer is HTTP/1.1 whatever allowed tunnels offer.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        if let Ok(Ok(tls)) = tokio::time::timeout(handshake_limit, acceptor.accept(io)).await {
            self.answer_denied(tls, tunnel).await;
        }
    }

    /// Serves one request on `io` with the denial, then closes.
    async fn answer_denied<I>(self: Arc<Self>, io: I, tunnel: Arc<DeniedTunnel>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let this = self.clone();
        let svc = hyper::service::service_fn(move |req| {
            let this = this.clone();
            let tunnel = tunnel.clone();
            async move { Ok::<_, std::convert::Infallible>(this.denied_request(req, &tunnel).await) }
        });
        let mut http1 = self.http1();
        http1.keep_alive(false);
        let _ = http1.serve_connection(TokioIo::new(io), svc).await;
    }

    /// The `403` for one request inside a denied tunnel, with its own audit
    /// line: its method and path show the operator what the agent tried.
    async fn denied_request(
        &self,
        req: Request<Incoming>,
        tunnel: &DeniedTunnel,
    ) -> Response<BoxBody> {
        if let Some(refusal) = self.refuse_unaudited() {
            return refusal;
        }
        let start = Instant::now();
        let method = req.method().as_str().to_string();
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let _ = http_body_util::Limited::new(req.into_body(), MAX_DRAINED_BODY_BYTES)
            .collect()
            .await;
        let rec = self.record(
            tunnel.decision,
            &tunnel.host.to_string(),
            tunnel.port,
            &method,
            &pq,
            &tunnel.reason,
            &tunnel.rule,
        );
        let mut resp = self.refuse(StatusCode::FORBIDDEN, rec, start, &tunnel.message);
        resp.extensions_mut().insert(tunnel.phrase.clone());
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_phrase_is_bounded_printable_ascii() {
        let phrase = reason_phrase(&format!("{}\r\n\u{7}é{}", "a".repeat(20), "b".repeat(300)));
        let bytes = phrase.as_bytes();
        assert!(bytes.starts_with(b"Blocked by bottle: aaaaaaaaaaaaaaaaaaaab"));
        assert_eq!(bytes.len(), MAX_PHRASE_BYTES);
        assert!(bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' '));
    }
}
