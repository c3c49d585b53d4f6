//! Canaries on this machine: the interface holding the stand-in addresses
//! and the listeners that record who reached them.
//!
//! Every listener answers with the run's token and logs the peer of every
//! connection or datagram. A TCP canary also speaks WebSocket (it switches
//! and echoes each message, recording the payloads it received decoded),
//! and answers a request to [`ECHO_PATH`] with the body it received, so a
//! probe sees what arrived. The log is the harness's own evidence: a peer
//! inside a bottle's network is an escape whatever the probe in that bottle
//! reported, and a listener nobody reached from the host is a failed
//! positive control.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bottle_probe::contract::ECHO_PATH;

use super::route;
use super::sys::Sys;
use super::teardown;

/// The canary interface (at most 15 characters).
pub(crate) const IFACE: &str = "btlcanary0";

/// "The internet": serves HTTP on 80, 443 and 8443, UDP echo on 5353.
pub(crate) const INTERNET: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The cloud-metadata stand-in for direct dials.
pub(crate) const METADATA_STANDIN: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 254);
/// The metadata address itself, held locally during the run so that a DNS
/// answer pointing at it can only ever reach the gate's own listener.
pub(crate) const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// A private address (RFC 1918) for the private-rebinding answer, held
/// locally for the same reason.
pub(crate) const PRIVATE: Ipv4Addr = Ipv4Addr::new(10, 213, 77, 10);
/// The recording DNS server.
pub(crate) const DNS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 53);
/// The pinned TCP destination (`egress.tcp`): the run's DNS gives the
/// manifest's pinned name this address; a canary listens on
/// [`PINNED_TCP_PORT`] and [`PINNED_TCP_OTHER_PORT`].
pub(crate) const PINNED_TCP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 20);
/// Another canary host no manifest names, listening on
/// [`PINNED_TCP_PORT`].
pub(crate) const OTHER_TCP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 21);
/// The pinned destination's port.
pub(crate) const PINNED_TCP_PORT: u16 = 7070;
/// A port on [`PINNED_TCP`] the manifest does not name.
pub(crate) const PINNED_TCP_OTHER_PORT: u16 = 7071;
/// "The internet" over IPv6.
pub(crate) const INTERNET_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);

/// Every address the interface holds.
pub(crate) fn addresses() -> Vec<IpAddr> {
    vec![
        IpAddr::V4(INTERNET),
        IpAddr::V4(METADATA_STANDIN),
        IpAddr::V4(METADATA),
        IpAddr::V4(PRIVATE),
        IpAddr::V4(DNS),
        IpAddr::V4(PINNED_TCP),
        IpAddr::V4(OTHER_TCP),
        IpAddr::V6(INTERNET_V6),
    ]
}

/// The canary interface; deleted when dropped (and on Ctrl-C).
pub(crate) struct Interface {
    sys: Arc<dyn Sys>,
    teardown_id: u64,
}

impl Interface {
    /// Creates [`IFACE`] holding [`addresses`]: a dummy interface, or an
    /// empty bridge on kernels without the dummy driver (it behaves the
    /// same: no ports, the addresses are local).
    pub(crate) fn create(sys: Arc<dyn Sys>) -> anyhow::Result<Interface> {
        // A leftover from a killed run.
        let _ = sys.run("ip", &["link", "del", IFACE]);
        let created = sys
            .run("ip", &["link", "add", IFACE, "type", "dummy"])
            .is_ok()
            || sys
                .run("ip", &["link", "add", IFACE, "type", "bridge"])
                .is_ok();
        if !created {
            bail!(
                "could not create the canary interface {IFACE} (needs root and a dummy or bridge driver)\n  fix: run the gate as root"
            );
        }
        let teardown_sys = sys.clone();
        let teardown_id = teardown::register("delete the canary interface", move || {
            let _ = teardown_sys.run("ip", &["link", "del", IFACE]);
        });
        let iface = Interface { sys, teardown_id };
        for addr in addresses() {
            let (cidr, extra): (String, &[&str]) = match addr {
                IpAddr::V4(a) => (format!("{a}/32"), &[]),
                IpAddr::V6(a) => (format!("{a}/128"), &["nodad"]),
            };
            let mut args = vec!["addr", "add", cidr.as_str(), "dev", IFACE];
            args.extend_from_slice(extra);
            iface.sys.run("ip", &args)?;
        }
        iface.sys.run("ip", &["link", "set", IFACE, "up"])?;
        Ok(iface)
    }

