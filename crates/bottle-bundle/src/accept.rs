//! The accept step every daemon shares: wait for a connection slot, then
//! for a connection, riding out accept errors that do not mean the
//! listener is broken.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::BundleError;

/// The next connection on `listener`, holding one of `slots` for as long as
/// the caller keeps the permit (so at most `slots` connections are served at
/// once). An error means the daemon `daemon` cannot accept any more.
pub(crate) async fn next_connection(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    daemon: &str,
) -> Result<(TcpStream, SocketAddr, OwnedSemaphorePermit), BundleError> {
    let failed = |detail: String| BundleError::Daemon {
        daemon: daemon.into(),
        detail,
    };
    let permit = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| failed(e.to_string()))?;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, peer, permit));
            }
            Err(e) if is_transient(&e) => {
                crate::log!("{daemon} accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(failed(format!("accept failed: {e}"))),
        }
    }
}

/// Accept errors that do not mean the listener is broken (a peer reset
/// before accept, running out of fds or memory for a moment).
fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || matches!(e.raw_os_error(), Some(23 | 24 | 12 | 105))
}
