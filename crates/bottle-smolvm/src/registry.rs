//! A read-only OCI distribution registry serving one locally built image,
//! for the length of one `smolvm pack create`.
//!
//! `pack create` reads only registry references (`src/cli/pack.rs`,
//! `PackCreateCmd::image`, pulled by the pack agent VM), and no registry is
//! assumed to exist. So the image comes from the Docker Engine's export
//! (`GET /images/{name}/get`, a `docker save` archive), is unpacked here into
//! content-addressed blobs with an OCI image manifest, and is served on an
//! ephemeral port with the read-only subset of the distribution API:
//!
//! - `GET /v2/` (API version check),
//! - `GET|HEAD /v2/<name>/manifests/<tag or digest>`,
//! - `GET|HEAD /v2/<name>/blobs/<digest>`.
//!
//! Everything else is `404` (unknown name, tag or digest) or `405` (any
//! other method: nothing can be pushed). Archive paths are never used as
//! filesystem paths, so a hostile archive cannot write outside the staging
//! directory.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::{SmolvmError, io_err};

/// The OCI image manifest media type served.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The OCI image config media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed layer (what `docker save` writes).
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// A gzip-compressed layer.
pub const LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// A zstd-compressed layer.
pub const LAYER_TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// A content descriptor in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// An OCI image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MANIFEST_MEDIA_TYPE`].
    pub media_type: String,
    /// The image config.
    pub config: Descriptor,
    /// The layers, bottom first.
    pub layers: Vec<Descriptor>,
}

/// One image, unpacked into content-addressed blobs on disk.
#[derive(Debug)]
pub struct ImageBlobs {
    manifest: Vec<u8>,
    manifest_digest: String,
    blobs: HashMap<String, (PathBuf, u64)>,
}

/// `manifest.json` of a `docker save` archive (one entry per image).
#[derive(Debug, Deserialize)]
struct SaveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// The part of an image config that names the layers.
#[derive(Debug, Deserialize)]
struct ConfigRootfs {
    rootfs: RootfsDiffIds,
}

#[derive(Debug, Deserialize)]
struct RootfsDiffIds {
    diff_ids: Vec<String>,
}

enum Entry {
    File {
        digest: String,
        size: u64,
        path: PathBuf,
    },
    Link(String),
}

impl ImageBlobs {
    /// Unpacks a `docker save` archive (classic layout, or the OCI layout
    /// Docker 25+ writes, both described by `manifest.json`) into `dir`.
    pub fn from_docker_save(archive: &Path, dir: &Path) -> Result<ImageBlobs, SmolvmError> {
        let bad = |detail: String| SmolvmError::ImageArchive { detail };
        let raw = dir.join("raw");
        fs::create_dir_all(&raw).map_err(|e| io_err("create directory", &raw, e))?;
        let file = File::open(archive).map_err(|e| io_err("open", archive, e))?;
        let mut tar = tar::Archive::new(file);
        let mut entries: HashMap<String, Entry> = HashMap::new();
        let iter = tar.entries().map_err(|e| io_err("read", archive, e))?;
        for (index, entry) in iter.enumerate() {
            let mut entry = entry.map_err(|e| io_err("read", archive, e))?;
            let name = normalize(
                &entry
                    .path()
                    .map_err(|e| io_err("read", archive, e))?
                    .to_string_lossy(),
            );
            let kind = entry.header().entry_type();
            if kind.is_symlink() || kind.is_hard_link() {
                let target = entry
                    .link_name()
                    .map_err(|e| io_err("read", archive, e))?
                    .map(|t| t.to_string_lossy().into_owned())
                    .ok_or_else(|| bad(format!("link {name} has no target")))?;
                let resolved = if kind.is_symlink() {
                    let parent = name.rsplit_once('/').map_or("", |(p, _)| p);
                    normalize(&format!("{parent}/{target}"))
                } else {
                    normalize(&target)
                };
                entries.insert(name, Entry::Link(resolved));
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let path = raw.join(index.to_string());
            let (digest, size) = copy_hashing(&mut entry, &path)?;
            entries.insert(name, Entry::File { digest, size, path });
        }

        let resolve = |name: &str| -> Result<(String, u64, PathBuf), SmolvmError> {
            let mut current = normalize(name);
            for _ in 0..16 {
                match entries.get(&current) {
                    Some(Entry::File { digest, size, path }) => {
                        return Ok((digest.clone(), *size, path.clone()));
                    }
                    Some(Entry::Link(next)) => current = next.clone(),
                    None => {
                        return Err(bad(format!(
                            "{name} is named by manifest.json but not in the archive"
                        )));
                    }
                }
            }
            Err(bad(format!("{name} is a link loop")))
        };

        let (_, _, manifest_path) = resolve("manifest.json")?;
        let save: Vec<SaveEntry> = serde_json::from_slice(
            &fs::read(&manifest_path).map_err(|e| io_err("read", &manifest_path, e))?,
        )
        .map_err(|e| bad(format!("manifest.json: {e}")))?;
        let [image] = save.as_slice() else {
            return Err(bad(format!(
                "manifest.json describes {} images, expected one",
                save.len()
            )));
        };

        let mut blobs = HashMap::new();
        let (config_digest, config_size, config_path) = resolve(&image.config)?;
        let config: ConfigRootfs = serde_json::from_slice(
            &fs::read(&config_path).map_err(|e| io_err("read", &config_path, e))?,
        )
        .map_err(|e| bad(format!("image config: {e}")))?;
        blobs.insert(config_digest.clone(), (config_path, config_size));

        let mut layers = Vec::new();
        for (i, layer) in image.layers.iter().enumerate() {
            let (digest, size, path) = resolve(layer)?;
            let media_type = layer_media_type(&path)?;
            // An uncompressed layer's digest is its diff_id: a mismatch means
            // the export does not describe the image it claims to.
            if media_type == LAYER_TAR && config.rootfs.diff_ids.get(i) != Some(&digest) {
                return Err(bad(format!(
                    "layer {i} ({layer}) has digest {digest}, the config's diff_id is {:?}",
                    config.rootfs.diff_ids.get(i)
                )));
            }
            blobs.insert(digest.clone(), (path, size));
            layers.push(Descriptor {
                media_type: media_type.to_string(),
                digest,
                size,
            });
        }
        if layers.len() != config.rootfs.diff_ids.len() {
            return Err(bad(format!(
                "{} layers for {} diff_ids in the config",
                layers.len(),
                config.rootfs.diff_ids.len()
            )));
        }

        let manifest = ImageManifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.into(),
            config: Descriptor {
                media_type: CONFIG_MEDIA_TYPE.into(),
                digest: config_digest,
                size: config_size,
            },
            layers,
        };
        let manifest = serde_json::to_vec(&manifest).map_err(|e| bad(e.to_string()))?;
        let manifest_digest = sha256_digest(&manifest);
        Ok(ImageBlobs {
            manifest,
            manifest_digest,
            blobs,
        })
    }

