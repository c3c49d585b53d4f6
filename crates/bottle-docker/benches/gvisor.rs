//! The gVisor tier against the container tier, in one run on the real
//! daemon, side by side: boot to the first tool call (with the demo image
//! and the Debian agent image, each beside `docker run --rm` of the same
//! image under the same runtime), `exec`, a tool call, a verified reset,
//! idle memory, and the proxy's throughput from inside the box (a download
//! through the bundle from an upstream on the host). Every figure is a
//! ratio against runc measured in the same run, the two tiers interleaved
//! where they repeat.
//!
//! `cargo xtask bench` runs it with the static binaries and the Debian
//! image; by hand: `BOTTLE_BUNDLE_BIN=… BOTTLE_TOOLBOX_BIN=…
//! [BOTTLE_TEST_DEBIAN_IMAGE=…] cargo bench -p bottle-docker --bench gvisor
//! [-- --quick]`. It needs the daemon's `runsc` runtime
//! (`.ci/setup` registers it) and says so when it is missing. Every loop
//! is bounded in count.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use bottle_core::sandbox::ToolCall;
use bottle_core::{Bottle, BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::{DockerBackend, DockerOptions};
use bottle_test_support::bench::{docker, ms, percentile, row};

const TAG: &str = "bottle-demo-agent:bench";
const HOST: &str = "bench.bottle.test";
const TIERS: [&str; 2] = ["runc", "gvisor"];
/// An image the boots are measured with.
struct BenchImage {
    label: &'static str,
    tag: String,
    /// What the image's agents' names end with.
    suffix: &'static str,
}

/// One image's boots, per tier: the raw `docker run --rm` and the bottle.
struct ImageBoots {
    label: &'static str,
    raw: [Vec<Duration>; 2],
    boot: [Vec<Duration>; 2],
}

struct Sizes {
    boots: usize,
    execs: usize,
    calls: usize,
    resets: usize,
    download_mib: usize,
    downloads: usize,
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let sizes = if quick {
        Sizes {
            boots: 2,
            execs: 30,
            calls: 30,
            resets: 5,
            download_mib: 32,
            downloads: 2,
        }
    } else {
        Sizes {
            boots: 5,
            execs: 200,
            calls: 200,
            resets: 30,
            download_mib: 256,
            downloads: 5,
        }
    };
    if let Err(why) = bottle_test_support::daemon_has_runtime("runsc") {
        println!("gvisor bench skipped: {why}");
        return;
    }
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
    let mut images = vec![BenchImage {
        label: "demo",
        tag: TAG.to_string(),
        suffix: "",
    }];
    if let Some(tag) = bottle_test_support::bench::debian_image() {
        images.push(BenchImage {
            label: "Debian",
            tag,
            suffix: "-debian",
        });
    }

    // The upstream: zeros over plain HTTP, on every host address, so a
    // bundle on the egress bridge reaches it at that bridge's gateway.
    let upstream = TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let port = upstream.local_addr().unwrap().port();
    std::thread::spawn(move || serve_zeros(&upstream));

    // A first bottle makes the egress network; its gateway is the
    // upstream's address the manifest pins the bench's host to.
    let manifest = dir.path().join("bottle.toml");
    write_manifest(&manifest, &images, None, port);
    let spec = |agent: &str, name: &str| {
        let loaded = bottle_core::manifest::load(&manifest).unwrap();
        BottleSpec::new(&loaded, &manifest, agent, Some(name), state.path()).unwrap()
    };
    let warm = backend.prepare(&spec("runc", "bench-gv-warm")).unwrap();
    drop(backend.launch(&warm).unwrap());
    let gateway = egress_gateway(&backend);
    backend.stop("bench-gv-warm").unwrap();
    write_manifest(&manifest, &images, Some(&gateway), port);

    // Boot to the first tool call, and the raw `docker run --rm IMAGE
    // true` of the same image under the same runtime, the tiers
    // interleaved; the demo image and, when `cargo xtask bench` names it,
    // the Debian agent image.
    let mut boots: Vec<ImageBoots> = Vec::new();
    for image in &images {
        let mut figures = ImageBoots {
            label: image.label,
            raw: [Vec::new(), Vec::new()],
            boot: [Vec::new(), Vec::new()],
        };
        for i in 0..sizes.boots {
            for (t, tier) in TIERS.iter().enumerate() {
                let mut raw = vec!["run", "--rm", "--network", "none"];
                if *tier == "gvisor" {
                    raw.extend(["--runtime", bottle_core::isolation::GVISOR_RUNTIME]);
                }
                raw.extend([image.tag.as_str(), "true"]);
                let started = Instant::now();
                assert!(docker(&raw), "docker {}", raw.join(" "));
                figures.raw[t].push(started.elapsed());

                let agent = format!("{tier}{}", image.suffix);
                let name = format!("bench-gv-boot-{agent}-{i}");
                let started = Instant::now();
                let plan = backend.prepare(&spec(&agent, &name)).unwrap();
                let bottle = backend.launch(&plan).unwrap();
                assert_eq!(
                    bottle.execute(&ToolCall::argv(["true"])).unwrap().exit_code,
                    0
                );
                figures.boot[t].push(started.elapsed());
                drop(bottle);
                backend.stop(&name).unwrap();
            }
        }
        boots.push(figures);
    }

    // One long-lived bottle per tier for the rest, of the real image when
    // there is one. Its download is curl's: busybox wget fails in a box of
    // gVisor 20221219's host network mode (a blocking socket read answered
    // with EAGAIN), which the demo image has nothing else to replace.
    let long_lived = images.last().expect("the demo image at least");
    let bottles: Vec<Box<dyn Bottle>> = TIERS
        .iter()
        .map(|tier| {
            let agent = format!("{tier}{}", long_lived.suffix);
            let plan = backend
                .prepare(&spec(&agent, &format!("bench-gv-{tier}")))
                .unwrap();
            backend.launch(&plan).unwrap()
        })
        .collect();
    let mut execs: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut calls: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut resets: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut downloads: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for bottle in &bottles {
        for _ in 0..10 {
            bottle.execute(&ToolCall::argv(["true"])).unwrap();
        }
    }
    for _ in 0..sizes.execs {
        for (t, bottle) in bottles.iter().enumerate() {
            let started = Instant::now();
            assert_eq!(bottle.exec(&["true".to_string()]).unwrap().exit_code, 0);
            execs[t].push(started.elapsed());
        }
    }
    for _ in 0..sizes.calls {
        for (t, bottle) in bottles.iter().enumerate() {
            let started = Instant::now();
            assert_eq!(
                bottle.execute(&ToolCall::argv(["true"])).unwrap().exit_code,
                0
            );
            calls[t].push(started.elapsed());
        }
    }
    let url = format!("http://{HOST}:{port}/{}", sizes.download_mib << 20);
    let download: Option<Vec<String>> = (long_lived.suffix == "-debian").then(|| {
        ["curl", "-sS", "--fail", "-o", "/dev/null", url.as_str()]
            .map(String::from)
            .to_vec()
    });
    for _ in 0..sizes.downloads {
        let Some(argv) = &download else { break };
        for (t, bottle) in bottles.iter().enumerate() {
            let started = Instant::now();
            let out = bottle.exec(argv).unwrap();
            assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
            downloads[t].push(started.elapsed());
        }
    }
    // Idle memory: each box as launched, after a reset, left alone.
    let mut idle = [0u64; 2];
    for (t, bottle) in bottles.iter().enumerate() {
        assert!(bottle.reset().unwrap().verified);
        std::thread::sleep(Duration::from_secs(3));
        idle[t] = memory_usage(&backend, &format!("bot-bottle-bench-gv-{}-agent", TIERS[t]));
    }
    for _ in 0..sizes.resets {
        for (t, bottle) in bottles.iter().enumerate() {
            let started = Instant::now();
            assert!(bottle.reset().unwrap().verified);
            resets[t].push(started.elapsed());
        }
    }
    drop(bottles);
    for tier in TIERS {
        backend.stop(&format!("bench-gv-{tier}")).unwrap();
    }

    println!("| measure | gVisor p50 (p99), ms | baseline | runc p50 (p99), ms | ratio of p50s |");
    println!("| --- | --- | --- | --- | --- |");
    for image in &boots {
        row(
            &format!("`docker run --rm IMAGE true`, {} image", image.label),
            &image.raw[1],
            "the same, runc",
            &image.raw[0],
        );
        row(
            &format!("boot to the first tool call, {} image", image.label),
            &image.boot[1],
            "the same, runc",
            &image.boot[0],
        );
    }
    row(
        "`bottle exec true` (Engine API exec)",
        &execs[1],
        "the same, runc",
        &execs[0],
    );
    row(
        "tool call `true` through the in-box agent",
        &calls[1],
        "the same, runc",
        &calls[0],
    );
    row(
        "reset, verified from three sources",
        &resets[1],
        "the same, runc",
        &resets[0],
    );
    if downloads[0].is_empty() {
        println!("| proxy throughput from inside | (needs the Debian image: its curl) | | | |");
    } else {
        row(
            &format!(
                "{} MiB through the bundle's proxy (curl in the box)",
                sizes.download_mib
            ),
            &downloads[1],
            "the same, runc",
            &downloads[0],
        );
        let mib_s = |d: &[Duration]| sizes.download_mib as f64 / percentile(d, 50).as_secs_f64();
        println!(
            "| … as throughput, MiB/s | {:.0} | | {:.0} | {:.2} |",
            mib_s(&downloads[1]),
            mib_s(&downloads[0]),
            mib_s(&downloads[1]) / mib_s(&downloads[0])
        );
    }
    println!(
        "| idle memory of the box (cgroup usage), MiB | {:.1} | | {:.1} | {:.2} |",
        idle[1] as f64 / 1048576.0,
        idle[0] as f64 / 1048576.0,
        idle[1] as f64 / idle[0] as f64
    );
    println!(
        "\nboot to the first tool call over `docker run --rm` of the same image and runtime (p50s):"
    );
    for image in &boots {
        for (t, tier) in TIERS.iter().enumerate() {
            println!(
                "- {} image, {tier}: {:.0} ms over {:.0} ms = {:.2}x",
                image.label,
                ms(percentile(&image.boot[t], 50)),
                ms(percentile(&image.raw[t], 50)),
                percentile(&image.boot[t], 50).as_secs_f64()
                    / percentile(&image.raw[t], 50).as_secs_f64()
            );
        }
    }
    println!(
        "\nn per tier: boots {} per image; with the {} image: execs {}, tool calls {}, resets {}, downloads {} of {} MiB",
        sizes.boots,
        long_lived.label,
        sizes.execs,
        sizes.calls,
        sizes.resets,
        downloads[0].len(),
        sizes.download_mib,
    );
}

/// The manifest: for each image an agent per tier (`runc`, `gvisor`, with
/// the image's suffix), each allowed the bench's host on the upstream's
/// port, pinned to `gateway` once known.
fn write_manifest(path: &Path, images: &[BenchImage], gateway: Option<&str>, port: u16) {
    let resolve = gateway
        .map(|g| format!("resolve = {{ \"{HOST}\" = \"{g}\" }}\n"))
        .unwrap_or_default();
    let mut text = String::new();
    for image in images {
        for (tier, isolation) in [("runc", "container"), ("gvisor", "gvisor")] {
            text.push_str(&format!(
                "[agents.{tier}{suffix}]\nimage = {tag:?}\ncommand = [\"/bin/sh\"]\nisolation = \"{isolation}\"\n\
                 [agents.{tier}{suffix}.egress]\nallow = [\"{HOST}\"]\nports = [{port}]\n{resolve}\n",
                suffix = image.suffix,
                tag = image.tag,
            ));
        }
    }
    std::fs::write(path, text).unwrap();
}

/// The egress network's gateway address (the host, on that bridge).
fn egress_gateway(backend: &DockerBackend) -> String {
    let engine = backend.engine().unwrap();
    let network = engine
        .block_on(
            engine
                .docker
                .inspect_network(bottle_docker::names::EGRESS_NETWORK, None),
        )
        .unwrap();
    network
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().find_map(|c| c.gateway))
        .expect("the egress network has a gateway")
}

