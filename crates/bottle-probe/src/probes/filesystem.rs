//! The host's files from inside: container-engine sockets, host paths and
//! whole-host mounts, `/proc/1/root`, writable `/proc/sys` and `/sys`
//! (cgroup release agents), the device nodes on the admin blacklist and
//! `mknod`, descriptors and a working directory inherited across `exec`.
//! Writes are never made to anything that matters: a sysctl is written
//! back with its own value, other files are only opened for writing.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::{Attempt, Ctx, Probe, errno_name};

const CAT: &str = "filesystem";

/// Blocked outcomes for opening a file that should not be usable.
fn refused(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::NotFound | K::PermissionDenied | K::ReadOnlyFilesystem
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::EACCES | libc::ENXIO | libc::ENODEV | libc::EROFS | libc::ENOENT)
    )
}

/// The filesystem probes.
pub(super) fn probes() -> Vec<Probe> {
    let mut v = vec![
        Probe::new(
            "fs-docker-socket",
            CAT,
            false,
            "connect to container-engine sockets (/var/run/docker.sock, /run/docker.sock, containerd, podman, cri-o): blocked unless a connect succeeds",
            |_| engine_sockets(),
        ),
        Probe::new(
            "fs-host-paths",
            CAT,
            false,
            "look for host filesystems at /host, /hostfs, /rootfs, /mnt/host, /var/lib/docker: blocked unless one exists with entries",
            |_| host_paths(),
        ),
        Probe::new(
            "fs-host-mounts",
            CAT,
            false,
            "/proc/self/mountinfo: blocked unless a block-device filesystem is mounted from its root (a whole host filesystem) or at a host-path mount point",
            |_| host_mounts(),
        ),
        Probe::new(
            "fs-proc1-root",
            CAT,
            false,
            "read /proc/1/root/etc/shadow: blocked unless it is readable through a root other than the bottle's own",
            |_| proc1_root(),
        ),
        Probe::new(
            "fs-write-proc-sys",
            CAT,
            false,
            "open /proc/sys/kernel/hostname (written back unchanged), /proc/sys/kernel/core_pattern and /proc/sys/vm/drop_caches for writing: blocked unless one opens",
            |_| proc_sys(),
        ),
        Probe::new(
            "fs-write-sys",
            CAT,
            false,
            "open /sys/kernel/uevent_helper, /sys/kernel/mm/transparent_hugepage/enabled, /sys/class/net/lo/mtu, /sys/power/state for writing (never written): blocked unless one opens",
            |_| {
                open_for_write_any(&[
                    "/sys/kernel/uevent_helper",
                    "/sys/kernel/mm/transparent_hugepage/enabled",
                    "/sys/class/net/lo/mtu",
                    "/sys/power/state",
                ])
            },
        ),
        Probe::new(
            "fs-cgroup-escape",
            CAT,
            false,
            "open a cgroup v1 release_agent for writing and create a child cgroup under /sys/fs/cgroup: blocked unless either works",
            |_| cgroup_escape(),
        ),
        Probe::new(
            "fs-mknod",
            CAT,
            false,
            "mknod a char device 1:1 (/dev/mem) in a scratch directory and open it: blocked unless the node opens",
            |_| mknod_mem(),
        ),
        Probe::new(
            "fs-inherited-fds",
            CAT,
            false,
            "descriptors above 2 inherited at exec: blocked unless one is a socket or a file or directory (pipes, /dev/null, ttys and anonymous inodes are harmless)",
            inherited_fds,
        ),
        Probe::new(
            "fs-working-directory",
            CAT,
            false,
            "the working directory at exec: blocked unless it lies outside the bottle's root (getcwd disagrees with /proc/self/cwd, or reads \"(unreachable)\")",
            working_directory,
        ),
    ];
    let devices: [(&str, &[&str]); 4] = [
        ("dev-mem", &["/dev/mem"]),
        ("dev-kmem", &["/dev/kmem"]),
        ("dev-port", &["/dev/port"]),
        (
            "dev-raw-disk",
            &[
                "/dev/sda",
                "/dev/sdb",
                "/dev/vda",
                "/dev/vdb",
                "/dev/xvda",
                "/dev/hda",
                "/dev/nvme0n1",
                "/dev/nvme0",
                "/dev/dm-0",
                "/dev/mmcblk0",
            ],
        ),
    ];
    for (name, paths) in devices {
        v.push(Probe::new(
            name,
            CAT,
            false,
            format!(
                "open {} read-only: blocked when absent or refused (ENOENT, EPERM, EACCES)",
                paths.join(", ")
            ),
            move |_| open_devices(paths),
        ));
    }
    v
}

fn engine_sockets() -> Attempt {
    let mut seen = Vec::new();
    for p in [
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/run/podman/podman.sock",
        "/var/run/crio/crio.sock",
        "/run/user/0/docker.sock",
    ] {
        match UnixStream::connect(p) {
            Ok(_) => return Attempt::reached(format!("{p}: connected")),
            Err(e) => seen.push(format!("{p}: {}", errno_name(&e))),
        }
    }
    Attempt::blocked(seen.join("; "))
}

