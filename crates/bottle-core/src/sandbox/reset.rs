//! Verified reset: the golden snapshot taken at launch, the revert to it,
//! and the check of the result against three independent sources.
//!
//! A backend supplies the mechanics ([`ResetSubstrate`]: snapshot, revert,
//! halt, and one reading per source); the protocol is here, one definition
//! for every backend:
//!
//! 1. [`record_golden`] (at launch, after provisioning): snapshot, then read
//!    the three sources and keep them as the baseline.
//! 2. [`reset`]: revert, read the three sources again, compare each with its
//!    baseline. Any one that differs, cannot be read, or has no baseline
//!    halts the bottle. There is no quorum: the threat model is a substrate
//!    that lies, and an attacker may control two of the three sources.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;
use crate::sandbox::audit::{self, SandboxRecord};
use crate::sandbox::error::SandboxError;
use crate::sandbox::shown;

/// The three sources a reset is verified against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A content hash of the box's writable state (the container's upper
    /// layer, the VM's overlay disk).
    Filesystem,
    /// The count of open descriptors of the box's processes.
    OpenFds,
    /// The engine's or VMM's own view of the box: running, image or
    /// snapshot, networks, limits.
    Engine,
}

impl Source {
    /// Every source, in the order they are reported.
    pub const ALL: [Source; 3] = [Source::Filesystem, Source::OpenFds, Source::Engine];

    /// The name used in reports and the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Filesystem => "filesystem",
            Source::OpenFds => "open_fds",
            Source::Engine => "engine",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a revert returned the box to its golden snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevertMethod {
    /// The box itself was stopped, restored and started again (a
    /// container's layer swapped while it was down, a microVM's disks).
    Restart,
    /// A standby box, prepared from the snapshot in the background and
    /// verified, took the old box's place; the old box was paused and cut
    /// off its network first.
    Standby,
}

impl RevertMethod {
    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RevertMethod::Restart => "restart",
            RevertMethod::Standby => "standby",
        }
    }
}

/// What the three sources said at snapshot time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// The bottle it belongs to.
    pub bottle: String,
    /// RFC 3339 time it was recorded.
    pub recorded: String,
    /// The filesystem source's hash, `sha256:<hex>`.
    pub fs_hash: String,
    /// The open-descriptor source's count.
    pub open_fds: u64,
    /// The engine source's facts, by name.
    pub engine: BTreeMap<String, String>,
}

/// How a backend snapshots, reverts, halts and reads a box.
pub trait ResetSubstrate {
    /// The bottle's name.
    fn bottle(&self) -> &str;

    /// Keeps the box's current writable state as its golden snapshot.
    fn snapshot(&self) -> Result<(), BackendError>;

    /// Returns the box to the golden snapshot: every process of the box
    /// ended (or, with a standby, frozen and cut off its network for good),
    /// the writable state restored, the box running again with nothing of
    /// the agent in it. The bundle, network, CA and audit log are not
    /// touched. Says how.
    fn revert(&self) -> Result<RevertMethod, BackendError>;

    /// The filesystem source: `sha256:<hex>` over the writable state.
    fn read_fs_hash(&self) -> Result<String, BackendError>;

    /// The open-descriptor source.
    fn read_open_fds(&self) -> Result<u64, BackendError>;

    /// The engine source: facts by name (`state`, `image`, `networks`,
    /// limits), each compared as text.
    fn read_engine(&self) -> Result<BTreeMap<String, String>, BackendError>;

    /// Stops the box without removing it, so it can be inspected.
    fn halt(&self) -> Result<(), BackendError>;
}

/// Where a bottle keeps its golden snapshot's records, in its state dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetFiles {
    /// The bottle's state dir.
    pub state_dir: PathBuf,
}

impl ResetFiles {
    /// The files of the bottle whose state dir is `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> ResetFiles {
        ResetFiles {
            state_dir: state_dir.into(),
        }
    }

    /// The directory a backend keeps its snapshot data in.
    pub fn golden_dir(&self) -> PathBuf {
        self.state_dir.join("golden")
    }

    /// The recorded baseline.
    pub fn baseline(&self) -> PathBuf {
        self.golden_dir().join("baseline.json")
    }

    /// Present once a reset halted the bottle: why, and when.
    pub fn halted(&self) -> PathBuf {
        self.state_dir.join("halted.json")
    }

    /// The bottle's audit log.
    pub fn audit_log(&self) -> PathBuf {
        self.state_dir
            .join(crate::audit_files::AUDIT_LOG_DIR)
            .join(crate::audit_files::AUDIT_LOG_FILE)
    }
}

