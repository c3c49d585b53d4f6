//! `cargo xtask sandbox-escape [--backend docker|smolmachines]
//! [--isolation container|gvisor] [--json] [--keep-going]
//! [--skip-dockerd-restart]`: the acceptance gate every backend, and every
//! isolation tier of the docker backend, must pass.
//!
//! Exit codes: 0 only when every attack was blocked and every positive
//! control passed; 10 on any escape; 1 on a failed control, a probe that
//! could not tell, or a harness error.

pub(crate) mod canary;
pub(crate) mod cli;
pub(crate) mod dns;
pub(crate) mod dockerd;
pub(crate) mod engine;
pub(crate) mod evidence;
pub(crate) mod fixture;
pub(crate) mod gate;
pub(crate) mod posture;
pub(crate) mod probe;
pub(crate) mod report;
pub(crate) mod resolv;
pub(crate) mod route;
pub(crate) mod smol;
pub(crate) mod sys;
pub(crate) mod teardown;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;

use self::report::Report;
use self::sys::{RealSys, Sys};

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Args {
    /// `docker` or `smolmachines`.
    pub backend: String,
    /// The agents' isolation tier: `container` or `gvisor` (docker only).
    pub isolation: String,
    /// Print the report as JSON instead of the table.
    pub json: bool,
    /// Go on after a harness error in a fault phase.
    pub keep_going: bool,
    /// Do not restart dockerd (recorded as an unproven row).
    pub skip_dockerd_restart: bool,
}

/// Parses the arguments after `sandbox-escape`.
pub(crate) fn parse_args(args: &[String]) -> anyhow::Result<Args> {
    let mut parsed = Args {
        backend: "docker".into(),
        isolation: "container".into(),
        json: false,
        keep_going: false,
        skip_dockerd_restart: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => parsed.json = true,
            "--keep-going" => parsed.keep_going = true,
            "--skip-dockerd-restart" => parsed.skip_dockerd_restart = true,
            "--backend" => match it.next() {
                Some(b) => parsed.backend = b.clone(),
                None => bail!("--backend needs a value: docker or smolmachines"),
            },
            "--isolation" => match it.next() {
                Some(i) => parsed.isolation = i.clone(),
                None => bail!("--isolation needs a value: container or gvisor"),
            },
            other => match (
                other.strip_prefix("--backend="),
                other.strip_prefix("--isolation="),
            ) {
                (Some(b), _) => parsed.backend = b.to_string(),
                (_, Some(i)) => parsed.isolation = i.to_string(),
                _ => bail!(
                    "unknown argument {other:?}\n  usage: cargo xtask sandbox-escape [--backend docker|smolmachines] [--isolation container|gvisor] [--json] [--keep-going] [--skip-dockerd-restart]"
                ),
            },
        }
    }
    if !bottle_core::isolation::Isolation::CHOICES.contains(&parsed.isolation.as_str()) {
        bail!(
            "unknown isolation {:?}\n  fix: --isolation container or --isolation gvisor",
            parsed.isolation
        );
    }
    if parsed.isolation == "gvisor" && parsed.backend != "docker" {
        bail!(
            "--isolation gvisor is a tier of the docker backend\n  fix: --backend docker --isolation gvisor"
        );
    }
    if !["docker", "smolmachines"].contains(&parsed.backend.as_str()) {
        bail!(
            "unknown backend {:?}\n  fix: --backend docker or --backend smolmachines",
            parsed.backend
        );
    }
    Ok(parsed)
}

/// A fresh random token for the run (the canaries answer with it).
fn token() -> String {
    let mut bytes = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !ok {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (nanos as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("btl{hex}")
}

/// Runs the gate.
pub(crate) fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let args = parse_args(args)?;
    teardown::watch_signals()?;
    let started = Instant::now();
    let sys: Arc<dyn Sys> = Arc::new(RealSys);
    let mut report = Report {
        backend: args.backend.clone(),
        isolation: args.isolation.clone(),
        token: token(),
        ..Report::default()
    };
    let backend = if args.backend == "smolmachines" {
        match smol::select(sys.clone()) {
            Ok(target) => {
                if target.fake {
                    eprintln!(
                        "sandbox-escape: WARNING: {}={} with {}=1: the phases run against the fake-smolvm test double, whose `machine exec` runs on the host; nothing is isolated and escapes are expected (the gate's negative control)",
                        smol::SMOLVM_ENV,
                        target.program.display(),
                        smol::FAKE_NO_KVM_ENV
                    );
                }
                gate::Backend::Smolmachines(target)
            }
            Err(reason) => {
                eprintln!(
                    "sandbox-escape: --backend smolmachines cannot run on this host: {reason}"
                );
                eprintln!("  not a pass: nothing was probed");
                return Ok(ExitCode::from(report::EXIT_FAILED));
            }
        }
    } else {
        gate::Backend::Docker
    };
    let options = gate::Options {
        backend,
        gvisor: args.isolation == "gvisor",
        keep_going: args.keep_going,
        skip_dockerd_restart: args.skip_dockerd_restart,
    };
    let result = gate::run(&options, sys, &mut report);
    teardown::wait_if_interrupted();
    // Anything a guard did not undo (a panic path, an early return).
    teardown::run_all(false);
    if let Err(err) = result {
        report.harness_errors.push(format!("{err:#}"));
    }
    report.duration_ms = started.elapsed().as_millis();
    if args.json {
        println!("{}", report.render_json());
    } else {
        print!("{}", report.render_table());
    }
    Ok(report.exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> anyhow::Result<Args> {
        parse_args(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn arguments_parse() {
        let a = args(&[]).unwrap();
        assert_eq!(
            (a.backend.as_str(), a.json, a.keep_going),
            ("docker", false, false)
        );
        let a = args(&["--backend", "smolmachines", "--json"]).unwrap();
        assert_eq!((a.backend.as_str(), a.json), ("smolmachines", true));
        assert!(
            args(&["--backend=docker", "--keep-going"])
                .unwrap()
                .keep_going
        );
        assert!(args(&["--backend", "podman"]).is_err());
        let a = args(&["--isolation", "gvisor"]).unwrap();
        assert_eq!(
            (a.backend.as_str(), a.isolation.as_str()),
            ("docker", "gvisor")
        );
        assert_eq!(args(&[]).unwrap().isolation, "container");
        assert!(args(&["--isolation=kata"]).is_err());
        assert!(args(&["--backend", "smolmachines", "--isolation", "gvisor"]).is_err());
        assert!(args(&["--backend"]).is_err());
        assert!(args(&["--frobnicate"]).is_err());
    }

    #[test]
    fn tokens_differ() {
        let (a, b) = (token(), token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 19);
    }
}
