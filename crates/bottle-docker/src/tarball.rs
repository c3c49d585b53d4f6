//! In-memory tar archives: build contexts and the files written into
//! containers through the archive API.
//!
//! Entries carry explicit owners and modes because the daemon applies them
//! as given (a secret must land `0600` and owned by the process that reads
//! it, not by whoever ran `bottle`).

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::DockerError;

/// Who owns an entry inside the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// Numeric user ID.
    pub uid: u64,
    /// Numeric group ID.
    pub gid: u64,
}

impl Ownership {
    /// `root:root`.
    pub const ROOT: Ownership = Ownership { uid: 0, gid: 0 };
}

/// A tar archive under construction, held in memory.
pub struct TarBuilder {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for TarBuilder {
    fn default() -> Self {
        TarBuilder::new()
    }
}

impl TarBuilder {
    /// An empty archive.
    pub fn new() -> TarBuilder {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        builder.follow_symlinks(false);
        TarBuilder { builder }
    }

    /// Adds a directory entry. `path` is relative to the extraction point.
    pub fn dir(&mut self, path: &str, mode: u32, owner: Ownership) -> Result<(), DockerError> {
        let mut header = header(tar::EntryType::Directory, 0, mode, owner);
        self.builder
            .append_data(&mut header, path, std::io::empty())
            .map_err(DockerError::io("build an archive entry for", path))
    }

    /// Adds a regular file with `contents`.
    pub fn file(
        &mut self,
        path: &str,
        contents: &[u8],
        mode: u32,
        owner: Ownership,
    ) -> Result<(), DockerError> {
        let mut header = header(tar::EntryType::Regular, contents.len() as u64, mode, owner);
        self.builder
            .append_data(&mut header, path, contents)
            .map_err(DockerError::io("build an archive entry for", path))
    }

    /// Adds a symlink at `path` to `target`, stored as given.
    pub fn symlink(
        &mut self,
        path: &str,
        target: impl AsRef<Path>,
        owner: Ownership,
    ) -> Result<(), DockerError> {
        let mut header = header(tar::EntryType::Symlink, 0, 0o777, owner);
        self.builder
            .append_link(&mut header, path, target)
            .map_err(DockerError::io("build an archive entry for", path))
    }

    /// Adds a host file or directory tree under `name`, keeping modes and
    /// symlinks (not following them), with every entry owned by `owner`.
    pub fn host_path(
        &mut self,
        source: &Path,
        name: &str,
        owner: Ownership,
    ) -> Result<(), DockerError> {
        let meta = std::fs::symlink_metadata(source).map_err(DockerError::io("read", source))?;
        if meta.is_dir() {
            let mode = unix_mode(&meta);
            self.dir(name, mode, owner)?;
            self.tree(source, name, owner, &|_| false)
        } else {
            self.leaf(source, name, &meta, owner)
        }
    }

    /// Adds the contents of host directory `dir` (not `dir` itself) under
    /// `prefix` (`""` for the archive's root), skipping every relative path
    /// for which `skip` answers true, and everything below it.
    pub fn tree(
        &mut self,
        dir: &Path,
        prefix: &str,
        owner: Ownership,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<(), DockerError> {
        let mut stack: Vec<(PathBuf, String)> = vec![(dir.to_path_buf(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let mut entries: Vec<_> = std::fs::read_dir(&dir)
                .map_err(DockerError::io("list", &dir))?
                .collect::<Result<_, _>>()
                .map_err(DockerError::io("list", &dir))?;
            entries.sort_by_key(std::fs::DirEntry::file_name);
            for entry in entries {
                let path = entry.path();
                let file_name = entry.file_name().to_string_lossy().into_owned();
                let child_rel = if rel.is_empty() {
                    file_name
                } else {
                    format!("{rel}/{file_name}")
                };
                if skip(&child_rel) {
                    continue;
                }
                let name = if prefix.is_empty() {
                    child_rel.clone()
                } else {
                    format!("{prefix}/{child_rel}")
                };
                let meta =
                    std::fs::symlink_metadata(&path).map_err(DockerError::io("read", &path))?;
                if meta.is_dir() {
                    self.dir(&name, unix_mode(&meta), owner)?;
                    stack.push((path, child_rel));
                } else {
                    self.leaf(&path, &name, &meta, owner)?;
                }
            }
        }
        Ok(())
    }

    fn leaf(
        &mut self,
        path: &Path,
        name: &str,
        meta: &std::fs::Metadata,
        owner: Ownership,
    ) -> Result<(), DockerError> {
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(path).map_err(DockerError::io("read", path))?;
            return self.symlink(name, target, owner);
        }
        if !meta.is_file() {
            // Sockets, fifos and devices have no business in a bottle.
            return Ok(());
        }
        let mut contents = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut contents))
            .map_err(DockerError::io("read", path))?;
        self.file(name, &contents, unix_mode(meta), owner)
    }

