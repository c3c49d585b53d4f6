//! Loading and validating `bottle.toml`.
//!
//! [`load`] / [`parse`] return a validated [`Manifest`] or exactly one
//! [`ManifestError`]: the first problem in the document, located by line,
//! column and field path, with a stable `BOT-M` code (see [`codes`]) and a
//! concrete fix. Three passes, each stopping at its first problem:
//!
//! 1. TOML syntax (toml's parser, which keeps spans);
//! 2. the shape of the spanned tree: unknown keys and enumeration values
//!    against the known fields, and tables written as arrays; then
//!    deserialising into the serde model (types, missing keys), through
//!    `serde_path_to_error` for the field path. The first problem in the
//!    document wins;
//! 3. semantic checks on the model, located by walking the
//!    same spanned tree.
//!
//! Relative paths in the manifest (every field `paths.rs` lists: `build.context`,
//! `prompt`, `skills`, local git urls, credential files) are relative to the
//! manifest's directory: the parent of the path the caller passed, or `.`
//! when it has none. A loaded manifest holds them absolute, so nothing
//! downstream depends on the directory `bottle` ran in. Errors show the
//! manifest path exactly as the caller passed it, and a bad path field as
//! written.

pub mod codes;
mod decode;
pub mod endpoint;
pub mod host;
mod model;
mod paths;
pub mod push_glob;
mod schema;
mod span;
mod suggest;
mod validate;

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

pub use endpoint::{HostService, PublishEntry, Published, TcpDestination};
pub use host::{HostRule, HostRuleError};
pub use model::*;
pub use paths::is_remote_git_url;
pub use validate::{MIN_DISK_BYTES, MIN_MEMORY_BYTES, MIN_PIDS};

use crate::error::Coded;
use span::{Doc, FieldPath};

/// A manifest that could not be read or is invalid.
///
/// Displays as `file:line:column: field: message`, leaving out the parts
/// that are unknown; the fix is [`Coded::fix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The manifest file, as the caller named it.
    pub file: PathBuf,
    /// 1-based line and column (in characters) of the offending text, when
    /// known.
    pub position: Option<(usize, usize)>,
    /// The field path, e.g. `agents.claude.egress.allow[2]`; empty when the
    /// problem is not in one field (a syntax error).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
    /// Stable code, one of [`codes`].
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
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

impl Coded for ManifestError {
    fn code(&self) -> &'static str {
        self.code
    }

    fn fix(&self) -> Option<String> {
        Some(self.fix.clone()).filter(|fix| !fix.is_empty())
    }
}

/// One problem found in a manifest, before it is tied to a file.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub(crate) code: &'static str,
    pub(crate) path: FieldPath,
    pub(crate) span: Option<Range<usize>>,
    pub(crate) message: String,
    pub(crate) fix: String,
}

impl Problem {
    pub(crate) fn new(
        code: &'static str,
        path: FieldPath,
        span: Option<Range<usize>>,
        message: String,
        fix: String,
    ) -> Problem {
        Problem {
            code,
            path,
            span,
            message,
            fix,
        }
    }

    fn into_error(self, file: &Path, doc: &Doc<'_>) -> ManifestError {
        ManifestError {
            file: file.to_path_buf(),
            position: self.span.map(|s| doc.line_col(s.start)),
            field: self.path.to_string(),
            message: self.message,
            fix: self.fix,
            code: self.code,
        }
    }
}

/// Reads and validates a manifest file. Relative paths inside it resolve
/// against `path`'s directory.
pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|err| ManifestError {
        file: path.to_path_buf(),
        position: None,
        field: String::new(),
        message: format!("cannot read the manifest: {err}"),
        fix: "check the path, or pass --manifest FILE".into(),
        code: codes::READ,
    })?;
    parse(path, &text)
}