/// Why and when a bottle was halted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltRecord {
    /// RFC 3339 time of the halt.
    pub time: String,
    /// What diverged or failed, one line.
    pub reason: String,
}

/// Whether (and why) a reset halted the bottle whose files are `files`.
pub fn halted(files: &ResetFiles) -> Option<HaltRecord> {
    let text = std::fs::read(files.halted()).ok()?;
    serde_json::from_slice(&text).ok()
}

/// One source's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCheck {
    /// The source.
    pub source: Source,
    /// Its baseline, as text (`none recorded` when there is none).
    pub expected: String,
    /// What it says now, as text (`unreadable: …` when it could not be read).
    pub observed: String,
    /// Whether the two agree.
    pub matched: bool,
}

/// What a reset did and found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetReport {
    /// The bottle.
    pub bottle: String,
    /// One verdict per source, in [`Source::ALL`] order.
    pub checks: Vec<SourceCheck>,
    /// Whether every source agreed with its baseline.
    pub verified: bool,
    /// How the box was reverted.
    pub method: RevertMethod,
    /// Time spent reverting.
    #[serde(with = "crate::sandbox::call::duration_ms")]
    pub revert: Duration,
    /// Time spent reading and comparing the sources.
    #[serde(with = "crate::sandbox::call::duration_ms")]
    pub verify: Duration,
}

impl ResetReport {
    /// The diverged sources with both values, for one line of text.
    pub fn divergence_summary(&self) -> String {
        divergence(&self.checks)
    }

