//! `cargo xtask bench [--quick]`: every benchmark, each against its
//! baseline in the same run, with the static binaries bottle ships. The
//! tables they print are what `docs/PERF.md` records.

use std::process::ExitCode;

use crate::process::{cargo, watch};
use crate::{agent_image, dist};

/// The benches, by package and bench target.
const BENCHES: &[(&str, &str)] = &[
    ("bottle-bundle", "proxy"),
    ("bottle-bundle", "scanner"),
    ("bottle-docker", "sandbox"),
    ("bottle-docker", "scale"),
    ("bottle-docker", "pool"),
    ("bottle-docker", "gvisor"),
    ("bottle-cli", "start"),
    ("bottle-cli", "stop"),
];

/// Builds the static binaries and the Debian agent image, then runs each bench; `--quick` makes every
/// bench run smaller. Extra arguments are refused.
pub(crate) fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let quick = match args {
        [] => false,
        [flag] if flag == "--quick" => true,
        _ => {
            eprintln!("usage: cargo xtask bench [--quick]");
            return Ok(ExitCode::from(2));
        }
    };
    let binaries = dist::run()?;
    // Start benches measure a real agent image too, beside the demo's.
    let debian_image = agent_image::ensure()?;
    // The pool's bench drives the real `bottle` binary, built as the CLI's
    // own benches build it (release), so every bench times the same CLI.
    if !watch(cargo().args(["build", "--release", "-p", "bottle-cli"]))?.success() {
        anyhow::bail!("cargo build --release -p bottle-cli failed");
    }
    let cli = dist::target_dir().join("release").join("bottle");
    let mut failed = Vec::new();
    for (package, bench) in BENCHES {
        let mut command = cargo()
            .args(["bench", "-p", package, "--bench", bench])
            .env("BOTTLE_BUNDLE_BIN", &binaries.bundle)
            .env("BOTTLE_TOOLBOX_BIN", &binaries.toolbox)
            .env("BOTTLE_CLI_BIN", &cli)
            .env(agent_image::TAG_ENV, &debian_image);
        if quick {
            command = command.args(["--", "--quick"]);
        }
        println!("== {package}: {bench}");
        if !watch(command)?.success() {
            failed.push(format!("{package}/{bench}"));
        }
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("failed: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}