/// Parses and validates manifest text. `path` is what errors show, and its
/// parent directory (or `.`), made absolute, is what relative paths in the
/// manifest resolve against; the checks that those paths exist read the
/// file system. The manifest returned holds every host path absolute.
pub fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
    let doc = Doc::parse(text).map_err(|err| syntax_error(path, text, &err))?;
    let shape = [schema::check(&doc), decode::tables_written_as_arrays(&doc)]
        .into_iter()
        .flatten()
        .min_by_key(|p| p.span.as_ref().map_or(usize::MAX, |s| s.start));
    let manifest: Manifest = match serde_path_to_error::deserialize(doc.deserializer()) {
        Ok(manifest) => manifest,
        Err(err) => {
            let problem = decode::problem(&doc, &err);
            let first = match shape {
                Some(shape) if starts_before(&shape, &problem) => shape,
                _ => problem,
            };
            return Err(first.into_error(path, &doc));
        }
    };
    if let Some(shape) = shape {
        return Err(shape.into_error(path, &doc));
    }
    let base_dir = absolute_base_dir(path);
    if let Some(problem) = validate::validate(&manifest, &doc, &base_dir) {
        return Err(problem.into_error(path, &doc));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut manifest = manifest;
    paths::make_absolute(&mut manifest, &base_dir, home.as_deref());
    Ok(manifest)
}

fn starts_before(a: &Problem, b: &Problem) -> bool {
    let start = |p: &Problem| p.span.as_ref().map_or(usize::MAX, |s| s.start);
    start(a) <= start(b)
}

