//! The local OCI registry, over real HTTP, serving archives built here and
//! (when Docker is up) a real export of a locally built image; and the
//! pack pipeline through the fake's `pack create`.

use std::net::{IpAddr, Ipv4Addr};

use bottle_smolvm::SmolvmError;
use bottle_smolvm::registry::{ImageBlobs, MANIFEST_MEDIA_TYPE, Registry};

use crate::support::{World, digest, docker_available, docker_save, http, layer};

fn serve(world: &World, archive: &std::path::Path) -> Registry {
    let blobs = ImageBlobs::from_docker_save(archive, &world.dir.path().join("blobs")).unwrap();
    Registry::serve(blobs, "bottle-agent", "t1", IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap()
}

#[test]
fn serves_the_read_only_distribution_api() {
    let world = World::new();
    let archive = world.dir.path().join("image.tar");
    let layers = [
        layer("a.txt", b"first layer"),
        layer("b.txt", b"second layer"),
    ];
    let saved = docker_save(&archive, &layers, false);
    let registry = serve(&world, &archive);
    let addr = registry.addr();
    assert!(addr.ip().is_loopback());
    assert_eq!(
        registry.reference(),
        format!("localhost:{}/bottle-agent:t1", addr.port())
    );

    let base = http(addr, "GET", "/v2/");
    assert_eq!(base.status, 200);
    assert_eq!(
        base.header("Docker-Distribution-API-Version"),
        Some("registry/2.0")
    );

    let manifest = http(addr, "GET", "/v2/bottle-agent/manifests/t1");
    assert_eq!(manifest.status, 200);
    assert_eq!(manifest.header("Content-Type"), Some(MANIFEST_MEDIA_TYPE));
    let manifest_digest = digest(&manifest.body);
    assert_eq!(
        manifest.header("Docker-Content-Digest"),
        Some(manifest_digest.as_str())
    );
    let parsed: serde_json::Value = serde_json::from_slice(&manifest.body).unwrap();
    assert_eq!(parsed["schemaVersion"], 2);
    assert_eq!(parsed["config"]["digest"], saved.id);
    assert_eq!(parsed["config"]["size"], saved.config.len());
    let served: Vec<&str> = parsed["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap())
        .collect();
    assert_eq!(served, saved.layers);

    // By digest too, and HEAD gives the headers without a body.
    let by_digest = http(
        addr,
        "GET",
        &format!("/v2/bottle-agent/manifests/{manifest_digest}"),
    );
    assert_eq!(by_digest.body, manifest.body);
    let head = http(addr, "HEAD", "/v2/bottle-agent/manifests/t1");
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("Content-Length"),
        Some(manifest.body.len().to_string().as_str())
    );

    for (i, bytes) in layers.iter().enumerate() {
        let blob = http(
            addr,
            "GET",
            &format!("/v2/bottle-agent/blobs/{}", saved.layers[i]),
        );
        assert_eq!(blob.status, 200);
        assert_eq!(&blob.body, bytes);
        assert_eq!(
            blob.header("Docker-Content-Digest"),
            Some(saved.layers[i].as_str())
        );
    }
    let config = http(addr, "GET", &format!("/v2/bottle-agent/blobs/{}", saved.id));
    assert_eq!(config.body, saved.config);
    let head = http(
        addr,
        "HEAD",
        &format!("/v2/bottle-agent/blobs/{}", saved.id),
    );
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("Content-Length"),
        Some(saved.config.len().to_string().as_str())
    );
}

