//! Writing a state file so a reader never sees half of it: written aside,
//! renamed into place, and (for the records `cleanup` relies on after a
//! crash) flushed first. One definition for the bottle's record, the warm
//! pool's files and the backends' own state files.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Whether a write must survive a host crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Not flushed: after a crash the file may be the old one or missing,
    /// never half of either (a bottle whose host crashed is gone anyway).
    No,
    /// The file flushed before the rename and the directory after it:
    /// after a crash the file is the old one or the new one.
    FileAndDir,
}

/// A write that failed: what was being done, to which path, and why.
#[derive(Debug)]
pub struct WriteFailure {
    /// What was being done (`write`, `rename into place`, `sync`).
    pub action: &'static str,
    /// To which path.
    pub path: PathBuf,
    /// Why not.
    pub source: std::io::Error,
}

/// Writes `contents` to `path` (whose directory exists) with `mode`,
/// through `<path>.tmp` and a rename, flushed as `flush` says.
pub fn write_aside(
    path: &Path,
    contents: &[u8],
    mode: u32,
    flush: Flush,
) -> Result<(), WriteFailure> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let failed = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteFailure {
            action,
            path,
            source,
        }
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(failed("write", &tmp))?;
    // `mode` is masked by the umask at creation, and an old file keeps its
    // own: set it outright.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(failed("set the permissions of", &tmp))?;
    file.write_all(contents)
        .and_then(|()| match flush {
            Flush::No => Ok(()),
            Flush::FileAndDir => file.sync_all(),
        })
        .map_err(failed("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(failed("rename into place", path))?;
    if flush == Flush::FileAndDir
        && let Some(dir) = path.parent()
    {
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(failed("sync", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn the_file_is_whole_with_its_mode_and_nothing_is_left_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        for (contents, flush) in [(&b"first"[..], Flush::No), (b"second", Flush::FileAndDir)] {
            write_aside(&path, contents, 0o600, flush).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), contents);
            assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
    }

    #[test]
    fn a_missing_directory_is_named_in_the_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent").join("record.json");
        let failure = write_aside(&path, b"x", 0o600, Flush::No).unwrap_err();
        assert_eq!(failure.action, "write");
        assert_eq!(
            failure.path,
            dir.path().join("absent").join("record.json.tmp")
        );
    }
}
