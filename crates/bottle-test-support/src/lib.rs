//! Helpers every crate's tests share, so each rule lives in one place:
//!
//! - [`RecordingRunner`]: a [`CommandRunner`] that records what it was asked
//!   to run and answers from a script, failures included;
//! - [`require_docker`] / [`skip_docker_test`]: a test that needs Docker
//!   prints a skip line without it, or fails under `BOTTLE_REQUIRE_DOCKER=1`
//!   (set by CI);
//! - [`wait_until`] / [`wait_for`] / [`eventually`] (and async twins
//!   behind the `tokio` feature): wait for a condition with a bound,
//!   instead of sleeping and hoping it has happened;
//! - [`temp_state_root`]: a private state root per test;
//! - `corp_net` (feature `corp-net`): a TLS-re-signing "corporate
//!   network" and the HTTPS upstreams behind it, for end-to-end tests;
//! - [`forge`]: the forged-tool-result attack an agent runs against its
//!   in-box agent, for the docker and smolmachines tests;
//! - [`mod@bench`]: the `docker` baseline and table rows the Docker-backed
//!   benches share;
//! - `fuzz` (feature `fuzz`): the seeded fuzz campaign against the real
//!   `bottle-bundle` binary, shared by its test and `cargo xtask fuzz`;
//! - `secret_corpus` (feature `secret-corpus`): credentials generated from
//!   their published shapes and placed in requests, realistic benign
//!   traffic, and the recall and false-positive tally of a scanner over
//!   them, shared by bottle-bundle's scanner bench and its quality test.
//!
//! A dev-dependency only: nothing here ships.

pub mod bench;
#[cfg(feature = "corp-net")]
pub mod corp_net;
pub mod forge;
#[cfg(feature = "fuzz")]
pub mod fuzz;
#[cfg(any(feature = "fuzz", feature = "secret-corpus"))]
pub mod rng;
#[cfg(feature = "secret-corpus")]
pub mod secret_corpus;

use std::fmt::Display;
use std::io;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec, PipedChild};

/// How often a bounded wait checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `cond` until it holds; panics, naming `what`, if `limit` passes
/// first.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    assert!(
        eventually(limit, cond),
        "timed out after {limit:?} waiting for {what}"
    );
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held,
/// for a caller that states the failure itself.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Polls `probe` until it returns a value and returns it; panics, naming
/// `what`, if `limit` passes first.
#[track_caller]
pub fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let mut found = None;
    let answered = eventually(limit, || {
        found = probe();
        found.is_some()
    });
    match found {
        Some(value) if answered => value,
        _ => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// [`eventually`] for async tests: sleeps without blocking the runtime.
#[cfg(feature = "tokio")]
pub async fn eventually_async(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`wait_for`] for async tests: sleeps without blocking the runtime.
#[cfg(feature = "tokio")]
pub async fn wait_for_async<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let mut found = None;
    let answered = eventually_async(limit, || {
        found = probe();
        found.is_some()
    })
    .await;
    match found {
        Some(value) if answered => value,
        _ => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// The variable under which a missing Docker (or anything else a Docker
/// test needs) fails the test instead of skipping it.
pub const REQUIRE_DOCKER_ENV: &str = "BOTTLE_REQUIRE_DOCKER";

/// Names the Debian test image, a real agent image (`cargo xtask
/// agent-image` builds it and prints its tag; `cargo xtask test` and
/// `cargo xtask bench` set this).
pub const DEBIAN_IMAGE_ENV: &str = "BOTTLE_TEST_DEBIAN_IMAGE";

/// Whether `BOTTLE_REQUIRE_DOCKER=1`.
pub fn docker_required() -> bool {
    std::env::var(REQUIRE_DOCKER_ENV).is_ok_and(|value| value == "1")
}

/// `test` cannot run here because of `why`: prints a skip line, or panics
/// when Docker is required.
#[track_caller]
#[expect(
    clippy::print_stdout,
    reason = "a skipped test says so in the test output, where cargo test shows it"
)]
pub fn skip_docker_test(test: &str, why: impl Display) {
    assert!(
        !docker_required(),
        "{test}: {why} ({REQUIRE_DOCKER_ENV}=1, so this fails instead of skipping)"
    );
    println!("SKIP {test}: {why}; set {REQUIRE_DOCKER_ENV}=1 to make this a failure");
}

