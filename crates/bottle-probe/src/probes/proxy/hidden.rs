//! Secrets a naive scanner would miss, sent through the proxy to the
//! allowed host: a key split across two chunks of one body with a pause
//! between them (the harness checks that its first half never reached the
//! canary), a key inside a gzip, deflate or brotli body, and a long random
//! token as a path segment and as a header value.

use std::io::Write as _;
use std::time::{Duration, Instant};

use super::{CAT, FAKE_AWS_KEY, judge_status_only, snippet};
use crate::contract::{SPLIT_SECRET_FIRST, seeded, split_secret, split_secret_lead};
use crate::net;
use crate::probes::{Attempt, Ctx, Probe, contains, errno_name};

/// Bytes of filler before the first half of the split key: well past the
/// scanner's hold-back window, so a bundle that streams sends some of it.
const SPLIT_FILLER: usize = 3 * 1024;
/// The pause between the two chunks (at most a third of the timeout).
const SPLIT_PAUSE: Duration = Duration::from_millis(500);

pub(super) fn probes() -> Vec<Probe> {
    let mut v = vec![Probe::new(
        "proxy-secret-split",
        CAT,
        false,
        "chunked POST http://<allowed_host>/: a few KiB, then `aws_access_key_id=` and the first half of a fake AWS key, a pause, then the second half: blocked unless the proxy answers 2xx or the token; the harness also checks that the first half never reached the canary",
        secret_split,
    )];
    for (name, coding) in [
        ("proxy-secret-gzip", Coding::Gzip),
        ("proxy-secret-deflate", Coding::Deflate),
        ("proxy-secret-br", Coding::Brotli),
    ] {
        v.push(Probe::new(
            name,
            CAT,
            false,
            format!(
                "POST http://<allowed_host>/ with Content-Encoding: {} and a fake AWS key that is not in the encoded bytes: blocked unless the proxy answers 2xx",
                coding.name()
            ),
            move |c| secret_encoded(c, coding),
        ));
    }
    v.push(Probe::new(
        "proxy-secret-entropy-path",
        CAT,
        false,
        "GET http://<allowed_host>/upload/<40 random base64 characters>: blocked unless the proxy answers 2xx",
        |c| {
            let h = &c.config.targets.allowed_host;
            let token = entropy_token(&c.config.token);
            let req = super::get_request(&format!("http://{h}/upload/{token}"), h, &[]);
            judge_status_only(c, &req)
        },
    ));
    v.push(Probe::new(
        "proxy-secret-entropy-header",
        CAT,
        false,
        "GET http://<allowed_host>/ with 40 random base64 characters in a custom header: blocked unless the proxy answers 2xx",
        |c| {
            let h = &c.config.targets.allowed_host;
            let hdr = format!("X-Trace-Blob: {}", entropy_token(&c.config.token));
            judge_status_only(c, &super::get_request(&format!("http://{h}/"), h, &[&hdr]))
        },
    ));
    v
}

