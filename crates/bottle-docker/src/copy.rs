//! `bottle cp` on a docker bottle, over the Engine's archive API.
//!
//! ## Into the box: checked and written with the container paused
//!
//! The Engine's `PUT /containers/{id}/archive` runs as root and resolves
//! its destination, and every name in the archive, with symbolic links
//! followed inside the container's rootfs (`containerExtractToDir` in
//! moby's `daemon/archive.go`: the path through `GetResourcePath`, i.e.
//! `FollowSymlinkInScope`, then `chrootarchive.UntarWithRoot`, whose
//! unpacking creates each entry through whatever link is on its way).
//! Docker's fix for CVE-2018-15664 (moby#39292, the chroot) keeps that
//! inside the container, which is where `/etc/bottle` is: an agent that
//! plants `~/drop -> /etc/bottle` would get the operator's file written as
//! root over `/etc/bottle/mcp.json`.
//!
//! So before the upload bottle walks the destination and everything the
//! archive would land on ([`bottle_core::copy::guest`]) with the archive
//! API's `stat` (which does not follow a final link), refusing any link on
//! the way, and does that walk and the upload **with the agent's container
//! paused**: the cgroup freezer stops every process in it (the agent's
//! execs included, they join its cgroup), so nothing can swap a directory
//! for a link between the check and the write. Nothing else can write the
//! agent's filesystem: no volume is mounted into it but its own
//! `/etc/resolv.conf` and bottle's `/.bottle`, both read-only, and the
//! bundle is another container.
//! Once the walk saw only directories, the daemon's own resolution of the
//! destination is the lexical path, and each entry is created under
//! directories that either were checked or were made by the archive
//! itself. The container is unpaused however the copy ends (an
//! already paused container is left paused, as found). Pausing is what
//! moby#39252 proposed for the daemon itself and set aside because of
//! volumes shared with other containers; an agent container shares none.
//!
//! Why not the other ways: extracting into a fresh directory and renaming
//! it into place needs a process in the box to rename without following
//! links, and an extraction run as the agent's user needs a `tar` in the
//! image; a docker bottle's image may have neither (no shell at all). The
//! microVM backend, which has no pause, does the latter.
//!
//! ## Out of the box
//!
//! `GET /containers/{id}/archive` streams the daemon's tar of the path;
//! the caller checks every entry before writing any.

use std::io::Write;
use std::path::Path;

use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, DownloadFromContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bottle_core::backend::BackendError;
use bottle_core::copy::{CopyError, CopyIn, GuestEntry, GuestPath, Owner, guest};
use futures_util::StreamExt;

use crate::archive::container_owner;
use crate::client::Engine;
use crate::error::{DockerError, is_not_found};

/// Go's `os.FileMode` bits, as the archive API's stat header reports them.
const GO_MODE_DIR: u32 = 1 << 31;
const GO_MODE_SYMLINK: u32 = 1 << 27;
const GO_MODE_DEVICE: u32 = 1 << 26;
const GO_MODE_NAMED_PIPE: u32 = 1 << 25;
const GO_MODE_SOCKET: u32 = 1 << 24;
const GO_MODE_CHAR_DEVICE: u32 = 1 << 21;
const GO_MODE_IRREGULAR: u32 = 1 << 19;

/// Copies `copy` into `container` at `dest` (see the module docs).
/// `state_dir` is the bottle's: its copy lock makes copies into one bottle
/// take turns, so no copy unpauses the container while another one walks.
pub fn copy_in(
    engine: &Engine,
    bottle: &str,
    container: &str,
    state_dir: &Path,
    copy: &CopyIn,
    dest: &GuestPath,
) -> Result<(), BackendError> {
    let owner = container_owner(engine, container)?;
    let owner = Owner {
        uid: owner.uid,
        gid: owner.gid,
    };
    let _turn = copy_lock(state_dir)?;
    let frozen = Frozen::pause(engine, bottle, container)?;
    let copied = copy_in_frozen(engine, bottle, container, copy, dest, owner);
    let thawed = frozen.thaw();
    copied?;
    Ok(thawed?)
}

/// Holds the bottle's copy lock (released when the file is closed): a
/// copy that found the container paused by another copy would otherwise
/// see it unpaused halfway through its own walk.
fn copy_lock(state_dir: &Path) -> Result<std::fs::File, DockerError> {
    crate::data::lock_file(&state_dir.join("copy.lock"))
}

fn copy_in_frozen(
    engine: &Engine,
    bottle: &str,
    container: &str,
    copy: &CopyIn,
    dest: &GuestPath,
    owner: Owner,
) -> Result<(), BackendError> {
    let stat = |path: &GuestPath| stat(engine, container, path);
    let found = guest::walk(bottle, dest, stat)??;
    let placement = guest::place(bottle, dest, found, copy)?;
    guest::check_existing(bottle, &placement, copy.entries(), stat)??;
    let archive = copy.archive_for(&placement, owner)?;
    let options = UploadToContainerOptionsBuilder::default()
        .path(&placement.dir.to_string())
        // Belt and braces: the check above already refused a directory
        // where a file goes, and the other way round.
        .no_overwrite_dir_non_dir("true")
        .build();
    engine
        .block_on(engine.docker.upload_to_container(
            container,
            Some(options),
            bollard::body_full(archive.into()),
        ))
        .map_err(DockerError::api(format!("copy files into {container}")))?;
    Ok(())
}

