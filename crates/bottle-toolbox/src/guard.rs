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
//!   off the channel in a gVisor box (it does refuse `ptrace`).
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
    // with everything on it), and best effort: the escape gate's toolbox
    // probes check the result in each tier.
    use std::os::fd::AsFd as _;
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    for fd in [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()] {
        let kind = nix::sys::stat::fstat(fd).map(|st| {
            nix::sys::stat::SFlag::from_bits_truncate(
                st.st_mode & nix::sys::stat::SFlag::S_IFMT.bits(),
            )
        });
        if matches!(kind, Ok(k) if k == nix::sys::stat::SFlag::S_IFIFO || k == nix::sys::stat::SFlag::S_IFSOCK)
        {
            let _ = nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::empty());
        }
    }
    if nix::sys::prctl::get_dumpable().unwrap_or(true) {
        return Err("it is still dumpable".into());
    }
    Ok(())
}
