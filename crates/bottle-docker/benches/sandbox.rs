//! The sandbox interface against raw Docker, in one run on the real daemon:
//! a tool call's round trip through the in-box agent's channel vs `docker
//! exec` (the Engine API's exec, and the `docker` CLI), reset's p50 and
//! p99 by restart and through a standby (with the standby's preparation
//! timed apart), and boot to the first tool call vs `docker run --rm`, for
//! the demo image and, when `cargo xtask bench` names it, the Debian test
//! image. Beside them, the Engine's own share of each, measured the same
//! way in the same run: the floors a bottle on this Engine cannot go
//! under (a network and two containers started for a boot, one address
//! handed from one container to another for a reset through a standby).
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

use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, NetworkConnectRequest,
    NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use bottle_core::sandbox::{RevertMethod, ToolCall};
use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::client::Engine;
use bottle_docker::{DockerBackend, DockerOptions};
use bottle_test_support::bench::{docker, ms, percentile, row, time};

const TAG: &str = "bottle-demo-agent:bench";

struct Sizes {
    boots: usize,
    calls: usize,
    baseline_calls: usize,
    cli_calls: usize,
    resets: usize,
    standby_resets: usize,
    restarts: usize,
    handovers: usize,
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
            standby_resets: 20,
            restarts: 10,
            handovers: 20,
        }
    } else {
        Sizes {
            boots: 10,
            calls: 1000,
            baseline_calls: 500,
            cli_calls: 100,
            // The restart is the fallback now; the standby is the reset.
            resets: 200,
            standby_resets: 1000,
            restarts: 100,
            handovers: 200,
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
    let mut images = vec![("demo image", TAG.to_string())];
    if let Some(debian) = bottle_test_support::bench::debian_image() {
        images.push(("Debian image", debian));
    }
    let measured: Vec<(&str, Measured)> = images
        .iter()
        .map(|(label, image)| {
            let bench = Bench {
                backend: &backend,
                state: state.path(),
                dir: dir.path(),
                image,
            };
            (*label, bench.measure(&sizes))
        })
        .collect();

    println!(
        "| measure | bottle p50 (p99), ms | baseline | baseline p50 (p99), ms | ratio of p50s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (label, m) in &measured {
        m.print(label);
    }
    for (label, m) in &measured {
        println!(
            "\n{label}: n: boots {} (and as many raw runs and two-container starts), tool calls {}, API execs {}, CLI execs {}, resets by restart {}, resets through a standby {}, raw restarts {}, raw address hand-overs {}",
            m.boots.len(),
            m.calls.len(),
            m.api_execs.len(),
            m.cli_execs.len(),
            m.resets.len(),
            m.standby_resets.len(),
            m.restarts.len(),
            m.handovers.len()
        );
    }
}

/// One image's bottles on one backend.
struct Bench<'a> {
    backend: &'a DockerBackend,
    state: &'a Path,
    dir: &'a Path,
    image: &'a str,
}

/// What one image's run measured.
struct Measured {
    boots: Vec<Duration>,
    runs: Vec<Duration>,
    /// The Engine API making a network and starting two containers on it
    /// at once: a bottle's boot is at least that.
    pair_starts: Vec<Duration>,
    calls: Vec<Duration>,
    api_execs: Vec<Duration>,
    cli_execs: Vec<Duration>,
    resets: Vec<Duration>,
    reverts: Vec<Duration>,
    verifies: Vec<Duration>,
    standby_resets: Vec<Duration>,
    standby_reverts: Vec<Duration>,
    standby_verifies: Vec<Duration>,
    preparations: Vec<Duration>,
    restarts: Vec<Duration>,
    /// The Engine API force-disconnecting a container and connecting
    /// another at its address: a reset through a standby is at least that.
    handovers: Vec<Duration>,
    /// The first tool call after each reset by restart (a new in-box
    /// agent) and through a standby (its channel opened ahead).
    first_calls_after_restart: Vec<Duration>,
    first_calls_after_standby: Vec<Duration>,
}

