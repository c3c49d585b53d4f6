//! Docker backend timings: `bench STATE_ROOT [ITERATIONS]`, with
//! `BOTTLE_BUNDLE_BIN` set and `/bin/busybox` present (for the demo image).
//!
//! Measures, per iteration and in the same run:
//! - bottle: prepare + launch (`start --yes`) until the first successful
//!   exec, then `stop`;
//! - raw: Engine API create + start + exec of the same image (no network,
//!   no bundle, no provisioning), then remove;
//!
//! and the idle memory of one bottle (agent + bundle, cgroup usage).
//!
//! Prints Markdown for docs/PERF.md.

#![expect(
    clippy::print_stdout,
    reason = "an example reports what it did on the terminal"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, StatsOptionsBuilder,
};
use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::bottle::exec_captured;
use bottle_docker::{DockerBackend, DockerOptions};
use futures_util::StreamExt;

const IMAGE: &str = "bottle-demo-agent:bench";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let state_root = Path::new(args.first().ok_or("usage: bench STATE_ROOT [ITERATIONS]")?);
    let iterations: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(5);
    std::fs::create_dir_all(state_root)?;
    let backend = DockerBackend::new(DockerOptions::new(state_root))?;
    backend.preflight()?;
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent");
    backend.build_demo_agent(&demo, Path::new("/bin/busybox"), IMAGE)?;
    let manifest_path = state_root.join("bench.toml");
    std::fs::write(
        &manifest_path,
        format!(
            "[agents.bench]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\"]\n[agents.bench.limits]\nmemory = \"256m\"\npids = 128\n"
        ),
    )?;
    let manifest = bottle_core::manifest::load(&manifest_path)?;
    let engine = backend.engine()?;
    let truth = ["true".to_string()];

    let (mut start, mut stop, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    let mut idle = None;
    for i in 0..iterations {
        let spec = BottleSpec::new(
            &manifest,
            &manifest_path,
            "bench",
            Some(&format!("bench-{i}")),
            state_root,
        )?;
        let t0 = Instant::now();
        let plan = backend.prepare(&spec)?;
        let bottle = backend.launch(&plan)?;
        let first = bottle.exec(&truth)?;
        start.push(t0.elapsed());
        assert_eq!(first.exit_code, 0);
        if idle.is_none() {
            std::thread::sleep(Duration::from_secs(3));
            let mut total = 0;
            for role in ["agent", "bundle"] {
                total += memory(engine, &format!("{}-{role}", spec.name))?;
            }
            idle = Some(total);
        }
        let t1 = Instant::now();
        backend.stop(bottle.name())?;
        stop.push(t1.elapsed());

        let name = format!("bottle-bench-raw-{i}");
        let t2 = Instant::now();
        engine.block_on(engine.docker.create_container(
            Some(CreateContainerOptionsBuilder::default().name(&name).build()),
            ContainerCreateBody {
                image: Some(IMAGE.into()),
                cmd: Some(vec!["sleep".into(), "3600".into()]),
                ..ContainerCreateBody::default()
            },
        ))?;
        engine.block_on(engine.docker.start_container(&name, None))?;
        let out = engine.block_on(exec_captured(engine, &name, &truth, None))?;
        raw.push(t2.elapsed());
        assert_eq!(out.exit_code, 0);
        engine.block_on(engine.docker.remove_container(
            &name,
            Some(RemoveContainerOptionsBuilder::default().force(true).build()),
        ))?;
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let summary = |v: &mut Vec<Duration>| {
        v.sort();
        format!(
            "{:.0} ms median, {:.0}-{:.0} ms",
            ms(&v[v.len() / 2]),
            ms(&v[0]),
            ms(&v[v.len() - 1])
        )
    };
    println!("| measurement ({iterations} runs) | result |");
    println!("| --- | --- |");
    println!(
        "| bottle start to first exec (prepare + launch + exec) | {} |",
        summary(&mut start)
    );
    println!("| bottle stop | {} |", summary(&mut stop));
    println!(
        "| raw Engine API create + start + exec, same image | {} |",
        summary(&mut raw)
    );
    if let Some(bytes) = idle {
        println!(
            "| idle memory of one bottle (agent + bundle) | {:.1} MiB |",
            bytes as f64 / f64::from(1 << 20)
        );
    }
    Ok(())
}

fn memory(
    engine: &bottle_docker::client::Engine,
    container: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    let options = StatsOptionsBuilder::default().stream(false).build();
    let stats =
        engine.block_on(async { engine.docker.stats(container, Some(options)).next().await });
    let stats = stats.ok_or("no stats")??;
    let memory = stats.memory_stats.ok_or("no memory stats")?;
    // Like `docker stats`: usage minus the page cache that can be dropped.
    let cache = memory
        .stats
        .as_ref()
        .and_then(|s| {
            s.get("inactive_file")
                .or_else(|| s.get("total_inactive_file"))
                .copied()
        })
        .unwrap_or(0);
    Ok(memory.usage.unwrap_or(0).saturating_sub(cache))
}
