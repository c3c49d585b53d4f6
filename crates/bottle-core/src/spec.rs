//! `BottleSpec`: one agent of a validated manifest, resolved into everything
//! a backend needs to plan a bottle.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::error::Coded;
use crate::manifest::{Agent, Manifest};
use crate::slug::{self, SlugError};
use crate::upstream_trust::{UPSTREAM_TRUST_ENV, UpstreamTrust};

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
    /// The host default for upstream trust is not one of its values.
    #[error("{UPSTREAM_TRUST_ENV}={value:?} is not an upstream trust")]
    UpstreamTrustEnv {
        /// The variable's value.
        value: String,
    },
}

impl Coded for SpecError {
    fn code(&self) -> &'static str {
        match self {
            SpecError::UnknownAgent { .. } => "BOT-M050",
            SpecError::Slug(err) => err.code(),
            SpecError::UpstreamTrustEnv { .. } => "BOT-M062",
        }
    }

    fn fix(&self) -> Option<String> {
        match self {
            SpecError::UnknownAgent { known, .. } => Some(format!("use one of: {known}")),
            SpecError::Slug(err) => err.fix(),
            SpecError::UpstreamTrustEnv { .. } => Some(format!(
                "set {UPSTREAM_TRUST_ENV} to one of: {}, or unset it",
                UpstreamTrust::CHOICES.join(", ")
            )),
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
    /// The roots the bundle trusts for upstream TLS: the manifest's
    /// `egress.upstream_trust`, else the host's [`UPSTREAM_TRUST_ENV`].
    pub upstream_trust: UpstreamTrust,
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
        let host_default = std::env::var(UPSTREAM_TRUST_ENV).ok();
        let upstream_trust =
            UpstreamTrust::effective(config.egress.upstream_trust, host_default.as_deref())
                .map_err(|value| SpecError::UpstreamTrustEnv { value })?;
        let base_dir = crate::manifest::absolute_base_dir(manifest_path);
        Ok(BottleSpec {
            name: slug::bottle_name(&slug),
            state_dir: state_root.join(&slug),
            slug,
            agent_name: agent.to_string(),
            agent: config.clone(),
            manifest_path: manifest_path.to_path_buf(),
            base_dir,
            upstream_trust,
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

    /// The agent's published ports (`publish`), as the validated manifest
    /// has them.
    pub fn published_ports(&self) -> Vec<crate::manifest::Published> {
        self.agent
            .publish
            .iter()
            .filter_map(|entry| crate::manifest::Published::from_entry(entry).ok())
            .collect()
    }

    /// The host services the agent may reach (`egress.host_services`).
    pub fn host_services(&self) -> Vec<crate::manifest::HostService> {
        self.agent
            .egress
            .host_services
            .iter()
            .filter_map(|entry| crate::manifest::HostService::parse(entry).ok())
            .collect()
    }

    /// The pinned remote TCP destinations (`egress.tcp`).
    pub fn tcp_destinations(&self) -> Vec<crate::manifest::TcpDestination> {
        self.agent
            .egress
            .tcp
            .iter()
            .filter_map(|entry| crate::manifest::TcpDestination::parse(entry).ok())
            .collect()
    }
}
