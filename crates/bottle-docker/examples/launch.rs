//! Prepares and launches one bottle with the docker backend, without the
//! CLI: `launch MANIFEST AGENT NAME STATE_ROOT [--detach]`.
//!
//! Prints `launched <bottle>` once the bottle is up, then waits for stdin
//! to close and stops it; with `--detach` it exits at once and leaves the
//! bottle running. The integration tests run it as the "owner"
//! process they kill mid-launch (with `BOTTLE_FAILPOINT=<step>:sleep`) to
//! leave an orphan behind for `cleanup`.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example reports what it did on the terminal"
)]

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::{DockerBackend, DockerOptions};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (detach, args) = match args.split_last() {
        Some((last, rest)) if last == "--detach" => (true, rest),
        _ => (false, args.as_slice()),
    };
    let [manifest, agent, name, state_root] = args else {
        eprintln!("usage: launch MANIFEST AGENT NAME STATE_ROOT [--detach]");
        return ExitCode::from(2);
    };
    match run(manifest.into(), agent, name, state_root.into(), detach) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("launch: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    manifest_path: PathBuf,
    agent: &str,
    name: &str,
    state_root: PathBuf,
    detach: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let manifest = bottle_core::manifest::load(&manifest_path)?;
    let spec = BottleSpec::new(&manifest, &manifest_path, agent, Some(name), &state_root)?;
    let mut options = DockerOptions::new(&state_root);
    options.progress = Some(std::sync::Arc::new(|line: &str| eprintln!("  {line}")));
    options.detach = detach;
    let backend = DockerBackend::new(options)?;
    backend.preflight()?;
    let plan = backend.prepare(&spec)?;
    let bottle = backend.launch(&plan)?;
    println!("launched {}", bottle.name());
    if detach {
        return Ok(());
    }
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    let report = backend.stop(bottle.name())?;
    for line in report.removed {
        eprintln!("removed {line}");
    }
    Ok(())
}