/// The container's memory use as the Engine reports it (one stats read).
fn memory_usage(backend: &DockerBackend, container: &str) -> u64 {
    use futures_util::StreamExt as _;
    let engine = backend.engine().unwrap();
    let options = bollard::query_parameters::StatsOptionsBuilder::default()
        .stream(false)
        .one_shot(true)
        .build();
    let stats = engine
        .block_on(async { engine.docker.stats(container, Some(options)).next().await })
        .expect("a stats answer")
        .unwrap();
    stats
        .memory_stats
        .and_then(|m| m.usage)
        .expect("the Engine reports the box's memory")
}

/// Serves `GET /<n>` with `n` zero bytes, one connection at a time per
/// thread.
fn serve_zeros(listener: &TcpListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                return;
            }
            let n: usize = line
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.trim_start_matches('/').parse().ok())
                .unwrap_or(0);
            loop {
                let mut header = String::new();
                match reader.read_line(&mut header) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if header == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
            if stream.write_all(head.as_bytes()).is_err() {
                return;
            }
            let chunk = vec![0u8; 1 << 20];
            let mut left = n;
            while left > 0 {
                let take = left.min(chunk.len());
                if stream.write_all(&chunk[..take]).is_err() {
                    return;
                }
                left -= take;
            }
        });
    }
}
