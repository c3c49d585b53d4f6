//! Loading and validating `bottle.toml`.

mod model;

use std::fmt;
use std::path::{Path, PathBuf};

pub use model::*;

use crate::error::Coded;

/// A manifest that could not be read or is invalid.
///
/// Displays as `file:line:column: field: message` followed by a `fix:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The manifest file.
    pub file: PathBuf,
    /// 1-based line and column of the offending text, when known.
    pub position: Option<(usize, usize)>,
    /// The field path, e.g. `agents.claude.egress.allow[2]`.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
    /// Stable code.
    pub code: &'static str,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.position {
            write!(f, ":{line}:{column}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}\n  fix: {}", self.message, self.fix)
    }
}

impl std::error::Error for ManifestError {}

impl Coded for ManifestError {
    fn code(&self) -> &'static str {
        self.code
    }
}

/// Reads and validates a manifest file.
pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|err| ManifestError {
        file: path.to_path_buf(),
        position: None,
        field: String::new(),
        message: format!("cannot read the manifest: {err}"),
        fix: "check the path, or pass --manifest FILE".into(),
        code: "BOT-M001",
    })?;
    parse(path, &text)
}

/// Parses and validates manifest text; `path` is only used in errors.
pub fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
    toml::from_str(text).map_err(|err: toml::de::Error| ManifestError {
        file: path.to_path_buf(),
        position: None,
        field: String::new(),
        message: err.message().to_string(),
        fix: "see docs/MANIFEST.md".into(),
        code: "BOT-M002",
    })
}
