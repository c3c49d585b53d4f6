//! Kernel attack surface: TIOCSTI into a terminal, ptrace of pid 1 and of
//! every process of another user, mount, module loading, raw and packet
//! sockets, AF_VSOCK to the host, AF_ALG, a new user namespace. Anything
//! that succeeds is undone at once (detach, unmount, close).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, AlgAddr, SockFlag, SockProtocol, SockType, VsockAddr, bind, connect, socket,
};

use super::{Attempt, Ctx, Probe, errno_name};
use crate::contract::Outcome;
use crate::sys;

const CAT: &str = "kernel";

fn errno(e: Errno) -> String {
    format!("{e:?}: {}", e.desc())
}

/// The kernel probes.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "kernel-tiocsti",
            CAT,
            false,
            "TIOCSTI (push input into the controlling terminal) on stdin and /dev/tty: blocked when there is no tty or the ioctl fails (ENOTTY, EIO, EPERM)",
            |_| tiocsti(),
        ),
        Probe::new(
            "kernel-ptrace-pid1",
            CAT,
            false,
            "PTRACE_ATTACH to pid 1: blocked unless it attaches (EPERM expected)",
            |c| ptrace_pid(nix::unistd::Pid::from_raw(1), c.timeout),
        ),
        Probe::new(
            "kernel-ptrace-other-user",
            CAT,
            false,
            "PTRACE_ATTACH to every process of another uid (the bottle's init and keep-alive): blocked unless one attaches (EPERM expected)",
            ptrace_other_users,
        ),
        Probe::new(
            "kernel-mount-tmpfs",
            CAT,
            false,
            "mount a tmpfs on a scratch directory: blocked unless it mounts (EPERM expected)",
            |_| mount_tmpfs(),
        ),
        Probe::new(
            "kernel-module-init",
            CAT,
            false,
            "init_module with an empty image: blocked when refused before the image is looked at (EPERM, ENOSYS)",
            |_| {
                let r = nix::kmod::init_module(&[], c"");
                module_verdict("init_module", r)
            },
        ),
        Probe::new(
            "kernel-module-finit",
            CAT,
            false,
            "finit_module on the probe's own (non-module) file: blocked when refused before the file is looked at (EPERM, ENOSYS)",
            |_| match std::fs::File::open(sys::self_exe()) {
                Ok(f) => module_verdict(
                    "finit_module",
                    nix::kmod::finit_module(&f, c"", nix::kmod::ModuleInitFlags::empty()),
                ),
                Err(e) => Attempt::error(format!("/proc/self/exe: {}", errno_name(&e))),
            },
        ),
        Probe::new(
            "kernel-raw-socket",
            CAT,
            false,
            "socket(AF_INET, SOCK_RAW, IPPROTO_ICMP): blocked unless it opens (EPERM without CAP_NET_RAW)",
            |_| {
                open_socket(
                    "AF_INET/SOCK_RAW",
                    socket(
                        AddressFamily::Inet,
                        SockType::Raw,
                        SockFlag::empty(),
                        SockProtocol::Icmp,
                    ),
                )
            },
        ),
        Probe::new(
            "kernel-af-packet",
            CAT,
            false,
            "socket(AF_PACKET, SOCK_RAW, ETH_P_ALL): blocked unless it opens",
            |_| {
                open_socket(
                    "AF_PACKET",
                    socket(
                        AddressFamily::Packet,
                        SockType::Raw,
                        SockFlag::empty(),
                        SockProtocol::EthAll,
                    ),
                )
            },
        ),
        Probe::new(
            "kernel-af-vsock",
            CAT,
            false,
            "AF_VSOCK connect to the host (CID 2) on host_any_port: blocked unless the connect succeeds",
            vsock_host,
        ),
        Probe::new(
            "kernel-af-alg",
            CAT,
            false,
            "AF_ALG socket bound to hash/sha256 (kernel crypto API): blocked when refused (EAFNOSUPPORT, EPERM, EACCES)",
            |_| af_alg(),
        ),
        Probe::new(
            "kernel-userns",
            CAT,
            false,
            "unshare(CLONE_NEWUSER) in a child process (regaining capabilities in a new user namespace): blocked unless it succeeds",
            |_| {
                let out = sys::helper(&["unshare-user"]).output();
                match out {
                    Err(e) => {
                        Attempt::error(format!("could not spawn the helper: {}", errno_name(&e)))
                    }
                    Ok(o) => {
                        let msg = String::from_utf8_lossy(&o.stdout).trim().to_string();
                        if o.status.success() {
                            Attempt::reached(format!("unshare(CLONE_NEWUSER) succeeded: {msg}"))
                        } else {
                            Attempt::blocked(format!("unshare(CLONE_NEWUSER): {msg}"))
                        }
                    }
                }
            },
        ),
    ]
}

fn tiocsti() -> Attempt {
    let mut seen = Vec::new();
    let stdin = std::io::stdin();
    match sys::tiocsti(&stdin, 0) {
        Ok(()) => return Attempt::reached("TIOCSTI on stdin succeeded"),
        Err(e) => seen.push(format!("stdin: {}", errno_name(&e))),
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    {
        Ok(tty) => match sys::tiocsti(&tty, 0) {
            Ok(()) => return Attempt::reached("TIOCSTI on /dev/tty succeeded"),
            Err(e) => seen.push(format!("/dev/tty: {}", errno_name(&e))),
        },
        Err(e) => seen.push(format!("/dev/tty: {}", errno_name(&e))),
    }
    Attempt::blocked(seen.join("; "))
}

pub(super) fn ptrace_pid(pid: nix::unistd::Pid, timeout: Duration) -> Attempt {
    use nix::sys::ptrace;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    match ptrace::attach(pid) {
        Err(e) => Attempt::blocked(format!("PTRACE_ATTACH {pid}: {}", errno(e))),
        Ok(()) => {
            // The tracee stops with SIGSTOP; wait for it (bounded), then
            // let it go.
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                match waitpid(pid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(5)),
                    _ => break,
                }
            }
            let detached = ptrace::detach(pid, None);
            Attempt::reached(format!(
                "PTRACE_ATTACH {pid} succeeded (detached: {detached:?})"
            ))
        }
    }
}

