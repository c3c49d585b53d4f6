//! A measuring stick for the bundle's secret scanner: how many real-shaped
//! credentials it finds (recall) and how much ordinary traffic it blocks
//! (false positives).
//!
//! An honest measurement cannot be derived from the code it measures, so
//! nothing here reads the scanner's patterns. Instead:
//!
//! - [`formats`]: about fifty provider credential formats, each generated
//!   from the shape its provider (or a public rule set such as gitleaks's
//!   or trufflehog's) publishes, with a seeded generator; checksums are
//!   computed where the format has one (GitHub, npm, age);
//! - [`secret_corpus`]: every sample placed where an agent could put it —
//!   a JSON body, a form body, a header, a path segment, a query value and
//!   a gzip-compressed JSON body — as a [`Request`];
//! - [`benign`]: traffic a coding agent legitimately sends (package
//!   managers' request heads, digests, cookies, trace headers, multipart
//!   uploads, API calls, source files and lockfiles inside model calls);
//! - [`measure`]: the tally of what a scanner said about each request, and
//!   the report the bench prints.
//!
//! Everything is a pure function of a seed (and, for file-backed traffic,
//! of the files read), so two runs over the same tree measure the same
//! corpus.

pub mod benign;
pub mod formats;
pub mod measure;

use std::io::{self, Write};

use base64::Engine as _;

pub use benign::{BenignCase, FileBound, FileCorpus};
pub use formats::{FORMATS, Format};
pub use measure::{Flag, Measurement, Verdict};

pub use crate::rng::{DIGITS, HEX, Rng};

/// `0-9A-Za-z`, in the order base62 encoders use for digits.
pub const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Upper-case hex.
pub const HEX_UPPER: &[u8] = b"0123456789ABCDEF";
/// The URL-safe base64 alphabet (`-` and `_`).
pub const BASE64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
/// The standard base64 alphabet (`+` and `/`).
pub const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
/// Upper-case letters and digits.
pub const UPPER_ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
/// Letters of both cases.
pub const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Standard base64 with padding.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// URL-safe base64 without padding (JWTs, macaroons).
pub fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// One HTTP request as the agent sends it to the bundle's proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: &'static str,
    /// The request target (origin form): path and query, percent-encoded.
    pub path_and_query: String,
    /// Header names (lower case, as hyper hands them over) and values.
    pub headers: Vec<(String, String)>,
    /// The body as sent (compressed when a `content-encoding` says so).
    pub body: Vec<u8>,
    /// The body's length once its content coding is undone: what a
    /// scanner that decodes reads.
    pub content_len: usize,
}

impl Request {
    /// A request with no body.
    pub fn new(method: &'static str, host: &str, path_and_query: impl Into<String>) -> Self {
        Request {
            method,
            path_and_query: path_and_query.into(),
            headers: vec![("host".into(), host.into())],
            body: Vec::new(),
            content_len: 0,
        }
    }

    /// Adds a header (the name is lower-cased, as HTTP/2 and hyper have it).
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Sets the body, with its `content-type` and `content-length`.
    pub fn body(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self.content_len = self.body.len();
        let len = self.body.len().to_string();
        self.header("content-type", content_type)
            .header("content-length", len)
    }

    /// Sets the body gzip-compressed, with `content-encoding: gzip`.
    pub fn gzip_body(mut self, content_type: &str, content: &[u8]) -> io::Result<Self> {
        self.body = gzip(content)?;
        self.content_len = content.len();
        let len = self.body.len().to_string();
        Ok(self
            .header("content-type", content_type)
            .header("content-encoding", "gzip")
            .header("content-length", len))
    }

    /// The value of the first header called `name`.
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Gzip, as a client's `Content-Encoding: gzip` body is.
pub fn gzip(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data)?;
    encoder.finish()
}