fn host_paths() -> Attempt {
    let mut seen = Vec::new();
    for p in [
        "/host",
        "/hostfs",
        "/rootfs",
        "/mnt/host",
        "/var/lib/docker",
    ] {
        match std::fs::read_dir(p) {
            Ok(mut d) => {
                if d.next().is_some() {
                    return Attempt::reached(format!("{p} exists and has entries"));
                }
                seen.push(format!("{p}: empty"));
            }
            Err(e) => seen.push(format!("{p}: {}", errno_name(&e))),
        }
    }
    Attempt::blocked(seen.join("; "))
}

/// A whole host filesystem: a block-device-backed mount of the source's
/// root, other than the bottle's own `/`; or anything at a host-ish path.
pub(super) fn suspicious_mounts(mountinfo: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        let (Some(root), Some(point), Some(fstype), Some(source)) =
            (pre.get(3), pre.get(4), post.first(), post.get(1))
        else {
            continue;
        };
        let block = source.starts_with("/dev/") && !matches!(*fstype, "tmpfs" | "devtmpfs");
        let hostish = ["/host", "/hostfs", "/rootfs", "/mnt/host"]
            .iter()
            .any(|h| point == h || point.starts_with(&format!("{h}/")));
        if (block && *root == "/" && *point != "/") || hostish {
            found.push(format!("{source} ({fstype}) root {root} at {point}"));
        }
    }
    found
}

fn host_mounts() -> Attempt {
    let text = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(t) => t,
        Err(e) => return Attempt::error(format!("/proc/self/mountinfo: {}", errno_name(&e))),
    };
    let found = suspicious_mounts(&text);
    if found.is_empty() {
        Attempt::blocked(format!(
            "{} mounts, none a whole block-device filesystem or a host path",
            text.lines().count()
        ))
    } else {
        Attempt::reached(found.join("; "))
    }
}

fn proc1_root() -> Attempt {
    let same_root = match (std::fs::metadata("/proc/1/root/"), std::fs::metadata("/")) {
        (Ok(a), Ok(b)) => Some(a.dev() == b.dev() && a.ino() == b.ino()),
        _ => None,
    };
    let mut buf = Vec::new();
    match std::fs::File::open("/proc/1/root/etc/shadow")
        .and_then(|mut f| Read::by_ref(&mut f).take(4096).read_to_end(&mut buf))
    {
        Err(e) => Attempt::blocked(format!("/proc/1/root/etc/shadow: {}", errno_name(&e))),
        Ok(_) if same_root == Some(true) => Attempt::blocked(format!(
            "readable, but /proc/1/root is the bottle's own root (pid 1 is in the bottle); {} bytes",
            buf.len()
        )),
        Ok(_) => Attempt::reached(format!(
            "/proc/1/root/etc/shadow readable ({} bytes) through a root other than ours (same root: {same_root:?})",
            buf.len()
        )),
    }
}

fn proc_sys() -> Attempt {
    let hostname = "/proc/sys/kernel/hostname";
    let mut seen = Vec::new();
    match OpenOptions::new().write(true).open(hostname) {
        Ok(mut f) => {
            let current = std::fs::read_to_string(hostname).unwrap_or_default();
            let wrote = f.write_all(current.trim_end().as_bytes());
            return match wrote {
                Ok(()) => {
                    Attempt::reached(format!("{hostname}: opened and written (its own value)"))
                }
                Err(e) => Attempt::reached(format!(
                    "{hostname}: opened for writing (the write itself: {})",
                    errno_name(&e)
                )),
            };
        }
        Err(e) => seen.push(format!("{hostname}: {}", errno_name(&e))),
    }
    let rest = open_for_write_any(&["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"]);
    if rest.outcome != crate::contract::Outcome::Blocked {
        return rest;
    }
    seen.push(rest.observed);
    Attempt::blocked(seen.join("; "))
}

/// Opens each path for writing without writing; reached on the first that
/// opens.
fn open_for_write_any(paths: &[&str]) -> Attempt {
    let mut seen = Vec::new();
    for p in paths {
        match OpenOptions::new().write(true).open(p) {
            Ok(_) => return Attempt::reached(format!("{p}: opened for writing")),
            Err(e) => seen.push(format!("{p}: {}", errno_name(&e))),
        }
    }
    Attempt::blocked(seen.join("; "))
}

fn cgroup_escape() -> Attempt {
    let mut seen = Vec::new();
    let mut agents = vec!["/sys/fs/cgroup/release_agent".to_string()];
    if let Ok(d) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in d.flatten() {
            agents.push(e.path().join("release_agent").display().to_string());
        }
    }
    for p in &agents {
        if !Path::new(p).exists() {
            continue;
        }
        match OpenOptions::new().write(true).open(p) {
            Ok(_) => return Attempt::reached(format!("{p}: opened for writing")),
            Err(e) => seen.push(format!("{p}: {}", errno_name(&e))),
        }
    }
    let child = format!("/sys/fs/cgroup/bottle-probe-{}", std::process::id());
    match std::fs::create_dir(&child) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&child);
            Attempt::reached(format!("{child}: created (and removed)"))
        }
        Err(e) => {
            seen.push(format!("mkdir {child}: {}", errno_name(&e)));
            Attempt::blocked(seen.join("; "))
        }
    }
}