/// Every process of another user: in a docker bottle the init and
/// keep-alive run as a uid of their own, so tracing them would cross from
/// the agent's processes to the bottle's machinery. Tracing the agent's
/// own processes is what debuggers do and crosses nothing.
fn ptrace_other_users(c: &Ctx) -> Attempt {
    let me = nix::unistd::getuid().as_raw();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Attempt::error("cannot list /proc");
    };
    let mut seen = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|v| {
                        v.split_whitespace()
                            .next()
                            .and_then(|u| u.parse::<u32>().ok())
                    })
            });
        match uid {
            Some(uid) if uid != me => {}
            _ => continue,
        }
        let attempt = ptrace_pid(nix::unistd::Pid::from_raw(pid), c.timeout);
        if attempt.outcome == Outcome::Reached {
            return attempt;
        }
        seen.push(attempt.observed);
        if seen.len() >= 64 {
            break;
        }
    }
    if seen.is_empty() {
        return Attempt::error(format!(
            "no process of another user than uid {me} to try (expected the bottle's init)"
        ));
    }
    Attempt::blocked(seen.join("; "))
}

fn mount_tmpfs() -> Attempt {
    use nix::mount::{MsFlags, mount, umount};
    // A fresh directory when one can be made, else the working directory:
    // the permission check does not care which, and a mount that does
    // succeed is undone at once.
    let scratch = sys::scratch_dir("mnt");
    let dir = match (&scratch, std::env::current_dir()) {
        (Some(d), _) => d.clone(),
        (None, Ok(cwd)) => cwd,
        (None, Err(e)) => return Attempt::error(format!("no directory to mount on: {e}")),
    };
    let r = mount(
        Some("tmpfs"),
        &dir,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    );
    let a = match r {
        Err(e) => Attempt::blocked(format!("mount tmpfs on {}: {}", dir.display(), errno(e))),
        Ok(()) => {
            let un = umount(&dir);
            Attempt::reached(format!(
                "mounted a tmpfs on {} (unmounted: {un:?})",
                dir.display()
            ))
        }
    };
    if let Some(d) = scratch {
        let _ = std::fs::remove_dir(&d);
    }
    a
}

fn module_verdict(call: &str, r: nix::Result<()>) -> Attempt {
    match r {
        Err(e @ (Errno::EPERM | Errno::ENOSYS | Errno::EACCES)) => {
            Attempt::blocked(format!("{call}: {}", errno(e)))
        }
        Err(e) => Attempt::reached(format!(
            "{call} got past the permission check and failed on the image: {}",
            errno(e)
        )),
        Ok(()) => Attempt::reached(format!("{call} succeeded")),
    }
}

fn open_socket(what: &str, r: nix::Result<std::os::fd::OwnedFd>) -> Attempt {
    match r {
        Ok(fd) => Attempt::reached(format!("{what} socket opened (fd {})", fd.as_raw_fd())),
        Err(e) => Attempt::blocked(format!("{what}: {}", errno(e))),
    }
}

fn vsock_host(c: &Ctx) -> Attempt {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::socket::{getsockopt, sockopt};
    use std::os::fd::AsFd;
    let fd = match socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK,
        None,
    ) {
        Ok(fd) => fd,
        Err(e) => return Attempt::blocked(format!("AF_VSOCK socket: {}", errno(e))),
    };
    let port = u32::from(c.config.targets.host_any_port);
    let addr = VsockAddr::new(libc::VMADDR_CID_HOST, port);
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) => {
            return Attempt::reached(format!("AF_VSOCK connect to CID 2 port {port} succeeded"));
        }
        Err(Errno::EINPROGRESS) => {}
        Err(e) => {
            return Attempt::blocked(format!("AF_VSOCK connect CID 2 port {port}: {}", errno(e)));
        }
    }
    let ms = u16::try_from(c.timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(0) => Attempt::blocked(format!(
            "AF_VSOCK connect CID 2 port {port}: no answer within the timeout"
        )),
        Ok(_) => match getsockopt(&fd, sockopt::SocketError) {
            Ok(0) => Attempt::reached(format!("AF_VSOCK connect to CID 2 port {port} succeeded")),
            Ok(code) => Attempt::blocked(format!(
                "AF_VSOCK connect CID 2 port {port}: {}",
                errno(Errno::from_raw(code))
            )),
            Err(e) => Attempt::blocked(format!("AF_VSOCK connect CID 2 port {port}: {}", errno(e))),
        },
        Err(e) => Attempt::blocked(format!("AF_VSOCK poll: {}", errno(e))),
    }
}

fn af_alg() -> Attempt {
    let fd = match socket(
        AddressFamily::Alg,
        SockType::SeqPacket,
        SockFlag::empty(),
        None,
    ) {
        Ok(fd) => fd,
        Err(e) => return Attempt::blocked(format!("AF_ALG socket: {}", errno(e))),
    };
    match bind(fd.as_raw_fd(), &AlgAddr::new("hash", "sha256")) {
        Ok(()) => Attempt::reached("AF_ALG socket bound to hash/sha256"),
        Err(e) => Attempt::blocked(format!("AF_ALG socket opened, bind refused: {}", errno(e))),
    }
}
