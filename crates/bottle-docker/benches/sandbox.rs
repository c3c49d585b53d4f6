//! The sandbox interface against raw Docker, in one run on the real daemon:
//! a tool call's round trip through the in-box agent's channel vs `docker
//! exec` (the Engine API's exec, and the `docker` CLI), reset's p50 and
//! p99, and boot to the first tool call vs `docker run --rm`.
//!
//! `cargo xtask bench` runs it with the static binaries; by hand:
//! `BOTTLE_BUNDLE_BIN=… BOTTLE_TOOLBOX_BIN=… cargo bench -p bottle-docker
//! --bench sandbox [-- --quick]`. Every loop is bounded in count.

#![expect(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use bottle_core::sandbox::ToolCall;
use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::{DockerBackend, DockerOptions};
use bottle_test_support::bench::{docker, ms, percentile, row};

const TAG: &str = "bottle-demo-agent:bench";

struct Sizes {
    boots: usize,
    calls: usize,
    baseline_calls: usize,
    cli_calls: usize,
    resets: usize,
    restarts: usize,
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let sizes = if quick {
        Sizes {
            boots: 3,
            calls: 200,
            baseline_calls: 100,
            cli_calls: 20,
            resets: 20,
            restarts: 10,
        }
    } else {
        Sizes {
            boots: 10,
            calls: 1000,
            baseline_calls: 500,
            cli_calls: 100,
            resets: 1000,
            restarts: 100,
        }
    };
    let bundle = bottle_test_support::bench::static_bundle();
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut options = DockerOptions::new(state.path());
    options.bundle_bin = Some(bundle);
    let backend = DockerBackend::new(options).unwrap();
    backend.preflight().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent");
    backend
        .build_demo_agent(&demo, Path::new("/bin/busybox"), TAG)
        .unwrap();
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(&manifest, format!("[agents.bench]\nimage = \"{TAG}\"\ncommand = [\"/bin/sh\"]\n[agents.bench.egress]\nallow = [\"bench.bottle.test\"]\n")).unwrap();
    let spec = |name: &str| {
        let loaded = bottle_core::manifest::load(&manifest).unwrap();
        BottleSpec::new(&loaded, &manifest, "bench", Some(name), state.path()).unwrap()
    };

    // Boot to the first tool call, against `docker run --rm IMAGE true`.
    let mut boots = Vec::new();
    let mut runs = Vec::new();
    for i in 0..sizes.boots {
        let name = format!("bench-boot-{i}");
        let started = Instant::now();
        let plan = backend.prepare(&spec(&name)).unwrap();
        let bottle = backend.launch(&plan).unwrap();
        let first = bottle.execute(&ToolCall::argv(["true"])).unwrap();
        assert_eq!(first.exit_code, 0);
        boots.push(started.elapsed());
        drop(bottle);
        backend.stop(&name).unwrap();
        let started = Instant::now();
        assert!(docker(&["run", "--rm", TAG, "true"]));
        runs.push(started.elapsed());
    }

    let name = "bench-sandbox";
    let plan = backend.prepare(&spec(name)).unwrap();
    let bottle = backend.launch(&plan).unwrap();
    let container = format!("bot-bottle-{name}-agent");

    // Tool call round trip.
    for _ in 0..20 {
        bottle.execute(&ToolCall::argv(["true"])).unwrap();
    }
    let calls = time(sizes.calls, || {
        assert_eq!(
            bottle.execute(&ToolCall::argv(["true"])).unwrap().exit_code,
            0
        );
    });
    let api_execs = time(sizes.baseline_calls, || {
        assert_eq!(bottle.exec(&["true".to_string()]).unwrap().exit_code, 0);
    });
    let cli_execs = time(sizes.cli_calls, || {
        assert!(docker(&["exec", &container, "true"]))
    });

    // Reset, each verified from its three sources; then the floor under
    // it: the Engine killing and starting the same container, nothing else.
    let mut reverts = Vec::new();
    let mut verifies = Vec::new();
    let resets = time(sizes.resets, || {
        let report = bottle.reset().unwrap();
        assert!(report.verified);
        reverts.push(report.revert);
        verifies.push(report.verify);
    });
    let engine = backend.engine().unwrap();
    let kill = || {
        bollard::query_parameters::KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build()
    };
    let restarts = time(sizes.restarts, || {
        engine.block_on(async {
            engine
                .docker
                .kill_container(&container, Some(kill()))
                .await
                .unwrap();
            engine
                .docker
                .start_container(&container, None)
                .await
                .unwrap();
        });
    });
    // The raw restarts left the box running but not as a reset leaves it.
    assert!(bottle.reset().unwrap().verified);
    let after_reset = Instant::now();
    bottle.execute(&ToolCall::argv(["true"])).unwrap();
    let first_call_after_reset = after_reset.elapsed();
    drop(bottle);
    backend.stop(name).unwrap();

    println!(
        "| measure | bottle p50 (p99), ms | baseline | baseline p50 (p99), ms | ratio of p50s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    row(
        "boot to the first tool call",
        &boots,
        "`docker run --rm IMAGE true`",
        &runs,
    );
    row(
        "tool call `true` through the in-box agent",
        &calls,
        "Engine API exec of `true` (`docker exec` without the CLI)",
        &api_execs,
    );
    row(
        "tool call `true` through the in-box agent",
        &calls,
        "`docker exec CONTAINER true`",
        &cli_execs,
    );
    row(
        "reset, verified from three sources",
        &resets,
        "Engine API SIGKILL + start of the same container",
        &restarts,
    );
    println!(
        "| … of which revert / verify | {:.1} / {:.1} | | | |",
        ms(percentile(&reverts, 50)),
        ms(percentile(&verifies, 50))
    );
    println!(
        "| first tool call after a reset (starts a new in-box agent) | {:.1} | | | |",
        ms(first_call_after_reset)
    );
    println!(
        "\nn: boots {}, tool calls {}, API execs {}, CLI execs {}, resets {}, raw restarts {}",
        boots.len(),
        calls.len(),
        api_execs.len(),
        cli_execs.len(),
        resets.len(),
        restarts.len()
    );
}

fn time(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect()
}
