//! The narrow view of an image store that a backend which does not run
//! containers needs: look an image up, export it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;

/// An agent image, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentImage {
    /// The reference the manifest gave.
    pub reference: String,
    /// The image ID (`sha256:<hex>`): content-addressed, so a cache key.
    pub id: String,
    /// The image's entrypoint.
    pub entrypoint: Vec<String>,
    /// The image's cmd.
    pub cmd: Vec<String>,
}

impl AgentImage {
    /// The ID's hex, without `sha256:`.
    pub fn id_hex(&self) -> &str {
        self.id.strip_prefix("sha256:").unwrap_or(&self.id)
    }

    /// What runs when the manifest gives no command: entrypoint + cmd.
    pub fn default_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// Where agent images come from (the Docker Engine, in practice).
pub trait ImageStore: Send + Sync {
    /// Resolves a local image reference to its ID and default command.
    fn inspect(&self, reference: &str) -> Result<AgentImage, BackendError>;

    /// Writes the image `id` as a `docker save` archive to `dest`.
    fn export(&self, id: &str, dest: &Path) -> Result<(), BackendError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_and_default_command() {
        let image = AgentImage {
            reference: "agent:latest".into(),
            id: "sha256:abc".into(),
            entrypoint: vec!["/bin/agent".into()],
            cmd: vec!["--serve".into()],
        };
        assert_eq!(image.id_hex(), "abc");
        assert_eq!(image.default_command(), ["/bin/agent", "--serve"]);
    }
}
