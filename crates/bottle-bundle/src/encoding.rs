//! Request bodies sent with a `Content-Encoding`: their content is what
//! must be scanned, and compressed bytes hide it from the patterns.
//!
//! Such a body is buffered (up to [`MAX_ENCODED_BODY`]), decoded as a
//! stream through every coding it names and scanned as it decodes, then
//! forwarded as the agent sent it. Decoding is bounded against compression
//! bombs: the decoded size may not exceed [`MAX_RATIO`] times the encoded
//! size (with a [`RATIO_FLOOR`], so small bodies of repetitive text pass)
//! nor [`MAX_DECODED_BODY`]. A coding the bundle cannot decode, a body that
//! does not decode, or one over a bound is refused: what cannot be scanned
//! does not leave.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::io::{self, Read};
use std::rc::Rc;

use bytes::Bytes;
use http::StatusCode;
use http::header::{self, HeaderMap};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use crate::body::{BoxBody, BoxError, boxed};
use crate::scan::{Finding, Scanner};

/// The most encoded bytes buffered for one request.
pub const MAX_ENCODED_BODY: usize = 8 << 20;
/// The most decoded bytes scanned for one request.
pub const MAX_DECODED_BODY: u64 = 64 << 20;
/// Decoded bytes allowed per encoded byte, above [`RATIO_FLOOR`].
pub const MAX_RATIO: u64 = 100;
/// Decoded size always allowed whatever the ratio.
pub const RATIO_FLOOR: u64 = 1 << 20;
/// Codings one body may stack (`Content-Encoding: gzip, br`).
const MAX_CODINGS: usize = 3;
/// Bytes decoded per read: the scanner sees them in pieces this large.
const DECODE_BUF: usize = 64 * 1024;

/// A content coding the bundle decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` (and its alias `x-gzip`), every member.
    Gzip,
    /// `deflate`: zlib-wrapped as the RFC says, or raw as some clients send.
    Deflate,
    /// `br`.
    Brotli,
}

/// Why a body is refused without being forwarded.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A secret in the decoded content (or in the encoded bytes).
    #[error("the body carries a secret ({})", .0.kind)]
    Secret(Finding),
    /// A coding the bundle does not decode, or too many of them.
    #[error(
        "the body's Content-Encoding `{0}` is not one the bundle can decode to scan (gzip, deflate, br; at most {MAX_CODINGS})"
    )]
    UnsupportedCoding(String),
    /// The body does not decode as the codings it names.
    #[error("the body does not decode as its Content-Encoding says ({0})")]
    Undecodable(String),
    /// Over [`MAX_ENCODED_BODY`] encoded or over the decoded bound.
    #[error(
        "the body is too large to scan (at most {MAX_ENCODED_BODY} bytes encoded, and {MAX_RATIO}x that or {RATIO_FLOOR} bytes decoded, up to {MAX_DECODED_BODY})"
    )]
    TooLarge,
    /// The agent's own body stream failed (malformed chunking, reset).
    #[error("the request body could not be read")]
    ClientFailed,
}

impl Refusal {
    /// The audit reason.
    pub fn reason(&self) -> String {
        match self {
            Self::Secret(f) => f.reason(),
            Self::UnsupportedCoding(_) => "unsupported_content_encoding".into(),
            Self::Undecodable(_) => "undecodable_body".into(),
            Self::TooLarge => "body_too_large_to_scan".into(),
            Self::ClientFailed => "bad_request_body".into(),
        }
    }

    /// The status the agent gets.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Secret(_) => StatusCode::FORBIDDEN,
            Self::UnsupportedCoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Undecodable(_) | Self::ClientFailed => StatusCode::BAD_REQUEST,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

/// The codings named by the request's `Content-Encoding` headers, in the
/// order they were applied; empty for none or `identity`.
pub fn codings(headers: &HeaderMap) -> Result<Vec<Coding>, Refusal> {
    let mut out = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let unsupported =
            || Refusal::UnsupportedCoding(String::from_utf8_lossy(value.as_bytes()).into_owned());
        let value = value.to_str().map_err(|_| unsupported())?;
        for name in value.split(',').map(str::trim) {
            match name.to_ascii_lowercase().as_str() {
                "" | "identity" => {}
                "gzip" | "x-gzip" => out.push(Coding::Gzip),
                "deflate" => out.push(Coding::Deflate),
                "br" => out.push(Coding::Brotli),
                _ => return Err(unsupported()),
            }
        }
        if out.len() > MAX_CODINGS {
            return Err(unsupported());
        }
    }
    Ok(out)
}

