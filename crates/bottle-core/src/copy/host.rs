//! The host's side of a copy out of a box. What comes out is the box's
//! word, so it is checked entry by entry ([`super::check`]) and written
//! into a fresh directory bottle makes beside the destination (owner-only,
//! so nothing else of the operator's sees it half-made), with modes
//! masked and every file the invoking user's; only once the whole archive
//! passed is its top entry renamed into place. A refused archive leaves
//! nothing behind. [`Repack`] is the same walk writing a clean archive
//! instead (`bottle cp BOTTLE:PATH -`).

use std::ffi::{OsStr, OsString};
use std::fs::{DirBuilder, File, FileTimes, OpenOptions, Permissions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::check::{Checked, EntryPath, Shape, Sink, Summary, check_archive};
use super::error::{ArchiveSource, CopyError, host_io};
use crate::undo::Interrupt;

/// Where a copy out lands on the host, decided before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTarget {
    /// The directory it lands in (it exists).
    pub dir: PathBuf,
    /// The name it gets there.
    pub name: OsString,
}

impl HostTarget {
    /// `docker cp`'s rules for a host destination `dest` of the box's
    /// path named `source_name`: into an existing directory under that
    /// name; as `dest` where `dest` does not exist (its directory must);
    /// over an existing file (only by a file, checked at the rename).
    /// `dest`'s own links are the operator's and are followed.
    pub fn resolve(dest: &Path, source_name: &str) -> Result<HostTarget, CopyError> {
        let as_directory = dest.as_os_str().as_bytes().ends_with(b"/");
        match std::fs::metadata(dest) {
            Ok(meta) if meta.is_dir() => Ok(HostTarget {
                dir: dest.to_path_buf(),
                name: OsString::from(source_name),
            }),
            Ok(_) if as_directory => Err(CopyError::HostNoDirectory {
                path: dest.to_path_buf(),
            }),
            Ok(_) => Self::beside(dest),
            Err(err) if err.kind() == ErrorKind::NotFound => {
                if as_directory {
                    return Err(CopyError::HostNoDirectory {
                        path: dest.to_path_buf(),
                    });
                }
                Self::beside(dest)
            }
            Err(err) => Err(host_io("read", dest)(err)),
        }
    }

    /// `dest` itself, in its directory.
    fn beside(dest: &Path) -> Result<HostTarget, CopyError> {
        let no_dir = || CopyError::HostNoDirectory {
            path: dest.to_path_buf(),
        };
        let name = dest.file_name().ok_or_else(no_dir)?;
        let dir = match dest.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(HostTarget {
                dir,
                name: name.to_os_string(),
            }),
            Ok(_) => Err(CopyError::HostNoDirectory { path: dir }),
            Err(err) if err.kind() == ErrorKind::NotFound => {
                Err(CopyError::HostNoDirectory { path: dir })
            }
            Err(err) => Err(host_io("read", &dir)(err)),
        }
    }

    /// The path the copy ends up at.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

/// Writes the box's `archive` of one path into a fresh directory beside
/// `target`, checking every entry first ([`super::check`],
/// [`Shape::OneTop`]). Nothing is at `target` until [`Received::commit`],
/// which the caller runs once the box's side also said it succeeded;
/// dropped instead, it leaves nothing behind.
pub fn receive(
    archive: impl Read,
    from: &ArchiveSource,
    target: &HostTarget,
    limit: u64,
    interrupt: Option<&Interrupt>,
) -> Result<Received, CopyError> {
    let mut staging = Staging::new(target, from.clone())?;
    let summary = check_archive(archive, from, Shape::OneTop, limit, interrupt, &mut staging)?;
    Ok(Received {
        staging,
        summary,
        target: target.clone(),
    })
}

/// A copy out whose every entry passed, not yet in place.
#[derive(Debug)]
pub struct Received {
    staging: Staging,
    summary: Summary,
    target: HostTarget,
}

impl Received {
    /// Renames it into place ([`Staging::commit`]); returns where.
    pub fn commit(self) -> Result<PathBuf, CopyError> {
        self.staging.commit(&self.target, &self.summary)
    }

    /// What the walk saw.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }
}

