//! The upstreams behind the corporate network: one HTTPS server (h1 and
//! h2) serving, by host, static pages, git's smart HTTP and a WebSocket
//! echo, and recording every request whole.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::TestCa;
use super::git::http_backend;

/// The largest request body the upstream reads (a git push's pack is the
/// largest a test sends); a larger one is answered 413.
const MAX_REQUEST_BODY: usize = 64 << 20;
/// How long one WebSocket connection may stay open.
const WEBSOCKET_LIFETIME: Duration = Duration::from_secs(120);

/// One page: its content type and body.
#[derive(Clone)]
struct Page {
    content_type: String,
    body: Bytes,
}

/// What the upstream serves, by host and path.
#[derive(Clone, Default)]
pub struct Site {
    pages: BTreeMap<(String, String), Page>,
    /// Hosts whose every path not a page is git's smart HTTP
    /// (`git http-backend`) over the repositories under the directory.
    git: BTreeMap<String, PathBuf>,
    /// (host, path) pairs that echo WebSocket messages.
    websockets: BTreeSet<(String, String)>,
}

impl Site {
    /// An empty site.
    pub fn new() -> Site {
        Site::default()
    }

    /// Serves `body` at `https://{host}{path}` (to any method: an npm
    /// registry's audit endpoint is a POST answered with a fixed body).
    pub fn page(
        mut self,
        host: &str,
        path: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> Site {
        self.pages.insert(
            (host.to_string(), path.to_string()),
            Page {
                content_type: content_type.to_string(),
                body: body.into(),
            },
        );
        self
    }

    /// Serves every file under `dir` at `https://{host}{prefix}/{relative
    /// path}` (a bare git repository after `git update-server-info` is a
    /// dumb-HTTP remote this way).
    pub fn directory(mut self, host: &str, prefix: &str, dir: &Path) -> io::Result<Site> {
        let mut pending = vec![dir.to_path_buf()];
        while let Some(current) = pending.pop() {
            for entry in std::fs::read_dir(&current)? {
                let path = entry?.path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let relative = path
                    .strip_prefix(dir)
                    .map_err(|e| io::Error::other(e.to_string()))?
                    .to_string_lossy()
                    .into_owned();
                self = self.page(
                    host,
                    &format!("{prefix}/{relative}"),
                    "application/octet-stream",
                    std::fs::read(&path)?,
                );
            }
        }
        Ok(self)
    }

    /// Serves the bare repositories under `project_root` over git's smart
    /// HTTP at `https://{host}/{repository}` (clone, fetch and push: each
    /// repository must say `http.receivepack true` to take pushes).
    pub fn git_smart_http(mut self, host: &str, project_root: &Path) -> Site {
        self.git
            .insert(host.to_string(), project_root.to_path_buf());
        self
    }

    /// Echoes every WebSocket text and binary message sent to
    /// `wss://{host}{path}` (HTTP/1.1 Upgrade, no extensions).
    pub fn websocket_echo(mut self, host: &str, path: &str) -> Site {
        self.websockets.insert((host.to_string(), path.to_string()));
        self
    }

    fn hosts(&self) -> Vec<String> {
        let hosts: BTreeSet<&String> = self
            .pages
            .keys()
            .map(|(host, _)| host)
            .chain(self.git.keys())
            .chain(self.websockets.iter().map(|(host, _)| host))
            .collect();
        hosts.into_iter().cloned().collect()
    }
}

/// One request the upstream answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenRequest {
    /// The host the request named (`Host` or `:authority`), port removed.
    pub host: String,
    /// The path, query removed.
    pub path: String,
    /// The HTTP version it came over.
    pub version: Version,
    /// The status it was answered with.
    pub status: StatusCode,
}

/// One request the upstream received, whole: what a client really sends,
/// for tests to dump and to replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// The host the request named (`Host` or `:authority`), port removed.
    pub host: String,
    /// The method.
    pub method: Method,
    /// The request target: path and query, as sent.
    pub target: String,
    /// The HTTP version it came over.
    pub version: Version,
    /// Every header in order of arrival: its name (as hyper keeps it, lower
    /// case) and its raw value. HTTP/2's pseudo-headers are not among them.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body (empty when it could not be read: see `status`).
    pub body: Bytes,
    /// The status it was answered with.
    pub status: StatusCode,
}

impl RecordedRequest {
    /// The path, query removed.
    pub fn path(&self) -> &str {
        self.target
            .split_once('?')
            .map_or(self.target.as_str(), |(path, _)| path)
    }

