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

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bottle_core::bundle::{BundleConfig, BundleCredential};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::BundleError;
use crate::allowlist::{Host, Policy, Verdict, parse_authority};
use crate::audit::{AuditLog, AuditRecord, Decision, redact_path};
use crate::body::{BoxBody, BoxError, ScrubBody, boxed, full};
use crate::io::IdleIo;

/// Header carrying the destination `host:port` from proxy to egress.
pub const TARGET_HEADER: &str = "x-bottle-target";
/// Header carrying the destination scheme (`http` / `https`).
pub const SCHEME_HEADER: &str = "x-bottle-scheme";
/// Set by egress on responses it generated itself (`deny` / `error`).
pub const DECISION_HEADER: &str = "x-bottle-decision";
/// Reason for a generated response.
pub const REASON_HEADER: &str = "x-bottle-reason";
/// Rule for a generated response.
pub const RULE_HEADER: &str = "x-bottle-rule";

/// Hop-by-hop headers, never forwarded in either direction.
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// Removes hop-by-hop headers, including those named in `Connection`, and
/// every `x-bottle-*` header (only the bundle itself may set those).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(*n);
    }
    let internal: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-bottle-"))
        .cloned()
        .collect();
    for n in internal {
        headers.remove(n);
    }
}

/// Whether egress must refuse to dial `ip` when it came from DNS.
pub fn is_forbidden_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let seg = v6.segments();
            // NAT64 (64:ff9b::/96) and IPv4-compatible (::/96) embed an IPv4.
            if (seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0])
                || seg[..6] == [0, 0, 0, 0, 0, 0]
            {
                let o = v6.octets();
                let v4 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
                if forbidden_v4(v4) || seg[..6] == [0, 0, 0, 0, 0, 0] {
                    return true;
                }
            }
            v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (seg[0] & 0xffc0) == 0xfe80 // link-local
                || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (seg[0] & 0xfe00) == 0xfc00 // unique local
                || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_unspecified()
        || o[0] == 0 // 0.0.0.0/8
        || ip.is_loopback()
        || ip.is_link_local() // includes 169.254.169.254
        || ip.is_private()
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // CGNAT 100.64/10 (incl. 100.100.100.200)
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || ip.is_broadcast()
        || ip.is_multicast()
        || o[0] >= 240
}

/// The bundle's own interface addresses (refused like loopback).
fn own_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|sa| {
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// A dial was refused because of where the name resolved.
#[derive(Debug, thiserror::Error)]
#[error(
    "{name} resolves only to addresses egress must not dial ({addrs}); map it with `resolve` or list the IP literal to allow it"
)]
pub struct DialRefused {
    name: String,
    addrs: String,
}

/// The name has no usable address at all.
#[derive(Debug, thiserror::Error)]
#[error("could not resolve {name}: {detail}")]
pub struct ResolveFailed {
    name: String,
    detail: String,
}

type DnsResolver = hickory_resolver::TokioResolver;

/// Resolves upstream names: `resolve` overrides, then DNS, then the
/// forbidden-address filter.
#[derive(Clone)]
pub struct GuardedResolver {
    inner: Arc<ResolverInner>,
}

struct ResolverInner {
    overrides: HashMap<String, Vec<IpAddr>>,
    dns: Result<DnsResolver, String>,
    own: Vec<IpAddr>,
}

