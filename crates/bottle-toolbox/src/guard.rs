//! Putting the in-box agent out of the agent's reach.
//!
//! The agent's processes run as the same user as this one (docker starts
//! both through execs naming the agent's user; on smolmachines both are
//! `machine exec`'s root), so the kernel's ownership rules alone would let
//! them open `/proc/<pid>/fd/1` and write frames of their own. What stops
//! them:
//!
//! - **not dumpable**: `/proc/<pid>/fd`, `mem`, `environ` and `ptrace`
//!   of a process that is not dumpable need `CAP_SYS_PTRACE`, whatever the
//!   caller's uid. The binary is installed execute-only, so the kernel
//!   already marks the process so at `execve` (a program its user cannot
//!   read is never dumpable), before its first instruction;
//!   `PR_SET_DUMPABLE` here says so again for an install that is readable.
//! - **no capability**: it gives up every capability it was started with
//!   (smolvm's `machine exec` runs as root with some; docker grants none),
//!   bounding set first, and sets `no_new_privs`, so no call it runs, and
//!   nothing a call starts, can hold `CAP_SYS_PTRACE` (or any other)
//!   either.
//!
//! - **a channel nobody can reopen**: its stdin, stdout and stderr (the
//!   pipes of the exec the host started it through) get mode 0, so a
//!   reopen through `/proc/<pid>/fd/N`, which checks the pipe's own mode,
//!   fails for every uid without `CAP_DAC_OVERRIDE`. On Linux dumpability
//!   already stops it; gVisor 20221219 lets the same uid list and reopen a
//!   non-dumpable process's descriptors, and this is what keeps the agent
//!   off the channel in a gVisor box (it does refuse `ptrace`). A pipe it
//!   cannot make mode 0 must already be out of its user's reach (another
//!   owner, no group or other bits), or it refuses to serve.
//! - **nobody got there first**: gVisor cannot run an execute-only program,
//!   so there the binary is readable and the process dumpable from
//!   `execve` until the first step below. Once the pipes are mode 0 nobody
//!   can open them any more; a process that opened them in that window
//!   still holds them, so every process of the box whose descriptors it
//!   can read is searched for the channel's pipes (its ancestors aside: on
//!   smolmachines the guest agent that started it holds their other ends,
//!   and the agent never starts it), and one found refuses the channel.
//!
//! What stays possible: the agent can signal it (same uid), which ends the
//! channel: the host then answers the call with an error, never a result.

use caps::CapSet;

/// Makes this process non-dumpable and capability-less for good; an error
/// says which step failed (the agent then refuses to serve).
pub(crate) fn guard() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false)
        .map_err(|err| format!("cannot make itself non-dumpable: {err}"))?;
    let permitted = caps::read(None, CapSet::Permitted)
        .map_err(|err| format!("cannot read its capabilities: {err}"))?;
    if !permitted.is_empty() {
        // Dropping from the bounding set needs CAP_SETPCAP, still held
        // here; without it the empty permitted set and no_new_privs below
        // still keep every later `execve` from gaining one.
        if caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SETPCAP).unwrap_or(false) {
            caps::clear(None, CapSet::Bounding)
                .map_err(|err| format!("cannot clear its bounding set: {err}"))?;
        }
    }
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(|err| format!("cannot clear its {set:?} set: {err}"))?;
    }
    // The ambient set is a subset of permitted and inheritable, both empty
    // now; a kernel without ambient capabilities (gVisor 20221219 answers
    // PR_CAP_AMBIENT_CLEAR_ALL with EINVAL) has nothing to clear.
    if let Err(err) = caps::clear(None, CapSet::Ambient) {
        let empty = |set| caps::read(None, set).is_ok_and(|caps| caps.is_empty());
        if !(empty(CapSet::Permitted) && empty(CapSet::Inheritable)) {
            return Err(format!("cannot clear its Ambient set: {err}"));
        }
    }
    nix::sys::prctl::set_no_new_privs().map_err(|err| format!("cannot set no_new_privs: {err}"))?;
    // Pipes and sockets only (a terminal's mode is its owner's, and shared
    // with everything on it); the escape gate's toolbox probes check the
    // result in each tier.
    use std::os::fd::AsFd as _;
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let mut channel = Vec::new();
    for (n, fd) in [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()]
        .into_iter()
        .enumerate()
    {
        let Ok(stat) = nix::sys::stat::fstat(fd) else {
            continue;
        };
        let kind = nix::sys::stat::SFlag::from_bits_truncate(
            stat.st_mode & nix::sys::stat::SFlag::S_IFMT.bits(),
        );
        if kind != nix::sys::stat::SFlag::S_IFIFO && kind != nix::sys::stat::SFlag::S_IFSOCK {
            continue;
        }
        if let Err(err) = nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::empty()) {
            let own = stat.st_uid == nix::unistd::geteuid().as_raw();
            if own || stat.st_mode & 0o077 != 0 {
                return Err(format!(
                    "cannot close descriptor {n} to other openers (fchmod: {err}; owner {}, mode {:o})",
                    stat.st_uid,
                    stat.st_mode & 0o777
                ));
            }
        }
        if let Ok(link) = std::fs::read_link(format!("/proc/self/fd/{n}")) {
            channel.push(link);
        }
    }
    if nix::sys::prctl::get_dumpable().unwrap_or(true) {
        return Err("it is still dumpable".into());
    }
    if let Some(holder) = channel_holder(std::path::Path::new("/proc"), &channel) {
        return Err(holder);
    }
    Ok(())
}

