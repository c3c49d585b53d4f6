//! A machine's data directory and its two disks, where smolvm keeps them:
//! `$XDG_CACHE_HOME` or `~/.cache` (`$SMOLVM_DATA_DIR/.cache` where that
//! relocates smolvm), then `smolvm/vms/<first 16 hex of sha256(name)>/`,
//! holding `storage.raw` and `overlay.raw` (sparse, `storage_gb` and
//! `overlay_gb` GiB), their `.formatted` markers and `name`.
//!
//! The disks are what a reset restores, so they behave as a VM's do: the
//! guest's files live on `overlay.raw` while the machine is stopped (`stop`
//! writes the guest root into it, as a shutdown flushes the filesystem;
//! `start` rebuilds the guest root from it), and every boot changes both
//! disks' bytes (a mount count in a superblock-like header, as ext4's). A
//! disk restored from a copy therefore really restores the guest's files.
//!
//! Layout of each disk: a 4 KiB header at offset 0 (`FAKEDISK`, the mount
//! count, the payload's length, all little-endian u64 after the magic),
//! and the payload at 1 MiB: for `overlay.raw` an archive of the guest
//! root, for `storage.raw` the image's name.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use bottle_smolvm::version::{Capabilities as _, SmolvmVersion};
use sha2::{Digest as _, Sha256};

use crate::{Result, error};

const MAGIC: &[u8; 8] = b"FAKEDISK";
const PAYLOAD_AT: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The overlay disk: the guest's root filesystem.
pub(crate) const OVERLAY: &str = "overlay.raw";
/// The storage disk: OCI layers and container overlays.
pub(crate) const STORAGE: &str = "storage.raw";

/// Top-level guest directories the VM mounts over (the host's system
/// directories, devices, `/proc`): never part of the disk's contents.
pub(crate) const MOUNT_POINTS: [&str; 9] = [
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "dev", "proc",
];

/// The machine's data directory, as `machine data-dir` prints it.
pub(crate) fn data_dir(version: SmolvmVersion, name: &str) -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let cache = match (version.honours_data_dir(), var("SMOLVM_DATA_DIR")) {
        (true, Some(root)) => root.join(".cache"),
        _ => match var("XDG_CACHE_HOME") {
            Some(xdg) => xdg,
            None => var("HOME")
                .ok_or_else(|| error("could not determine cache directory"))?
                .join(".cache"),
        },
    };
    let digest = format!("{:x}", Sha256::digest(name.as_bytes()));
    Ok(cache.join("smolvm/vms").join(&digest[..16]))
}

/// Creates the data directory and its two formatted, sparse disks.
pub(crate) fn create(
    dir: &Path,
    name: &str,
    image: &str,
    storage_gb: u64,
    overlay_gb: u64,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io("create", dir, &e))?;
    for (disk, gib, payload) in [
        (STORAGE, storage_gb, image.as_bytes().to_vec()),
        (OVERLAY, overlay_gb, archive(None)?),
    ] {
        let path = dir.join(disk);
        let file = File::create(&path).map_err(|e| io("create", &path, &e))?;
        file.set_len(gib * GIB).map_err(|e| io("size", &path, &e))?;
        write_disk(&path, 0, &payload)?;
        let marker = dir.join(disk.replace(".raw", ".formatted"));
        std::fs::write(&marker, b"").map_err(|e| io("write", &marker, &e))?;
    }
    std::fs::write(dir.join("name"), name).map_err(|e| io("write", dir, &e))
}

/// What a boot does to the disks: each one's mount count goes up. Then
/// the guest root is rebuilt from the overlay disk, except at the first
/// boot: what a test put in the guest root before it stands for the
/// image's files, and the first stop writes them to the disk.
pub(crate) fn boot(dir: &Path, root: &Path) -> Result<()> {
    let (mounts, payload) = read_disk(&dir.join(OVERLAY))?;
    for disk in [STORAGE, OVERLAY] {
        let path = dir.join(disk);
        let (count, payload) = read_disk(&path)?;
        write_disk(&path, count + 1, &payload)?;
    }
    if mounts == 0 {
        return std::fs::create_dir_all(root).map_err(|e| io("create", root, &e));
    }
    clear_root(root)?;
    unpack(&payload, root)
}

/// What a shutdown does: the guest root's files are written to the
/// overlay disk.
pub(crate) fn flush(dir: &Path, root: &Path) -> Result<()> {
    let path = dir.join(OVERLAY);
    let (count, _) = read_disk(&path)?;
    write_disk(&path, count, &archive(Some(root))?)
}

fn read_disk(path: &Path) -> Result<(u64, Vec<u8>)> {
    let file = File::open(path).map_err(|e| io("open", path, &e))?;
    let mut header = [0u8; 24];
    file.read_exact_at(&mut header, 0)
        .map_err(|e| io("read", path, &e))?;
    if &header[..8] != MAGIC {
        return Err(error(format!("{}: not a formatted disk", path.display())));
    }
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or([0; 8]));
    let (count, len) = (word(8), word(16));
    let mut payload = vec![0u8; usize::try_from(len).map_err(|e| error(e.to_string()))?];
    file.read_exact_at(&mut payload, PAYLOAD_AT)
        .map_err(|e| io("read", path, &e))?;
    Ok((count, payload))
}

