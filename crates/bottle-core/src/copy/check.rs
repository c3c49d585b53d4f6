//! The rules every tar archive `bottle cp` reads from outside bottle is
//! held to, entry by entry, before a byte of it is written anywhere: the
//! archive of a box's path (the box's word, hostile) and a tar the
//! operator pipes in (`bottle cp - BOTTLE:DIR`).
//!
//! The `tar` crate only parses; its `unpack` is never used, since its
//! defaults (absolute links kept, set-id bits, entries below a link the
//! archive made) are not ours. An entry passes when:
//!
//! - its name is relative and has no `..` (`.` and empty components are
//!   dropped);
//! - it is a regular file, a directory, a symbolic link or a hard link:
//!   device nodes, fifos, sparse files and every other type are refused;
//! - nothing the archive made earlier on its way is a file or a link (a
//!   link followed by a file "through" it is refused), and it does not
//!   name what the archive already made (two directories aside);
//! - a symbolic link's target is relative, climbs (`..`) only at its start
//!   and no higher than the copied tree's top, then only descends: each
//!   link then resolves inside the tree, and so does a chain of them,
//!   since every step of a chain is such a link. The copy's top itself may
//!   not be a link (its target could only be outside it);
//! - a hard link names a regular file earlier in the same archive;
//! - and the archive's bytes stay within the size bound.
//!
//! Set-id and sticky bits are dropped from every mode; what else a
//! destination masks is its own ([`super::host`]).

use std::collections::HashMap;
use std::io::Read;

use tar::EntryType;

use super::error::{ArchiveSource, CopyError};
use crate::undo::Interrupt;

/// How the archive is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One top entry and what is below it: the archive of one path in a
    /// box. Links may not leave that top entry.
    OneTop,
    /// Entries relative to the destination directory: a tar on stdin.
    /// Links may not leave that directory.
    Contents,
}

/// The longest entry name taken: Linux's `PATH_MAX`. A longer one could
/// not be written on the host anyway, and the bound keeps the checks'
/// work per entry small.
const NAME_MAX_BYTES: usize = 4096;

/// A checked entry's name: its components, none empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryPath(Vec<Vec<u8>>);

impl EntryPath {
    /// The components.
    pub fn components(&self) -> &[Vec<u8>] {
        &self.0
    }

    /// The components joined with `/`.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.join(&b'/')
    }

    /// For messages only (quote it with `{:?}`).
    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(&self.to_bytes()).into_owned()
    }

    /// A name made by a test, past the check.
    #[cfg(test)]
    pub(super) fn of(parts: &[&str]) -> EntryPath {
        EntryPath(parts.iter().map(|p| p.as_bytes().to_vec()).collect())
    }
}

/// One entry that passed, as a sink gets it.
pub enum Checked<'a> {
    /// A directory; `implicit` when the archive named only what is in it.
    Dir {
        /// Its name.
        path: &'a EntryPath,
        /// Permission bits (`0o777` at most).
        mode: u32,
        /// Modification time, seconds since the epoch (`None`: implicit).
        mtime: Option<u64>,
    },
    /// A regular file and its data.
    File {
        /// Its name.
        path: &'a EntryPath,
        /// Permission bits (`0o777` at most).
        mode: u32,
        /// Modification time, seconds since the epoch.
        mtime: u64,
        /// Its size.
        size: u64,
        /// Its data (`size` bytes).
        data: &'a mut dyn Read,
    },
    /// A symbolic link whose target stays inside the copy.
    Symlink {
        /// Its name.
        path: &'a EntryPath,
        /// Its target, normalised: `../` steps, then names.
        target: &'a [u8],
        /// Modification time, seconds since the epoch.
        mtime: u64,
    },
    /// A hard link to a regular file earlier in the archive.
    HardLink {
        /// Its name.
        path: &'a EntryPath,
        /// The earlier file.
        target: &'a EntryPath,
    },
}

