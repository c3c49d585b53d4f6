//! What `bottle cp` puts into a box: the entries of a host file or tree
//! (read without following its links), or of a tar on stdin after every
//! entry passed [`super::check`]; and the tar a backend extracts, with the
//! top entry named where it lands and every entry owned by the agent's
//! user. Times are the host's (or the archive's), modes lose their set-id
//! and sticky bits.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use super::check::{self, Checked, Shape, Sink};
use super::error::{ArchiveSource, CopyError, host_io};
use super::guest::Placement;
use crate::undo::Interrupt;

/// How a copy's entries are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopySource {
    /// One file or directory of this name and what is below it (`bottle
    /// cp PATH BOTTLE:DEST`): it lands in DEST under its name, or as DEST.
    Named(String),
    /// Entries extracted into DEST, which must be a directory (`bottle cp -
    /// BOTTLE:DIR`, `bottle cp DIR/. BOTTLE:DIR`).
    Contents,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// A hard link to a file earlier in the copy.
    HardLink,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    None,
    Data(Vec<u8>),
    /// A symbolic link's target, or a hard link's earlier entry.
    Link(Vec<u8>),
}

/// One entry of a copy into a box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveEntry {
    /// Its name: relative, `/`-separated, no `.`, `..` or empty component.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    mode: u32,
    mtime: u64,
    body: Body,
}

/// Who owns what a copy puts in a box: the agent's user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Numeric user ID.
    pub uid: u64,
    /// Numeric group ID.
    pub gid: u64,
}

/// A copy into a box, read whole before anything is written there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyIn {
    source: CopySource,
    entries: Vec<ArchiveEntry>,
}

impl CopyIn {
    /// The host file or tree at `path`, its links kept as links and never
    /// followed. `DIR/.` (or `.`) copies what is in `DIR`. Names must be
    /// UTF-8 (a path in a box is text to the backends); fifos, sockets and
    /// devices are refused.
    pub fn from_host(path: &Path) -> Result<CopyIn, CopyError> {
        let text = path.as_os_str().as_bytes();
        let contents = text == b"." || text.ends_with(b"/.");
        let meta = std::fs::symlink_metadata(path).map_err(host_io("read", path))?;
        let mut copy = CopyIn {
            source: CopySource::Contents,
            entries: Vec::new(),
        };
        if contents {
            if !meta.is_dir() {
                return Err(CopyError::HostSource {
                    path: path.to_path_buf(),
                    why: "only a directory's contents can be copied with `/.`".into(),
                });
            }
            copy.tree(path, "")?;
            return Ok(copy);
        }
        let name = match path.file_name().map(OsStr::to_str) {
            Some(Some(name)) => name.to_string(),
            Some(None) => return Err(not_utf8(path)),
            None => {
                return Err(CopyError::HostSource {
                    path: path.to_path_buf(),
                    why: "it has no name to copy under (name it, or write DIR/. for its contents)"
                        .into(),
                });
            }
        };
        copy.source = CopySource::Named(name.clone());
        copy.host_entry(path, &name, &meta)?;
        if meta.is_dir() {
            copy.tree(path, &name)?;
        }
        Ok(copy)
    }

    /// A tar archive on stdin, checked entry by entry ([`super::check`],
    /// [`Shape::Contents`]): its entries land in the destination directory.
    pub fn from_archive(
        archive: impl Read,
        limit: u64,
        interrupt: Option<&Interrupt>,
    ) -> Result<CopyIn, CopyError> {
        let mut collect = Collect {
            entries: Vec::new(),
        };
        check::check_archive(
            archive,
            &ArchiveSource::Stdin,
            Shape::Contents,
            limit,
            interrupt,
            &mut collect,
        )?;
        Ok(CopyIn {
            source: CopySource::Contents,
            entries: collect.entries,
        })
    }

    /// How the entries are laid out.
    pub fn source(&self) -> &CopySource {
        &self.source
    }

    /// The entries, each after the directories above it.
    pub fn entries(&self) -> &[ArchiveEntry] {
        &self.entries
    }

    /// Whether it is one directory (and what is in it).
    pub fn is_dir(&self) -> bool {
        matches!(self.source, CopySource::Named(_))
            && self
                .entries
                .first()
                .is_some_and(|e| e.kind == EntryKind::Dir)
    }