/// The value of a Docker probe, or `None` after [`skip_docker_test`] when it
/// failed.
#[track_caller]
pub fn require_docker<T, E: Display>(test: &str, probe: Result<T, E>) -> Option<T> {
    match probe {
        Ok(value) => Some(value),
        Err(why) => {
            skip_docker_test(test, why);
            None
        }
    }
}

/// The variable under which a daemon without gVisor (the `runsc` runtime)
/// fails the gVisor tests instead of skipping them (CI sets it: its setup
/// registers runsc).
pub const REQUIRE_GVISOR_ENV: &str = "BOTTLE_REQUIRE_GVISOR";

/// Whether `BOTTLE_REQUIRE_GVISOR=1`.
pub fn gvisor_required() -> bool {
    std::env::var(REQUIRE_GVISOR_ENV).is_ok_and(|value| value == "1")
}

/// `test` needs gVisor, which this daemon lacks (`why`): prints a skip
/// line, or panics when gVisor is required.
#[track_caller]
#[expect(
    clippy::print_stdout,
    reason = "a skipped test says so in the test output, where cargo test shows it"
)]
pub fn skip_gvisor_test(test: &str, why: impl Display) {
    assert!(
        !gvisor_required(),
        "{test}: {why} ({REQUIRE_GVISOR_ENV}=1, so this fails instead of skipping)"
    );
    println!("SKIP {test}: {why}; set {REQUIRE_GVISOR_ENV}=1 to make this a failure");
}

/// Whether the daemon behind `DOCKER_HOST` (or the local socket) has a
/// runtime registered as `name`, from `GET /info`: `Err` says why not.
pub fn daemon_has_runtime(name: &str) -> Result<(), String> {
    let endpoint = std::env::var("DOCKER_HOST").unwrap_or_default();
    let socket = endpoint
        .strip_prefix("unix://")
        .unwrap_or("/var/run/docker.sock")
        .to_string();
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|err| format!("cannot reach the docker daemon at {socket}: {err}"))?;
    std::io::Write::write_all(
        &mut stream,
        b"GET /info HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n",
    )
    .map_err(|err| format!("cannot ask the daemon: {err}"))?;
    let mut raw = String::new();
    std::io::Read::read_to_string(&mut stream, &mut raw)
        .map_err(|err| format!("cannot read the daemon's answer: {err}"))?;
    let needle = format!("\"{name}\":{{");
    if raw.contains(&needle) {
        Ok(())
    } else {
        Err(format!(
            "the docker daemon has no `{name}` runtime (.ci/setup registers gVisor's)"
        ))
    }
}

/// A private, empty state root (what `XDG_STATE_HOME` or a backend's state
/// dir points at), removed when dropped.
pub fn temp_state_root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bottle-test-state-")
        .tempdir()
        .unwrap_or_else(|err| panic!("could not create a temp state root: {err}"))
}

type Respond = dyn Fn(&CommandSpec) -> io::Result<CommandOutput> + Send + Sync;

/// A [`CommandRunner`] that records every command it is asked to run and
/// answers from a script: canned output, a non-zero exit, or an injected
/// failure to start.
pub struct RecordingRunner {
    calls: Mutex<Vec<CommandSpec>>,
    respond: Box<Respond>,
}

impl RecordingRunner {
    /// Answers every command with `respond`.
    pub fn with(
        respond: impl Fn(&CommandSpec) -> io::Result<CommandOutput> + Send + Sync + 'static,
    ) -> RecordingRunner {
        RecordingRunner {
            calls: Mutex::new(Vec::new()),
            respond: Box::new(respond),
        }
    }

    /// Every command exits 0 with no output.
    pub fn succeeding() -> RecordingRunner {
        RecordingRunner::printing("")
    }

