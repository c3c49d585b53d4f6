//! Bounded socket helpers shared by the network, DNS, proxy and secrets
//! probes: connect with a timeout, send a request, read what comes back
//! until the peer closes, a size cap, or the deadline.
//!
//! Every wait for data is a `poll(2)` with the time left, never the
//! socket's own receive timeout alone: gVisor 20221219 in its host network
//! mode ignores `SO_RCVTIMEO` (a `recv` with nothing to read blocks for
//! good), so a probe that trusted it would hang the whole run.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// The most a probe reads from one peer.
pub(crate) const READ_CAP: usize = 64 * 1024;

/// Parses a target address; the error names the field.
pub(crate) fn parse_ip(field: &str, value: &str) -> Result<IpAddr, String> {
    value
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("targets.{field} = {value:?} is not an IP address"))
}

/// An `ip` or `ip:port` target with a default port.
pub(crate) fn parse_addr(
    field: &str,
    value: &str,
    default_port: u16,
) -> Result<SocketAddr, String> {
    if let Ok(sa) = value.parse::<SocketAddr>() {
        return Ok(sa);
    }
    parse_ip(field, value).map(|ip| SocketAddr::new(ip, default_port))
}

/// `host:port` for a request line or header (IPv6 bracketed).
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A host for a URL or `Host:` header (IPv6 bracketed), no port.
pub(crate) fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Waits until `socket` has something to read, or `timeout` passes
/// (`TimedOut`).
pub(crate) fn wait_readable(socket: &impl AsFd, timeout: Duration) -> std::io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let ms = u16::try_from(timeout.as_millis().max(1)).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(0) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
        Ok(_) => Ok(()),
        Err(errno) => Err(std::io::Error::from(errno)),
    }
}

/// One datagram from `socket`, waited for until `deadline` at most
/// (`TimedOut` then).
pub(crate) fn recv_by(
    socket: &std::net::UdpSocket,
    buf: &mut [u8],
    deadline: Instant,
) -> std::io::Result<usize> {
    wait_readable(socket, deadline.saturating_duration_since(Instant::now()))?;
    socket.recv(buf)
}

/// A TCP connection whose reads wait with `poll(2)` for at most its read
/// timeout (see the module's note on gVisor); everything else is the
/// stream's.
#[derive(Debug)]
pub(crate) struct Conn(pub(crate) TcpStream);

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(timeout) = self.0.read_timeout()? {
            wait_readable(&self.0, timeout)?;
        }
        self.0.read(buf)
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl std::ops::Deref for Conn {
    type Target = TcpStream;

    fn deref(&self) -> &TcpStream {
        &self.0
    }
}

/// Connects within `timeout`, with read and write timeouts set.
pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Conn> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(Conn(s))
}

/// Reads until EOF, [`READ_CAP`], or `deadline`; whatever arrived is
/// returned even when the read ends in an error or a timeout.
pub(crate) fn read_until_close(s: &mut impl Read, deadline: Instant) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < READ_CAP && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

/// Reads an HTTP response head (up to the blank line), bounded.
pub(crate) fn read_head(s: &mut impl Read, deadline: Instant) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while got.len() < READ_CAP && Instant::now() < deadline && !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(_) => got.push(b[0]),
        }
    }
    got
}

/// Sends `request` and returns everything the peer answers.
pub(crate) fn exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    let mut s = connect(addr, timeout)?;
    s.write_all(request)?;
    Ok(read_until_close(&mut s, Instant::now() + timeout))
}

/// A plain `GET` with `Connection: close`.
pub(crate) fn http_get(
    addr: SocketAddr,
    host: &str,
    target: &str,
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bottle-probe\r\nConnection: close\r\n\r\n"
    );
    exchange(addr, req.as_bytes(), timeout)
}

/// The status code of an HTTP response, if it starts like one.
pub(crate) fn status(reply: &[u8]) -> Option<u16> {
    let line = reply.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// The body of a whole HTTP/1.1 response read until close: de-chunked
/// when it says `Transfer-Encoding: chunked`, cut to `Content-Length` when
/// it has one, else everything after the head.
pub(crate) fn body(reply: &[u8]) -> Result<Vec<u8>, String> {
    let end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete response head")?;
    let head = String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase();
    let rest = &reply[end + 4..];
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut out = Vec::new();
        let mut at = rest;
        loop {
            let line_end = at
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or("a chunk size line is cut off")?;
            let size = std::str::from_utf8(&at[..line_end])
                .ok()
                .map(|l| l.split(';').next().unwrap_or(l).trim())
                .and_then(|l| usize::from_str_radix(l, 16).ok())
                .ok_or("a chunk size is not hex")?;
            at = &at[line_end + 2..];
            if size == 0 {
                return Ok(out);
            }
            let chunk = at.get(..size).ok_or("a chunk is cut off")?;
            out.extend_from_slice(chunk);
            at = at.get(size + 2..).ok_or("a chunk is cut off")?;
        }
    }
    match header("content-length").map(|v| v.parse::<usize>()) {
        Some(Ok(len)) => rest
            .get(..len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("the body is cut off ({} of {len} bytes)", rest.len())),
        Some(Err(_)) => Err("Content-Length is not a number".into()),
        None => Ok(rest.to_vec()),
    }
}

