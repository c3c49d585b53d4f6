//! The recording DNS canary: a tiny authoritative server for the gate's own
//! zone that remembers every query it receives, over UDP and TCP.
//!
//! It is made the Engine's upstream resolver for the run, so it sees what
//! the bundles ask (the rebind names, proving the path works) and would see
//! anything an agent managed to get forwarded (CVE-2024-29018: Docker's
//! embedded resolver forwards even on `--internal` networks). A query whose
//! source is inside a bottle's network is an escape, whatever the probe in
//! that bottle reported.
//!
//! Names outside [`ZONE`] get SERVFAIL, never an answer: resolvers on the
//! host (and Docker's embedded resolver) then move on to the host's real
//! nameserver, listed after this one, so the rest of the machine keeps
//! working during a run and nothing of the gate's own is forwarded anywhere.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// The zone the recorder answers for.
pub(crate) const ZONE: &str = "bottle.test";

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_SERVFAIL: u8 = 2;
const RCODE_NXDOMAIN: u8 = 3;

/// One question from a DNS message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Question {
    /// The message ID.
    pub id: u16,
    /// Header flags (to copy RD back).
    pub flags: u16,
    /// The name, lowercase, without the trailing dot.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// The raw question section (name + type + class), echoed in answers.
    pub raw: Vec<u8>,
}

/// Parses the first question of a query. `None` for anything malformed
/// (including compression pointers, which a question never needs).
pub(crate) fn parse_query(msg: &[u8]) -> Option<Question> {
    if msg.len() < 12 {
        return None;
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    let qdcount = u16::from_be_bytes([msg[4], msg[5]]);
    if flags & 0x8000 != 0 || qdcount == 0 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        let label = msg.get(at..at + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    let _class = u16::from_be_bytes([*msg.get(at + 2)?, *msg.get(at + 3)?]);
    Some(Question {
        id,
        flags,
        name: labels.join("."),
        qtype,
        raw: msg[12..at + 4].to_vec(),
    })
}

/// What the recorder says to a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A records (TTL 0, so every lookup comes back here).
    Addresses(Vec<std::net::Ipv4Addr>),
    /// The name exists but has no record of this type.
    NoData,
    /// The name does not exist in the zone.
    NxDomain,
    /// Not our zone: let the asker try its next server.
    ServFail,
}

/// Decides the reply from the answer table.
pub(crate) fn decide(answers: &BTreeMap<String, Vec<std::net::Ipv4Addr>>, q: &Question) -> Reply {
    let in_zone = q.name == ZONE || q.name.ends_with(&format!(".{ZONE}"));
    if !in_zone {
        return Reply::ServFail;
    }
    match answers.get(&q.name) {
        Some(addrs) if q.qtype == TYPE_A => Reply::Addresses(addrs.clone()),
        Some(_) => Reply::NoData,
        None if q.qtype == TYPE_A || q.qtype == TYPE_AAAA => Reply::NxDomain,
        None => Reply::NxDomain,
    }
}

/// Encodes the reply to `q`.
pub(crate) fn encode_reply(q: &Question, reply: &Reply) -> Vec<u8> {
    let (rcode, addrs): (u8, &[std::net::Ipv4Addr]) = match reply {
        Reply::Addresses(a) => (0, a),
        Reply::NoData => (0, &[]),
        Reply::NxDomain => (RCODE_NXDOMAIN, &[]),
        Reply::ServFail => (RCODE_SERVFAIL, &[]),
    };
    // QR, AA (except SERVFAIL), RD copied from the query.
    let aa = if matches!(reply, Reply::ServFail) {
        0
    } else {
        0x0400
    };
    let flags: u16 = 0x8000 | aa | (q.flags & 0x0100) | u16::from(rcode);
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&q.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::try_from(addrs.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&q.raw);
    for addr in addrs.iter().take(usize::from(u16::MAX)) {
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&addr.octets());
    }
    out
}

/// Builds a query for `name` (type A), as the host-side control sends it.
pub(crate) fn encode_query(id: u16, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let bytes = label.as_bytes();
        out.push(u8::try_from(bytes.len().min(63)).unwrap_or(63));
        out.extend_from_slice(&bytes[..bytes.len().min(63)]);
    }
    out.push(0);
    out.extend_from_slice(&TYPE_A.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// The rcode and A records of a response (for the host-side control).
pub(crate) fn parse_response(msg: &[u8]) -> Option<(u8, Vec<std::net::Ipv4Addr>)> {
    if msg.len() < 12 || msg[2] & 0x80 == 0 {
        return None;
    }
    let rcode = msg[3] & 0x0f;
    let ancount = u16::from_be_bytes([msg[6], msg[7]]);
    let mut at = 12;
    // Skip the question.
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        at += len;
    }
    at += 4;
    let mut addrs = Vec::new();
    for _ in 0..ancount {
        // Name: a pointer (2 bytes) or labels.
        if *msg.get(at)? & 0xc0 == 0xc0 {
            at += 2;
        } else {
            loop {
                let len = usize::from(*msg.get(at)?);
                at += 1;
                if len == 0 {
                    break;
                }
                at += len;
            }
        }
        let rtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
        let rdlen = usize::from(u16::from_be_bytes([*msg.get(at + 8)?, *msg.get(at + 9)?]));
        at += 10;
        let rdata = msg.get(at..at + rdlen)?;
        if rtype == TYPE_A && rdlen == 4 {
            addrs.push(std::net::Ipv4Addr::new(
                rdata[0], rdata[1], rdata[2], rdata[3],
            ));
        }
        at += rdlen;
    }
    Some((rcode, addrs))
}

