//! The agent image as a `.smolmachine`, cached by image ID.
//!
//! `smolvm pack create` reads only registry references, so a locally built
//! image goes through [`crate::registry`]: exported from an
//! [`ImageStore`] (the Docker Engine, in practice), unpacked into blobs, served on an ephemeral port for the length of
//! the pack, then the server and the staging files are gone. The result is
//! kept as `<cache>/<image id hex>.smolmachine`: the ID is content-addressed,
//! so a rebuilt image gets a new entry and an unchanged one skips the whole
//! pipeline.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use bottle_core::images::{AgentImage, ImageStore};

use crate::cli::Smolvm;
use crate::error::{SmolvmError, io_err};
use crate::registry::{ImageBlobs, Registry};

/// The repository name the local registry serves the agent image under.
pub const REPOSITORY: &str = "bottle-agent";

/// The `.smolmachine`s of agent images, cached by image ID under one
/// directory and packed on a miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmolmachineCache {
    dir: PathBuf,
    bind: IpAddr,
}

impl SmolmachineCache {
    /// A cache under `dir`, whose packing registry binds loopback.
    pub fn new(dir: PathBuf) -> SmolmachineCache {
        SmolmachineCache {
            dir,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// The cached `.smolmachine` for `image`, if it is there.
    pub fn cached(&self, image: &AgentImage) -> Option<PathBuf> {
        Some(cache_entry(&self.dir, image)).filter(|p| p.is_file())
    }

    /// The `.smolmachine` for `image`: the cached one, or `images`' export
    /// of it packed by `smolvm pack create`.
    pub fn smolmachine(
        &self,
        images: &dyn ImageStore,
        image: &AgentImage,
        smolvm: &Smolvm,
    ) -> Result<PathBuf, SmolvmError> {
        if let Some(hit) = self.cached(image) {
            return Ok(hit);
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| io_err("create directory", &self.dir, e))?;
        let staging = Staging::new(&self.dir)?;
        let archive = staging.path.join("image.tar");
        images
            .export(&image.id, &archive)
            .map_err(SmolvmError::External)?;
        pack_archive(&archive, image.id_hex(), &self.dir, self.bind, smolvm)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_keyed_by_image_id() {
        use bottle_core::images::AgentImage;
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
