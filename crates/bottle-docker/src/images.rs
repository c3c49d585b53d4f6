//! Images: resolving the agent's (local only: no registry is reachable),
//! building it from a Dockerfile context, and the bundle image built from
//! the static `bottle-bundle` binary.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use bollard::query_parameters::BuildImageOptionsBuilder;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::client::Engine;
use crate::config::BUNDLE_BINARY_PATH;
use crate::error::{DockerError, is_not_found};
use crate::tarball::{Ownership, TarBuilder};

/// Receives one line of progress (build output, provisioning steps).
pub type Progress = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

pub use bottle_core::bundle_binary::{
    BUNDLE_BIN_ENV, bundle_binary_candidates, elf_needs_interpreter,
};

/// Repository of the bundle image; the tag is the binary's hash.
pub const BUNDLE_IMAGE_REPO: &str = "bottle-bundle";

/// What an image is, as far as a launch cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFacts {
    /// The image ID (`sha256:...`).
    pub id: String,
    /// The configured user; empty means root.
    pub user: String,
    /// Entrypoint followed by cmd.
    pub default_command: Vec<String>,
}

/// The Engine's inspection of a local image; a missing one is
/// [`DockerError::ImageNotFound`].
pub(crate) fn inspect_raw(
    engine: &Engine,
    reference: &str,
) -> Result<bollard::models::ImageInspect, DockerError> {
    engine
        .block_on(engine.docker.inspect_image(reference))
        .map_err(|err| {
            if is_not_found(&err) {
                DockerError::ImageNotFound {
                    reference: reference.to_string(),
                }
            } else {
                DockerError::api(format!("inspect image {reference}"))(err)
            }
        })
}

/// Inspects a local image; a missing one is [`DockerError::ImageNotFound`].
pub fn inspect_image(engine: &Engine, reference: &str) -> Result<ImageFacts, DockerError> {
    let image = inspect_raw(engine, reference)?;
    let config = image.config.unwrap_or_default();
    let mut default_command = config.entrypoint.unwrap_or_default();
    default_command.extend(config.cmd.unwrap_or_default());
    Ok(ImageFacts {
        id: image.id.unwrap_or_else(|| reference.to_string()),
        user: config.user.unwrap_or_default(),
        default_command,
    })
}

/// True if a local image exists.
pub fn image_exists(engine: &Engine, reference: &str) -> Result<bool, DockerError> {
    match inspect_image(engine, reference) {
        Ok(_) => Ok(true),
        Err(DockerError::ImageNotFound { .. }) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Builds `tag` from an in-memory tar context. Build output goes to
/// `progress` line by line when given; on failure the error carries the
/// last lines either way.
pub fn build_from_tar(
    engine: &Engine,
    context: Vec<u8>,
    dockerfile: &str,
    tag: &str,
    build_args: &HashMap<String, String>,
    labels: &HashMap<String, String>,
    progress: Option<&Progress>,
) -> Result<ImageFacts, DockerError> {
    let mut options = BuildImageOptionsBuilder::default()
        .dockerfile(dockerfile)
        .t(tag)
        .rm(true)
        .forcerm(true)
        .labels(labels);
    if !build_args.is_empty() {
        options = options.buildargs(build_args);
    }
    let options = options.build();
    let mut tail: Vec<String> = Vec::new();
    let result: Result<(), String> = engine.block_on(async {
        let mut stream =
            engine
                .docker
                .build_image(options, None, Some(bollard::body_full(context.into())));
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    let text = info.stream.or(info.status).unwrap_or_default();
                    for line in text.lines().filter(|l| !l.trim().is_empty()) {
                        if let Some(progress) = progress {
                            progress(line);
                        }
                        tail.push(line.to_string());
                        if tail.len() > 20 {
                            tail.remove(0);
                        }
                    }
                }
                Err(bollard::errors::Error::DockerStreamError { error }) => return Err(error),
                Err(err) => return Err(err.to_string()),
            }
        }
        Ok(())
    });
    if let Err(error) = result {
        let mut detail = error.trim().to_string();
        if !tail.is_empty() {
            detail.push_str("\n  build output (last lines):\n    ");
            detail.push_str(&tail.join("\n    "));
        }
        return Err(DockerError::Build {
            tag: tag.to_string(),
            detail,
        });
    }
    inspect_image(engine, tag)
}

