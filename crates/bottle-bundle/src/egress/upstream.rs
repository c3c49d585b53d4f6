//! The client egress dials upstreams with: TLS roots, the guarded
//! resolver, timeouts, and what a failed dial tells the agent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bottle_core::bundle::BundleConfig;
use http::{StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::resolve::{DialRefused, GuardedResolver, ResolveFailed};
use crate::BundleError;
use crate::audit::Decision;
use crate::body::BoxBody;
use crate::io::ReadBuffered;
use crate::proxy::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};

/// The HTTP(S) client every upstream request goes through.
pub(super) type UpstreamClient =
    Client<hyper_rustls::HttpsConnector<ReadBufferedConnector>, BoxBody>;

/// The TCP connector under the upstream TLS: each connection read through
/// a [`ReadBuffered`] buffer, so that rustls's 4 KiB reads of a download
/// cost no system call each.
#[derive(Clone)]
pub(super) struct ReadBufferedConnector(HttpConnector<GuardedResolver>);

impl tower_service::Service<Uri> for ReadBufferedConnector {
    type Response = TokioIo<ReadBuffered<TcpStream>>;
    type Error = <HttpConnector<GuardedResolver> as tower_service::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?.into_inner();
            Ok(TokioIo::new(ReadBuffered::new(tcp)))
        })
    }
}

/// The HTTP versions a client offers upstreams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Versions {
    /// h2 or HTTP/1.1, as TLS's ALPN settles.
    Any,
    /// HTTP/1.1 only: the one an upgrade rides.
    Http1,
}

/// The client for `config`: its TLS roots, its resolver and its connect
/// timeout.
pub(super) fn client(
    config: &BundleConfig,
    versions: Versions,
) -> Result<UpstreamClient, BundleError> {
    let tls = upstream_tls(&config.upstream_roots, config.upstream_web_roots)?;
    let resolver = GuardedResolver::new(config)?;
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_millis(
        config.limits.connect_timeout_ms,
    )));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match versions {
        Versions::Any => builder
            .enable_all_versions()
            .wrap_connector(ReadBufferedConnector(http)),
        Versions::Http1 => builder
            .enable_http1()
            .wrap_connector(ReadBufferedConnector(http)),
    };
    // ALPN offers h2 and http/1.1 to TLS upstreams; plain HTTP stays 1.1.
    Ok(Client::builder(TokioExecutor::new())
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https))
}

/// Builds the TLS client config: the roots of `upstream_roots` (the web
/// roots when `web_roots`, plus every certificate in `root_files`).
pub fn upstream_tls(
    root_files: &[String],
    web_roots: bool,
) -> Result<rustls::ClientConfig, BundleError> {
    let roots = upstream_roots(root_files, web_roots)?;
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| BundleError::Tls {
            detail: e.to_string(),
        })
}

/// The roots upstream certificates must chain to: the compiled-in web
/// roots when `web_roots`, and every certificate in `root_files`. A system
/// store may hold certificates rustls cannot use; those are skipped, but a
/// file with none it can use is an error, as is trusting nothing.
pub(super) fn upstream_roots(
    root_files: &[String],
    web_roots: bool,
) -> Result<rustls::RootCertStore, BundleError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if web_roots {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    for path in root_files {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| BundleError::UpstreamRoots {
                detail: format!("cannot read {path}: {e}"),
            })?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(BundleError::UpstreamRoots {
                detail: format!("{path} holds no usable CA certificate"),
            });
        }
    }
    if roots.is_empty() {
        return Err(BundleError::UpstreamRoots {
            detail: "no roots: the web roots are off and no root file is given".into(),
        });
    }
    Ok(roots)
}

/// Why a TLS handshake with an upstream failed: the audit reason and the
/// words for the agent.
fn tls_failure(error: &rustls::Error) -> (&'static str, String) {
    use rustls::CertificateError as Cert;
    match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            Cert::UnknownIssuer => (
                "tls_unknown_issuer",
                "its certificate was issued by an unknown CA (UnknownIssuer)".into(),
            ),
            Cert::Expired | Cert::ExpiredContext { .. } => (
                "tls_expired",
                format!("its certificate has expired ({cert:?})"),
            ),
            Cert::NotValidForName | Cert::NotValidForNameContext { .. } => (
                "tls_name_mismatch",
                "its certificate is not valid for this name (NotValidForName)".into(),
            ),
            other => (
                "tls_bad_certificate",
                format!("its certificate was refused ({other:?})"),
            ),
        },
        other => (
            "tls_handshake_failed",
            format!("the handshake failed: {other}"),
        ),
    }
}

