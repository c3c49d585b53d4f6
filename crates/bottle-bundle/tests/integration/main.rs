//! Integration tests for the bundle: the real proxy (and egress behind it) on
//! loopback ephemeral ports, real upstream HTTP/HTTPS servers, real TLS.

#![expect(
    clippy::unwrap_used,
    reason = "test harness helpers outside #[test] fns: a failure must fail the test loudly"
)]

mod support;

/// A request scanned as the proxy scans it, shared with the scanner bench.
#[path = "../../benches/scanner/like_proxy.rs"]
mod like_proxy;

mod allowlist;
mod audit;
mod credentials;
mod daemons;
mod denied;
mod dns;
mod fuzz;
mod gitgate;
mod h2;
mod limits;
mod real_client_corpus;
mod relay;
mod scanner_quality;
mod secrets;
mod supervise;
mod tls;
mod websocket;