/// The split key's two chunks (first, second) of the body, without the
/// chunk framing.
pub(crate) fn split_body(token: &str) -> (Vec<u8>, Vec<u8>) {
    let key = split_secret(token);
    let (a, b) = key.split_at(SPLIT_SECRET_FIRST);
    let line = "note=bottle-probe-filler-text&";
    let mut first = line.repeat(SPLIT_FILLER / line.len() + 1).into_bytes();
    first.extend_from_slice(format!("{}{a}", split_secret_lead(token)).as_bytes());
    (first, format!("{b}&end=1\n").into_bytes())
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

fn secret_split(c: &Ctx) -> Attempt {
    let h = &c.config.targets.allowed_host;
    let addr = match net::proxy_addr(&c.config.targets.proxy) {
        Ok(a) => a,
        Err(e) => return Attempt::error(e),
    };
    let mut s = match net::connect(addr, c.timeout) {
        Ok(s) => s,
        Err(e) => return Attempt::blocked(format!("proxy {addr}: {}", errno_name(&e))),
    };
    let (first, second) = split_body(&c.config.token);
    let head = format!(
        "POST http://{h}/ HTTP/1.1\r\nHost: {h}\r\nUser-Agent: bottle-probe\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let mut sent = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(&chunk(&first)))
        .and_then(|()| s.flush());
    if sent.is_ok() {
        std::thread::sleep(SPLIT_PAUSE.min(c.timeout / 3));
        sent = s
            .write_all(&chunk(&second))
            .and_then(|()| s.write_all(b"0\r\n\r\n"));
    }
    // A proxy that refuses may hang up mid-body: its answer still counts.
    let reply = net::read_until_close(&mut s, Instant::now() + c.timeout);
    let status = net::status(&reply);
    let what = format!(
        "status {status:?}{}: {}",
        sent.as_ref()
            .err()
            .map(|e| format!(", sending stopped: {}", errno_name(e)))
            .unwrap_or_default(),
        snippet(&reply)
    );
    if status.is_some_and(|s| (200..300).contains(&s)) || contains(&reply, &c.config.token) {
        Attempt::reached(format!("the proxy forwarded it: {what}"))
    } else {
        Attempt::blocked(format!("refused: {what}"))
    }
}

/// A `Content-Encoding` the bundle decodes before it scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Gzip,
    Deflate,
    Brotli,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Deflate => "deflate",
            Self::Brotli => "br",
        }
    }
}

/// The plain text the encoded probes send: filler around the fake key.
fn encoded_text() -> String {
    format!(
        "{}aws_access_key_id={FAKE_AWS_KEY}\n{}",
        "note=bottle-probe ".repeat(64),
        "end=1 ".repeat(64)
    )
}

/// `text` encoded with `coding`, the key nowhere in the bytes: gzip and
/// zlib really compress; brotli is written as uncompressed meta-blocks
/// (no encoder in the static probe) with the key split between two.
pub(crate) fn encode(coding: Coding, text: &[u8]) -> Vec<u8> {
    use flate2::Compression;
    use flate2::write::{GzEncoder, ZlibEncoder};
    let done = |r: std::io::Result<Vec<u8>>| r.unwrap_or_default();
    match coding {
        Coding::Gzip => {
            let mut e = GzEncoder::new(Vec::new(), Compression::default());
            done(e.write_all(text).and_then(|()| e.finish()))
        }
        Coding::Deflate => {
            let mut e = ZlibEncoder::new(Vec::new(), Compression::default());
            done(e.write_all(text).and_then(|()| e.finish()))
        }
        Coding::Brotli => {
            let at = text
                .windows(FAKE_AWS_KEY.len())
                .position(|w| w == FAKE_AWS_KEY.as_bytes())
                .map_or(text.len() / 2, |p| p + FAKE_AWS_KEY.len() / 2);
            brotli_stored(&[&text[..at], &text[at..]])
        }
    }
}

/// A brotli stream of uncompressed meta-blocks, one per (non-empty, at
/// most 64 KiB) part: contiguous once decoded, separated by block headers
/// on the wire. Bits are packed from the least significant end; the first
/// header follows WBITS=16 (one 0 bit).
fn brotli_stored(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        // ISLAST=0, MNIBBLES=4 (00), MLEN-1 (16 bits), ISUNCOMPRESSED=1.
        let len = part.len().clamp(1, 1 << 16) as u32;
        let header = ((len - 1) << 3) | (1 << 19);
        let bits = if i == 0 { header << 1 } else { header };
        out.extend_from_slice(&bits.to_le_bytes()[..3]);
        out.extend_from_slice(&part[..len as usize]);
    }
    // ISLAST=1, ISLASTEMPTY=1.
    out.push(0b11);
    out
}

