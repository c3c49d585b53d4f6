//! Secret scanning of what the agent sends out.
//!
//! Patterns for well-known credential formats (`rules`) run over request
//! headers, the request target and the body. The body is scanned as it
//! streams through a hold-back window ([`StreamScanner`]): the last
//! [`Scanner::window`] bytes seen are kept back until more arrive, so no
//! byte leaves while a secret that could include it is still incomplete,
//! and memory stays bounded by one chunk plus the window. The window is the
//! longest match any pattern can make, computed from the patterns
//! themselves.
//!
//! Long random-looking tokens count as secrets too (`tokens`: high
//! Shannon entropy over the base64 alphabet, which catches credentials no
//! pattern knows) in query values, path segments and header values, unless
//! the value reads as what else it is: a content digest or a multipart
//! boundary.
//!
//! What a finding does is the host's choice: it blocks the request, or it
//! is **redacted**: replaced in place by a marker of the same length
//! ([`MARKER`], then `*`), the secret's whole token with it, and the
//! request goes on. A documented example value (AWS's `…EXAMPLE` keys) is
//! no secret: it never blocks, and a redacting host still masks it.

mod rules;
mod stream;
mod tokens;

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use regex::bytes::{Regex, RegexSet};

use self::rules::{RULES, Tail, is_documented_example, passes};
pub use self::stream::StreamScanner;
pub use self::tokens::{ENTROPY_MIN_LEN, ENTROPY_THRESHOLD, shannon_entropy};
use self::tokens::{Place, random_tokens};

/// Header values that legitimately carry long random-looking tokens issued
/// by the server and merely echoed back, so only the patterns (not
/// entropy) judge them: `cookie` (session identifiers) and the entity tags
/// of `if-match` and `if-none-match`. Values the client makes itself are
/// judged by what they are (a digest, a boundary), not by the header's
/// name.
///
/// The bundle's own headers (target, scheme, injected credentials) are
/// added after the scan and never reach it.
const ENTROPY_EXEMPT_HEADERS: &[&str] = &["cookie", "if-match", "if-none-match"];

/// What a redacted secret starts with; the rest of it becomes `*`. Letters
/// and `*` only, so it is valid wherever the secret was: a JSON string, a
/// form, a header value, a path.
pub const MARKER: &[u8] = b"REDACTED";

/// A detected secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finding {
    /// Which kind (`aws_access_key_id`, `github_token`, ...).
    pub kind: &'static str,
}

impl Finding {
    /// The audit reason string.
    pub fn reason(&self) -> String {
        format!("secret:{}", self.kind)
    }
}

/// The audit reason for secrets redacted from one request: `secret:` and
/// their kinds, comma-separated, in a stable order.
pub fn redacted_reason(kinds: &BTreeSet<&'static str>) -> String {
    let kinds: Vec<&str> = kinds.iter().copied().collect();
    format!("secret:{}", kinds.join(","))
}

/// One secret in a buffer: its kind, the bytes to mask (the match and the
/// tail that goes with it), and whether it is a documented example.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hit {
    kind: &'static str,
    span: Range<usize>,
    example: bool,
    /// The token's tail, when it runs to the end of the buffer and may go
    /// on in the next one.
    open: Option<Tail>,
}

/// What [`Scanner::redact`] did to a buffer.
#[derive(Debug, Default)]
struct Redaction {
    kinds: BTreeSet<&'static str>,
    open: Option<Tail>,
}

/// The compiled patterns; build once and share. Clones share one copy
/// (and the regexes' caches with it: a clone of a `Regex` would start
/// with cold ones, and every request's body stream holds a clone).
#[derive(Debug, Clone)]
pub struct Scanner(Arc<Compiled>);

#[derive(Debug)]
struct Compiled {
    set: RegexSet,
    regexes: Vec<Regex>,
    window: usize,
}

impl Scanner {
    /// Compiles the built-in patterns.
    pub fn new() -> Result<Self, crate::BundleError> {
        let invalid = |detail: String| crate::BundleError::Daemon {
            daemon: "proxy".into(),
            detail: format!("secret patterns do not compile: {detail}"),
        };
        let sources: Vec<String> = RULES
            .iter()
            .map(|r| format!("(?-u){}", r.pattern))
            .collect();
        let set = RegexSet::new(&sources).map_err(|e| invalid(e.to_string()))?;
        let regexes = sources
            .iter()
            .map(|s| Regex::new(s))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        let window = longest_match(&sources).map_err(invalid)?;
        Ok(Self(Arc::new(Compiled {
            set,
            regexes,
            window,
        })))
    }

    /// The longest match any pattern can make, in bytes: a stream scanner
    /// holds back this many bytes.
    pub fn window(&self) -> usize {
        self.0.window
    }

