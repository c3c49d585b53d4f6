//! Cold start against raw Docker, in one run on the real daemon, images
//! cached and no pool, interleaved so both see the same load:
//!
//! - the CLI as a user runs it: `bottle --yes --quiet start AGENT` whose
//!   agent prints one line, from spawning the process to that line on its
//!   stdout, against `docker run --rm IMAGE true` of the same image;
//! - the library path: prepare, launch and the first tool call through the
//!   in-box agent, against the same baseline.
//!
//! Each with the demo image and, when `BOTTLE_TEST_DEBIAN_IMAGE` names it,
//! the Debian test image (a real agent image), each against `docker run`
//! of its own image. Then the per-step timeline (`bottle start
//! --timings`) of the CLI's median run. `cargo xtask bench` runs it with the static binaries; by
//! hand: `BOTTLE_BUNDLE_BIN=… BOTTLE_TOOLBOX_BIN=… cargo bench --profile dev
//! -p bottle-cli --bench start [-- --quick]`. Every loop is bounded in
//! count, and every wait for output in time.

#![expect(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bottle_core::sandbox::ToolCall;
use bottle_core::timeline::Timeline;
use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::{DockerBackend, DockerOptions};
use bottle_test_support::bench::{docker, median_index, ms, row};

const TAG: &str = "bottle-demo-agent:bench-start";
const MARKER: &str = "bench-agent-started";
/// How long one start may take before the bench gives up.
const START_WITHIN: Duration = Duration::from_secs(60);

/// One image's manifest and what was measured with it.
struct Subject {
    label: String,
    image: String,
    manifest: PathBuf,
    docker_runs: Vec<Duration>,
    cli: Vec<Duration>,
    timelines: Vec<String>,
    library: Vec<Duration>,
    library_timelines: Vec<String>,
}

impl Subject {
    fn new(label: &str, image: &str, dir: &Path) -> Subject {
        let manifest = dir.join(format!("{label}.toml"));
        std::fs::write(
            &manifest,
            format!(
                "[agents.bench]\nimage = \"{image}\"\ncommand = [\"/bin/sh\", \"-c\", \"echo {MARKER}\"]\n[agents.bench.egress]\nallow = [\"bench.bottle.test\"]\n"
            ),
        )
        .unwrap();
        Subject {
            label: label.to_string(),
            image: image.to_string(),
            manifest,
            docker_runs: Vec::new(),
            cli: Vec::new(),
            timelines: Vec::new(),
            library: Vec::new(),
            library_timelines: Vec::new(),
        }
    }
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let runs = if quick { 3 } else { 10 };
    let bundle = bottle_test_support::bench::static_bundle();
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bottle_state = state.path().join("bottle");
    std::fs::create_dir_all(&bottle_state).unwrap();
    let options = |timeline: Option<Timeline>| {
        let mut options = DockerOptions::new(&bottle_state);
        options.bundle_bin = Some(bundle.clone());
        options.timeline = timeline;
        options
    };
    let backend = DockerBackend::new(options(None)).unwrap();
    backend.preflight().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent");
    backend
        .build_demo_agent(&demo, Path::new("/bin/busybox"), TAG)
        .unwrap();
    let mut subjects = vec![Subject::new("demo image", TAG, dir.path())];
    if let Some(debian) = bottle_test_support::bench::debian_image() {
        subjects.push(Subject::new("Debian image", &debian, dir.path()));
    }
    // One untimed start of each, so none pays for a first image load.
    for (n, subject) in subjects.iter().enumerate() {
        assert!(docker(&["run", "--rm", &subject.image, "true"]));
        cli_start(state.path(), &subject.manifest, &format!("bench-warm-{n}"));
    }

    for i in 0..runs {
        for (n, subject) in subjects.iter_mut().enumerate() {
            let started = Instant::now();
            assert!(docker(&["run", "--rm", &subject.image, "true"]));
            subject.docker_runs.push(started.elapsed());

            let name = format!("bench-cli-{n}-{i}");
            let (took, timeline) = cli_start(state.path(), &subject.manifest, &name);
            subject.cli.push(took);
            subject.timelines.push(timeline);

            let name = format!("bench-lib-{n}-{i}");
            let loaded = bottle_core::manifest::load(&subject.manifest).unwrap();
            let spec = BottleSpec::new(
                &loaded,
                &subject.manifest,
                "bench",
                Some(&name),
                &bottle_state,
            )
            .unwrap();
            let timeline = Timeline::new();
            let backend = DockerBackend::new(options(Some(timeline.clone()))).unwrap();
            backend.preflight().unwrap();
            timeline.lap("connect (not timed)");
            let started = Instant::now();
            let plan = backend.prepare(&spec).unwrap();
            timeline.lap("prepare");
            let bottle = backend.launch(&plan).unwrap();
            assert_eq!(
                bottle.execute(&ToolCall::argv(["true"])).unwrap().exit_code,
                0
            );
            subject.library.push(started.elapsed());
            timeline.lap("first tool call");
            subject.library_timelines.push(timeline.render());
            drop(bottle);
            backend.stop(&name).unwrap();
        }
    }

    println!(
        "| measure | bottle p50 (p99), ms | baseline | baseline p50 (p99), ms | ratio of p50s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for subject in &subjects {
        let label = &subject.label;
        row(
            &format!("`bottle start` (CLI) to the agent's first output, {label}"),
            &subject.cli,
            "`docker run --rm IMAGE true`",
            &subject.docker_runs,
        );
        row(
            &format!("prepare + launch + first tool call (library), {label}"),
            &subject.library,
            "`docker run --rm IMAGE true`",
            &subject.docker_runs,
        );
    }
    println!("\nn: {runs} of each, interleaved");
    for subject in &subjects {
        let label = &subject.label;
        let median = median_index(&subject.cli);
        println!(
            "\n`bottle start --timings` of the median CLI run, {label} ({:.0} ms to first output):\n",
            ms(subject.cli[median])
        );
        println!("```\n{}```", subject.timelines[median]);
        let median = median_index(&subject.library);
        println!(
            "\nThe launch steps of the median library run, {label} ({:.0} ms to the first tool call):\n",
            ms(subject.library[median])
        );
        println!("```\n{}```", subject.library_timelines[median]);
    }
}

/// Runs `bottle --yes --quiet start bench --timings` attached, whose agent
/// prints [`MARKER`] and exits (the CLI then stops the bottle): the time
/// from spawning the process to the marker on its stdout, and the timeline
/// it printed on stderr.
fn cli_start(state: &Path, manifest: &Path, name: &str) -> (Duration, String) {
    #[expect(
        clippy::disallowed_methods,
        reason = "the bench runs the real bottle binary, as a user does"
    )]
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_bottle"));
    command
        .env("XDG_STATE_HOME", state)
        .env_remove("BOT_BOTTLE_BACKEND")
        .arg("--manifest")
        .arg(manifest)
        .args(["--backend", "docker", "--yes", "--quiet", "start", "bench"])
        .args(["--name", name, "--timings"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (seen, marker) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap_or_default();
            if line.contains(MARKER) {
                let _ = seen.send(Instant::now());
            }
        }
    });
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let at = marker.recv_timeout(START_WITHIN);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let stderr = errors.join().unwrap();
    let at =
        at.unwrap_or_else(|_| panic!("{name} printed nothing within {START_WITHIN:?}: {stderr}"));
    assert!(status.success(), "{name}: {stderr}");
    let timeline = stderr
        .split_once("timings:\n")
        .map(|(_, table)| table.to_string())
        .unwrap_or_else(|| panic!("{name} printed no timeline: {stderr}"));
    (at.duration_since(started), timeline)
}