fn mknod_mem() -> Attempt {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    // A scratch directory when one can be made; otherwise the node is
    // attempted in places that exist (a refusal there is still a verdict).
    let scratch = crate::sys::scratch_dir("mknod");
    let mut dirs: Vec<std::path::PathBuf> = scratch.iter().cloned().collect();
    if dirs.is_empty() {
        dirs.extend(std::env::current_dir().ok());
        dirs.push("/dev/shm".into());
        dirs.push("/".into());
    }
    let name = format!("bottle-probe-mem-{}", std::process::id());
    let mut seen = Vec::new();
    let mut verdict = None;
    for dir in &dirs {
        let node = dir.join(&name);
        match mknod(
            &node,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(1, 1),
        ) {
            Err(e) => seen.push(format!("mknod in {}: {e:?}: {}", dir.display(), e.desc())),
            Ok(()) => {
                verdict = Some(match std::fs::File::open(&node) {
                    Ok(_) => Attempt::reached(format!(
                        "mknod c 1 1 in {} and open succeeded (physical memory)",
                        dir.display()
                    )),
                    Err(e) => Attempt::blocked(format!(
                        "mknod in {} succeeded but the node does not open: {}",
                        dir.display(),
                        errno_name(&e)
                    )),
                });
                let _ = std::fs::remove_file(&node);
                break;
            }
        }
    }
    if let Some(d) = scratch {
        let _ = std::fs::remove_dir(&d);
    }
    verdict.unwrap_or_else(|| Attempt::blocked(seen.join("; ")))
}

fn open_devices(paths: &[&str]) -> Attempt {
    let mut seen = Vec::new();
    for p in paths {
        match std::fs::File::open(p) {
            Ok(_) => return Attempt::reached(format!("{p}: opened")),
            Err(e) if refused(&e) => seen.push(format!("{p}: {}", errno_name(&e))),
            Err(e) => {
                return Attempt::reached(format!(
                    "{p}: present and not refused: {}",
                    errno_name(&e)
                ));
            }
        }
    }
    Attempt::blocked(seen.join("; "))
}

/// Whether an inherited descriptor's link points at something that could
/// carry data in or out of the bottle.
pub(super) fn risky_fd(link: &str) -> bool {
    let harmless = link.starts_with("pipe:")
        || link.starts_with("anon_inode:")
        || link == "/dev/null"
        || link.starts_with("/dev/pts/")
        || link.starts_with("/dev/tty");
    !harmless
}

fn inherited_fds(c: &Ctx) -> Attempt {
    let fds = &c.startup.fds;
    let listed = fds
        .iter()
        .map(|(fd, l)| format!("{fd} -> {l}"))
        .collect::<Vec<_>>()
        .join(", ");
    if fds.iter().any(|(_, l)| risky_fd(l)) {
        Attempt::reached(format!("inherited: {listed}"))
    } else if fds.is_empty() {
        Attempt::blocked("no descriptor above 2 at exec")
    } else {
        Attempt::blocked(format!("only harmless descriptors: {listed}"))
    }
}

fn working_directory(c: &Ctx) -> Attempt {
    let s = &c.startup;
    let cwd = s.cwd.as_deref().unwrap_or("<unreadable>");
    if cwd.starts_with("(unreachable)") || s.cwd_consistent == Some(false) {
        Attempt::reached(format!(
            "the working directory {cwd} is outside the bottle's root (getcwd disagrees)"
        ))
    } else if s.cwd.is_none() {
        Attempt::error("/proc/self/cwd unreadable")
    } else {
        Attempt::blocked(format!("{cwd}, inside the bottle's root"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_whole_host_filesystems() {
        let container = "\
1 0 0:50 / / rw - overlay overlay rw,lowerdir=x
2 1 0:5 / /proc rw - proc proc rw
3 1 259:1 /var/lib/docker/containers/x/resolv.conf /etc/resolv.conf ro - ext4 /dev/nvme0n1p1 rw
";
        assert!(suspicious_mounts(container).is_empty());
        let leaked = "4 1 259:1 / /mnt/data rw - ext4 /dev/nvme0n1p1 rw\n";
        assert_eq!(suspicious_mounts(leaked).len(), 1);
        let hostish = "5 1 0:60 /tmp /host/tmp rw - tmpfs tmpfs rw\n";
        assert_eq!(suspicious_mounts(hostish).len(), 1);
    }

    #[test]
    fn classifies_inherited_descriptors() {
        assert!(!risky_fd("pipe:[123]"));
        assert!(!risky_fd("/dev/null"));
        assert!(!risky_fd("anon_inode:[eventpoll]"));
        assert!(risky_fd("socket:[99]"));
        assert!(risky_fd("/sys/fs/cgroup"));
        assert!(risky_fd("/home/op/project"));
    }
}
