//! A stand-in for a corporate network whose egress re-signs TLS, with the
//! upstreams behind it, all on this machine:
//!
//! - [`TestCa`]: a CA that mints leaves; one plays the upstreams' "public"
//!   CA, another the corporation's;
//! - [`TestInterface`]: a dummy interface holding TEST-NET addresses the
//!   test made (checked local with `ip route get` before use);
//! - [`ReSigningProxy`]: accepts TLS for any SNI with a leaf from the
//!   corporate CA, opens TLS to the upstream trusting only the public CA,
//!   and relays bytes; ALPN passes through, so h2 works end to end;
//! - [`Upstream`]: an HTTPS server (h1 and h2) serving a [`Site`] of static
//!   files and recording the HTTP version of every request.
//!
//! [`CorpNet`] runs a proxy and an upstream on their own tokio runtime, so
//! synchronous tests can use them.

mod ca;
mod interface;
mod proxy;
mod upstream;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

pub use ca::TestCa;
pub use hyper::Version;
pub use interface::TestInterface;
pub use proxy::ReSigningProxy;
pub use upstream::{SeenRequest, Site, Upstream};

/// A re-signing proxy in front of one upstream serving `site`, running
/// until dropped.
pub struct CorpNet {
    /// The corporate CA: what a client behind this network must trust.
    pub corp_ca: Arc<TestCa>,
    /// The proxy's listening address.
    pub proxy_addr: SocketAddr,
    upstream: Upstream,
    proxy: ReSigningProxy,
    // Dropped last: the servers' tasks end with it.
    runtime: tokio::runtime::Runtime,
}

impl CorpNet {
    /// Starts the upstream on loopback and the proxy on `proxy` (port 0:
    /// any free port).
    pub fn start(proxy: SocketAddr, site: Site) -> io::Result<CorpNet> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let public_ca = Arc::new(TestCa::new("bottle test public root")?);
        let corp_ca = Arc::new(TestCa::new("bottle test corporate inspection CA")?);
        let upstream = runtime.block_on(Upstream::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            &public_ca,
            site,
        ))?;
        let proxy = runtime.block_on(ReSigningProxy::start(
            proxy,
            corp_ca.clone(),
            &public_ca,
            upstream.addr(),
        ))?;
        Ok(CorpNet {
            corp_ca,
            proxy_addr: proxy.addr(),
            upstream,
            proxy,
            runtime,
        })
    }

    /// Every request the upstream answered, in order.
    pub fn upstream_requests(&self) -> Vec<SeenRequest> {
        self.upstream.seen()
    }

    /// Every SNI a client asked the proxy for, in order.
    pub fn proxy_server_names(&self) -> Vec<String> {
        self.proxy.server_names()
    }

    /// The runtime the servers run on, for async clients in tests.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }
}

#[cfg(test)]
mod tests {

    use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};

    use super::*;

    const HOST: &str = "files.corp.test";

    fn corp_net() -> CorpNet {
        let site = Site::new().page(HOST, "/hello.txt", "text/plain", "hello from upstream\n");
        CorpNet::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), site).unwrap()
    }

    /// Host curl through the proxy, trusting `ca_pem`; prints the body and
    /// then the HTTP version it used.
    fn curl(net: &CorpNet, ca_pem: &str, extra: &[&str]) -> CommandOutput {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        let connect_to = format!("{HOST}:443:127.0.0.1:{}", net.proxy_addr.port());
        SystemRunner
            .run(
                &CommandSpec::new("curl")
                    .args(["-sS", "--max-time", "20", "--cacert"])
                    .arg(&ca)
                    .args(["--connect-to", &connect_to, "-w", "%{http_version}"])
                    .args(extra.iter().copied())
                    .arg(format!("https://{HOST}/hello.txt")),
            )
            .unwrap()
    }

    #[test]
    fn the_proxy_re_signs_and_passes_h2_and_http1_through() {
        let net = corp_net();
        let h2 = curl(&net, net.corp_ca.cert_pem(), &["--http2"]);
        assert!(h2.success(), "{}", h2.stderr_text());
        assert_eq!(h2.stdout_text(), "hello from upstream\n2");
        let h1 = curl(&net, net.corp_ca.cert_pem(), &["--http1.1"]);
        assert_eq!(h1.stdout_text(), "hello from upstream\n1.1");
        let versions: Vec<Version> = net.upstream_requests().iter().map(|r| r.version).collect();
        assert_eq!(versions, [Version::HTTP_2, Version::HTTP_11]);
        assert_eq!(net.proxy_server_names(), [HOST, HOST]);
    }

    #[test]
    fn a_client_that_does_not_trust_the_corporate_ca_is_refused() {
        let net = corp_net();
        let other = TestCa::new("not the corporate CA").unwrap();
        let out = curl(&net, other.cert_pem(), &[]);
        assert!(!out.success());
        assert!(
            out.stderr_text().contains("certificate"),
            "{}",
            out.stderr_text()
        );
        assert!(net.upstream_requests().is_empty());
    }
}
