//! Egress host rules: what an `egress.allow` entry may say, and whether a
//! host name is matched by one.
//!
//! A rule is an exact host (`api.example.com`), a suffix rule
//! (`*.example.com`, which matches subdomains only, never `example.com`
//! itself) or an IP literal. Names are compared case-insensitively, as DNS
//! does. The proxy and the manifest check share this code so that what the
//! manifest accepts is exactly what the proxy enforces.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A parsed `egress.allow` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostRule {
    /// One host name, lowercased.
    Exact(String),
    /// Every subdomain of this domain (lowercased, without the `*.`).
    Suffix(String),
    /// One IP address.
    Ip(IpAddr),
}

/// Why a string is not a host rule. Each variant carries what a fix needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRuleError {
    /// The empty string.
    Empty,
    /// Leading or trailing whitespace; `trimmed` is the entry without it.
    Spaces {
        /// The entry without the surrounding whitespace.
        trimmed: String,
    },
    /// A URL (`https://host/...`); `host` is the host part, if any.
    Url {
        /// The host the URL names.
        host: Option<String>,
    },
    /// A host followed by a path.
    Path {
        /// The host before the path.
        host: String,
    },
    /// A host followed by a port.
    Port {
        /// The host before the port.
        host: String,
        /// The port as written.
        port: String,
    },
    /// An IPv6 literal in brackets.
    Brackets {
        /// The address without brackets.
        addr: String,
    },
    /// A `*` anywhere but a leading `*.` label.
    Wildcard,
    /// A suffix rule on a top-level domain (`*.com`) or a bare `*`.
    TooBroad,
    /// A wildcard where only one exact host is allowed (credential hosts).
    NotExact,
    /// A leading dot; `domain` is the name without it.
    LeadingDot {
        /// The name without the leading dot.
        domain: String,
    },
    /// A trailing dot; `host` is the name without it.
    TrailingDot {
        /// The name without the trailing dot.
        host: String,
    },
    /// Two dots in a row.
    EmptyLabel,
    /// A label with a character DNS names cannot hold.
    BadChar {
        /// The label.
        label: String,
        /// The offending character.
        ch: char,
    },
    /// A label starting or ending with `-`.
    Hyphen {
        /// The label.
        label: String,
    },
    /// A label longer than 63 characters.
    LongLabel {
        /// The label.
        label: String,
    },
    /// A name longer than 253 characters.
    LongName,
    /// All-digit last label: looks like an IPv4 address but is not one.
    NotAnIp,
}

impl HostRule {
    /// Parses an `egress.allow` entry.
    pub fn parse(rule: &str) -> Result<HostRule, HostRuleError> {
        if rule.is_empty() {
            return Err(HostRuleError::Empty);
        }
        if rule.trim() != rule {
            return Err(HostRuleError::Spaces {
                trimmed: rule.trim().to_string(),
            });
        }
        if rule.contains("://") {
            return Err(HostRuleError::Url {
                host: host_part(rule),
            });
        }
        if let Ok(ip) = rule.parse::<IpAddr>() {
            return Ok(HostRule::Ip(ip));
        }
        if let Some(inner) = rule.strip_prefix('[') {
            if let Some((addr, rest)) = inner.split_once(']')
                && addr.parse::<Ipv6Addr>().is_ok()
            {
                return Err(match rest.strip_prefix(':') {
                    Some(port) if !rest.contains('/') => HostRuleError::Port {
                        host: addr.to_string(),
                        port: port.to_string(),
                    },
                    _ if rest.starts_with('/') => HostRuleError::Path {
                        host: addr.to_string(),
                    },
                    _ => HostRuleError::Brackets {
                        addr: addr.to_string(),
                    },
                });
            }
            return Err(HostRuleError::BadChar {
                label: rule.to_string(),
                ch: '[',
            });
        }
        if let Some((host, _)) = rule.split_once(['/', '?', '#']) {
            return Err(HostRuleError::Path {
                host: strip_port(host).to_string(),
            });
        }
        if let Some((host, port)) = rule.split_once(':')
            && !port.contains(':')
        {
            return Err(HostRuleError::Port {
                host: host.to_string(),
                port: port.to_string(),
            });
        }
        if rule.contains('*') {
            let Some(domain) = rule.strip_prefix("*.") else {
                return Err(if rule == "*" {
                    HostRuleError::TooBroad
                } else {
                    HostRuleError::Wildcard
                });
            };
            if domain.contains('*') {
                return Err(HostRuleError::Wildcard);
            }
            check_name(domain)?;
            if !domain.contains('.') {
                return Err(HostRuleError::TooBroad);
            }
            return Ok(HostRule::Suffix(domain.to_ascii_lowercase()));
        }
        check_name(rule)?;
        Ok(HostRule::Exact(rule.to_ascii_lowercase()))
    }