/// A body with a `Content-Encoding` as it may leave.
#[derive(Debug)]
pub enum Scanned {
    /// As the agent sent it, trailers included: nothing was found.
    AsSent(BoxBody),
    /// Decoded, with the secrets it carried masked (a host that redacts):
    /// it goes on without its `Content-Encoding`, at this length.
    Redacted {
        /// The decoded, masked body and the (masked) trailers.
        body: BoxBody,
        /// Its length, for `Content-Length`.
        len: u64,
        /// The kinds of the secrets masked.
        kinds: BTreeSet<&'static str>,
    },
}

/// Buffers `body` (bounded). Blocking, it scans it decoded and as sent and
/// returns it to forward unchanged (trailers included), or why it may not
/// go. Redacting, a body with a secret in it goes on decoded and masked.
pub async fn buffer_and_scan<B>(
    body: B,
    scanner: &Scanner,
    codings: Vec<Coding>,
    redacting: bool,
) -> Result<Scanned, Refusal>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let collected = Limited::new(body, MAX_ENCODED_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                Refusal::TooLarge
            } else {
                Refusal::ClientFailed
            }
        })?;
    let mut trailers = collected.trailers().cloned();
    let mut kinds = BTreeSet::new();
    for (name, value) in trailers.iter_mut().flatten() {
        if !redacting {
            if let Some(f) = scanner.scan_header(name.as_str(), value.as_bytes()) {
                return Err(Refusal::Secret(f));
            }
            continue;
        }
        let (masked, found) = scanner
            .redact_header(name.as_str(), value.as_bytes())
            .map_err(Refusal::Secret)?;
        if !found.is_empty() {
            // Masking writes letters and `*` only: always a valid value.
            if let Ok(masked) = header::HeaderValue::from_bytes(&masked) {
                *value = masked;
            }
            kinds.extend(found);
        }
    }
    let encoded = collected.to_bytes();
    let scanner = scanner.clone();
    let to_scan = encoded.clone();
    // Decoding is CPU work of up to tens of milliseconds: off the reactor.
    let masked = tokio::task::spawn_blocking(move || {
        if redacting {
            redact_encoded(&scanner, &codings, &to_scan).map(Some)
        } else {
            scan_encoded(&scanner, &codings, &to_scan).map(|()| None)
        }
    })
    .await
    .map_err(|e| Refusal::Undecodable(format!("the decoder stopped: {e}")))??;
    match masked {
        Some((decoded, found)) if !found.is_empty() || !kinds.is_empty() => {
            kinds.extend(found);
            let len = decoded.len() as u64;
            let body =
                Full::new(Bytes::from(decoded)).with_trailers(async move { trailers.map(Ok) });
            Ok(Scanned::Redacted {
                body: boxed(body),
                len,
                kinds,
            })
        }
        _ => {
            let body = Full::new(encoded).with_trailers(async move { trailers.map(Ok) });
            Ok(Scanned::AsSent(boxed(body)))
        }
    }
}

/// Scans `encoded` as sent and decoded through `codings` (applied in that
/// order, so undone in reverse).
pub fn scan_encoded(scanner: &Scanner, codings: &[Coding], encoded: &[u8]) -> Result<(), Refusal> {
    // As sent too: an upstream may not decode, and gzip headers carry file
    // names and comments the decoder skips.
    if let Some(f) = scanner.scan(encoded) {
        return Err(Refusal::Secret(f));
    }
    let mut stream = scanner.stream();
    decode(codings, encoded, |decoded| {
        stream.feed(decoded).map(drop).map_err(Refusal::Secret)
    })
}

/// `encoded` decoded through `codings` with every secret masked, and the
/// kinds masked; a secret in the bytes as sent (a gzip header's file name)
/// counts too, since the decoded body is what then leaves.
fn redact_encoded(
    scanner: &Scanner,
    codings: &[Coding],
    encoded: &[u8],
) -> Result<(Vec<u8>, BTreeSet<&'static str>), Refusal> {
    let mut as_sent = scanner.redacting_stream();
    as_sent.feed(encoded).map_err(Refusal::Secret)?;
    let mut stream = scanner.redacting_stream();
    let mut out = Vec::new();
    decode(codings, encoded, |decoded| {
        out.extend_from_slice(&stream.feed(decoded).map_err(Refusal::Secret)?);
        Ok(())
    })?;
    out.extend_from_slice(&stream.finish());
    let mut kinds = stream.redacted().clone();
    kinds.extend(as_sent.redacted());
    Ok((out, kinds))
}

