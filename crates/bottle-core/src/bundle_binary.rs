//! Where `bottle` finds the static binaries it puts into boxes (the
//! `bottle-bundle` it builds the bundle image from, the `bottle-toolbox`
//! the sandbox interface runs in each box), and how to tell that a binary
//! is static. The order is
//! decided here, without touching the filesystem, so the backend that uses
//! the binary and the doctor that reports it cannot disagree.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Environment variable naming the static bundle binary.
pub const BUNDLE_BIN_ENV: &str = "BOTTLE_BUNDLE_BIN";

/// Environment variable naming the static in-box agent binary.
pub const TOOLBOX_BIN_ENV: &str = "BOTTLE_TOOLBOX_BIN";

/// The in-box agent's places, in the same order as
/// [`bundle_binary_candidates`] with `bottle-toolbox` for the name and
/// [`TOOLBOX_BIN_ENV`] for the variable.
pub fn toolbox_binary_candidates(env: Option<&OsStr>, exe: Option<&Path>) -> Vec<PathBuf> {
    static_binary_candidates("bottle-toolbox", env, exe)
}

/// The places the bundle binary may be, most specific first, for a `bottle`
/// running as `exe` with [`BUNDLE_BIN_ENV`] set to `env`:
///
/// 1. `BOTTLE_BUNDLE_BIN`, when set and not empty;
/// 2. `<exe dir>/../lib/bottle/bottle-bundle`: what `cargo xtask install`
///    lays out under its prefix;
/// 3. `<exe dir>/../x86_64-unknown-linux-gnu/release/bottle-bundle`: a cargo
///    checkout, where `cargo xtask dist` leaves the static build beside
///    `target/debug`. It comes before the next one because the
///    `bottle-bundle` in `target/debug` is a dynamic debug build;
/// 4. `<exe dir>/bottle-bundle`: both binaries in one directory (the static
///    target directory `dist` builds into, or a hand-made installation).
pub fn bundle_binary_candidates(env: Option<&OsStr>, exe: Option<&Path>) -> Vec<PathBuf> {
    static_binary_candidates("bottle-bundle", env, exe)
}

fn static_binary_candidates(name: &str, env: Option<&OsStr>, exe: Option<&Path>) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(path) = env.filter(|path| !path.is_empty()) {
        candidates.push(PathBuf::from(path));
    }
    if let Some(dir) = exe.and_then(Path::parent) {
        candidates.push(dir.join("../lib/bottle").join(name));
        candidates.push(dir.join("../x86_64-unknown-linux-gnu/release").join(name));
        candidates.push(dir.join(name));
    }
    candidates
}

/// The static in-box agent found on the host: what every box receives at
/// [`crate::sandbox::TOOLBOX_PATH`].
#[derive(Debug)]
pub struct ToolboxBinary {
    /// Where it was found.
    pub path: PathBuf,
    /// Its bytes, checked to be a static ELF.
    pub bytes: Vec<u8>,
}

/// The first file of `candidates` (the places
/// [`toolbox_binary_candidates`] lists), if it is a static ELF: the box has
/// no loader to give it. Otherwise why there is none, a lowercase fragment.
pub fn find_toolbox_in(candidates: &[PathBuf]) -> Result<ToolboxBinary, String> {
    let Some(path) = first_file(candidates) else {
        let searched: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
        return Err(format!(
            "no bottle-toolbox found (searched {})",
            if searched.is_empty() {
                format!("nothing: {TOOLBOX_BIN_ENV} is unset and this program's path is unknown")
            } else {
                searched.join(", ")
            }
        ));
    };
    let bytes =
        std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    if elf_needs_interpreter(&bytes) != Some(false) {
        return Err(format!("{} is not a static ELF binary", path.display()));
    }
    Ok(ToolboxBinary {
        path: path.clone(),
        bytes,
    })
}

/// The first of `candidates` that is a file, without reading it: what
/// [`find_toolbox_in`] would take, for a fingerprint that identifies it by
/// its metadata.
pub fn first_file(candidates: &[PathBuf]) -> Option<&PathBuf> {
    candidates.iter().find(|c| c.is_file())
}

