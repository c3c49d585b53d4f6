//! What the manifest's TCP endpoints say: a published port (`publish`), a
//! service on the host's loopback (`egress.host_services`) and a pinned
//! remote TCP destination (`egress.tcp`).
//!
//! The validator reports what is wrong with an entry; a loaded manifest's
//! entries all parse, so the plan reads them with the same functions.

use std::fmt;
use std::net::IpAddr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::host::{HostRule, HostRuleError};

/// The name at which the agent reaches the host's services: the box's
/// `/etc/hosts` points it at the bundle, whose relay for each service
/// listens on the service's port.
pub const HOST_SERVICES_NAME: &str = "host.bottle.internal";

/// One `publish` entry as written: a port number, or a string
/// `"PORT:HOST_PORT"` (or `"PORT"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishEntry {
    /// `8000`: the agent's port 8000 on the host's loopback port 8000.
    Number(i64),
    /// `"3000:13000"`: the agent's port 3000 on the host's port 13000.
    Text(String),
}

impl fmt::Display for PublishEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishEntry::Number(n) => write!(f, "{n}"),
            PublishEntry::Text(text) => write!(f, "{text:?}"),
        }
    }
}

impl Serialize for PublishEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PublishEntry::Number(n) => serializer.serialize_i64(*n),
            PublishEntry::Text(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for PublishEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl Visitor<'_> for EntryVisitor {
            type Value = PublishEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number or a string \"PORT:HOST_PORT\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PublishEntry, E> {
                Ok(PublishEntry::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PublishEntry, E> {
                Ok(PublishEntry::Number(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PublishEntry, E> {
                Ok(PublishEntry::Text(v.to_string()))
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}

/// A published port: the agent's `port`, listened for on the host's
/// loopback at `host_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Published {
    /// The port inside the box.
    pub port: u16,
    /// The port on the host's `127.0.0.1` (0: any free port, from `bottle
    /// port` only).
    pub host_port: u16,
}

impl fmt::Display for Published {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.port, self.host_port)
    }
}

/// What is wrong with a `publish` entry or a `bottle port` argument; the
/// text reads after the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// A number that is not a port (0, negative, above 65535).
    NotAPort(String),
    /// An address before the ports: published ports listen on loopback.
    Address,
    /// Anything else.
    Syntax,
}

impl PublishError {
    /// What is wrong, after the entry as written.
    pub fn problem(&self) -> String {
        match self {
            PublishError::NotAPort(port) => format!("names {port}, not a port from 1 to 65535"),
            PublishError::Address => {
                "names an address; a published port listens on the host's 127.0.0.1 only".into()
            }
            PublishError::Syntax => "is not PORT or \"PORT:HOST_PORT\"".into(),
        }
    }
}

/// Parses a port from 1 to 65535.
fn port(text: &str) -> Result<u16, PublishError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PublishError::Syntax);
    }
    match text.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(PublishError::NotAPort(text.to_string())),
    }
}

impl Published {
    /// Parses `PORT` or `PORT:HOST_PORT`; `any_host_port` lets HOST_PORT
    /// be 0 (any free port, which `bottle port` prints).
    pub fn parse(text: &str, any_host_port: bool) -> Result<Published, PublishError> {
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            [one] => {
                let port = port(one)?;
                Ok(Published {
                    port,
                    host_port: port,
                })
            }
            // `127.0.0.1:8000`: an address and one port.
            [agent, _] if agent_looks_like_address(agent) => Err(PublishError::Address),
            [agent, host] => Ok(Published {
                port: port(agent)?,
                host_port: port_or_zero(host, any_host_port)?,
            }),
            _ if text.contains('.') || text.contains('[') => Err(PublishError::Address),
            _ => Err(PublishError::Syntax),
        }
    }

    /// Reads a manifest entry.
    pub fn from_entry(entry: &PublishEntry) -> Result<Published, PublishError> {
        match entry {
            PublishEntry::Number(n) => match u16::try_from(*n) {
                Ok(port) if port != 0 => Ok(Published {
                    port,
                    host_port: port,
                }),
                _ => Err(PublishError::NotAPort(n.to_string())),
            },
            PublishEntry::Text(text) => Published::parse(text, false),
        }
    }
}

