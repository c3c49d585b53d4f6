//! Resource exhaustion, bounded: a fork bomb of at most pids-limit + 64
//! short-lived children, all killed and reaped afterwards; a memory hog in
//! a child process that touches up to twice the memory limit before a
//! deadline. Blocked means the kernel stopped it (EAGAIN on fork, the
//! child OOM-killed). These run last.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::{Attempt, Ctx, Probe, errno_name};
use crate::sys;

const CAT: &str = "resources";

/// Children spawned when no pids limit is visible.
const FORK_FALLBACK: u64 = 512;
/// Never more children than this, whatever the limit says.
const FORK_CAP: u64 = 4096;
/// How long the memory hog may take.
const MEMORY_DEADLINE: Duration = Duration::from_secs(30);

/// The resource probes.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "resource-fork-bomb",
            CAT,
            false,
            "spawn up to pids.max (where the cgroup is not visible, as in gVisor: RLIMIT_NPROC) + 64 sleeping children (all killed and reaped after): blocked when a spawn fails with EAGAIN before that",
            fork_bomb,
        ),
        Probe::new(
            "resource-memory",
            CAT,
            false,
            "a child touches up to 2x memory.max (in a gVisor box, whose cgroup is not visible inside: 2x MemTotal, which gVisor sets to it) before a deadline: blocked when it is OOM-killed or its allocation fails",
            |c| memory(c.config.isolation == "gvisor"),
        ),
    ]
}

/// The pids limit: the cgroup's, or in a gVisor box (`gvisor`), whose
/// cgroup is not visible inside, `RLIMIT_NPROC`, where gVisor enforces it.
fn pids_limit(gvisor: bool) -> Result<Option<u64>, String> {
    sys::cgroup_limit(&["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"]).or_else(
        |cgroup| {
            if !gvisor {
                return Err(cgroup);
            }
            match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC) {
                Ok((soft, _)) if soft != nix::sys::resource::RLIM_INFINITY => Ok(Some(soft)),
                _ => Err(format!("{cgroup}; no RLIMIT_NPROC either")),
            }
        },
    )
}

/// The memory limit: the cgroup's, or in a gVisor box (`gvisor`), whose
/// cgroup is not visible inside, MemTotal, which gVisor sets to it.
fn memory_limit(gvisor: bool) -> Result<Option<u64>, String> {
    sys::cgroup_limit(&[
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ])
    .or_else(|cgroup| {
        if !gvisor {
            return Err(cgroup);
        }
        let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(|e| e.to_string())?;
        mem_total(&meminfo)
            .map(Some)
            .ok_or_else(|| format!("{cgroup}; no MemTotal in /proc/meminfo"))
    })
}

/// MemTotal of a `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn fork_bomb(c: &Ctx) -> Attempt {
    let limit = pids_limit(c.config.isolation == "gvisor");
    let n = match &limit {
        Ok(Some(l)) => (l + 64).min(FORK_CAP),
        _ => FORK_FALLBACK,
    };
    // Long enough to hold every child at once, short enough that a child
    // we failed to kill still goes away by itself.
    let sleep_ms = (c.timeout.as_millis() * 10)
        .clamp(5_000, 60_000)
        .to_string();
    let started = Instant::now();
    let mut children: Vec<Child> = Vec::new();
    let mut failure = None;
    for _ in 0..n {
        let spawned = sys::helper(&["sleep", &sleep_ms])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(ch) => children.push(ch),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    let count = children.len();
    for ch in &mut children {
        let _ = ch.kill();
    }
    for ch in &mut children {
        let _ = ch.wait();
    }
    let limit_s = match &limit {
        Ok(Some(l)) => format!("pids.max {l}"),
        Ok(None) => "pids.max max (no limit)".into(),
        Err(e) => format!("no pids limit visible ({e})"),
    };
    match failure {
        Some(e) if e.raw_os_error() == Some(libc::EAGAIN) => Attempt::blocked(format!(
            "{limit_s}: spawn {} failed with {} (all {count} children reaped)",
            count + 1,
            errno_name(&e)
        )),
        Some(e) => Attempt::blocked(format!(
            "{limit_s}: spawn {} failed: {} (all {count} children reaped)",
            count + 1,
            errno_name(&e)
        )),
        None if count as u64 >= n => Attempt::reached(format!(
            "{limit_s}: all {count} children ran at once (reaped)"
        )),
        None => Attempt::error(format!(
            "{limit_s}: stopped at {count} of {n} children on the time bound, not the kernel"
        )),
    }
}

fn memory(gvisor: bool) -> Attempt {
    let limit = match memory_limit(gvisor) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Attempt::reached("memory.max is max: no memory limit (nothing allocated)");
        }
        Err(e) => {
            return Attempt::error(format!(
                "no memory limit visible ({e}); not allocating blind"
            ));
        }
    };
    let target = limit.saturating_mul(2);
    let child = sys::helper(&[
        "alloc",
        &target.to_string(),
        &MEMORY_DEADLINE.as_millis().to_string(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn();
    let mut child = match child {
        Ok(ch) => ch,
        Err(e) => return Attempt::error(format!("could not spawn the hog: {}", errno_name(&e))),
    };
    let deadline = Instant::now() + MEMORY_DEADLINE + Duration::from_secs(5);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut report = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let report = report
        .lines()
        .last()
        .unwrap_or("nothing")
        .trim()
        .to_string();
    match status {
        None => Attempt::blocked(format!(
            "limit {limit}: the hog made no progress to {target} bytes before the deadline and was killed"
        )),
        Some(st) if st.signal() == Some(libc::SIGKILL) => Attempt::blocked(format!(
            "limit {limit}: the hog was killed (OOM) on its way to {target} bytes; last report: {report}"
        )),
        Some(st) if st.success() => Attempt::reached(format!(
            "limit {limit}: the hog touched {target} bytes and exited: {report}"
        )),
        Some(st) => Attempt::blocked(format!(
            "limit {limit}: the hog stopped ({st}) before {target} bytes: {report}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        assert_eq!(
            mem_total("MemTotal:         393216 kB\nMemFree: 1 kB\n"),
            Some(393216 * 1024)
        );
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }
}