    /// The tar a backend extracts into `placement.dir`: the top entry
    /// renamed to `placement.top`, every entry owned by `owner`, with its
    /// mode and time.
    pub fn archive_for(&self, placement: &Placement, owner: Owner) -> Result<Vec<u8>, CopyError> {
        let rename = |path: &str| -> String {
            match &placement.top {
                None => path.to_string(),
                Some(top) => match path.split_once('/') {
                    Some((_, rest)) => format!("{top}/{rest}"),
                    None => top.clone(),
                },
            }
        };
        let mut builder = tar::Builder::new(Vec::new());
        let failed = |e: std::io::Error| CopyError::HostIo {
            action: "build the archive of",
            path: PathBuf::from(self.name()),
            source: e,
        };
        for entry in &self.entries {
            let name = rename(&entry.path);
            let mut header = tar::Header::new_gnu();
            header.set_uid(owner.uid);
            header.set_gid(owner.gid);
            header.set_mode(entry.mode);
            header.set_mtime(entry.mtime);
            match (&entry.kind, &entry.body) {
                (EntryKind::Dir, _) => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    builder
                        .append_data(&mut header, &name, std::io::empty())
                        .map_err(failed)?;
                }
                (EntryKind::File, Body::Data(data)) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    builder
                        .append_data(&mut header, &name, data.as_slice())
                        .map_err(failed)?;
                }
                (EntryKind::Symlink, Body::Link(target)) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    builder
                        .append_link(&mut header, &name, OsStr::from_bytes(target))
                        .map_err(failed)?;
                }
                (EntryKind::HardLink, Body::Link(target)) => {
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_size(0);
                    let target = rename(&String::from_utf8_lossy(target));
                    builder
                        .append_link(&mut header, &name, &target)
                        .map_err(failed)?;
                }
                _ => {}
            }
        }
        builder.into_inner().map_err(failed)
    }

    fn name(&self) -> &str {
        match &self.source {
            CopySource::Named(name) => name,
            CopySource::Contents => ".",
        }
    }

    /// Every entry below host directory `dir`, named under `prefix`,
    /// directories before what is in them, sorted for a stable archive.
    fn tree(&mut self, dir: &Path, prefix: &str) -> Result<(), CopyError> {
        let mut stack = vec![(dir.to_path_buf(), prefix.to_string())];
        while let Some((dir, prefix)) = stack.pop() {
            let mut children: Vec<_> = std::fs::read_dir(&dir)
                .map_err(host_io("list", &dir))?
                .collect::<Result<_, _>>()
                .map_err(host_io("list", &dir))?;
            children.sort_by_key(std::fs::DirEntry::file_name);
            let mut below = Vec::new();
            for child in children {
                let path = child.path();
                let Some(name) = child.file_name().to_str().map(str::to_string) else {
                    return Err(not_utf8(&path));
                };
                let name = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                let meta = std::fs::symlink_metadata(&path).map_err(host_io("read", &path))?;
                self.host_entry(&path, &name, &meta)?;
                if meta.is_dir() {
                    below.push((path, name));
                }
            }
            // Popped in order: the first directory's contents come first.
            stack.extend(below.into_iter().rev());
        }
        Ok(())
    }

    fn host_entry(
        &mut self,
        path: &Path,
        name: &str,
        meta: &std::fs::Metadata,
    ) -> Result<(), CopyError> {
        let mode = meta.permissions().mode() & 0o777;
        let mtime = u64::try_from(meta.mtime()).unwrap_or(0);
        let kind = meta.file_type();
        let (kind, body) = if kind.is_dir() {
            (EntryKind::Dir, Body::None)
        } else if kind.is_symlink() {
            let target = std::fs::read_link(path).map_err(host_io("read", path))?;
            (
                EntryKind::Symlink,
                Body::Link(target.as_os_str().as_bytes().to_vec()),
            )
        } else if kind.is_file() {
            let mut data = Vec::new();
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_end(&mut data))
                .map_err(host_io("read", path))?;
            (EntryKind::File, Body::Data(data))
        } else {
            return Err(CopyError::HostSource {
                path: path.to_path_buf(),
                why: "it is a fifo, socket or device node, which `bottle cp` does not copy".into(),
            });
        };
        self.entries.push(ArchiveEntry {
            path: name.to_string(),
            kind,
            mode,
            mtime,
            body,
        });
        Ok(())
    }

    /// A copy of `entries`, for tests of placement rules.
    #[cfg(test)]
    pub(crate) fn for_tests(source: CopySource, entries: Vec<(&str, EntryKind)>) -> CopyIn {
        CopyIn {
            source,
            entries: entries
                .into_iter()
                .map(|(path, kind)| ArchiveEntry {
                    path: path.to_string(),
                    kind,
                    mode: 0o644,
                    mtime: 0,
                    body: match kind {
                        EntryKind::File => Body::Data(Vec::new()),
                        EntryKind::Dir => Body::None,
                        _ => Body::Link(b"x".to_vec()),
                    },
                })
                .collect(),
        }
    }
}