    /// Every command exits 0 printing `stdout`.
    pub fn printing(stdout: &str) -> RecordingRunner {
        let stdout = stdout.as_bytes().to_vec();
        RecordingRunner::with(move |_| {
            Ok(CommandOutput {
                code: Some(0),
                stdout: stdout.clone(),
                stderr: Vec::new(),
            })
        })
    }

    /// Every command fails to start with `kind` (`NotFound`: the program is
    /// not installed).
    pub fn failing_to_start(kind: io::ErrorKind) -> RecordingRunner {
        RecordingRunner::with(move |spec| {
            Err(io::Error::new(
                kind,
                format!(
                    "{}: injected failure to start",
                    spec.program.to_string_lossy()
                ),
            ))
        })
    }

    /// For code that must run nothing: any command is an error, and
    /// [`RecordingRunner::calls`] shows what was attempted.
    pub fn refusing() -> RecordingRunner {
        RecordingRunner::with(|spec| {
            Err(io::Error::other(format!(
                "this test runs no command, but `{}` was run",
                spec.argv().join(" ")
            )))
        })
    }

    /// The argv of every call so far.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.specs().iter().map(CommandSpec::argv).collect()
    }

    /// Every call so far, in full.
    pub fn specs(&self) -> Vec<CommandSpec> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl CommandRunner for RecordingRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(spec.clone());
        (self.respond)(spec)
    }

    /// Records `spec` like [`CommandRunner::run`]; a scripted failure is
    /// returned, anything else reads as started with PID 1 (never ours).
    fn spawn_detached(&self, spec: &CommandSpec, _log: &std::path::Path) -> io::Result<u32> {
        self.run(spec).map(|_| 1)
    }

    /// Records `spec` like [`CommandRunner::run`]; a scripted failure is
    /// returned, anything else is a child whose stdout is what the script
    /// printed and whose stdin goes nowhere.
    fn spawn_piped(&self, spec: &CommandSpec) -> io::Result<PipedChild> {
        let out = self.run(spec)?;
        Ok(PipedChild::from_streams(
            Box::new(io::sink()),
            Box::new(io::Cursor::new(out.stdout)),
        ))
    }
}

/// A finished process: exit `code`, nothing on stdout, `stderr`.
pub fn exit(code: i32, stderr: &str) -> CommandOutput {
    CommandOutput {
        code: Some(code),
        stdout: Vec::new(),
        stderr: stderr.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_records_and_answers_from_its_script() {
        let runner = RecordingRunner::with(|spec| match spec.args.first() {
            Some(arg) if arg == "ok" => Ok(exit(0, "")),
            _ => Ok(exit(2, "bad")),
        });
        assert!(
            runner
                .run(&CommandSpec::new("tool").arg("ok"))
                .unwrap()
                .success()
        );
        assert_eq!(
            runner
                .run(&CommandSpec::new("tool").arg("no"))
                .unwrap()
                .code,
            Some(2)
        );
        assert_eq!(runner.calls(), [vec!["tool", "ok"], vec!["tool", "no"]]);
    }

    #[test]
    fn injected_start_failures_keep_their_kind() {
        let runner = RecordingRunner::failing_to_start(io::ErrorKind::NotFound);
        let err = runner.run(&CommandSpec::new("smolvm")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("smolvm"), "{err}");
        assert!(
            RecordingRunner::refusing()
                .run(&CommandSpec::new("x"))
                .is_err()
        );
    }

    #[test]
    fn a_wait_returns_as_soon_as_its_condition_holds() {
        let mut polls = 0;
        let value = wait_for("the third poll", Duration::from_secs(10), || {
            polls += 1;
            (polls == 3).then_some(polls)
        });
        assert_eq!(value, 3);
    }

    #[test]
    fn a_wait_past_its_bound_fails_naming_what_it_waited_for() {
        let panic = std::panic::catch_unwind(|| {
            wait_until("never", Duration::from_millis(50), || false);
        })
        .unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(message.contains("waiting for never"), "{message}");
    }

    #[test]
    fn state_roots_are_private_and_empty() {
        let (a, b) = (temp_state_root(), temp_state_root());
        assert_ne!(a.path(), b.path());
        assert_eq!(std::fs::read_dir(a.path()).unwrap().count(), 0);
    }
}
