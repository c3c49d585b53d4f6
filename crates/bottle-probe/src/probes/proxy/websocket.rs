//! WebSockets and redaction through the proxy: a WebSocket to the allowed
//! host (the positive control: a message comes back), a per-run fake key
//! in one message and split across the frames of one, an upgrade to a
//! denied host, and a key in a body to the host whose secrets the bundle
//! redacts. The canary echoes what it received (messages, or a body sent
//! to [`ECHO_PATH`]), so the probe sees what arrived; the harness also
//! looks for the key's first byte after its lead at the canaries.

use std::io::{Read, Write as _};
use std::time::{Duration, Instant};

use super::{CAT, snippet};
use crate::contract::{
    ECHO_PATH, REDACTION_MARKER, RunSecret, SPLIT_SECRET_FIRST, run_secret, run_secret_lead,
};
use crate::net;
use crate::probes::{Attempt, Ctx, Probe, contains, errno_name};

/// The pause between the frames of a split message (at most a third of
/// the timeout).
const FRAME_PAUSE: Duration = Duration::from_millis(300);
/// Any masking key will do: the bundle unmasks whatever the client chose.
const MASK: [u8; 4] = [0x5a, 0x13, 0xc4, 0x7e];

pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "proxy-websocket-control",
            CAT,
            false,
            "CONTROL: a WebSocket to ws://<allowed_host>/ through the proxy; a text message must come back from the canary's echo (reached = WebSockets pass)",
            websocket_control,
        ),
        Probe::new(
            "proxy-websocket-secret",
            CAT,
            false,
            "a WebSocket to ws://<allowed_host>/ through the proxy, then one text message carrying a per-run fake AWS key: blocked unless the canary echoes the key",
            |c| websocket_secret(c, false),
        ),
        Probe::new(
            "proxy-websocket-split",
            CAT,
            false,
            "the same key split across three frames of one message, with pauses: blocked unless the canary echoes the key; the harness also checks that its first byte never reached the canary",
            |c| websocket_secret(c, true),
        ),
        Probe::new(
            "proxy-websocket-denied",
            CAT,
            false,
            "a WebSocket upgrade to ws://<denied_host>/ through the proxy: blocked unless it is answered 101",
            |c| {
                let h = c.config.targets.denied_host.clone();
                match open(c, &h) {
                    Ok(_) => Attempt::reached(format!("{h} switched protocols")),
                    Err(a) => a,
                }
            },
        ),
        Probe::new(
            "proxy-redact-secret",
            CAT,
            false,
            "chunked POST http://<redact_host>/bottle-probe/echo with a per-run fake AWS key split across two chunks: blocked unless the canary echoes a byte of the key after its lead (the host redacts: the key must arrive masked)",
            redact_secret,
        ),
    ]
}

/// A WebSocket to `host` through the proxy in absolute form; the stream
/// once it answered 101, or the attempt's verdict.
fn open(c: &Ctx, host: &str) -> Result<net::Conn, Attempt> {
    let addr = net::proxy_addr(&c.config.targets.proxy).map_err(Attempt::error)?;
    let mut s = net::connect(addr, c.timeout)
        .map_err(|e| Attempt::blocked(format!("proxy {addr}: {}", errno_name(&e))))?;
    let head = format!(
        "GET http://{host}{ECHO_PATH} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bottle-probe\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: Ym90dGxlLXByb2JlLWtleQ==\r\n\r\n"
    );
    if let Err(e) = s.write_all(head.as_bytes()) {
        return Err(Attempt::blocked(format!("sending: {}", errno_name(&e))));
    }
    let reply = net::read_head(&mut s, Instant::now() + c.timeout);
    match net::status(&reply) {
        Some(101) => Ok(s),
        other => Err(Attempt::blocked(format!(
            "no switch (status {other:?}): {}",
            snippet(&reply)
        ))),
    }
}

/// One client frame, masked.
fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::from(fin) << 7 | opcode];
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n @ 126..=0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&MASK);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    out
}

/// What came back on a WebSocket.
enum Back {
    /// A message's payload.
    Message(Vec<u8>),
    /// A close frame's code (0: none given).
    Close(u16),
    /// The stream ended, failed or timed out.
    Gone(String),
}

impl Back {
    /// What came back, for the report.
    fn describe(&self) -> String {
        match self {
            Self::Message(m) => format!("a message: {}", snippet(m)),
            Self::Close(code) => format!("closed with {code}"),
            Self::Gone(why) => format!("nothing: {why}"),
        }
    }
}

/// Reads the next whole frame the server sent (servers do not fragment
/// the canary's echoes).
fn read_back(s: &mut net::Conn, deadline: Instant) -> Back {
    let mut read = |n: usize| -> Result<Vec<u8>, String> {
        let mut buf = vec![0; n];
        let mut got = 0;
        while got < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("timed out".into());
            }
            let _ = s.set_read_timeout(Some(left));
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err("the stream ended".into()),
                Ok(k) => got += k,
                Err(e) => return Err(errno_name(&e)),
            }
        }
        Ok(buf)
    };
    let head = match read(2) {
        Ok(h) => h,
        Err(e) => return Back::Gone(e),
    };
    let len = match head[1] & 0x7F {
        126 => read(2).map(|b| u64::from(u16::from_be_bytes([b[0], b[1]]))),
        127 => read(8).map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8]))),
        n => Ok(u64::from(n)),
    };
    let payload = match len.and_then(|n| read(n.min(1 << 20) as usize)) {
        Ok(p) => p,
        Err(e) => return Back::Gone(e),
    };
    match head[0] & 0x0F {
        0x8 => Back::Close(
            payload
                .get(..2)
                .map_or(0, |c| u16::from_be_bytes([c[0], c[1]])),
        ),
        _ => Back::Message(payload),
    }
}

