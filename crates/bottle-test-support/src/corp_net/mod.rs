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
//! - [`Upstream`]: an HTTPS server (h1 and h2) serving a [`Site`] by host:
//!   static pages (an npm registry, [`npm_registry`], and a Python index,
//!   [`python_index`], are pages made by the real tools), git's smart HTTP
//!   ([`Site::git_smart_http`]) and a WebSocket echo
//!   ([`Site::websocket_echo`]), recording every request whole
//!   ([`RecordedRequest`]; [`write_corpus`] writes them to files);
//! - [`ConnectProxy`]: a CONNECT proxy in front of the re-signing one, so
//!   the host's own clients reach the test hosts as a bottle's do, through
//!   a proxy.
//!
//! [`CorpNet`] runs the proxies and an upstream on their own tokio runtime,
//! so synchronous tests can use them.

mod ca;
#[cfg(test)]
mod client_tests;
mod connect;
mod corpus;
mod git;
mod interface;
mod npm;
mod proxy;
mod pypi;
mod upstream;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;

pub use ca::TestCa;
pub use connect::ConnectProxy;
pub use corpus::{corpus_bytes, write_corpus};
pub use git::make_bare_repo;
pub use hyper::{Method, Version};
pub use interface::TestInterface;
pub use npm::{NPM_BULK_ADVISORIES, NpmPackage, NpmPublished, npm_registry};
pub use proxy::ReSigningProxy;
pub use pypi::{PythonFile, SDIST_PROJECT, WHEEL_PROJECT, python_index};
pub use upstream::{RecordedRequest, SeenRequest, Site, Upstream};

/// How long a WebSocket check may take, handshake to close.
const WEBSOCKET_CHECK_TIME_LIMIT: Duration = Duration::from_secs(20);

/// A re-signing proxy in front of one upstream serving `site`, running
/// until dropped.
pub struct CorpNet {
    /// The corporate CA: what a client behind this network must trust.
    pub corp_ca: Arc<TestCa>,
    /// The proxy's listening address.
    pub proxy_addr: SocketAddr,
    /// A CONNECT proxy on loopback tunnelling to `proxy_addr`: what the
    /// host's own clients are given as their proxy.
    pub connect_proxy_addr: SocketAddr,
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
        let connect_proxy = runtime.block_on(ConnectProxy::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            proxy.addr(),
        ))?;
        Ok(CorpNet {
            corp_ca,
            proxy_addr: proxy.addr(),
            connect_proxy_addr: connect_proxy.addr(),
            upstream,
            proxy,
            runtime,
        })
    }

    /// Every request the upstream answered, in order.
    pub fn upstream_requests(&self) -> Vec<SeenRequest> {
        self.upstream.seen()
    }

    /// Every request the upstream received, whole, in order.
    pub fn recorded_requests(&self) -> Vec<RecordedRequest> {
        self.upstream.recorded()
    }

    /// Every SNI a client asked the proxy for, in order.
    pub fn proxy_server_names(&self) -> Vec<String> {
        self.proxy.server_names()
    }

    /// The runtime the servers run on, for async clients in tests.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }

    /// The positive control of a WebSocket echo at `wss://{host}{path}`:
    /// through the re-signing proxy, trusting the corporate CA, a text and a
    /// binary message each come back as sent.
    pub fn websocket_echo_check(&self, host: &str, path: &str) -> io::Result<()> {
        let config = self.corp_ca.client_config(vec![b"http/1.1".to_vec()])?;
        let (proxy, host, path) = (self.proxy_addr, host.to_string(), path.to_string());
        let check = async move {
            let tcp = TcpStream::connect(proxy).await?;
            let name = ServerName::try_from(host.clone()).map_err(io::Error::other)?;
            let tls = TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await?;
            let (mut socket, _) =
                tokio_tungstenite::client_async(format!("wss://{host}{path}"), tls)
                    .await
                    .map_err(io::Error::other)?;
            let sent = [
                Message::text("hello over a websocket"),
                Message::binary(vec![0u8, 1, 2, 254, 255]),
            ];
            for message in &sent {
                socket
                    .send(message.clone())
                    .await
                    .map_err(io::Error::other)?;
                let echoed = socket
                    .next()
                    .await
                    .ok_or_else(|| io::Error::other("the echo closed"))?
                    .map_err(io::Error::other)?;
                if &echoed != message {
                    return Err(io::Error::other(format!(
                        "sent {message:?}, echoed {echoed:?}"
                    )));
                }
            }
            socket.close(None).await.map_err(io::Error::other)?;
            Ok(())
        };
        self.runtime
            .block_on(async { tokio::time::timeout(WEBSOCKET_CHECK_TIME_LIMIT, check).await })
            .map_err(|_| io::Error::other("the WebSocket check timed out"))?
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