/// Decodes `encoded` through `codings` (bounded, see [`decoded_limit`]),
/// handing each decoded piece to `each`.
fn decode(
    codings: &[Coding],
    encoded: &[u8],
    mut each: impl FnMut(&[u8]) -> Result<(), Refusal>,
) -> Result<(), Refusal> {
    if encoded.is_empty() {
        return Ok(());
    }
    let limit = decoded_limit(encoded.len());
    let exceeded = Rc::new(Cell::new(false));
    let mut reader: Box<dyn Read + '_> = Box::new(encoded);
    for coding in codings.iter().rev() {
        let decoded: Box<dyn Read + '_> = match coding {
            Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
            Coding::Deflate => deflate(reader),
            Coding::Brotli => Box::new(brotli_decompressor::reader::Decompressor::new(
                reader, DECODE_BUF,
            )),
        };
        // Every stage is bounded, so a stage that inflates what the next
        // one shrinks back cannot run away either.
        reader = Box::new(Bounded {
            inner: decoded,
            left: limit,
            exceeded: exceeded.clone(),
        });
    }
    let mut buf = vec![0; DECODE_BUF];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => each(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) if exceeded.get() => return Err(Refusal::TooLarge),
            Err(e) => return Err(Refusal::Undecodable(e.to_string())),
        }
    }
}

/// The decoded bytes allowed for `encoded_len` encoded bytes.
pub fn decoded_limit(encoded_len: usize) -> u64 {
    (encoded_len as u64)
        .saturating_mul(MAX_RATIO)
        .clamp(RATIO_FLOOR, MAX_DECODED_BODY)
}

/// `deflate` as RFC 9110 means it (zlib) when the first two bytes are a
/// zlib header, else raw deflate, which some clients send instead.
fn deflate<'a>(mut inner: Box<dyn Read + 'a>) -> Box<dyn Read + 'a> {
    let mut head = [0u8; 2];
    let mut got = 0;
    while got < head.len() {
        match inner.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Let the decoder meet the same error on its first read.
            Err(e) => return Box::new(Failed(Some(e))),
        }
    }
    let is_zlib = got == 2 && head[0] & 0x0f == 8 && u16::from_be_bytes(head) % 31 == 0;
    let whole = io::Cursor::new(head[..got].to_vec()).chain(inner);
    if is_zlib {
        Box::new(flate2::read::ZlibDecoder::new(whole))
    } else {
        Box::new(flate2::read::DeflateDecoder::new(whole))
    }
}

/// A reader that fails once with the error it holds.
struct Failed(Option<io::Error>);

impl Read for Failed {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(self
            .0
            .take()
            .unwrap_or_else(|| io::Error::other("the body could not be read")))
    }
}

/// Passes at most `left` bytes, then fails (and says so in `exceeded`) if
/// there would have been more.
struct Bounded<R> {
    inner: R,
    left: u64,
    exceeded: Rc<Cell<bool>>,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? == 0 {
                return Ok(0);
            }
            self.exceeded.set(true);
            return Err(io::Error::other("decoded body over the bound"));
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;

    use super::*;

    const AWS: &str = "AKIAZ7Q3HN2XK5WJ4T6M";

    pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// A brotli stream of uncompressed meta-blocks, one per part: the parts
    /// are contiguous once decoded but separated by block headers on the
    /// wire, so a secret split across them is not in the encoded bytes.
    pub(crate) fn brotli_stored(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        // Bits are packed from the least significant end; the first block's
        // header follows WBITS (one 0 bit: a 64 KiB window).
        let mut first = true;
        for part in parts {
            assert!(!part.is_empty() && part.len() <= 1 << 16);
            let mlen = (part.len() - 1) as u32;
            // ISLAST=0, MNIBBLES=4 (00), MLEN-1 (16 bits), ISUNCOMPRESSED=1.
            let header = (mlen << 3) | (1 << 19);
            let bits = if first { header << 1 } else { header };
            let len: usize = if first { 21 } else { 20 };
            let bytes = len.div_ceil(8);
            out.extend_from_slice(&bits.to_le_bytes()[..bytes]);
            out.extend_from_slice(part);
            first = false;
        }
        // ISLAST=1, ISLASTEMPTY=1.
        out.push(0b11);
        out
    }

    #[test]
    fn codings_are_read_in_order_and_unknown_ones_refused() {
        let mut h = HeaderMap::new();
        assert_eq!(codings(&h).unwrap(), vec![]);
        h.insert(header::CONTENT_ENCODING, "identity".parse().unwrap());
        assert_eq!(codings(&h).unwrap(), vec![]);
        h.insert(header::CONTENT_ENCODING, "gzip, BR".parse().unwrap());
        h.append(header::CONTENT_ENCODING, "deflate".parse().unwrap());
        assert_eq!(
            codings(&h).unwrap(),
            vec![Coding::Gzip, Coding::Brotli, Coding::Deflate]
        );
        for bad in ["zstd", "compress", "gzip, gzip, gzip, gzip"] {
            h.insert(header::CONTENT_ENCODING, bad.parse().unwrap());
            let err = codings(&h).unwrap_err();
            assert_eq!(err.reason(), "unsupported_content_encoding", "{bad}");
        }
    }

