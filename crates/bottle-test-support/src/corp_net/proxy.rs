//! The TLS-re-signing proxy of a corporate network: transparent (clients
//! reach it as if it were the upstream), it re-signs every certificate with
//! its own CA.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::TestCa;
use super::ca::client_config_trusting;

/// A running re-signing proxy; its task ends with the runtime it runs on.
pub struct ReSigningProxy {
    addr: SocketAddr,
    server_names: Arc<Mutex<Vec<String>>>,
}

impl ReSigningProxy {
    /// Listens on `listen`; relays every connection to `upstream`, trusting
    /// only `upstream_ca` there, and presents leaves from `corp_ca`.
    pub async fn start(
        listen: SocketAddr,
        corp_ca: Arc<TestCa>,
        upstream_ca: &TestCa,
        upstream: SocketAddr,
    ) -> io::Result<ReSigningProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let server_names = Arc::new(Mutex::new(Vec::new()));
        let upstream_root = upstream_ca.cert_der();
        let names = server_names.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (corp_ca, root, names) =
                    (corp_ca.clone(), upstream_root.clone(), names.clone());
                tokio::spawn(async move {
                    // A failed relay is the client's to see (a reset); the
                    // tests assert on what the clients report.
                    let _ = relay(client, &corp_ca, root, upstream, &names).await;
                });
            }
        });
        Ok(ReSigningProxy { addr, server_names })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every SNI a client asked for, in order.
    pub fn server_names(&self) -> Vec<String> {
        self.server_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn relay(
    client: TcpStream,
    corp_ca: &TestCa,
    upstream_root: CertificateDer<'static>,
    upstream: SocketAddr,
    names: &Mutex<Vec<String>>,
) -> io::Result<()> {
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client).await?;
    let hello = start.client_hello();
    let sni = hello
        .server_name()
        .ok_or_else(|| io::Error::other("the client sent no SNI"))?
        .to_string();
    let offered: Vec<Vec<u8>> = hello
        .alpn()
        .map(|protocols| protocols.map(<[u8]>::to_vec).collect())
        .unwrap_or_default();
    names
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(sni.clone());

    // Upstream first, offering what the client offered, so the client is
    // answered with the protocol the upstream chose.
    let connector = TlsConnector::from(Arc::new(client_config_trusting(upstream_root, offered)?));
    let server_name =
        ServerName::try_from(sni.clone()).map_err(|e| io::Error::other(e.to_string()))?;
    let mut upstream_tls = connector
        .connect(server_name, TcpStream::connect(upstream).await?)
        .await?;
    let chosen: Vec<Vec<u8>> = upstream_tls
        .get_ref()
        .1
        .alpn_protocol()
        .map(|p| vec![p.to_vec()])
        .unwrap_or_default();

    let config = corp_ca.server_config(&[sni], chosen)?;
    let mut client_tls = start.into_stream(Arc::new(config)).await?;
    tokio::io::copy_bidirectional(&mut client_tls, &mut upstream_tls).await?;
    Ok(())
}