/// The box's `archive` of one path, checked and written as a clean archive
/// (owned by `owner`) to an anonymous temporary file: nothing reaches the
/// caller's output until [`Repacked::write_to`], run once the whole
/// archive passed and the box's side said it succeeded.
pub fn repack(
    archive: impl Read,
    from: &ArchiveSource,
    limit: u64,
    interrupt: Option<&Interrupt>,
    owner: (u64, u64),
) -> Result<Repacked, CopyError> {
    let spool = tempfile::tempfile().map_err(host_io("create", &std::env::temp_dir()))?;
    let mut repack = Repack::new(spool, from.clone(), owner);
    check_archive(archive, from, Shape::OneTop, limit, interrupt, &mut repack)?;
    Ok(Repacked {
        spool: repack.finish()?,
    })
}

/// A checked, clean archive waiting to be written out.
#[derive(Debug)]
pub struct Repacked {
    spool: File,
}

impl Repacked {
    /// Writes the archive to `out` (stdout).
    pub fn write_to(mut self, out: &mut dyn Write) -> Result<(), CopyError> {
        let temp = std::env::temp_dir();
        std::io::Seek::rewind(&mut self.spool).map_err(host_io("read", &temp))?;
        std::io::copy(&mut self.spool, out).map_err(host_io("write", Path::new("stdout")))?;
        out.flush().map_err(host_io("write", Path::new("stdout")))
    }
}

/// A file's mode on the host: the box's owner bits and read-write for the
/// owner, group and others at most read and execute; no set-id or sticky.
pub fn host_file_mode(mode: u32) -> u32 {
    (mode & 0o755) | 0o600
}

/// A directory's mode on the host: as a file's, and always the owner's to
/// enter and change.
pub fn host_dir_mode(mode: u32) -> u32 {
    (mode & 0o755) | 0o700
}

/// A copy out being written: a fresh directory beside its destination,
/// removed (with what is in it) unless [`Staging::commit`] renamed its
/// top entry into place.
#[derive(Debug)]
pub struct Staging {
    root: PathBuf,
    from: ArchiveSource,
    /// Directories' final modes and times, set once everything is in them.
    dirs: Vec<(PathBuf, u32, Option<u64>)>,
    done: bool,
}

impl Staging {
    /// Makes the fresh directory in `target.dir`, owner-only.
    pub fn new(target: &HostTarget, from: ArchiveSource) -> Result<Staging, CopyError> {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..100u32 {
            let root = target.dir.join(format!(
                ".bottle-cp-{}-{stamp:x}-{attempt}",
                std::process::id()
            ));
            match DirBuilder::new().mode(0o700).create(&root) {
                Ok(()) => {
                    return Ok(Staging {
                        root,
                        from,
                        dirs: Vec::new(),
                        done: false,
                    });
                }
                Err(err) if err.kind() == ErrorKind::AlreadyExists => {}
                Err(err) => return Err(host_io("create a directory in", &target.dir)(err)),
            }
        }
        Err(host_io("create a directory in", &target.dir)(
            std::io::Error::from(ErrorKind::AlreadyExists),
        ))
    }

    /// The fresh directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `path` goes: below the fresh directory, built from checked
    /// components only, every directory above it made by this copy.
    fn at(&self, path: &EntryPath) -> PathBuf {
        let mut out = self.root.clone();
        for part in path.components() {
            out.push(OsStr::from_bytes(part));
        }
        out
    }

    /// Renames the top entry to `target` once every entry passed: over an
    /// existing file only when the copy is a file too, never over a
    /// directory or onto anything when the copy is a directory.
    pub fn commit(mut self, target: &HostTarget, summary: &Summary) -> Result<PathBuf, CopyError> {
        let Some(top) = &summary.top else {
            return Err(CopyError::Malformed {
                from: self.from.clone(),
                detail: "it holds no entry".into(),
            });
        };
        self.finish_dirs()?;
        let staged = self.root.join(OsStr::from_bytes(top));
        let dest = target.path();
        match std::fs::symlink_metadata(&dest) {
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Ok(meta) if !summary.top_is_dir && !meta.is_dir() => {}
            Ok(_) => return Err(CopyError::HostExists { path: dest }),
            Err(err) => return Err(host_io("read", &dest)(err)),
        }
        std::fs::rename(&staged, &dest).map_err(host_io("move the copy to", &dest))?;
        std::fs::remove_dir(&self.root).map_err(host_io("remove", &self.root))?;
        self.done = true;
        Ok(dest)
    }

