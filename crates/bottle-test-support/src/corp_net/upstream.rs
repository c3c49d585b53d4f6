//! The upstreams behind the corporate network: one HTTPS server (h1 and
//! h2) serving static pages by host and path.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::TestCa;

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
}

impl Site {
    /// An empty site.
    pub fn new() -> Site {
        Site::default()
    }

    /// Serves `body` at `https://{host}{path}`.
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

    fn hosts(&self) -> Vec<String> {
        let hosts: BTreeSet<&String> = self.pages.keys().map(|(host, _)| host).collect();
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

/// A running upstream; its task ends with the runtime it runs on.
pub struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
}

impl Upstream {
    /// Serves `site` on `listen` with a leaf from `ca` naming every host of
    /// the site, offering h2 and HTTP/1.1.
    pub async fn start(listen: SocketAddr, ca: &TestCa, site: Site) -> io::Result<Upstream> {
        let config = ca.server_config(&site.hosts(), vec![b"h2".to_vec(), b"http/1.1".to_vec()])?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let site = Arc::new(site);
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, site, record) = (acceptor.clone(), site.clone(), record.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let answer = answer(&site, &record, &req);
                        async move { Ok::<_, Infallible>(answer) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Upstream { addr, seen })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request it answered, in order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn answer(
    site: &Site,
    record: &Mutex<Vec<SeenRequest>>,
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let host = req
        .uri()
        .host()
        .map(str::to_string)
        .or_else(|| {
            let header = req.headers().get(hyper::header::HOST)?.to_str().ok()?;
            Some(
                header
                    .rsplit_once(':')
                    .map_or(header, |(h, _)| h)
                    .to_string(),
            )
        })
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    let page = site.pages.get(&(host.clone(), path.clone()));
    let response = match page {
        Some(page) => Response::builder()
            .header(hyper::header::CONTENT_TYPE, &page.content_type)
            .body(Full::new(page.body.clone())),
        None => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"not found\n"))),
    }
    .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    record
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(SeenRequest {
            host,
            path,
            version: req.version(),
            status: response.status(),
        });
    response
}