impl GuardedResolver {
    fn new(config: &BundleConfig) -> Result<Self, BundleError> {
        let mut overrides = HashMap::new();
        for (name, addrs) in &config.resolve {
            let host =
                crate::allowlist::normalize_host(name).map_err(|e| BundleError::ConfigInvalid {
                    path: "resolve".into(),
                    detail: format!("resolve key {name:?}: {e}"),
                })?;
            let ips = addrs
                .split(',')
                .map(|a| {
                    a.trim()
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<IpAddr>()
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| BundleError::ConfigInvalid {
                    path: "resolve".into(),
                    detail: format!(
                        "resolve value {addrs:?} for {name} is not a list of IP addresses"
                    ),
                })?;
            overrides.insert(host.to_string(), ips);
        }
        let dns = build_dns(&config.nameservers)?;
        Ok(Self {
            inner: Arc::new(ResolverInner {
                overrides,
                dns,
                own: own_addresses(),
            }),
        })
    }

    async fn resolve(&self, name: &str) -> Result<Vec<SocketAddr>, BoxError> {
        if let Some(ips) = self.inner.overrides.get(name) {
            return Ok(ips.iter().map(|ip| SocketAddr::new(*ip, 0)).collect());
        }
        let dns = self.inner.dns.as_ref().map_err(|e| ResolveFailed {
            name: name.to_string(),
            detail: e.clone(),
        })?;
        // A trailing dot makes the lookup absolute: no search domains.
        let lookup = dns
            .lookup_ip(format!("{name}."))
            .await
            .map_err(|e| ResolveFailed {
                name: name.to_string(),
                detail: e.to_string(),
            })?;
        let all: Vec<IpAddr> = lookup.iter().collect();
        let ok: Vec<SocketAddr> = all
            .iter()
            .filter(|ip| !is_forbidden_address(**ip) && !self.inner.own.contains(ip))
            .map(|ip| SocketAddr::new(*ip, 0))
            .collect();
        if ok.is_empty() {
            if all.is_empty() {
                return Err(Box::new(ResolveFailed {
                    name: name.to_string(),
                    detail: "no addresses".into(),
                }));
            }
            return Err(Box::new(DialRefused {
                name: name.to_string(),
                addrs: all
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            }));
        }
        Ok(ok)
    }
}

fn build_dns(nameservers: &[String]) -> Result<Result<DnsResolver, String>, BundleError> {
    use hickory_resolver::config::{NameServerConfig, NameServerConfigGroup, ResolverConfig};
    use hickory_resolver::name_server::TokioConnectionProvider;
    use hickory_resolver::proto::xfer::Protocol;
    if nameservers.is_empty() {
        // Missing /etc/resolv.conf is not fatal: names with `resolve`
        // overrides still work, others fail per request with this message.
        return Ok(DnsResolver::builder_tokio()
            .map(|b| b.build())
            .map_err(|e| format!("no DNS configuration ({e}); fix: give the bundle an /etc/resolv.conf or set nameservers in the bundle config")));
    }
    let mut group = Vec::new();
    for ns in nameservers {
        let addr = ns
            .parse::<SocketAddr>()
            .or_else(|_| ns.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
            .map_err(|_| BundleError::ConfigInvalid {
                path: "nameservers".into(),
                detail: format!("nameserver {ns:?} is not an IP address or ip:port"),
            })?;
        group.push(NameServerConfig::new(addr, Protocol::Udp));
        group.push(NameServerConfig::new(addr, Protocol::Tcp));
    }
    let cfg = ResolverConfig::from_parts(None, vec![], NameServerConfigGroup::from(group));
    Ok(Ok(DnsResolver::builder_with_config(
        cfg,
        TokioConnectionProvider::default(),
    )
    .build()))
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.resolve(name.as_str()).await.map(Vec::into_iter) })
    }
}

/// A credential ready to inject.
#[derive(Debug, Clone)]
struct Injection {
    name: String,
    header: HeaderName,
    value: HeaderValue,
    secret: String,
}

type UpstreamClient = Client<hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>, BoxBody>;

/// Everything the egress daemon needs, built once at start.
pub struct Egress {
    bottle: String,
    policy: Policy,
    audit: AuditLog,
    client: UpstreamClient,
    injections: HashMap<String, Vec<Injection>>,
    scrub: HashMap<String, (Arc<regex::bytes::Regex>, usize)>,
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

fn read_credential(c: &BundleCredential) -> Result<Injection, BundleError> {
    let err = |detail: String| BundleError::Credential {
        name: c.name.clone(),
        path: c.file.clone(),
        detail,
    };
    let raw = std::fs::read_to_string(&c.file).map_err(|e| err(e.to_string()))?;
    let secret = raw.trim_end_matches(['\n', '\r']).to_string();
    if secret.is_empty() {
        return Err(err("the file is empty".into()));
    }
    let header = HeaderName::from_bytes(c.header.as_bytes())
        .map_err(|_| err(format!("{:?} is not a valid header name", c.header)))?;
    let formatted = if c.format.contains("{}") {
        c.format.replace("{}", &secret)
    } else {
        secret.clone()
    };
    let mut value = HeaderValue::from_str(&formatted)
        .map_err(|_| err("the secret is not a valid header value".into()))?;
    value.set_sensitive(true);
    Ok(Injection {
        name: c.name.clone(),
        header,
        value,
        secret,
    })
}

/// Builds the TLS client config: web roots plus the config's extra roots.
pub fn upstream_tls(extra_roots: &[String]) -> Result<rustls::ClientConfig, BundleError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra_roots {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| BundleError::Tls {
                detail: format!("cannot read upstream root {path}: {e}"),
            })?;
        if certs.is_empty() {
            return Err(BundleError::Tls {
                detail: format!("upstream root {path} holds no certificate"),
            });
        }
        for c in certs {
            roots.add(c).map_err(|e| BundleError::Tls {
                detail: format!("upstream root {path}: {e}"),
            })?;
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| BundleError::Tls {
            detail: e.to_string(),
        })
}

