//! `BottleSpec`: one agent of a validated manifest, resolved into everything
//! a backend needs to plan a bottle.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::error::Coded;
use crate::manifest::{Agent, Manifest};
use crate::slug::{self, SlugError};

/// Default memory limit when the manifest sets none: 4 GiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 4 << 30;
/// Default process limit when the manifest sets none.
pub const DEFAULT_PIDS: u32 = 1024;
/// Default egress ports when the manifest sets none.
pub const DEFAULT_EGRESS_PORTS: [u16; 2] = [443, 80];

/// The agent asked for is not in the manifest, or its name is unusable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    /// No `[agents.<name>]` table for this agent.
    #[error("{manifest}: no agent named {agent:?}{hint}")]
    UnknownAgent {
        /// The manifest file.
        manifest: String,
        /// The name asked for.
        agent: String,
        /// A did-you-mean suffix, possibly empty.
        hint: String,
        /// The agents the manifest defines.
        known: String,
    },
    /// The bottle name does not make a slug.
    #[error(transparent)]
    Slug(#[from] SlugError),
}

impl Coded for SpecError {
    fn code(&self) -> &'static str {
        match self {
            SpecError::UnknownAgent { .. } => "BOT-M050",
            SpecError::Slug(err) => err.code(),
        }
    }

    fn fix(&self) -> Option<String> {
        match self {
            SpecError::UnknownAgent { known, .. } => Some(format!("use one of: {known}")),
            SpecError::Slug(err) => err.fix(),
        }
    }
}

/// Everything about one bottle that does not depend on the backend.
#[derive(Debug, Clone, PartialEq)]
pub struct BottleSpec {
    /// `bot-bottle-<slug>`.
    pub name: String,
    /// The slug all resources are named after.
    pub slug: String,
    /// The agent's key in the manifest.
    pub agent_name: String,
    /// The agent's validated configuration.
    pub agent: Agent,
    /// The manifest file this came from.
    pub manifest_path: PathBuf,
    /// The directory relative paths in the manifest are resolved against,
    /// absolute.
    pub base_dir: PathBuf,
    /// `<state root>/<slug>`: plan, CA, audit log, leases.
    pub state_dir: PathBuf,
}

impl BottleSpec {
    /// Picks `agent` out of `manifest`. The bottle is named after the agent
    /// unless `bottle_name` is given.
    pub fn new(
        manifest: &Manifest,
        manifest_path: &Path,
        agent: &str,
        bottle_name: Option<&str>,
        state_root: &Path,
    ) -> Result<BottleSpec, SpecError> {
        let Some(config) = manifest.agents.get(agent) else {
            let known: Vec<&str> = manifest.agents.keys().map(String::as_str).collect();
            let hint = known
                .iter()
                .filter(|k| strsim::jaro_winkler(k, agent) > 0.8)
                .max_by(|a, b| {
                    strsim::jaro_winkler(a, agent).total_cmp(&strsim::jaro_winkler(b, agent))
                })
                .map(|k| format!(" (did you mean {k:?}?)"))
                .unwrap_or_default();
            return Err(SpecError::UnknownAgent {
                manifest: manifest_path.display().to_string(),
                agent: agent.to_string(),
                hint,
                known: known.join(", "),
            });
        };
        let slug = slug::slugify(bottle_name.unwrap_or(agent))?;
        let base_dir = crate::manifest::absolute_base_dir(manifest_path);
        Ok(BottleSpec {
            name: slug::bottle_name(&slug),
            state_dir: state_root.join(&slug),
            slug,
            agent_name: agent.to_string(),
            agent: config.clone(),
            manifest_path: manifest_path.to_path_buf(),
            base_dir,
        })
    }

    /// Resolves a manifest-relative path (absolute paths pass through).
    pub fn resolve(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// The egress ports in force.
    pub fn egress_ports(&self) -> Vec<u16> {
        self.agent
            .egress
            .ports
            .clone()
            .unwrap_or_else(|| DEFAULT_EGRESS_PORTS.to_vec())
    }
}