    /// Parses a host that must be exactly one host (a name or an IP
    /// literal), as credential hosts are.
    pub fn parse_exact(host: &str) -> Result<HostRule, HostRuleError> {
        match HostRule::parse(host)? {
            HostRule::Suffix(_) => Err(HostRuleError::NotExact),
            rule => Ok(rule),
        }
    }

    /// Whether a request to `host` (a name or an IP literal, as the client
    /// sent it) is allowed by this rule.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        match self {
            HostRule::Exact(name) => host.eq_ignore_ascii_case(name),
            HostRule::Suffix(domain) => {
                host.len() > domain.len() + 1
                    && host
                        .get(host.len() - domain.len() - 1..)
                        .is_some_and(|tail| {
                            tail.starts_with('.') && tail[1..].eq_ignore_ascii_case(domain)
                        })
            }
            HostRule::Ip(ip) => {
                let bare = host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(host);
                bare.parse::<IpAddr>().is_ok_and(|addr| addr == *ip)
            }
        }
    }

    /// Whether this rule lets through everything `other` does (used to check
    /// that a credential's host is on the allowlist).
    pub fn covers(&self, other: &HostRule) -> bool {
        match other {
            HostRule::Exact(name) => self.matches(name),
            HostRule::Ip(ip) => self == &HostRule::Ip(*ip),
            HostRule::Suffix(domain) => match self {
                HostRule::Suffix(mine) => {
                    domain == mine || HostRule::Suffix(mine.clone()).matches(domain)
                }
                _ => false,
            },
        }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRule::Exact(name) => f.write_str(name),
            HostRule::Suffix(domain) => write!(f, "*.{domain}"),
            HostRule::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Checks a DNS name made of dot-separated labels.
fn check_name(name: &str) -> Result<(), HostRuleError> {
    if let Some(domain) = name.strip_prefix('.') {
        return Err(HostRuleError::LeadingDot {
            domain: domain.to_string(),
        });
    }
    if let Some(host) = name.strip_suffix('.') {
        return Err(HostRuleError::TrailingDot {
            host: host.to_string(),
        });
    }
    if name.len() > 253 {
        return Err(HostRuleError::LongName);
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostRuleError::EmptyLabel);
        }
        if let Some(ch) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(HostRuleError::BadChar {
                label: label.to_string(),
                ch,
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostRuleError::Hyphen {
                label: label.to_string(),
            });
        }
        if label.len() > 63 {
            return Err(HostRuleError::LongLabel {
                label: label.to_string(),
            });
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(HostRuleError::NotAnIp);
    }
    Ok(())
}

