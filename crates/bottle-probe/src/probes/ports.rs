//! TCP beyond HTTP: the manifest's host service (`egress.host_services`,
//! reached at `host.bottle.internal:<port>` through the bundle's relay) and
//! pinned TCP destination (`egress.tcp`, a name the box's `/etc/hosts`
//! points at the bundle, which resolves and relays it). The two controls
//! go through the relays and must get the canary's token back; every other
//! probe aims at what the relays must not open: the same host name or the
//! bundle on a port the manifest does not name, a second host loopback
//! service, the pinned canary dialled directly or on another port, and
//! another canary host.
//!
//! Names are looked up in `/etc/hosts`, as the box's resolver would (a
//! bottle has no DNS); on the host (the positive control) they are not
//! there, so the controls of the blocked probes dial the canaries'
//! addresses themselves.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::{Attempt, Ctx, Probe, contains, errno_name, snippet};
use crate::contract::HOST_SERVICES_NAME;
use crate::net;

const CAT: &str = "ports";

/// The probes of host services and pinned TCP.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "host-service-control",
            CAT,
            false,
            "the positive control: GET http://host.bottle.internal:<host_service_port>/ (the name from /etc/hosts) through the bundle's relay to the host loopback service the manifest names: must answer with the token",
            |c| {
                let port = c.config.targets.host_service_port;
                if port == 0 {
                    return Attempt::skipped("no targets.host_service_port");
                }
                through_name(c, HOST_SERVICES_NAME, port)
            },
        ),
        Probe::new(
            "host-service-other-port",
            CAT,
            true,
            "a host loopback service the manifest does not name (host_service_unnamed_port), at host.bottle.internal, at the bundle's address and at 127.0.0.1: blocked unless a reply carries the token",
            |c| {
                let t = &c.config.targets;
                if t.host_service_unnamed_port == 0 {
                    return Attempt::skipped("no targets.host_service_unnamed_port");
                }
                let mut dial = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
                dial.extend(net::hosts_lookup(HOST_SERVICES_NAME));
                dial.extend(t.own_bundle.parse::<IpAddr>().ok());
                any_reaches(c, &dial, t.host_service_unnamed_port)
            },
        ),
        Probe::new(
            "host-service-loopback-direct",
            CAT,
            true,
            "the named host service straight at 127.0.0.1:<host_service_port>, not through the bundle: blocked unless the reply carries the token",
            |c| {
                let port = c.config.targets.host_service_port;
                if port == 0 {
                    return Attempt::skipped("no targets.host_service_port");
                }
                any_reaches(c, &[IpAddr::V4(Ipv4Addr::LOCALHOST)], port)
            },
        ),
        Probe::new(
            "tcp-pinned-control",
            CAT,
            false,
            "the positive control: GET http://<pinned_tcp_host>:<pinned_tcp_port>/ (the name from /etc/hosts) through the bundle's relay to the pinned canary: must answer with the token",
            |c| {
                let t = &c.config.targets;
                if t.pinned_tcp_host.is_empty() || t.pinned_tcp_port == 0 {
                    return Attempt::skipped("no targets.pinned_tcp_host");
                }
                through_name(c, &t.pinned_tcp_host, t.pinned_tcp_port)
            },
        ),
        Probe::new(
            "tcp-pinned-direct",
            CAT,
            true,
            "the pinned canary dialled straight at its address (pinned_tcp_addr:pinned_tcp_port), not through the bundle: blocked unless the reply carries the token",
            |c| {
                let t = &c.config.targets;
                match addr_of(&t.pinned_tcp_addr) {
                    Some(ip) => any_reaches(c, &[ip], t.pinned_tcp_port),
                    None => Attempt::skipped("no targets.pinned_tcp_addr"),
                }
            },
        ),
        Probe::new(
            "tcp-pinned-other-port",
            CAT,
            true,
            "the pinned canary's address on a port the manifest does not name (pinned_tcp_other_port, a canary listens), at the pinned name, at the bundle and at the address: blocked unless a reply carries the token",
            |c| {
                let t = &c.config.targets;
                let Some(ip) = addr_of(&t.pinned_tcp_addr) else {
                    return Attempt::skipped("no targets.pinned_tcp_addr");
                };
                let mut dial = vec![ip];
                dial.extend(net::hosts_lookup(&t.pinned_tcp_host));
                dial.extend(t.own_bundle.parse::<IpAddr>().ok());
                any_reaches(c, &dial, t.pinned_tcp_other_port)
            },
        ),
        Probe::new(
            "tcp-pinned-other-host",
            CAT,
            true,
            "another canary host no manifest names (other_tcp_host, by /etc/hosts, and its address other_tcp_addr) on the pinned port: blocked unless a reply carries the token",
            |c| {
                let t = &c.config.targets;
                let Some(ip) = addr_of(&t.other_tcp_addr) else {
                    return Attempt::skipped("no targets.other_tcp_addr");
                };
                let mut dial = vec![ip];
                dial.extend(net::hosts_lookup(&t.other_tcp_host));
                any_reaches(c, &dial, t.pinned_tcp_port)
            },
        ),
    ]
}

fn addr_of(value: &str) -> Option<IpAddr> {
    (!value.is_empty())
        .then(|| net::parse_ip("addr", value).ok())
        .flatten()
}

/// A GET to `name:port`, the name looked up in `/etc/hosts`: reached when
/// the reply carries the token.
fn through_name(c: &Ctx, name: &str, port: u16) -> Attempt {
    let Some(ip) = net::hosts_lookup(name) else {
        return Attempt::blocked(format!("/etc/hosts does not name {name}"));
    };
    let addr = SocketAddr::new(ip, port);
    let host = net::authority(name, port);
    match net::http_get(addr, &host, "/", c.timeout) {
        Err(e) => Attempt::blocked(format!("{name} ({addr}): {}", errno_name(&e))),
        Ok(bytes) if contains(&bytes, &c.config.token) => Attempt::reached(format!(
            "{name} ({addr}): the reply carries the token: {}",
            snippet(&bytes)
        )),
        Ok(bytes) => Attempt::blocked(format!(
            "{name} ({addr}): no token in the reply: {:?}",
            snippet(&bytes)
        )),
    }
}

/// A GET to each of `ips` at `port`: reached if any reply carries the
/// token; what each did, for the report.
fn any_reaches(c: &Ctx, ips: &[IpAddr], port: u16) -> Attempt {
    if port == 0 {
        return Attempt::error("no port to dial");
    }
    let mut seen = Vec::new();
    for ip in ips {
        let addr = SocketAddr::new(*ip, port);
        let host = net::authority(&ip.to_string(), port);
        match net::http_get(addr, &host, "/", c.timeout) {
            Ok(bytes) if contains(&bytes, &c.config.token) => {
                return Attempt::reached(format!(
                    "{addr}: the reply carries the token: {}",
                    snippet(&bytes)
                ));
            }
            Ok(bytes) => seen.push(format!("{addr}: no token ({:?})", snippet(&bytes))),
            Err(e) => seen.push(format!("{addr}: {}", errno_name(&e))),
        }
    }
    Attempt::blocked(seen.join("; "))
}
