//! The server's unix socket: owner-only from the moment it exists, never
//! taken from a server that still answers on it.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::failure::{EXIT_USAGE, Failure};

/// The socket's file name under the state root.
const DEFAULT_NAME: &str = "serve.sock";

/// `<state_root>/serve.sock`.
pub(crate) fn default_path(state_root: &Path) -> PathBuf {
    state_root.join(DEFAULT_NAME)
}

/// A bound socket, removed when dropped (if it is still ours).
pub(crate) struct BoundSocket {
    pub listener: UnixListener,
    path: PathBuf,
    inode: u64,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt as _;
        // Another server may have replaced a socket it found stale.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds `path`, owner-only: its directory is created `0700` when missing
/// and the socket made `0600`. (Between the bind and the chmod another user
/// could connect: the server also checks every peer's uid.) A socket a live
/// server answers on is refused; a stale one is replaced; anything else at
/// `path` is left alone and refused.
pub(crate) fn bind(path: &Path) -> Result<BoundSocket, Failure> {
    use std::os::unix::fs::MetadataExt as _;
    let failed = |what: &str, err: io::Error| {
        Failure::new(
            "BOT-C040",
            EXIT_USAGE,
            format!("cannot {what} {}: {err}", path.display()),
        )
        .with_fix("pass --socket with a path in a directory you own")
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|err| failed("create the directory of", err))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(Failure::new(
                    "BOT-C041",
                    EXIT_USAGE,
                    format!("a server already answers on {}", path.display()),
                )
                .with_fix("stop that `bottle serve`, or pass --socket with another path"));
            }
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .map_err(|err| failed("replace the stale socket", err))?;
            }
            Err(err) => return Err(failed("check the socket", err)),
        },
        Ok(_) => {
            return Err(failed(
                "use",
                io::Error::other("it exists and is not a socket"),
            ));
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(failed("check", err)),
    }
    let listener = UnixListener::bind(path).map_err(|err| failed("listen on", err))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|err| failed("make owner-only", err))?;
    let inode = std::fs::symlink_metadata(path)
        .map_err(|err| failed("check", err))?
        .ino();
    Ok(BoundSocket {
        listener,
        path: path.to_path_buf(),
        inode,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_socket_and_a_new_directory_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/serve.sock");
        let bound = bind(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("new")), 0o700);
        drop(bound);
        assert!(!path.exists(), "the socket is removed when the server ends");
    }

    #[test]
    fn a_live_server_is_refused_and_a_stale_socket_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.sock");
        let live = bind(&path).unwrap();
        let refused = bind(&path).err().unwrap();
        assert_eq!(refused.code, Some("BOT-C041"));
        // The refused attempt left the live server's socket in place.
        assert!(UnixStream::connect(&path).is_ok());
        drop(live);
        let stale = UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(path.exists(), "a listener dropped leaves its file behind");
        let replaced = bind(&path).unwrap();
        assert!(UnixStream::connect(&path).is_ok());
        drop(replaced);
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.sock");
        std::fs::write(&path, "keep me").unwrap();
        let err = bind(&path).err().unwrap();
        assert_eq!(err.code, Some("BOT-C040"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    }
}
