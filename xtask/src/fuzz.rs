//! `cargo xtask fuzz [--seconds N] [--seed S] [--cases N]
//! [--target proxy|gitgate|supervise|all] [--bin PATH]`: the long fuzz
//! campaign against a real `bottle-bundle` (a debug build unless `--bin`
//! names one), with the generators and oracles of the short run in
//! bottle-bundle's tests (`bottle_test_support::fuzz`). `--cases` replays
//! a finding: the seed and case count it printed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use bottle_test_support::fuzz::{self, Budget, Campaign, Target};

use crate::dist::target_dir;
use crate::process::{cargo, describe_exit, watch};

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [--seed S] [--cases N] [--target proxy|gitgate|supervise|all] [--bin PATH]";

/// What the command line asked for.
#[derive(Debug, PartialEq)]
pub(crate) struct Args {
    seed: Option<u64>,
    budget: Budget,
    targets: Vec<Target>,
    bin: Option<PathBuf>,
}

pub(crate) fn parse_args(args: &[String]) -> anyhow::Result<Args> {
    let mut parsed = Args {
        seed: None,
        budget: Budget::Time(Duration::from_secs(300)),
        targets: Target::ALL.to_vec(),
        bin: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{flag} needs a value\n  {USAGE}"))
        };
        match flag.as_str() {
            "--seconds" => parsed.budget = Budget::Time(Duration::from_secs(number(value()?)?)),
            "--cases" => parsed.budget = Budget::Cases(number(value()?)?),
            "--seed" => parsed.seed = Some(number(value()?)?),
            "--bin" => parsed.bin = Some(PathBuf::from(value()?)),
            "--target" => {
                let name = value()?;
                parsed.targets = if name == "all" {
                    Target::ALL.to_vec()
                } else {
                    vec![Target::parse(name).with_context(|| {
                        format!("unknown target {name:?}\n  fix: --target proxy, gitgate, supervise or all")
                    })?]
                };
            }
            other => bail!("unknown argument {other:?}\n  {USAGE}"),
        }
    }
    Ok(parsed)
}

fn number(text: &str) -> anyhow::Result<u64> {
    text.parse()
        .with_context(|| format!("{text:?} is not a whole number\n  {USAGE}"))
}

/// Builds the bundle unless `--bin` names one, then runs the campaign.
pub(crate) fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let args = parse_args(args)?;
    let bin = match args.bin {
        Some(bin) => bin,
        None => {
            let out = watch(cargo().args(["build", "-p", "bottle-bundle"]))?;
            if !out.success() {
                bail!("building bottle-bundle failed ({})", describe_exit(&out));
            }
            target_dir().join("debug").join("bottle-bundle")
        }
    };
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let campaign = Campaign {
        seed,
        targets: args.targets,
        budget: args.budget,
        batch: 100,
    };
    let budget = match campaign.budget {
        Budget::Cases(n) => format!("{n} cases"),
        Budget::Time(t) => format!("{} s", t.as_secs()),
    };
    println!(
        "fuzz: seed {seed}, {budget} per target, against {}",
        bin.display()
    );
    match fuzz::run(&bin, &campaign, |line| println!("fuzz: {line}")) {
        Ok(summaries) => {
            for s in summaries {
                let statuses: Vec<String> = s
                    .statuses
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect();
                println!(
                    "fuzz: {} held: {} cases, slowest close {} ms; answers {}",
                    s.target.name(),
                    s.cases,
                    s.slowest_close.as_millis(),
                    statuses.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("{err}");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> anyhow::Result<Args> {
        parse_args(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_to_five_minutes_of_every_target() {
        let a = args(&[]).unwrap();
        assert_eq!(a.budget, Budget::Time(Duration::from_secs(300)));
        assert_eq!(a.targets, Target::ALL.to_vec());
        assert_eq!(a.seed, None);
    }

    #[test]
    fn a_replay_names_seed_target_and_cases() {
        let a = args(&["--target", "gitgate", "--seed", "13", "--cases", "50"]).unwrap();
        assert_eq!(a.targets, vec![Target::GitGate]);
        assert_eq!(a.seed, Some(13));
        assert_eq!(a.budget, Budget::Cases(50));
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(args(&["--target", "dns"]).is_err());
        assert!(args(&["--seconds"]).is_err());
        assert!(args(&["--seed", "x"]).is_err());
        assert!(args(&["--frobnicate"]).is_err());
    }
}