/// Tars a build context directory, honouring the simple forms of
/// `.dockerignore` (one glob per line, matched against relative paths;
/// `#` comments; `!` exceptions are not supported and are ignored).
pub fn context_tar(dir: &Path) -> Result<Vec<u8>, DockerError> {
    let meta = std::fs::metadata(dir).map_err(DockerError::io("read the build context", dir))?;
    if !meta.is_dir() {
        return Err(DockerError::Io {
            action: "use as a build context".into(),
            path: dir.to_path_buf(),
            source: std::io::Error::other("not a directory"),
        });
    }
    let patterns: Vec<glob::Pattern> = match std::fs::read_to_string(dir.join(".dockerignore")) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
            .filter_map(|l| {
                glob::Pattern::new(l.trim_start_matches("./").trim_end_matches('/')).ok()
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let mut tar = TarBuilder::new();
    tar.tree(dir, "", Ownership::ROOT, &|rel| {
        patterns.iter().any(|p| p.matches(rel))
    })?;
    tar.finish()
}

/// Where the static bundle binary is: the explicit option, then the places
/// [`bundle_binary_candidates`] lists for this process, the first that is a
/// file.
pub fn find_bundle_binary(explicit: Option<&Path>) -> Result<PathBuf, DockerError> {
    let mut candidates: Vec<PathBuf> = explicit.map(Path::to_path_buf).into_iter().collect();
    candidates.extend(bundle_binary_candidates(
        std::env::var_os(BUNDLE_BIN_ENV).as_deref(),
        std::env::current_exe().ok().as_deref(),
    ));
    let mut searched = Vec::new();
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
        searched.push(candidate.display().to_string());
    }
    Err(DockerError::BundleBinaryMissing { searched })
}

/// The host files git-gate needs in the bundle image (git, its helpers,
/// their shared libraries): `(host path, path in the image)`, from
/// [`bottle_bundle_files::git_runtime_files`], which runs `git --exec-path`
/// and `ldd` through `runner`.
pub fn git_runtime_files(
    runner: &dyn bottle_core::exec::CommandRunner,
) -> Result<Vec<(PathBuf, String)>, DockerError> {
    bottle_bundle_files::git_runtime_files(runner).map_err(|err| DockerError::GitRuntime {
        detail: match err {
            bottle_bundle_files::BundleFilesError::GitRuntime { detail } => detail,
            other => other.to_string(),
        },
    })
}

/// The bundle image for a binary: `bottle-bundle:<first 12 hex of
/// sha256>`, built `FROM scratch` if it is not there yet, so it is rebuilt
/// exactly when the binary changes.
///
/// `git_files` (from [`git_runtime_files`]; empty when the bottle has no
/// git repositories) go into the image at their paths, with a
/// world-writable `/tmp` for git-gate's work dir; the hash then covers
/// them too, so the image is rebuilt when the host's git changes.
pub fn ensure_bundle_image(
    engine: &Engine,
    binary: &Path,
    git_files: &[(PathBuf, String)],
    progress: Option<&Progress>,
) -> Result<String, DockerError> {
    ensure_bundle_image_with(engine, binary, git_files, progress, None)
}

/// [`ensure_bundle_image`] for the install whose state root is
/// `state_root` (when given): the binary's digest is remembered under it
/// ([`BUNDLE_DIGEST_CACHE`]) by the binary's identity (device, inode,
/// size, mtime and ctime), so a start whose image exists neither reads nor
/// hashes the binary, and an image it builds is labelled as this
/// install's ([`LABEL_BUNDLE_STATE_ROOT`]), the only bundle images its
/// `cleanup` removes. Building an image always reads and hashes the binary
/// anew.
pub fn ensure_bundle_image_with(
    engine: &Engine,
    binary: &Path,
    git_files: &[(PathBuf, String)],
    progress: Option<&Progress>,
    state_root: Option<&Path>,
) -> Result<String, DockerError> {
    let digest_cache = state_root.map(|root| root.join(BUNDLE_DIGEST_CACHE));
    let digest_cache = digest_cache.as_deref();
    if git_files.is_empty()
        && let Some(cache) = digest_cache
        && let Some(digest) = DigestCache::lookup(cache, binary)
    {
        let tag = format!("{BUNDLE_IMAGE_REPO}:{}", &digest[..12]);
        if image_exists(engine, &tag)? {
            return Ok(tag);
        }
    }
    let identity = DigestCache::identity(binary);
    let bytes = std::fs::read(binary).map_err(DockerError::io("read", binary))?;
    if elf_needs_interpreter(&bytes) != Some(false) {
        return Err(DockerError::BundleBinaryNotStatic {
            path: binary.to_path_buf(),
        });
    }
    let digest = Sha256::digest(&bytes);
    if let (Some(cache), Some(identity)) = (digest_cache, identity)
        // Unchanged while it was read: the digest is this identity's.
        && DigestCache::identity(binary).as_ref() == Some(&identity)
    {
        DigestCache::store(cache, &identity, &hex(&digest));
    }
    let mut rootfs = Vec::with_capacity(git_files.len());
    let mut image_hash = Sha256::new();
    image_hash.update(digest);
    for (host, in_image) in git_files {
        let data = std::fs::read(host).map_err(DockerError::io("read", host))?;
        let mode = std::fs::metadata(host)
            .map_err(DockerError::io("read", host))?
            .permissions()
            .mode()
            & 0o755;
        let name = format!("rootfs/{}", in_image.trim_start_matches('/'));
        image_hash.update((name.len() as u64).to_le_bytes());
        image_hash.update(name.as_bytes());
        image_hash.update((data.len() as u64).to_le_bytes());
        image_hash.update(&data);
        rootfs.push((name, data, mode));
    }
    let version = if rootfs.is_empty() {
        hex(&digest[..6])
    } else {
        format!("{}-git", hex(&image_hash.finalize()[..6]))
    };
    let tag = format!("{BUNDLE_IMAGE_REPO}:{version}");
    if image_exists(engine, &tag)? {
        return Ok(tag);
    }
    if let Some(progress) = progress {
        progress(&format!(
            "building bundle image {tag} from {}",
            binary.display()
        ));
    }
    let copy_rootfs = if rootfs.is_empty() {
        ""
    } else {
        "COPY rootfs/ /\n"
    };
    let dockerfile = format!(
        "FROM scratch\nCOPY bottle-bundle {BUNDLE_BINARY_PATH}\n{copy_rootfs}ENTRYPOINT [\"{BUNDLE_BINARY_PATH}\"]\nCMD [\"run\"]\n"
    );
    let mut tar = TarBuilder::new();
    tar.file("Dockerfile", dockerfile.as_bytes(), 0o644, Ownership::ROOT)?;
    tar.file("bottle-bundle", &bytes, 0o755, Ownership::ROOT)?;
    if !rootfs.is_empty() {
        tar.dir("rootfs", 0o755, Ownership::ROOT)?;
        tar.dir("rootfs/tmp", 0o1777, Ownership::ROOT)?;
    }
    for (name, data, mode) in &rootfs {
        tar.file(name, data, *mode, Ownership::ROOT)?;
    }
    let mut labels = HashMap::from([(LABEL_BUNDLE_SHA256.to_string(), hex(&digest))]);
    if let Some(root) = state_root {
        labels.insert(
            LABEL_BUNDLE_STATE_ROOT.to_string(),
            root.display().to_string(),
        );
    }
    build_from_tar(
        engine,
        tar.finish()?,
        "Dockerfile",
        &tag,
        &HashMap::new(),
        &labels,
        progress,
    )?;
    Ok(tag)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One remembered digest of a static bundle binary, in a small file of
/// the operator's own state root: the binary's identity on the first line,
/// its sha256 on the second. A cache only: anything unreadable or
/// different is a miss, and a failed write costs the next start a hash.
struct DigestCache;

impl DigestCache {
    /// Device, inode, size, mtime and ctime of `binary`, and its path. The
    /// ctime changes with any write and cannot be set back, so a binary
    /// replaced or rewritten in place never matches an old entry.
    fn identity(binary: &Path) -> Option<String> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(binary).ok()?;
        Some(format!(
            "v1 {} {} {} {}.{} {}.{} {}",
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
            binary.display()
        ))
    }

    /// The remembered sha256 (hex) of `binary`, if its identity matches.
    fn lookup(cache: &Path, binary: &Path) -> Option<String> {
        let text = std::fs::read_to_string(cache).ok()?;
        let (identity, digest) = text.trim_end().split_once('\n')?;
        let valid = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        (valid && Some(identity) == Self::identity(binary).as_deref()).then(|| digest.to_string())
    }

    /// Remembers `digest` for `identity`; written aside and renamed, so a
    /// reader sees the old entry or the new one.
    fn store(cache: &Path, identity: &str, digest: &str) {
        crate::cache::store(cache, format!("{identity}\n{digest}\n").as_bytes());
    }
}

/// The file under the state root that remembers the bundle binary's
/// digest ([`ensure_bundle_image_with`]). In a directory of its own: every
/// backend's listing reads each entry of the state root as a bottle's
/// state dir, and this one holds no bottle's records.
pub const BUNDLE_DIGEST_CACHE: &str = ".cache/bundle-digest";

/// The label every bundle image carries: the sha256 of the bundle binary
/// it was built from.
pub const LABEL_BUNDLE_SHA256: &str = "bottle.bundle-sha256";

/// The label of a bundle image built for an install: its state root. An
/// image without it (built before it existed, or by a library caller with
/// no state root) belongs to no install, and no `cleanup` removes it.
pub const LABEL_BUNDLE_STATE_ROOT: &str = "bottle.state-root";

/// Finds (and, for the items `pass` says the operator approved, removes)
/// the bundle images this install built (labelled with `state_root`) from
/// another bundle binary than `current` that no container uses, even a
/// stopped one (each new binary leaves one behind). Another install's
/// images are never listed. Nothing is listed when `current` cannot be
/// read, so the image a launch is about to use is never pruned.
pub fn prune_bundle_images(
    engine: &Engine,
    current: &Path,
    state_root: &Path,
    pass: &mut bottle_core::backend::CleanupPass<'_>,
) -> Result<(), DockerError> {
    use bollard::query_parameters::{
        ListContainersOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
    };
    let Ok(bytes) = std::fs::read(current) else {
        return Ok(());
    };
    let current: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let install = format!("{LABEL_BUNDLE_STATE_ROOT}={}", state_root.display());
    let filters = HashMap::from([(
        "label".to_string(),
        vec![LABEL_BUNDLE_SHA256.to_string(), install],
    )]);
    let images = engine
        .block_on(
            engine.docker.list_images(Some(
                ListImagesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            )),
        )
        .map_err(DockerError::api("list the bundle images"))?;
    let in_use: std::collections::HashSet<String> = engine
        .block_on(engine.docker.list_containers(Some(
            ListContainersOptionsBuilder::default().all(true).build(),
        )))
        .map_err(DockerError::api("list the containers"))?
        .into_iter()
        .filter_map(|c| c.image_id)
        .collect();
    for image in images {
        if image.labels.get(LABEL_BUNDLE_SHA256) == Some(&current) || in_use.contains(&image.id) {
            continue;
        }
        let name = image
            .repo_tags
            .iter()
            .find(|t| t.starts_with(&format!("{BUNDLE_IMAGE_REPO}:")))
            .cloned()
            .unwrap_or_else(|| image.id.clone());
        let item = bottle_core::backend::CleanupItem::new(
            "image",
            name.clone(),
            "a bundle image this install built from an older bundle binary; no container uses it",
        );
        if !pass.found(item) {
            continue;
        }
        let options = RemoveImageOptionsBuilder::default().build();
        match engine.block_on(engine.docker.remove_image(&image.id, Some(options), None)) {
            Ok(_) => pass.report.removed.push(format!("image {name}")),
            // In use by a container since it was listed, or already gone:
            // not ours to remove now.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => {}
            Err(err) => pass
                .report
                .failed
                .push(DockerError::api(format!("remove image {name}"))(err).to_string()),
        }
    }
    Ok(())
}

/// Builds the demo agent image (`examples/demo-agent/`) as `tag`: the
/// directory's files plus the static busybox at `busybox` (Debian's
/// `busybox-static` installs it at `/bin/busybox`), which is copied into
/// the context at build time rather than committed.
pub fn build_demo_agent(
    engine: &Engine,
    demo_dir: &Path,
    busybox: &Path,
    tag: &str,
    progress: Option<&Progress>,
) -> Result<ImageFacts, DockerError> {
    let busybox_bytes = std::fs::read(busybox).map_err(DockerError::io("read", busybox))?;
    if elf_needs_interpreter(&busybox_bytes) != Some(false) {
        return Err(DockerError::Build {
            tag: tag.to_string(),
            detail: format!(
                "{} is not a static binary (install Debian's busybox-static)",
                busybox.display()
            ),
        });
    }
    let mut tar = TarBuilder::new();
    tar.tree(demo_dir, "", Ownership::ROOT, &|rel| rel == "busybox")?;
    tar.file("busybox", &busybox_bytes, 0o755, Ownership::ROOT)?;
    build_from_tar(
        engine,
        tar.finish()?,
        "Dockerfile",
        tag,
        &HashMap::new(),
        &HashMap::new(),
        progress,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_digest_is_forgotten_when_the_binary_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (binary, cache) = (dir.path().join("bottle-bundle"), dir.path().join("cache"));
        std::fs::write(&binary, b"one").unwrap();
        assert_eq!(DigestCache::lookup(&cache, &binary), None);
        let identity = DigestCache::identity(&binary).unwrap();
        let digest = hex(&Sha256::digest(b"one"));
        DigestCache::store(&cache, &identity, &digest);
        assert_eq!(DigestCache::lookup(&cache, &binary), Some(digest));
        // Same size, and the mtime set back: the ctime still moves.
        let mtime = std::fs::metadata(&binary).unwrap().modified().unwrap();
        std::fs::write(&binary, b"two").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&binary)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        wait_for_ctime_to_move(&binary, &identity);
        assert_eq!(DigestCache::lookup(&cache, &binary), None);
    }

    /// Some filesystems keep coarse timestamps: rewrite until the ctime
    /// differs, within a bound.
    fn wait_for_ctime_to_move(binary: &Path, old: &str) {
        for _ in 0..200 {
            if DigestCache::identity(binary).as_deref() != Some(old) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::fs::write(binary, b"two").unwrap();
        }
        panic!("the ctime of {} never moved", binary.display());
    }

    #[test]
    fn static_and_dynamic_binaries_are_told_apart() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Test binaries are dynamically linked unless built with crt-static.
        let dynamic = elf_needs_interpreter(&me).unwrap();
        let pause = crate::pause::pause_elf("x86_64").unwrap();
        assert_eq!(elf_needs_interpreter(&pause), Some(false));
        assert_eq!(elf_needs_interpreter(b"#!/bin/sh\n"), None);
        if cfg!(target_feature = "crt-static") {
            assert!(!dynamic);
        } else {
            assert!(dynamic);
        }
    }

    #[test]
    fn the_bundle_binary_is_searched_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let present = dir.path().join("bottle-bundle");
        std::fs::write(&present, b"x").unwrap();
        assert_eq!(find_bundle_binary(Some(&present)).unwrap(), present);
        let missing = dir.path().join("nope");
        match find_bundle_binary(Some(&missing)) {
            Err(DockerError::BundleBinaryMissing { searched }) => {
                assert_eq!(searched[0], missing.display().to_string());
            }
            // BOTTLE_BUNDLE_BIN or a binary next to the test may exist.
            Ok(found) => assert_ne!(found, missing),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn context_tars_honour_dockerignore() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::write(dir.path().join(".dockerignore"), "# c\nsecret*\ntarget\n").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "s").unwrap();
        std::fs::create_dir(dir.path().join("target")).unwrap();
        std::fs::write(dir.path().join("target/big"), "b").unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/main.rs"), "m").unwrap();
        let archive = context_tar(dir.path()).unwrap();
        let mut names: Vec<String> = tar::Archive::new(&archive[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".dockerignore", "Dockerfile", "src", "src/main.rs"]);
    }
}