/// Where checked entries go: a directory on the host, or a new archive.
pub trait Sink {
    /// Takes one checked entry. An error stops the walk.
    fn entry(&mut self, entry: Checked<'_>) -> Result<(), CopyError>;
}

/// What the walk saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The archive's top entry's name ([`Shape::OneTop`]).
    pub top: Option<Vec<u8>>,
    /// Whether that top entry is a directory.
    pub top_is_dir: bool,
    /// Entries handed to the sink (implicit directories included).
    pub entries: usize,
    /// Bytes of the archive read.
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Dir,
    File,
    Link,
}

/// Reads `archive` through the rules above, handing each entry to `sink`.
/// `limit` bounds the archive's bytes; `interrupt` is checked between
/// entries.
pub fn check_archive(
    archive: impl Read,
    from: &ArchiveSource,
    shape: Shape,
    limit: u64,
    interrupt: Option<&Interrupt>,
    sink: &mut dyn Sink,
) -> Result<Summary, CopyError> {
    let counter = Bounded::new(archive, limit);
    let mut reader = tar::Archive::new(counter);
    let mut walk = Walk {
        from,
        shape,
        seen: HashMap::new(),
        summary: Summary::default(),
    };
    let result = walk.run(&mut reader, interrupt, sink);
    let mut counter = reader.into_inner();
    // What follows the archive's end (a writer's padding) is read too, so
    // the writer on the other end of a pipe can finish; it counts.
    let result = result.and_then(|()| {
        std::io::copy(&mut counter, &mut std::io::sink())
            .map(drop)
            .map_err(|e| walk.malformed(&e))
    });
    walk.summary.bytes = counter.read;
    match result {
        Err(_) if counter.exceeded => Err(CopyError::TooLarge {
            from: from.clone(),
            limit,
        }),
        Err(err) => Err(err),
        Ok(()) => Ok(walk.summary),
    }
}

struct Walk<'s> {
    from: &'s ArchiveSource,
    shape: Shape,
    seen: HashMap<EntryPath, Seen>,
    summary: Summary,
}