/// One query the recorder received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// Who asked.
    pub source: SocketAddr,
    /// The name asked for.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// `udp` or `tcp`.
    pub transport: &'static str,
}

/// The running recorder; stops and joins its threads when dropped.
pub(crate) struct DnsRecorder {
    answers: Arc<Mutex<BTreeMap<String, Vec<std::net::Ipv4Addr>>>>,
    log: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

/// A UDP socket and a TCP listener on the same address. With port 0
/// (tests), TCP takes the port UDP got, which another process may hold
/// for TCP: then both are given up and other ports tried, a bounded
/// number of times.
fn bind_udp_and_tcp(addr: SocketAddr) -> anyhow::Result<(UdpSocket, TcpListener)> {
    const ATTEMPTS: usize = 20;
    for attempt in 1..=ATTEMPTS {
        let udp = UdpSocket::bind(addr)
            .with_context(|| format!("could not bind DNS canary udp {addr}"))?;
        let bound = udp.local_addr()?;
        match TcpListener::bind(bound) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(err)
                if addr.port() == 0
                    && err.kind() == std::io::ErrorKind::AddrInUse
                    && attempt < ATTEMPTS => {}
            Err(err) => {
                return Err(err).with_context(|| format!("could not bind DNS canary tcp {bound}"));
            }
        }
    }
    unreachable!("the last attempt returns")
}

impl DnsRecorder {
    /// Listens on `addr` (UDP and TCP port 53 normally).
    pub(crate) fn start(addr: SocketAddr) -> anyhow::Result<DnsRecorder> {
        let (udp, tcp) = bind_udp_and_tcp(addr)?;
        let addr = udp.local_addr()?;
        udp.set_read_timeout(Some(Duration::from_millis(100)))?;
        tcp.set_nonblocking(true)?;
        let answers = Arc::new(Mutex::new(BTreeMap::new()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        {
            let (answers, log, stop) = (answers.clone(), log.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                serve_udp(&udp, &answers, &log, &stop)
            }));
        }
        {
            let (answers, log, stop) = (answers.clone(), log.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                serve_tcp(&tcp, &answers, &log, &stop)
            }));
        }
        Ok(DnsRecorder {
            answers,
            log,
            stop,
            threads,
            addr,
        })
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the A records of `name` (lowercase, no trailing dot).
    pub(crate) fn set(&self, name: &str, addrs: Vec<std::net::Ipv4Addr>) {
        if let Ok(mut answers) = self.answers.lock() {
            answers.insert(name.to_ascii_lowercase(), addrs);
        }
    }

    /// Everything received so far.
    pub(crate) fn queries(&self) -> Vec<Recorded> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Queries from `source` so far.
    #[cfg(test)]
    pub(crate) fn queries_from(&self, source: std::net::IpAddr) -> Vec<Recorded> {
        self.queries()
            .into_iter()
            .filter(|q| q.source.ip() == source)
            .collect()
    }
}

impl Drop for DnsRecorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

type Answers = Mutex<BTreeMap<String, Vec<std::net::Ipv4Addr>>>;

fn answer(
    msg: &[u8],
    source: SocketAddr,
    transport: &'static str,
    answers: &Answers,
    log: &Mutex<Vec<Recorded>>,
) -> Option<Vec<u8>> {
    let q = parse_query(msg)?;
    if let Ok(mut log) = log.lock() {
        log.push(Recorded {
            source,
            name: q.name.clone(),
            qtype: q.qtype,
            transport,
        });
    }
    let reply = answers
        .lock()
        .map(|a| decide(&a, &q))
        .unwrap_or(Reply::ServFail);
    Some(encode_reply(&q, &reply))
}

fn serve_udp(socket: &UdpSocket, answers: &Answers, log: &Mutex<Vec<Recorded>>, stop: &AtomicBool) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        if let Ok((n, peer)) = socket.recv_from(&mut buf)
            && let Some(out) = answer(&buf[..n], peer, "udp", answers, log)
        {
            let _ = socket.send_to(&out, peer);
        }
    }
}

fn serve_tcp(
    listener: &TcpListener,
    answers: &Answers,
    log: &Mutex<Vec<Recorded>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let _ = serve_tcp_conn(stream, peer, answers, log);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn serve_tcp_conn(
    mut stream: TcpStream,
    peer: SocketAddr,
    answers: &Answers,
    log: &Mutex<Vec<Recorded>>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    // At most a few messages per connection, each length-prefixed.
    for _ in 0..8 {
        if Instant::now() > deadline {
            break;
        }
        let mut len = [0u8; 2];
        if stream.read_exact(&mut len).is_err() {
            break;
        }
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut msg)?;
        if let Some(out) = answer(&msg, peer, "tcp", answers, log) {
            let len = u16::try_from(out.len()).unwrap_or(u16::MAX).to_be_bytes();
            stream.write_all(&len)?;
            stream.write_all(&out)?;
        }
    }
    Ok(())
}