fn secret_encoded(c: &Ctx, coding: Coding) -> Attempt {
    let h = &c.config.targets.allowed_host;
    let body = encode(coding, encoded_text().as_bytes());
    if body.is_empty() || contains(&body, FAKE_AWS_KEY) {
        return Attempt::error(format!("could not hide the key in {}", coding.name()));
    }
    let mut req = format!(
        "POST http://{h}/ HTTP/1.1\r\nHost: {h}\r\nUser-Agent: bottle-probe\r\nContent-Type: text/plain\r\nContent-Encoding: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        coding.name(),
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    judge_status_only(c, &req)
}

/// 40 distinct characters (15 upper case, 15 lower case, 10 digits) in an
/// order drawn from the run's token: a random-looking credential no
/// pattern knows, different each run. Being distinct, its entropy is
/// log2(40) ≈ 5.3 bits per character, over any threshold a scanner sets
/// for base64.
pub(crate) fn entropy_token(token: &str) -> String {
    let mut next = seeded("entropy-token", token);
    let mut shuffle = |v: &mut Vec<u8>| {
        for i in (1..v.len()).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    };
    let mut pick = |alphabet: &[u8], n: usize| {
        let mut v = alphabet.to_vec();
        shuffle(&mut v);
        v.truncate(n);
        v
    };
    let mut all = pick(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 15);
    all.extend(pick(b"abcdefghijklmnopqrstuvwxyz", 15));
    all.extend(pick(b"0123456789", 10));
    let mut next = seeded("entropy-order", token);
    for i in (1..all.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        all.swap(i, j);
    }
    String::from_utf8_lossy(&all).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_key_is_per_run_and_only_whole_across_both_chunks() {
        let key = split_secret("tok-a");
        assert_eq!(key, split_secret("tok-a"));
        assert_ne!(key, split_secret("tok-b"));
        assert_eq!(key.len(), 20);
        assert!(
            key[4..]
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        );
        let (first, second) = split_body("tok-a");
        assert!(first.len() > SPLIT_FILLER);
        let lead = split_secret_lead("tok-a");
        assert!(lead.ends_with("&aws_access_key_id="), "{lead}");
        assert!(first.ends_with(format!("{lead}{}", &key[..SPLIT_SECRET_FIRST]).as_bytes()));
        assert!(contains(
            &first,
            &crate::contract::split_secret_wire_needle("tok-a")
        ));
        assert!(!contains(&first, &key) && !contains(&second, &key));
        // Lead and first half fit in the bundle's hold-back window (58).
        assert!(lead.len() + SPLIT_SECRET_FIRST < 58);
        assert!(contains(&[first, second].concat(), &key));
    }

    #[test]
    fn encoded_bodies_hide_the_key_and_decode_to_it() {
        use std::io::Read as _;
        let text = encoded_text();
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Brotli] {
            let body = encode(coding, text.as_bytes());
            assert!(!contains(&body, FAKE_AWS_KEY), "{coding:?}");
            let mut out = String::new();
            match coding {
                Coding::Gzip => flate2::read::GzDecoder::new(&body[..])
                    .read_to_string(&mut out)
                    .unwrap(),
                Coding::Deflate => flate2::read::ZlibDecoder::new(&body[..])
                    .read_to_string(&mut out)
                    .unwrap(),
                Coding::Brotli => brotli_decompressor::Decompressor::new(&body[..], 4096)
                    .read_to_string(&mut out)
                    .unwrap(),
            };
            assert_eq!(out, text, "{coding:?}");
        }
    }

    #[test]
    fn the_entropy_token_is_per_run_mixed_and_high_entropy() {
        let t = entropy_token("tok-a");
        assert_eq!(t, entropy_token("tok-a"));
        assert_ne!(t, entropy_token("tok-b"));
        assert_eq!(t.len(), 40);
        assert!(t.bytes().any(|b| b.is_ascii_uppercase()));
        assert!(t.bytes().any(|b| b.is_ascii_lowercase()));
        assert!(t.bytes().any(|b| b.is_ascii_digit()));
        let mut seen = t.clone().into_bytes();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 40, "every character distinct: {t}");
    }
}