impl Walk<'_> {
    fn malformed(&self, err: &std::io::Error) -> CopyError {
        CopyError::Malformed {
            from: self.from.clone(),
            detail: err.to_string(),
        }
    }

    fn refuse(&self, entry: &[u8], why: impl Into<String>) -> CopyError {
        CopyError::Refused {
            from: self.from.clone(),
            entry: String::from_utf8_lossy(entry).into_owned(),
            why: why.into(),
        }
    }

    fn run<R: Read>(
        &mut self,
        reader: &mut tar::Archive<R>,
        interrupt: Option<&Interrupt>,
        sink: &mut dyn Sink,
    ) -> Result<(), CopyError> {
        let entries = reader.entries().map_err(|e| self.malformed(&e))?;
        for entry in entries {
            if interrupt.is_some_and(Interrupt::is_requested) {
                return Err(CopyError::Interrupted);
            }
            let mut entry = entry.map_err(|e| self.malformed(&e))?;
            self.one(&mut entry, sink)?;
        }
        Ok(())
    }

    fn one<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        sink: &mut dyn Sink,
    ) -> Result<(), CopyError> {
        let raw_name = entry.path_bytes().into_owned();
        let kind = entry.header().entry_type();
        let seen_kind = match kind {
            EntryType::Regular | EntryType::Continuous => Seen::File,
            EntryType::Directory => Seen::Dir,
            EntryType::Symlink | EntryType::Link => Seen::Link,
            // A pax global header (git archive's comment) describes the
            // archive, not a file.
            EntryType::XGlobalHeader => return Ok(()),
            EntryType::Char | EntryType::Block => {
                return Err(self.refuse(&raw_name, "a device node: devices are never copied"));
            }
            EntryType::Fifo => {
                return Err(self.refuse(&raw_name, "a fifo: fifos are never copied"));
            }
            EntryType::GNUSparse => {
                return Err(self.refuse(&raw_name, "a sparse file, which is not copied"));
            }
            other => {
                return Err(self.refuse(
                    &raw_name,
                    format!(
                        "an entry of type {:?}, which is not copied",
                        other.as_byte()
                    ),
                ));
            }
        };
        let path = match self.name(&raw_name)? {
            Some(path) => path,
            // `.`, `./`: the destination itself. Its mode is not the box's
            // to set.
            None if seen_kind == Seen::Dir => return Ok(()),
            None => return Err(self.refuse(&raw_name, "a file with no name")),
        };
        self.top(&raw_name, &path, seen_kind)?;
        self.parents(&raw_name, &path, sink)?;
        if let Some(before) = self.seen.get(&path)
            && !(*before == Seen::Dir && seen_kind == Seen::Dir)
        {
            return Err(self.refuse(&raw_name, "it names an entry the archive already made"));
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let mtime = entry.header().mtime().unwrap_or(0);
        match kind {
            EntryType::Directory => sink.entry(Checked::Dir {
                path: &path,
                mode,
                mtime: Some(mtime),
            })?,
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = self.link_target(&raw_name, &path, &target)?;
                sink.entry(Checked::Symlink {
                    path: &path,
                    target: &target,
                    mtime,
                })?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let earlier = match self.name(&target) {
                    Ok(Some(earlier)) if self.seen.get(&earlier) == Some(&Seen::File) => earlier,
                    _ => {
                        return Err(self.refuse(
                            &raw_name,
                            format!(
                                "a hard link to {:?}, which is not a file earlier in the archive",
                                String::from_utf8_lossy(&target)
                            ),
                        ));
                    }
                };
                sink.entry(Checked::HardLink {
                    path: &path,
                    target: &earlier,
                })?;
            }
            _ => {
                let size = entry.header().entry_size().unwrap_or(0);
                sink.entry(Checked::File {
                    path: &path,
                    mode,
                    mtime,
                    size,
                    data: entry,
                })?;
            }
        }
        // A hard link is a file too (another may name it); a symbolic link
        // is what nothing may lie beneath.
        let recorded = match kind {
            EntryType::Link => Seen::File,
            EntryType::Symlink => Seen::Link,
            _ => seen_kind,
        };
        self.seen.insert(path, recorded);
        self.summary.entries += 1;
        Ok(())
    }

    /// The entry's name, normalised; `None` for the archive's root.
    fn name(&self, raw: &[u8]) -> Result<Option<EntryPath>, CopyError> {
        if raw.first() == Some(&b'/') {
            return Err(self.refuse(raw, "an absolute name"));
        }
        if raw.len() > NAME_MAX_BYTES {
            return Err(self.refuse(
                &raw[..64],
                format!("a name longer than {NAME_MAX_BYTES} bytes, more than a host path holds"),
            ));
        }
        let mut parts = Vec::new();
        for part in raw.split(|b| *b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => return Err(self.refuse(raw, "a name with a `..` component")),
                name => parts.push(name.to_vec()),
            }
        }
        Ok((!parts.is_empty()).then_some(EntryPath(parts)))
    }

    /// [`Shape::OneTop`]: every entry is below the first.
    fn top(&mut self, raw: &[u8], path: &EntryPath, kind: Seen) -> Result<(), CopyError> {
        if self.shape != Shape::OneTop {
            return Ok(());
        }
        let first = &path.0[0];
        match &self.summary.top {
            None if path.0.len() == 1 => {
                self.summary.top = Some(first.clone());
                self.summary.top_is_dir = kind == Seen::Dir;
                Ok(())
            }
            None => {
                // The top directory is implicit.
                self.summary.top = Some(first.clone());
                self.summary.top_is_dir = true;
                Ok(())
            }
            Some(top) if top == first => Ok(()),
            Some(_) => Err(self.refuse(
                raw,
                "a second top-level entry: the archive of one path holds one file or directory",
            )),
        }
    }

    /// Every directory above the entry: made by the archive as a directory
    /// (never a file or a link), or made here as an implicit one.
    ///
    /// Looked up from the deepest: a directory already seen had every
    /// directory above it checked when it was (a name is never seen twice),
    /// so the walk stops there and a deep tree costs its depth, not its
    /// depth squared.
    fn parents(
        &mut self,
        raw: &[u8],
        path: &EntryPath,
        sink: &mut dyn Sink,
    ) -> Result<(), CopyError> {
        let mut known = 0;
        for n in (1..path.0.len()).rev() {
            let parent = EntryPath(path.0[..n].to_vec());
            match self.seen.get(&parent) {
                Some(Seen::Dir) => {
                    known = n;
                    break;
                }
                Some(Seen::Link) => {
                    return Err(self.refuse(
                        raw,
                        format!(
                            "it lies beneath {:?}, a link the archive made",
                            parent.lossy()
                        ),
                    ));
                }
                Some(Seen::File) => {
                    return Err(self.refuse(
                        raw,
                        format!(
                            "it lies beneath {:?}, a file the archive made",
                            parent.lossy()
                        ),
                    ));
                }
                None => {}
            }
        }
        for n in known + 1..path.0.len() {
            let parent = EntryPath(path.0[..n].to_vec());
            sink.entry(Checked::Dir {
                path: &parent,
                mode: 0o755,
                mtime: None,
            })?;
            self.seen.insert(parent, Seen::Dir);
            self.summary.entries += 1;
        }
        Ok(())
    }

    /// A symbolic link's target, normalised, if it stays inside the copy.
    fn link_target(
        &self,
        raw: &[u8],
        path: &EntryPath,
        target: &[u8],
    ) -> Result<Vec<u8>, CopyError> {
        let shown = String::from_utf8_lossy(target);
        if target.is_empty() {
            return Err(self.refuse(raw, "a link with no target"));
        }
        if target.first() == Some(&b'/') {
            return Err(self.refuse(
                raw,
                format!("a link to the absolute path {shown:?}, outside the copy"),
            ));
        }
        // How many directories the link's own directory is below the
        // copy's top (the top's directory is outside the copy: -1).
        let depth = match self.shape {
            Shape::OneTop => path.0.len() as i64 - 2,
            Shape::Contents => path.0.len() as i64 - 1,
        };
        if depth < 0 {
            return Err(self.refuse(
                raw,
                format!(
                    "the copy is itself a link (to {shown:?}), which can only point outside it"
                ),
            ));
        }
        let mut ups = 0i64;
        let mut names: Vec<&[u8]> = Vec::new();
        for part in target.split(|b| *b == b'/') {
            match part {
                b"" | b"." => {}
                b".." if names.is_empty() => ups += 1,
                b".." => {
                    return Err(self.refuse(
                        raw,
                        format!("a link to {shown:?}, which climbs after descending"),
                    ));
                }
                name => names.push(name),
            }
        }
        if ups > depth {
            return Err(self.refuse(
                raw,
                format!("a link to {shown:?}, which points outside the copy"),
            ));
        }
        let mut normal: Vec<&[u8]> = std::iter::repeat_n(&b".."[..], ups as usize).collect();
        normal.extend(names);
        if normal.is_empty() {
            return Ok(b".".to_vec());
        }
        Ok(normal.join(&b'/'))
    }
}

/// A reader that fails once more than `limit` bytes were asked of it.
struct Bounded<R> {
    inner: R,
    limit: u64,
    read: u64,
    exceeded: bool,
}

impl<R> Bounded<R> {
    fn new(inner: R, limit: u64) -> Bounded<R> {
        Bounded {
            inner,
            limit,
            read: 0,
            exceeded: false,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.exceeded {
            return Err(std::io::Error::other("over the size bound"));
        }
        // One byte past the bound is enough to know it is past.
        let room = self.limit.saturating_sub(self.read).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.read += n as u64;
        if self.read > self.limit {
            self.exceeded = true;
            return Err(std::io::Error::other("over the size bound"));
        }
        Ok(n)
    }
}
