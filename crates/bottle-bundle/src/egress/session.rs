//! One upstream connection per intercepted tunnel.
//!
//! Every request in a tunnel goes to the same destination, so the tunnel
//! keeps its own upstream connection instead of asking the shared client's
//! pool for one per request (a pool lookup under a lock, a boxed future and
//! a URI rewrite each time). The session only carries requests: every
//! request still passes all of [`super::Egress::send`]'s checks first, and
//! the connection is dialled lazily, on the first request that passed them,
//! through the same connector as the shared client (guarded resolver,
//! address guard, TLS roots), so no connection opens for a request the
//! bundle refused and nothing here is a second way out.

use std::sync::{Mutex, MutexGuard};

use http::uri::{PathAndQuery, Uri};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::Scheme;
use super::upstream::UpstreamConnector;
use crate::allowlist::Host;
use crate::body::BoxBody;
use crate::proxy::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};

/// Why a request through a session failed.
pub(super) type SessionError = Box<dyn std::error::Error + Send + Sync>;

/// A tunnel's upstream connection: made by [`super::Egress::session`], held
/// by the tunnel, used by [`super::Egress::send`].
#[derive(Debug)]
pub struct EgressSession {
    scheme: Scheme,
    host: Host,
    port: u16,
    /// Where the connector dials: `scheme://authority/`.
    dial_uri: Uri,
    slot: Mutex<Slot>,
}

/// The connection's sender, when no request holds it.
#[derive(Debug)]
enum Slot {
    /// Not dialled yet, or the last connection failed.
    Empty,
    /// A request is dialling, or holds the HTTP/1 sender.
    Busy,
    Idle(Sender),
}

#[derive(Debug)]
enum Sender {
    Http1(http1::SendRequest<BoxBody>),
    /// Multiplexed: each request takes a clone and the slot keeps one.
    Http2(http2::SendRequest<BoxBody>),
}

/// What a request gets from the slot.
enum Checkout {
    Sender(Sender),
    /// The slot was empty: this request dials.
    Dial,
    /// Another request holds the HTTP/1 sender: use the shared client.
    Busy,
}

/// What became of a request sent through a session.
pub(super) enum Sent {
    /// The upstream's response.
    Response(Response<Incoming>),
    /// Another request holds the connection: the caller sends this one
    /// some other way.
    Busy(Request<BoxBody>),
    /// Dialling or sending failed.
    Failed(SessionError),
}

/// A request the connection did not take.
enum SendFailure {
    /// Never sent (the connection had closed): it may go on a new one.
    Unsent(Request<BoxBody>),
    Failed(SessionError),
}

impl EgressSession {
    pub(super) fn new(scheme: Scheme, host: Host, port: u16, dial_uri: Uri) -> Self {
        Self {
            scheme,
            host,
            port,
            dial_uri,
            slot: Mutex::new(Slot::Empty),
        }
    }

    /// Whether this session's connection goes where `scheme`, `host` and
    /// `port` say: a request for anywhere else must not use it.
    pub(super) fn serves(&self, scheme: Scheme, host: &Host, port: u16) -> bool {
        self.scheme == scheme && self.host == *host && self.port == port
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        match self.slot.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn checkout(&self) -> Checkout {
        let mut slot = self.lock();
        match std::mem::replace(&mut *slot, Slot::Busy) {
            Slot::Empty => Checkout::Dial,
            Slot::Busy => Checkout::Busy,
            Slot::Idle(Sender::Http2(s)) => {
                let mine = s.clone();
                *slot = Slot::Idle(Sender::Http2(s));
                Checkout::Sender(Sender::Http2(mine))
            }
            // Still streaming the last response (an HTTP/2 tunnel's
            // concurrent streams): waiting would queue this request behind
            // it, so it goes through the shared client instead.
            Slot::Idle(Sender::Http1(s)) if !s.is_ready() && !s.is_closed() => {
                *slot = Slot::Idle(Sender::Http1(s));
                Checkout::Busy
            }
            Slot::Idle(s) => Checkout::Sender(s),
        }
    }

    fn checkin(&self, sender: Sender) {
        let mut slot = self.lock();
        match sender {
            // The slot keeps its own clone of an HTTP/2 sender.
            Sender::Http2(_) if matches!(*slot, Slot::Idle(_)) => {}
            s => *slot = Slot::Idle(s),
        }
    }

    /// Forgets a failed connection: the next request dials again.
    fn lose(&self) {
        *self.lock() = Slot::Empty;
    }

    /// Sends `req` (its URI absolute) on this session's connection: dials
    /// it first if there is none, and once more if it had closed before
    /// `req` went out.
    pub(super) async fn send(&self, connector: &UpstreamConnector, req: Request<BoxBody>) -> Sent {
        let req = match self.checkout() {
            Checkout::Busy => return Sent::Busy(req),
            Checkout::Dial => req,
            Checkout::Sender(sender) => match self.send_on(sender, req).await {
                Ok(resp) => return Sent::Response(resp),
                Err(SendFailure::Unsent(req)) => req,
                Err(SendFailure::Failed(e)) => return Sent::Failed(e),
            },
        };
        let sender = match dial(connector, &self.dial_uri).await {
            Ok(s) => s,
            Err(e) => {
                self.lose();
                return Sent::Failed(e);
            }
        };
        match self.send_on(sender, req).await {
            Ok(resp) => Sent::Response(resp),
            Err(SendFailure::Unsent(_)) => Sent::Failed(
                "the new upstream connection closed before the request went out".into(),
            ),
            Err(SendFailure::Failed(e)) => Sent::Failed(e),
        }
    }

    /// One request on `sender`; the sender goes back to the slot if the
    /// connection took the request, and is forgotten if not.
    async fn send_on(
        &self,
        sender: Sender,
        mut req: Request<BoxBody>,
    ) -> Result<Response<Incoming>, SendFailure> {
        let sent = match sender {
            Sender::Http1(mut s) => {
                // HTTP/1.1 puts the path on the request line; the Host
                // header (set by egress) names the authority.
                let origin = req
                    .uri()
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/"));
                *req.uri_mut() = Uri::from(origin);
                if s.ready().await.is_err() {
                    self.lose();
                    return Err(SendFailure::Unsent(req));
                }
                let sent = s.try_send_request(req).await;
                (sent, Sender::Http1(s))
            }
            Sender::Http2(mut s) => {
                if s.ready().await.is_err() {
                    self.lose();
                    return Err(SendFailure::Unsent(req));
                }
                let sent = s.try_send_request(req).await;
                (sent, Sender::Http2(s))
            }
        };
        match sent {
            (Ok(resp), sender) => {
                self.checkin(sender);
                Ok(resp)
            }
            (Err(mut e), _) => {
                self.lose();
                match e.take_message() {
                    Some(req) => Err(SendFailure::Unsent(req)),
                    None => Err(SendFailure::Failed(Box::new(e.into_error()))),
                }
            }
        }
    }
}

/// Opens a connection through `connector` (the shared client's: guarded
/// resolver, address guard, TLS roots) and speaks what its ALPN settled.
async fn dial(connector: &UpstreamConnector, uri: &Uri) -> Result<Sender, SessionError> {
    let io = tower_service::Service::call(&mut connector.clone(), uri.clone()).await?;
    if io.connected().is_negotiated_h2() {
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .handshake(io)
            .await?;
        tokio::spawn(conn);
        Ok(Sender::Http2(sender))
    } else {
        let (sender, conn) = http1::handshake(io).await?;
        tokio::spawn(conn);
        Ok(Sender::Http1(sender))
    }
}