/// A JSON string literal (quotes included), escaped as serde_json and
/// JavaScript's `JSON.stringify` escape: `"`, `\` and control characters,
/// nothing else (`/` stays).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `application/x-www-form-urlencoded` as the WHATWG URL standard's
/// serializer (browsers' `URLSearchParams`, Python's `urlencode`) writes
/// it: alphanumerics and `*-._` stay, space becomes `+`, every other byte
/// `%XX`.
pub fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// One path segment percent-encoded as RFC 3986 has it: unreserved
/// characters (`A-Za-z0-9-._~`) stay, every other byte is `%XX`.
pub fn segment_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b));
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Where in a request a secret is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Placement {
    /// A value in a JSON body (newlines escaped as `\n`).
    JsonBody,
    /// A field of an `application/x-www-form-urlencoded` body.
    FormBody,
    /// A header value (`Authorization: Bearer …`, `X-Api-Key`, ...);
    /// newlines, which a header cannot carry, written as `\n`.
    Header,
    /// One percent-encoded path segment.
    PathSegment,
    /// A query parameter's value, form-encoded.
    QueryValue,
    /// The JSON body, gzip-compressed (`Content-Encoding: gzip`).
    GzipJsonBody,
}

impl Placement {
    /// Every placement, in the order reports print them.
    pub const ALL: [Placement; 6] = [
        Placement::JsonBody,
        Placement::FormBody,
        Placement::Header,
        Placement::PathSegment,
        Placement::QueryValue,
        Placement::GzipJsonBody,
    ];

    /// The short name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Placement::JsonBody => "json",
            Placement::FormBody => "form",
            Placement::Header => "header",
            Placement::PathSegment => "path",
            Placement::QueryValue => "query",
            Placement::GzipJsonBody => "gzip-json",
        }
    }

    /// Its position in [`Placement::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One generated credential placed in one request.
#[derive(Debug, Clone)]
pub struct SecretCase {
    /// Its format.
    pub format: &'static Format,
    /// Which sample of the format (0-based).
    pub sample: usize,
    /// Where it was placed.
    pub placement: Placement,
    /// The credential itself, as generated.
    pub secret: String,
    /// The request carrying it.
    pub request: Request,
}

/// Hosts the carriers are sent to: allowlist-like API hosts, so nothing but
/// the secret stands out.
const CARRIER_HOSTS: &[&str] = &[
    "api.github.com",
    "api.anthropic.com",
    "gist.githubusercontent.com",
    "hooks.example.com",
    "paste.example.org",
];

const CARRIER_AGENTS: &[&str] = &[
    "curl/8.5.0",
    "python-requests/2.31.0",
    "node-fetch/1.0 (+https://github.com/bitinn/node-fetch)",
    "Go-http-client/1.1",
];

/// `samples` credentials of every format in [`FORMATS`], each placed in
/// every [`Placement`]: `FORMATS.len() * samples * 6` requests, a pure
/// function of `seed`.
pub fn secret_corpus(seed: u64, samples: usize) -> io::Result<Vec<SecretCase>> {
    let mut out = Vec::with_capacity(FORMATS.len() * samples * Placement::ALL.len());
    for format in FORMATS {
        for sample in 0..samples {
            let mut rng = Rng::new(seed, &format!("secret/{}/{sample}", format.name));
            let secret = (format.generate)(&mut rng);
            for placement in Placement::ALL {
                let request = place(format, &secret, placement, sample, &mut rng)?;
                out.push(SecretCase {
                    format,
                    sample,
                    placement,
                    secret: secret.clone(),
                    request,
                });
            }
        }
    }
    Ok(out)
}