    /// Sets every directory's mode and time, deepest first (writing into a
    /// directory changes its time).
    fn finish_dirs(&mut self) -> Result<(), CopyError> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|(path, _, _)| std::cmp::Reverse(path.components().count()));
        for (path, mode, mtime) in &dirs {
            std::fs::set_permissions(path, Permissions::from_mode(host_dir_mode(*mode)))
                .map_err(host_io("set the mode of", path))?;
            if let Some(mtime) = mtime {
                File::open(path)
                    .and_then(|dir| dir.set_times(times(*mtime)))
                    .map_err(host_io("set the time of", path))?;
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            // Best effort: every directory in it is still owner-writable.
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn times(mtime: u64) -> FileTimes {
    let when = UNIX_EPOCH
        .checked_add(Duration::from_secs(mtime))
        .unwrap_or(UNIX_EPOCH);
    FileTimes::new().set_modified(when).set_accessed(when)
}

impl Sink for Staging {
    fn entry(&mut self, entry: Checked<'_>) -> Result<(), CopyError> {
        match entry {
            Checked::Dir { path, mode, mtime } => {
                let at = self.at(path);
                match DirBuilder::new().mode(0o700).create(&at) {
                    Ok(()) => {}
                    // Named again: only a directory this copy made under
                    // exactly that name. On a host filesystem that folds
                    // case or normalises Unicode (APFS, vfat, ext4 with
                    // casefold) another name can land on the same file,
                    // a link the archive made among them: the check above
                    // compares names byte for byte, so the filesystem must
                    // not be left to decide that two names are one.
                    Err(err)
                        if err.kind() == ErrorKind::AlreadyExists
                            && self.dirs.iter().any(|(p, _, _)| *p == at) =>
                    {
                        self.dirs.retain(|(p, _, _)| *p != at);
                    }
                    Err(err) if err.kind() == ErrorKind::AlreadyExists => {
                        return Err(CopyError::Refused {
                            from: self.from.clone(),
                            entry: path.lossy(),
                            why: "its name is another entry's on this host's filesystem \
                                  (one that folds case or normalises Unicode)"
                                .into(),
                        });
                    }
                    Err(err) => return Err(host_io("create", &at)(err)),
                }
                self.dirs.push((at, mode, mtime));
            }
            Checked::File {
                path,
                mode,
                mtime,
                data,
                ..
            } => {
                let at = self.at(path);
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                    .open(&at)
                    .map_err(host_io("create", &at))?;
                copy_data(data, &mut file, &self.from, &at)?;
                file.set_permissions(Permissions::from_mode(host_file_mode(mode)))
                    .map_err(host_io("set the mode of", &at))?;
                file.set_times(times(mtime))
                    .map_err(host_io("set the time of", &at))?;
            }
            Checked::Symlink { path, target, .. } => {
                let at = self.at(path);
                std::os::unix::fs::symlink(OsStr::from_bytes(target), &at)
                    .map_err(host_io("create the link", &at))?;
            }
            Checked::HardLink { path, target } => {
                let at = self.at(path);
                let earlier = self.at(target);
                std::fs::hard_link(&earlier, &at).map_err(host_io("create the link", &at))?;
            }
        }
        Ok(())
    }
}

/// Copies an entry's data, telling a failed read (the archive) from a
/// failed write (the host).
fn copy_data(
    data: &mut dyn Read,
    out: &mut dyn Write,
    from: &ArchiveSource,
    at: &Path,
) -> Result<(), CopyError> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match data.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => {
                return Err(CopyError::Malformed {
                    from: from.clone(),
                    detail: err.to_string(),
                });
            }
        };
        out.write_all(&buf[..n]).map_err(host_io("write", at))?;
    }
}

/// Writes the checked entries as a new tar archive: names normalised,
/// modes masked as on the host, owned by `owner`, links as they passed.
pub struct Repack<W: Write> {
    builder: tar::Builder<W>,
    from: ArchiveSource,
    owner: (u64, u64),
}

impl<W: Write> Repack<W> {
    /// A new archive written to `out`, every entry owned by `owner`.
    pub fn new(out: W, from: ArchiveSource, owner: (u64, u64)) -> Repack<W> {
        Repack {
            builder: tar::Builder::new(out),
            from,
            owner,
        }
    }

