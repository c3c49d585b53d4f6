//! A container's files through the Engine's archive API: one file or
//! entry read out, whether a directory holds anything, an archive
//! extracted in, and the numeric owner of the container's user. Used by
//! the launch, `bottle cp` and `bottle commit` alike.

use bollard::query_parameters::UploadToContainerOptionsBuilder;
use futures_util::StreamExt;

use crate::client::Engine;
use crate::error::DockerError;
use crate::tarball::Ownership;

/// The numeric owner of the container's configured user.
pub fn container_owner(engine: &Engine, container: &str) -> Result<Ownership, DockerError> {
    let inspect = engine
        .block_on(engine.docker.inspect_container(container, None))
        .map_err(DockerError::api(format!("inspect container {container}")))?;
    let config = inspect.config.unwrap_or_default();
    // Agent containers run their own processes as the keep-alive user; the
    // files copied in belong to the agent's user.
    let user = match config
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::names::LABEL_AGENT_USER))
    {
        Some(agent) => agent.clone(),
        None => config.user.unwrap_or_default(),
    };
    if user.is_empty() {
        return Ok(Ownership::ROOT);
    }
    let text = |path: &str| -> Result<String, DockerError> {
        Ok(download_file(engine, container, path)?
            .map(|(bytes, _)| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default())
    };
    crate::users::resolve_owner(&user, &text("/etc/passwd")?, &text("/etc/group")?)
}

/// A regular file from the container, or `None` if it is absent (or not a
/// regular file, e.g. a symlink into another directory).
pub fn download_file(
    engine: &Engine,
    container: &str,
    path: &str,
) -> Result<Option<(Vec<u8>, u32)>, DockerError> {
    let result = download_archive(engine, container, path);
    match result {
        Ok(archive) => crate::tarball::first_file(&archive)
            .map_err(DockerError::io(format!("read {path} from"), container)),
        Err(err) if crate::error::is_not_found(&err) => Ok(None),
        Err(err) => Err(DockerError::api(format!("read {path} from {container}"))(
            err,
        )),
    }
}

/// What is at `path` in the container, a final symlink not followed. A
/// directory is recognised from the archive's stat header alone, so its
/// contents are never downloaded.
pub fn container_entry(
    engine: &Engine,
    container: &str,
    path: &str,
) -> Result<bottle_core::agent_box::Entry, DockerError> {
    use bollard::query_parameters::ContainerArchiveInfoOptionsBuilder;
    use bottle_core::agent_box::Entry;
    /// Go's `os.ModeDir`, as the daemon's stat header reports it.
    const GO_MODE_DIR: u32 = 1 << 31;
    let stat = engine.block_on(
        engine.docker.get_container_archive_info(
            container,
            Some(
                ContainerArchiveInfoOptionsBuilder::default()
                    .path(path)
                    .build(),
            ),
        ),
    );
    match stat {
        Ok(stat) if stat.file_mode & GO_MODE_DIR != 0 => return Ok(Entry::Dir),
        Ok(_) => {}
        Err(err) if crate::error::is_not_found(&err) => return Ok(Entry::Missing),
        // A dangling symlink may fail the stat; the download below tells.
        Err(_) => {}
    }
    let result = download_archive(engine, container, path);
    match result {
        Ok(archive) => crate::tarball::first_entry(&archive)
            .map_err(DockerError::io(format!("read {path} from"), container)),
        Err(err) if crate::error::is_not_found(&err) => Ok(Entry::Missing),
        Err(err) => Err(DockerError::api(format!("read {path} from {container}"))(
            err,
        )),
    }
}

/// Whether the directory `path` in the container holds any entry (a
/// missing one holds none).
pub fn container_dir_has_entries(
    engine: &Engine,
    container: &str,
    path: &str,
) -> Result<bool, DockerError> {
    match download_archive(engine, container, path) {
        Ok(archive) => crate::tarball::holds_entries_below_its_first(&archive)
            .map_err(DockerError::io(format!("list {path} in"), container)),
        Err(err) if crate::error::is_not_found(&err) => Ok(false),
        Err(err) => Err(DockerError::api(format!("list {path} in {container}"))(err)),
    }
}

/// The daemon's tar archive of `path` in the container.
fn download_archive(
    engine: &Engine,
    container: &str,
    path: &str,
) -> Result<Vec<u8>, bollard::errors::Error> {
    use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
    let options = DownloadFromContainerOptionsBuilder::default()
        .path(path)
        .build();
    engine.block_on(async {
        let mut stream = engine
            .docker
            .download_from_container(container, Some(options));
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            archive.extend_from_slice(&chunk?);
        }
        Ok(archive)
    })
}

/// Uploads an archive and extracts it at `/` in the container, keeping the
/// owners and modes in the archive.
pub fn upload(engine: &Engine, container: &str, archive: Vec<u8>) -> Result<(), DockerError> {
    let options = UploadToContainerOptionsBuilder::default().path("/");
    engine
        .block_on(engine.docker.upload_to_container(
            container,
            Some(options.build()),
            bollard::body_full(archive.into()),
        ))
        .map_err(DockerError::api(format!("copy files into {container}")))
}