    /// The finished archive.
    pub fn finish(self) -> Result<Vec<u8>, DockerError> {
        self.builder
            .into_inner()
            .map_err(DockerError::io("finish an archive", PathBuf::new()))
    }
}

fn header(kind: tar::EntryType, size: u64, mode: u32, owner: Ownership) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(owner.uid);
    header.set_gid(owner.gid);
    header.set_mtime(0);
    header
}

fn unix_mode(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

/// The first regular file in a tar archive (what the archive API returns
/// for a single-file path), or `None`.
pub fn first_file(archive: &[u8]) -> Result<Option<(Vec<u8>, u32)>, std::io::Error> {
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries()? {
        let mut entry = entry?;
        if entry.header().entry_type().is_file() {
            let mode = entry.header().mode()?;
            let mut contents = Vec::new();
            entry.read_to_end(&mut contents)?;
            return Ok(Some((contents, mode)));
        }
    }
    Ok(None)
}

/// The first entry of a container's archive of one path: a regular file,
/// a directory, or a symlink with its stored target.
pub fn first_entry(archive: &[u8]) -> Result<bottle_core::agent_box::Entry, std::io::Error> {
    use bottle_core::agent_box::Entry;
    let mut reader = tar::Archive::new(archive);
    let Some(entry) = reader.entries()?.next() else {
        return Ok(Entry::Missing);
    };
    let mut entry = entry?;
    let kind = entry.header().entry_type();
    if kind.is_dir() {
        return Ok(Entry::Dir);
    }
    if kind.is_symlink() {
        let target = entry.link_name()?.unwrap_or_default();
        return Ok(Entry::Link(target.to_string_lossy().into_owned()));
    }
    if kind.is_file() {
        let mode = entry.header().mode()?;
        let mut contents = Vec::new();
        entry.read_to_end(&mut contents)?;
        return Ok(Entry::File { contents, mode });
    }
    Ok(Entry::Missing)
}

/// Whether a container's archive of one directory holds anything below
/// it (the archive's first entry is the directory itself).
pub fn holds_entries_below_its_first(archive: &[u8]) -> Result<bool, std::io::Error> {
    let mut reader = tar::Archive::new(archive);
    let mut entries = reader.entries()?;
    if entries.next().transpose()?.is_none() {
        return Ok(false);
    }
    Ok(entries.next().transpose()?.is_some())
}

/// A path inside a container as an archive entry name: no leading slash.
pub fn entry_name(container_path: &str) -> String {
    container_path.trim_start_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &[u8]) -> Vec<(String, u32, u64, char)> {
        let mut reader = tar::Archive::new(archive);
        reader
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                let kind = match h.entry_type() {
                    tar::EntryType::Directory => 'd',
                    tar::EntryType::Symlink => 'l',
                    _ => 'f',
                };
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    kind,
                )
            })
            .collect()
    }

    #[test]
    fn files_keep_mode_and_owner() {
        let mut tar = TarBuilder::new();
        let owner = Ownership {
            uid: 1000,
            gid: 1000,
        };
        tar.dir("run/bottle", 0o700, owner).unwrap();
        tar.file("run/bottle/key.pem", b"k", 0o600, owner).unwrap();
        let archive = tar.finish().unwrap();
        assert_eq!(
            entries(&archive),
            [
                ("run/bottle".to_string(), 0o700, 1000, 'd'),
                ("run/bottle/key.pem".to_string(), 0o600, 1000, 'f'),
            ]
        );
        assert_eq!(first_file(&archive).unwrap(), Some((b"k".to_vec(), 0o600)));
    }

    #[test]
    fn host_trees_keep_symlinks_and_modes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("skill");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(root.join("sub/a.md"), "a").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let mut tar = TarBuilder::new();
        tar.host_path(&root, "etc/bottle/skills/skill", Ownership::ROOT)
            .unwrap();
        let mut got = entries(&tar.finish().unwrap());
        got.sort();
        let names: Vec<_> = got.iter().map(|e| (e.0.as_str(), e.3)).collect();
        assert_eq!(
            names,
            [
                ("etc/bottle/skills/skill", 'd'),
                ("etc/bottle/skills/skill/link", 'l'),
                ("etc/bottle/skills/skill/run.sh", 'f'),
                ("etc/bottle/skills/skill/sub", 'd'),
                ("etc/bottle/skills/skill/sub/a.md", 'f'),
            ]
        );
        let run = got.iter().find(|e| e.0.ends_with("run.sh")).unwrap();
        assert_eq!(run.1, 0o755);
    }

    #[test]
    fn entry_names_are_relative() {
        assert_eq!(entry_name("/etc/bottle/ca.pem"), "etc/bottle/ca.pem");
        assert_eq!(entry_name("etc"), "etc");
    }
}
