//! `pack create`: pulls an image from a registry over real HTTP, checks
//! every digest and size, and writes a `.smolmachine` that describes it
//! (the fake's artifact is JSON, not a VM).

use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt as _, Empty};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::error;

/// `pack create --image HOST:PORT/NAME:TAG -o OUT`.
#[derive(Args)]
pub(crate) struct PackCreateArgs {
    /// The image, in a registry the host can reach.
    #[arg(short = 'I', long)]
    image: String,
    /// Where to write the launcher (the artifact is `OUT.smolmachine`).
    #[arg(short, long)]
    output: PathBuf,
}

pub(crate) fn create(args: PackCreateArgs) -> crate::Result<ExitCode> {
    let PackCreateArgs { image, output } = args;
    let pulled = pull(&image).map_err(|e| error(format!("pull {image}: {e}")))?;
    std::fs::write(&output, "#!/bin/sh\necho 'fake smolmachine launcher'\n")
        .map_err(|e| error(format!("write {}: {e}", output.display())))?;
    let mut sidecar = output.into_os_string();
    sidecar.push(".smolmachine");
    let artifact = json!({
        "format": "fake-smolmachine/1",
        "image": image,
        "manifest_digest": pulled.manifest_digest,
        "config": pulled.config,
        "layers": pulled.layers,
        "bytes": pulled.bytes,
    });
    std::fs::write(&sidecar, artifact.to_string())
        .map_err(|e| error(format!("write {}: {e}", PathBuf::from(&sidecar).display())))?;
    println!(
        "Packed {image} ({} layers, {} bytes)",
        pulled.layers.len(),
        pulled.bytes
    );
    Ok(ExitCode::SUCCESS)
}

/// What a pull fetched and checked.
struct Pulled {
    manifest_digest: String,
    config: String,
    layers: Vec<String>,
    bytes: u64,
}

/// Pulls one image with just enough of the distribution API, checking
/// every digest and size.
fn pull(reference: &str) -> Result<Pulled, String> {
    let (host, rest) = reference
        .split_once('/')
        .ok_or_else(|| format!("{reference} names no registry"))?;
    let (repo, tag) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{reference} has no tag"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let (status, _, _) = get(host, "/v2/", None).await?;
        if status != 200 {
            return Err(format!("GET /v2/ answered {status}"));
        }
        let accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
        let (status, headers, body) = get(host, &format!("/v2/{repo}/manifests/{tag}"), Some(accept)).await?;
        if status != 200 {
            return Err(format!("manifest {tag} answered {status}"));
        }
        let digest = digest_of(&body);
        if headers.get("docker-content-digest").and_then(|v| v.to_str().ok()) != Some(digest.as_str()) {
            return Err("the manifest's Docker-Content-Digest does not match its body".into());
        }
        let manifest: Value = serde_json::from_slice(&body).map_err(|e| format!("manifest: {e}"))?;
        let mut descriptors = vec![manifest["config"].clone()];
        descriptors.extend(manifest["layers"].as_array().cloned().unwrap_or_default());
        let mut bytes = 0u64;
        let mut digests = Vec::new();
        for descriptor in &descriptors {
            let want = descriptor["digest"].as_str().ok_or("descriptor without digest")?;
            let size = descriptor["size"].as_u64().ok_or("descriptor without size")?;
            let (status, _, blob) = get(host, &format!("/v2/{repo}/blobs/{want}"), None).await?;
            if status != 200 {
                return Err(format!("blob {want} answered {status}"));
            }
            if digest_of(&blob) != want || blob.len() as u64 != size {
                return Err(format!("blob {want} does not match its digest or size"));
            }
            bytes += size;
            digests.push(want.to_string());
        }
        let config = digests.remove(0);
        Ok(Pulled {
            manifest_digest: digest,
            config,
            layers: digests,
            bytes,
        })
    })
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

async fn get(
    host: &str,
    path: &str,
    accept: Option<&str>,
) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("connect {host}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let mut request = http::Request::get(path).header(http::header::HOST, host);
    if let Some(accept) = accept {
        request = request.header(http::header::ACCEPT, accept);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("GET {path}: {e}"))?
        .to_bytes();
    Ok((parts.status.as_u16(), parts.headers, body))
}
