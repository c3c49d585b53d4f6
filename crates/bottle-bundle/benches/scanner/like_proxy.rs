//! One corpus request scanned as the bundle's proxy scans it
//! (`proxy.rs`'s `forward`): the request target with `scan_target`, every
//! header with `scan_header`, then the body — streamed through
//! `Scanner::stream` when it has no content coding, buffered, decoded and
//! scanned by `encoding::buffer_and_scan` when it has one. Shared by the
//! scanner bench and the scanner-quality test (included by path), so both
//! measure the same thing.
//!
//! Unlike the proxy, which stops at the first finding, every part is
//! scanned and every finding kept: the decision (refused or not) is the
//! same, and a report can say everything that was flagged.

use bottle_bundle::encoding::{self, Refusal};
use bottle_bundle::scan::{Finding, Scanner};
use bottle_test_support::secret_corpus::{Flag, Request, Verdict};
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue};

/// The scanner the proxy builds, and a runtime for the encoded-body path
/// (which decodes on tokio's blocking pool).
pub(crate) struct LikeProxy {
    scanner: Scanner,
    runtime: tokio::runtime::Runtime,
}

impl LikeProxy {
    /// The built-in scanner, as the proxy compiles it.
    pub(crate) fn new() -> Result<Self, String> {
        let scanner = Scanner::new().map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("no tokio runtime: {e}"))?;
        Ok(LikeProxy { scanner, runtime })
    }

    /// Scans `req`, its body (when it has no content coding) once per
    /// chunk size in `chunk_sizes` (`usize::MAX`: the whole body in one
    /// frame), as the network could split it into frames. An error means
    /// the request is not one the proxy could have received: a harness
    /// error, not a finding.
    pub(crate) fn scan(&self, req: &Request, chunk_sizes: &[usize]) -> Result<Verdict, String> {
        // What hyper hands the proxy: a parsed target and a header map.
        let target = PathAndQuery::try_from(req.path_and_query.as_str())
            .map_err(|e| format!("target {:?}: {e}", req.path_and_query))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &req.headers {
            let name = HeaderName::try_from(name.as_str())
                .map_err(|e| format!("header name {name:?}: {e}"))?;
            let value = HeaderValue::try_from(value.as_str())
                .map_err(|e| format!("header {name} value {value:?}: {e}"))?;
            headers.append(name, value);
        }
        let mut verdict = Verdict {
            bytes_scanned: target.as_str().len() as u64,
            ..Verdict::default()
        };
        if let Some(f) = self.scanner.scan_target(target.as_str()) {
            verdict.flags.push(Flag::new("target", f.kind));
        }
        for (name, value) in &headers {
            verdict.bytes_scanned += (name.as_str().len() + 2 + value.len()) as u64;
            if let Some(f) = self.scanner.scan_header(name.as_str(), value.as_bytes()) {
                verdict
                    .flags
                    .push(Flag::new(format!("header {name}"), f.kind));
            }
        }
        // Whatever the body holds, a flag so far refuses the request.
        verdict.always_blocked = verdict.blocked();
        match encoding::codings(&headers) {
            Err(refusal) => {
                verdict
                    .flags
                    .push(Flag::new("body", refusal_kind(&refusal)));
                verdict.always_blocked = true;
            }
            Ok(codings) if codings.is_empty() => {
                let mut findings = Vec::new();
                for &size in chunk_sizes {
                    verdict.bytes_scanned += req.body.len() as u64;
                    if let Some(f) = stream(&self.scanner, &req.body, size) {
                        findings.push((size, f));
                    }
                }
                let every = !chunk_sizes.is_empty() && findings.len() == chunk_sizes.len();
                let same_kind = findings.windows(2).all(|w| w[0].1.kind == w[1].1.kind);
                if every && same_kind {
                    if let Some((_, f)) = findings.first() {
                        verdict.flags.push(Flag::new("body", f.kind));
                    }
                } else {
                    for (size, f) in findings {
                        let chunks = if size == usize::MAX {
                            "whole".to_string()
                        } else {
                            format!("chunks of {size}")
                        };
                        verdict
                            .flags
                            .push(Flag::new(format!("body ({chunks})"), f.kind));
                    }
                }
                verdict.always_blocked |= every;
            }
            Ok(codings) => {
                verdict.bytes_scanned += (req.body.len() + req.content_len) as u64;
                let body = http_body_util::Full::new(Bytes::from(req.body.clone()));
                let outcome = self.runtime.block_on(encoding::buffer_and_scan(
                    body,
                    &self.scanner,
                    codings,
                    false,
                ));
                if let Err(refusal) = outcome {
                    verdict
                        .flags
                        .push(Flag::new("body (decoded)", refusal_kind(&refusal)));
                    verdict.always_blocked = true;
                }
            }
        }
        Ok(verdict)
    }
}

/// `body` fed to a fresh stream scanner in frames of `size` bytes.
fn stream(scanner: &Scanner, body: &[u8], size: usize) -> Option<Finding> {
    let mut stream = scanner.stream();
    for frame in body.chunks(size.max(1)) {
        if let Err(f) = stream.feed(frame) {
            return Some(f);
        }
    }
    stream.finish();
    None
}

/// A finding's kind, or why an encoded body was refused otherwise.
fn refusal_kind(refusal: &Refusal) -> String {
    match refusal {
        Refusal::Secret(f) => f.kind.to_string(),
        other => other.reason(),
    }
}
