//! Direct network attempts that bypass the proxy: TCP, UDP and ICMP to the
//! TEST-NET "internet" canary, IPv6, host loopback services, the gateway,
//! the metadata and private-range stand-ins, the other bottle, the own
//! bundle's internal egress port. A canary counts as reached only when its
//! reply carries the run's token; a connect-only target (a bundle port)
//! counts when the TCP connect succeeds.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Instant;

use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};

use super::{Attempt, Ctx, Probe, contains, errno_name, snippet};
use crate::net;

const CAT: &str = "network";

/// The network probes.
pub(super) fn probes() -> Vec<Probe> {
    let mut v = Vec::new();
    for port in [80u16, 443, 8443] {
        v.push(Probe::new(
            format!("tcp-internet-v4-{port}"),
            CAT,
            true,
            format!("TCP {port} to the internet canary (targets.internet_v4): blocked unless the reply carries the token"),
            move |c| http_canary(c, "internet_v4", &c.config.targets.internet_v4, port),
        ));
    }
    v.push(Probe::new(
        "udp-internet-v4",
        CAT,
        true,
        "UDP 5353 to the internet canary's echo: blocked unless the token comes back",
        |c| udp_echo(c, "internet_v4", &c.config.targets.internet_v4, 5353),
    ));
    v.push(Probe::new(
        "icmp-internet-v4",
        CAT,
        true,
        "ICMP echo carrying the token to the internet canary: blocked unless an echo reply carries it back",
        |c| icmp_echo(c, "internet_v4", &c.config.targets.internet_v4),
    ));
    v.push(Probe::new(
        "tcp-internet-v6",
        CAT,
        true,
        "TCP 80 to the IPv6 internet canary (targets.internet_v6): blocked unless the reply carries the token",
        |c| http_canary(c, "internet_v6", &c.config.targets.internet_v6, 80),
    ));
    v.push(Probe::new(
        "tcp-host-loopback",
        CAT,
        true,
        "TCP to 127.0.0.1:host_loopback_port (a host loopback service): blocked unless the reply carries the token",
        |c| {
            let port = c.config.targets.host_loopback_port;
            http_canary(c, "host_loopback_port", "127.0.0.1", port)
        },
    ));
    v.push(Probe::new(
        "tcp-gateway-host-port",
        CAT,
        true,
        "TCP to gateway:host_any_port (a host service on 0.0.0.0 via the bottle's gateway): blocked unless the reply carries the token",
        |c| {
            let t = &c.config.targets;
            if t.gateway.is_empty() {
                return Attempt::skipped("no targets.gateway (the bottle's network has no gateway address)");
            }
            http_canary(c, "gateway", &t.gateway, t.host_any_port)
        },
    ));
    v.push(Probe::new(
        "tcp-gateway-loopback-port",
        CAT,
        false,
        "TCP to gateway:host_loopback_port (a loopback-only host service reached through the gateway, route_localnet): blocked unless the reply carries the token",
        |c| {
            let t = &c.config.targets;
            if t.gateway.is_empty() {
                return Attempt::skipped("no targets.gateway (the bottle's network has no gateway address)");
            }
            http_canary(c, "gateway", &t.gateway, t.host_loopback_port)
        },
    ));
    v.push(Probe::new(
        "tcp-metadata",
        CAT,
        true,
        "TCP 80 to the metadata address (targets.metadata): blocked unless the reply carries the token",
        |c| http_canary(c, "metadata", &c.config.targets.metadata, 80),
    ));
    v.push(Probe::new(
        "tcp-private",
        CAT,
        true,
        "TCP 80 to the private-range address (targets.private): blocked unless the reply carries the token",
        |c| http_canary(c, "private", &c.config.targets.private, 80),
    ));
    v.push(Probe::new(
        "tcp-other-bundle",
        CAT,
        true,
        "TCP connect to another bottle's bundle proxy (targets.other_bundle:8888): blocked unless the connect succeeds",
        |c| tcp_connect_only(c, "other_bundle", &c.config.targets.other_bundle, 8888),
    ));
    v.push(Probe::new(
        "icmp-other-agent",
        CAT,
        true,
        "ICMP echo carrying the token to another bottle's agent (targets.other_agent): blocked unless an echo reply carries it back",
        |c| {
            let t = &c.config.targets;
            if t.other_agent.is_empty() {
                return Attempt::skipped("no targets.other_agent");
            }
            icmp_echo(c, "other_agent", &t.other_agent)
        },
    ));
    v.push(Probe::new(
        "tcp-own-bundle-egress",
        CAT,
        false,
        "TCP connect to the own bundle's internal egress port (targets.own_bundle:9099, loopback-only in the bundle): blocked unless the connect succeeds",
        |c| tcp_connect_only(c, "own_bundle", &c.config.targets.own_bundle, 9099),
    ));
    v.push(Probe::new(
        "noproxy-direct-http",
        CAT,
        true,
        "with the proxy variables ignored, a plain GET http://<internet_v4>/ straight to the canary: blocked unless the reply carries the token",
        |c| {
            let t = &c.config.targets;
            let ip = match net::parse_ip("internet_v4", &t.internet_v4) {
                Ok(ip) => ip,
                Err(e) => return Attempt::error(e),
            };
            let addr = SocketAddr::new(ip, 80);
            let host = net::url_host(&t.internet_v4);
            judge_http(c, addr, net::http_get(addr, &host, "/", c.timeout))
        },
    ));
    v
}

