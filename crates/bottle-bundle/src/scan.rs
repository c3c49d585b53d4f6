//! Secret scanning of what the agent sends out.
//!
//! Patterns for well-known credential formats run over request headers, the
//! request target and the body; the body is scanned as it streams, with a
//! bounded carry-over of the previous bytes so that a secret split across
//! chunk boundaries is still seen, without ever buffering the whole body.
//! Query-string values are also checked for high Shannon entropy (random
//! tokens), which catches credentials no pattern knows.

use regex::bytes::RegexSet;

/// Bytes of the previous chunk kept to catch secrets that straddle chunks.
/// Every pattern's shortest match is well below this.
pub const CARRY: usize = 256;
/// Query values shorter than this are never judged by entropy.
pub const ENTROPY_MIN_LEN: usize = 32;
/// Bits per character above which a long query token counts as a secret.
/// Random base64 of 32+ characters scores about 4.5; hex tops out at 4.0,
/// so commit hashes and UUIDs pass.
pub const ENTROPY_THRESHOLD: f64 = 4.3;

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
}

impl Scanner {
    /// Compiles the built-in patterns.
    pub fn new() -> Result<Self, crate::BundleError> {
        let set =
            RegexSet::new(PATTERNS.iter().map(|(_, p)| format!("(?-u){p}"))).map_err(|e| {
                crate::BundleError::Daemon {
                    daemon: "proxy".into(),
                    detail: format!("secret patterns do not compile: {e}"),
                }
            })?;
        Ok(Self { set })
    }

    /// Scans one complete buffer.
    pub fn scan(&self, bytes: &[u8]) -> Option<Finding> {
        let m = self.set.matches(bytes);
        m.iter().next().map(|i| Finding {
            kind: PATTERNS[i].0,
        })
    }

    /// Scans a request target: patterns over the whole (percent-decoded)
    /// target, entropy over each query value.
    pub fn scan_target(&self, path_and_query: &str) -> Option<Finding> {
        let decoded = percent_decode(path_and_query.as_bytes());
        if let Some(f) = self.scan(&decoded) {
            return Some(f);
        }
        let (_, query) = path_and_query.split_once('?')?;
        for pair in query.split('&') {
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

    /// A streaming scanner for one body.
    pub fn stream(&self) -> StreamScanner {
        StreamScanner {
            scanner: self.clone(),
            tail: Vec::with_capacity(CARRY),
        }
    }
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

/// Scans a body chunk by chunk, seeing across chunk boundaries.
#[derive(Debug, Clone)]
pub struct StreamScanner {
    scanner: Scanner,
    tail: Vec<u8>,
}

impl StreamScanner {
    /// Feeds the next chunk; returns a finding as soon as one is seen.
    pub fn feed(&mut self, chunk: &[u8]) -> Option<Finding> {
        if chunk.is_empty() {
            return None;
        }
        // The junction (carry + head of this chunk) catches straddling
        // secrets; the chunk itself is scanned in place, without copying.
        if !self.tail.is_empty() {
            let mut junction = Vec::with_capacity(self.tail.len() + CARRY.min(chunk.len()));
            junction.extend_from_slice(&self.tail);
            junction.extend_from_slice(&chunk[..CARRY.min(chunk.len())]);
            if let Some(f) = self.scanner.scan(&junction) {
                return Some(f);
            }
        }
        if let Some(f) = self.scanner.scan(chunk) {
            return Some(f);
        }
        if chunk.len() >= CARRY {
            self.tail.clear();
            self.tail.extend_from_slice(&chunk[chunk.len() - CARRY..]);
        } else {
            self.tail.extend_from_slice(chunk);
            let excess = self.tail.len().saturating_sub(CARRY);
            self.tail.drain(..excess);
        }
        None
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

    #[test]
    fn every_split_point_is_caught() {
        let s = Scanner::new().unwrap();
        for (kind, text) in SAMPLES {
            let body = format!("{}{text}{}", "a ".repeat(300), " b".repeat(300));
            let bytes = body.as_bytes();
            for split in 590..bytes.len().min(700) {
                let mut st = s.stream();
                let first = st.feed(&bytes[..split]);
                let second = st.feed(&bytes[split..]);
                let got = first.or(second).map(|f| f.kind);
                // A partial Anthropic key already looks like an OpenAI one;
                // either way it is blocked.
                let ok =
                    got == Some(*kind) || (*kind == "anthropic_key" && got == Some("openai_key"));
                assert!(ok, "{text} @ {split}: {got:?}");
            }
        }
    }

    #[test]
    fn byte_by_byte_stream_is_caught() {
        let s = Scanner::new().unwrap();
        let mut st = s.stream();
        let found = "xx AKIAIOSFODNN7EXAMPLE yy"
            .as_bytes()
            .chunks(1)
            .find_map(|c| st.feed(c));
        assert_eq!(found.map(|f| f.kind), Some("aws_access_key_id"));
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
}
