//! Whether the process that owns a bottle's resources still runs.
//!
//! A PID alone is not an identity: once its process exits the kernel may
//! hand the number to another, and a bottle whose launcher died would then
//! look owned forever. [`Owner`] pairs the PID with the process's start time
//! from `/proc/<pid>/stat`, so a reused PID is a different owner.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// A process that owns resources: its PID and its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The process ID.
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field
    /// 22); 0 when unknown (no `/proc`, or recorded before start times
    /// were), and then only the PID is compared.
    pub start: u64,
}

impl Owner {
    /// The current process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        let start = match proc_stat(pid) {
            ProcStat::Running { start } => start,
            ProcStat::Gone | ProcStat::NoProcfs => 0,
        };
        Owner { pid, start }
    }

    /// The process `pid` as it runs now, named by its start time; `None`
    /// when no such process runs, or this host has no `/proc` to tell its
    /// start time (then a later process could not be told from it).
    pub fn of(pid: u32) -> Option<Owner> {
        match proc_stat(pid) {
            ProcStat::Running { start } => Some(Owner { pid, start }),
            ProcStat::Gone | ProcStat::NoProcfs => None,
        }
    }

    /// True if `pid` is this very process: the same PID, running, started
    /// at the same known time. Unlike [`Owner::is_alive`], an owner whose
    /// start time is unknown is no process at all.
    pub fn is(&self, pid: u32) -> bool {
        self.pid == pid
            && self.start != 0
            && matches!(proc_stat(pid), ProcStat::Running { start } if start == self.start)
    }

    /// True while the owning process runs. A PID that now belongs to a
    /// process started at another time is a different process, and a
    /// zombie is dead: it will never finish what it owns.
    pub fn is_alive(&self) -> bool {
        match proc_stat(self.pid) {
            ProcStat::Running { start } => self.start == 0 || start == self.start,
            ProcStat::Gone => false,
            // macOS has no /proc: the PID is all there is to go on.
            ProcStat::NoProcfs => pid_exists(self.pid),
        }
    }
}

/// What `/proc` says about a PID.
enum ProcStat {
    /// It runs, started at `start`.
    Running { start: u64 },
    /// No such process, or a zombie.
    Gone,
    /// This host has no `/proc` to ask.
    NoProcfs,
}

fn proc_stat(pid: u32) -> ProcStat {
    let proc = Path::new("/proc");
    let Ok(stat) = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")) else {
        return if proc.join("self").join("stat").exists() {
            ProcStat::Gone
        } else {
            ProcStat::NoProcfs
        };
    };
    parse_start(&stat).map_or(ProcStat::Gone, |start| ProcStat::Running { start })
}

/// Field 22 of a `/proc/<pid>/stat` line, or `None` for a zombie (or a line
/// that is not one).
fn parse_start(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after it start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `state` was field 3; field 22 is 19 further on.
    fields.nth(18)?.parse().ok()
}

/// Whether `pid` names a process, by sending it signal 0.
fn pid_exists(pid: u32) -> bool {
    // 0 would address our own process group, not a process.
    pid != 0
        && i32::try_from(pid).is_ok_and(|pid| {
            // EPERM: it exists but is not ours.
            match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
                Ok(()) => true,
                Err(errno) => errno == nix::errno::Errno::EPERM,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = Owner::current();
        assert!(me.start > 0);
        assert!(me.is_alive());
        let impostor = Owner {
            start: me.start + 1,
            ..me
        };
        assert!(!impostor.is_alive());
        let start_unknown = Owner { start: 0, ..me };
        assert!(start_unknown.is_alive());
    }

    #[test]
    fn a_process_named_as_it_runs_is_itself_and_no_other() {
        let me = Owner::of(std::process::id()).unwrap();
        assert_eq!(me, Owner::current());
        assert!(me.is(me.pid));
        assert!(!me.is(me.pid + 1));
        // A later process given the same PID started at another time.
        assert!(
            !Owner {
                start: me.start + 1,
                ..me
            }
            .is(me.pid)
        );
        // Unknown start time: no process is surely this one.
        assert!(!Owner { start: 0, ..me }.is(me.pid));
    }

    #[test]
    fn a_reaped_child_is_dead() {
        #[expect(
            clippy::disallowed_methods,
            reason = "the test needs a real process that exits"
        )]
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let owner = Owner {
            pid: child.id(),
            start: 0,
        };
        child.wait().unwrap();
        assert!(!owner.is_alive());
    }

    #[test]
    fn reads_the_start_time_past_a_command_name_with_parentheses() {
        let line = |state: &str| {
            format!(
                "42 (a) b) {state} 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 9876 1000 10"
            )
        };
        assert_eq!(parse_start(&line("S")), Some(9876));
        assert_eq!(parse_start(&line("Z")), None);
        assert_eq!(parse_start("garbage"), None);
    }

    #[test]
    fn signal_zero_finds_this_process_and_never_pid_zero() {
        assert!(pid_exists(std::process::id()));
        assert!(!pid_exists(0));
    }
}
