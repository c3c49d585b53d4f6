//! The sandbox-escape probe, run inside a bottle by `cargo xtask
//! sandbox-escape`. [`contract`] is what the harness and the probe agree on:
//! the config the harness writes, the one-JSON-line-per-probe result the
//! probe prints. [`probes`] holds the named attempts, one module per
//! category; [`child`] the helper processes some of them spawn (sleepers for
//! the fork bomb, the memory hog, a user-namespace attempt) so that the
//! probe itself never forks without exec'ing and never changes its own
//! state.
//!
//! **Invariant:** every network attempt aims only at an address taken from
//! the config's `targets` (or the bottle's own `/etc/resolv.conf`), and every
//! attempt is bounded in time and count.

pub mod child;
pub mod contract;
mod net;
pub mod probes;
mod sys;

use std::io::Write;
use std::path::Path;

pub use probes::{Startup, run};

/// Why the probe could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The config file could not be read.
    #[error(
        "could not read the probe config {path}: {source}; fix: pass --config with a readable JSON file"
    )]
    ReadConfig {
        /// The path given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not a valid [`contract::ProbeConfig`].
    #[error(
        "the probe config {path} is not valid: {source}; fix: write it from bottle_probe::contract::ProbeConfig"
    )]
    ParseConfig {
        /// The path given.
        path: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// Writing a result line failed (stdout closed).
    #[error(
        "could not write a probe result: {0}; fix: keep the probe's stdout open until it exits"
    )]
    Output(#[source] std::io::Error),
}

/// Reads and parses the config file.
pub fn load_config(path: &Path) -> Result<contract::ProbeConfig, ProbeError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProbeError::ReadConfig {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ProbeError::ParseConfig {
        path: path.display().to_string(),
        source,
    })
}

/// Runs the selected probes and writes one JSON line per probe to `out`,
/// flushing after each. Returns how many lines were written.
pub fn run_to(
    config: &contract::ProbeConfig,
    startup: Startup,
    out: &mut dyn Write,
) -> Result<usize, ProbeError> {
    run(config, startup, out).map_err(ProbeError::Output)
}