    /// Aborts unless every canary address routes locally and sits on the
    /// canary interface.
    pub(crate) fn verify(&self) -> anyhow::Result<()> {
        let listed =
            route::parse_addr_show(&self.sys.run("ip", &["-o", "addr", "show", "dev", IFACE])?);
        for addr in addresses() {
            let text = addr.to_string();
            let out = self.sys.run("ip", &["route", "get", &text])?;
            route::check_local(addr, &out).map_err(anyhow::Error::msg)?;
            if !listed.contains(&addr) {
                bail!("{addr} routes locally but is not on {IFACE}; refusing to run");
            }
        }
        Ok(())
    }
}

impl Drop for Interface {
    fn drop(&mut self) {
        teardown::run(self.teardown_id);
    }
}

/// How a canary is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Proto {
    /// TCP, answered with an HTTP 200 carrying the token.
    Tcp,
    /// UDP, echoed back after the token.
    Udp,
}

/// One connection or datagram a canary received.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Hit {
    /// The canary's name.
    pub canary: String,
    /// The address it was reached at.
    pub local: SocketAddr,
    /// Who reached it.
    pub peer: SocketAddr,
    /// TCP or UDP.
    pub proto: Proto,
    /// The HTTP Host header, when the peer sent a request.
    pub host: Option<String>,
    /// What the peer sent: the request head and as much of a declared body
    /// as arrived in time (at most [`RECEIVED_CAP`] bytes); the harness
    /// looks for secrets in it.
    #[serde(skip)]
    pub received: Vec<u8>,
}

/// The most of a request a TCP canary keeps.
pub(crate) const RECEIVED_CAP: usize = 64 * 1024;

/// A listener to start.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// Its name in reports (`internet:80`, `host-loopback`, ...).
    pub name: String,
    /// Where to bind (port 0: any free port).
    pub bind: SocketAddr,
    /// TCP or UDP.
    pub proto: Proto,
}

/// A started listener.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    /// Its name.
    pub name: String,
    /// The address it is bound to (port filled in).
    pub addr: SocketAddr,
    /// TCP or UDP.
    pub proto: Proto,
}

/// The running listeners; stopped and joined when dropped.
pub(crate) struct Listeners {
    /// The listeners, in start order.
    pub bound: Vec<Bound>,
    log: Arc<Mutex<Vec<Hit>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// The body every TCP canary answers with.
pub(crate) fn http_body(token: &str, canary: &str) -> String {
    format!("bottle-canary {token} {canary}\n")
}

impl Listeners {
    /// Binds and serves every listener in `specs`.
    pub(crate) fn start(specs: &[Spec], token: &str) -> anyhow::Result<Listeners> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut listeners = Listeners {
            bound: Vec::new(),
            log,
            stop,
            threads: Vec::new(),
        };
        for spec in specs {
            let (log, stop, token, name) = (
                listeners.log.clone(),
                listeners.stop.clone(),
                token.to_string(),
                spec.name.clone(),
            );
            let addr = match spec.proto {
                Proto::Tcp => {
                    let listener = TcpListener::bind(spec.bind).with_context(|| {
                        format!("could not bind canary {} on tcp {}", spec.name, spec.bind)
                    })?;
                    listener.set_nonblocking(true)?;
                    let addr = listener.local_addr()?;
                    listeners.threads.push(std::thread::spawn(move || {
                        serve_tcp(&listener, &name, &token, &log, &stop)
                    }));
                    addr
                }
                Proto::Udp => {
                    let socket = UdpSocket::bind(spec.bind).with_context(|| {
                        format!("could not bind canary {} on udp {}", spec.name, spec.bind)
                    })?;
                    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
                    let addr = socket.local_addr()?;
                    listeners.threads.push(std::thread::spawn(move || {
                        serve_udp(&socket, &name, &token, &log, &stop)
                    }));
                    addr
                }
            };
            listeners.bound.push(Bound {
                name: spec.name.clone(),
                addr,
                proto: spec.proto,
            });
        }
        Ok(listeners)
    }