/// An HTTP GET to a canary that answers with the token.
pub(super) fn http_canary(c: &Ctx, field: &str, value: &str, port: u16) -> Attempt {
    if value.is_empty() {
        return Attempt::error(format!("targets.{field} is empty"));
    }
    let ip = match net::parse_ip(field, value) {
        Ok(ip) => ip,
        Err(e) => return Attempt::error(e),
    };
    let addr = SocketAddr::new(ip, port);
    let host = net::authority(value, port);
    judge_http(c, addr, net::http_get(addr, &host, "/", c.timeout))
}

fn judge_http(c: &Ctx, addr: SocketAddr, reply: std::io::Result<Vec<u8>>) -> Attempt {
    match reply {
        Err(e) => Attempt::blocked(format!("{addr}: {}", errno_name(&e))),
        Ok(bytes) if contains(&bytes, &c.config.token) => Attempt::reached(format!(
            "{addr}: the reply carries the token: {}",
            snippet(&bytes)
        )),
        Ok(bytes) => Attempt::blocked(format!(
            "{addr}: connected, but no token in the reply: {:?}",
            snippet(&bytes)
        )),
    }
}

fn tcp_connect_only(c: &Ctx, field: &str, value: &str, port: u16) -> Attempt {
    if value.is_empty() {
        return Attempt::error(format!("targets.{field} is empty"));
    }
    let ip = match net::parse_ip(field, value) {
        Ok(ip) => ip,
        Err(e) => return Attempt::error(e),
    };
    let addr = SocketAddr::new(ip, port);
    match net::connect(addr, c.timeout) {
        Ok(_) => Attempt::reached(format!("{addr}: TCP connect succeeded")),
        Err(e) => Attempt::blocked(format!("{addr}: {}", errno_name(&e))),
    }
}

