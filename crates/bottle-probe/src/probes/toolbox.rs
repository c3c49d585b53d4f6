//! The in-box agent's channel (issue 25): the process behind `bottle
//! execute` reads requests on its stdin and writes every tool result on its
//! stdout, so an agent that could open `/proc/<pid>/fd/1` could write
//! results of its own, and one that could trace it could rewrite them.
//!
//! These probes only mean something while an in-box agent runs: the
//! harness runs them as a tool call (`bottle execute`), so the agent under
//! attack is the one carrying this very call's result. Elsewhere they are
//! skipped. Each has its positive control in the same probe: the same
//! action against a child of the probe's own uid must work, else the probe
//! reports an error rather than a pass.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt as _;
use std::process::{Child, Stdio};
use std::time::Duration;

use nix::unistd::Pid;

use super::{Attempt, Ctx, Probe, errno_name};
use crate::sys;

const CAT: &str = "toolbox";

/// Where the in-box agent runs from.
const TOOLBOX: &str = "/.bottle/toolbox";

/// The in-box agent probes.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "toolbox-forge-fd",
            CAT,
            false,
            "open the in-box agent's stdout (/proc/<pid>/fd/1, where results travel) for writing and its stdin (fd/0, the host's requests) for reading: blocked when both are refused (control: the same opens of a child of the probe's uid work)",
            |c| each_agent(c, forge_fd),
        ),
        Probe::new(
            "toolbox-plant-frames",
            CAT,
            false,
            "open the in-box agent's stdin (fd/0) and stdout (fd/1) for writing, to plant requests or answers ahead of the next call: blocked when both are refused (control: the same opens of a child of the probe's uid work)",
            |c| each_agent(c, plant_frames),
        ),
        Probe::new(
            "toolbox-ptrace",
            CAT,
            false,
            "PTRACE_ATTACH to the in-box agent, to rewrite a result in its memory: blocked when refused (control: attaching to a child of the probe's uid works)",
            |c| each_agent(c, ptrace),
        ),
    ]
}

/// The pids of the in-box agents running in the box.
fn agents() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.split(|b| *b == 0).next() == Some(TOOLBOX.as_bytes()))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// A child of the probe's own uid with piped stdin and stdout: the
/// control's target, killed when dropped.
struct Control(Child);

impl Control {
    fn start() -> Result<Control, String> {
        sys::helper(&["sleep", "30000"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map(Control)
            .map_err(|e| format!("control: cannot start a child: {e}"))
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).unwrap_or(0)
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `attempt` against every in-box agent, after it worked against a
/// child of the probe's own uid (`attempt` returns `Ok(what)` when the
/// action worked, `Err(why)` when it was refused).
fn each_agent(c: &Ctx, attempt: fn(i32, Duration) -> Result<String, String>) -> Attempt {
    let agents = agents();
    if agents.is_empty() {
        return Attempt::skipped(
            "no in-box agent runs in the box (the harness runs these probes as a tool call)",
        );
    }
    let control = match Control::start() {
        Ok(control) => control,
        Err(why) => return Attempt::error(why),
    };
    let control_said = match attempt(control.pid(), c.timeout) {
        Ok(what) => what,
        Err(why) => {
            return Attempt::error(format!(
                "control failed, so the method proves nothing: {why}"
            ));
        }
    };
    drop(control);
    let mut seen = vec![format!("control: {control_said}")];
    for pid in agents {
        match attempt(pid, c.timeout) {
            Ok(what) => return Attempt::reached(format!("in-box agent {pid}: {what}")),
            Err(why) => seen.push(format!("in-box agent {pid}: {why}")),
        }
    }
    Attempt::blocked(seen.join("; "))
}

/// Opens `/proc/<pid>/fd/<fd>`; never writes or reads a byte.
fn open_fd(pid: i32, fd: u8, write: bool) -> Result<String, String> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let mut options = OpenOptions::new();
    options
        .read(!write)
        .write(write)
        .custom_flags(nix::libc::O_NONBLOCK);
    let how = if write { "writing" } else { "reading" };
    match options.open(&path) {
        Ok(_) => Ok(format!("opened {path} for {how}")),
        Err(e) => Err(format!("{path} for {how}: {}", errno_name(&e))),
    }
}

fn both(first: Result<String, String>, second: Result<String, String>) -> Result<String, String> {
    match (first, second) {
        (Ok(what), _) | (_, Ok(what)) => Ok(what),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
    }
}

fn forge_fd(pid: i32, _: Duration) -> Result<String, String> {
    both(open_fd(pid, 1, true), open_fd(pid, 0, false))
}

fn plant_frames(pid: i32, _: Duration) -> Result<String, String> {
    both(open_fd(pid, 0, true), open_fd(pid, 1, true))
}

fn ptrace(pid: i32, timeout: Duration) -> Result<String, String> {
    let attempt = super::kernel::ptrace_pid(Pid::from_raw(pid), timeout);
    if attempt.outcome == crate::contract::Outcome::Reached {
        Ok(attempt.observed)
    } else {
        Err(attempt.observed)
    }
}