/// What is at `path` in the container, a final link not followed: the
/// archive API's stat, which resolves only the directories above it.
fn stat(engine: &Engine, container: &str, path: &GuestPath) -> Result<GuestEntry, DockerError> {
    let options = ContainerArchiveInfoOptionsBuilder::default()
        .path(&path.to_string())
        .build();
    match engine.block_on(
        engine
            .docker
            .get_container_archive_info(container, Some(options)),
    ) {
        Ok(stat) => Ok(entry_of(stat.file_mode)),
        Err(err) if is_not_found(&err) => Ok(GuestEntry::Missing),
        Err(err) => Err(DockerError::api(format!("look at {path} in {container}"))(
            err,
        )),
    }
}

/// A Go `os.FileMode` as what is there.
fn entry_of(mode: u32) -> GuestEntry {
    if mode & GO_MODE_SYMLINK != 0 {
        GuestEntry::Link
    } else if mode & GO_MODE_DIR != 0 {
        GuestEntry::Dir
    } else if mode
        & (GO_MODE_DEVICE
            | GO_MODE_NAMED_PIPE
            | GO_MODE_SOCKET
            | GO_MODE_CHAR_DEVICE
            | GO_MODE_IRREGULAR)
        != 0
    {
        GuestEntry::Other
    } else {
        GuestEntry::File
    }
}

/// Streams the daemon's archive of `path` in `container` to `out`.
pub fn copy_out(
    engine: &Engine,
    bottle: &str,
    container: &str,
    path: &GuestPath,
    out: &mut dyn Write,
) -> Result<(), BackendError> {
    let options = DownloadFromContainerOptionsBuilder::default()
        .path(&path.to_string())
        .build();
    let streamed: Result<(), BackendError> = engine.block_on(async {
        let mut stream = engine
            .docker
            .download_from_container(container, Some(options));
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(err) if is_not_found(&err) => {
                    return Err(CopyError::Missing {
                        bottle: bottle.to_string(),
                        path: path.to_string(),
                    }
                    .into());
                }
                Err(err) => {
                    return Err(
                        DockerError::api(format!("copy {path} out of {container}"))(err).into(),
                    );
                }
            };
            // A refused entry closes the reader: the write fails and the
            // download is dropped.
            out.write_all(&chunk)
                .map_err(DockerError::io("pass on the archive of", path.to_string()))?;
        }
        Ok(())
    });
    streamed
}

/// The agent's container paused for the length of a copy in.
struct Frozen<'a> {
    engine: &'a Engine,
    container: &'a str,
    /// Whether this copy paused it (and so unpauses it).
    paused_here: bool,
}

impl<'a> Frozen<'a> {
    fn pause(engine: &'a Engine, bottle: &str, container: &'a str) -> Result<Self, DockerError> {
        let inspect = engine
            .block_on(engine.docker.inspect_container(container, None))
            .map_err(DockerError::api(format!("inspect container {container}")))?;
        let state = inspect.state.unwrap_or_default();
        if state.paused == Some(true) {
            return Ok(Frozen {
                engine,
                container,
                paused_here: false,
            });
        }
        if state.running != Some(true) {
            return Err(DockerError::NotRunning {
                name: bottle.to_string(),
                state: state.status.map(|s| s.to_string()).unwrap_or_default(),
            });
        }
        engine
            .block_on(engine.docker.pause_container(container))
            .map_err(DockerError::api(format!("pause {container} for the copy")))?;
        Ok(Frozen {
            engine,
            container,
            paused_here: true,
        })
    }

    fn thaw(mut self) -> Result<(), DockerError> {
        self.unpause()
    }

    fn unpause(&mut self) -> Result<(), DockerError> {
        if !std::mem::take(&mut self.paused_here) {
            return Ok(());
        }
        self.engine
            .block_on(self.engine.docker.unpause_container(self.container))
            .map_err(DockerError::api(format!(
                "unpause {} after the copy",
                self.container
            )))
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        // A panic between pause and thaw must not leave the agent frozen.
        let _ = self.unpause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_file_modes_tell_links_from_directories() {
        assert_eq!(entry_of(GO_MODE_DIR | 0o755), GuestEntry::Dir);
        assert_eq!(entry_of(GO_MODE_SYMLINK | 0o777), GuestEntry::Link);
        assert_eq!(entry_of(0o644), GuestEntry::File);
        assert_eq!(entry_of(GO_MODE_NAMED_PIPE | 0o644), GuestEntry::Other);
        assert_eq!(
            entry_of(GO_MODE_DEVICE | GO_MODE_CHAR_DEVICE | 0o666),
            GuestEntry::Other
        );
    }
}
