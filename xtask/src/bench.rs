//! `cargo xtask bench [--quick] [BENCH...]`: every benchmark (or those
//! named), each against its baseline in the same run, with the static
//! binaries bottle ships. The tables they print are what `docs/PERF.md`
//! records.

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

/// Builds the static binaries and the Debian agent image, then runs each bench, or those named by
/// bench target; `--quick` makes every bench run smaller. Anything else is refused.
pub(crate) fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let Some((quick, benches)) = parse(args) else {
        let names: Vec<&str> = BENCHES.iter().map(|(_, bench)| *bench).collect();
        eprintln!(
            "usage: cargo xtask bench [--quick] [BENCH...]\nBENCH is one of: {}",
            names.join(", ")
        );
        return Ok(ExitCode::from(2));
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
    for (package, bench) in benches {
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

/// `--quick` and the benches named (all when none is), or `None` for an
/// argument that is neither `--quick` nor a bench's name.
fn parse(args: &[String]) -> Option<(bool, Vec<(&'static str, &'static str)>)> {
    let mut quick = false;
    let mut named = Vec::new();
    for arg in args {
        if arg == "--quick" {
            quick = true;
        } else {
            named.push(*BENCHES.iter().find(|(_, bench)| bench == arg)?);
        }
    }
    if named.is_empty() {
        named = BENCHES.to_vec();
    }
    Some((quick, named))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn the_benches_named_run_in_the_order_named_and_an_unknown_name_is_refused() {
        assert_eq!(parse(&args(&[])), Some((false, BENCHES.to_vec())));
        assert_eq!(
            parse(&args(&["start", "--quick", "sandbox"])),
            Some((
                true,
                vec![("bottle-cli", "start"), ("bottle-docker", "sandbox")]
            ))
        );
        assert_eq!(parse(&args(&["sandbox", "nosuch"])), None);
        assert_eq!(parse(&args(&["--slow"])), None);
    }
}
