//! DNS as a side channel: raw queries for the canary names straight to the
//! recording DNS canary (UDP and TCP), through the nameservers in the
//! bottle's `/etc/resolv.conf`, and through the C library's resolver. The
//! harness also reads the canary's log: a query recorded from a bottle is
//! an escape whatever these probes saw.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::mpsc;
use std::time::Instant;

use super::{Attempt, Ctx, Probe, errno_name};
use crate::net;

const CAT: &str = "dns";

/// The DNS probes.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "dns-canary-udp",
            CAT,
            true,
            "UDP queries for the canary names straight to targets.dns_server: blocked unless any reply comes back",
            |c| each_name(c, direct_udp),
        ),
        Probe::new(
            "dns-canary-tcp",
            CAT,
            true,
            "a TCP query for a canary name straight to targets.dns_server: blocked unless any reply comes back",
            |c| each_name(c, direct_tcp),
        ),
        Probe::new(
            "dns-resolvconf",
            CAT,
            false,
            "UDP queries for the canary names to each nameserver in /etc/resolv.conf: blocked unless a reply carries an answer record",
            resolv_conf,
        ),
        Probe::new(
            "dns-getaddrinfo",
            CAT,
            false,
            "getaddrinfo() of the canary names through the C library: blocked unless an address comes back",
            getaddrinfo,
        ),
    ]
}

fn names(c: &Ctx) -> Result<&[String], Attempt> {
    if c.config.targets.canary_names.is_empty() {
        Err(Attempt::error("targets.canary_names is empty"))
    } else {
        Ok(&c.config.targets.canary_names)
    }
}

/// Runs `f` per canary name; reached on the first name that reaches.
fn each_name(c: &Ctx, f: impl Fn(&Ctx, &str) -> Attempt) -> Attempt {
    let names = match names(c) {
        Ok(n) => n,
        Err(a) => return a,
    };
    let mut seen = Vec::new();
    for name in names {
        let a = f(c, name);
        if a.outcome != crate::contract::Outcome::Blocked {
            return a;
        }
        seen.push(format!("{name}: {}", a.observed));
    }
    Attempt::blocked(seen.join("; "))
}

fn server(c: &Ctx) -> Result<SocketAddr, Attempt> {
    net::parse_addr("dns_server", &c.config.targets.dns_server, 53).map_err(Attempt::error)
}

fn direct_udp(c: &Ctx, name: &str) -> Attempt {
    let addr = match server(c) {
        Ok(a) => a,
        Err(a) => return a,
    };
    match udp_query(addr, name, c) {
        Ok(reply) => Attempt::reached(format!(
            "{addr}: the canary answered ({})",
            reply.describe()
        )),
        Err(e) => Attempt::blocked(format!("{addr}: {e}")),
    }
}

fn direct_tcp(c: &Ctx, name: &str) -> Attempt {
    let addr = match server(c) {
        Ok(a) => a,
        Err(a) => return a,
    };
    let id = query_id(name);
    let q = query(id, name);
    let mut s = match net::connect(addr, c.timeout) {
        Ok(s) => s,
        Err(e) => return Attempt::blocked(format!("{addr}: {}", errno_name(&e))),
    };
    let mut framed = u16::try_from(q.len()).unwrap_or(0).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    if let Err(e) = s.write_all(&framed) {
        return Attempt::reached(format!("{addr}: TCP connect succeeded, write failed: {e}"));
    }
    let mut len = [0u8; 2];
    match s.read_exact(&mut len) {
        Ok(()) => {
            let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
            let parsed = s
                .read_exact(&mut body)
                .ok()
                .and_then(|()| Reply::parse(&body, id));
            Attempt::reached(format!(
                "{addr}: the canary answered over TCP ({})",
                parsed.map_or("unparsed".into(), |r| r.describe())
            ))
        }
        Err(e) => Attempt::reached(format!(
            "{addr}: TCP connect to the DNS canary succeeded (no reply: {e})"
        )),
    }
}

fn resolv_conf(c: &Ctx) -> Attempt {
    let names = match names(c) {
        Ok(n) => n,
        Err(a) => return a,
    };
    let text = match std::fs::read_to_string("/etc/resolv.conf") {
        Ok(t) => t,
        Err(e) => return Attempt::blocked(format!("no /etc/resolv.conf: {e}")),
    };
    let servers = nameservers(&text);
    if servers.is_empty() {
        return Attempt::blocked("/etc/resolv.conf lists no nameserver");
    }
    let mut seen = Vec::new();
    for ip in &servers {
        let addr = SocketAddr::new(*ip, 53);
        for name in names {
            match udp_query(addr, name, c) {
                Ok(r) if r.answers > 0 => {
                    return Attempt::reached(format!("{addr} answered {name}: {}", r.describe()));
                }
                Ok(r) => seen.push(format!("{addr} {name}: {}", r.describe())),
                Err(e) => seen.push(format!("{addr} {name}: {e}")),
            }
        }
    }
    Attempt::blocked(seen.join("; "))
}

