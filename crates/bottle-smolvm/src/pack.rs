//! The agent image as a `.smolmachine`, cached by image ID.
//!
//! `smolvm pack create` reads only registry references, so a locally built
//! image goes through [`crate::registry`]: exported from the Docker Engine
//! (`GET /images/{name}/get` via bollard's `export_image`, never the docker
//! CLI), unpacked into blobs, served on an ephemeral port for the length of
//! the pack, then the server and the staging files are gone. The result is
//! kept as `<cache>/<image id hex>.smolmachine`: the ID is content-addressed,
//! so a rebuilt image gets a new entry and an unchanged one skips the whole
//! pipeline.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

use crate::cli::Smolvm;
use crate::error::{SmolvmError, io_err};
use crate::registry::{ImageBlobs, Registry};

/// The repository name the local registry serves the agent image under.
pub const REPOSITORY: &str = "bottle-agent";

/// An agent image, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentImage {
    /// The reference the manifest gave.
    pub reference: String,
    /// The image ID (`sha256:<hex>`): the cache key.
    pub id: String,
    /// The image's entrypoint.
    pub entrypoint: Vec<String>,
    /// The image's cmd.
    pub cmd: Vec<String>,
}

impl AgentImage {
    /// The ID's hex, without `sha256:`.
    pub fn id_hex(&self) -> &str {
        self.id.strip_prefix("sha256:").unwrap_or(&self.id)
    }

    /// What runs when the manifest gives no command: entrypoint + cmd.
    pub fn default_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// Where agent images come from and how they become `.smolmachine`s.
pub trait ImageSource: Send + Sync {
    /// Resolves a local image reference to its ID and default command.
    fn inspect(&self, reference: &str) -> Result<AgentImage, SmolvmError>;

    /// The cached `.smolmachine` for `image`, if it is there.
    fn cached(&self, image: &AgentImage) -> Option<PathBuf>;

    /// The `.smolmachine` for `image`, packing it on a cache miss.
    fn smolmachine(&self, image: &AgentImage, smolvm: &Smolvm) -> Result<PathBuf, SmolvmError>;
}

/// `<cache>/<id hex>.smolmachine`.
pub fn cache_entry(cache_dir: &Path, image: &AgentImage) -> PathBuf {
    cache_dir.join(format!("{}.smolmachine", image.id_hex()))
}

/// The default cache: `$XDG_CACHE_HOME/bottle/smolmachines`, else
/// `~/.cache/bottle/smolmachines`.
pub fn default_cache_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let absolute = |v: Option<String>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    absolute(env("XDG_CACHE_HOME"))
        .or_else(|| absolute(env("HOME")).map(|h| h.join(".cache")))
        .map(|c| c.join("bottle/smolmachines"))
}

/// Packs a `docker save` archive into `<cache>/<tag>.smolmachine`: serves it
/// on `bind` and runs `smolvm pack create` against it. The registry and the
/// staging files are removed whatever happens.
pub fn pack_archive(
    archive: &Path,
    tag: &str,
    cache_dir: &Path,
    bind: IpAddr,
    smolvm: &Smolvm,
) -> Result<PathBuf, SmolvmError> {
    std::fs::create_dir_all(cache_dir).map_err(|e| io_err("create directory", cache_dir, e))?;
    let staging = Staging::new(cache_dir)?;
    let blobs = ImageBlobs::from_docker_save(archive, &staging.path.join("blobs"))?;
    let registry = Registry::serve(blobs, REPOSITORY, tag, bind)?;
    let output = staging.path.join(tag);
    let sidecar = smolvm.pack_create(&registry.reference(), &output)?;
    drop(registry);
    let entry = cache_dir.join(format!("{tag}.smolmachine"));
    // A rename is atomic: a concurrent launch sees the old entry or the new
    // one, never half a file.
    std::fs::rename(&sidecar, &entry).map_err(|e| io_err("move into the cache", &entry, e))?;
    Ok(entry)
}

/// A staging directory removed on drop.
struct Staging {
    path: PathBuf,
}

