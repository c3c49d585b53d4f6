//! Host normalisation and the allowlist decision.
//!
//! Every name the agent hands us (CONNECT authority, absolute URI, Host
//! header, SNI) goes through [`normalize_host`] before any rule sees it, so
//! that case, a trailing dot, Unicode look-alikes, punycode, percent-encoding
//! or a non-canonical IPv4 spelling (`127.1`, `0x7f.0.0.1`) can never make a
//! denied host look allowed: the normalised form is also the one the egress
//! daemon resolves and dials.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, PoisonError, RwLock};

use bottle_core::bundle::AGENT_MCP_CONFIG;

use crate::BundleError;

/// A normalised destination host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// A lower-case ASCII (punycode) DNS name without a trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Host {
    /// The form used in URIs and `host:port` authorities (IPv6 bracketed).
    pub fn authority_form(&self) -> String {
        match self {
            Self::Name(n) => n.clone(),
            Self::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            Self::Ip(ip) => ip.to_string(),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why a host string was refused before any rule was consulted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Empty host.
    #[error("empty host")]
    Empty,
    /// Percent-encoding or an IPv6 zone id.
    #[error("percent-encoded host {0:?}")]
    PercentEncoded(String),
    /// Not a valid (IDNA) domain name.
    #[error("invalid host name {0:?}")]
    Invalid(String),
    /// Looks numeric but is not a canonical dotted-quad.
    #[error("ambiguous IP literal {0:?} (write it as a dotted quad)")]
    AmbiguousIp(String),
    /// The authority has no port or a bad port.
    #[error("invalid port in {0:?}")]
    Port(String),
}

/// Normalises a host as written by a client (no port).
pub fn normalize_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if raw.contains('%') {
        return Err(HostError::PercentEncoded(raw.to_string()));
    }
    if let Some(inner) = raw.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(canonical_ip(IpAddr::V6(ip))))
            .map_err(|_| HostError::Invalid(raw.to_string()));
    }
    if let Ok(ip) = raw.parse::<Ipv6Addr>() {
        return Ok(Host::Ip(canonical_ip(IpAddr::V6(ip))));
    }
    let mapped = idna::domain_to_ascii_cow(raw.as_bytes(), idna::AsciiDenyList::URL)
        .map_err(|_| HostError::Invalid(raw.to_string()))?;
    let mut name: &str = &mapped;
    if let Some(stripped) = name.strip_suffix('.') {
        name = stripped;
    }
    if name.is_empty() || name.len() > 253 {
        return Err(HostError::Invalid(raw.to_string()));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(HostError::Invalid(raw.to_string()));
        }
    }
    // WHATWG URL rule: a name whose last label is numeric is an IPv4 address.
    let last = name.rsplit('.').next().unwrap_or(name);
    let numeric = last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") || last == "0";
    if numeric {
        return match name.parse::<Ipv4Addr>() {
            Ok(ip) if ip.to_string() == name => Ok(Host::Ip(IpAddr::V4(ip))),
            _ => Err(HostError::AmbiguousIp(raw.to_string())),
        };
    }
    Ok(Host::Name(name.to_string()))
}

/// IPv4-mapped IPv6 addresses are treated as the IPv4 address they carry, so
/// `[::ffff:127.0.0.1]` is judged like `127.0.0.1`.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Splits `host:port` (or `[v6]:port`, or a bare host when `default_port` is
/// given) and normalises the host.
pub fn parse_authority(raw: &str, default_port: Option<u16>) -> Result<(Host, u16), HostError> {
    let (host, port) = if let Some(rest) = raw.strip_prefix('[') {
        let close = rest
            .find(']')
            .ok_or_else(|| HostError::Invalid(raw.to_string()))?;
        let after = &rest[close + 1..];
        let host = &raw[..close + 2];
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(HostError::Invalid(raw.to_string())),
        }
    } else {
        match raw.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err(HostError::Invalid(raw.to_string())),
            None => (raw, None),
        }
    };
    let port = match port {
        Some(p) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HostError::Port(raw.to_string()));
            }
            match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(HostError::Port(raw.to_string())),
                Ok(n) => n,
            }
        }
        None => default_port.ok_or_else(|| HostError::Port(raw.to_string()))?,
    };
    Ok((normalize_host(host)?, port))
}

#[derive(Debug, Clone)]
enum Matcher {
    Exact(String),
    /// `*.example.com` stored as `.example.com`: subdomains only.
    Suffix(String),
    Ip(IpAddr),
}

/// The outcome of a policy check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed by this rule (as the operator wrote it).
    Allow {
        /// The matching rule.
        rule: String,
    },
    /// Denied.
    Deny(Denial),
}

