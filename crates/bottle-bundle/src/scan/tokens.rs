//! Random-looking tokens: credentials no pattern knows, judged by their
//! entropy, unless the value says what else it is.
//!
//! A token is a run of the base64(url) alphabet at least
//! [`ENTROPY_MIN_LEN`] long whose Shannon entropy is at least
//! [`ENTROPY_THRESHOLD`] bits per character. A credential is rarely
//! anything else; but a content digest is just as random, so a token that
//! reads as one (its algorithm's label before it and exactly that
//! algorithm's length after: `sha512-…` in npm's `pacote-integrity` and
//! SRI, `sha-256=:…:` in `Content-Digest`, `SHA-256=…` in `Digest`,
//! `sha256:…`) is judged a digest, and a multipart boundary (random by
//! design, and sent in the body anyway) a boundary. A token that is base64
//! of text (a registry's signed upload state, a base64 JSON document) is
//! judged by that text instead: a secret inside it, or a `user:password`
//! pair, is one; other text is not. Hex (commit ids, checksums, UUIDs)
//! never reaches the threshold.

use std::ops::Range;

/// Tokens shorter than this are never judged by entropy.
pub const ENTROPY_MIN_LEN: usize = 32;
/// Bits per character above which a long token counts as a secret.
/// Random base64 of 32+ characters scores about 4.5; hex tops out at 4.0,
/// so commit hashes, content hashes and UUIDs pass.
pub const ENTROPY_THRESHOLD: f64 = 4.3;

/// Where a token is, which decides how it is cut out of its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// A header value or a path segment: `.` splits tokens (file names,
    /// JWT parts), and a token needs upper case, lower case and digits
    /// (package file names such as
    /// `numpy-1.26.4-cp312-manylinux_2_17_x86_64.whl` lack upper case;
    /// random base64 of this length lacks one class well under 1% of the
    /// time).
    Value,
    /// A query value: `.` and `~` belong to tokens and any mix of classes
    /// counts.
    Query,
}

impl Place {
    fn is_token_byte(self, b: u8) -> bool {
        let base = b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'_' | b'-' | b'=');
        match self {
            Self::Value => base,
            Self::Query => base || matches!(b, b'.' | b'~'),
        }
    }
}

/// The spans of `text` that look like random credentials; `holds_secret`
/// judges the text a base64 token decodes to.
pub(super) fn random_tokens(
    text: &[u8],
    place: Place,
    holds_secret: &dyn Fn(&[u8]) -> bool,
) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    let mut start = 0;
    while start < text.len() {
        if !place.is_token_byte(text[start]) {
            start += 1;
            continue;
        }
        let end = text[start..]
            .iter()
            .position(|&b| !place.is_token_byte(b))
            .map_or(text.len(), |n| start + n);
        let token = &text[start..end];
        let encoded_text = || {
            decoded_text(token)
                .is_some_and(|decoded| !holds_secret(&decoded) && !is_user_and_password(&decoded))
        };
        if looks_random(token, place) && !is_digest(text, start..end) && !encoded_text() {
            found.push(start..end);
        }
        start = end;
    }
    found
}

