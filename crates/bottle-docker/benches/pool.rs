//! The warm pool against raw Docker, in one run on the real daemon:
//! `bottle start --yes` of an agent with a pooled bottle waiting (claim,
//! re-check, run a command that prints) until its first output, against
//! `docker run --rm IMAGE true` of the same image, interleaved; a cold
//! `bottle start` of the same agent is the third column's reference. With
//! the demo image and, when `BOTTLE_TEST_DEBIAN_IMAGE` names it, the
//! Debian test image. The
//! refill between iterations (`bottle pool fill`) is not timed, nor is
//! the stop after the first output.
//!
//! It drives the real `bottle` binary: `BOTTLE_CLI_BIN`, else the `bottle`
//! built beside this bench (`cargo build -p bottle-cli` first). `cargo
//! xtask bench` runs it with the static binaries; by hand:
//! `BOTTLE_BUNDLE_BIN=… BOTTLE_TOOLBOX_BIN=… cargo bench --profile dev -p
//! bottle-docker --bench pool [-- --quick]`. Every loop is bounded in
//! count.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bottle_core::BottleBackend as _;
use bottle_docker::{DockerBackend, DockerOptions};
use bottle_test_support::bench::{docker, row, time};

const TAG: &str = "bottle-demo-agent:bench";

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let rounds = if quick { 3 } else { 10 };
    let bundle = bottle_test_support::bench::static_bundle();
    let cli = cli_binary();
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut options = DockerOptions::new(state.path().join("bottle"));
    options.bundle_bin = Some(bundle);
    let backend = DockerBackend::new(options).unwrap();
    backend.preflight().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent");
    backend
        .build_demo_agent(&demo, Path::new("/bin/busybox"), TAG)
        .unwrap();
    // The demo image's agent and, when named, the Debian test image's.
    let mut subjects = vec![("bench", TAG.to_string(), "demo image")];
    if let Some(debian) = bottle_test_support::bench::debian_image() {
        subjects.push(("bench-debian", debian, "Debian image"));
    }
    let manifest = dir.path().join("bottle.toml");
    let agents: String = subjects
        .iter()
        .map(|(agent, image, _)| {
            format!(
                "[agents.{agent}]\nimage = \"{image}\"\ncommand = [\"/bin/echo\", \"first-output\"]\n[agents.{agent}.egress]\nallow = [\"bench.bottle.test\"]\n\n"
            )
        })
        .collect();
    std::fs::write(&manifest, agents).unwrap();
    let bottle = |args: &[&str]| {
        #[expect(
            clippy::disallowed_methods,
            reason = "the bench drives the real `bottle` binary and times its first output"
        )]
        let mut command = std::process::Command::new(&cli);
        command
            .env("XDG_STATE_HOME", state.path())
            .arg("--manifest")
            .arg(&manifest)
            .args(["--backend", "docker", "--yes", "--quiet"])
            .args(args);
        command
    };
    let _drain = Drain(bottle(&["pool", "drain"]));
    // One untimed cold start of each image, so none pays a first load.
    for (agent, image, _) in &subjects {
        assert!(docker(&["run", "--rm", image, "true"]));
        first_output(bottle(&["start", agent, "--name", "warm"]));
    }

    let mut measured: Vec<[Vec<Duration>; 3]> =
        subjects.iter().map(|_| Default::default()).collect();
    for _ in 0..rounds {
        for ((agent, image, _), [claims, colds, raws]) in subjects.iter().zip(&mut measured) {
            let filled = bottle(&["pool", "fill", agent, "1"])
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(filled.success(), "bottle pool fill {agent} failed");
            claims.push(first_output(bottle(&["start", agent])));
            colds.push(first_output(bottle(&["start", agent, "--name", "cold"])));
            raws.push(time(|| {
                assert!(docker(&["run", "--rm", image, "true"]));
            }));
        }
    }
    println!("| measure | bottle p50 (p99) ms | baseline | baseline p50 (p99) ms | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    for ((_, _, label), [claims, colds, raws]) in subjects.iter().zip(&measured) {
        row(
            &format!(
                "start of a pooled bottle, create → first output (claim, re-check, exec), {label}"
            ),
            claims,
            "`docker run --rm IMAGE true`",
            raws,
        );
        row(
            &format!("cold start, create → first output (the same CLI, no pool), {label}"),
            colds,
            "`docker run --rm IMAGE true`",
            raws,
        );
    }
    println!("\nn: {rounds} of each, interleaved");
}

/// Drains the bench's pool however the bench ends.
struct Drain(std::process::Command);

impl Drop for Drain {
    fn drop(&mut self) {
        let _ = self.0.stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// `BOTTLE_CLI_BIN`, else the `bottle` in this bench's target directory.
fn cli_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BOTTLE_CLI_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let beside = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("bottle"))
        .filter(|path| path.is_file());
    beside.expect("set BOTTLE_CLI_BIN, or build the CLI first: cargo build -p bottle-cli")
}

/// How long `command` takes to write its first byte to stdout; then waits
/// for it to end (not timed) and requires it succeeded.
fn first_output(mut command: std::process::Command) -> Duration {
    let started = Instant::now();
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte).unwrap();
    let elapsed = started.elapsed();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "bottle start failed");
    elapsed
}