/// Resolves a `host:port` (used only for the proxy address, which the
/// harness gives as an IP; a name goes through the system resolver).
pub(crate) fn resolve_one(host_port: &str) -> Result<SocketAddr, String> {
    if let Ok(sa) = host_port.parse::<SocketAddr>() {
        return Ok(sa);
    }
    host_port
        .to_socket_addrs()
        .map_err(|e| format!("{host_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host_port}: no address"))
}

/// Splits `http://host:port[/...]` into a socket address.
pub(crate) fn proxy_addr(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("targets.proxy = {url:?} is not an http:// URL"))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let with_port = if hostport.rsplit_once(':').is_some_and(|(h, p)| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (!h.contains(':') || h.ends_with(']'))
    }) {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    resolve_one(&with_port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        assert_eq!(
            parse_ip("x", "192.0.2.10").unwrap().to_string(),
            "192.0.2.10"
        );
        assert_eq!(
            parse_ip("x", "[2001:db8::10]").unwrap().to_string(),
            "2001:db8::10"
        );
        assert!(parse_ip("x", "example").unwrap_err().contains("targets.x"));
        assert_eq!(parse_addr("d", "203.0.113.53", 53).unwrap().port(), 53);
        assert_eq!(parse_addr("d", "127.0.0.1:5300", 53).unwrap().port(), 5300);
    }

    #[test]
    fn parses_proxy_urls() {
        assert_eq!(
            proxy_addr("http://192.0.2.1:8888").unwrap().to_string(),
            "192.0.2.1:8888"
        );
        assert_eq!(proxy_addr("http://192.0.2.1:8888/").unwrap().port(), 8888);
        assert_eq!(proxy_addr("http://192.0.2.1").unwrap().port(), 80);
        assert_eq!(
            proxy_addr("http://[2001:db8::1]:3128").unwrap().port(),
            3128
        );
        assert!(proxy_addr("socks5://x").is_err());
    }

    #[test]
    fn authorities_bracket_ipv6() {
        assert_eq!(authority("2001:db8::10", 80), "[2001:db8::10]:80");
        assert_eq!(authority("a.test", 443), "a.test:443");
        assert_eq!(url_host("2001:db8::10"), "[2001:db8::10]");
    }

    #[test]
    fn bodies_are_de_chunked_and_cut_to_their_length() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(body(chunked).unwrap(), b"abcde");
        let sized = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhello";
        assert_eq!(body(sized).unwrap(), b"he");
        let until_close = b"HTTP/1.0 200 OK\r\n\r\nall of it";
        assert_eq!(body(until_close).unwrap(), b"all of it");
        assert!(body(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab").is_err());
        assert!(body(b"HTTP/1.1 200").is_err());
    }

    #[test]
    fn reads_status_codes() {
        assert_eq!(status(b"HTTP/1.1 403 Forbidden\r\n\r\n"), Some(403));
        assert_eq!(status(b"HTTP/1.0 200 OK\r\n"), Some(200));
        assert_eq!(status(b"SSH-2.0-x\r\n"), None);
        assert_eq!(status(b""), None);
    }
}

/// The address `/etc/hosts` gives `name` (IPv4 first), as a box's own
/// resolver would find it; `None` when the file does not name it. Read
/// directly: the probe is a static binary, and a bottle has no DNS.
pub(crate) fn hosts_lookup(name: &str) -> Option<IpAddr> {
    hosts_lookup_in(&std::fs::read_to_string("/etc/hosts").ok()?, name)
}

/// [`hosts_lookup`] over the text of a hosts file.
pub(crate) fn hosts_lookup_in(text: &str, name: &str) -> Option<IpAddr> {
    let mut found: Vec<IpAddr> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let ip: IpAddr = fields.next()?.parse().ok()?;
            fields.any(|n| n.eq_ignore_ascii_case(name)).then_some(ip)
        })
        .collect();
    found.sort_by_key(|ip| !ip.is_ipv4());
    found.first().copied()
}

#[cfg(test)]
mod hosts_tests {
    use super::*;

    #[test]
    fn hosts_lines_are_matched_by_any_name_ipv4_first() {
        let text = "127.0.0.1 localhost\n::1 a.test\n# 10.0.0.1 a.test\n192.168.7.2 b a.test # c\n";
        assert_eq!(
            hosts_lookup_in(text, "A.test"),
            Some("192.168.7.2".parse().unwrap())
        );
        assert_eq!(
            hosts_lookup_in(text, "b"),
            Some("192.168.7.2".parse().unwrap())
        );
        assert_eq!(hosts_lookup_in(text, "c"), None);
        assert_eq!(hosts_lookup_in(text, "missing"), None);
    }
}