    #[test]
    fn secrets_hidden_by_every_coding_are_found() {
        let s = Scanner::new().unwrap();
        let text = format!(
            "{} key={AWS} {}",
            "lorem ipsum ".repeat(500),
            "dolor ".repeat(500)
        );
        let (a, b) = text.split_at(text.find(AWS).unwrap() + 8);
        let cases: Vec<(Vec<Coding>, Vec<u8>)> = vec![
            (vec![Coding::Gzip], gzip(text.as_bytes())),
            (vec![Coding::Deflate], zlib(text.as_bytes())),
            (vec![Coding::Deflate], raw_deflate(text.as_bytes())),
            (
                vec![Coding::Brotli],
                brotli_stored(&[a.as_bytes(), b.as_bytes()]),
            ),
            (
                vec![Coding::Brotli, Coding::Gzip],
                gzip(&brotli_stored(&[a.as_bytes(), b.as_bytes()])),
            ),
        ];
        for (codings, encoded) in cases {
            assert!(
                s.scan(&encoded).is_none(),
                "{codings:?}: the encoded bytes must hide the key for this test to mean anything"
            );
            let err = scan_encoded(&s, &codings, &encoded).unwrap_err();
            assert_eq!(err.reason(), "secret:aws_access_key_id", "{codings:?}");
        }
    }

    #[test]
    fn clean_encoded_bodies_pass() {
        let s = Scanner::new().unwrap();
        let text = "nothing to see here ".repeat(1000);
        scan_encoded(&s, &[Coding::Gzip], &gzip(text.as_bytes())).unwrap();
        scan_encoded(&s, &[Coding::Deflate], &zlib(text.as_bytes())).unwrap();
        scan_encoded(&s, &[Coding::Brotli], &brotli_stored(&[text.as_bytes()])).unwrap();
        scan_encoded(&s, &[Coding::Gzip], b"").unwrap();
    }

    #[test]
    fn a_secret_in_the_gzip_header_is_found() {
        let s = Scanner::new().unwrap();
        let mut e = flate2::GzBuilder::new()
            .filename(AWS)
            .write(Vec::new(), flate2::Compression::default());
        e.write_all(b"clean").unwrap();
        let encoded = e.finish().unwrap();
        let err = scan_encoded(&s, &[Coding::Gzip], &encoded).unwrap_err();
        assert_eq!(err.reason(), "secret:aws_access_key_id");
    }

    #[test]
    fn what_does_not_decode_is_refused() {
        let s = Scanner::new().unwrap();
        for (coding, bytes) in [
            (Coding::Gzip, b"not gzip at all".as_slice()),
            (Coding::Brotli, b"\xff\xff\xff\xff not brotli".as_slice()),
        ] {
            let err = scan_encoded(&s, &[coding], bytes).unwrap_err();
            assert_eq!(err.reason(), "undecodable_body", "{coding:?}: {err}");
        }
        let mut truncated = gzip(&b"x".repeat(1000));
        truncated.truncate(truncated.len() / 2);
        let err = scan_encoded(&s, &[Coding::Gzip], &truncated).unwrap_err();
        assert_eq!(err.reason(), "undecodable_body");
    }

    #[test]
    fn bombs_stop_at_the_bound() {
        let s = Scanner::new().unwrap();
        // 64 members of 1 MiB of zeros: ~64 KiB that inflate 1000-fold.
        let member = gzip(&vec![0; 1 << 20]);
        let bomb: Vec<u8> = member.repeat(64);
        assert!(decoded_limit(bomb.len()) < 64 << 20);
        let started = std::time::Instant::now();
        let err = scan_encoded(&s, &[Coding::Gzip], &bomb).unwrap_err();
        assert_eq!(err.reason(), "body_too_large_to_scan");
        // Nested: the inner stage's output is bounded too.
        let nested = gzip(&bomb);
        let err = scan_encoded(&s, &[Coding::Gzip, Coding::Gzip], &nested).unwrap_err();
        assert_eq!(err.reason(), "body_too_large_to_scan");
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn the_decoded_limit_has_a_floor_and_a_ceiling() {
        assert_eq!(decoded_limit(0), RATIO_FLOOR);
        assert_eq!(decoded_limit(1 << 20), MAX_DECODED_BODY);
        assert_eq!(decoded_limit(MAX_ENCODED_BODY), MAX_DECODED_BODY);
        assert_eq!(decoded_limit(100 << 10), 100 * (100 << 10));
    }
}
