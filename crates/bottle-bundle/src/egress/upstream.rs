//! The client egress dials upstreams with: TLS roots, the guarded
//! resolver, timeouts, and what a failed dial tells the agent.

use std::sync::Arc;
use std::time::Duration;

use bottle_core::bundle::BundleConfig;
use http::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::resolve::{DialRefused, GuardedResolver, ResolveFailed};
use crate::BundleError;
use crate::audit::Decision;
use crate::body::BoxBody;
use crate::proxy::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};

/// The HTTP(S) client every upstream request goes through.
pub(super) type UpstreamClient =
    Client<hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>, BoxBody>;

/// The client for `config`: its TLS roots, its resolver and its connect
/// timeout.
pub(super) fn client(config: &BundleConfig) -> Result<UpstreamClient, BundleError> {
    let tls = upstream_tls(&config.upstream_roots)?;
    let resolver = GuardedResolver::new(config)?;
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_millis(
        config.limits.connect_timeout_ms,
    )));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    // ALPN offers h2 and http/1.1 to TLS upstreams; plain HTTP stays 1.1.
    Ok(Client::builder(TokioExecutor::new())
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https))
}

/// Builds the TLS client config: web roots plus the config's extra roots.
pub fn upstream_tls(extra_roots: &[String]) -> Result<rustls::ClientConfig, BundleError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra_roots {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| BundleError::Tls {
                detail: format!("cannot read upstream root {path}: {e}"),
            })?;
        if certs.is_empty() {
            return Err(BundleError::Tls {
                detail: format!("upstream root {path} holds no certificate"),
            });
        }
        for c in certs {
            roots.add(c).map_err(|e| BundleError::Tls {
                detail: format!("upstream root {path}: {e}"),
            })?;
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| BundleError::Tls {
            detail: e.to_string(),
        })
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
