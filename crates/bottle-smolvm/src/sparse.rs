//! Copying and hashing a microVM's disks, which are sparse: 30 GiB of
//! logical size holding a few MiB of data. Both walk only the data extents
//! (`SEEK_DATA`/`SEEK_HOLE`), so neither reads the holes.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use nix::unistd::{Whence, lseek};
use sha2::{Digest as _, Sha256};

use crate::error::{SmolvmError, io_err};

/// The granule of the hash: the block size of the guest's ext4.
const BLOCK: u64 = 4096;

/// The data extents of `file` of length `len`, as `(start, end)`.
fn extents(file: &File, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut at: u64 = 0;
    while at < len {
        let offset = i64::try_from(at).map_err(std::io::Error::other)?;
        let start = match lseek(file.as_fd(), offset, Whence::SeekData) {
            Ok(start) => start,
            // No data past `at`.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(err) => return Err(err.into()),
        };
        let end = lseek(file.as_fd(), start, Whence::SeekHole)?;
        let (start, end) = (
            u64::try_from(start).map_err(std::io::Error::other)?,
            u64::try_from(end).map_err(std::io::Error::other)?,
        );
        out.push((start, end));
        at = end;
    }
    Ok(out)
}

/// Copies `from` to `to` (created or truncated), the same logical size,
/// writing only `from`'s data extents so holes stay holes.
pub fn copy(from: &Path, to: &Path) -> Result<(), SmolvmError> {
    let source = File::open(from).map_err(|e| io_err("open", from, e))?;
    let len = source
        .metadata()
        .map_err(|e| io_err("stat", from, e))?
        .len();
    let target = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(to)
        .map_err(|e| io_err("create", to, e))?;
    target.set_len(len).map_err(|e| io_err("size", to, e))?;
    let mut buf = vec![0u8; 1 << 20];
    for (start, end) in extents(&source, len).map_err(|e| io_err("read", from, e))? {
        let mut at = start;
        while at < end {
            let n = usize::try_from((end - at).min(buf.len() as u64)).unwrap_or(buf.len());
            source
                .read_exact_at(&mut buf[..n], at)
                .map_err(|e| io_err("read", from, e))?;
            target
                .write_all_at(&buf[..n], at)
                .map_err(|e| io_err("write", to, e))?;
            at += n as u64;
        }
    }
    target.sync_all().map_err(|e| io_err("sync", to, e))
}

/// `sha256:<hex>` of the disks' logical contents, holes read as zeros,
/// without reading the holes: for each disk, its name and length, then
/// every non-zero 4 KiB block with its offset. Two disks hash the same
/// exactly when their bytes are the same, however the filesystem laid out
/// their extents.
pub fn hash(disks: &[(&str, &Path)]) -> Result<String, SmolvmError> {
    let mut hasher = Sha256::new();
    hasher.update(b"bottle-disks-v1");
    let mut block = vec![0u8; BLOCK as usize];
    for (name, path) in disks {
        let file = File::open(path).map_err(|e| io_err("open", path, e))?;
        let len = file.metadata().map_err(|e| io_err("stat", path, e))?.len();
        hasher.update((name.len() as u64).to_be_bytes());
        hasher.update(name.as_bytes());
        hasher.update(len.to_be_bytes());
        let mut next = 0;
        for (start, end) in extents(&file, len).map_err(|e| io_err("read", path, e))? {
            for index in (start / BLOCK).max(next)..end.div_ceil(BLOCK) {
                let at = index * BLOCK;
                let n = usize::try_from(BLOCK.min(len - at)).unwrap_or(0);
                block[n..].fill(0);
                file.read_exact_at(&mut block[..n], at)
                    .map_err(|e| io_err("read", path, e))?;
                if block.iter().any(|b| *b != 0) {
                    hasher.update(at.to_be_bytes());
                    hasher.update(&block);
                }
                next = index + 1;
            }
        }
        hasher.update(b"end");
    }
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(path: &Path, len: u64, writes: &[(u64, &[u8])]) {
        let file = File::create(path).unwrap();
        file.set_len(len).unwrap();
        for (at, bytes) in writes {
            file.write_all_at(bytes, *at).unwrap();
        }
    }

    #[test]
    fn a_copy_keeps_the_bytes_and_the_holes_and_the_hash_sees_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        // 8 GiB of logical size: reading the holes would take minutes.
        disk(
            &a,
            8 << 30,
            &[(0, b"super"), (5 << 30, b"data"), ((8 << 30) - 1, b"z")],
        );
        copy(&a, &b).unwrap();
        let meta = std::fs::metadata(&b).unwrap();
        assert_eq!(meta.len(), 8 << 30);
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < 1 << 20,
            "holes stay holes"
        );
        let mut tail = [0u8; 4];
        File::open(&b)
            .unwrap()
            .read_exact_at(&mut tail, 5 << 30)
            .unwrap();
        assert_eq!(&tail, b"data");
        let hash_of = |p: &Path| hash(&[("overlay.raw", p)]).unwrap();
        assert_eq!(hash_of(&a), hash_of(&b));

        // Zeros written as data hash like a hole.
        disk(
            &b,
            8 << 30,
            &[
                (0, b"super"),
                (5 << 30, b"data"),
                ((8 << 30) - 1, b"z"),
                (3 << 30, &[0; 8192]),
            ],
        );
        assert_eq!(hash_of(&a), hash_of(&b));
        // One byte anywhere differs.
        disk(
            &b,
            8 << 30,
            &[(0, b"super"), (5 << 30, b"dato"), ((8 << 30) - 1, b"z")],
        );
        assert_ne!(hash_of(&a), hash_of(&b));
        disk(
            &b,
            8 << 30,
            &[
                (0, b"super"),
                (5 << 30, b"data"),
                ((8 << 30) - 1, b"z"),
                (7 << 30, b"x"),
            ],
        );
        assert_ne!(hash_of(&a), hash_of(&b));
        // So do the name and the length.
        assert_ne!(hash_of(&a), hash(&[("storage.raw", &a)]).unwrap());
        disk(
            &b,
            (8 << 30) + 4096,
            &[(0, b"super"), (5 << 30, b"data"), ((8 << 30) - 1, b"z")],
        );
        assert_ne!(hash_of(&a), hash_of(&b));
    }
}