impl Egress {
    /// Builds the daemon's state: policy, credentials (read now, so a
    /// missing secret stops the bundle instead of failing later), TLS roots
    /// and the resolver.
    pub fn new(config: &BundleConfig, audit: AuditLog) -> Result<Self, BundleError> {
        let policy = Policy::new(&config.allow, &config.ports)?;
        let mut injections: HashMap<String, Vec<Injection>> = HashMap::new();
        for c in &config.credentials {
            let host =
                crate::allowlist::normalize_host(&c.host).map_err(|e| BundleError::Credential {
                    name: c.name.clone(),
                    path: c.file.clone(),
                    detail: format!("host {:?}: {e}", c.host),
                })?;
            injections
                .entry(host.to_string())
                .or_default()
                .push(read_credential(c)?);
        }
        let mut scrub = HashMap::new();
        for (host, injs) in &injections {
            let pattern = injs
                .iter()
                .map(|i| regex::escape(&i.secret))
                .collect::<Vec<_>>()
                .join("|");
            let re = regex::bytes::Regex::new(&format!("(?-u){pattern}")).map_err(|e| {
                BundleError::Credential {
                    name: host.clone(),
                    path: String::new(),
                    detail: format!("cannot build the masking pattern: {e}"),
                }
            })?;
            let max = injs.iter().map(|i| i.secret.len()).max().unwrap_or(1);
            scrub.insert(host.clone(), (Arc::new(re), max));
        }
        let tls = upstream_tls(&config.upstream_roots)?;
        let resolver = GuardedResolver::new(config)?;
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_millis(
            config.limits.connect_timeout_ms,
        )));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(https);
        Ok(Self {
            bottle: config.bottle.clone(),
            policy,
            audit,
            client,
            injections,
            scrub,
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
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_millis(90_000))
                    .serve_connection(io, svc)
                    .await;
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

    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per audit field; a builder would only add noise"
    )]
    fn audit(
        &self,
        decision: Decision,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
        status: StatusCode,
        reason: &str,
        rule: &str,
        start: Instant,
    ) {
        self.audit.write(&AuditRecord {
            v: crate::audit::AUDIT_VERSION,
            time: crate::audit::now_rfc3339(),
            bottle: self.bottle.clone(),
            daemon: "egress".into(),
            decision,
            host: host.into(),
            port,
            method: method.into(),
            path: redact_path(path),
            status: status.as_u16(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
            reason: reason.into(),
            rule: rule.into(),
        });
    }

    /// Handles one request from the proxy.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<BoxBody> {
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
                self.audit(
                    Decision::Deny,
                    "",
                    0,
                    &method,
                    &pq,
                    StatusCode::BAD_REQUEST,
                    "not_from_proxy",
                    "",
                    start,
                );
                return self.generated(
                    StatusCode::BAD_REQUEST,
                    Decision::Deny,
                    "not_from_proxy",
                    "",
                    msg,
                );
            }
        };
        let host_s = host.to_string();
        let rule = match self.policy.check(&host, port) {
            Verdict::Allow { rule } => rule,
            Verdict::Deny(d) => {
                self.audit(
                    Decision::Deny,
                    &host_s,
                    port,
                    &method,
                    &pq,
                    StatusCode::FORBIDDEN,
                    d.reason,
                    &d.rule,
                    start,
                );
                return self.generated(
                    StatusCode::FORBIDDEN,
                    Decision::Deny,
                    d.reason,
                    &d.rule,
                    d.message,
                );
            }
        };
        let authority = match (scheme.as_str(), port) {
            ("https", 443) | ("http", 80) => host.authority_form(),
            _ => format!("{}:{port}", host.authority_form()),
        };
        let uri: Uri = match format!("{scheme}://{authority}{pq}").parse() {
            Ok(u) => u,
            Err(_) => {
                self.audit(
                    Decision::Error,
                    &host_s,
                    port,
                    &method,
                    &pq,
                    StatusCode::BAD_REQUEST,
                    "bad_uri",
                    &rule,
                    start,
                );
                return self.generated(
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
        let injected = self.injections.get(&host_s);
        if let Some(injs) = injected {
            for inj in injs {
                // The agent's own value is dropped, never merged.
                parts.headers.remove(&inj.header);
                parts.headers.insert(inj.header.clone(), inj.value.clone());
            }
            // Compressed responses would hide an echoed secret from masking.
            parts.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let upstream_req = Request::from_parts(parts, boxed(body));
        match self.client.request(upstream_req).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let body = match self.scrub.get(&host_s) {
                    Some((re, max)) => {
                        for v in parts.headers.values_mut() {
                            let mut bytes = v.as_bytes().to_vec();
                            if crate::body::mask_in_place(re, &mut bytes)
                                && let Ok(nv) = HeaderValue::from_bytes(&bytes)
                            {
                                *v = nv;
                            }
                        }
                        boxed(ScrubBody::new(body, re.clone(), *max))
                    }
                    None => boxed(body),
                };
                Response::from_parts(parts, body)
            }
            Err(e) => {
                let (status, decision, reason, message) = classify_upstream_error(&e, &host_s);
                self.audit(
                    decision, &host_s, port, &method, &pq, status, reason, &rule, start,
                );
                self.generated(status, decision, reason, &rule, message)
            }
        }
    }

    /// Names of the credentials injected for `host` (for tests and logs).
    pub fn credential_names(&self, host: &Host) -> Vec<String> {
        self.injections
            .get(&host.to_string())
            .map(|v| v.iter().map(|i| i.name.clone()).collect())
            .unwrap_or_default()
    }
}