/// The directory a manifest's relative paths resolve against.
pub fn base_dir(manifest_path: &Path) -> &Path {
    match manifest_path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// [`base_dir`], absolute and without `..` (canonical when it exists): what
/// a loaded manifest's paths were resolved against.
pub fn absolute_base_dir(manifest_path: &Path) -> PathBuf {
    paths::absolute_dir(base_dir(manifest_path))
}

/// Resolves a path written in the manifest: `~/...` against `home`, a
/// relative path against `base_dir`, an absolute path as is. `None` for
/// `~/...` when there is no home directory.
pub fn resolve_path(base_dir: &Path, value: &str, home: Option<&Path>) -> Option<PathBuf> {
    match value.strip_prefix("~/") {
        Some(rest) => home.map(|home| home.join(rest)),
        None => Some(base_dir.join(value)),
    }
}

fn syntax_error(path: &Path, text: &str, err: &toml::de::Error) -> ManifestError {
    let span = err.span();
    let mut message = err.message().trim().to_string();
    let hint = [
        (
            "string values must be quoted",
            "put the value in double quotes",
        ),
        ("unclosed table", "close the table header with `]`"),
        ("key with no value", "write `key = value`"),
        ("missing comma", "separate the items with commas"),
        ("invalid basic string", "close the string with `\"`"),
    ];
    let mut fix = hint
        .iter()
        .find(|(start, _)| message.starts_with(start))
        .map_or(
            "fix the TOML syntax here (see https://toml.io)",
            |(_, fix)| fix,
        )
        .to_string();
    if message == "duplicate key"
        && let Some(key) = span.as_ref().and_then(|s| text.get(s.clone()))
    {
        message = format!("duplicate key `{key}`");
        fix = format!("keep one `{key}`; each key may appear once per table");
    }
    ManifestError {
        file: path.to_path_buf(),
        position: span.map(|s| span::line_col(text, s.start)),
        field: String::new(),
        message,
        fix,
        code: codes::SYNTAX,
    }
}

/// Parses a memory size: a whole or decimal number with an optional unit
/// `b`, `k`, `m`, `g`, `t` (each also as `kb`/`kib`, any letter case). All
/// units are binary, as Docker's are: `"4g"` and `"4GiB"` are both 4 × 2³⁰
/// bytes. A bare number is bytes. `None` if the text is not a size or the
/// result does not fit in a `u64`.
pub fn parse_memory(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if number.contains('.')
        && (fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let unit: u128 = 1 << shift;
    let whole: u128 = whole.parse().ok()?;
    let mut bytes = whole.checked_mul(unit)?;
    if !fraction.is_empty() {
        // Bytes cannot be split; more than 12 digits adds nothing a u64 holds.
        let digits = &fraction[..fraction.len().min(12)];
        let scale = 10u128.pow(u32::try_from(digits.len()).ok()?);
        let part: u128 = digits.parse().ok()?;
        bytes = bytes.checked_add(part * unit / scale)?;
    }
    u64::try_from(bytes).ok()
}

impl Agent {
    /// The memory limit in bytes, or `None` when the manifest sets none
    /// (the plan then uses [`crate::spec::DEFAULT_MEMORY_BYTES`]). A
    /// validated manifest always has a parsable size here.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.limits.memory.as_deref().and_then(parse_memory)
    }

    /// The cap on the agent's writable layer in bytes, or `None` when the
    /// manifest sets none. A validated manifest always has a parsable size
    /// here.
    pub fn disk_bytes(&self) -> Option<u64> {
        self.limits.disk.as_deref().and_then(parse_memory)
    }

    /// The audit log's rotation size in bytes, or `None` when the manifest
    /// sets none (the plan then uses
    /// [`crate::audit_files::DEFAULT_AUDIT_LOG_MAX_BYTES`]).
    pub fn audit_log_bytes(&self) -> Option<u64> {
        self.limits.audit_log.as_deref().and_then(parse_memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("512m"), Some(512 << 20));
        assert_eq!(parse_memory("4g"), Some(4 << 30));
        assert_eq!(parse_memory("4GiB"), Some(4 << 30));
        assert_eq!(parse_memory("4GB"), Some(4 << 30));
        assert_eq!(parse_memory("1073741824"), Some(1 << 30));
        assert_eq!(parse_memory("1.5g"), Some(3 << 29));
        assert_eq!(parse_memory("2T"), Some(2 << 40));
        assert_eq!(parse_memory("100b"), Some(100));
        for bad in [
            "",
            "g",
            "4 g",
            "4gg",
            "-1g",
            "1.g",
            ".5g",
            "1.2.3m",
            "4x",
            "99999999999t",
        ] {
            assert_eq!(parse_memory(bad), None, "{bad:?}");
        }
        assert_eq!(parse_memory("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_memory("18446744073709551616"), None);
    }

    #[test]
    fn display_leaves_out_unknown_parts() {
        let mut err = ManifestError {
            file: "bottle.toml".into(),
            position: Some((3, 9)),
            field: "agents.claude.image".into(),
            message: "image is empty".into(),
            fix: "name a local image".into(),
            code: codes::EMPTY_IMAGE,
        };
        assert_eq!(
            err.to_string(),
            "bottle.toml:3:9: agents.claude.image: image is empty"
        );
        assert_eq!(err.fix().as_deref(), Some("name a local image"));
        err.position = None;
        err.field.clear();
        assert_eq!(err.to_string(), "bottle.toml: image is empty");
    }

    #[test]
    fn unreadable_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(&dir.path().join("missing.toml")).unwrap_err();
        assert_eq!(err.code, codes::READ);
        assert!(err.message.starts_with("cannot read the manifest: "));
    }

    #[test]
    fn paths_resolve_against_the_manifest_dir() {
        assert_eq!(base_dir(Path::new("bottle.toml")), Path::new("."));
        assert_eq!(base_dir(Path::new("a/bottle.toml")), Path::new("a"));
        let home = Path::new("/home/op");
        assert_eq!(
            resolve_path(Path::new("a"), "~/key", Some(home)),
            Some(PathBuf::from("/home/op/key"))
        );
        assert_eq!(resolve_path(Path::new("a"), "~/key", None), None);
        assert_eq!(
            resolve_path(Path::new("a"), "k/x", Some(home)),
            Some(PathBuf::from("a/k/x"))
        );
        assert_eq!(
            resolve_path(Path::new("a"), "/etc/k", None),
            Some(PathBuf::from("/etc/k"))
        );
    }

    #[test]
    fn memory_bytes_of_an_agent() {
        let mut agent: Agent = toml::from_str("image = \"x\"").unwrap();
        assert_eq!(agent.memory_bytes(), None);
        agent.limits.memory = Some("512m".into());
        assert_eq!(agent.memory_bytes(), Some(512 << 20));
        assert_eq!(agent.disk_bytes(), None);
        agent.limits.disk = Some("10g".into());
        assert_eq!(agent.disk_bytes(), Some(10 << 30));
    }
}
