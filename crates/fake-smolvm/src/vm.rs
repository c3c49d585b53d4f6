//! The "VM" of a running machine: a process standing in for its init, in
//! a user, mount and pid namespace of its own made at `machine start`, with
//! the guest root furnished and `/proc` mounted for the guest. Every
//! `machine exec` enters those namespaces, so the guest's processes share
//! one pid namespace and one `/proc`, as a VM's do, and `machine stop`
//! kills the init, which ends every process of the guest with it.
//!
//! `FAKE_SMOLVM_MODE=keep-guest-processes` makes `stop` leave the init (and
//! so every guest process) running and the next `start` reuse it: a
//! process that survives the restart, for the reset's descriptor check.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};

use crate::{Fake, Result, error};

/// The hidden verb the init runs as.
pub(crate) const INIT_VERB: &str = "__vm-init";

/// How long a started init has to mount the guest's `/proc`, and a killed
/// one to go.
const SETTLE: Duration = Duration::from_secs(10);

fn pid_file(fake: &Fake, name: &str) -> PathBuf {
    fake.fake_dir.join("vms").join(format!("{name}.pid"))
}

/// The running init of `name`, if there is one.
pub(crate) fn running(fake: &Fake, name: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file(fake, name))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let root = fake.guest_root(name).canonicalize().ok()?;
    is_init(pid, &root).then_some(pid)
}

/// Whether `pid` is a live init of the guest at `root` (not a reused pid).
fn is_init(pid: u32, root: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    alive(pid)
        && args.contains(&INIT_VERB.as_bytes())
        && args.contains(&root.as_os_str().as_encoded_bytes())
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// Boots the machine's init (or, in `keep-guest-processes` mode, keeps the
/// one still running) and returns its pid. Leaves this process inside the
/// VM's namespaces: call it last.
pub(crate) fn boot(fake: &Fake, name: &str) -> Result<u32> {
    let root = fake.guest_root(name);
    if let Some(pid) = running(fake, name) {
        return Ok(pid);
    }
    let exe = std::env::current_exe().map_err(|e| error(format!("own executable: {e}")))?;
    let root = root
        .canonicalize()
        .map_err(|e| error(format!("guest root {}: {e}", root.display())))?;
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID)
        .map_err(|e| error(format!("unshare the VM's namespaces: {e}")))?;
    let sandboxed = |step: &str, r: std::io::Result<()>| {
        r.map_err(|e| {
            error(format!(
                "fake-smolvm cannot sandbox guests here: {step}: {e}"
            ))
        })
    };
    sandboxed("setgroups", std::fs::write("/proc/self/setgroups", "deny"))?;
    sandboxed(
        "uid_map",
        std::fs::write("/proc/self/uid_map", format!("0 {uid} 1")),
    )?;
    sandboxed(
        "gid_map",
        std::fs::write("/proc/self/gid_map", format!("0 {gid} 1")),
    )?;
    crate::guest::furnish(&root)
        .map_err(|e| error(format!("fake-smolvm cannot sandbox guests here: {e}")))?;
    let logs = fake.fake_dir.join("vms");
    std::fs::create_dir_all(&logs).map_err(|e| error(e.to_string()))?;
    // The first child after unsharing the pid namespace is its pid 1.
    let spec = CommandSpec::new(exe).arg(INIT_VERB).arg(&root);
    let pid = SystemRunner
        .spawn_detached(&spec, &logs.join(format!("{name}.log")))
        .map_err(|e| error(format!("start the VM: {e}")))?;
    std::fs::write(pid_file(fake, name), pid.to_string()).map_err(|e| error(e.to_string()))?;
    // Booted once its /proc is there.
    let proc_one = PathBuf::from(format!("/proc/{pid}/root"))
        .join(root.strip_prefix("/").unwrap_or(&root))
        .join("proc/1");
    let until = Instant::now() + SETTLE;
    while !proc_one.exists() {
        // Not `is_init`: the child may not have reached its `exec` yet.
        if Instant::now() > until || !alive(pid) {
            let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
            return Err(error(format!("the VM did not boot: {}", log.trim())));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(pid)
}

/// The init itself: mounts the guest's `/proc` and reaps orphans until it
/// is killed, or its guest root is removed (a test's temp dir: a VM whose
/// disk is gone does not run on).
pub(crate) fn init(root: &Path) -> Result<std::process::ExitCode> {
    mount(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| error(format!("mount the guest's /proc: {e}")))?;
    while root.exists() {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => std::thread::sleep(Duration::from_millis(100)),
            Ok(_) => {}
        }
    }
    eprintln!("the guest root {} is gone; the VM stops", root.display());
    Ok(std::process::ExitCode::SUCCESS)
}

/// Kills the machine's init, and with it every guest process, unless the
/// `keep-guest-processes` mode keeps them.
pub(crate) fn halt(fake: &Fake, name: &str) -> Result<()> {
    if fake.mode("keep-guest-processes") {
        return Ok(());
    }
    let Some(pid) = running(fake, name) else {
        let _ = std::fs::remove_file(pid_file(fake, name));
        return Ok(());
    };
    let root = fake
        .guest_root(name)
        .canonicalize()
        .map_err(|e| error(e.to_string()))?;
    let target = nix::unistd::Pid::from_raw(i32::try_from(pid).map_err(|e| error(e.to_string()))?);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    let until = Instant::now() + SETTLE;
    while is_init(pid, &root) {
        if Instant::now() > until {
            return Err(error(format!("the VM (pid {pid}) did not stop")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(pid_file(fake, name));
    Ok(())
}

/// Moves this (single-threaded) process into the VM's user and mount
/// namespaces, and its future children into the VM's pid namespace.
pub(crate) fn enter(pid: u32) -> std::result::Result<(), String> {
    let open = |ns: &str| {
        std::fs::File::open(format!("/proc/{pid}/ns/{ns}"))
            .map_err(|e| format!("the VM's {ns} namespace: {e}"))
    };
    let (user, mnt, pidns) = (open("user")?, open("mnt")?, open("pid")?);
    setns(user, CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("enter the VM's user namespace: {e}"))?;
    setns(mnt, CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("enter the VM's mount namespace: {e}"))?;
    setns(pidns, CloneFlags::CLONE_NEWPID).map_err(|e| format!("enter the VM's pid namespace: {e}"))
}