    /// The manifest bytes served.
    pub fn manifest(&self) -> &[u8] {
        &self.manifest
    }

    /// `sha256:<hex>` of [`Self::manifest`].
    pub fn manifest_digest(&self) -> &str {
        &self.manifest_digest
    }

    /// The file and size holding `digest`, if it is one of this image's.
    pub fn blob(&self, digest: &str) -> Option<&(PathBuf, u64)> {
        self.blobs.get(digest)
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

fn copy_hashing(reader: &mut impl Read, path: &Path) -> Result<(String, u64), SmolvmError> {
    let mut out = File::create(path).map_err(|e| io_err("create", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| io_err("read archive entry into", path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| io_err("write", path, e))?;
        size += n as u64;
    }
    out.flush().map_err(|e| io_err("write", path, e))?;
    Ok((format!("sha256:{:x}", hasher.finalize()), size))
}

fn layer_media_type(path: &Path) -> Result<&'static str, SmolvmError> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path).map_err(|e| io_err("open", path, e))?;
    let n = file.read(&mut magic).map_err(|e| io_err("read", path, e))?;
    Ok(match &magic[..n] {
        [0x1f, 0x8b, ..] => LAYER_TAR_GZIP,
        [0x28, 0xb5, 0x2f, 0xfd] => LAYER_TAR_ZSTD,
        _ => LAYER_TAR,
    })
}

/// A running registry; stops when dropped.
#[derive(Debug)]
pub struct Registry {
    addr: SocketAddr,
    repository: String,
    tag: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Registry {
    /// Serves `blobs` as `<repository>:<tag>` on `bind`, port chosen by the
    /// kernel.
    pub fn serve(
        blobs: ImageBlobs,
        repository: &str,
        tag: &str,
        bind: IpAddr,
    ) -> Result<Registry, SmolvmError> {
        let registry_err = |action: &str| {
            let action = action.to_string();
            move |source| SmolvmError::Registry { action, source }
        };
        let listener =
            std::net::TcpListener::bind((bind, 0)).map_err(registry_err("bind a port"))?;
        listener
            .set_nonblocking(true)
            .map_err(registry_err("configure the listener"))?;
        let addr = listener
            .local_addr()
            .map_err(registry_err("read the port"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(registry_err("start its runtime"))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let state = Arc::new(State {
            blobs,
            repository: repository.to_string(),
            tag: tag.to_string(),
        });
        let thread = std::thread::Builder::new()
            .name("bottle-registry".into())
            .spawn(move || runtime.block_on(accept_loop(listener, state, rx)))
            .map_err(registry_err("start its thread"))?;
        Ok(Registry {
            addr,
            repository: repository.to_string(),
            tag: tag.to_string(),
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The reference `pack create --image` takes. A loopback bind is named
    /// `localhost`, which registry clients reach over plain HTTP.
    pub fn reference(&self) -> String {
        let host = if self.addr.ip().is_loopback() {
            format!("localhost:{}", self.addr.port())
        } else {
            self.addr.to_string()
        };
        format!("{host}/{}:{}", self.repository, self.tag)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct State {
    blobs: ImageBlobs,
    repository: String,
    tag: String,
}

type Body = BoxBody<Bytes, io::Error>;

async fn accept_loop(
    listener: std::net::TcpListener,
    state: Arc<State>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, io::Error>(handle(&state, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// What a request path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Base,
    Manifest { name: &'a str, reference: &'a str },
    Blob { name: &'a str, digest: &'a str },
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    if path == "/v2/" || path == "/v2" {
        return Route::Base;
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return Route::Unknown;
    };
    // A repository name may contain slashes; the last two segments are the
    // endpoint and its argument.
    if let Some((name, reference)) = rest.rsplit_once("/manifests/")
        && !reference.contains('/')
    {
        return Route::Manifest { name, reference };
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/")
        && !digest.contains('/')
    {
        return Route::Blob { name, digest };
    }
    Route::Unknown
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "this registry is read-only",
        );
    }
    match route(req.uri().path()) {
        Route::Base => json_response(b"{}".to_vec(), "application/json", None, head),
        Route::Manifest { name, reference } => {
            if name != state.repository {
                return error(
                    StatusCode::NOT_FOUND,
                    "NAME_UNKNOWN",
                    "repository name not known to registry",
                );
            }
            if reference != state.tag && reference != state.blobs.manifest_digest {
                return error(
                    StatusCode::NOT_FOUND,
                    "MANIFEST_UNKNOWN",
                    "manifest unknown",
                );
            }
            json_response(
                state.blobs.manifest.clone(),
                MANIFEST_MEDIA_TYPE,
                Some(&state.blobs.manifest_digest),
                head,
            )
        }
        Route::Blob { name, digest } => {
            if name != state.repository {
                return error(
                    StatusCode::NOT_FOUND,
                    "NAME_UNKNOWN",
                    "repository name not known to registry",
                );
            }
            match state.blobs.blob(digest) {
                Some((path, size)) => blob_response(path, *size, digest, head).await,
                None => error(
                    StatusCode::NOT_FOUND,
                    "BLOB_UNKNOWN",
                    "blob unknown to registry",
                ),
            }
        }
        Route::Unknown => error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "unknown endpoint"),
    }
}

fn base_builder(status: StatusCode) -> http::response::Builder {
    Response::builder()
        .status(status)
        .header("Docker-Distribution-API-Version", "registry/2.0")
}

fn json_response(
    body: Vec<u8>,
    content_type: &str,
    digest: Option<&str>,
    head: bool,
) -> Response<Body> {
    let mut builder = base_builder(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_LENGTH, body.len());
    if let Some(digest) = digest {
        builder = builder.header("Docker-Content-Digest", digest);
    }
    let body = if head { empty() } else { full(body) };
    builder.body(body).unwrap_or_else(|_| internal())
}

async fn blob_response(path: &Path, size: u64, digest: &str, head: bool) -> Response<Body> {
    let builder = base_builder(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .header("Docker-Content-Digest", digest);
    if head {
        return builder.body(empty()).unwrap_or_else(|_| internal());
    }
    let Ok(file) = tokio::fs::File::open(path).await else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "UNKNOWN",
            "blob file unreadable",
        );
    };
    let stream = futures_util::stream::unfold(Some(file), |file| async move {
        use tokio::io::AsyncReadExt as _;
        let mut file = file?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some(file)))
            }
            Err(err) => Some((Err(err), None)),
        }
    });
    builder
        .body(StreamBody::new(stream).boxed())
        .unwrap_or_else(|_| internal())
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": message }] }).to_string();
    base_builder(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, body.len())
        .body(full(body.into_bytes()))
        .unwrap_or_else(|_| internal())
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed()
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

fn internal() -> Response<Body> {
    let mut response = Response::new(empty());
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/v2/"), Route::Base);
        assert_eq!(
            route("/v2/bottle-agent/manifests/abc"),
            Route::Manifest {
                name: "bottle-agent",
                reference: "abc"
            }
        );
        assert_eq!(
            route("/v2/org/agent/blobs/sha256:00"),
            Route::Blob {
                name: "org/agent",
                digest: "sha256:00"
            }
        );
        assert_eq!(route("/v2/a/blobs/uploads/"), Route::Unknown);
        assert_eq!(route("/etc/passwd"), Route::Unknown);
    }

    #[test]
    fn normalizes_archive_paths() {
        assert_eq!(normalize("./abc/../manifest.json"), "manifest.json");
        assert_eq!(normalize("a/./b//c"), "a/b/c");
        assert_eq!(normalize("../../x"), "x");
    }
}