/// The host part of something URL-like, for a "write just the host" fix.
fn host_part(text: &str) -> Option<String> {
    let rest = text.split_once("://").map_or(text, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(inner) = host_port.strip_prefix('[') {
        inner.split(']').next().unwrap_or("")
    } else {
        strip_port(host_port)
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// `host:port` → `host`, leaving IPv6 literals alone.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(rule: &str) -> HostRule {
        HostRule::parse(rule).unwrap()
    }

    fn err(rule: &str) -> HostRuleError {
        HostRule::parse(rule).unwrap_err()
    }

    #[test]
    fn accepts_hosts_suffixes_and_ips() {
        assert_eq!(
            ok("API.Example.com"),
            HostRule::Exact("api.example.com".into())
        );
        assert_eq!(ok("localhost"), HostRule::Exact("localhost".into()));
        assert_eq!(ok("*.co.uk"), HostRule::Suffix("co.uk".into()));
        assert_eq!(ok("192.0.2.7"), HostRule::Ip("192.0.2.7".parse().unwrap()));
        assert_eq!(
            ok("2001:db8::1"),
            HostRule::Ip("2001:db8::1".parse().unwrap())
        );
        assert_eq!(
            ok("xn--bcher-kva.example").to_string(),
            "xn--bcher-kva.example"
        );
    }

    #[test]
    fn refuses_urls_paths_ports_and_bad_wildcards() {
        assert_eq!(
            err("https://user@api.example.com:8443/v1"),
            HostRuleError::Url {
                host: Some("api.example.com".into())
            }
        );
        assert_eq!(
            err("api.example.com/v1"),
            HostRuleError::Path {
                host: "api.example.com".into()
            }
        );
        assert_eq!(
            err("api.example.com:8443"),
            HostRuleError::Port {
                host: "api.example.com".into(),
                port: "8443".into()
            }
        );
        assert_eq!(
            err("[2001:db8::1]:443"),
            HostRuleError::Port {
                host: "2001:db8::1".into(),
                port: "443".into()
            }
        );
        assert_eq!(err("[::1]"), HostRuleError::Brackets { addr: "::1".into() });
        assert_eq!(err("*.com"), HostRuleError::TooBroad);
        assert_eq!(err("*"), HostRuleError::TooBroad);
        assert_eq!(err("api.*.com"), HostRuleError::Wildcard);
        assert_eq!(err("*api.example.com"), HostRuleError::Wildcard);
        assert_eq!(err("*.*.example.com"), HostRuleError::Wildcard);
    }

    #[test]
    fn refuses_invalid_names() {
        assert_eq!(err(""), HostRuleError::Empty);
        assert!(matches!(err(" a.com"), HostRuleError::Spaces { .. }));
        assert!(matches!(
            err("a_b.com"),
            HostRuleError::BadChar { ch: '_', .. }
        ));
        assert!(matches!(err("-a.com"), HostRuleError::Hyphen { .. }));
        assert!(matches!(err(".a.com"), HostRuleError::LeadingDot { .. }));
        assert!(matches!(err("a.com."), HostRuleError::TrailingDot { .. }));
        assert_eq!(err("a..com"), HostRuleError::EmptyLabel);
        assert_eq!(err("1.2.3.999"), HostRuleError::NotAnIp);
        assert!(matches!(
            err(&format!("{}.com", "a".repeat(64))),
            HostRuleError::LongLabel { .. }
        ));
        assert_eq!(
            err(&format!("{}com", "abcdefghi.".repeat(26))),
            HostRuleError::LongName
        );
    }

    #[test]
    fn matching() {
        let suffix = ok("*.example.com");
        assert!(suffix.matches("api.example.com"));
        assert!(suffix.matches("a.b.EXAMPLE.com"));
        assert!(!suffix.matches("example.com"));
        assert!(!suffix.matches("badexample.com"));
        assert!(ok("api.example.com").matches("API.example.com."));
        assert!(!ok("api.example.com").matches("x.api.example.com"));
        assert!(ok("2001:db8::1").matches("[2001:db8:0::1]"));
        assert!(!ok("192.0.2.1").matches("192.0.2.2"));
    }

    #[test]
    fn coverage_of_rules() {
        assert!(ok("*.example.com").covers(&ok("api.example.com")));
        assert!(ok("*.example.com").covers(&ok("*.api.example.com")));
        assert!(!ok("api.example.com").covers(&ok("*.example.com")));
        assert!(!ok("*.example.com").covers(&ok("example.com")));
        assert_eq!(
            HostRule::parse_exact("*.example.com"),
            Err(HostRuleError::NotExact)
        );
    }
}
