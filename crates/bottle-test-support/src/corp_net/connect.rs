//! A CONNECT proxy in front of the re-signing proxy, for the host's own
//! clients: they cannot resolve the test hosts, but every one of them
//! (curl, git, npm, pip) can be given a proxy, which tunnels each CONNECT
//! to the corporate network whatever host it names.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The largest request head a client may send before its tunnel.
const MAX_HEAD: usize = 16 << 10;
/// How long a client may take to send its CONNECT.
const HEAD_TIME_LIMIT: Duration = Duration::from_secs(10);
/// How long one tunnel may stay open.
const TUNNEL_LIFETIME: Duration = Duration::from_secs(300);

/// A running CONNECT proxy; its task ends with the runtime it runs on.
pub struct ConnectProxy {
    addr: SocketAddr,
}

impl ConnectProxy {
    /// Listens on `listen` and tunnels every CONNECT to `target`.
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> io::Result<ConnectProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    // A failed tunnel is the client's to see; tests assert
                    // on what the clients report.
                    let _ = tokio::time::timeout(TUNNEL_LIFETIME, tunnel(client, target)).await;
                });
            }
        });
        Ok(ConnectProxy { addr })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn tunnel(mut client: TcpStream, target: SocketAddr) -> io::Result<()> {
    let head = tokio::time::timeout(HEAD_TIME_LIMIT, read_head(&mut client))
        .await
        .map_err(|_| io::Error::other("no CONNECT in time"))??;
    if !head.starts_with(b"CONNECT ") {
        client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await?;
        return Ok(());
    }
    let mut upstream = TcpStream::connect(target).await?;
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Reads up to the blank line ending the request head, one byte at a time
/// so nothing of the tunnel's first bytes is taken.
async fn read_head(client: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err(io::Error::other("request head too long"));
        }
        let byte = client.read_u8().await?;
        head.push(byte);
    }
    Ok(head)
}