/// The in-box agent's places for this process: [`TOOLBOX_BIN_ENV`], then
/// the places beside the running `bottle`. Touches no file.
pub fn toolbox_places() -> Vec<PathBuf> {
    toolbox_binary_candidates(
        std::env::var_os(TOOLBOX_BIN_ENV).as_deref(),
        std::env::current_exe().ok().as_deref(),
    )
}

/// The in-box agent for this process, read and checked: the first of
/// [`toolbox_places`].
pub fn find_toolbox() -> Result<ToolboxBinary, String> {
    find_toolbox_in(&toolbox_places())
}

/// True if the ELF file asks for a program interpreter (a dynamic loader).
pub fn elf_needs_interpreter(bytes: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_comes_first_then_the_installation_then_the_checkout() {
        let found = bundle_binary_candidates(
            Some(OsStr::new("/opt/b/bottle-bundle")),
            Some(Path::new("/usr/local/bin/bottle")),
        );
        assert_eq!(
            found,
            [
                PathBuf::from("/opt/b/bottle-bundle"),
                PathBuf::from("/usr/local/bin/../lib/bottle/bottle-bundle"),
                PathBuf::from("/usr/local/bin/../x86_64-unknown-linux-gnu/release/bottle-bundle"),
                PathBuf::from("/usr/local/bin/bottle-bundle"),
            ]
        );
    }

    #[test]
    fn an_empty_or_unset_variable_is_skipped() {
        let exe = Some(Path::new("/w/target/debug/bottle"));
        let unset = bundle_binary_candidates(None, exe);
        assert_eq!(bundle_binary_candidates(Some(OsStr::new("")), exe), unset);
        assert_eq!(
            unset.first(),
            Some(&PathBuf::from(
                "/w/target/debug/../lib/bottle/bottle-bundle"
            ))
        );
    }

    #[test]
    fn without_a_known_executable_only_the_variable_is_left() {
        assert_eq!(
            bundle_binary_candidates(Some(OsStr::new("/b")), None),
            [PathBuf::from("/b")]
        );
        assert!(bundle_binary_candidates(None, None).is_empty());
    }

    #[test]
    fn the_toolbox_is_looked_for_in_the_same_places() {
        let exe = Some(Path::new("/usr/local/bin/bottle"));
        let toolbox: Vec<PathBuf> = toolbox_binary_candidates(None, exe);
        let bundle: Vec<PathBuf> = bundle_binary_candidates(None, exe)
            .into_iter()
            .map(|p| p.with_file_name("bottle-toolbox"))
            .collect();
        assert_eq!(toolbox, bundle);
    }

    /// The smallest ELF header `elf_needs_interpreter` reads: 64-bit,
    /// little-endian, program headers right after it, with one of type
    /// `program_type`.
    fn elf(program_type: u32) -> Vec<u8> {
        let mut bytes = vec![0u8; 64 + 56];
        bytes[..6].copy_from_slice(b"\x7fELF\x02\x01");
        bytes[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        bytes[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        bytes[64..68].copy_from_slice(&program_type.to_le_bytes());
        bytes
    }

    #[test]
    fn the_first_toolbox_found_is_taken_and_must_be_static() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent");
        let dynamic = dir.path().join("dynamic");
        let static_one = dir.path().join("static");
        // PT_LOAD alone, and PT_INTERP (a loader asked for).
        std::fs::write(&static_one, elf(1)).unwrap();
        std::fs::write(&dynamic, elf(3)).unwrap();

        let found =
            find_toolbox_in(&[absent.clone(), static_one.clone(), dynamic.clone()]).unwrap();
        assert_eq!(found.path, static_one);
        assert_eq!(found.bytes, elf(1));

        let why = find_toolbox_in(&[absent.clone(), dynamic.clone(), static_one]).unwrap_err();
        assert!(why.contains("is not a static ELF"), "{why}");

        let why = find_toolbox_in(std::slice::from_ref(&absent)).unwrap_err();
        assert!(why.contains(&absent.display().to_string()), "{why}");
        assert!(find_toolbox_in(&[]).unwrap_err().contains(TOOLBOX_BIN_ENV));
    }

    #[test]
    fn non_elf_input_is_not_judged() {
        assert_eq!(elf_needs_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_needs_interpreter(b""), None);
    }
}