    /// Scans one complete buffer: the first secret that is not a
    /// documented example, by the rules' order.
    pub fn scan(&self, bytes: &[u8]) -> Option<Finding> {
        // The common case is clean: one pass that can stop early, and the
        // per-pattern pass only to name what was found.
        if !self.0.set.is_match(bytes) {
            return None;
        }
        self.hits(bytes)
            .into_iter()
            .filter(|h| !h.example)
            .min_by_key(|h| rule_index(h.kind))
            .map(|h| Finding { kind: h.kind })
    }

    /// Every secret in `bytes`, documented examples included, with the
    /// span of its whole token.
    fn hits(&self, bytes: &[u8]) -> Vec<Hit> {
        let mut hits = Vec::new();
        for i in self.0.set.matches(bytes).iter() {
            let rule = &RULES[i];
            for m in self.0.regexes[i].find_iter(bytes) {
                if !passes(rule.check, rule.kind, m.as_bytes()) {
                    continue;
                }
                let tail = bytes[m.end()..]
                    .iter()
                    .take_while(|&&b| rule.tail.continues(b))
                    .count();
                let end = m.end() + tail;
                hits.push(Hit {
                    kind: rule.kind,
                    span: m.start()..end,
                    example: is_documented_example(rule.kind, m.as_bytes()),
                    open: (end == bytes.len() && rule.tail != Tail::None).then_some(rule.tail),
                });
            }
        }
        hits
    }

    /// Masks every secret in `bytes` in place (same length). Overlapping
    /// hits (an Anthropic key is also OpenAI-shaped) are one secret, named
    /// by the first rule.
    fn redact(&self, bytes: &mut [u8]) -> Redaction {
        let mut done = Redaction::default();
        if !self.0.set.is_match(bytes) {
            return done;
        }
        let mut hits = self.hits(bytes);
        hits.sort_by_key(|h| (h.span.start, rule_index(h.kind)));
        let mut merged: Vec<Hit> = Vec::with_capacity(hits.len());
        for hit in hits {
            match merged.last_mut() {
                Some(last) if hit.span.start < last.span.end => {
                    if hit.span.end > last.span.end {
                        last.span.end = hit.span.end;
                        last.open = hit.open;
                    }
                    if rule_index(hit.kind) < rule_index(last.kind) {
                        last.kind = hit.kind;
                    }
                }
                _ => merged.push(hit),
            }
        }
        for hit in merged {
            mask(&mut bytes[hit.span.clone()], true);
            done.kinds.insert(hit.kind);
            done.open = done.open.or(hit.open);
        }
        done
    }

    /// Scans a request target: patterns over the whole (percent-decoded)
    /// target, entropy over each path segment and each query value.
    pub fn scan_target(&self, path_and_query: &str) -> Option<Finding> {
        let decoded = percent_decode(path_and_query.as_bytes());
        if let Some(f) = self.scan(&decoded) {
            return Some(f);
        }
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        for segment in path.split('/') {
            if !random_tokens(
                &percent_decode(segment.as_bytes()),
                Place::Value,
                &self.holds_secret(),
            )
            .is_empty()
            {
                return Some(Finding {
                    kind: "high_entropy_path",
                });
            }
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let value = pair.split_once('=').map_or(pair, |(_, v)| v);
            if !random_tokens(
                &percent_decode(value.as_bytes()),
                Place::Query,
                &self.holds_secret(),
            )
            .is_empty()
            {
                return Some(Finding {
                    kind: "high_entropy_query",
                });
            }
        }
        None
    }

