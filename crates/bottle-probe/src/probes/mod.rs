//! The probe catalogue and the loop that runs it.
//!
//! Every probe is a named, bounded attempt that returns an [`Attempt`]:
//! `reached` when the escape worked, `blocked` when it was refused, `error`
//! when the probe could not even try. The order is fixed: the audit flood
//! runs after every other probe of the proxy, and the resource
//! probes (fork bomb, memory) run last so that whatever they leave behind
//! cannot spoil the others.

mod audit;
mod copy;
mod dns;
mod filesystem;
mod git;
mod kernel;
mod network;
mod operator;
mod ports;
mod privilege;
mod proxy;
mod resources;
mod secrets;
mod toolbox;

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::contract::{Outcome, ProbeConfig, ProbeResult};

/// What the probe process looked like when it started, captured before it
/// opened anything itself: inherited descriptors and working directory are
/// what a runtime leaks across `exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Startup {
    /// Descriptors above 2 open at start, with their `/proc/self/fd` link.
    pub fds: Vec<(i32, String)>,
    /// The `/proc/self/cwd` link at start (`None`: unreadable).
    pub cwd: Option<String>,
    /// Whether `/proc/self/cwd` resolved to the same inode as `getcwd()`.
    pub cwd_consistent: Option<bool>,
}

impl Startup {
    /// Captures the inherited state. Call first thing in `main`.
    pub fn capture() -> Self {
        let mut fds = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            for entry in dir.flatten() {
                let Some(fd) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<i32>().ok())
                else {
                    continue;
                };
                if fd <= 2 {
                    continue;
                }
                let link = std::fs::read_link(entry.path())
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|e| format!("<unreadable: {e}>"));
                // The directory handle read_dir itself holds.
                if link.starts_with("/proc/") && link.ends_with("/fd") {
                    continue;
                }
                fds.push((fd, link));
            }
        }
        fds.sort();
        let cwd = std::fs::read_link("/proc/self/cwd")
            .ok()
            .map(|p| p.display().to_string());
        let cwd_consistent = crate::sys::cwd_consistent();
        Self {
            fds,
            cwd,
            cwd_consistent,
        }
    }
}

/// Everything a probe may look at.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The harness's config.
    pub config: ProbeConfig,
    /// The per-attempt bound.
    pub timeout: Duration,
    /// The inherited state.
    pub startup: Startup,
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The verdict.
    pub outcome: Outcome,
    /// What happened, for the report.
    pub observed: String,
    /// The probe had nothing to aim at (an optional target is empty). In a
    /// bottle it is reported as blocked with the reason; in a control run
    /// it is left out.
    pub skipped: bool,
}

impl Attempt {
    /// The escape was refused.
    pub fn blocked(observed: impl Into<String>) -> Self {
        Self::new(Outcome::Blocked, observed)
    }
    /// The escape worked.
    pub fn reached(observed: impl Into<String>) -> Self {
        Self::new(Outcome::Reached, observed)
    }
    /// The probe could not try.
    pub fn error(observed: impl Into<String>) -> Self {
        Self::new(Outcome::Error, observed)
    }
    /// Nothing to aim at.
    pub fn skipped(why: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::Blocked,
            observed: format!("skipped: {}", why.into()),
            skipped: true,
        }
    }
    fn new(outcome: Outcome, observed: impl Into<String>) -> Self {
        Self {
            outcome,
            observed: observed.into(),
            skipped: false,
        }
    }
}

type RunFn = Box<dyn Fn(&Ctx) -> Attempt>;

/// One named probe.
pub struct Probe {
    /// Stable name.
    pub name: String,
    /// Category (`network`, `dns`, ...).
    pub category: &'static str,
    /// What is attempted and what counts as blocked.
    pub expected: String,
    /// A network probe: runs in the control, where reaching is expected.
    pub network: bool,
    run: RunFn,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("name", &self.name)
            .field("category", &self.category)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

impl Probe {
    pub(crate) fn new(
        name: impl Into<String>,
        category: &'static str,
        network: bool,
        expected: impl Into<String>,
        run: impl Fn(&Ctx) -> Attempt + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            category,
            expected: expected.into(),
            network,
            run: Box::new(run),
        }
    }