fn not_utf8(path: &Path) -> CopyError {
    CopyError::HostSource {
        path: path.to_path_buf(),
        why: "its name is not UTF-8, which a path in a bottle must be".into(),
    }
}

/// Collects a checked archive's entries in memory, for a copy into a box.
struct Collect {
    entries: Vec<ArchiveEntry>,
}

impl Sink for Collect {
    fn entry(&mut self, entry: Checked<'_>) -> Result<(), CopyError> {
        let utf8 = |path: &check::EntryPath| {
            String::from_utf8(path.to_bytes()).map_err(|_| CopyError::Refused {
                from: ArchiveSource::Stdin,
                entry: path.lossy(),
                why: "a name that is not UTF-8, which a path in a bottle must be".into(),
            })
        };
        let entry = match entry {
            Checked::Dir { path, mode, mtime } => {
                let path = utf8(path)?;
                // A directory named again keeps its later mode and time.
                if let Some(earlier) = self.entries.iter_mut().find(|e| e.path == path) {
                    earlier.mode = mode;
                    earlier.mtime = mtime.unwrap_or(earlier.mtime);
                    return Ok(());
                }
                ArchiveEntry {
                    path,
                    kind: EntryKind::Dir,
                    mode,
                    mtime: mtime.unwrap_or(0),
                    body: Body::None,
                }
            }
            Checked::File {
                path,
                mode,
                mtime,
                size,
                data,
            } => {
                let mut bytes = Vec::with_capacity(usize::try_from(size.min(1 << 20)).unwrap_or(0));
                data.read_to_end(&mut bytes)
                    .map_err(|e| CopyError::Malformed {
                        from: ArchiveSource::Stdin,
                        detail: e.to_string(),
                    })?;
                ArchiveEntry {
                    path: utf8(path)?,
                    kind: EntryKind::File,
                    mode,
                    mtime,
                    body: Body::Data(bytes),
                }
            }
            Checked::Symlink {
                path,
                target,
                mtime,
            } => ArchiveEntry {
                path: utf8(path)?,
                kind: EntryKind::Symlink,
                mode: 0o777,
                mtime,
                body: Body::Link(target.to_vec()),
            },
            Checked::HardLink { path, target } => ArchiveEntry {
                path: utf8(path)?,
                kind: EntryKind::HardLink,
                mode: 0o644,
                mtime: 0,
                body: Body::Link(target.to_bytes()),
            },
        };
        self.entries.push(entry);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::copy::guest::GuestPath;

    fn listed(archive: &[u8]) -> Vec<(String, char, u32, u64, u64, String)> {
        let mut reader = tar::Archive::new(archive);
        reader
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let h = e.header().clone();
                let kind = match h.entry_type() {
                    tar::EntryType::Directory => 'd',
                    tar::EntryType::Symlink => 'l',
                    tar::EntryType::Link => 'h',
                    _ => 'f',
                };
                let mut data = String::new();
                if kind == 'f' {
                    e.read_to_string(&mut data).unwrap();
                }
                if kind == 'l' || kind == 'h' {
                    data = e.link_name().unwrap().unwrap().display().to_string();
                }
                (
                    e.path().unwrap().display().to_string(),
                    kind,
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                    data,
                )
            })
            .collect()
    }

    #[test]
    fn a_host_tree_keeps_its_times_and_links_and_lands_owned_by_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::fs::write(root.join("sub/a.md"), "a").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
        std::fs::File::options()
            .write(true)
            .open(root.join("sub/a.md"))
            .unwrap()
            .set_modified(when)
            .unwrap();

        let copy = CopyIn::from_host(&root).unwrap();
        assert_eq!(copy.source(), &CopySource::Named("proj".into()));
        assert!(copy.is_dir());
        let placement = Placement {
            dir: GuestPath::parse("/home/agent").unwrap(),
            top: Some("renamed".into()),
        };
        let owner = Owner {
            uid: 1000,
            gid: 1001,
        };
        let got = listed(&copy.archive_for(&placement, owner).unwrap());
        let names: Vec<_> = got.iter().map(|e| (e.0.as_str(), e.1)).collect();
        assert_eq!(
            names,
            [
                ("renamed", 'd'),
                ("renamed/link", 'l'),
                ("renamed/run.sh", 'f'),
                ("renamed/sub", 'd'),
                ("renamed/sub/a.md", 'f'),
            ]
        );
        assert!(got.iter().all(|e| e.3 == 1000));
        let run = &got[2];
        assert_eq!(run.2, 0o755, "set-id bits are dropped");
        assert_eq!(got[4].4, 1_600_000_000, "the host's time is kept");
        assert_eq!(got[1].5, "/etc/passwd", "the host's link is kept as it is");

        // Its contents, with `/.`.
        let contents = CopyIn::from_host(&root.join(".")).unwrap();
        assert_eq!(contents.source(), &CopySource::Contents);
        assert_eq!(contents.entries()[0].path, "link");
    }

    #[test]
    fn a_tar_on_stdin_is_checked_entry_by_entry() {
        let mut good = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(2);
        header.set_mode(0o6755);
        header.set_mtime(1_234_567_890);
        good.append_data(&mut header, "./dir/file", &b"hi"[..])
            .unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        good.append_link(&mut link, "dir/to-file", "file").unwrap();
        let good = good.into_inner().unwrap();
        let copy = CopyIn::from_archive(good.as_slice(), 1 << 20, None).unwrap();
        assert_eq!(copy.source(), &CopySource::Contents);
        let names: Vec<_> = copy
            .entries()
            .iter()
            .map(|e| (e.path.as_str(), e.kind))
            .collect();
        assert_eq!(
            names,
            [
                ("dir", EntryKind::Dir),
                ("dir/file", EntryKind::File),
                ("dir/to-file", EntryKind::Symlink),
            ]
        );
        assert_eq!(copy.entries()[1].mode, 0o755);
        assert_eq!(copy.entries()[1].mtime, 1_234_567_890);

        // A link to what bottle owns, then a file through it.
        let mut bad = tar::Builder::new(Vec::new());
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        bad.append_link(&mut link, "drop", "/etc/bottle").unwrap();
        let mut file = tar::Header::new_gnu();
        file.set_entry_type(tar::EntryType::Regular);
        file.set_size(2);
        bad.append_data(&mut file, "drop/mcp.json", &b"{}"[..])
            .unwrap();
        let bad = bad.into_inner().unwrap();
        let err = CopyIn::from_archive(bad.as_slice(), 1 << 20, None).unwrap_err();
        assert_eq!(crate::Coded::code(&err), "BOT-F010");
        assert!(err.to_string().contains("from stdin"), "{err}");
        assert_eq!(
            err.kind(),
            crate::backend::BackendErrorKind::NotFound,
            "the operator's own input is bad input"
        );
    }

    #[test]
    fn a_single_file_and_what_cannot_go_in() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, "hello").unwrap();
        let copy = CopyIn::from_host(&file).unwrap();
        assert!(!copy.is_dir());
        assert_eq!(copy.entries().len(), 1);

        let missing = CopyIn::from_host(&dir.path().join("nope")).unwrap_err();
        assert_eq!(crate::Coded::code(&missing), "BOT-F022");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = CopyIn::from_host(dir.path()).unwrap_err();
        assert_eq!(crate::Coded::code(&err), "BOT-F023");
        assert!(err.to_string().contains("fifo"), "{err}");
    }
}