    /// Ends the archive and returns where it was written.
    pub fn finish(self) -> Result<W, CopyError> {
        self.builder
            .into_inner()
            .map_err(host_io("write", Path::new("the archive")))
    }

    fn header(&self, kind: tar::EntryType, mode: u32, mtime: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_mtime(mtime);
        header.set_uid(self.owner.0);
        header.set_gid(self.owner.1);
        header.set_size(0);
        header
    }
}

impl<W: Write> Sink for Repack<W> {
    fn entry(&mut self, entry: Checked<'_>) -> Result<(), CopyError> {
        let failed = host_io("write", Path::new("the archive"));
        match entry {
            Checked::Dir { path, mode, mtime } => {
                let mut header = self.header(
                    tar::EntryType::Directory,
                    host_dir_mode(mode),
                    mtime.unwrap_or(0),
                );
                let name = OsStr::from_bytes(&path.to_bytes()).to_os_string();
                self.builder
                    .append_data(&mut header, name, std::io::empty())
                    .map_err(failed)
            }
            Checked::File {
                path,
                mode,
                mtime,
                size,
                data,
            } => {
                let mut header = self.header(tar::EntryType::Regular, host_file_mode(mode), mtime);
                header.set_size(size);
                let name = OsStr::from_bytes(&path.to_bytes()).to_os_string();
                // The tar crate's builder reads exactly `size` bytes; a
                // short read is the archive's fault.
                let from = self.from.clone();
                let mut reader = ReadFailures {
                    inner: data,
                    failed: None,
                };
                let written = self.builder.append_data(&mut header, name, &mut reader);
                match (written, reader.failed) {
                    (_, Some(detail)) => Err(CopyError::Malformed { from, detail }),
                    (Err(err), None) => Err(failed(err)),
                    (Ok(()), None) => Ok(()),
                }
            }
            Checked::Symlink {
                path,
                target,
                mtime,
            } => {
                let mut header = self.header(tar::EntryType::Symlink, 0o777, mtime);
                let name = OsStr::from_bytes(&path.to_bytes()).to_os_string();
                self.builder
                    .append_link(&mut header, name, OsStr::from_bytes(target))
                    .map_err(failed)
            }
            Checked::HardLink { path, target } => {
                let mut header = self.header(tar::EntryType::Link, 0o644, 0);
                let name = OsStr::from_bytes(&path.to_bytes()).to_os_string();
                let target = OsStr::from_bytes(&target.to_bytes()).to_os_string();
                self.builder
                    .append_link(&mut header, name, target)
                    .map_err(failed)
            }
        }
    }
}

/// Remembers a read error, so a failed read is told from a failed write.
struct ReadFailures<'a> {
    inner: &'a mut dyn Read,
    failed: Option<String>,
}

impl Read for ReadFailures<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|err| {
            self.failed = Some(err.to_string());
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;
    use crate::Coded as _;

    /// A hand-made archive: entries written header by header, so names
    /// the `tar` crate's builder refuses (absolute, `..`) can be made.
    #[derive(Default)]
    struct Hostile {
        out: Vec<u8>,
    }

    impl Hostile {
        fn raw(&mut self, kind: tar::EntryType, name: &str, link: &str, mode: u32, data: &[u8]) {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            let gnu = header.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
            header.set_mode(mode);
            header.set_size(data.len() as u64);
            header.set_mtime(1_500_000_000);
            header.set_cksum();
            self.out.extend_from_slice(header.as_bytes());
            self.out.extend_from_slice(data);
            let pad = (512 - data.len() % 512) % 512;
            self.out.extend(std::iter::repeat_n(0u8, pad));
        }
        fn dir(mut self, name: &str) -> Self {
            self.raw(tar::EntryType::Directory, name, "", 0o755, b"");
            self
        }
        fn file(mut self, name: &str, data: &str) -> Self {
            self.raw(tar::EntryType::Regular, name, "", 0o644, data.as_bytes());
            self
        }
        fn mode(mut self, name: &str, mode: u32) -> Self {
            self.raw(tar::EntryType::Regular, name, "", mode, b"#!/bin/sh\n");
            self
        }
        fn symlink(mut self, name: &str, target: &str) -> Self {
            self.raw(tar::EntryType::Symlink, name, target, 0o777, b"");
            self
        }
        fn hardlink(mut self, name: &str, target: &str) -> Self {
            self.raw(tar::EntryType::Link, name, target, 0o644, b"");
            self
        }
        fn special(mut self, kind: tar::EntryType, name: &str) -> Self {
            self.raw(kind, name, "", 0o644, b"");
            self
        }
        fn done(mut self) -> Vec<u8> {
            self.out.extend(std::iter::repeat_n(0u8, 1024));
            self.out
        }
    }

