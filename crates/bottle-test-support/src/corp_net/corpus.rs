//! The corpus of what real clients send: each recorded request written to
//! a file of its own, for tests that replay it (bottle-bundle's scanner
//! replay reads them).
//!
//! The format of one file (`NNN-host-METHOD-path.http`): an HTTP/1.1-style
//! request head, then the body, raw and whole, to the end of the file:
//!
//! ```text
//! METHOD path-and-query HTTP/1.1\r\n      (HTTP/2 for an h2 request)
//! name: value\r\n                         (each header as received, in order)
//! \r\n
//! body bytes
//! ```
//!
//! Names are as hyper keeps them (lower case); values are the raw bytes.
//! An HTTP/2 request's `:authority` is in the file's name only, as the
//! proxy's scanner never sees pseudo-headers as headers either.

use std::collections::BTreeSet;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash as _, Hasher as _};
use std::io;
use std::path::{Path, PathBuf};

use hyper::Version;

use super::RecordedRequest;

/// The longest a file name's path part gets.
const MAX_SLUG: usize = 60;

/// The request as a corpus file's bytes.
pub fn corpus_bytes(request: &RecordedRequest) -> Vec<u8> {
    let version = if request.version == Version::HTTP_2 {
        "HTTP/2"
    } else {
        "HTTP/1.1"
    };
    let mut out = format!("{} {} {version}\r\n", request.method, request.target).into_bytes();
    for (name, value) in &request.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&request.body);
    out
}

/// Headers whose value is new on every request (npm's session id, a
/// WebSocket handshake's nonce): two requests differing only there are
/// the same request to the corpus.
const VOLATILE_HEADERS: &[&str] = &["npm-session", "sec-websocket-key"];

/// What makes two requests the same for the corpus: host, method, target,
/// every header but the [`VOLATILE_HEADERS`], and the body.
fn identity(request: &RecordedRequest) -> u64 {
    let mut hasher = DefaultHasher::new();
    request.host.hash(&mut hasher);
    request.method.as_str().hash(&mut hasher);
    request.target.hash(&mut hasher);
    for (name, value) in &request.headers {
        if !VOLATILE_HEADERS
            .iter()
            .any(|v| v.eq_ignore_ascii_case(name))
        {
            (name, value).hash(&mut hasher);
        }
    }
    request.body.hash(&mut hasher);
    hasher.finish()
}

/// A file name's path part: the path's letters, digits, `.`, `_` and `-`,
/// others as `_`, at most [`MAX_SLUG`] long.
fn slug(text: &str) -> String {
    let slug: String = text
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_SLUG)
        .collect();
    if slug.is_empty() { "root".into() } else { slug }
}

/// Writes each request not seen before (see [`identity`]) to `dir`, in
/// order, and returns the files written.
pub fn write_corpus(dir: &Path, requests: &[RecordedRequest]) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut seen = BTreeSet::new();
    let mut written = Vec::new();
    for request in requests {
        if !seen.insert(identity(request)) {
            continue;
        }
        let name = format!(
            "{:03}-{}-{}-{}.http",
            written.len() + 1,
            request.host,
            request.method,
            slug(request.path())
        );
        let path = dir.join(name);
        std::fs::write(&path, corpus_bytes(request))?;
        written.push(path);
    }
    Ok(written)
}
