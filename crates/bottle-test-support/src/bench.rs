//! What the Docker-backed benches share: the `docker` CLI as their
//! baseline, and the table row every bench prints (bottle's p50 and p99
//! against a baseline measured in the same run, and the ratio of p50s).

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a bench prints its table and fails loudly"
)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The static bundle `BOTTLE_BUNDLE_BIN` names, once `BOTTLE_TOOLBOX_BIN`
/// names the static in-box agent too: what every bench that launches
/// bottles needs (`cargo xtask bench` sets both).
pub fn static_bundle() -> PathBuf {
    assert!(
        std::env::var_os("BOTTLE_TOOLBOX_BIN").is_some(),
        "set BOTTLE_TOOLBOX_BIN to the static in-box agent"
    );
    std::env::var_os("BOTTLE_BUNDLE_BIN")
        .map(PathBuf::from)
        .expect("set BOTTLE_BUNDLE_BIN to the static bundle")
}

/// The Debian test image's tag ([`crate::DEBIAN_IMAGE_ENV`]), or `None`
/// after a line saying its rows are left out.
pub fn debian_image() -> Option<String> {
    let image = std::env::var(crate::DEBIAN_IMAGE_ENV).ok();
    if image.is_none() {
        println!(
            "({} is not set: the Debian image's rows are left out; `cargo xtask bench` sets it)\n",
            crate::DEBIAN_IMAGE_ENV
        );
    }
    image
}

/// Runs `docker ARGS` with its output discarded; whether it succeeded.
pub fn docker(args: &[&str]) -> bool {
    #[expect(
        clippy::disallowed_methods,
        reason = "the baseline is the docker CLI itself"
    )]
    let status = Command::new("docker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run docker");
    status.success()
}

/// Runs `docker ARGS`; its stdout. Panics when it fails.
pub fn docker_output(args: &[&str]) -> String {
    #[expect(
        clippy::disallowed_methods,
        reason = "the baseline is the docker CLI itself"
    )]
    let output = Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    assert!(output.status.success(), "docker {args:?} failed");
    String::from_utf8(output.stdout).unwrap()
}

/// How long `f` took.
pub fn time(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

/// The `p`th percentile (nearest rank) of `samples`, which must not be
/// empty.
pub fn percentile(samples: &[Duration], p: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// The index of the median sample (the run whose details a bench shows).
pub fn median_index(samples: &[Duration]) -> usize {
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|&i| samples[i]);
    order[order.len() / 2]
}

/// Milliseconds, for the tables.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One table row: `| what | p50 (p99) | baseline | p50 (p99) | ratio |`.
pub fn row(what: &str, ours: &[Duration], baseline_name: &str, baseline: &[Duration]) {
    let (a, b) = (percentile(ours, 50), percentile(baseline, 50));
    println!(
        "| {what} | {:.2} ({:.2}) | {baseline_name} | {:.2} ({:.2}) | {:.2} |",
        ms(a),
        ms(percentile(ours, 99)),
        ms(b),
        ms(percentile(baseline, 99)),
        a.as_secs_f64() / b.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_median_pick_by_rank() {
        let samples: Vec<Duration> = [5, 1, 4, 2, 3].map(Duration::from_millis).to_vec();
        assert_eq!(percentile(&samples, 50), Duration::from_millis(3));
        assert_eq!(percentile(&samples, 99), Duration::from_millis(5));
        assert_eq!(percentile(&samples, 0), Duration::from_millis(1));
        assert_eq!(median_index(&samples), 4);
    }
}