impl Staging {
    fn new(cache_dir: &Path) -> Result<Staging, SmolvmError> {
        let path = cache_dir.join(format!(
            ".staging-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&path).map_err(|e| io_err("create directory", &path, e))?;
        Ok(Staging { path })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Agent images from the local Docker Engine.
pub struct DockerImages {
    docker: bollard::Docker,
    runtime: tokio::runtime::Runtime,
    cache_dir: PathBuf,
    bind: IpAddr,
}

impl std::fmt::Debug for DockerImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerImages")
            .field("cache_dir", &self.cache_dir)
            .field("bind", &self.bind)
            .finish_non_exhaustive()
    }
}

impl DockerImages {
    /// Connects to the engine the usual way (`DOCKER_HOST` or the local
    /// socket) and caches under `cache_dir`. The registry binds loopback.
    pub fn connect(cache_dir: PathBuf) -> Result<DockerImages, SmolvmError> {
        let docker =
            bollard::Docker::connect_with_defaults().map_err(|source| SmolvmError::Docker {
                action: "connect".into(),
                source,
            })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| io_err("start a runtime for", "the docker client", e))?;
        Ok(DockerImages {
            docker,
            runtime,
            cache_dir,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        })
    }

    /// Serves images to `pack create` on `bind` instead of loopback.
    pub fn bind(mut self, bind: IpAddr) -> DockerImages {
        self.bind = bind;
        self
    }

    /// Writes the engine's export of `reference` to `dest`.
    pub fn export(&self, reference: &str, dest: &Path) -> Result<(), SmolvmError> {
        self.runtime.block_on(async {
            let mut file = tokio::fs::File::create(dest)
                .await
                .map_err(|e| io_err("create", dest, e))?;
            let mut stream = self.docker.export_image(reference);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|source| SmolvmError::Docker {
                    action: format!("export image {reference}"),
                    source,
                })?;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| io_err("write", dest, e))?;
            }
            file.flush().await.map_err(|e| io_err("write", dest, e))
        })
    }
}

impl ImageSource for DockerImages {
    fn inspect(&self, reference: &str) -> Result<AgentImage, SmolvmError> {
        let inspect = self
            .runtime
            .block_on(self.docker.inspect_image(reference))
            .map_err(|source| SmolvmError::Docker {
                action: format!("inspect image {reference}"),
                source,
            })?;
        let id = inspect.id.ok_or_else(|| SmolvmError::ImageArchive {
            detail: format!("the engine reported no ID for {reference}"),
        })?;
        let config = inspect.config.unwrap_or_default();
        Ok(AgentImage {
            reference: reference.into(),
            id,
            entrypoint: config.entrypoint.unwrap_or_default(),
            cmd: config.cmd.unwrap_or_default(),
        })
    }

    fn cached(&self, image: &AgentImage) -> Option<PathBuf> {
        Some(cache_entry(&self.cache_dir, image)).filter(|p| p.is_file())
    }

    fn smolmachine(&self, image: &AgentImage, smolvm: &Smolvm) -> Result<PathBuf, SmolvmError> {
        if let Some(hit) = self.cached(image) {
            return Ok(hit);
        }
        std::fs::create_dir_all(&self.cache_dir)
            .map_err(|e| io_err("create directory", &self.cache_dir, e))?;
        let staging = Staging::new(&self.cache_dir)?;
        let archive = staging.path.join("image.tar");
        self.export(&image.id, &archive)?;
        pack_archive(&archive, image.id_hex(), &self.cache_dir, self.bind, smolvm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_keyed_by_image_id() {
        let image = AgentImage {
            reference: "agent:latest".into(),
            id: "sha256:abc".into(),
            entrypoint: vec!["/bin/agent".into()],
            cmd: vec!["--serve".into()],
        };
        assert_eq!(
            cache_entry(Path::new("/c"), &image),
            PathBuf::from("/c/abc.smolmachine")
        );
        assert_eq!(image.default_command(), ["/bin/agent", "--serve"]);
    }

    #[test]
    fn cache_dir_follows_xdg() {
        let env = |k: &str| match k {
            "XDG_CACHE_HOME" => Some("/x".to_string()),
            "HOME" => Some("/h".to_string()),
            _ => None,
        };
        assert_eq!(
            default_cache_dir(env),
            Some(PathBuf::from("/x/bottle/smolmachines"))
        );
        let env = |k: &str| (k == "HOME").then(|| "/h".to_string());
        assert_eq!(
            default_cache_dir(env),
            Some(PathBuf::from("/h/.cache/bottle/smolmachines"))
        );
    }
}
