//! Many bottles at once, and what an idle one costs, against raw Docker
//! in one run on the real daemon.
//!
//! - Idle memory: one bottle (its agent and bundle containers and their
//!   two containerd shims) against one raw container of the same image
//!   running `sleep` (the container and its shim). A container counts as
//!   `docker stats` counts it on cgroup v1 (usage minus inactive file
//!   cache), a shim as its proportional set size.
//! - Scale: N bottles launched at the same time through the library
//!   (`prepare` + `launch`, planning again when a concurrent launch took
//!   the planned subnet, as `bottle start -y` does), each one's start time
//!   against one cold start alone and against N `docker run -d` at the
//!   same time; the memory of all of them against N raw containers, and
//!   the host's `MemAvailable` drop; then, from inside
//!   every bottle, its allowlist: an allowed name (pinned with
//!   `egress.resolve` to a server this bench runs on the egress bridge's
//!   host address) answers, a denied one is refused.
//!
//! `cargo xtask bench` runs it with the static binaries; by hand:
//! `BOTTLE_BUNDLE_BIN=… BOTTLE_TOOLBOX_BIN=… cargo bench --profile dev -p
//! bottle-docker --bench scale [-- --quick]` (N = 50, `--quick`: 10).
//! Every bottle and container it makes is removed at the end, also when
//! it fails. Every loop is bounded in count, every wait in time.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bottle_core::backend::BackendErrorKind;
use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::names::{EGRESS_NETWORK, ResourceNames};
use bottle_docker::{DockerBackend, DockerOptions};
use bottle_test_support::bench::{docker, docker_output, ms, percentile};