    /// The listener named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Bound> {
        self.bound.iter().find(|b| b.name == name)
    }

    /// Everything received so far.
    pub(crate) fn hits(&self) -> Vec<Hit> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn serve_tcp(
    listener: &TcpListener,
    name: &str,
    token: &str,
    log: &Arc<Mutex<Vec<Hit>>>,
    stop: &Arc<AtomicBool>,
) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let local = stream.local_addr().unwrap_or(peer);
                let (name, token, log) = (name.to_string(), token.to_string(), log.clone());
                workers.retain(|w| !w.is_finished());
                // Bounded: a flood of connections waits in the backlog.
                if workers.len() < 32 {
                    workers.push(std::thread::spawn(move || {
                        serve_tcp_conn(stream, local, peer, &name, &token, &log);
                    }));
                } else {
                    serve_tcp_conn(stream, local, peer, name.as_str(), &token, &log);
                }
            }
            // Short: the audit flood's allowed requests reach the canary
            // as a new connection each, one after another.
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    for worker in workers {
        let _ = worker.join();
    }
}

/// The Host header of a request head, if any.
pub(crate) fn host_header(head: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim().to_ascii_lowercase())
    })
}

fn serve_tcp_conn(
    mut stream: TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    name: &str,
    token: &str,
    log: &Mutex<Vec<Hit>>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1500)));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut received = Vec::new();
    let mut buf = [0u8; 2048];
    // Read a request head if the peer sends one (a bare connect is a hit
    // too), then the body it declares, so that what leaked in a body is on
    // record.
    while received.len() < RECEIVED_CAP && Instant::now() < deadline {
        let head_end = received
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| p + 4);
        if let Some(end) = head_end
            && body_complete(&received[..end], &received[end..])
        {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
    received.truncate(RECEIVED_CAP);
    let head = String::from_utf8_lossy(&received).into_owned();
    let websocket = websocket_key(&head);
    let mut response = if let Some(key) = &websocket {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
            websocket_accept(key)
        )
        .into_bytes()
    } else {
        let mut body = http_body(token, name).into_bytes();
        if head.lines().next().is_some_and(|l| l.contains(ECHO_PATH)) {
            body.extend_from_slice(&echoed_body(&received));
        }
        let mut response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(&body);
        response
    };
    if websocket.is_some() {
        let _ = stream.write_all(&response);
        response.clear();
        echo_messages(
            &mut stream,
            &mut received,
            deadline + Duration::from_secs(5),
        );
    }
    if let Ok(mut log) = log.lock() {
        log.push(Hit {
            canary: name.to_string(),
            local,
            peer,
            proto: Proto::Tcp,
            host: host_header(&head),
            received,
        });
    }
    let _ = stream.write_all(&response);
}

/// A request's `Sec-WebSocket-Key`, when it asks to switch to WebSocket.
fn websocket_key(head: &str) -> Option<String> {
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    };
    header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
        .then(|| header("sec-websocket-key"))
        .flatten()
}

/// RFC 6455's answer to `key`.
fn websocket_accept(key: &str) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut sha = sha1::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC11B85");
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

/// Reads a client's frames until it closes or `deadline`, appending each
/// payload (unmasked) to `received` and echoing each whole message back.
fn echo_messages(stream: &mut TcpStream, received: &mut Vec<u8>, deadline: Instant) {
    let mut message = Vec::new();
    while received.len() < RECEIVED_CAP && Instant::now() < deadline {
        let Some((fin, opcode, payload)) = read_frame(stream, deadline) else {
            return;
        };
        received.extend_from_slice(&payload);
        match opcode {
            0x8 => {
                let _ = stream.write_all(&[0x88, 0]);
                return;
            }
            0x0..=0x2 => {
                message.extend_from_slice(&payload);
                if fin {
                    let mut frame = vec![0x81];
                    match message.len() {
                        n @ 0..=125 => frame.push(n as u8),
                        n => {
                            frame.push(126);
                            frame.extend_from_slice(&(n.min(0xFFFF) as u16).to_be_bytes());
                        }
                    }
                    message.truncate(0xFFFF);
                    frame.append(&mut message);
                    let _ = stream.write_all(&frame);
                }
            }
            _ => {}
        }
    }
}