    /// The first value of header `name` (any case), if any, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    fn seen(&self) -> SeenRequest {
        SeenRequest {
            host: self.host.clone(),
            path: self.path().to_string(),
            version: self.version,
            status: self.status,
        }
    }
}

/// A running upstream; its task ends with the runtime it runs on.
pub struct Upstream {
    addr: SocketAddr,
    recorded: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl Upstream {
    /// Serves `site` on `listen` with a leaf from `ca` naming every host of
    /// the site, offering h2 and HTTP/1.1.
    pub async fn start(listen: SocketAddr, ca: &TestCa, site: Site) -> io::Result<Upstream> {
        let config = ca.server_config(&site.hosts(), vec![b"h2".to_vec(), b"http/1.1".to_vec()])?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let site = Arc::new(site);
        let record = recorded.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, site, record) = (acceptor.clone(), site.clone(), record.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let (site, record) = (site.clone(), record.clone());
                        async move { Ok::<_, Infallible>(answer(&site, &record, req).await) }
                    });
                    // With upgrades: a WebSocket takes the connection over.
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Upstream { addr, recorded })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request it answered, in order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.recorded().iter().map(RecordedRequest::seen).collect()
    }

    /// Every request it received, whole, in order.
    pub fn recorded(&self) -> Vec<RecordedRequest> {
        self.recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

type Answer = Response<Full<Bytes>>;

fn plain(status: StatusCode, text: &'static str) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

fn host_of(req: &Request<Incoming>) -> String {
    req.uri()
        .host()
        .map(str::to_string)
        .or_else(|| {
            let header = req.headers().get(header::HOST)?.to_str().ok()?;
            Some(
                header
                    .rsplit_once(':')
                    .map_or(header, |(h, _)| h)
                    .to_string(),
            )
        })
        .unwrap_or_default()
}

async fn answer(
    site: &Site,
    record: &Mutex<Vec<RecordedRequest>>,
    mut req: Request<Incoming>,
) -> Answer {
    let host = host_of(&req);
    let path = req.uri().path().to_string();
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| path.clone(), |pq| pq.as_str().to_string());
    let headers = req
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect();
    let (method, version) = (req.method().clone(), req.version());
    let websocket = site.websockets.contains(&(host.clone(), path.clone()));
    // Taken before the body is read: the upgrade belongs to the request.
    let upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let (body, response) = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Err(_) => (
            Bytes::new(),
            plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the body could not be read whole\n",
            ),
        ),
        Ok(collected) => {
            let body = collected.to_bytes();
            let response = if let Some(upgrade) = upgrade {
                websocket_accept(&parts.headers, upgrade)
            } else if let Some(page) = site.pages.get(&(host.clone(), path.clone())) {
                Response::builder()
                    .header(header::CONTENT_TYPE, &page.content_type)
                    .body(Full::new(page.body.clone()))
                    .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "bad page\n"))
            } else if let Some(root) = site.git.get(&host) {
                let (root, parts, body) = (root.clone(), parts.clone(), body.clone());
                tokio::task::spawn_blocking(move || http_backend(&root, &parts, &body))
                    .await
                    .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "git failed\n"))
            } else {
                plain(StatusCode::NOT_FOUND, "not found\n")
            };
            (body, response)
        }
    };
    record
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(RecordedRequest {
            host,
            method,
            target,
            version,
            headers,
            body,
            status: response.status(),
        });
    response
}

/// Answers a WebSocket handshake with 101 and echoes on the upgraded
/// connection; anything else asked of the endpoint is a 400.
fn websocket_accept(headers: &hyper::HeaderMap, upgrade: hyper::upgrade::OnUpgrade) -> Answer {
    let wants_websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return plain(StatusCode::BAD_REQUEST, "not a WebSocket handshake\n");
    };
    if !wants_websocket {
        return plain(StatusCode::BAD_REQUEST, "not a WebSocket handshake\n");
    }
    let accept = derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        let _ = tokio::time::timeout(WEBSOCKET_LIFETIME, echo(socket)).await;
    });
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

/// Sends every text and binary message back; answers pings (tungstenite
/// does) and ends on close.
async fn echo<S>(mut socket: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(Ok(message)) = socket.next().await {
        let reply = match message {
            Message::Text(_) | Message::Binary(_) => message,
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
        };
        if socket.send(reply).await.is_err() {
            break;
        }
    }
    let _ = socket.close(None).await;
}
