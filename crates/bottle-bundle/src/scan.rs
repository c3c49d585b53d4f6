//! Secret scanning of what the agent sends out.
//!
//! Patterns for well-known credential formats run over request headers, the
//! request target and the body. The body is scanned as it streams through a
//! hold-back window: the last [`Scanner::window`] bytes seen are kept back
//! until more arrive, so no byte leaves while a secret that could include it
//! is still incomplete, and memory stays bounded by one chunk plus the
//! window. The window is the longest match any pattern can make, computed
//! from the patterns themselves.
//!
//! Long random-looking tokens count as secrets too (high Shannon entropy
//! over the base64 alphabet, which catches credentials no pattern knows) in
//! query values, path segments and header values.

use bytes::{Bytes, BytesMut};
use regex::bytes::RegexSet;

/// Tokens shorter than this are never judged by entropy.
pub const ENTROPY_MIN_LEN: usize = 32;
/// Bits per character above which a long token counts as a secret.
/// Random base64 of 32+ characters scores about 4.5; hex tops out at 4.0,
/// so commit hashes, content hashes and UUIDs pass.
pub const ENTROPY_THRESHOLD: f64 = 4.3;

/// Header values that legitimately carry long random-looking tokens, so
/// only the patterns (not entropy) judge them. Each is either issued by the
/// server and merely echoed back, or a digest of the body, which is itself
/// scanned:
/// - `cookie`: session identifiers set by the upstream;
/// - `if-match`, `if-none-match`: entity tags set by the upstream;
/// - `digest`, `content-digest`, `repr-digest`: base64 hashes of the body;
/// - `content-type`: a multipart boundary is a random string by design.
///
/// The bundle's own headers (target, scheme, injected credentials) are
/// added after the scan and never reach it.
const ENTROPY_EXEMPT_HEADERS: &[&str] = &[
    "cookie",
    "if-match",
    "if-none-match",
    "digest",
    "content-digest",
    "repr-digest",
    "content-type",
];

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

// Order matters: the first matching kind is reported (Anthropic keys also
// look like OpenAI ones).
const PATTERNS: &[(&str, &str)] = &[
    ("private_key", r"-----BEGIN[ A-Z0-9]{0,32}PRIVATE KEY-----"),
    (
        "gcp_service_account",
        r#""type"\s{0,8}:\s{0,8}"service_account""#,
    ),
    (
        "gcp_service_account",
        r#""private_key"\s{0,8}:\s{0,8}"-----BEGIN"#,
    ),
    ("aws_access_key_id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("github_token", r"\b(?:ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{36}"),
    ("github_token", r"\bgithub_pat_[A-Za-z0-9_]{22}"),
    ("gitlab_token", r"\bglpat-[A-Za-z0-9_\-]{20}"),
    ("slack_token", r"\bxox[bpars]-[A-Za-z0-9\-]{10}"),
    ("anthropic_key", r"\bsk-ant-[A-Za-z0-9_\-]{20}"),
    (
        "openai_key",
        r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20}",
    ),
];

/// The compiled patterns; build once and share.
#[derive(Debug, Clone)]
pub struct Scanner {
    set: RegexSet,
    window: usize,
}

impl Scanner {
    /// Compiles the built-in patterns.
    pub fn new() -> Result<Self, crate::BundleError> {
        let invalid = |detail: String| crate::BundleError::Daemon {
            daemon: "proxy".into(),
            detail: format!("secret patterns do not compile: {detail}"),
        };
        let sources: Vec<String> = PATTERNS.iter().map(|(_, p)| format!("(?-u){p}")).collect();
        let set = RegexSet::new(&sources).map_err(|e| invalid(e.to_string()))?;
        let window = longest_match(&sources).map_err(invalid)?;
        Ok(Self { set, window })
    }

    /// The longest match any pattern can make, in bytes: a stream scanner
    /// holds back this many bytes.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Scans one complete buffer.
    pub fn scan(&self, bytes: &[u8]) -> Option<Finding> {
        // The common case is clean: one pass that can stop early, and the
        // per-pattern pass only to name what was found.
        if !self.set.is_match(bytes) {
            return None;
        }
        let m = self.set.matches(bytes);
        m.iter().next().map(|i| Finding {
            kind: PATTERNS[i].0,
        })
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
            if looks_random(&percent_decode(segment.as_bytes())) {
                return Some(Finding {
                    kind: "high_entropy_path",
                });
            }
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let value = pair.split_once('=').map_or(pair, |(_, v)| v);
            let value = percent_decode(value.as_bytes());
            for token in value.split(|b| !is_token_byte(*b)) {
                if token.len() >= ENTROPY_MIN_LEN && shannon_entropy(token) >= ENTROPY_THRESHOLD {
                    return Some(Finding {
                        kind: "high_entropy_query",
                    });
                }
            }
        }
        None
    }

    /// Scans one header (or trailer): patterns over `name: value`, entropy
    /// over the value unless the header is one that legitimately carries
    /// random tokens.
    pub fn scan_header(&self, name: &str, value: &[u8]) -> Option<Finding> {
        let line = [name.as_bytes(), b": ", value].concat();
        if let Some(f) = self.scan(&line) {
            return Some(f);
        }
        let exempt = ENTROPY_EXEMPT_HEADERS
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name));
        (!exempt && looks_random(value)).then_some(Finding {
            kind: "high_entropy_header",
        })
    }

    /// A streaming scanner for one body.
    pub fn stream(&self) -> StreamScanner {
        StreamScanner {
            scanner: self.clone(),
            held: BytesMut::with_capacity(self.window),
        }
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

/// Whether `text` holds a token that looks like a random credential: a run
/// of the base64(url) alphabet at least [`ENTROPY_MIN_LEN`] long, above
/// [`ENTROPY_THRESHOLD`], with upper case, lower case and digits all present.
/// `.` splits tokens (file names, JWT parts), and the mixed-case rule keeps
/// package file names (`numpy-1.26.4-cp312-manylinux_2_17_x86_64.whl`,
/// lower case and digits) from counting; random base64 of this length
/// lacks one of the three classes well under 1% of the time.
fn looks_random(text: &[u8]) -> bool {
    text.split(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'_' | b'-' | b'=')))
        .filter(|t| t.len() >= ENTROPY_MIN_LEN)
        .any(|t| {
            t.iter().any(u8::is_ascii_uppercase)
                && t.iter().any(u8::is_ascii_lowercase)
                && t.iter().any(u8::is_ascii_digit)
                && shannon_entropy(t) >= ENTROPY_THRESHOLD
        })
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'_' | b'-' | b'=' | b'.' | b'~')
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