    fn diverged_sources(&self) -> String {
        self.checks
            .iter()
            .filter(|check| !check.matched)
            .map(|check| check.source.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The checks among `checks` that failed, each with both values, as one
/// line (`source: expected …, observed …; …`); empty when all matched.
pub fn divergence(checks: &[SourceCheck]) -> String {
    checks
        .iter()
        .filter(|check| !check.matched)
        .map(|check| {
            format!(
                "{}: expected {}, observed {}",
                check.source, check.expected, check.observed
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Takes the golden snapshot and records the three sources as its baseline
/// (written last, so a snapshot without a complete baseline has none).
pub fn record_golden(
    substrate: &dyn ResetSubstrate,
    files: &ResetFiles,
) -> Result<Baseline, SandboxError> {
    let failed = |why: String| {
        SandboxError::NotAvailable {
        bottle: substrate.bottle().to_string(),
        what: "reset".into(),
        why,
        fix: "reset needs the golden snapshot taken at launch; stop the bottle and start it again, and see `bottle doctor`".into(),
    }
    };
    let _ = std::fs::remove_file(files.baseline());
    std::fs::create_dir_all(files.golden_dir()).map_err(|err| {
        failed(format!(
            "cannot create {}: {err}",
            files.golden_dir().display()
        ))
    })?;
    substrate
        .snapshot()
        .map_err(|err| failed(format!("taking the snapshot failed: {err}")))?;
    let baseline = Baseline {
        bottle: substrate.bottle().to_string(),
        recorded: crate::time::now_rfc3339_millis(),
        fs_hash: substrate
            .read_fs_hash()
            .map_err(|err| failed(format!("hashing the filesystem failed: {err}")))?,
        open_fds: substrate
            .read_open_fds()
            .map_err(|err| failed(format!("counting open descriptors failed: {err}")))?,
        engine: substrate
            .read_engine()
            .map_err(|err| failed(format!("reading the engine's state failed: {err}")))?,
    };
    let json = serde_json::to_vec_pretty(&baseline)
        .map_err(|err| failed(format!("cannot encode the baseline: {err}")))?;
    write_atomically(&files.baseline(), &json).map_err(|err| {
        failed(format!(
            "cannot write {}: {err}",
            files.baseline().display()
        ))
    })?;
    Ok(baseline)
}

/// Reverts the box to its golden snapshot and verifies the revert; any
/// failure or divergence halts the bottle ([`SandboxError::Reset`],
/// [`SandboxError::ResetDivergence`]).
pub fn reset(
    substrate: &dyn ResetSubstrate,
    files: &ResetFiles,
) -> Result<ResetReport, SandboxError> {
    let bottle = substrate.bottle().to_string();
    let started = Instant::now();
    if let Some(halt) = halted(files) {
        return Err(SandboxError::Reset {
            bottle,
            why: format!("it was halted at {}: {}", halt.time, halt.reason),
        });
    }
    let baseline = load_baseline(files);
    let method = match substrate.revert() {
        Ok(method) => method,
        Err(err) => {
            let why = format!(
                "reverting to the golden snapshot failed: {}",
                shown(&err.to_string())
            );
            halt(substrate, files, &why, started.elapsed());
            return Err(SandboxError::Reset { bottle, why });
        }
    };
    let revert = started.elapsed();
    let checks = verify(substrate, baseline.as_ref(), &Source::ALL);
    let report = ResetReport {
        bottle: bottle.clone(),
        verified: checks.iter().all(|check| check.matched),
        checks,
        method,
        revert,
        verify: started.elapsed() - revert,
    };
    if !report.verified {
        let why = format!("diverged:{}", report.diverged_sources());
        halt(
            substrate,
            files,
            &format!("{why}: {}", report.divergence_summary()),
            started.elapsed(),
        );
        return Err(SandboxError::ResetDivergence {
            report: Box::new(report),
        });
    }
    let _ = audit::append(
        &files.audit_log(),
        &SandboxRecord::reset(&bottle, "verified", false, started.elapsed()),
    );
    Ok(report)
}

/// Reads `sources` of a box that was not reverted and compares each with
/// the baseline recorded at its golden snapshot, without halting anything:
/// a warm pool's entry is checked this way before it is handed out, and
/// discarded by its caller if any check fails. (A microVM's disks cannot be
/// read while it runs, so its claim asks for the other two.)
pub fn check_against_baseline(
    substrate: &dyn ResetSubstrate,
    files: &ResetFiles,
    sources: &[Source],
) -> Vec<SourceCheck> {
    verify(substrate, load_baseline(files).as_ref(), sources)
}

/// Reads each of `sources` and compares it with the baseline, in
/// [`Source::ALL`] order. A missing baseline or an unreadable source is a
/// divergence, never a pass.
fn verify(
    substrate: &dyn ResetSubstrate,
    baseline: Option<&Baseline>,
    sources: &[Source],
) -> Vec<SourceCheck> {
    const NONE: &str = "none recorded";
    let unreadable = |err: BackendError| format!("unreadable: {}", shown(&err.to_string()));
    let check = |source, expected: Option<String>, observed: Result<String, String>| {
        let matched = matches!((&expected, &observed), (Some(e), Ok(o)) if e == o);
        SourceCheck {
            source,
            expected: expected.unwrap_or_else(|| NONE.into()),
            observed: observed.unwrap_or_else(|err| err),
            matched,
        }
    };
    Source::ALL
        .into_iter()
        .filter(|source| sources.contains(source))
        .map(|source| match source {
            Source::Filesystem => check(
                source,
                baseline.map(|b| b.fs_hash.clone()),
                substrate.read_fs_hash().map_err(unreadable),
            ),
            Source::OpenFds => check(
                source,
                baseline.map(|b| b.open_fds.to_string()),
                substrate
                    .read_open_fds()
                    .map(|n| n.to_string())
                    .map_err(unreadable),
            ),
            // The engine's facts are compared one by one, so the report
            // names the fact that changed rather than two long maps.
            Source::Engine => match (baseline, substrate.read_engine().map_err(unreadable)) {
                (Some(baseline), Ok(observed)) => engine_check(&baseline.engine, &observed),
                (baseline, observed) => check(
                    source,
                    baseline.map(|b| facts(&b.engine)),
                    observed.map(|o| facts(&o)),
                ),
            },
        })
        .collect()
}

/// The Engine source's check of `observed` facts against `expected`: on a
/// mismatch, only the facts that differ, the observed ones made safe to
/// show. A backend checking a box before it serves (a standby) words its
/// refusal with it, as a reset words a divergence.
pub fn engine_check(
    expected: &BTreeMap<String, String>,
    observed: &BTreeMap<String, String>,
) -> SourceCheck {
    let mut keys: Vec<&String> = expected.keys().chain(observed.keys()).collect();
    keys.sort();
    keys.dedup();
    let differing: Vec<&String> = keys
        .into_iter()
        .filter(|key| expected.get(*key) != observed.get(*key))
        .collect();
    let pick = |map: &BTreeMap<String, String>| {
        differing
            .iter()
            .map(|key| format!("{key}={}", map.get(*key).map_or("(none)", String::as_str)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if differing.is_empty() {
        SourceCheck {
            source: Source::Engine,
            expected: facts(expected),
            observed: facts(observed),
            matched: true,
        }
    } else {
        SourceCheck {
            source: Source::Engine,
            expected: pick(expected),
            observed: shown(&pick(observed)),
            matched: false,
        }
    }
}

fn facts(map: &BTreeMap<String, String>) -> String {
    shown(
        &map.iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn load_baseline(files: &ResetFiles) -> Option<Baseline> {
    let text = std::fs::read(files.baseline()).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Stops the box, marks it halted and audits why. Failures here cannot be
/// reported better than the divergence that caused them, so the marker is
/// written even when stopping the box failed (and says so).
fn halt(substrate: &dyn ResetSubstrate, files: &ResetFiles, why: &str, elapsed: Duration) {
    let stopped = substrate.halt();
    let reason = match &stopped {
        Ok(()) => why.to_string(),
        Err(err) => format!(
            "{why} (and stopping it failed: {})",
            shown(&err.to_string())
        ),
    };
    let record = HaltRecord {
        time: crate::time::now_rfc3339_millis(),
        reason: reason.clone(),
    };
    if let Ok(json) = serde_json::to_vec_pretty(&record) {
        let _ = write_atomically(&files.halted(), &json);
    }
    let _ = audit::append(
        &files.audit_log(),
        &SandboxRecord::reset(substrate.bottle(), &reason, true, elapsed),
    );
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    std::fs::write(&temp, bytes)?;
    std::fs::rename(&temp, path)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::backend::BackendErrorKind;

    /// A box whose three readings the test sets, and which records what
    /// was done to it.
    struct FakeBox {
        fs: RefCell<Result<String, String>>,
        fds: RefCell<u64>,
        engine: RefCell<BTreeMap<String, String>>,
        revert_fails: bool,
        log: RefCell<Vec<&'static str>>,
    }

    impl FakeBox {
        fn new() -> FakeBox {
            FakeBox {
                fs: RefCell::new(Ok("sha256:golden".into())),
                fds: RefCell::new(7),
                engine: RefCell::new(BTreeMap::from([
                    ("state".into(), "running".into()),
                    ("networks".into(), "bot-bottle-x=10.0.0.3".into()),
                ])),
                revert_fails: false,
                log: RefCell::new(Vec::new()),
            }
        }
    }

    fn failed(message: &str) -> BackendError {
        BackendError::new(BackendErrorKind::Failed, "BOT-T000", message, "")
    }

    impl ResetSubstrate for FakeBox {
        fn bottle(&self) -> &str {
            "bot-bottle-x"
        }
        fn snapshot(&self) -> Result<(), BackendError> {
            self.log.borrow_mut().push("snapshot");
            Ok(())
        }
        fn revert(&self) -> Result<RevertMethod, BackendError> {
            self.log.borrow_mut().push("revert");
            if self.revert_fails {
                return Err(failed("the engine refused to start the box"));
            }
            Ok(RevertMethod::Restart)
        }
        fn read_fs_hash(&self) -> Result<String, BackendError> {
            self.fs.borrow().clone().map_err(|e| failed(&e))
        }
        fn read_open_fds(&self) -> Result<u64, BackendError> {
            Ok(*self.fds.borrow())
        }
        fn read_engine(&self) -> Result<BTreeMap<String, String>, BackendError> {
            Ok(self.engine.borrow().clone())
        }
        fn halt(&self) -> Result<(), BackendError> {
            self.log.borrow_mut().push("halt");
            Ok(())
        }
    }

    fn files() -> (tempfile::TempDir, ResetFiles) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        let files = ResetFiles::new(dir.path());
        (dir, files)
    }

    fn audit_reasons(files: &ResetFiles) -> Vec<String> {
        std::fs::read_to_string(files.audit_log())
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_reset_that_matches_every_baseline_passes() {
        let (_dir, files) = files();
        let fake = FakeBox::new();
        record_golden(&fake, &files).unwrap();
        let report = reset(&fake, &files).unwrap();
        assert!(report.verified);
        assert_eq!(report.checks.len(), 3);
        assert!(halted(&files).is_none());
        assert_eq!(*fake.log.borrow(), ["snapshot", "revert"]);
        assert_eq!(audit_reasons(&files), ["verified"]);
    }

    #[test]
    fn a_check_reads_only_the_sources_asked_for_and_halts_nothing() {
        let (_dir, files) = files();
        let fake = FakeBox::new();
        record_golden(&fake, &files).unwrap();
        // A running microVM's disks cannot be read: its claim does not ask.
        *fake.fs.borrow_mut() = Err("the machine runs".into());
        let checks = check_against_baseline(&fake, &files, &[Source::Engine, Source::OpenFds]);
        let sources: Vec<Source> = checks.iter().map(|c| c.source).collect();
        assert_eq!(sources, [Source::OpenFds, Source::Engine]);
        assert!(checks.iter().all(|c| c.matched), "{checks:?}");
        *fake.fds.borrow_mut() = 8;
        let checks = check_against_baseline(&fake, &files, &Source::ALL);
        let diverged: Vec<Source> = checks
            .iter()
            .filter(|c| !c.matched)
            .map(|c| c.source)
            .collect();
        assert_eq!(diverged, [Source::Filesystem, Source::OpenFds]);
        assert!(halted(&files).is_none());
        assert_eq!(*fake.log.borrow(), ["snapshot"]);
    }

    fn assert_halted(fake: &FakeBox, files: &ResetFiles, source: Source) -> ResetReport {
        let err = reset(fake, files).unwrap_err();
        assert_eq!(crate::Coded::code(&err), "BOT-X006");
        assert_eq!(err.exit_code(), 5);
        let SandboxError::ResetDivergence { report } = err else {
            panic!("not a divergence")
        };
        assert!(!report.verified);
        let diverged: Vec<Source> = report
            .checks
            .iter()
            .filter(|c| !c.matched)
            .map(|c| c.source)
            .collect();
        assert_eq!(diverged, [source], "{report:?}");
        assert_eq!(fake.log.borrow().last(), Some(&"halt"));
        let halt = halted(files).expect("the halt is recorded");
        assert!(halt.reason.contains(source.as_str()), "{}", halt.reason);
        assert!(
            audit_reasons(files)
                .last()
                .unwrap()
                .starts_with("diverged:")
        );
        // A halted bottle is never reset again.
        let again = reset(fake, files).unwrap_err();
        assert_eq!(crate::Coded::code(&again), "BOT-X005");
        *report
    }

    #[test]
    fn each_lying_source_alone_halts_the_bottle() {
        for source in Source::ALL {
            let (_dir, files) = files();
            let fake = FakeBox::new();
            record_golden(&fake, &files).unwrap();
            match source {
                Source::Filesystem => *fake.fs.borrow_mut() = Ok("sha256:planted".into()),
                Source::OpenFds => *fake.fds.borrow_mut() = 8,
                Source::Engine => {
                    fake.engine.borrow_mut().insert(
                        "networks".into(),
                        "bot-bottle-x=10.0.0.3 bridge=172.17.0.9".into(),
                    );
                }
            }
            let report = assert_halted(&fake, &files, source);
            let check = report.checks.iter().find(|c| c.source == source).unwrap();
            if source == Source::Engine {
                assert_eq!(check.expected, "networks=bot-bottle-x=10.0.0.3");
                assert_eq!(
                    check.observed,
                    "networks=bot-bottle-x=10.0.0.3 bridge=172.17.0.9"
                );
            }
        }
    }

    #[test]
    fn an_unreadable_source_is_a_divergence() {
        let (_dir, files) = files();
        let fake = FakeBox::new();
        record_golden(&fake, &files).unwrap();
        *fake.fs.borrow_mut() = Err("permission denied".into());
        let report = assert_halted(&fake, &files, Source::Filesystem);
        assert!(
            report.checks[0]
                .observed
                .starts_with("unreadable: permission denied")
        );
    }

    #[test]
    fn a_baseline_never_recorded_is_not_a_pass() {
        let (_dir, files) = files();
        let fake = FakeBox::new();
        let err = reset(&fake, &files).unwrap_err();
        let SandboxError::ResetDivergence { report } = err else {
            panic!("not a divergence")
        };
        assert!(
            report
                .checks
                .iter()
                .all(|c| !c.matched && c.expected == "none recorded")
        );
        assert!(halted(&files).is_some());
    }

    #[test]
    fn a_failed_revert_halts_the_bottle() {
        let (_dir, files) = files();
        let mut fake = FakeBox::new();
        record_golden(&fake, &files).unwrap();
        fake.revert_fails = true;
        let err = reset(&fake, &files).unwrap_err();
        assert_eq!(crate::Coded::code(&err), "BOT-X005");
        assert_eq!(err.exit_code(), 5);
        assert_eq!(fake.log.borrow().last(), Some(&"halt"));
        assert!(
            halted(&files)
                .unwrap()
                .reason
                .contains("the engine refused")
        );
    }
}