#[test]
fn refuses_everything_else() {
    let world = World::new();
    let archive = world.dir.path().join("image.tar");
    docker_save(&archive, &[layer("a.txt", b"x")], false);
    let registry = serve(&world, &archive);
    let addr = registry.addr();
    let code = |reply: &crate::support::Reply| {
        serde_json::from_slice::<serde_json::Value>(&reply.body).unwrap()["errors"][0]["code"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let r = http(addr, "GET", "/v2/bottle-agent/manifests/other");
    assert_eq!((r.status, code(&r).as_str()), (404, "MANIFEST_UNKNOWN"));
    let r = http(addr, "GET", "/v2/someone-else/manifests/t1");
    assert_eq!((r.status, code(&r).as_str()), (404, "NAME_UNKNOWN"));
    let r = http(
        addr,
        "GET",
        &format!("/v2/bottle-agent/blobs/sha256:{}", "0".repeat(64)),
    );
    assert_eq!((r.status, code(&r).as_str()), (404, "BLOB_UNKNOWN"));
    let r = http(addr, "GET", "/v2/bottle-agent/blobs/../../../../etc/passwd");
    assert_eq!(r.status, 404);
    let r = http(addr, "PUT", "/v2/bottle-agent/manifests/t1");
    assert_eq!(r.status, 405);
    let r = http(addr, "POST", "/v2/bottle-agent/blobs/uploads/");
    assert_eq!(r.status, 405);
}

#[test]
fn the_registry_is_gone_once_dropped() {
    let world = World::new();
    let archive = world.dir.path().join("image.tar");
    docker_save(&archive, &[layer("a.txt", b"x")], false);
    let registry = serve(&world, &archive);
    let addr = registry.addr();
    drop(registry);
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn a_repeated_layer_written_as_a_symlink_is_followed() {
    let world = World::new();
    let archive = world.dir.path().join("image.tar");
    let same = layer("same.txt", b"same bytes");
    let saved = docker_save(
        &archive,
        &[same.clone(), layer("b", b"b"), same.clone()],
        true,
    );
    let registry = serve(&world, &archive);
    let blob = http(
        registry.addr(),
        "GET",
        &format!("/v2/bottle-agent/blobs/{}", saved.layers[2]),
    );
    assert_eq!(blob.body, same);
}

#[test]
fn an_archive_that_lies_about_its_layers_is_refused() {
    let world = World::new();
    let archive = world.dir.path().join("image.tar");
    docker_save(&archive, &[layer("a.txt", b"x")], false);
    // Rewrite the layer bytes behind the config's back.
    let mut rewritten = tar::Builder::new(Vec::new());
    let bytes = std::fs::read(&archive).unwrap();
    for entry in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        if path.ends_with("layer.tar") {
            data = layer("a.txt", b"tampered");
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        rewritten
            .append_data(&mut header, path, data.as_slice())
            .unwrap();
    }
    std::fs::write(&archive, rewritten.into_inner().unwrap()).unwrap();
    let err = ImageBlobs::from_docker_save(&archive, &world.dir.path().join("blobs")).unwrap_err();
    assert!(matches!(err, SmolvmError::ImageArchive { .. }), "{err:?}");
}

#[test]
fn pack_goes_through_the_registry_and_lands_in_the_cache() {
    let world = World::new();
    let archive = world.dir.path().join("image.tar");
    let saved = docker_save(&archive, &[layer("bin/agent", b"#!/bin/sh\n")], false);
    let smolvm = world.smolvm("1.9.3", "");
    let tag = saved.id.trim_start_matches("sha256:");
    let entry = bottle_smolvm::pack::pack_archive(
        &archive,
        tag,
        &world.cache(),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        &smolvm,
    )
    .unwrap();
    assert_eq!(entry, world.cache().join(format!("{tag}.smolmachine")));
    let artifact: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
    // The fake pulled the manifest and every blob, digests checked.
    assert_eq!(artifact["config"], saved.id);
    assert_eq!(artifact["layers"], serde_json::json!(saved.layers));
    // Nothing but the cache entry is left behind.
    let left: Vec<_> = std::fs::read_dir(world.cache())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [format!("{tag}.smolmachine")]);
}

#[test]
fn a_real_docker_export_is_served_and_packed() {
    let Some(docker) = docker_available("a_real_docker_export_is_served_and_packed") else {
        return;
    };
    use bollard::query_parameters::{BuildImageOptionsBuilder, RemoveImageOptionsBuilder};
    use futures_util::StreamExt as _;

    let world = World::new();
    let tag = format!("bottle-smolvm-test:{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A build context: FROM scratch plus one file, so no registry is needed.
    let mut context = tar::Builder::new(Vec::new());
    for (path, data) in [
        (
            "Dockerfile",
            b"FROM scratch\nCOPY hello.txt /hello.txt\n".as_slice(),
        ),
        ("hello.txt", b"hello from a local build\n".as_slice()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        context.append_data(&mut header, path, data).unwrap();
    }
    let context = context.into_inner().unwrap();
    runtime.block_on(async {
        let options = BuildImageOptionsBuilder::default()
            .dockerfile("Dockerfile")
            .t(&tag)
            .rm(true)
            .build();
        let mut build = docker.build_image(options, None, Some(bollard::body_full(context.into())));
        while let Some(step) = build.next().await {
            step.unwrap();
        }
    });

    let images = EngineExport {
        docker: docker.clone(),
    };
    use bottle_core::images::ImageStore as _;
    let image = images.inspect(&tag).unwrap();
    let archive = world.dir.path().join("export.tar");
    images.export(&image.id, &archive).unwrap();
    let smolvm = world.smolvm("1.9.3", "");
    let cache = bottle_smolvm::pack::SmolmachineCache::new(world.cache());
    let entry = cache.smolmachine(&images, &image, &smolvm);
    runtime.block_on(async {
        let _ = docker
            .remove_image(
                &tag,
                Some(RemoveImageOptionsBuilder::default().force(true).build()),
                None,
            )
            .await;
    });
    let entry = entry.unwrap();
    let artifact: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
    assert_eq!(
        artifact["config"], image.id,
        "the config blob is the image ID"
    );
    assert_eq!(artifact["layers"].as_array().unwrap().len(), 1);

    // The same export, served by hand, answers the API.
    let blobs = ImageBlobs::from_docker_save(&archive, &world.dir.path().join("blobs")).unwrap();
    let registry =
        Registry::serve(blobs, "bottle-agent", "x", IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let manifest = http(registry.addr(), "GET", "/v2/bottle-agent/manifests/x");
    assert_eq!(manifest.status, 200);
    // A second request for the same image is a cache hit: no engine needed.
    assert_eq!(cache.cached(&image), Some(entry));
}

/// The Engine's own image export, as the CLI's image store does it
/// (bottle-docker's `EngineImages`, which this crate may not depend on).
struct EngineExport {
    docker: bollard::Docker,
}

impl EngineExport {
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }
}

impl bottle_core::images::ImageStore for EngineExport {
    fn inspect(
        &self,
        reference: &str,
    ) -> Result<bottle_core::images::AgentImage, bottle_core::BackendError> {
        let image = Self::runtime()
            .block_on(self.docker.inspect_image(reference))
            .unwrap();
        let config = image.config.unwrap_or_default();
        Ok(bottle_core::images::AgentImage {
            reference: reference.into(),
            id: image.id.unwrap(),
            entrypoint: config.entrypoint.unwrap_or_default(),
            cmd: config.cmd.unwrap_or_default(),
        })
    }

    fn export(&self, id: &str, dest: &std::path::Path) -> Result<(), bottle_core::BackendError> {
        use futures_util::StreamExt as _;
        let bytes = Self::runtime().block_on(async {
            let mut out = Vec::new();
            let mut stream = self.docker.export_image(id);
            while let Some(chunk) = stream.next().await {
                out.extend_from_slice(&chunk.unwrap());
            }
            out
        });
        std::fs::write(dest, bytes).unwrap();
        Ok(())
    }
}
