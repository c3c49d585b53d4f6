//! The name OpenSSL looks a certificate up by in a hashed directory
//! (`/etc/ssl/certs/<hash>.0`, `openssl verify -CApath`): `X509_NAME_hash`,
//! computed here on the host so a box without `openssl` still gets the
//! entry.
//!
//! OpenSSL hashes the subject's *canonical* encoding (`x509_name_canon`):
//! every RDN's SET re-encoded with its string values as UTF8String,
//! lowercased (ASCII), trimmed and with whitespace runs collapsed; the
//! outer SEQUENCE left out. The hash is the first four bytes of SHA-1 over
//! that, read little-endian.

use base64::Engine as _;
use sha1::{Digest as _, Sha1};

/// Why a certificate could not be hashed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the certificate is not a PEM X.509 certificate: {detail}")]
pub struct CertificateError {
    detail: String,
}

fn bad(detail: &str) -> CertificateError {
    CertificateError {
        detail: detail.into(),
    }
}

/// The DER of the first `CERTIFICATE` block in `pem`.
pub fn pem_to_der(pem: &[u8]) -> Result<Vec<u8>, CertificateError> {
    let text = std::str::from_utf8(pem).map_err(|_| bad("not UTF-8"))?;
    let begin = "-----BEGIN CERTIFICATE-----";
    let start = text.find(begin).ok_or_else(|| bad("no BEGIN line"))? + begin.len();
    let len = text[start..]
        .find("-----END CERTIFICATE-----")
        .ok_or_else(|| bad("no END line"))?;
    let body: String = text[start..start + len]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| bad("the body is not base64"))
}

/// `openssl x509 -subject_hash` of the PEM certificate `pem`, as the eight
/// lowercase hex digits OpenSSL prints.
pub fn subject_hash(pem: &[u8]) -> Result<String, CertificateError> {
    let der = pem_to_der(pem)?;
    let canon = canonical_subject(&der)?;
    let digest = Sha1::digest(&canon);
    let hash = u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]);
    Ok(format!("{hash:08x}"))
}

/// One DER element: its tag, its contents, and what follows it.
struct Tlv<'a> {
    tag: u8,
    contents: &'a [u8],
    rest: &'a [u8],
}

fn tlv(input: &[u8]) -> Result<Tlv<'_>, CertificateError> {
    let (&tag, after_tag) = input.split_first().ok_or_else(|| bad("truncated"))?;
    let (&first, mut after_len) = after_tag.split_first().ok_or_else(|| bad("truncated"))?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || after_len.len() < count {
            return Err(bad("bad length"));
        }
        let (bytes, rest) = after_len.split_at(count);
        after_len = rest;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if after_len.len() < len {
        return Err(bad("truncated"));
    }
    let (contents, rest) = after_len.split_at(len);
    Ok(Tlv {
        tag,
        contents,
        rest,
    })
}

fn encode(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(contents);
    out
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const UTF8_STRING: u8 = 0x0c;

/// The canonical encoding of the certificate's subject.
fn canonical_subject(der: &[u8]) -> Result<Vec<u8>, CertificateError> {
    let certificate = tlv(der)?;
    let tbs = tlv(certificate.contents)?;
    let mut field = tlv(tbs.contents)?;
    if field.tag == 0xa0 {
        field = tlv(field.rest)?; // the explicit version; next is the serial
    }
    let signature = tlv(field.rest)?;
    let issuer = tlv(signature.rest)?;
    let validity = tlv(issuer.rest)?;
    let subject = tlv(validity.rest)?;
    if subject.tag != SEQUENCE {
        return Err(bad("the subject is not a SEQUENCE"));
    }
    let mut canon = Vec::new();
    let mut rdns = subject.contents;
    while !rdns.is_empty() {
        let rdn = tlv(rdns)?;
        rdns = rdn.rest;
        let mut attributes = Vec::new();
        let mut members = rdn.contents;
        while !members.is_empty() {
            let attribute = tlv(members)?;
            members = attribute.rest;
            let oid = tlv(attribute.contents)?;
            let value = tlv(oid.rest)?;
            let mut encoded = encode(oid.tag, oid.contents);
            match utf8_of(value.tag, value.contents) {
                Some(text) => encoded.extend(encode(UTF8_STRING, canonical_text(&text).as_bytes())),
                None => encoded.extend(encode(value.tag, value.contents)),
            }
            attributes.push(encode(SEQUENCE, &encoded));
        }
        // DER's SET OF: members in the order of their encodings.
        attributes.sort();
        canon.extend(encode(SET, &attributes.concat()));
    }
    Ok(canon)
}

/// The text of a string type OpenSSL canonicalises, as UTF-8; `None` for
/// the types it hashes unchanged (NumericString among them).
fn utf8_of(tag: u8, contents: &[u8]) -> Option<String> {
    match tag {
        // UTF8String, PrintableString, IA5String, VisibleString
        0x0c | 0x13 | 0x16 | 0x1a => Some(String::from_utf8_lossy(contents).into_owned()),
        // T61String: OpenSSL reads it as Latin-1.
        0x14 => Some(contents.iter().map(|b| char::from(*b)).collect()),
        // BMPString: UTF-16BE.
        0x1e => {
            let units: Vec<u16> = contents
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
                .collect();
            Some(String::from_utf16_lossy(&units))
        }
        // UniversalString: UTF-32BE.
        0x1c => Some(
            contents
                .chunks(4)
                .map(|c| {
                    let mut word = [0u8; 4];
                    word[..c.len()].copy_from_slice(c);
                    char::from_u32(u32::from_be_bytes(word)).unwrap_or('\u{fffd}')
                })
                .collect(),
        ),
        _ => None,
    }
}

/// OpenSSL's `asn1_string_canon`: trimmed, ASCII lowercased, every run of
/// whitespace one space.
fn canonical_text(text: &str) -> String {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r');
    let mut out = String::new();
    for word in text.split(is_space).filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&word.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate with subject `CN = Bottle  CA  test, O = Bottle`
    /// (mixed case, doubled spaces), made with `openssl req -x509`;
    /// `openssl x509 -noout -subject_hash` prints `expected` below.
    const CERT: &str = include_str!("subject_hash/test-ca.pem");

    #[test]
    fn matches_what_openssl_prints() {
        let expected = include_str!("subject_hash/test-ca.hash").trim();
        assert_eq!(subject_hash(CERT.as_bytes()).unwrap(), expected);
    }

    #[test]
    fn canonical_text_trims_lowercases_and_collapses() {
        assert_eq!(canonical_text("  Bottle \t CA\n"), "bottle ca");
    }

    #[test]
    fn not_a_certificate_is_an_error() {
        assert!(subject_hash(b"hello").is_err());
        assert!(
            subject_hash(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                .is_err()
        );
    }
}