impl Bench<'_> {
    fn spec(&self, name: &str) -> BottleSpec {
        let manifest = self.dir.join("bottle.toml");
        std::fs::write(&manifest, format!("[agents.bench]\nimage = \"{}\"\ncommand = [\"/bin/sh\"]\n[agents.bench.egress]\nallow = [\"bench.bottle.test\"]\n", self.image)).unwrap();
        let loaded = bottle_core::manifest::load(&manifest).unwrap();
        BottleSpec::new(&loaded, &manifest, "bench", Some(name), self.state).unwrap()
    }

    fn measure(&self, sizes: &Sizes) -> Measured {
        let backend = self.backend;
        // Boot to the first tool call, against `docker run --rm IMAGE true`.
        let engine = backend.engine().unwrap();
        let mut boots = Vec::new();
        let mut runs = Vec::new();
        let mut pair_starts = Vec::new();
        for i in 0..sizes.boots {
            let name = format!("bench-boot-{i}");
            let spec = self.spec(&name);
            let started = Instant::now();
            let plan = backend.prepare(&spec).unwrap();
            let bottle = backend.launch(&plan).unwrap();
            let first = bottle.execute(&ToolCall::argv(["true"])).unwrap();
            assert_eq!(first.exit_code, 0);
            boots.push(started.elapsed());
            drop(bottle);
            backend.stop(&name).unwrap();
            let started = Instant::now();
            assert!(docker(&["run", "--rm", self.image, "true"]));
            runs.push(started.elapsed());
            pair_starts.push(self.start_pair(engine, i));
        }

        let name = "bench-sandbox";
        let plan = backend.prepare(&self.spec(name)).unwrap();
        let bottle = backend.launch(&plan).unwrap();
        let container = format!("bot-bottle-{name}-agent");

        // Tool call round trip.
        for _ in 0..20 {
            bottle.execute(&ToolCall::argv(["true"])).unwrap();
        }
        let calls = repeat(sizes.calls, || {
            assert_eq!(
                bottle.execute(&ToolCall::argv(["true"])).unwrap().exit_code,
                0
            );
        });
        let api_execs = repeat(sizes.baseline_calls, || {
            assert_eq!(bottle.exec(&["true".to_string()]).unwrap().exit_code, 0);
        });
        let cli_execs = repeat(sizes.cli_calls, || {
            assert!(docker(&["exec", &container, "true"]))
        });

        // Reset, each verified from its three sources: by restart (no
        // standby waits), then through a standby prepared before each one
        // (its preparation timed apart: it runs in the background after a
        // reset); then the floor under the restart: the Engine killing and
        // starting the same container, nothing else.
        // After each, the first tool call, timed apart.
        let first_call = || {
            time(|| {
                assert_eq!(
                    bottle.execute(&ToolCall::argv(["true"])).unwrap().exit_code,
                    0
                );
            })
        };
        let mut reverts = Vec::new();
        let mut verifies = Vec::new();
        let mut resets = Vec::new();
        let mut first_calls_after_restart = Vec::new();
        for _ in 0..sizes.resets {
            let started = Instant::now();
            let report = bottle.reset().unwrap();
            resets.push(started.elapsed());
            assert!(report.verified);
            assert_eq!(report.method, RevertMethod::Restart);
            reverts.push(report.revert);
            verifies.push(report.verify);
            first_calls_after_restart.push(first_call());
        }
        let mut standby_resets = Vec::new();
        let mut standby_reverts = Vec::new();
        let mut standby_verifies = Vec::new();
        let mut preparations = Vec::new();
        let mut first_calls_after_standby = Vec::new();
        for _ in 0..sizes.standby_resets {
            let started = Instant::now();
            let said = bottle.prepare_reset().unwrap();
            preparations.push(started.elapsed());
            // This handle calls: its standby's agent runs, its channel
            // open.
            assert!(said.contains("channel open"), "{said}");
            let started = Instant::now();
            let report = bottle.reset().unwrap();
            standby_resets.push(started.elapsed());
            assert!(report.verified);
            assert_eq!(report.method, RevertMethod::Standby);
            standby_reverts.push(report.revert);
            standby_verifies.push(report.verify);
            first_calls_after_standby.push(first_call());
        }
        let kill = || {
            bollard::query_parameters::KillContainerOptionsBuilder::default()
                .signal("SIGKILL")
                .build()
        };
        let restarts = repeat(sizes.restarts, || {
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
        // The address's hand-over alone, between the agent's box and a
        // standby of it, thawed: each round hands it over and back, timing
        // the first.
        bottle.prepare_reset().unwrap();
        let standby = format!("{container}-standby");
        engine
            .block_on(engine.docker.unpause_container(&standby))
            .unwrap();
        let (network, address) = agent_address(engine, &container);
        let at = (network.as_str(), address.as_str());
        let handovers = (0..sizes.handovers)
            .map(|_| {
                let taken = time(|| hand_over(engine, at, &container, &standby));
                hand_over(engine, at, &standby, &container);
                taken
            })
            .collect();
        drop(bottle);
        backend.stop(name).unwrap();
        Measured {
            boots,
            runs,
            pair_starts,
            calls,
            api_execs,
            cli_execs,
            resets,
            reverts,
            verifies,
            standby_resets,
            standby_reverts,
            standby_verifies,
            preparations,
            restarts,
            handovers,
            first_calls_after_restart,
            first_calls_after_standby,
        }
    }

    /// Times the Engine API making an internal network and creating and
    /// starting two containers of the image on it at once (the agent's
    /// box and the bundle's, as a launch does); removes them untimed.
    fn start_pair(&self, engine: &Engine, i: usize) -> Duration {
        let docker = &engine.docker;
        let network = format!("bot-bench-pair-{i}");
        let names = [
            format!("bot-bench-pair-{i}-a"),
            format!("bot-bench-pair-{i}-b"),
        ];
        let body = || ContainerCreateBody {
            image: Some(self.image.to_string()),
            cmd: Some(vec!["true".to_string()]),
            host_config: Some(bollard::models::HostConfig {
                network_mode: Some(network.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let create = |name: &str| {
            let options = CreateContainerOptionsBuilder::default().name(name).build();
            docker.create_container(Some(options), body())
        };
        let taken = time(|| {
            engine.block_on(async {
                docker
                    .create_network(NetworkCreateRequest {
                        name: network.clone(),
                        internal: Some(true),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                let (a, b) = tokio::join!(create(&names[0]), create(&names[1]));
                a.unwrap();
                b.unwrap();
                let (a, b) = tokio::join!(
                    docker.start_container(&names[0], None),
                    docker.start_container(&names[1], None)
                );
                a.unwrap();
                b.unwrap();
            })
        });
        engine.block_on(async {
            for name in &names {
                let options = RemoveContainerOptionsBuilder::default().force(true).build();
                docker.remove_container(name, Some(options)).await.unwrap();
            }
            docker.remove_network(&network).await.unwrap();
        });
        taken
    }
}

impl Measured {
    fn print(&self, image: &str) {
        row(
            &format!("boot to the first tool call, {image}"),
            &self.boots,
            "`docker run --rm IMAGE true`",
            &self.runs,
        );
        row(
            &format!("boot to the first tool call, {image}"),
            &self.boots,
            "floor: Engine API network + two containers created and started at once",
            &self.pair_starts,
        );
        row(
            &format!("tool call `true` through the in-box agent, {image}"),
            &self.calls,
            "Engine API exec of `true` (`docker exec` without the CLI)",
            &self.api_execs,
        );
        row(
            &format!("tool call `true` through the in-box agent, {image}"),
            &self.calls,
            "`docker exec CONTAINER true`",
            &self.cli_execs,
        );
        row(
            &format!("reset by restart, verified from three sources, {image}"),
            &self.resets,
            "Engine API SIGKILL + start of the same container",
            &self.restarts,
        );
        println!(
            "| … of which revert / verify | {:.1} / {:.1} | | | |",
            ms(percentile(&self.reverts, 50)),
            ms(percentile(&self.verifies, 50))
        );
        row(
            &format!("reset through a standby, verified from three sources, {image}"),
            &self.standby_resets,
            "Engine API SIGKILL + start of the same container",
            &self.restarts,
        );
        row(
            &format!("reset through a standby, verified from three sources, {image}"),
            &self.standby_resets,
            "floor: Engine API force-disconnect of a container, then connect of another at its address",
            &self.handovers,
        );
        println!(
            "| … of which swap / verify | {:.1} / {:.1} | | | |",
            ms(percentile(&self.standby_reverts, 50)),
            ms(percentile(&self.standby_verifies, 50))
        );
        println!(
            "| preparing a standby (in the background, between resets), {image} | {:.1} ({:.1}) | | | |",
            ms(percentile(&self.preparations, 50)),
            ms(percentile(&self.preparations, 99))
        );
        println!(
            "| first tool call after a reset by restart (starts a new in-box agent), {image} | {:.1} ({:.1}) | | | |",
            ms(percentile(&self.first_calls_after_restart, 50)),
            ms(percentile(&self.first_calls_after_restart, 99))
        );
        println!(
            "| first tool call after a reset through a standby (its channel opened ahead), {image} | {:.1} ({:.1}) | tool call round trip | {:.1} | {:.2} |",
            ms(percentile(&self.first_calls_after_standby, 50)),
            ms(percentile(&self.first_calls_after_standby, 99)),
            ms(percentile(&self.calls, 50)),
            ms(percentile(&self.first_calls_after_standby, 50)) / ms(percentile(&self.calls, 50))
        );
    }
}

fn repeat(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..n).map(|_| time(&mut f)).collect()
}

/// Moves `address` on `network` from the container `from` to the
/// container `to`: the force-disconnect and the connect a reset through a
/// standby makes on its path, and nothing else.
fn hand_over(engine: &Engine, (network, address): (&str, &str), from: &str, to: &str) {
    let docker = &engine.docker;
    let disconnect = NetworkDisconnectRequest {
        container: from.to_string(),
        force: Some(true),
    };
    let connect = NetworkConnectRequest {
        container: to.to_string(),
        endpoint_config: Some(EndpointSettings {
            ipam_config: Some(EndpointIpamConfig {
                ipv4_address: Some(address.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    engine.block_on(async {
        docker
            .disconnect_network(network, disconnect)
            .await
            .unwrap();
        docker.connect_network(network, connect).await.unwrap();
    });
}

/// The agent box's one network and its address there.
fn agent_address(engine: &Engine, container: &str) -> (String, String) {
    let inspect = engine
        .block_on(engine.docker.inspect_container(container, None))
        .unwrap();
    let networks = inspect.network_settings.unwrap().networks.unwrap();
    let (network, endpoint) = networks.into_iter().next().unwrap();
    (network, endpoint.ip_address.unwrap())
}