fn port_or_zero(text: &str, zero: bool) -> Result<u16, PublishError> {
    if zero && text == "0" {
        return Ok(0);
    }
    port(text)
}

fn agent_looks_like_address(text: &str) -> bool {
    text.contains('.') || text.eq_ignore_ascii_case("localhost")
}

/// A `HOST:PORT` entry split, the host without IPv6 brackets; `None` when
/// there is no port.
fn split_host_port(text: &str) -> Option<(&str, &str)> {
    if let Some(inner) = text.strip_prefix('[') {
        let (host, rest) = inner.split_once(']')?;
        return Some((host, rest.strip_prefix(':')?));
    }
    let (host, port) = text.rsplit_once(':')?;
    // A bare IPv6 address has colons of its own.
    (!host.contains(':')).then_some((host, port))
}

/// Whether `host` (a name or an IP literal, without brackets) is a
/// loopback host: an address in `127.0.0.0/8` or `::1` (mapped ones too),
/// `localhost`, or a name under `.localhost` (RFC 6761 sends every one of
/// them to loopback).
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        };
    }
    let lower = host.to_ascii_lowercase();
    lower == "localhost" || lower.ends_with(".localhost")
}

/// A service on the host's loopback the agent may reach
/// (`egress.host_services`), at [`HOST_SERVICES_NAME`] and the same port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostService {
    /// The host as written: an address in `127.0.0.0/8`, `::1`, or
    /// `localhost`.
    pub host: String,
    /// The service's port on the host, which is also the port the agent
    /// dials.
    pub port: u16,
}

/// What is wrong with an `egress.host_services` or `egress.tcp` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointError {
    /// No `:PORT`.
    NoPort,
    /// A port that is not 1 to 65535.
    BadPort(String),
    /// A host service that is not on the host's loopback.
    NotLoopback(String),
    /// A TCP destination on the loopback: that is a host service.
    Loopback(String),
    /// A TCP destination given as an IP address: the agent needs a name.
    Address(String),
    /// A host that is not a host rule.
    Host(HostRuleError),
}