/// One client frame: FIN, opcode and the unmasked payload (bounded).
fn read_frame(stream: &mut TcpStream, deadline: Instant) -> Option<(bool, u8, Vec<u8>)> {
    let mut exact = |n: usize| -> Option<Vec<u8>> {
        let mut buf = vec![0; n];
        let mut got = 0;
        while got < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let _ = stream.set_read_timeout(Some(left));
            match stream.read(&mut buf[got..]) {
                Ok(0) | Err(_) => return None,
                Ok(k) => got += k,
            }
        }
        Some(buf)
    };
    let head = exact(2)?;
    let len = match head[1] & 0x7F {
        126 => exact(2).map(|b| u64::from(u16::from_be_bytes([b[0], b[1]])))?,
        127 => exact(8).map(|b| b.iter().fold(0u64, |n, &x| n << 8 | u64::from(x)))?,
        n => u64::from(n),
    };
    let mask = if head[1] & 0x80 != 0 {
        exact(4)?
    } else {
        vec![0; 4]
    };
    let mut payload = exact(usize::try_from(len.min(RECEIVED_CAP as u64)).unwrap_or(0))?;
    for (i, b) in payload.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    Some((head[0] & 0x80 != 0, head[0] & 0x0F, payload))
}

/// The body a request carried, its chunk framing taken out.
fn echoed_body(received: &[u8]) -> Vec<u8> {
    let dechunked = super::evidence::dechunked(received);
    let whole = if dechunked.is_empty() {
        received
    } else {
        &dechunked
    };
    whole
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or_else(Vec::new, |end| whole[end + 4..].to_vec())
}

/// Whether `body` holds all of the body `head` declares: none declared,
/// `Content-Length` bytes, or a chunked body's last chunk.
fn body_complete(head: &[u8], body: &[u8]) -> bool {
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return body.windows(5).any(|w| w == b"0\r\n\r\n");
    }
    let length = header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    body.len() >= length
}

fn serve_udp(
    socket: &UdpSocket,
    name: &str,
    token: &str,
    log: &Mutex<Vec<Hit>>,
    stop: &AtomicBool,
) {
    let local = socket
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        if let Ok((n, peer)) = socket.recv_from(&mut buf) {
            if let Ok(mut log) = log.lock() {
                log.push(Hit {
                    canary: name.to_string(),
                    local,
                    peer,
                    proto: Proto::Udp,
                    host: None,
                    received: buf[..n].to_vec(),
                });
            }
            let mut reply = http_body(token, name).into_bytes();
            reply.extend_from_slice(&buf[..n.min(512)]);
            let _ = socket.send_to(&reply, peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_headers_are_found_case_insensitively() {
        let head = "GET / HTTP/1.1\r\nHOST: Allowed.Bottle.Test\r\nAccept: */*\r\n\r\n";
        assert_eq!(host_header(head).as_deref(), Some("allowed.bottle.test"));
        assert_eq!(host_header("GET / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(host_header(""), None);
    }

    #[test]
    fn a_declared_body_is_waited_for() {
        let head = b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n";
        assert!(!body_complete(head, b"ab"));
        assert!(body_complete(head, b"abcd"));
        assert!(body_complete(b"GET / HTTP/1.1\r\n\r\n", b""));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(!body_complete(chunked, b"4\r\nabcd\r\n"));
        assert!(body_complete(chunked, b"4\r\nabcd\r\n0\r\n\r\n"));
    }

    #[test]
    fn listeners_answer_with_the_token_and_log_the_peer() {
        let specs = [
            Spec {
                name: "t".into(),
                bind: "127.0.0.1:0".parse().unwrap(),
                proto: Proto::Tcp,
            },
            Spec {
                name: "u".into(),
                bind: "127.0.0.1:0".parse().unwrap(),
                proto: Proto::Udp,
            },
        ];
        let listeners = Listeners::start(&specs, "tok123").unwrap();
        let tcp = listeners.get("t").unwrap().addr;
        let mut stream = TcpStream::connect(tcp).unwrap();
        stream
            .write_all(b"POST / HTTP/1.1\r\nHost: a.bottle.test\r\nContent-Length: 6\r\n\r\n")
            .unwrap();
        stream.write_all(b"secret").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(response.ends_with(&http_body("tok123", "t")), "{response}");

        let udp = listeners.get("u").unwrap().addr;
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        socket.send_to(b"ping", udp).unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = socket.recv_from(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("tok123"));

        let hits = listeners.hits();
        let tcp_hit = hits.iter().find(|h| h.canary == "t").unwrap();
        assert_eq!(tcp_hit.peer.ip(), stream.local_addr().unwrap().ip());
        assert_eq!(tcp_hit.host.as_deref(), Some("a.bottle.test"));
        assert!(tcp_hit.received.ends_with(b"\r\n\r\nsecret"));
        let udp_hit = hits.iter().find(|h| h.canary == "u").unwrap();
        assert_eq!(udp_hit.peer, socket.local_addr().unwrap());
        assert_eq!(udp_hit.proto, Proto::Udp);
    }
}
