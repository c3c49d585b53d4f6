//! `bottle stop` against raw Docker, in one run on the real daemon: the
//! real CLI stopping a running detached bottle, against `docker rm -f` of
//! one running container of the same image (the baseline: `stop`
//! returns once the agent's one container is gone) and of two in one
//! command (what the whole bottle's two containers cost), interleaved
//! round by round. Also reported, not the goal: the time until the
//! detached finisher has removed the bottle's state dir (its bundle and
//! network go before it).
//!
//! `cargo xtask bench` runs it with the static binaries; by hand:
//! `BOTTLE_BUNDLE_BIN=… BOTTLE_TOOLBOX_BIN=… cargo bench --profile dev -p
//! bottle-cli --bench stop [-- --quick]` (what is timed is the daemon's
//! work and two processes, so a debug build of `bottle` changes little).
//! Every loop is bounded in count and time.

#![expect(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bottle_docker::client::Engine;
use bottle_test_support::bench::{docker, row};

const TAG: &str = "bottle-demo-agent:bench-stop";

/// How long one bottle's finisher may take before the bench gives up.
const FINISH_WITHIN: Duration = Duration::from_secs(60);

fn main() {
    let rounds = if std::env::args().any(|arg| arg == "--quick") {
        3
    } else {
        15
    };
    for var in ["BOTTLE_BUNDLE_BIN", "BOTTLE_TOOLBOX_BIN"] {
        assert!(std::env::var_os(var).is_some(), "set {var}");
    }
    let engine = Engine::connect(None).unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent");
    bottle_docker::images::build_demo_agent(&engine, &demo, Path::new("/bin/busybox"), TAG, None)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let world = World {
        state: dir.path().join("state"),
        manifest: dir.path().join("bottle.toml"),
    };
    std::fs::write(
        &world.manifest,
        format!(
            "[agents.bench]\nimage = \"{TAG}\"\ncommand = [\"/bin/sh\", \"-c\", \"sleep 600\"]\n"
        ),
    )
    .unwrap();

    let mut stops = Vec::new();
    let mut finishes = Vec::new();
    let mut removes = Vec::new();
    let mut removes_of_two = Vec::new();
    for round in 0..rounds {
        let name = format!("bench-stop-{round}-{}", std::process::id());
        let _guard = Leftovers {
            world: &world,
            name: name.clone(),
        };
        world.start(&name);
        let state_dir = world.state.join("bottle").join(&name);
        let started = Instant::now();
        assert!(world.bottle(&["stop", &name]), "bottle stop {name}");
        stops.push(started.elapsed());
        wait_gone(&state_dir);
        finishes.push(started.elapsed());

        let one = format!("{name}-raw");
        run_detached(&one);
        let started = Instant::now();
        assert!(docker(&["rm", "-f", &one]));
        removes.push(started.elapsed());

        let (a, b) = (format!("{name}-raw-a"), format!("{name}-raw-b"));
        run_detached(&a);
        run_detached(&b);
        let started = Instant::now();
        assert!(docker(&["rm", "-f", &a, &b]));
        removes_of_two.push(started.elapsed());
    }

    println!(
        "| measure | bottle p50 (p99), ms | baseline | baseline p50 (p99), ms | ratio of p50s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    row(
        "`bottle stop` of a running detached bottle (returns with the agent's container gone)",
        &stops,
        "`docker rm -f` of one running container",
        &removes,
    );
    row(
        "`bottle stop` of a running detached bottle (returns with the agent's container gone)",
        &stops,
        "`docker rm -f A B` of two running containers",
        &removes_of_two,
    );
    row(
        "… until its finisher removed the bundle, the network and the state dir (reported, not the goal)",
        &finishes,
        "`docker rm -f` of one running container",
        &removes,
    );
    println!("\nn: {rounds} rounds, interleaved (bottle, one container, two containers)");
}

/// The bench's state root and manifest, for the real `bottle`.
struct World {
    state: PathBuf,
    manifest: PathBuf,
}

impl World {
    /// Runs the real `bottle` with `args`; whether it succeeded.
    fn bottle(&self, args: &[&str]) -> bool {
        #[expect(
            clippy::disallowed_methods,
            reason = "the bench times the real bottle binary"
        )]
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_bottle"))
            .env("XDG_STATE_HOME", &self.state)
            .env_remove("BOT_BOTTLE_BACKEND")
            .arg("--manifest")
            .arg(&self.manifest)
            .args(["--backend", "docker", "--quiet"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        status.success()
    }

    fn start(&self, name: &str) {
        assert!(
            self.bottle(&["--yes", "start", "bench", "--name", name, "-d"]),
            "bottle start {name}"
        );
    }
}

/// Removes what a round made if it failed half-way.
struct Leftovers<'a> {
    world: &'a World,
    name: String,
}

impl Drop for Leftovers<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.world.bottle(&["stop", &self.name]);
            let raw = ["raw", "raw-a", "raw-b"].map(|s| format!("{}-{s}", self.name));
            let _ = docker(&["rm", "-f", &raw[0], &raw[1], &raw[2]]);
        }
    }
}

/// Waits until the finisher removed `state_dir` (its last step before the
/// shared egress network), checking every millisecond.
fn wait_gone(state_dir: &Path) {
    let deadline = Instant::now() + FINISH_WITHIN;
    while state_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "{} outlived {FINISH_WITHIN:?}",
            state_dir.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `docker run -d` of the bottle's image as the container `name`, running
/// as the bottle's agent does (a shell asleep).
fn run_detached(name: &str) {
    assert!(docker(&[
        "run",
        "-d",
        "--name",
        name,
        TAG,
        "/bin/sh",
        "-c",
        "sleep 600"
    ]));
}
