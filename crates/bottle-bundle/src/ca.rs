//! The leaf certificates minted from the per-bottle CA for TLS interception.
//!
//! The backend makes the CA on the host with
//! [`bottle_bundle_files::generate_ca`], installs the certificate in the
//! agent's trust store and hands both PEMs to the bundle. The key never
//! leaves the bundle: [`LeafMinter`] loads it once and signs a
//! short-lived leaf per intercepted host, all leaves sharing one key pair
//! (minting is then one signature, not a key generation), each with its own
//! serial so clients never see two certificates with the same issuer+serial.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bottle_bundle_files::ca::fresh_serial;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::BundleError;
use crate::allowlist::Host;

/// How long a minted leaf is valid.
const LEAF_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// A cached leaf is re-minted after this long, well before it expires.
const LEAF_REFRESH: Duration = Duration::from_secs(24 * 3600);
/// Cap on cached leaves; the cache is cleared when it is reached.
const LEAF_CACHE_MAX: usize = 4096;

fn ca_err(detail: impl std::fmt::Display) -> BundleError {
    BundleError::Ca {
        detail: detail.to_string(),
    }
}

/// Mints and caches per-host TLS server configs signed by the bottle's CA.
pub struct LeafMinter {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    leaf_key: KeyPair,
    cache: Mutex<HashMap<Host, (Arc<ServerConfig>, Instant)>>,
}

impl std::fmt::Debug for LeafMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafMinter").finish_non_exhaustive()
    }
}

impl LeafMinter {
    /// Loads the CA from PEM text.
    pub fn new(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, BundleError> {
        let ca_key = KeyPair::from_pem(ca_key_pem)
            .map_err(|e| ca_err(format!("cannot parse the CA key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)
            .map_err(|e| ca_err(format!("cannot parse the CA certificate: {e}")))?;
        use rustls::pki_types::pem::PemObject;
        let ca_der = CertificateDer::from_pem_slice(ca_cert_pem.as_bytes())
            .map_err(|e| ca_err(format!("cannot parse the CA certificate: {e}")))?;
        let leaf_key = KeyPair::generate().map_err(ca_err)?;
        Ok(Self {
            issuer,
            ca_der,
            leaf_key,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Loads the CA from the two files named in the config.
    pub fn from_files(cert_path: &str, key_path: &str) -> Result<Self, BundleError> {
        let read = |p: &str| {
            std::fs::read_to_string(p).map_err(|e| ca_err(format!("cannot read {p}: {e}")))
        };
        Self::new(&read(cert_path)?, &read(key_path)?)
    }

    /// The TLS server config presenting a leaf for `host` (minted on first use).
    pub fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, BundleError> {
        {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((cfg, at)) = cache.get(host)
                && at.elapsed() < LEAF_REFRESH
            {
                return Ok(cfg.clone());
            }
        }
        let cfg = Arc::new(self.mint(host)?);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= LEAF_CACHE_MAX {
            cache.clear();
        }
        cache.insert(host.clone(), (cfg.clone(), Instant::now()));
        Ok(cfg)
    }

    fn mint(&self, host: &Host) -> Result<ServerConfig, BundleError> {
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(ca_err)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host.to_string());
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(fresh_serial(&host.to_string()));
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(ca_err)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut cfg =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| BundleError::Tls {
                    detail: e.to_string(),
                })?
                .with_no_client_auth()
                .with_single_cert(vec![leaf.der().clone(), self.ca_der.clone()], key)
                .map_err(|e| BundleError::Tls {
                    detail: e.to_string(),
                })?;
        // h2 first: a client that offers both gets HTTP/2, as it would from
        // the real server; the proxy serves whichever was negotiated.
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bottle_bundle_files::generate_ca;

    #[test]
    fn generated_ca_mints_distinct_leaves() {
        let ca = generate_ca("t").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.contains("PRIVATE KEY"));
        let minter = LeafMinter::new(&ca.cert_pem, &ca.key_pem).unwrap();
        let a = minter
            .server_config(&Host::Name("a.example".into()))
            .unwrap();
        let again = minter
            .server_config(&Host::Name("a.example".into()))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &again), "leaves are cached");
        let ip = minter
            .server_config(&Host::Ip("192.0.2.1".parse().unwrap()))
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &ip));
    }

    #[test]
    fn bad_pem_is_a_coded_error() {
        use bottle_core::Coded;
        let err = LeafMinter::new("nope", "nope").unwrap_err();
        assert_eq!(err.code(), "BOT-B007");
    }
}
