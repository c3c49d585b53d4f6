//! The per-bottle certificate authority the bundle intercepts TLS with.
//!
//! The backend calls [`generate_ca`] when it prepares a bottle, installs the
//! certificate in the agent's trust store and hands both PEMs to the bundle,
//! which alone uses the key (to mint leaves, with [`fresh_serial`] too).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use sha2::{Digest, Sha256};

use crate::BundleFilesError;

/// How long a generated CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);

/// A CA certificate and its private key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPair {
    /// The CA certificate (install in the agent's trust store).
    pub cert_pem: String,
    /// The CA private key (give only to the bundle).
    pub key_pem: String,
}

fn ca_err(detail: impl std::fmt::Display) -> BundleFilesError {
    BundleFilesError::Ca {
        detail: detail.to_string(),
    }
}

static SERIAL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A positive 128-bit serial, distinct per call (the seed, the time, a
/// process-wide counter and the pid go into it), so that clients never see
/// two certificates with the same issuer and serial.
pub fn fresh_serial(seed: &str) -> SerialNumber {
    let mut h = Sha256::new();
    h.update(seed.as_bytes());
    h.update(
        time::OffsetDateTime::now_utc()
            .unix_timestamp_nanos()
            .to_be_bytes(),
    );
    h.update(SERIAL_COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    h.update(std::process::id().to_be_bytes());
    let mut bytes = h.finalize()[..16].to_vec();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

/// Makes a fresh CA for one bottle, valid for [`CA_VALIDITY`] (ECDSA P-256,
/// path length 0 so it can only sign leaves).
pub fn generate_ca(bottle: &str) -> Result<CaPair, BundleFilesError> {
    let key = KeyPair::generate().map_err(ca_err)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("bottle {bottle} interception CA"),
    );
    dn.push(DnType::OrganizationName, "bottle");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + CA_VALIDITY;
    params.serial_number = Some(fresh_serial(bottle));
    let cert = params.self_signed(&key).map_err(ca_err)?;
    Ok(CaPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_pem_ca_pair() {
        let ca = generate_ca("t").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.contains("PRIVATE KEY"));
        assert_ne!(generate_ca("t").unwrap(), ca, "every bottle gets its own");
    }

    #[test]
    fn serials_differ_for_the_same_seed() {
        assert_ne!(fresh_serial("a"), fresh_serial("a"));
        assert!(fresh_serial("a").as_ref()[0] < 0x80, "serials are positive");
    }
}