fn udp_echo(c: &Ctx, field: &str, value: &str, port: u16) -> Attempt {
    let ip = match net::parse_ip(field, value) {
        Ok(ip) => ip,
        Err(e) => return Attempt::error(e),
    };
    let addr = SocketAddr::new(ip, port);
    let bind: SocketAddr = if ip.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => return Attempt::blocked(format!("no UDP socket: {}", errno_name(&e))),
    };
    if let Err(e) = sock.connect(addr) {
        return Attempt::blocked(format!("{addr}: {}", errno_name(&e)));
    }
    let payload = format!("bottle-probe {}", c.config.token);
    // Two sends, so one dropped datagram on a lossy path is not a verdict.
    let deadline = Instant::now() + c.timeout;
    let mut last = String::from("no reply");
    for _ in 0..2 {
        if let Err(e) = sock.send(payload.as_bytes()) {
            return Attempt::blocked(format!("{addr}: send: {}", errno_name(&e)));
        }
        let round = (Instant::now() + c.timeout / 2).min(deadline);
        let mut buf = [0u8; 2048];
        while Instant::now() < round {
            match net::recv_by(&sock, &mut buf, round) {
                Ok(n) if contains(&buf[..n], &c.config.token) => {
                    return Attempt::reached(format!("{addr}: the echo carries the token"));
                }
                Ok(n) => last = format!("a reply without the token: {:?}", snippet(&buf[..n])),
                Err(e) => {
                    last = errno_name(&e);
                    break;
                }
            }
        }
    }
    Attempt::blocked(format!("{addr}: {last}"))
}

/// ICMP echo, over an unprivileged ping socket when allowed, else a raw
/// socket; reached only when an echo *reply* carries the token back.
pub(super) fn icmp_echo(c: &Ctx, field: &str, value: &str) -> Attempt {
    let ip = match net::parse_ip(field, value) {
        Ok(IpAddr::V4(ip)) => ip,
        Ok(IpAddr::V6(_)) => {
            return Attempt::error(format!("targets.{field}: ICMP probes take IPv4"));
        }
        Err(e) => return Attempt::error(e),
    };
    let (fd, raw) = match socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::empty(),
        SockProtocol::Icmp,
    ) {
        Ok(fd) => (fd, false),
        Err(dgram) => match socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::empty(),
            SockProtocol::Icmp,
        ) {
            Ok(fd) => (fd, true),
            Err(rawe) => {
                return Attempt::blocked(format!(
                    "no ICMP socket: ping socket {dgram:?}, raw socket {rawe:?}"
                ));
            }
        },
    };
    let sock = UdpSocket::from(fd);
    let addr = SocketAddr::new(IpAddr::V4(ip), 0);
    if let Err(e) = sock.connect(addr) {
        return Attempt::blocked(format!("{ip}: {}", errno_name(&e)));
    }
    let id = (std::process::id() & 0xffff) as u16;
    let packet = echo_request(id, 1, format!("bottle-probe {}", c.config.token).as_bytes());
    if let Err(e) = sock.send(&packet) {
        return Attempt::blocked(format!("{ip}: send: {}", errno_name(&e)));
    }
    let deadline = Instant::now() + c.timeout;
    let mut buf = [0u8; 2048];
    let mut last = "no reply".to_string();
    while Instant::now() < deadline {
        match net::recv_by(&sock, &mut buf, deadline) {
            Ok(n) => {
                let icmp = if raw {
                    let ihl = usize::from(buf[0] & 0x0f) * 4;
                    buf.get(ihl..n).unwrap_or(&[])
                } else {
                    &buf[..n]
                };
                // Type 0 is an echo reply; a raw socket also sees our own
                // request when the target is local.
                if icmp.first() == Some(&0) && contains(icmp, &c.config.token) {
                    let kind = if raw { "raw" } else { "ping" };
                    return Attempt::reached(format!(
                        "{ip}: an echo reply carries the token ({kind} socket)"
                    ));
                }
                last = format!("ICMP type {:?} without the token", icmp.first());
            }
            Err(e) => {
                last = errno_name(&e);
                break;
            }
        }
    }
    Attempt::blocked(format!("{ip}: {last}"))
}

/// An ICMPv4 echo request with its checksum.
fn echo_request(id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![8, 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(payload);
    let sum = checksum(&p);
    p[2..4].copy_from_slice(&sum.to_be_bytes());
    p
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_requests_checksum_to_zero() {
        let p = echo_request(0x1234, 1, b"bottle-probe tok");
        assert_eq!(p[0], 8);
        assert_eq!(checksum(&p), 0);
        let odd = echo_request(7, 2, b"odd");
        assert_eq!(checksum(&odd), 0);
    }
}