/// Asks `server` for `name` over UDP from the host (the DNS positive
/// control): returns the rcode and addresses.
pub(crate) fn query_udp(
    server: SocketAddr,
    name: &str,
) -> anyhow::Result<(u8, Vec<std::net::Ipv4Addr>)> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .context("bind address")?;
    let socket = UdpSocket::bind(bind)?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    let id = 0x5eed;
    socket.send_to(&encode_query(id, name), server)?;
    let mut buf = [0u8; 1500];
    let (n, _) = socket
        .recv_from(&mut buf)
        .with_context(|| format!("no answer from the DNS canary {server} for {name}"))?;
    parse_response(&buf[..n]).with_context(|| format!("unparseable answer from {server}"))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn table() -> BTreeMap<String, Vec<Ipv4Addr>> {
        BTreeMap::from([(
            "rebind-loopback.bottle.test".to_string(),
            vec![Ipv4Addr::LOCALHOST],
        )])
    }

    #[test]
    fn a_query_round_trips() {
        let q = parse_query(&encode_query(7, "Rebind-Loopback.bottle.test.")).unwrap();
        assert_eq!(q.id, 7);
        assert_eq!(q.name, "rebind-loopback.bottle.test");
        assert_eq!(q.qtype, TYPE_A);
        let out = encode_reply(&q, &decide(&table(), &q));
        assert_eq!(parse_response(&out), Some((0, vec![Ipv4Addr::LOCALHOST])));
        // TTL 0: every lookup comes back to the recorder.
        assert_eq!(&out[out.len() - 10..out.len() - 6], &[0, 0, 0, 0]);
    }

    #[test]
    fn unknown_names_in_the_zone_do_not_exist_and_others_fail() {
        let in_zone = parse_query(&encode_query(1, "exfil-123.bottle.test")).unwrap();
        assert_eq!(decide(&table(), &in_zone), Reply::NxDomain);
        let out = encode_reply(&in_zone, &Reply::NxDomain);
        assert_eq!(parse_response(&out), Some((RCODE_NXDOMAIN, vec![])));
        let foreign = parse_query(&encode_query(2, "crates.io")).unwrap();
        assert_eq!(decide(&table(), &foreign), Reply::ServFail);
        let out = encode_reply(&foreign, &Reply::ServFail);
        assert_eq!(parse_response(&out), Some((RCODE_SERVFAIL, vec![])));
    }

    #[test]
    fn aaaa_for_a_known_name_is_nodata() {
        let mut msg = encode_query(3, "rebind-loopback.bottle.test");
        let n = msg.len();
        msg[n - 4..n - 2].copy_from_slice(&TYPE_AAAA.to_be_bytes());
        let q = parse_query(&msg).unwrap();
        assert_eq!(decide(&table(), &q), Reply::NoData);
    }

    #[test]
    fn malformed_queries_are_ignored() {
        assert_eq!(parse_query(&[0; 5]), None);
        let mut response = encode_query(1, "a.bottle.test");
        response[2] |= 0x80;
        assert_eq!(parse_query(&response), None);
        let mut truncated = encode_query(1, "a.bottle.test");
        truncated.truncate(16);
        assert_eq!(parse_query(&truncated), None);
    }

    #[test]
    fn the_recorder_answers_and_records_on_loopback() {
        let recorder = DnsRecorder::start("127.0.0.1:0".parse().unwrap()).unwrap();
        recorder.set("Allowed.bottle.test", vec![Ipv4Addr::new(198, 51, 100, 10)]);
        let (rcode, addrs) = query_udp(recorder.addr(), "allowed.bottle.test").unwrap();
        assert_eq!((rcode, addrs), (0, vec![Ipv4Addr::new(198, 51, 100, 10)]));

        // The same over TCP, length-prefixed.
        let mut tcp = TcpStream::connect(recorder.addr()).unwrap();
        let query = encode_query(9, "nothing.bottle.test");
        tcp.write_all(&u16::try_from(query.len()).unwrap().to_be_bytes())
            .unwrap();
        tcp.write_all(&query).unwrap();
        let mut len = [0u8; 2];
        tcp.read_exact(&mut len).unwrap();
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        tcp.read_exact(&mut reply).unwrap();
        assert_eq!(parse_response(&reply), Some((RCODE_NXDOMAIN, vec![])));
        drop(tcp);

        let names: Vec<(String, &str)> = recorder
            .queries_from(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST))
            .into_iter()
            .map(|q| (q.name, q.transport))
            .collect();
        assert_eq!(
            names,
            [
                ("allowed.bottle.test".to_string(), "udp"),
                ("nothing.bottle.test".to_string(), "tcp")
            ]
        );
        assert!(
            recorder
                .queries_from("127.0.0.2".parse().unwrap())
                .is_empty()
        );
    }
}