/// Another process under `proc_root` holding one of `channel` (the
/// targets of this process's stdio links, `pipe:[N]`), this process and
/// its ancestors aside; processes whose descriptors cannot be read are
/// passed over (on Linux they could not have opened ours either). No
/// channel links (no `/proc` to reopen them through): nothing to search.
fn channel_holder(proc_root: &std::path::Path, channel: &[std::path::PathBuf]) -> Option<String> {
    if channel.is_empty() {
        return None;
    }
    let me = std::process::id();
    let ancestors = ancestors(proc_root, me);
    let entries = match std::fs::read_dir(proc_root) {
        Ok(entries) => entries,
        Err(err) => {
            return Some(format!(
                "cannot list {} to see who else holds its channel: {err}",
                proc_root.display()
            ));
        }
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || ancestors.contains(&pid) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && channel.contains(&target)
            {
                return Some(format!(
                    "process {pid} holds its channel ({}): it was opened before the channel was closed",
                    target.display()
                ));
            }
        }
    }
    None
}

/// The parent of `pid`, its parent, and so on (from each
/// `/proc/<pid>/stat`), at most 64 of them.
fn ancestors(proc_root: &std::path::Path, pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut current = pid;
    while found.len() < 64 {
        let Ok(stat) = std::fs::read_to_string(proc_root.join(current.to_string()).join("stat"))
        else {
            break;
        };
        let parent = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        match parent {
            Some(parent) if parent > 0 && !found.contains(&parent) => {
                found.push(parent);
                current = parent;
            }
            _ => break,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::channel_holder;

    /// A `/proc` of processes: pid, parent, descriptor links.
    fn fake_proc(processes: &[(u32, u32, &[&str])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, ppid, links) in processes {
            let root = dir.path().join(pid.to_string());
            let fd = root.join("fd");
            std::fs::create_dir_all(&fd).unwrap();
            std::fs::write(root.join("stat"), format!("{pid} (x) S {ppid} 1 1 0\n")).unwrap();
            for (n, link) in links.iter().enumerate() {
                std::os::unix::fs::symlink(link, fd.join(n.to_string())).unwrap();
            }
        }
        dir
    }

    #[test]
    fn a_process_holding_the_channel_is_found() {
        let channel = vec![PathBuf::from("pipe:[77]"), PathBuf::from("pipe:[78]")];
        let clean = fake_proc(&[
            (10, 1, &["/dev/null", "pipe:[5]"]),
            (11, 1, &["socket:[77]"]),
        ]);
        assert_eq!(channel_holder(clean.path(), &channel), None);
        let held = fake_proc(&[
            (10, 1, &["/dev/null"]),
            (12, 1, &["/dev/null", "pipe:[78]"]),
        ]);
        let found = channel_holder(held.path(), &channel).unwrap();
        assert!(
            found.contains("process 12 holds its channel (pipe:[78])"),
            "{found}"
        );
        // This process and its ancestors (who started it and hold the
        // pipes' other ends) are not holders; their other children are.
        let me = std::process::id();
        let family = fake_proc(&[
            (me, 40, &["pipe:[77]"]),
            (40, 30, &["pipe:[77]", "pipe:[78]"]),
            (30, 0, &["pipe:[78]"]),
        ]);
        assert_eq!(channel_holder(family.path(), &channel), None);
        let sibling = fake_proc(&[
            (me, 40, &["pipe:[77]"]),
            (40, 0, &[]),
            (41, 40, &["pipe:[77]"]),
        ]);
        assert!(channel_holder(sibling.path(), &channel).is_some());
        assert!(channel_holder(Path::new("/nonexistent"), &channel).is_some());
        assert_eq!(channel_holder(held.path(), &[]), None);
    }
}
