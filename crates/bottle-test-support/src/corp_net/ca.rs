//! A test CA and the TLS configs built on it.

use std::io;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A CA made for one test run: its certificate (PEM, to hand to clients)
/// and its key (which never leaves this process).
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
}

fn tls_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The crypto provider every config here uses (the workspace's: ring).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TestCa {
    /// A fresh CA named `common_name`.
    pub fn new(common_name: &str) -> io::Result<TestCa> {
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(2);
        let cert = params.self_signed(&key).map_err(tls_err)?;
        Ok(TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A server config presenting a fresh leaf for `hosts`, offering `alpn`.
    pub fn server_config(&self, hosts: &[String], alpn: Vec<Vec<u8>>) -> io::Result<ServerConfig> {
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut params = CertificateParams::new(hosts.to_vec()).map_err(tls_err)?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            hosts.first().map_or("localhost", String::as_str),
        );
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(1);
        let leaf = params.signed_by(&key, &self.issuer).map_err(tls_err)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.cert_der.clone()], key)
            .map_err(tls_err)?;
        config.alpn_protocols = alpn;
        Ok(config)
    }

    /// A client config trusting this CA only, offering `alpn`.
    pub fn client_config(&self, alpn: Vec<Vec<u8>>) -> io::Result<ClientConfig> {
        client_config_trusting(self.cert_der.clone(), alpn)
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }
}

/// A client config trusting `root` only, offering `alpn`.
pub(super) fn client_config_trusting(
    root: CertificateDer<'static>,
    alpn: Vec<Vec<u8>>,
) -> io::Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(root).map_err(tls_err)?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn;
    Ok(config)
}