fn write_disk(path: &Path, count: u64, payload: &[u8]) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io("open", path, &e))?;
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.write_all_at(&header, 0)
        .and_then(|()| file.write_all_at(payload, PAYLOAD_AT))
        .and_then(|()| file.sync_all())
        .map_err(|e| io("write", path, &e))
}

/// Removes everything in the guest root but its mount points.
fn clear_root(root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).map_err(|e| io("create", root, &e))?;
    for entry in std::fs::read_dir(root).map_err(|e| io("read", root, &e))? {
        let entry = entry.map_err(|e| error(e.to_string()))?;
        if MOUNT_POINTS.iter().any(|m| entry.file_name() == *m) {
            continue;
        }
        let path = entry.path();
        let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| io("remove", &path, &e))?;
    }
    Ok(())
}

/// The guest root's files (its mount points aside) as one byte string:
/// per entry, a kind (`d`, `f`, `l`, `p` for a fifo), the mode, the path and the data,
/// each length-prefixed. `None`: an empty filesystem.
fn archive(root: Option<&Path>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    if let Some(root) = root {
        walk(root, Path::new(""), &mut out)?;
    }
    Ok(out)
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<u8>) -> Result<()> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| io("read", &dir, &e))?
        .filter_map(std::result::Result::ok)
        .collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        if rel.as_os_str().is_empty() && MOUNT_POINTS.iter().any(|m| entry.file_name() == *m) {
            continue;
        }
        let path = entry.path();
        let child = rel.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&path).map_err(|e| io("stat", &path, &e))?;
        let mode = meta.permissions().mode();
        let (kind, data) = if meta.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| io("read", &path, &e))?;
            (b'l', target.into_os_string().into_encoded_bytes())
        } else if meta.is_dir() {
            (b'd', Vec::new())
        } else if meta.file_type().is_fifo() {
            // Kept as what it is: opening one to read it would wait for a
            // writer that never comes.
            (b'p', Vec::new())
        } else if !meta.is_file() {
            // A socket or a device node: sockets die with the guest, and a
            // guest of the double makes no device it could keep.
            continue;
        } else {
            (
                b'f',
                std::fs::read(&path).map_err(|e| io("read", &path, &e))?,
            )
        };
        out.push(kind);
        out.extend_from_slice(&mode.to_le_bytes());
        let name = child.as_os_str().as_encoded_bytes();
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(&data);
        if kind == b'd' {
            walk(root, &child, out)?;
        }
    }
    Ok(())
}

fn unpack(mut bytes: &[u8], root: &Path) -> Result<()> {
    let corrupt = || error("the overlay disk's filesystem is corrupt");
    let take = |n: usize, bytes: &mut &[u8]| -> Result<Vec<u8>> {
        let (head, rest) = bytes.split_at_checked(n).ok_or_else(corrupt)?;
        *bytes = rest;
        Ok(head.to_vec())
    };
    while !bytes.is_empty() {
        let kind = take(1, &mut bytes)?[0];
        let mode = u32::from_le_bytes(take(4, &mut bytes)?.try_into().map_err(|_| corrupt())?);
        let len = |bytes: &mut &[u8]| -> Result<usize> {
            let word = take(8, bytes)?;
            usize::try_from(u64::from_le_bytes(word.try_into().map_err(|_| corrupt())?))
                .map_err(|_| corrupt())
        };
        let name_len = len(&mut bytes)?;
        let name = take(name_len, &mut bytes)?;
        let data_len = len(&mut bytes)?;
        let data = take(data_len, &mut bytes)?;
        // `archive` wrote names read off a directory, so no `..`; refuse
        // anything else all the same.
        let rel = PathBuf::from(String::from_utf8(name).map_err(|_| corrupt())?);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(corrupt());
        }
        let path = root.join(&rel);
        match kind {
            b'd' => std::fs::create_dir_all(&path).map_err(|e| io("create", &path, &e))?,
            b'l' => std::os::unix::fs::symlink(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(data),
                &path,
            )
            .map_err(|e| io("link", &path, &e))?,
            b'p' => nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|e| io("create", &path, &std::io::Error::from(e)))?,
            b'f' => {
                let mut file = File::create(&path).map_err(|e| io("create", &path, &e))?;
                file.write_all(&data).map_err(|e| io("write", &path, &e))?;
            }
            _ => return Err(corrupt()),
        }
        if kind != b'l' {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| io("chmod", &path, &e))?;
        }
    }
    Ok(())
}

fn io(action: &str, path: &Path, err: &std::io::Error) -> crate::Failure {
    error(format!("{action} {}: {err}", path.display()))
}