fn classify_upstream_error(
    e: &hyper_util::client::legacy::Error,
    host: &str,
) -> (StatusCode, Decision, &'static str, String) {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<DialRefused>() {
            return (
                StatusCode::FORBIDDEN,
                Decision::Deny,
                "dial_refused",
                format!("bottle: refused: {r}"),
            );
        }
        if let Some(r) = s.downcast_ref::<ResolveFailed>() {
            return (
                StatusCode::BAD_GATEWAY,
                Decision::Error,
                "resolve_failed",
                format!("bottle: {r}"),
            );
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return (
                StatusCode::GATEWAY_TIMEOUT,
                Decision::Error,
                "upstream_timeout",
                format!("bottle: timed out connecting to {host}"),
            );
        }
        src = s.source();
    }
    let mut detail = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        src = s.source();
    }
    (
        StatusCode::BAD_GATEWAY,
        Decision::Error,
        "upstream_error",
        format!("bottle: upstream {host} failed: {detail}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_addresses() {
        for a in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.100.100.200",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(is_forbidden_address(a.parse().unwrap()), "{a}");
        }
        for a in [
            "93.184.216.34",
            "2606:2800:220:1:248:1893:25c8:1946",
            "1.1.1.1",
        ] {
            assert!(!is_forbidden_address(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn egress_listen_must_be_loopback() {
        assert!(check_egress_listen(&"127.0.0.1:9099".parse().unwrap()).is_ok());
        assert!(check_egress_listen(&"[::1]:9099".parse().unwrap()).is_ok());
        let e = check_egress_listen(&"0.0.0.0:9099".parse().unwrap()).unwrap_err();
        use bottle_core::Coded;
        assert_eq!(e.code(), "BOT-B006");
    }

    #[test]
    fn hop_by_hop_and_internal_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("x-bottle-target", HeaderValue::from_static("evil:443"));
        h.insert("proxy-authorization", HeaderValue::from_static("basic x"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }
}
