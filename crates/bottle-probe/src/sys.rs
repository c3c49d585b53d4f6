//! Small system helpers: the one `unsafe` call (TIOCSTI, which no safe
//! wrapper offers), `/proc` parsing, cgroup limits, a scratch directory.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Pushes one byte into a terminal's input queue (`TIOCSTI`). Returns the
/// raw `ioctl` result as an I/O error on failure.
pub(crate) fn tiocsti(fd: &impl AsRawFd, byte: u8) -> std::io::Result<()> {
    let c = byte;
    #[expect(
        unsafe_code,
        reason = "TIOCSTI has no safe wrapper; the pointer is to a live local byte"
    )]
    // SAFETY: `c` outlives the call; TIOCSTI reads exactly one byte from
    // the pointer.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSTI, &raw const c) };
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `/proc/self/cwd` and `getcwd()` name the same directory; a
/// working directory outside the root (a leaked host directory) makes
/// `getcwd` fail or disagree. `None`: `/proc` unreadable.
pub(crate) fn cwd_consistent() -> Option<bool> {
    let via_proc = std::fs::metadata("/proc/self/cwd").ok()?;
    let Ok(named) = std::env::current_dir() else {
        return Some(false);
    };
    if !named.is_absolute() {
        return Some(false);
    }
    Some(
        std::fs::metadata(&named)
            .is_ok_and(|m| m.dev() == via_proc.dev() && m.ino() == via_proc.ino()),
    )
}

/// A field of `/proc/self/status`-style text (`CapEff`, `NoNewPrivs`).
pub(crate) fn status_field_in(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// A cgroup limit: the first of `paths` that reads as a number. `Ok(None)`:
/// a file says there is no limit (`max`, or the v1 "unlimited" value);
/// `Err`: no file was readable.
pub(crate) fn cgroup_limit(paths: &[&str]) -> Result<Option<u64>, String> {
    let mut tried = Vec::new();
    for p in paths {
        match std::fs::read_to_string(p) {
            Ok(s) => return Ok(parse_limit(&s)),
            Err(e) => tried.push(format!("{p}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// `max` or a v1 huge value (above 2^60) is no limit.
pub(crate) fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v < (1 << 60))
}

/// A fresh directory for a probe's scratch files: under the temp dir, else
/// under the working directory. The caller removes it.
pub(crate) fn scratch_dir(tag: &str) -> Option<PathBuf> {
    let name = format!("bottle-probe-{tag}-{}", std::process::id());
    for base in [
        std::env::temp_dir(),
        PathBuf::from("/tmp"),
        PathBuf::from("."),
    ] {
        let dir = base.join(&name);
        if std::fs::create_dir(&dir).is_ok() {
            return Some(dir);
        }
    }
    None
}

/// The probe's own executable, for spawning helper children.
pub(crate) fn self_exe() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}

/// The one place the probe spawns a process: itself, as `--child <task>`
/// (see [`crate::child`]), with stdin closed. The probe is a static binary
/// that must not depend on the CLI's command runner, and it never runs any
/// other program.
pub(crate) fn helper(task: &[&str]) -> std::process::Command {
    #[expect(
        clippy::disallowed_methods,
        reason = "the probe only re-executes itself; see the doc comment"
    )]
    let mut cmd = std::process::Command::new(self_exe());
    cmd.arg("--child")
        .args(task)
        .stdin(std::process::Stdio::null());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_fields() {
        let t = "Name:\tx\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
        assert_eq!(
            status_field_in(t, "CapEff").as_deref(),
            Some("0000000000000000")
        );
        assert_eq!(status_field_in(t, "NoNewPrivs").as_deref(), Some("1"));
        assert_eq!(status_field_in(t, "Missing"), None);
    }

    #[test]
    fn parses_cgroup_limits() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("268435456\n"), Some(268_435_456));
        assert_eq!(parse_limit("9223372036854771712"), None);
        assert_eq!(parse_limit("128"), Some(128));
    }

    #[test]
    fn scratch_dirs_are_fresh() {
        let d = scratch_dir("test").unwrap();
        assert!(d.is_dir());
        std::fs::remove_dir(&d).unwrap();
    }
}