fn getaddrinfo(c: &Ctx) -> Attempt {
    let names = match names(c) {
        Ok(n) => n,
        Err(a) => return a,
    };
    let mut seen = Vec::new();
    for name in names {
        // getaddrinfo cannot be cancelled: run it on a thread and stop
        // waiting at the deadline (the thread dies with the process).
        let (tx, rx) = mpsc::channel();
        let n = name.clone();
        std::thread::spawn(move || {
            let r = (n.as_str(), 80)
                .to_socket_addrs()
                .map(|it| it.map(|a| a.ip()).collect::<Vec<_>>());
            let _ = tx.send(r);
        });
        match rx.recv_timeout(c.timeout) {
            Ok(Ok(addrs)) if !addrs.is_empty() => {
                return Attempt::reached(format!("{name} resolved to {addrs:?}"));
            }
            Ok(Ok(_)) => seen.push(format!("{name}: no address")),
            Ok(Err(e)) => seen.push(format!("{name}: {e}")),
            Err(_) => seen.push(format!("{name}: no answer within the timeout")),
        }
    }
    Attempt::blocked(seen.join("; "))
}

/// `nameserver` lines of a resolv.conf.
pub(super) fn nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "nameserver").then_some(())?;
            w.next()?.split('%').next()?.parse().ok()
        })
        .collect()
}

fn udp_query(addr: SocketAddr, name: &str, c: &Ctx) -> Result<Reply, String> {
    let bind: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(bind).map_err(|e| format!("no UDP socket: {}", errno_name(&e)))?;
    sock.connect(addr).map_err(|e| errno_name(&e))?;
    let id = query_id(name);
    sock.send(&query(id, name))
        .map_err(|e| format!("send: {}", errno_name(&e)))?;
    let deadline = Instant::now() + c.timeout;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        match net::recv_by(&sock, &mut buf, deadline) {
            Ok(n) => {
                if let Some(r) = Reply::parse(&buf[..n], id) {
                    return Ok(r);
                }
            }
            Err(e) => return Err(errno_name(&e)),
        }
    }
    Err("no reply within the timeout".into())
}

fn query_id(name: &str) -> u16 {
    let mut h: u16 = (std::process::id() & 0xffff) as u16;
    for b in name.bytes() {
        h = h.rotate_left(5) ^ u16::from(b);
    }
    h
}

/// A recursive A query for `name`.
pub(super) fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let l = &label.as_bytes()[..label.len().min(63)];
        q.push(l.len() as u8);
        q.extend_from_slice(l);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// The parts of a DNS reply the verdict needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub rcode: u8,
    pub answers: u16,
}

impl Reply {
    pub(super) fn parse(bytes: &[u8], id: u16) -> Option<Self> {
        if bytes.len() < 12 || bytes[0..2] != id.to_be_bytes() || bytes[2] & 0x80 == 0 {
            return None;
        }
        Some(Self {
            rcode: bytes[3] & 0x0f,
            answers: u16::from_be_bytes([bytes[6], bytes[7]]),
        })
    }

    fn describe(&self) -> String {
        let rcode = match self.rcode {
            0 => "NOERROR".to_string(),
            2 => "SERVFAIL".to_string(),
            3 => "NXDOMAIN".to_string(),
            5 => "REFUSED".to_string(),
            n => format!("rcode {n}"),
        };
        format!("{rcode}, {} answers", self.answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_queries() {
        let q = query(0xabcd, "leak.bottle.test");
        assert_eq!(&q[..4], &[0xab, 0xcd, 0x01, 0x00]);
        assert_eq!(&q[12..17], b"\x04leak");
        assert!(q.ends_with(&[4, b't', b'e', b's', b't', 0, 0, 1, 0, 1]));
    }

    #[test]
    fn parses_replies() {
        let mut r = query(7, "a.test");
        r[2] |= 0x80;
        r[3] = 0x83;
        assert_eq!(
            Reply::parse(&r, 7),
            Some(Reply {
                rcode: 3,
                answers: 0
            })
        );
        assert_eq!(Reply::parse(&r, 8), None);
        let q = query(7, "a.test");
        assert_eq!(Reply::parse(&q, 7), None, "a query is not a reply");
    }

    #[test]
    fn reads_nameservers() {
        let t =
            "# c\nnameserver 127.0.0.11\nnameserver fe80::1%eth0\noptions ndots:0\nnameserver x\n";
        assert_eq!(nameservers(t).len(), 2);
        assert!(nameservers("options ndots:0 attempts:1\n").is_empty());
    }
}
