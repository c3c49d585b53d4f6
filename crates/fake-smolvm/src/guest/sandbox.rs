//! Guest commands, confined to a guest root: the VM's user, mount and pid
//! namespaces (made at `machine start`, with the host's system directories
//! bound read-only and a few devices), then `chroot`. Absolute guest paths land in the guest root and the host is
//! never written.

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;

use bottle_core::exec::{CommandOutput, CommandSpec, SystemRunner};
use nix::mount::{MsFlags, mount};

const SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
const DEVICES: [&str; 4] = ["null", "zero", "random", "urandom"];

/// How a guest command's stdio is wired.
pub(crate) enum GuestIo {
    /// Empty stdin; stdout and stderr captured for the caller to print.
    Buffered,
    /// This process's own stdin, stdout and stderr: nothing is captured,
    /// everything streams while the command runs.
    Attached,
}

/// Gives the VM's mount namespace (which the caller has just unshared,
/// with its user namespace) the guest's system directories and devices
/// under `root`, and the directories every guest has.
pub(crate) fn furnish(root: &Path) -> Result<(), String> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make mounts private: {e}"))?;

    for dir in SYSTEM_DIRS {
        let host = Path::new("/").join(dir);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        let guest = root.join(dir);
        if meta.file_type().is_symlink() {
            let target =
                std::fs::read_link(&host).map_err(|e| format!("{}: {e}", host.display()))?;
            if std::fs::symlink_metadata(&guest).is_err() {
                std::os::unix::fs::symlink(&target, &guest)
                    .map_err(|e| format!("{}: {e}", guest.display()))?;
            }
            continue;
        }
        if !meta.is_dir() {
            continue;
        }
        std::fs::create_dir_all(&guest).map_err(|e| format!("{}: {e}", guest.display()))?;
        bind_read_only(&host, &guest)?;
    }

    let dev = root.join("dev");
    std::fs::create_dir_all(&dev).map_err(|e| format!("{}: {e}", dev.display()))?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        let guest = dev.join(name);
        if !host.exists() {
            continue;
        }
        if !guest.exists() {
            std::fs::write(&guest, b"").map_err(|e| format!("{}: {e}", guest.display()))?;
        }
        mount(
            Some(&host),
            &guest,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind {}: {e}", host.display()))?;
    }
    for dir in ["tmp", "root", "proc"] {
        std::fs::create_dir_all(root.join(dir)).map_err(|e| format!("{dir}: {e}"))?;
    }
    Ok(())
}

/// Runs `argv` with `root` as `/`; its exit code is the shell's (128 +
/// signal when one ended it), as smolvm reports it. The caller is already
/// in the VM's namespaces (see `guest::exec`).
pub(crate) fn run_in_guest(
    root: &Path,
    argv: &[String],
    env: &[(String, String)],
    workdir: Option<&str>,
    io: GuestIo,
) -> Result<CommandOutput, String> {
    let root = root
        .canonicalize()
        .map_err(|e| format!("guest root {}: {e}", root.display()))?;
    nix::unistd::chroot(&root).map_err(|e| format!("chroot {}: {e}", root.display()))?;
    std::env::set_current_dir(workdir.unwrap_or("/")).map_err(|e| format!("chdir: {e}"))?;

    let mut spec = CommandSpec::new(&argv[0]).args(&argv[1..]);
    spec = spec
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("TERM", "xterm-256color");
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    if let GuestIo::Attached = io {
        spec = spec.inherit_streams();
    }
    match SystemRunner.run_to_status(&spec) {
        Ok((status, out)) => Ok(CommandOutput {
            code: status.code().or_else(|| status.signal().map(|s| 128 + s)),
            ..out
        }),
        // A missing program is the guest's 127, as a shell would say.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(CommandOutput {
            code: Some(127),
            stdout: Vec::new(),
            stderr: format!("{}: not found\n", argv[0]).into_bytes(),
        }),
        Err(err) => Err(format!("run {}: {err}", argv[0])),
    }
}

/// Binds `host` onto `guest` read-only. Refuses rather than leave a
/// writable bind of a host system directory.
fn bind_read_only(host: &Path, guest: &Path) -> Result<(), String> {
    mount(
        Some(host),
        guest,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("bind {}: {e}", host.display()))?;
    // A remount must keep the flags the kernel locked on the original.
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    if let Ok(stat) = nix::sys::statvfs::statvfs(host) {
        use nix::sys::statvfs::FsFlags;
        let map = [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ];
        for (st, ms) in map {
            if stat.flags().contains(st) {
                flags |= ms;
            }
        }
    }
    mount(None::<&str>, guest, None::<&str>, flags, None::<&str>).map_err(|e| {
        format!(
            "could not make the bind of {} read-only ({e}); refusing to expose it writable",
            host.display()
        )
    })
}