    fn bottle() -> ArchiveSource {
        ArchiveSource::Bottle("bot-bottle-b".into())
    }

    /// Extracts into a fresh directory holding one file of the operator's;
    /// returns the result and what the directory holds afterwards.
    fn extract(archive: &[u8], limit: u64) -> (Result<PathBuf, CopyError>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine"), "operator").unwrap();
        let target = HostTarget::resolve(dir.path(), "top").unwrap();
        let result = receive(archive, &bottle(), &target, limit, None).and_then(Received::commit);
        (result, dir)
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.clone());
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                out.extend(walk(&path));
            }
        }
        out
    }

    /// The archive is refused with `code`, its reason saying `why`, and
    /// the destination holds only what it held before.
    fn refused(archive: &[u8], code: &str, why: &str) {
        let (result, dir) = extract(archive, 1 << 20);
        let err = result.unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(listing(dir.path()), ["mine"], "{err}");
        assert_eq!(std::fs::read(dir.path().join("mine")).unwrap(), b"operator");
    }

    #[test]
    fn a_directory_the_host_holds_under_a_name_this_copy_did_not_make_is_refused() {
        // On a filesystem that folds case, `top/a` after the link `top/A`
        // is the link; the check, comparing bytes, saw two names. Here the
        // link's own name is given to the sink again, past the check: the
        // sink must not take the filesystem's word that it is a directory.
        let dir = tempfile::tempdir().unwrap();
        let target = HostTarget::resolve(dir.path(), "top").unwrap();
        let mut staging = Staging::new(&target, bottle()).unwrap();
        let top = EntryPath::of(&["top"]);
        let link = EntryPath::of(&["top", "A"]);
        let dir_entry = |path| Checked::Dir {
            path,
            mode: 0o755,
            mtime: None,
        };
        staging.entry(dir_entry(&top)).unwrap();
        staging
            .entry(Checked::Symlink {
                path: &link,
                target: b".",
                mtime: 0,
            })
            .unwrap();
        let err = staging.entry(dir_entry(&link)).unwrap_err();
        assert_eq!(err.code(), "BOT-F010", "{err}");
        assert!(err.to_string().contains("folds case"), "{err}");
        // A directory this copy made may be named again.
        staging.entry(dir_entry(&top)).unwrap();
    }

    #[test]
    fn a_name_longer_than_a_host_path_is_refused() {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_size(1);
        let name = format!("top/{}f", "a/".repeat(2100));
        builder.append_data(&mut header, &name, &b"x"[..]).unwrap();
        refused(
            &builder.into_inner().unwrap(),
            "BOT-F010",
            "longer than 4096 bytes",
        );
    }

    #[test]
    fn absolute_names_are_refused() {
        refused(
            &Hostile::default().file("/tmp/evil", "x").done(),
            "BOT-F010",
            "an absolute name",
        );
    }

    #[test]
    fn dot_dot_names_are_refused() {
        refused(
            &Hostile::default()
                .dir("top")
                .file("top/../../evil", "x")
                .done(),
            "BOT-F010",
            "`..`",
        );
        refused(
            &Hostile::default().file("../evil", "x").done(),
            "BOT-F010",
            "`..`",
        );
    }

    #[test]
    fn a_link_out_then_a_file_through_it_is_refused() {
        // Out by an absolute target, then by climbing.
        refused(
            &Hostile::default()
                .dir("top")
                .symlink("top/out", "/etc")
                .file("top/out/passwd", "x")
                .done(),
            "BOT-F010",
            "absolute path",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .symlink("top/out", "../../../../etc")
                .done(),
            "BOT-F010",
            "points outside the copy",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .dir("top/a")
                .symlink("top/a/out", "../../x")
                .done(),
            "BOT-F010",
            "points outside the copy",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .symlink("top/out", "sub/../../x")
                .done(),
            "BOT-F010",
            "climbs after descending",
        );
        // A link that stays inside, then a file through it.
        refused(
            &Hostile::default()
                .dir("top")
                .dir("top/sub")
                .symlink("top/in", "sub")
                .file("top/in/x", "x")
                .done(),
            "BOT-F010",
            "beneath \"top/in\", a link",
        );
        // The copy itself a link.
        refused(
            &Hostile::default().symlink("top", "whatever").done(),
            "BOT-F010",
            "is itself a link",
        );
    }

    #[test]
    fn hard_links_outside_the_archive_are_refused() {
        refused(
            &Hostile::default()
                .dir("top")
                .hardlink("top/passwd", "/etc/passwd")
                .done(),
            "BOT-F010",
            "hard link",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .hardlink("top/passwd", "etc/passwd")
                .done(),
            "BOT-F010",
            "not a file earlier in the archive",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .hardlink("top/up", "../outside")
                .done(),
            "BOT-F010",
            "hard link",
        );
    }

    #[test]
    fn devices_and_fifos_are_refused() {
        refused(
            &Hostile::default()
                .dir("top")
                .special(tar::EntryType::Char, "top/null")
                .done(),
            "BOT-F010",
            "device",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .special(tar::EntryType::Block, "top/sda")
                .done(),
            "BOT-F010",
            "device",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .special(tar::EntryType::Fifo, "top/pipe")
                .done(),
            "BOT-F010",
            "fifo",
        );
    }

    #[test]
    fn a_second_top_entry_or_a_name_made_twice_is_refused() {
        refused(
            &Hostile::default().dir("top").file("other", "x").done(),
            "BOT-F010",
            "second top-level entry",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .file("top/f", "a")
                .symlink("top/f", "g")
                .done(),
            "BOT-F010",
            "already made",
        );
        refused(
            &Hostile::default()
                .dir("top")
                .file("top/f", "a")
                .file("top/f/g", "b")
                .done(),
            "BOT-F010",
            "a file the archive made",
        );
    }

    #[test]
    fn an_archive_over_the_bound_is_refused_and_leaves_nothing() {
        let big = "x".repeat(8192);
        let archive = Hostile::default().dir("top").file("top/big", &big).done();
        let (result, dir) = extract(&archive, 4096);
        let err = result.unwrap_err();
        assert_eq!(err.code(), "BOT-F011", "{err}");
        assert!(err.to_string().contains("larger than 4096 bytes"), "{err}");
        assert_eq!(listing(dir.path()), ["mine"]);
        // Within the bound, the same archive lands.
        let (result, _dir) = extract(&archive, 1 << 20);
        result.unwrap();
    }

    #[test]
    fn set_id_bits_are_dropped_and_modes_masked() {
        let archive = Hostile::default()
            .dir("top")
            .mode("top/suid", 0o4755)
            .mode("top/sgid", 0o2777)
            .mode("top/secret", 0o400)
            .done();
        let (result, dir) = extract(&archive, 1 << 20);
        let top = result.unwrap();
        assert_eq!(top, dir.path().join("top"));
        let mode = |name: &str| std::fs::metadata(top.join(name)).unwrap().mode() & 0o7777;
        assert_eq!(mode("suid"), 0o755);
        assert_eq!(mode("sgid"), 0o755);
        assert_eq!(mode("secret"), 0o600);
        assert_eq!(
            std::fs::metadata(top.join("suid")).unwrap().uid(),
            nix::unistd::getuid().as_raw(),
            "files are the invoking user's"
        );
    }

    #[test]
    fn a_tree_lands_whole_with_its_times_and_inner_links() {
        let archive = Hostile::default()
            .dir("top")
            .dir("top/sub")
            .file("top/sub/a.txt", "alpha")
            .symlink("top/sub/to-a", "a.txt")
            .symlink("top/sub/up", "../b.txt")
            .file("top/b.txt", "beta")
            .hardlink("top/sub/again", "top/sub/a.txt")
            // Implicit directories.
            .file("top/deep/er/c.txt", "gamma")
            .done();
        let (result, dir) = extract(&archive, 1 << 20);
        let top = result.unwrap();
        assert_eq!(
            listing(dir.path()),
            [
                "mine",
                "top",
                "top/b.txt",
                "top/deep",
                "top/deep/er",
                "top/deep/er/c.txt",
                "top/sub",
                "top/sub/a.txt",
                "top/sub/again",
                "top/sub/to-a",
                "top/sub/up",
            ]
        );
        assert_eq!(
            std::fs::read_to_string(top.join("sub/to-a")).unwrap(),
            "alpha"
        );
        assert_eq!(std::fs::read_to_string(top.join("sub/up")).unwrap(), "beta");
        let a = std::fs::metadata(top.join("sub/a.txt")).unwrap();
        assert_eq!(
            a.ino(),
            std::fs::metadata(top.join("sub/again")).unwrap().ino()
        );
        assert_eq!(a.mtime(), 1_500_000_000);
        assert_eq!(
            std::fs::metadata(top.join("sub")).unwrap().mtime(),
            1_500_000_000
        );
    }

    #[test]
    fn the_copy_never_lands_on_what_is_there_but_a_file_on_a_file() {
        let tree = Hostile::default().dir("top").file("top/x", "new").done();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("top")).unwrap();
        let target = HostTarget::resolve(dir.path(), "top").unwrap();
        let err = receive(tree.as_slice(), &bottle(), &target, 1 << 20, None)
            .and_then(Received::commit)
            .unwrap_err();
        assert_eq!(err.code(), "BOT-F020");
        assert_eq!(listing(dir.path()), ["top"]);

        // A file over a file: replaced.
        let file = Hostile::default().file("top", "new").done();
        let dest = dir.path().join("kept.txt");
        std::fs::write(&dest, "old").unwrap();
        let target = HostTarget::resolve(&dest, "top").unwrap();
        assert_eq!(target.path(), dest);
        receive(file.as_slice(), &bottle(), &target, 1 << 20, None)
            .and_then(Received::commit)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "new");

        // As a new name in an existing directory.
        let target = HostTarget::resolve(&dir.path().join("fresh"), "top").unwrap();
        receive(tree.as_slice(), &bottle(), &target, 1 << 20, None)
            .and_then(Received::commit)
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("fresh/x")).unwrap(),
            "new"
        );
        // No directory to land in.
        assert_eq!(
            HostTarget::resolve(&dir.path().join("no/such"), "top")
                .unwrap_err()
                .code(),
            "BOT-F021"
        );
        assert_eq!(
            HostTarget::resolve(&dir.path().join("nothing/"), "top")
                .unwrap_err()
                .code(),
            "BOT-F021"
        );
    }

    #[test]
    fn garbage_and_empty_archives_are_refused() {
        let (result, dir) = extract(&[7u8; 1024], 1 << 20);
        assert_eq!(result.unwrap_err().code(), "BOT-F012");
        assert_eq!(listing(dir.path()), ["mine"]);
        let (result, dir) = extract(&[0u8; 1024], 1 << 20);
        assert_eq!(result.unwrap_err().code(), "BOT-F012");
        assert_eq!(listing(dir.path()), ["mine"]);
    }

    #[test]
    fn the_repacked_stream_is_the_checked_archive() {
        let archive = Hostile::default()
            .dir("top")
            .mode("top/suid", 0o4755)
            .symlink("top/in", "suid")
            .done();
        let mut out = Vec::new();
        repack(archive.as_slice(), &bottle(), 1 << 20, None, (1000, 1000))
            .and_then(|r| r.write_to(&mut out))
            .unwrap();
        let mut reader = tar::Archive::new(out.as_slice());
        let got: Vec<(String, u32, u64)> = reader
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mode().unwrap(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("top".to_string(), 0o755, 1000),
                ("top/suid".to_string(), 0o755, 1000),
                ("top/in".to_string(), 0o777, 1000),
            ]
        );
        let mut out = Vec::new();
        let hostile = Hostile::default()
            .dir("top")
            .symlink("top/x", "/etc")
            .done();
        let err = repack(hostile.as_slice(), &bottle(), 1 << 20, None, (0, 0))
            .and_then(|r| r.write_to(&mut out))
            .unwrap_err();
        assert_eq!(err.code(), "BOT-F010");
        assert!(
            out.is_empty(),
            "nothing reaches stdout before the whole archive passed"
        );
    }
}