fn looks_random(token: &[u8], place: Place) -> bool {
    let classes = match place {
        Place::Value => {
            token.iter().any(u8::is_ascii_uppercase)
                && token.iter().any(u8::is_ascii_lowercase)
                && token.iter().any(u8::is_ascii_digit)
        }
        Place::Query => true,
    };
    token.len() >= ENTROPY_MIN_LEN && classes && shannon_entropy(token) >= ENTROPY_THRESHOLD
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

/// What `token` decodes to as base64 (either alphabet, padded or not),
/// when that is mostly text: a random byte is printable 38% of the time
/// (24 random bytes reach 70% about once in a thousand), so 70% printable
/// is text (a signed JSON state with its 32-byte MAC in front is about
/// 80%).
fn decoded_text(token: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let decoded = [
        GeneralPurpose::new(&base64::alphabet::STANDARD, config),
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, config),
    ]
    .iter()
    .find_map(|engine| engine.decode(token).ok())?;
    let printable = decoded
        .iter()
        .filter(|&&b| b.is_ascii_graphic() || matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .count();
    (decoded.len() >= 16 && printable * 10 >= decoded.len() * 7).then_some(decoded)
}

/// Whether decoded text is a `user:password` pair (HTTP Basic's
/// credentials), whatever the password looks like.
fn is_user_and_password(text: &[u8]) -> bool {
    let Some(colon) = text.iter().position(|&b| b == b':') else {
        return false;
    };
    let (user, password) = (&text[..colon], &text[colon + 1..]);
    !user.is_empty()
        && user.len() <= 128
        && password.len() >= 6
        && !password.contains(&b':')
        && text.iter().all(u8::is_ascii_graphic)
}

/// Digest algorithms by the labels their formats write, with their
/// digest's size in bytes.
const DIGESTS: &[(&str, usize)] = &[
    ("sha512", 64),
    ("sha-512", 64),
    ("sha384", 48),
    ("sha-384", 48),
    ("sha256", 32),
    ("sha-256", 32),
    ("sha224", 28),
    ("sha-224", 28),
    ("sha1", 20),
    ("sha-1", 20),
    ("md5", 16),
];

/// Whether the token at `span` of `text` reads as a content digest or a
/// multipart boundary rather than a credential.
fn is_digest(text: &[u8], span: Range<usize>) -> bool {
    let token = &text[span.clone()];
    let before = &text[..span.start];
    // `=` is a token byte, so an unquoted boundary starts its token.
    if strip_prefix_ignore_case(token, b"boundary=").is_some()
        || ends_with_ignore_case(before, b"boundary=\"")
    {
        return true;
    }
    // The label inside the token (`sha512-…`, `SHA-256=…`), or just
    // before it (`sha-256=:…`, `sha256:…`).
    for &(label, size) in DIGESTS {
        let label = label.as_bytes();
        if let Some(rest) = strip_prefix_ignore_case(token, label)
            && let Some((&sep, value)) = rest.split_first()
            && matches!(sep, b'-' | b'=')
            && encodes_exactly(value, size)
            && label_starts_word(before)
        {
            return true;
        }
        for sep in [&b"=:"[..], b":", b"="] {
            let Some(head) = before.strip_suffix(sep) else {
                continue;
            };
            if ends_with_ignore_case(head, label)
                && label_starts_word(&head[..head.len() - label.len()])
                && encodes_exactly(token, size)
            {
                return true;
            }
        }
    }
    false
}

/// Whether a label that follows `before` starts a word (so `xsha256-` is
/// not `sha256-`).
fn label_starts_word(before: &[u8]) -> bool {
    before
        .last()
        .is_none_or(|b| !b.is_ascii_alphanumeric() && *b != b'_')
}

/// Whether `value` is exactly `size` bytes in base64 (either alphabet,
/// padded or not) or in hex.
fn encodes_exactly(value: &[u8], size: usize) -> bool {
    let hex = value.len() == size * 2 && value.iter().all(u8::is_ascii_hexdigit);
    let unpadded = value
        .iter()
        .rposition(|&b| b != b'=')
        .map_or(&value[..0], |last| &value[..=last]);
    let padding = value.len() - unpadded.len();
    let base64_len = size.div_ceil(3) * 4;
    let unpadded_len = (size * 4).div_ceil(3);
    let alphabet = unpadded
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_'));
    let base64 = alphabet
        && unpadded.len() == unpadded_len
        && (padding == 0 || unpadded.len() + padding == base64_len);
    hex || base64
}

fn strip_prefix_ignore_case<'a>(text: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (text.len() >= prefix.len() && text[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &text[prefix.len()..])
}