    /// A request target with its secrets masked and their kinds; the
    /// finding that is left when masking the target as sent does not leave
    /// it clean (a secret percent-encoded across its characters), so the
    /// request is refused instead.
    pub fn redact_target(
        &self,
        path_and_query: &str,
    ) -> Result<(String, BTreeSet<&'static str>), Finding> {
        let mut bytes = path_and_query.as_bytes().to_vec();
        let mut kinds = self.redact(&mut bytes).kinds;
        let query_at = bytes.iter().position(|&b| b == b'?').unwrap_or(bytes.len());
        // The same pieces `scan_target` judges: path segments, query values.
        let mut pieces: Vec<(Range<usize>, Place, &'static str)> = Vec::new();
        let mut start = 0;
        for segment in bytes[..query_at].split(|&b| b == b'/') {
            pieces.push((
                start..start + segment.len(),
                Place::Value,
                "high_entropy_path",
            ));
            start += segment.len() + 1;
        }
        let query = bytes.get(query_at + 1..).unwrap_or_default();
        let mut start = query_at + 1;
        for pair in query.split(|&b| b == b'&').filter(|_| !query.is_empty()) {
            let value_at = pair.iter().position(|&b| b == b'=').map_or(0, |i| i + 1);
            pieces.push((
                start + value_at..start + pair.len(),
                Place::Query,
                "high_entropy_query",
            ));
            start += pair.len() + 1;
        }
        for (piece, place, kind) in pieces {
            for span in random_tokens(&bytes[piece.clone()], place, &self.holds_secret()) {
                mask(
                    &mut bytes[piece.start + span.start..piece.start + span.end],
                    false,
                );
                kinds.insert(kind);
            }
        }
        // Masks replace ASCII runs with ASCII: the text stays UTF-8.
        let redacted = String::from_utf8_lossy(&bytes).into_owned();
        match self.scan_target(&redacted) {
            Some(left) => Err(left),
            None => Ok((redacted, kinds)),
        }
    }

    /// Scans one header (or trailer): patterns over `name: value`, entropy
    /// over the value unless the header is one that legitimately carries
    /// random tokens.
    pub fn scan_header(&self, name: &str, value: &[u8]) -> Option<Finding> {
        let line = [name.as_bytes(), b": ", value].concat();
        if let Some(f) = self.scan(&line) {
            return Some(f);
        }
        (judges_entropy(name)
            && !random_tokens(value, Place::Value, &self.holds_secret()).is_empty())
        .then_some(Finding {
            kind: "high_entropy_header",
        })
    }

    /// A header value with its secrets masked and their kinds (empty when
    /// it had none); the finding that is left when the masked header would
    /// still not pass [`Self::scan_header`], so the request is refused
    /// instead.
    pub fn redact_header(
        &self,
        name: &str,
        value: &[u8],
    ) -> Result<(Vec<u8>, BTreeSet<&'static str>), Finding> {
        let offset = name.len() + 2;
        let mut line = [name.as_bytes(), b": ", value].concat();
        let mut kinds = BTreeSet::new();
        if self.0.set.is_match(&line) {
            for hit in self.hits(&line) {
                // A match that began in the name masks only the value.
                let span = hit.span.start.max(offset)..hit.span.end;
                mask(&mut line[span], true);
                kinds.insert(hit.kind);
            }
        }
        let mut value = line.split_off(offset);
        if judges_entropy(name) {
            for span in random_tokens(&value, Place::Value, &self.holds_secret()) {
                mask(&mut value[span], true);
                kinds.insert("high_entropy_header");
            }
        }
        match self.scan_header(name, &value) {
            Some(left) => Err(left),
            None => Ok((value, kinds)),
        }
    }

    /// Whether decoded text holds a secret a pattern knows.
    fn holds_secret(&self) -> impl Fn(&[u8]) -> bool + '_ {
        |text| self.scan(text).is_some()
    }

    /// A streaming scanner for one body that blocks: it fails at the first
    /// secret, before any byte of it is released.
    pub fn stream(&self) -> StreamScanner {
        StreamScanner::new(self.clone(), false)
    }

    /// A streaming scanner for one body that redacts: every secret is
    /// masked before any byte of it is released, and the body goes on.
    pub fn redacting_stream(&self) -> StreamScanner {
        StreamScanner::new(self.clone(), true)
    }
}

/// The position of `kind`'s first rule: findings are named by it.
fn rule_index(kind: &str) -> usize {
    RULES
        .iter()
        .position(|r| r.kind == kind)
        .unwrap_or(usize::MAX)
}

/// Whether entropy judges a header's value (see [`ENTROPY_EXEMPT_HEADERS`]).
fn judges_entropy(name: &str) -> bool {
    !ENTROPY_EXEMPT_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// Overwrites a secret's bytes: [`MARKER`] first when `marked` and it
/// fits, `*` for the rest.
fn mask(bytes: &mut [u8], marked: bool) {
    let marker = if marked && bytes.len() >= MARKER.len() {
        MARKER
    } else {
        b""
    };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = marker.get(i).copied().unwrap_or(b'*');
    }
}

/// The longest match any of `patterns` can make; an error if one is
/// unbounded, since no finite hold-back could then cover it.
fn longest_match(patterns: &[String]) -> Result<usize, String> {
    let mut longest = 0;
    for pattern in patterns {
        let hir = regex_syntax::ParserBuilder::new()
            .utf8(false)
            .build()
            .parse(pattern)
            .map_err(|e| e.to_string())?;
        let max = hir
            .properties()
            .maximum_len()
            .ok_or_else(|| format!("{pattern} has no longest match"))?;
        longest = longest.max(max);
    }
    Ok(longest)
}

/// Decodes `%XX` escapes (and `+` stays as is); invalid escapes are kept.
pub fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' && i + 2 < input.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(input[i + 1]), hex(input[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests;