const TAG: &str = "bottle-demo-agent:bench";
/// How many times a launch plans again when its subnet was taken
/// (`bottle start -y` does the same).
const REPLANS: usize = 8;

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let count = if quick { 10 } else { 50 };
    let bundle = std::env::var_os("BOTTLE_BUNDLE_BIN")
        .map(PathBuf::from)
        .expect("set BOTTLE_BUNDLE_BIN to the static bundle");
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = || {
        let mut options = DockerOptions::new(state.path());
        options.bundle_bin = Some(bundle.clone());
        options
    };
    let backend = DockerBackend::new(options()).unwrap();
    backend.preflight().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent");
    backend
        .build_demo_agent(&demo, Path::new("/bin/busybox"), TAG)
        .unwrap();
    let mut cleanup = Cleanup {
        backend: &backend,
        bottles: Vec::new(),
        containers: Vec::new(),
    };

    // One raw container of the same image, idle.
    let raw = "bottle-bench-scale-raw";
    cleanup.containers.push(raw.to_string());
    assert!(docker(&[
        "run",
        "-d",
        "--name",
        raw,
        "--entrypoint",
        "/bin/busybox",
        TAG,
        "sleep",
        "3600"
    ]));

    // One bottle alone: the cold start without load, and the bottle whose
    // egress bridge the allowlist checks use (it runs to the end).
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(&manifest, manifest_text(None)).unwrap();
    let solo = "scale-solo";
    cleanup.bottles.push(solo.to_string());
    let started = Instant::now();
    let (_, replans) = start(&backend, &manifest, state.path(), solo);
    let alone = started.elapsed();
    assert_eq!(replans, 0);

    let engine = backend.engine().unwrap();
    let gateway: Ipv4Addr = engine
        .block_on(engine.docker.inspect_network(EGRESS_NETWORK, None))
        .unwrap()
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().find_map(|c| c.gateway))
        .expect("the egress network has a gateway")
        .parse()
        .unwrap();
    let port = serve_ok(gateway);
    std::fs::write(&manifest, manifest_text(Some((gateway, port)))).unwrap();

    let raw_memory = container_memory(raw);
    let solo_memory = bottle_memory(solo);

    // N at once.
    let available_before = mem_available();
    let names: Vec<String> = (0..count).map(|i| format!("scale-{i}")).collect();
    cleanup.bottles.extend(names.iter().cloned());
    let barrier = Arc::new(Barrier::new(count));
    let launches: Vec<(Duration, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .iter()
            .map(|name| {
                let (barrier, manifest, state, options) =
                    (barrier.clone(), &manifest, state.path(), options());
                scope.spawn(move || {
                    let backend = DockerBackend::new(options).unwrap();
                    barrier.wait();
                    let started = Instant::now();
                    let (_, replans) = start(&backend, manifest, state, name);
                    (started.elapsed(), replans)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let starts: Vec<Duration> = launches.iter().map(|(d, _)| *d).collect();
    let replans: usize = launches.iter().map(|(_, r)| r).sum();
    let available_after = mem_available();

    // N raw containers started at the same time (the baseline under the
    // same load), kept beside the bottles so that both share the shims'
    // pages the same way when they are measured.
    let raws: Vec<String> = (0..count).map(|i| format!("{raw}-{i}")).collect();
    cleanup.containers.extend(raws.iter().cloned());
    let raw_started = mem_available();
    let barrier = Arc::new(Barrier::new(count));
    let raw_starts: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = raws
            .iter()
            .map(|name| {
                let barrier = barrier.clone();
                scope.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    assert!(docker(&[
                        "run",
                        "-d",
                        "--name",
                        name,
                        "--entrypoint",
                        "/bin/busybox",
                        TAG,
                        "sleep",
                        "3600"
                    ]));
                    started.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let raw_available_after = mem_available();
    let memories: Vec<Memory> = names.iter().map(|n| bottle_memory(n)).collect();
    let raw_memories: Vec<Part> = raws.iter().map(|n| container_memory(n)).collect();
    let total: u64 = memories.iter().map(Memory::total).sum();
    let raw_total: u64 = raw_memories.iter().map(Part::total).sum();

    // Each bottle's allowlist, from inside it, a few bottles at a time.
    let verdicts: Vec<(bool, bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .chunks(count.div_ceil(8))
            .map(|chunk| {
                let backend = &backend;
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|name| allowlist_holds(backend, name, port))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let allowed_ok = verdicts.iter().filter(|(allowed, _)| *allowed).count();
    let denied_refused = verdicts.iter().filter(|(_, denied)| *denied).count();

    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let ratio = |a: u64, b: u64| a as f64 / b as f64;
    println!("| measure | bottle | baseline | baseline value | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    for (what, bottle, raw) in [
        (
            "cgroups + shims' proportional share (PSS)",
            solo_memory.total(),
            raw_memory.total(),
        ),
        (
            "cgroups + shims' resident sets (RSS)",
            solo_memory.with_rss(),
            raw_memory.with_rss(),
        ),
        (
            "cgroups + shims' private pages",
            solo_memory.with_private(),
            raw_memory.with_private(),
        ),
    ] {
        println!(
            "| idle memory of one bottle, {what}, MiB | {:.1} | one raw container (`sleep`) | {:.1} | {:.2} |",
            mib(bottle),
            mib(raw),
            ratio(bottle, raw)
        );
    }
    println!(
        "| … cgroups: agent / bundle, MiB | {:.1} / {:.1} | raw container | {:.1} | |",
        mib(solo_memory.agent.cgroup),
        mib(solo_memory.bundle.cgroup),
        mib(raw_memory.cgroup),
    );
    println!(
        "| … shims: agent / bundle RSS (PSS, private), MiB | {:.1} ({:.1}, {:.1}) / {:.1} ({:.1}, {:.1}) | raw container's shim | {:.1} ({:.1}, {:.1}) | |",
        mib(solo_memory.agent.shim.rss),
        mib(solo_memory.agent.shim.pss),
        mib(solo_memory.agent.shim.private),
        mib(solo_memory.bundle.shim.rss),
        mib(solo_memory.bundle.shim.pss),
        mib(solo_memory.bundle.shim.private),
        mib(raw_memory.shim.rss),
        mib(raw_memory.shim.pss),
        mib(raw_memory.shim.private),
    );
    let (p50, alone_ms) = (percentile(&starts, 50), ms(alone));
    println!(
        "| start, {count} at once, p50 (p99), ms | {:.0} ({:.0}) | one start alone | {:.0} | {:.2} |",
        ms(p50),
        ms(percentile(&starts, 99)),
        alone_ms,
        ms(p50) / alone_ms
    );
    let raw_p50 = percentile(&raw_starts, 50);
    println!(
        "| start, {count} at once, p50 (p99), ms | {:.0} ({:.0}) | `docker run -d`, {count} at once, p50 (p99) | {:.0} ({:.0}) | {:.2} |",
        ms(p50),
        ms(percentile(&starts, 99)),
        ms(raw_p50),
        ms(percentile(&raw_starts, 99)),
        ms(p50) / ms(raw_p50)
    );
    println!(
        "| memory of {count} idle bottles (cgroups + shims' PSS), MiB | {:.1} | {count} raw containers beside them | {:.1} | {:.2} |",
        mib(total),
        mib(raw_total),
        ratio(total, raw_total)
    );
    let mib_drop = |before: u64, after: u64| (before as f64 - after as f64) / (1024.0 * 1024.0);
    println!(
        "| host MemAvailable drop, MiB (shared machine: noisy) | {:.1} over the {count} launches | over the {count} raw starts | {:.1} | |",
        mib_drop(available_before, available_after),
        mib_drop(raw_started, raw_available_after)
    );
    println!(
        "| allowlist from inside: allowed answered / denied refused | {allowed_ok} / {denied_refused} of {count} | | | |"
    );
    println!("\nre-plans after a taken subnet: {replans}");
    assert_eq!(allowed_ok, count, "an allowed host did not answer");
    assert_eq!(denied_refused, count, "a denied host was not refused");
    drop(cleanup);
}

fn manifest_text(upstream: Option<(Ipv4Addr, u16)>) -> String {
    let (ports, resolve) = match upstream {
        Some((ip, port)) => (
            format!("ports = [{port}]\n"),
            format!("[agents.bench.egress.resolve]\n\"allowed.bottle.test\" = \"{ip}\"\n"),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "[agents.bench]\nimage = \"{TAG}\"\ncommand = [\"/bin/sh\"]\n[agents.bench.egress]\nallow = [\"allowed.bottle.test\"]\n{ports}{resolve}"
    )
}

/// Prepares and launches `name`, planning again (bounded) when a launch
/// running at the same time took the planned subnet first. Returns the
/// bottle's name and how many times it planned again.
fn start(backend: &DockerBackend, manifest: &Path, state: &Path, name: &str) -> (String, usize) {
    let loaded = bottle_core::manifest::load(manifest).unwrap();
    let spec = BottleSpec::new(&loaded, manifest, "bench", Some(name), state).unwrap();
    for replans in 0..=REPLANS {
        let plan = backend.prepare(&spec).unwrap();
        match backend.launch(&plan) {
            Ok(bottle) => return (bottle.name().to_string(), replans),
            Err(err) if err.kind == BackendErrorKind::PlanTaken => continue,
            Err(err) => panic!("{name}: {err} ({})", err.code),
        }
    }
    panic!("{name}: the subnet was taken {REPLANS} times in a row")
}

/// Asks the bundle's proxy, from inside bottle `name`, for the allowed
/// name and for a denied one; true for each that the allowlist treats
/// right: the allowed one answers `200 ... ok` from this bench's server,
/// the denied one gets the proxy's `403`.
fn allowlist_holds(backend: &DockerBackend, name: &str, port: u16) -> (bool, bool) {
    let bottle = backend.attach_bottle(name).unwrap();
    let ask = |host: &str| {
        // busybox nc: stdin is held open (bounded) so the answer is read.
        let script = format!(
            "proxy=${{HTTP_PROXY#http://}}; proxy=${{proxy%/}}; (printf 'GET http://{host}:{port}/ HTTP/1.1\\r\\nHost: {host}:{port}\\r\\nConnection: close\\r\\n\\r\\n'; sleep 3) | timeout 15 nc -w 10 ${{proxy%:*}} ${{proxy##*:}}"
        );
        let out = bottle_core::Bottle::exec(&bottle, &sh(&script)).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let allowed = ask("allowed.bottle.test");
    let denied = ask("denied.bottle.test");
    let allowed_ok = allowed.starts_with("HTTP/1.1 200") && allowed.ends_with("ok");
    let denied_refused = denied.starts_with("HTTP/1.1 403");
    if !allowed_ok {
        println!("{name}: the allowed host did not answer: {allowed:?}");
    }
    if !denied_refused {
        println!("{name}: the denied host was not refused: {denied:?}");
    }
    (allowed_ok, denied_refused)
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// Answers every request with `ok` on `ip`, in a thread that lives as
/// long as the bench.
fn serve_ok(ip: Ipv4Addr) -> u16 {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            });
        }
    });
    port
}

/// What one container costs: its cgroup as `docker stats` counts it, and
/// its containerd shim, whose pages are mostly the shim binary's and shared
/// with every other shim: its resident set (what `ps` shows, and how issue
/// 16 first counted), its proportional share, and what is its own alone.
#[derive(Clone, Copy, Default)]
struct Part {
    cgroup: u64,
    shim: Shim,
}

#[derive(Clone, Copy, Default)]
struct Shim {
    rss: u64,
    pss: u64,
    private: u64,
}

impl Part {
    /// The container's cgroup and its shim's proportional share: summed
    /// over every container running, what the host pays.
    fn total(&self) -> u64 {
        self.cgroup + self.shim.pss
    }

    fn with_rss(&self) -> u64 {
        self.cgroup + self.shim.rss
    }

    fn with_private(&self) -> u64 {
        self.cgroup + self.shim.private
    }
}

#[derive(Clone, Copy, Default)]
struct Memory {
    agent: Part,
    bundle: Part,
}

impl Memory {
    fn total(&self) -> u64 {
        self.agent.total() + self.bundle.total()
    }

    fn with_rss(&self) -> u64 {
        self.agent.with_rss() + self.bundle.with_rss()
    }

    fn with_private(&self) -> u64 {
        self.agent.with_private() + self.bundle.with_private()
    }
}

fn bottle_memory(name: &str) -> Memory {
    let names = ResourceNames::for_slug(name);
    Memory {
        agent: container_memory(&names.agent),
        bundle: container_memory(&names.bundle),
    }
}

fn container_memory(name: &str) -> Part {
    let id = docker_output(&["inspect", "--format", "{{.Id}}", name]);
    let id = id.trim();
    let cgroup = Path::new("/sys/fs/cgroup/memory/docker").join(id);
    let usage: u64 = read_number(&cgroup.join("memory.usage_in_bytes"));
    let stat = std::fs::read_to_string(cgroup.join("memory.stat")).unwrap();
    let inactive_file: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Part {
        cgroup: usage.saturating_sub(inactive_file),
        shim: shim_memory(id),
    }
}

/// The memory of the `containerd-shim-runc-v2` whose `-id` is `id`.
fn shim_memory(id: &str) -> Shim {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
        if is_shim
            && args
                .windows(2)
                .any(|w| w[0] == b"-id" && w[1] == id.as_bytes())
        {
            let rollup =
                std::fs::read_to_string(entry.path().join("smaps_rollup")).unwrap_or_default();
            let field = |name: &str| {
                rollup
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .map_or(0, |kb| kb * 1024)
            };
            return Shim {
                rss: field("Rss:"),
                pss: field("Pss:"),
                private: field("Private_Clean:") + field("Private_Dirty:"),
            };
        }
    }
    panic!("no containerd shim found for container {id}")
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap()
}

fn read_number(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Removes every bottle and container the bench made, also when it
/// panicked half-way.
struct Cleanup<'a> {
    backend: &'a DockerBackend,
    bottles: Vec<String>,
    containers: Vec<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let backend = self.backend;
        std::thread::scope(|scope| {
            for chunk in self.bottles.chunks(8) {
                scope.spawn(move || {
                    for name in chunk {
                        if let Err(err) = backend.stop(name)
                            && err.code != "BOT-D031"
                        {
                            println!("cleanup: {name}: {err}");
                        }
                    }
                });
            }
        });
        for container in &self.containers {
            docker(&["rm", "-f", container]);
        }
    }
}
