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
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|err| format!("cannot clear its {set:?} set: {err}"))?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(|err| format!("cannot set no_new_privs: {err}"))?;
    if nix::sys::prctl::get_dumpable().unwrap_or(true) {
        return Err("it is still dumpable".into());
    }
    Ok(())
}