/// Shannon entropy in bits per byte.
pub fn shannon_entropy(bytes: &[u8]) -> f64 {
    if bytes.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// Scans a body chunk by chunk and says which bytes may be forwarded: all
/// but the last [`Scanner::window`] bytes seen, which could still begin a
/// secret that the next chunk completes.
#[derive(Debug, Clone)]
pub struct StreamScanner {
    scanner: Scanner,
    held: BytesMut,
}

impl StreamScanner {
    /// Feeds the next chunk. Returns the bytes that are now safe to forward
    /// (possibly none), or the finding as soon as one is seen, in which case
    /// nothing of the secret has been returned before.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Bytes, Finding> {
        // Held bytes plus the chunk: every match that ends in this chunk
        // starts at most `window` bytes before it, so it lies wholly in here.
        let mut seen = BytesMut::with_capacity(self.held.len() + chunk.len());
        seen.extend_from_slice(&self.held);
        seen.extend_from_slice(chunk);
        if let Some(f) = self.scanner.scan(&seen) {
            return Err(f);
        }
        let keep = self.scanner.window.min(seen.len());
        let ready = seen.split_to(seen.len() - keep).freeze();
        self.held.clear();
        self.held.extend_from_slice(&seen);
        Ok(ready)
    }

    /// The end of the body: the held bytes, already scanned with everything
    /// before them, may now go.
    pub fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }

    /// How many bytes are held back right now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: &[(&str, &str)] = &[
        ("private_key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE"),
        ("private_key", "-----BEGIN OPENSSH PRIVATE KEY-----"),
        ("private_key", "-----BEGIN PRIVATE KEY-----"),
        (
            "gcp_service_account",
            r#"{"type": "service_account", "project_id": "p"}"#,
        ),
        ("aws_access_key_id", "key=AKIAIOSFODNN7EXAMPLE;"),
        (
            "github_token",
            "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        ),
        ("github_token", "gho_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
        (
            "github_token",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        ),
        ("gitlab_token", "glpat-abcdefghij0123456789"),
        ("slack_token", "xoxb-123456789012-abcdefghij"),
        (
            "anthropic_key",
            "x-api-key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
        ),
        (
            "openai_key",
            "Bearer sk-proj-abcdefghijklmnopqrstuvwxyz012345",
        ),
        ("openai_key", "sk-abcdefghijklmnopqrstuvwxyz012345"),
    ];

    #[test]
    fn known_formats_are_found() {
        let s = Scanner::new().unwrap();
        for (kind, text) in SAMPLES {
            assert_eq!(
                s.scan(text.as_bytes()).map(|f| f.kind),
                Some(*kind),
                "{text}"
            );
        }
    }

    #[test]
    fn ordinary_text_passes() {
        let s = Scanner::new().unwrap();
        for text in [
            "hello world",
            "task-abcdefghijklmnopqrstuvwxyz012345",
            "AKIA is a prefix",
            "ghp_short",
            r#"{"type":"user"}"#,
            "-----BEGIN CERTIFICATE-----",
        ] {
            assert_eq!(s.scan(text.as_bytes()), None, "{text}");
        }
    }

    /// Where the first secret in `body` starts, by any pattern.
    fn secret_start(body: &[u8]) -> usize {
        PATTERNS
            .iter()
            .filter_map(|(_, p)| {
                let re = regex::bytes::Regex::new(&format!("(?-u){p}")).unwrap();
                re.find(body).map(|m| m.start())
            })
            .min()
            .unwrap()
    }

    /// Feeds `parts` in order; what was released before the finding.
    fn released_before_finding(s: &Scanner, parts: &[&[u8]]) -> (Vec<u8>, Option<Finding>) {
        let mut st = s.stream();
        let mut released = Vec::new();
        for part in parts {
            match st.feed(part) {
                Ok(ready) => released.extend_from_slice(&ready),
                Err(f) => return (released, Some(f)),
            }
        }
        released.extend_from_slice(&st.finish());
        (released, None)
    }

    #[test]
    fn window_is_the_longest_possible_match() {
        let s = Scanner::new().unwrap();
        // `-----BEGIN` (10) + `[ A-Z0-9]{0,32}` (32) + `PRIVATE KEY-----`
        // (16): the private-key pattern is the longest.
        assert_eq!(s.window(), 58);
        let longest = format!("-----BEGIN{}PRIVATE KEY-----", "X".repeat(32));
        assert_eq!(longest.len(), s.window());
        assert_eq!(
            s.scan(longest.as_bytes()).map(|f| f.kind),
            Some("private_key")
        );
        for (_, p) in PATTERNS {
            let one = longest_match(&[format!("(?-u){p}")]).unwrap();
            assert!(one <= s.window(), "{p}: {one}");
        }
    }

    #[test]
    fn an_unbounded_pattern_is_refused() {
        let err = longest_match(&["(?-u)sk-[a-z]+".to_string()]).unwrap_err();
        assert!(err.contains("no longest match"), "{err}");
    }

    #[test]
    fn no_byte_of_a_secret_is_released_at_any_split_point() {
        let s = Scanner::new().unwrap();
        let longest = format!("-----BEGIN{}PRIVATE KEY-----", "X".repeat(32));
        let samples = SAMPLES
            .iter()
            .map(|(kind, text)| (*kind, (*text).to_string()))
            .chain([("private_key", longest)]);
        for (kind, text) in samples {
            let body = format!("{}{text}{}", "a ".repeat(100), " b".repeat(100));
            let bytes = body.as_bytes();
            let start = secret_start(bytes);
            // Split points further from the secret than the window all
            // behave alike: try every one near it.
            let near = start.saturating_sub(s.window() + 2)
                ..(start + text.len() + s.window() + 2).min(bytes.len());
            for split in near {
                let (released, found) =
                    released_before_finding(&s, &[&bytes[..split], &bytes[split..]]);
                let got = found.map(|f| f.kind);
                // A partial Anthropic key already looks like an OpenAI one;
                // either way it is blocked.
                let ok =
                    got == Some(kind) || (kind == "anthropic_key" && got == Some("openai_key"));
                assert!(ok, "{text} @ {split}: {got:?}");
                assert!(
                    released.len() <= start,
                    "{text} @ {split}: released {} bytes, the secret starts at {start}",
                    released.len()
                );
            }
        }
    }

    #[test]
    fn byte_by_byte_stream_is_caught_before_any_of_it_leaves() {
        let s = Scanner::new().unwrap();
        let body = b"xx AKIAIOSFODNN7EXAMPLE yy";
        let parts: Vec<&[u8]> = body.chunks(1).collect();
        let (released, found) = released_before_finding(&s, &parts);
        assert_eq!(found.map(|f| f.kind), Some("aws_access_key_id"));
        assert!(released.len() <= 3, "{released:?}");
    }

    #[test]
    fn a_clean_body_comes_out_whole_and_in_order() {
        let s = Scanner::new().unwrap();
        let body: Vec<u8> = (0..10_000u32)
            .map(|i| b"abc def\n"[i as usize % 8])
            .collect();
        for size in [1, 7, 57, 58, 59, 4096] {
            let parts: Vec<&[u8]> = body.chunks(size).collect();
            let mut st = s.stream();
            let mut out = Vec::new();
            for part in &parts {
                out.extend_from_slice(&st.feed(part).unwrap());
                assert!(st.held() <= s.window());
            }
            out.extend_from_slice(&st.finish());
            assert_eq!(out, body, "chunks of {size}");
        }
    }

    #[test]
    fn query_entropy() {
        let s = Scanner::new().unwrap();
        assert_eq!(
            s.scan_target("/x?token=Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz")
                .map(|f| f.kind),
            Some("high_entropy_query")
        );
        assert_eq!(
            s.scan_target("/x?ref=3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a"),
            None,
            "hex commit ids pass"
        );
        assert_eq!(
            s.scan_target("/x?id=123e4567-e89b-12d3-a456-426614174000"),
            None
        );
        assert_eq!(s.scan_target("/search?q=how+to+write+rust"), None);
        assert_eq!(
            s.scan_target("/x?k=AKIA%49OSFODNN7EXAMPLE").map(|f| f.kind),
            Some("aws_access_key_id"),
            "percent-encoding does not hide a key"
        );
    }

    #[test]
    fn random_path_segments_are_found() {
        let s = Scanner::new().unwrap();
        for path in [
            "/upload/Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz",
            "/a/Zk3q9P%5FxL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz/b?x=1",
            "/jwt/eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.e30.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ] {
            assert_eq!(
                s.scan_target(path).map(|f| f.kind),
                Some("high_entropy_path"),
                "{path}"
            );
        }
    }

    #[test]
    fn ordinary_paths_pass() {
        let s = Scanner::new().unwrap();
        for path in [
            "/packages/3b/12/0e6bd0a7cd1b4d1b2e8fbbc6f7b7f0f1e3fa5e6c5d6a3f1e0c2a9b8d7c6e5f4a/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            "/packages/cryptography-42.0.5-cp39-abi3-manylinux_2_28_x86_64.whl",
            "/repos/o/r/git/commits/3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a",
            "/v2/library/ubuntu/blobs/sha256:3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3f2a9c1b0e8d7f6a5b4c3d2e",
            "/uploads/123e4567-e89b-12d3-a456-426614174000",
            "/@typescript-eslint/parser/-/parser-7.1.0.tgz",
            "/github.com/!azure/azure-sdk-for-go/sdk/azcore/@v/v1.11.1.zip",
            "/nix-cache/0c1mzxrwsv0fl8bhlm4vqqnh4cq9bj3f.narinfo",
        ] {
            assert_eq!(s.scan_target(path), None, "{path}");
        }
    }

    #[test]
    fn random_header_values_are_found_except_where_expected() {
        let s = Scanner::new().unwrap();
        let token = b"Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz";
        assert_eq!(
            s.scan_header("x-debug", token).map(|f| f.kind),
            Some("high_entropy_header")
        );
        assert_eq!(
            s.scan_header("authorization", &[b"Bearer ".as_slice(), token].concat())
                .map(|f| f.kind),
            Some("high_entropy_header")
        );
        assert_eq!(
            s.scan_header("Cookie", &[b"session=".as_slice(), token].concat()),
            None
        );
        for (name, value) in [
            (
                "user-agent",
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
            ),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("x-request-id", "123e4567-e89b-12d3-a456-426614174000"),
            (
                "content-type",
                "multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW",
            ),
            (
                "content-digest",
                "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",
            ),
            ("accept", "application/vnd.github+json"),
        ] {
            assert_eq!(s.scan_header(name, value.as_bytes()), None, "{name}");
        }
        // Patterns still apply to exempt headers.
        assert_eq!(
            s.scan_header("cookie", b"k=AKIAIOSFODNN7EXAMPLE")
                .map(|f| f.kind),
            Some("aws_access_key_id")
        );
    }
}
