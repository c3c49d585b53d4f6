//! Resolving upstream names, and refusing the addresses egress must never
//! dial (see the module doc of [`super`] for which and why).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bottle_core::bundle::BundleConfig;
use hyper_util::client::legacy::connect::dns::Name;

use crate::BundleError;
use crate::body::BoxError;

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
    pub(crate) fn new(config: &BundleConfig) -> Result<Self, BundleError> {
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

    /// The addresses egress may dial for `name` (port 0): a TCP relay's
    /// destination is resolved as egress resolves an upstream.
    pub(crate) async fn resolve_host(&self, name: &str) -> Result<Vec<SocketAddr>, BoxError> {
        self.resolve(&name.to_ascii_lowercase()).await
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
}