    /// Runs the probe; a panic becomes an `error` outcome.
    pub fn run(&self, ctx: &Ctx) -> Attempt {
        match catch_unwind(AssertUnwindSafe(|| (self.run)(ctx))) {
            Ok(a) => a,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into());
                Attempt::error(format!("the probe panicked: {msg}"))
            }
        }
    }
}

/// Every probe for this config, in run order (resources last).
pub fn catalogue(config: &ProbeConfig) -> Vec<Probe> {
    let mut all = Vec::new();
    all.extend(network::probes());
    all.extend(ports::probes());
    all.extend(dns::probes());
    all.extend(proxy::probes(config));
    all.extend(filesystem::probes());
    all.extend(kernel::probes());
    all.extend(privilege::probes());
    all.extend(toolbox::probes());
    all.extend(secrets::probes());
    all.extend(operator::probes());
    all.extend(copy::probes());
    all.extend(git::probes());
    all.extend(audit::probes());
    all.extend(resources::probes());
    all
}

/// The probes this config selects: `only` by name less `skip`, and in a
/// control run only the network probes.
pub fn select(config: &ProbeConfig) -> Vec<Probe> {
    catalogue(config)
        .into_iter()
        .filter(|p| !config.control || p.network)
        .filter(|p| config.only.is_empty() || config.only.contains(&p.name))
        .filter(|p| !config.skip.contains(&p.name))
        .collect()
}

/// Runs the selected probes, one JSON line each, flushed as it goes. A
/// name in `only` that matches no probe gets an `error` line, so a typo in
/// the harness cannot pass silently.
pub fn run(config: &ProbeConfig, startup: Startup, out: &mut dyn Write) -> std::io::Result<usize> {
    let ctx = Ctx {
        config: config.clone(),
        timeout: Duration::from_millis(config.timeout_ms.max(1)),
        startup,
    };
    let all = catalogue(config);
    let mut written = 0;
    for name in &config.only {
        if !all.iter().any(|p| p.name == *name) {
            let r = ProbeResult {
                probe: name.clone(),
                category: "unknown".into(),
                expected: "a probe of this name".into(),
                outcome: Outcome::Error,
                observed: "no probe has this name".into(),
                network: false,
            };
            emit(out, &r)?;
            written += 1;
        }
    }
    drop(all);
    for probe in select(config) {
        let a = probe.run(&ctx);
        if a.skipped && config.control {
            continue;
        }
        let r = ProbeResult {
            probe: probe.name.clone(),
            category: probe.category.to_string(),
            expected: probe.expected.clone(),
            outcome: a.outcome,
            observed: a.observed,
            network: probe.network,
        };
        emit(out, &r)?;
        written += 1;
    }
    Ok(written)
}

fn emit(out: &mut dyn Write, r: &ProbeResult) -> std::io::Result<()> {
    let line = serde_json::to_string(r).map_err(std::io::Error::other)?;
    writeln!(out, "{line}")?;
    out.flush()
}

/// Shortens what a peer sent for the report: printable ASCII, bounded.
pub(crate) fn snippet(bytes: &[u8]) -> String {
    let max = 160;
    let mut s: String = bytes
        .iter()
        .take(max)
        .map(|&b| match b {
            b'\r' => ' ',
            b'\n' => '|',
            0x20..=0x7e => b as char,
            _ => '.',
        })
        .collect();
    if bytes.len() > max {
        s.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    s
}

/// Whether `hay` contains `needle` (an empty needle never matches: a
/// config without a token cannot make everything "reached").
pub(crate) fn contains(hay: &[u8], needle: &str) -> bool {
    let n = needle.as_bytes();
    !n.is_empty() && hay.windows(n.len()).any(|w| w == n)
}

/// `errno` of an I/O error, as its symbolic name when known.
pub(crate) fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let errno = nix::errno::Errno::from_raw(code);
            format!("{errno:?}: {}", errno.desc())
        }
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_needs_a_non_empty_needle() {
        assert!(contains(b"abc token def", "token"));
        assert!(!contains(b"abc", ""));
        assert!(!contains(b"tok", "token"));
    }

    #[test]
    fn snippet_is_printable_and_bounded() {
        let s = snippet(b"HTTP/1.1 200 OK\r\n\x00x");
        assert_eq!(s, "HTTP/1.1 200 OK |.x");
        let long = vec![b'a'; 500];
        assert!(snippet(&long).ends_with("... (500 bytes)"));
    }
}