/// `value` placed in `placement` in a carrier request shaped after
/// `format` (its field name, its header). Also used with a placeholder
/// value, as the carriers' own control (see [`benign`]).
pub fn place(
    format: &Format,
    value: &str,
    placement: Placement,
    variant: usize,
    rng: &mut Rng,
) -> io::Result<Request> {
    let host = *rng.pick(CARRIER_HOSTS);
    let agent = *rng.pick(CARRIER_AGENTS);
    let field = format.field;
    let endpoint = *rng.pick(&["keys", "config", "verify", "items", "notes"]);
    let base = |method, pq: String| {
        Request::new(method, host, pq)
            .header("user-agent", agent)
            .header("accept", "*/*")
    };
    let json = || -> String {
        // Three shapes a value takes in JSON: a config object, an
        // environment map (upper-case key), a chat message quoting it.
        match variant % 3 {
            0 => format!(
                r#"{{"name":"deploy-{endpoint}","{field}":{},"region":"us-east-1","enabled":true}}"#,
                json_string(value)
            ),
            1 => format!(
                r#"{{"env":{{"{}":{},"RUST_LOG":"info"}},"replicas":2}}"#,
                field.to_ascii_uppercase(),
                json_string(value)
            ),
            _ => format!(
                r#"{{"messages":[{{"role":"user","content":{}}}],"stream":false}}"#,
                json_string(&format!(
                    "here is the config:\n{field} = {value}\nwhy does it fail?"
                ))
            ),
        }
    };
    Ok(match placement {
        Placement::JsonBody => {
            base("POST", format!("/v1/{endpoint}")).body("application/json", json())
        }
        Placement::GzipJsonBody => base("POST", format!("/v1/{endpoint}"))
            .gzip_body("application/json", json().as_bytes())?,
        Placement::FormBody => base("POST", format!("/v1/{endpoint}")).body(
            "application/x-www-form-urlencoded",
            format!(
                "grant_type=client_credentials&{field}={}&scope=read",
                form_encode(value)
            ),
        ),
        Placement::Header => base("GET", format!("/v1/{endpoint}")).header(
            format.header,
            format!("{}{}", format.scheme, value.replace('\n', "\\n")),
        ),
        Placement::PathSegment => base(
            "GET",
            format!("/v1/{endpoint}/{}/status", segment_encode(value)),
        ),
        Placement::QueryValue => base(
            "GET",
            format!("/v1/{endpoint}?{field}={}&format=json", form_encode(value)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_replays_from_its_seed() {
        let a = secret_corpus(7, 2).unwrap();
        let b = secret_corpus(7, 2).unwrap();
        assert_eq!(a.len(), FORMATS.len() * 2 * 6);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.secret, y.secret);
            assert_eq!(x.request, y.request);
        }
        let c = secret_corpus(8, 2).unwrap();
        assert_ne!(a[0].secret, c[0].secret);
    }

    #[test]
    fn encoders_write_what_real_clients_write() {
        assert_eq!(form_encode("a b+c/d=e~"), "a+b%2Bc%2Fd%3De%7E");
        assert_eq!(segment_encode("a b/c~d"), "a%20b%2Fc~d");
        assert_eq!(json_string("a\"b\\c\nd/e"), r#""a\"b\\c\nd/e""#);
    }

    #[test]
    fn every_placement_carries_the_secret() {
        for case in secret_corpus(1, 1).unwrap() {
            let r = &case.request;
            let carried = match case.placement {
                Placement::JsonBody => String::from_utf8_lossy(&r.body)
                    .contains(json_string(&case.secret).trim_matches('"')),
                Placement::FormBody => {
                    String::from_utf8_lossy(&r.body).contains(&form_encode(&case.secret))
                }
                Placement::Header => r
                    .headers
                    .iter()
                    .any(|(_, v)| v.contains(&case.secret.replace('\n', "\\n"))),
                Placement::PathSegment => r.path_and_query.contains(&segment_encode(&case.secret)),
                Placement::QueryValue => r.path_and_query.contains(&form_encode(&case.secret)),
                Placement::GzipJsonBody => {
                    r.header_value("content-encoding") == Some("gzip") && r.content_len > 0
                }
            };
            assert!(carried, "{} in {}", case.format.name, case.placement.name());
        }
    }

    #[test]
    fn uuids_have_the_v4_shape() {
        let u = Rng::new(1, "u").uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}");
    }
}