fn websocket_control(c: &Ctx) -> Attempt {
    let h = c.config.targets.allowed_host.clone();
    let mut s = match open(c, &h) {
        Ok(s) => s,
        Err(a) => return a,
    };
    let text = format!("ws-control-{}", c.config.token);
    if let Err(e) = s.write_all(&frame(0x1, true, text.as_bytes())) {
        return Attempt::blocked(format!("sending: {}", errno_name(&e)));
    }
    match read_back(&mut s, Instant::now() + c.timeout) {
        Back::Message(m) if m == text.as_bytes() => {
            Attempt::reached(format!("{h} echoed the message"))
        }
        other => Attempt::blocked(format!("no echo: {}", other.describe())),
    }
}

fn websocket_secret(c: &Ctx, split: bool) -> Attempt {
    let h = c.config.targets.allowed_host.clone();
    let mut s = match open(c, &h) {
        Ok(s) => s,
        Err(a) => return a,
    };
    let key = run_secret(RunSecret::WebSocket, &c.config.token);
    let lead = run_secret_lead(RunSecret::WebSocket, &c.config.token);
    let frames = if split {
        let (a, b) = key.split_at(SPLIT_SECRET_FIRST);
        let (b, c2) = b.split_at(3);
        vec![
            frame(0x1, false, format!("{lead}{a}").as_bytes()),
            frame(0x0, false, b.as_bytes()),
            frame(0x0, true, format!("{c2}&end=1").as_bytes()),
        ]
    } else {
        vec![frame(0x1, true, format!("{lead}{key}&end=1").as_bytes())]
    };
    let mut sent = Ok(());
    for (i, f) in frames.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(FRAME_PAUSE.min(c.timeout / 3));
        }
        sent = s.write_all(f).and_then(|()| s.flush());
        if sent.is_err() {
            break;
        }
    }
    let stopped = sent
        .err()
        .map(|e| format!(", sending stopped: {}", errno_name(&e)))
        .unwrap_or_default();
    match read_back(&mut s, Instant::now() + c.timeout) {
        Back::Message(m) if contains(&m, &key) => {
            Attempt::reached(format!("the canary echoed the key{stopped}"))
        }
        other => Attempt::blocked(format!("no key came back: {}{stopped}", other.describe())),
    }
}

fn redact_secret(c: &Ctx) -> Attempt {
    let h = c.config.targets.redact_host.clone();
    if h.is_empty() {
        return Attempt::error("no redact_host in the config");
    }
    let addr = match net::proxy_addr(&c.config.targets.proxy) {
        Ok(a) => a,
        Err(e) => return Attempt::error(e),
    };
    let mut s = match net::connect(addr, c.timeout) {
        Ok(s) => s,
        Err(e) => return Attempt::blocked(format!("proxy {addr}: {}", errno_name(&e))),
    };
    let key = run_secret(RunSecret::Redact, &c.config.token);
    let lead = run_secret_lead(RunSecret::Redact, &c.config.token);
    let (a, b) = key.split_at(SPLIT_SECRET_FIRST);
    let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
    let head = format!(
        "POST http://{h}{ECHO_PATH} HTTP/1.1\r\nHost: {h}\r\nUser-Agent: bottle-probe\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let first = format!("note=bottle-probe-redaction&{lead}{a}");
    let mut sent = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(chunk(&first).as_bytes()))
        .and_then(|()| s.flush());
    if sent.is_ok() {
        std::thread::sleep(FRAME_PAUSE.min(c.timeout / 3));
        sent = s
            .write_all(chunk(&format!("{b}&end=1")).as_bytes())
            .and_then(|()| s.write_all(b"0\r\n\r\n"));
    }
    let reply = net::read_until_close(&mut s, Instant::now() + c.timeout);
    let status = net::status(&reply);
    let leaked = format!("{lead}{}", &key[..1]);
    if contains(&reply, &leaked) {
        Attempt::reached(format!("the canary echoed the key: {}", snippet(&reply)))
    } else if contains(&reply, &format!("{lead}{REDACTION_MARKER}")) {
        Attempt::blocked(format!(
            "status {status:?}: the key arrived masked ({REDACTION_MARKER}…)"
        ))
    } else {
        // Neither the key nor its mask came back (a refusal, or a bundle
        // down after a fault): nothing leaked; the harness's
        // `control-redact-masked` row says whether redaction worked.
        Attempt::blocked(format!(
            "status {status:?}{}, no key and no mask came back: {}",
            sent.err()
                .map(|e| format!(", sending stopped: {}", errno_name(&e)))
                .unwrap_or_default(),
            snippet(&reply)
        ))
    }
}
