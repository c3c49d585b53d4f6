//! What every target's cases share: how the bytes are delivered, and
//! mutations that know nothing of the protocol.

use std::time::Duration;

use crate::rng::Rng;

/// How a case's bytes reach the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// All at once, then the write side is shut.
    Whole,
    /// All at once; the write side is shut once the daemon starts to
    /// answer (or after [`REPLY_WAIT`]), so the request is served before
    /// the client's half-close can abort it.
    AwaitReply,
    /// In `pieces` writes `pause` apart (a slow client well within the
    /// daemon's timeouts), then the write side is shut.
    Drip {
        /// How many writes.
        pieces: usize,
        /// The pause between two writes.
        pause: Duration,
    },
    /// All at once and the connection left open: the daemon must end it
    /// itself, within its own timeouts.
    HoldOpen,
}

/// How long an [`Delivery::AwaitReply`] case waits for the daemon to start
/// answering before it shuts its write side anyway.
pub const REPLY_WAIT: Duration = Duration::from_millis(200);

/// One input for one daemon.
#[derive(Debug, Clone)]
pub struct Case {
    /// What is sent.
    pub bytes: Vec<u8>,
    /// How it is sent.
    pub delivery: Delivery,
}

impl Case {
    /// `bytes` with a delivery drawn from `rng`: mostly whole, some drips,
    /// rarely held open (each of those costs the daemon's timeout).
    pub fn deliver(rng: &mut Rng, bytes: Vec<u8>) -> Self {
        let delivery = match rng.below(64) {
            0 => Delivery::HoldOpen,
            1..=6 => Delivery::Drip {
                pieces: 2 + rng.below(6),
                pause: Duration::from_millis(1 + rng.below(40) as u64),
            },
            7..=40 => Delivery::AwaitReply,
            _ => Delivery::Whole,
        };
        Self { bytes, delivery }
    }
}

/// Bytes that are not UTF-8, or are control characters HTTP forbids.
const HOSTILE: [&[u8]; 10] = [
    b"\xff",
    b"\xc3\x28",
    b"\x00",
    b"\r",
    b"\n",
    b"\x7f",
    b"\xe2\x80\xae",
    b"\t",
    b" ",
    b"\x85",
];

/// Applies 1..=3 protocol-blind mutations to `input`.
pub fn mutate_bytes(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        let len = input.len();
        let at = rng.below(len + 1);
        match rng.below(8) {
            0 if len > 0 => input[at.min(len - 1)] ^= 1 << rng.below(8),
            1 => {
                let junk = rng.pick(&HOSTILE).to_vec();
                input.splice(at..at, junk);
            }
            2 => {
                let end = (at + rng.below(16)).min(len);
                input.drain(at..end);
            }
            3 => {
                let end = (at + rng.below(64)).min(len);
                let copy = input[at..end].to_vec();
                input.splice(end..end, copy);
            }
            4 => input.truncate(at),
            5 => {
                let random = rng.bytes_below(32);
                input.splice(at..at, random);
            }
            6 => {
                // Bare LF for CRLF (or the reverse) somewhere.
                if let Some(pos) = find(&input[at..], b"\r\n") {
                    input.remove(at + pos);
                } else if let Some(pos) = find(&input[at..], b"\n") {
                    input.insert(at + pos, b'\r');
                }
            }
            _ => {
                // A long run: oversize fields and lines.
                let byte = *rng.pick(b"a0 \t:f;");
                let run = vec![byte; 1 << (6 + rng.below(12))];
                input.splice(at..at, run);
            }
        }
    }
}

/// Where `needle` first occurs in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Replaces the first `from` in `input` by `to`.
pub fn replace_first(input: &mut Vec<u8>, from: &[u8], to: &[u8]) {
    if let Some(pos) = find(input, from) {
        input.splice(pos..pos + from.len(), to.iter().copied());
    }
}

/// An HTTP body framed one of the ways a client (or an attacker) frames
/// it: content-length, chunked, both, conflicting lengths, or a chunk
/// size no one can hold.
pub fn framed_body(rng: &mut Rng, body: &[u8]) -> (String, Vec<u8>) {
    let n = body.len();
    match rng.below(7) {
        0 => (format!("Content-Length: {n}\r\n"), body.to_vec()),
        1 => (
            "Transfer-Encoding: chunked\r\n".into(),
            chunked(rng, body, false),
        ),
        2 => (
            format!("Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n"),
            chunked(rng, body, false),
        ),
        3 => (
            format!("Content-Length: {n}\r\nContent-Length: {}\r\n", n + 1),
            body.to_vec(),
        ),
        4 => (
            "Transfer-Encoding: chunked\r\n".into(),
            chunked(rng, body, true),
        ),
        5 => (
            format!("Content-Length: {n}\r\nTransfer-Encoding: identity, chunked\r\n"),
            chunked(rng, body, false),
        ),
        _ => (
            format!(
                "Content-Length: {}\r\n",
                rng.pick(&["-1", "+5", "1e3", "99999999999999999999", "0x10", " 5 , 5"])
            ),
            body.to_vec(),
        ),
    }
}

fn chunked(rng: &mut Rng, body: &[u8], hostile_size: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in body.chunks(1 + rng.below(body.len().max(1))) {
        let size = if hostile_size && rng.one_in(2) {
            (*rng.pick(&[
                "ffffffffffffffff",
                "fffffffffffffffff0",
                "-1",
                "zz",
                "0x5",
                "5 ;ext=\"a\"",
                "",
            ]))
            .to_string()
        } else {
            format!("{:x}", piece.len())
        };
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}