/// Why a destination was denied, with the message shown to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// Short machine-friendly reason (`host_not_allowed`, `ip_literal`, `port_not_allowed`, ...).
    pub reason: &'static str,
    /// The rule the operator would add to allow it.
    pub rule: String,
    /// The human message (starts with `bottle:`).
    pub message: String,
}

impl Denial {
    /// A denial for an unparseable or ambiguous host.
    pub fn bad_host(err: &HostError) -> Self {
        Self {
            reason: "bad_host",
            rule: String::new(),
            message: format!(
                "bottle: refused: {err}; use a plain host name or a dotted-quad IP address"
            ),
        }
    }
}

fn parse_rule(raw: &str) -> Result<Matcher, BundleError> {
    let bad = |reason: &str| BundleError::Rule {
        rule: raw.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = raw.trim();
    if let Some(suffix) = trimmed.strip_prefix("*.") {
        match normalize_host(suffix) {
            Ok(Host::Name(n)) => Ok(Matcher::Suffix(format!(".{n}"))),
            Ok(Host::Ip(_)) => Err(bad("a suffix rule cannot name an IP address")),
            Err(e) => Err(bad(&e.to_string())),
        }
    } else if trimmed.contains('*') {
        Err(bad("`*` is only allowed as a leading `*.` label"))
    } else {
        match normalize_host(trimmed) {
            Ok(Host::Name(n)) => Ok(Matcher::Exact(n)),
            Ok(Host::Ip(ip)) => Ok(Matcher::Ip(ip)),
            Err(e) => Err(bad(&e.to_string())),
        }
    }
}

fn matches(m: &Matcher, host: &Host) -> bool {
    match (m, host) {
        (Matcher::Exact(r), Host::Name(n)) => r == n,
        (Matcher::Suffix(s), Host::Name(n)) => n.len() > s.len() && n.ends_with(s.as_str()),
        (Matcher::Ip(r), Host::Ip(ip)) => r == ip,
        _ => false,
    }
}

/// Hosts named by rules of the config's `allow` syntax, for what applies
/// to some allowed hosts only (which ones redact secrets).
#[derive(Debug, Clone, Default)]
pub struct HostSet {
    rules: Vec<Matcher>,
}

impl HostSet {
    /// Parses `rules`.
    pub fn new(rules: &[String]) -> Result<Self, BundleError> {
        Ok(Self {
            rules: rules
                .iter()
                .map(|r| parse_rule(r))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether a rule names `host`.
    pub fn contains(&self, host: &Host) -> bool {
        self.rules.iter().any(|m| matches(m, host))
    }
}

/// Rules added while the bundle runs (hosts the operator approved through
/// supervise). Cheap to clone; every clone is the same list, so the proxy
/// and egress see an approval at the same moment, without a restart.
#[derive(Debug, Clone, Default)]
pub struct RuntimeRules {
    rules: Arc<RwLock<Vec<(Matcher, String)>>>,
}

impl RuntimeRules {
    /// Adds `rule` (same syntax as the config's `allow`); returns whether
    /// it was new.
    pub fn allow(&self, rule: &str) -> Result<bool, BundleError> {
        let matcher = parse_rule(rule)?;
        let mut rules = self.rules.write().unwrap_or_else(PoisonError::into_inner);
        if rules.iter().any(|(_, r)| r == rule) {
            return Ok(false);
        }
        rules.push((matcher, rule.to_string()));
        Ok(true)
    }

    /// The rules added so far, in order.
    pub fn rules(&self) -> Vec<String> {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    fn find(&self, host: &Host) -> Option<String> {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(m, _)| matches(m, host))
            .map(|(_, r)| r.clone())
    }

    fn lists_ip(&self, ip: IpAddr) -> bool {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|(m, _)| matches!(m, Matcher::Ip(r) if *r == ip))
    }
}

/// The allowlist: rules plus allowed ports.
#[derive(Debug, Clone)]
pub struct Policy {
    rules: Vec<(Matcher, String)>,
    ports: BTreeSet<u16>,
    runtime: RuntimeRules,
    agent: String,
}

impl Policy {
    /// Builds a policy from the config's `allow` and `ports`.
    pub fn new(allow: &[String], ports: &[u16]) -> Result<Self, BundleError> {
        let mut rules = Vec::with_capacity(allow.len());
        for raw in allow {
            rules.push((parse_rule(raw)?, raw.clone()));
        }
        Ok(Self {
            rules,
            ports: ports.iter().copied().collect(),
            runtime: RuntimeRules::default(),
            agent: String::new(),
        })
    }

    /// Names the bottle's agent in denial messages, so that they say whose
    /// allowlist it is and which manifest section the operator would edit.
    pub fn for_agent(mut self, agent: &str) -> Self {
        self.agent = agent.to_string();
        self
    }

    /// Makes this policy also allow what `runtime` allows (now and later).
    pub fn share_runtime(&mut self, runtime: RuntimeRules) {
        self.runtime = runtime;
    }

    /// Whether `host` is explicitly listed as an IP literal rule.
    pub fn lists_ip(&self, ip: IpAddr) -> bool {
        self.rules
            .iter()
            .any(|(m, _)| matches!(m, Matcher::Ip(r) if *r == ip))
            || self.runtime.lists_ip(ip)
    }

    /// Decides whether the agent may reach `host:port`.
    pub fn check(&self, host: &Host, port: u16) -> Verdict {
        let rule = self
            .rules
            .iter()
            .find(|(m, _)| matches(m, host))
            .map(|(_, r)| r.clone())
            .or_else(|| self.runtime.find(host));
        let Some(rule) = rule else {
            return Verdict::Deny(match host {
                Host::Ip(ip) => Denial {
                    reason: "ip_literal",
                    rule: ip.to_string(),
                    message: format!(
                        "bottle: egress to the IP address {ip} is blocked: it is not in {whose} allowlist; use a host name. {ask} \"{ip}\" to [agents.{section}.egress] allow in bottle.toml.",
                        whose = self.whose(),
                        ask = self.ask_for_host(),
                        section = self.section(),
                    ),
                },
                Host::Name(n) => Denial {
                    reason: "host_not_allowed",
                    rule: n.clone(),
                    message: format!(
                        "bottle: egress to {n} is blocked: it is not in {whose} allowlist. {ask} \"{n}\" to [agents.{section}.egress] allow in bottle.toml.",
                        whose = self.whose(),
                        ask = self.ask_for_host(),
                        section = self.section(),
                    ),
                },
            });
        };
        if !self.ports.contains(&port) {
            return Verdict::Deny(Denial {
                reason: "port_not_allowed",
                rule: port.to_string(),
                message: format!(
                    "bottle: egress to {host} on port {port} is blocked: port {port} is not among {whose} allowed ports, and the request_egress tool opens hosts, not ports. Ask the operator with the notify tool of the bottle's supervise MCP server (configured in {AGENT_MCP_CONFIG}) to add {port} to [agents.{section}.egress] ports in bottle.toml.",
                    whose = self.whose(),
                    section = self.section(),
                ),
            });
        }
        Verdict::Allow { rule }
    }

    /// `agent "claude"'s`, or `the agent's` for a config without a name.
    fn whose(&self) -> String {
        if self.agent.is_empty() {
            "the agent's".into()
        } else {
            format!("agent \"{}\"'s", self.agent)
        }
    }

    /// The manifest section's agent key.
    fn section(&self) -> &str {
        if self.agent.is_empty() {
            "<agent>"
        } else {
            &self.agent
        }
    }

    /// The agent's own way to a host it cannot reach: it cannot edit the
    /// manifest, but it can ask the operator (the sentence ends where the
    /// caller names the rule to add).
    fn ask_for_host(&self) -> String {
        format!(
            "Ask the operator for it with the request_egress tool of the bottle's supervise MCP server (configured in {AGENT_MCP_CONFIG}); the operator approves it with `bottle approve`, or adds"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy::new(
            &[
                "api.example.com".into(),
                "*.cdn.example".into(),
                "192.0.2.7".into(),
                "bücher.example".into(),
            ],
            &[443, 80],
        )
        .unwrap()
    }

    fn allowed(h: &str, port: u16) -> bool {
        match normalize_host(h) {
            Ok(host) => matches!(policy().check(&host, port), Verdict::Allow { .. }),
            Err(_) => false,
        }
    }

    #[test]
    fn exact_suffix_and_ip_rules() {
        assert!(allowed("api.example.com", 443));
        assert!(allowed("API.Example.COM.", 443));
        assert!(!allowed("api.example.com", 22));
        assert!(!allowed("evil.example.com", 443));
        assert!(!allowed("api.example.com.evil", 443));
        assert!(allowed("a.cdn.example", 443));
        assert!(allowed("x.y.cdn.example", 443));
        assert!(
            !allowed("cdn.example", 443),
            "suffix rules match subdomains only"
        );
        assert!(!allowed("evilcdn.example", 443));
        assert!(allowed("192.0.2.7", 443));
        assert!(!allowed("192.0.2.8", 443));
        assert!(allowed("xn--bcher-kva.example", 443));
        assert!(allowed("BÜCHER.example", 443));
    }

    #[test]
    fn tricky_spellings_are_refused_or_canonical() {
        assert_eq!(
            normalize_host("127.1"),
            Err(HostError::AmbiguousIp("127.1".into()))
        );
        assert!(matches!(
            normalize_host("0x7f.0.0.1"),
            Err(HostError::AmbiguousIp(_))
        ));
        assert!(matches!(
            normalize_host("0177.0.0.1"),
            Err(HostError::AmbiguousIp(_))
        ));
        assert!(matches!(
            normalize_host("api%2eexample.com"),
            Err(HostError::PercentEncoded(_))
        ));
        assert!(matches!(
            normalize_host("api.example.com.."),
            Err(HostError::Invalid(_))
        ));
        assert!(matches!(normalize_host("a b"), Err(HostError::Invalid(_))));
        assert!(matches!(
            normalize_host("user@host"),
            Err(HostError::Invalid(_))
        ));
        assert_eq!(
            normalize_host("[::ffff:127.0.0.1]"),
            Ok(Host::Ip("127.0.0.1".parse().unwrap()))
        );
        // Fullwidth letters map onto their ASCII forms (UTS 46), and the
        // mapped name is what gets checked and dialled.
        assert_eq!(
            normalize_host("ａｐｉ.example.com"),
            Ok(Host::Name("api.example.com".into()))
        );
        // Fullwidth digits map to an IP literal, judged as such.
        assert_eq!(
            normalize_host("１９２.0.2.7"),
            Ok(Host::Ip("192.0.2.7".parse().unwrap()))
        );
    }

    #[test]
    fn authorities() {
        assert_eq!(
            parse_authority("Api.Example.com:443", None),
            Ok((Host::Name("api.example.com".into()), 443))
        );
        assert_eq!(
            parse_authority("[::1]:8443", None),
            Ok((Host::Ip("::1".parse().unwrap()), 8443))
        );
        assert_eq!(
            parse_authority("example.com", Some(80)),
            Ok((Host::Name("example.com".into()), 80))
        );
        assert!(parse_authority("example.com", None).is_err());
        assert!(parse_authority("example.com:0", None).is_err());
        assert!(parse_authority("example.com:+443", None).is_err());
        assert!(parse_authority("example.com:65536", None).is_err());
        assert!(parse_authority("::1:443", None).is_err());
    }

    #[test]
    fn runtime_rules_apply_to_every_sharing_policy() {
        let runtime = RuntimeRules::default();
        let mut a = policy();
        let mut b = policy();
        a.share_runtime(runtime.clone());
        b.share_runtime(runtime.clone());
        let host = normalize_host("docs.rs").unwrap();
        assert!(matches!(a.check(&host, 443), Verdict::Deny(_)));
        assert!(runtime.allow("docs.rs").unwrap());
        assert!(!runtime.allow("docs.rs").unwrap(), "added once");
        for p in [&a, &b] {
            assert_eq!(
                p.check(&host, 443),
                Verdict::Allow {
                    rule: "docs.rs".into()
                }
            );
            assert!(
                matches!(p.check(&host, 22), Verdict::Deny(_)),
                "ports still apply"
            );
        }
        assert!(matches!(policy().check(&host, 443), Verdict::Deny(_)));
        assert!(runtime.allow("*.*.bad").is_err());
        assert_eq!(runtime.rules(), ["docs.rs"]);
    }

    fn denial(policy: &Policy, host: &str, port: u16) -> Denial {
        match policy.check(&normalize_host(host).unwrap(), port) {
            Verdict::Deny(d) => d,
            allowed => panic!("{host}:{port} was {allowed:?}"),
        }
    }

    #[test]
    fn denials_name_the_agent_and_its_way_out() {
        let named = policy().for_agent("claude");
        for (host, port) in [
            ("pypi.org", 443),
            ("192.0.2.9", 443),
            ("api.example.com", 22),
        ] {
            let message = denial(&named, host, port).message;
            assert!(message.contains(host), "{message}");
            assert!(message.contains(r#"agent "claude"'s"#), "{message}");
            assert!(message.contains("[agents.claude.egress]"), "{message}");
            assert!(message.contains("request_egress"), "{message}");
            assert!(message.contains(AGENT_MCP_CONFIG), "{message}");
        }
        let message = denial(&policy(), "pypi.org", 443).message;
        assert!(message.contains("the agent's allowlist"), "{message}");
        assert!(message.contains("[agents.<agent>.egress]"), "{message}");
    }

    #[test]
    fn bad_rules_are_refused() {
        assert!(Policy::new(&["*.*.example".into()], &[443]).is_err());
        assert!(Policy::new(&["ex*ample.com".into()], &[443]).is_err());
        assert!(Policy::new(&["*.192.0.2.1".into()], &[443]).is_err());
        assert!(Policy::new(&["127.1".into()], &[443]).is_err());
    }
}