fn ends_with_ignore_case(text: &[u8], suffix: &[u8]) -> bool {
    text.len() >= suffix.len() && text[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str, place: Place) -> Vec<&str> {
        random_tokens(text.as_bytes(), place, &|_| false)
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    const RANDOM: &str = "Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz";

    #[test]
    fn digests_in_every_format_that_writes_them_are_not_secrets() {
        for value in [
            // npm's pacote-integrity and SRI, one or several.
            "sha512-DhNtPOeqpqfbLsDh8bn0ycJbn5+qK8e/7Vtd6NPQn9d9zJU9A/KXrdSkW6s5wSYRBaWaH0lJXRPVDBD8KOBbdw==",
            "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU= sha384-OLBgp1GsljhM2TJ+sbHjaiH9txEUvgdDTAzHv2P24donTt6/529l+9Ua0vFImLlb",
            "sha1-o7/8gL3xW9SzGzz3QTBgM3P0ydk=",
            // Content-Digest, Repr-Digest, Digest, docker.
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",
            "sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:",
            "SHA-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
            "sha256:3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3f2a9c1b0e8d7f6a5b4c3d2e",
            "md5=1B2M2Y8AsgTpgAmY7PhCfg==",
            // Unpadded base64url, as some registries write it.
            "sha256-X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE",
            "multipart/form-data; boundary=----WebKitFormBoundaryZk3q9PxL2mVb7RtY1cWn8Hd0sJgAe",
            "multipart/mixed; boundary=\"Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz\"",
        ] {
            assert_eq!(found(value, Place::Value), Vec::<&str>::new(), "{value}");
        }
    }

    #[test]
    fn a_label_does_not_launder_what_is_not_that_digest() {
        for value in [
            // The wrong length for the algorithm it names.
            format!("sha512-{RANDOM}"),
            format!("sha-256=:{RANDOM}{RANDOM}:"),
            // A label glued to another word.
            "xsha256-X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=".to_string(),
            format!("Bearer {RANDOM}"),
        ] {
            assert!(!found(&value, Place::Value).is_empty(), "{value}");
        }
    }

    #[test]
    fn query_tokens_need_no_mix_of_classes() {
        let lower = "zk3q9pxl2mvb7rty1cwn8hd0sjgaeq4ukof6itz";
        assert_eq!(found(lower, Place::Query), [lower]);
        assert!(found(lower, Place::Value).is_empty());
        assert!(found("3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a", Place::Query).is_empty());
    }

    #[test]
    fn base64_of_text_is_judged_by_the_text() {
        use base64::Engine as _;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE.encode(bytes);
        // A registry's upload state: a MAC, then JSON.
        let mut state = vec![0x9c, 0x13, 0xfe, 0x02, 0x77, 0xd1, 0x5a, 0xe8];
        state.extend_from_slice(&[0xa4; 24]);
        state.extend_from_slice(br#"{"Name":"library/app","UUID":"5f0c3a4e-9f7b-4d2a-8b1e-3c6d2f1a0b9e","Offset":1048576,"StartedAt":"2024-06-05T10:22:33.1Z"}"#);
        assert!(found(&b64(&state), Place::Query).is_empty());
        // Basic credentials, and a secret a pattern knows, are secrets.
        let basic = b64(b"deploy:Zk3q9P-xL2mVb7RtY1cWn8Hd0sJgAe");
        assert_eq!(
            found(&format!("Basic {basic}"), Place::Value),
            [basic.as_str()]
        );
        let wrapped = b64(b"{\"token\":\"ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789\"}");
        let text = format!("?s={wrapped}");
        let spans = random_tokens(text.as_bytes(), Place::Query, &|t: &[u8]| {
            t.windows(4).any(|w| w == b"ghp_")
        });
        assert_eq!(spans.len(), 1);
    }

    #[test]
    fn spans_name_the_token_within_its_text() {
        let text = format!("a=1; Bearer {RANDOM}; b");
        let spans = random_tokens(text.as_bytes(), Place::Value, &|_| false);
        assert_eq!(spans.len(), 1);
        assert_eq!(&text[spans[0].clone()], RANDOM);
    }
}
