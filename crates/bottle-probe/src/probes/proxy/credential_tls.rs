//! A request to the credential's host the way a real client makes it:
//! `CONNECT <credential_host>:443`, TLS with the bundle (which intercepts
//! it), then `GET /` inside. The bundle's egress then injects the
//! credential and dials the canary over TLS it verifies; the canary speaks
//! no TLS, so that leg fails before any request byte, and the secret never
//! travels. What this leaves is the bundle's audit line of the injection,
//! which the harness must still find after the audit flood
//! (`audit-credential-kept`).
//!
//! The probe does not check the bundle's certificate: what is tested is
//! what the bundle does with the request, not whether the box trusts the
//! bottle's CA (the launch's own checks cover that).

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::super::{Attempt, Ctx, Probe, contains, snippet};
use super::{CAT, connect_tunnel, get_request};
use crate::net;

/// The probe's name (the harness reads its outcome).
pub(crate) const NAME: &str = "proxy-credential-tls";

pub(in crate::probes) fn probe() -> Probe {
    Probe::new(
        NAME,
        CAT,
        false,
        "CONNECT <credential_host>:443, TLS with the bundle (any certificate), then GET / inside: blocked unless answered with the token (the bundle injects the credential, and its verified TLS to the canary, which speaks none, fails); error when no HTTP answer comes back inside the TLS (then the harness cannot look for the injection's audit line)",
        credential_tls,
    )
}

fn credential_tls(c: &Ctx) -> Attempt {
    let host = &c.config.targets.credential_host;
    if host.is_empty() {
        return Attempt::skipped("no credential host");
    }
    let authority = net::authority(host, 443);
    let tcp = match connect_tunnel(c, &authority) {
        Err(a) => return a,
        Ok((status, _, s)) if (200..300).contains(&status) => s,
        Ok((_, head, _)) => {
            return Attempt::error(format!(
                "CONNECT {authority} did not open, though the host is allowed: {}",
                snippet(&head)
            ));
        }
    };
    let name = match ServerName::try_from(host.clone()) {
        Ok(n) => n,
        Err(e) => return Attempt::error(format!("{host:?} is no TLS server name: {e}")),
    };
    let config = match client_config() {
        Ok(config) => config,
        Err(e) => return Attempt::error(e),
    };
    let conn = match rustls::ClientConnection::new(config, name) {
        Ok(conn) => conn,
        Err(e) => return Attempt::error(format!("TLS client: {e}")),
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    if let Err(e) = tls.write_all(&get_request("/", host, &[])) {
        return Attempt::error(format!("TLS with the bundle failed: {e}"));
    }
    let reply = read_reply(&mut tls, Instant::now() + ANSWER_WITHIN);
    let what = format!("status {:?}: {}", net::status(&reply), snippet(&reply));
    if contains(&reply, &c.config.token) {
        Attempt::reached(format!("the credential's host answered: {what}"))
    } else if net::status(&reply).is_some() {
        Attempt::blocked(format!("answered by the bundle: {what}"))
    } else {
        Attempt::error(format!("no HTTP answer inside the TLS: {what}"))
    }
}

/// How long the bundle's answer may take: egress dials the canary and
/// waits out its TLS handshake, which the canary (reading for an HTTP head
/// that never comes) ends only after its own read timeout.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Reads until the bundle closes or `deadline`, riding out the socket's
/// per-read timeout (the probe's attempt timeout, shorter than egress's
/// answer may take).
fn read_reply(tls: &mut impl std::io::Read, deadline: Instant) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < net::READ_CAP && Instant::now() < deadline {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    got
}

/// A client that takes whatever certificate the bundle shows (see the
/// module's note), still checking the handshake's signatures.
fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS client: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