impl HostService {
    /// Parses `127.0.0.1:5432`, `localhost:11434` or `[::1]:8080`.
    pub fn parse(text: &str) -> Result<HostService, EndpointError> {
        let (host, port_text) = split_host_port(text).ok_or(EndpointError::NoPort)?;
        if !is_loopback_host(host) || host.to_ascii_lowercase().ends_with(".localhost") {
            return Err(EndpointError::NotLoopback(host.to_string()));
        }
        let port = endpoint_port(port_text)?;
        Ok(HostService {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// `host:port` for audit lines and the plan, brackets around IPv6.
    pub fn address(&self) -> String {
        join_host_port(&self.host, self.port)
    }
}

/// A pinned remote TCP destination (`egress.tcp`): the bundle resolves
/// `host` and dials exactly it at `port`; the agent reaches it at the same
/// name and port, which the box's `/etc/hosts` points at the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TcpDestination {
    /// The host name, lowercased.
    pub host: String,
    /// The destination's port, which is also the port the agent dials.
    pub port: u16,
}

impl TcpDestination {
    /// Parses `git.example.com:22`.
    pub fn parse(text: &str) -> Result<TcpDestination, EndpointError> {
        let (host, port_text) = split_host_port(text).ok_or(EndpointError::NoPort)?;
        if is_loopback_host(host) {
            return Err(EndpointError::Loopback(host.to_string()));
        }
        if host.parse::<IpAddr>().is_ok() {
            return Err(EndpointError::Address(host.to_string()));
        }
        let rule = HostRule::parse_exact(host).map_err(EndpointError::Host)?;
        let port = endpoint_port(port_text)?;
        match rule {
            HostRule::Exact(host) => Ok(TcpDestination { host, port }),
            // parse_exact gives no suffix, and IP literals were refused.
            _ => Err(EndpointError::Host(HostRuleError::NotExact)),
        }
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        join_host_port(&self.host, self.port)
    }
}

fn endpoint_port(text: &str) -> Result<u16, EndpointError> {
    match text.parse::<u16>() {
        Ok(port) if port != 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(port),
        _ => Err(EndpointError::BadPort(text.to_string())),
    }
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(port: u16, host_port: u16) -> Published {
        Published { port, host_port }
    }

    #[test]
    fn publish_entries() {
        assert_eq!(Published::parse("8000", false), Ok(published(8000, 8000)));
        assert_eq!(
            Published::parse("3000:13000", false),
            Ok(published(3000, 13000))
        );
        assert_eq!(
            Published::parse("3000:0", false),
            Err(PublishError::NotAPort("0".into()))
        );
        assert_eq!(Published::parse("3000:0", true), Ok(published(3000, 0)));
        assert_eq!(
            Published::parse("127.0.0.1:8000", false),
            Err(PublishError::Address)
        );
        assert_eq!(
            Published::parse("0.0.0.0:8000:8000", false),
            Err(PublishError::Address)
        );
        assert_eq!(Published::parse("web", false), Err(PublishError::Syntax));
        assert_eq!(Published::parse("1:2:3", false), Err(PublishError::Syntax));
        assert_eq!(
            Published::parse("70000", false),
            Err(PublishError::NotAPort("70000".into()))
        );
        assert_eq!(
            Published::from_entry(&PublishEntry::Number(-1)),
            Err(PublishError::NotAPort("-1".into()))
        );
        assert_eq!(
            Published::from_entry(&PublishEntry::Number(8080)),
            Ok(published(8080, 8080))
        );
    }

    #[test]
    fn loopback_hosts() {
        for host in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "LocalHost",
            "a.localhost",
            "localhost.",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["10.0.0.1", "::2", "localhost.example.com", "example.com"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn host_services() {
        assert_eq!(
            HostService::parse("127.0.0.1:5432"),
            Ok(HostService {
                host: "127.0.0.1".into(),
                port: 5432
            })
        );
        assert_eq!(
            HostService::parse("[::1]:8080").map(|s| s.address()),
            Ok("[::1]:8080".into())
        );
        assert_eq!(
            HostService::parse("LOCALHOST:11434").map(|s| s.address()),
            Ok("localhost:11434".into())
        );
        assert_eq!(HostService::parse("localhost"), Err(EndpointError::NoPort));
        assert_eq!(HostService::parse("::1"), Err(EndpointError::NoPort));
        assert_eq!(
            HostService::parse("10.0.0.5:5432"),
            Err(EndpointError::NotLoopback("10.0.0.5".into()))
        );
        assert_eq!(
            HostService::parse("127.0.0.1:0"),
            Err(EndpointError::BadPort("0".into()))
        );
        assert_eq!(
            HostService::parse("127.0.0.1:+80"),
            Err(EndpointError::BadPort("+80".into()))
        );
    }

    #[test]
    fn tcp_destinations() {
        assert_eq!(
            TcpDestination::parse("Git.Example.com:22"),
            Ok(TcpDestination {
                host: "git.example.com".into(),
                port: 22
            })
        );
        assert_eq!(
            TcpDestination::parse("git.example.com"),
            Err(EndpointError::NoPort)
        );
        assert_eq!(
            TcpDestination::parse("localhost:5432"),
            Err(EndpointError::Loopback("localhost".into()))
        );
        assert_eq!(
            TcpDestination::parse("[::1]:5432"),
            Err(EndpointError::Loopback("::1".into()))
        );
        assert_eq!(
            TcpDestination::parse("203.0.113.5:5432"),
            Err(EndpointError::Address("203.0.113.5".into()))
        );
        assert_eq!(
            TcpDestination::parse("*.example.com:22"),
            Err(EndpointError::Host(HostRuleError::NotExact))
        );
        assert!(matches!(
            TcpDestination::parse("a_b.example.com:22"),
            Err(EndpointError::Host(HostRuleError::BadChar { .. }))
        ));
    }
}