/// The HTTP/1.1 reason phrase of a 502 for a failed upstream TLS
/// handshake (audit `reason`): tools such as pip print the status line
/// but never the body, so the cause goes there too.
pub(super) fn tls_reason_phrase(reason: &str) -> Option<&'static [u8]> {
    Some(match reason {
        "tls_unknown_issuer" => {
            b"Bad Gateway: upstream TLS certificate from an unknown CA (see egress.upstream_ca)"
        }
        "tls_expired" => b"Bad Gateway: upstream TLS certificate expired",
        "tls_name_mismatch" => b"Bad Gateway: upstream TLS certificate not valid for the name",
        "tls_bad_certificate" => b"Bad Gateway: upstream TLS certificate refused",
        "tls_handshake_failed" => b"Bad Gateway: upstream TLS handshake failed",
        _ => return None,
    })
}

/// What an operator behind a re-signing network does about an unknown
/// issuer; the agent cannot, but it can pass the words on.
const UNKNOWN_ISSUER_FIX: &str = "If your network re-signs TLS, give the bundle that CA: \
    egress.upstream_ca = [\"/path/to/ca.pem\"] or egress.upstream_trust = \"system\" in bottle.toml.";

/// The rustls error somewhere in `error`'s chain. A handshake failure
/// reaches hyper as an `io::Error` wrapping an `io::Error` wrapping the
/// rustls error, and `io::Error::source` skips the error it wraps, so look
/// inside each one as well as down the chain.
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let wrapped = error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    wrapped
        .and_then(rustls_error)
        .or_else(|| error.source().and_then(rustls_error))
}

/// The status, decision, reason and message egress answers a failed
/// upstream request with.
pub(super) fn classify_upstream_error(
    e: &hyper_util::client::legacy::Error,
    host: &str,
) -> (StatusCode, Decision, &'static str, String) {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<DialRefused>() {
            return (
                StatusCode::FORBIDDEN,
                Decision::Deny,
                "dial_refused",
                format!("bottle: refused: {r}"),
            );
        }
        if let Some(r) = s.downcast_ref::<ResolveFailed>() {
            return (
                StatusCode::BAD_GATEWAY,
                Decision::Error,
                "resolve_failed",
                format!("bottle: {r}"),
            );
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return (
                StatusCode::GATEWAY_TIMEOUT,
                Decision::Error,
                "upstream_timeout",
                format!("bottle: timed out connecting to {host}"),
            );
        }
        src = s.source();
    }
    if let Some(tls) = rustls_error(e) {
        let (reason, what) = tls_failure(tls);
        let fix = if reason == "tls_unknown_issuer" {
            format!(" {UNKNOWN_ISSUER_FIX}")
        } else {
            String::new()
        };
        return (
            StatusCode::BAD_GATEWAY,
            Decision::Error,
            reason,
            format!("bottle: TLS to {host} failed: {what}.{fix}"),
        );
    }
    let mut detail = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        src = s.source();
    }
    (
        StatusCode::BAD_GATEWAY,
        Decision::Error,
        "upstream_error",
        format!("bottle: upstream {host} failed: {detail}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_file(dir: &std::path::Path, name: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, crate::generate_ca(name).unwrap().cert_pem).unwrap();
        path.display().to_string()
    }

    #[test]
    fn web_roots_are_trusted_unless_switched_off() {
        let dir = tempfile::tempdir().unwrap();
        let corp = ca_file(dir.path(), "corp");
        let web = webpki_roots::TLS_SERVER_ROOTS.len();
        assert_eq!(upstream_roots(&[], true).unwrap().len(), web);
        assert_eq!(
            upstream_roots(std::slice::from_ref(&corp), true)
                .unwrap()
                .len(),
            web + 1
        );
        assert_eq!(upstream_roots(&[corp], false).unwrap().len(), 1);
    }

    #[test]
    fn trusting_nothing_or_a_file_without_certificates_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = upstream_roots(&[], false).unwrap_err();
        assert!(matches!(err, BundleError::UpstreamRoots { .. }), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = upstream_roots(&[empty.display().to_string()], true).unwrap_err();
        assert!(
            err.to_string().contains("no usable CA certificate"),
            "{err}"
        );
        let missing = dir.path().join("missing.pem").display().to_string();
        let err = upstream_roots(&[missing], true).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }
}
