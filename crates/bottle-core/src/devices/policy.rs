//! The admin policy file and the merged device policy of one agent.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::DeviceError;
use super::{BUILTIN_BLACKLIST, DEFAULT_DEVICES};
use crate::manifest::Agent;
use crate::spec::BottleSpec;

/// The admin's device policy, read from [`super::DEFAULT_POLICY_FILE`] (or
/// the file [`super::POLICY_FILE_ENV`] names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminPolicy {
    /// The file it was read from; `None` when there is no file, in which case
    /// only [`BUILTIN_BLACKLIST`] applies.
    pub file: Option<PathBuf>,
    /// Blacklist globs the admin adds to the built-in ones.
    pub devices_blacklist: Vec<String>,
}

/// The file's format: unknown keys are errors, so a misspelt key never
/// silently drops the admin's blacklist.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    devices_blacklist: Vec<toml::Spanned<String>>,
}

impl AdminPolicy {
    /// No admin file: the built-in blacklist only.
    pub fn builtin_only() -> AdminPolicy {
        AdminPolicy::default()
    }

    /// Reads the admin policy. A missing file means built-ins only; a file
    /// that exists but cannot be read or is invalid is an error (fail closed).
    pub fn load(path: &Path) -> Result<AdminPolicy, DeviceError> {
        match std::fs::read_to_string(path) {
            Ok(text) => AdminPolicy::parse(path, &text),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(AdminPolicy::builtin_only()),
            Err(source) => Err(DeviceError::PolicyUnreadable {
                file: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Parses policy text; `path` names the file in errors.
    pub fn parse(path: &Path, text: &str) -> Result<AdminPolicy, DeviceError> {
        let invalid = |err: &toml::de::Error, field: String| DeviceError::PolicyInvalid {
            file: path.to_path_buf(),
            position: err.span().map(|span| line_column(text, span.start)),
            field,
            message: err.message().to_string(),
        };
        let deserializer =
            toml::Deserializer::parse(text).map_err(|err| invalid(&err, "(file)".into()))?;
        let file: PolicyFile = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let field = field_of(&err);
            invalid(err.inner(), field)
        })?;
        let mut devices_blacklist = Vec::with_capacity(file.devices_blacklist.len());
        for (index, entry) in file.devices_blacklist.iter().enumerate() {
            let normalized =
                normalize(entry.get_ref()).map_err(|problem| DeviceError::BadBlacklistPattern {
                    file: path.to_path_buf(),
                    field: format!(
                        "devices_blacklist[{index}] (line {})",
                        line_column(text, entry.span().start).0
                    ),
                    pattern: entry.get_ref().clone(),
                    problem,
                })?;
            devices_blacklist.push(normalized);
        }
        Ok(AdminPolicy {
            file: Some(path.to_path_buf()),
            devices_blacklist,
        })
    }
}

/// The key an error is about (for an unknown key, the key itself).
fn field_of(err: &serde_path_to_error::Error<toml::de::Error>) -> String {
    let path = err.path().to_string();
    if path.is_empty() || path == "." {
        "(file)".to_string()
    } else {
        path
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Where a blacklist entry came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlacklistSource {
    /// [`BUILTIN_BLACKLIST`].
    BuiltIn,
    /// The admin policy file.
    Admin(PathBuf),
    /// The manifest's `devices_blacklist`.
    Manifest,
}

impl fmt::Display for BlacklistSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlacklistSource::BuiltIn => f.write_str("built-in"),
            BlacklistSource::Admin(file) => write!(f, "admin policy {}", file.display()),
            BlacklistSource::Manifest => f.write_str("manifest devices_blacklist"),
        }
    }
}

/// One blacklist glob and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlacklistEntry {
    /// The glob, normalized (`/dev/...`, no empty components).
    pub pattern: String,
    /// Where it came from.
    pub source: BlacklistSource,
    pub(super) compiled: glob::Pattern,
}

impl BlacklistEntry {
    fn new(pattern: String, source: BlacklistSource) -> Result<BlacklistEntry, String> {
        let compiled =
            glob::Pattern::new(&pattern).map_err(|err| format!("is not a valid glob: {err}"))?;
        Ok(BlacklistEntry {
            pattern,
            source,
            compiled,
        })
    }

    /// Whether `path` (`/dev/...`) or a directory above it matches.
    pub fn covers(&self, path: &str) -> bool {
        // `*` may cross `/` here (a bash `case` glob, as the design's
        // resolver used), and a matched directory covers its contents:
        // both err towards refusing.
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: false,
            require_literal_leading_dot: false,
        };
        let mut candidate = path;
        loop {
            if self.compiled.matches_with(candidate, options) {
                return true;
            }
            match candidate.rfind('/') {
                Some(cut) if cut > "/dev".len() => candidate = &candidate[..cut],
                _ => return false,
            }
        }
    }
}

/// The device policy of one agent: what it asks for and the merged
/// blacklist (built-in + admin + manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePolicy {
    pub(super) requests: Vec<String>,
    pub(super) explicit: bool,
    pub(super) blacklist: Vec<BlacklistEntry>,
    pub(super) policy_file: Option<PathBuf>,
}

impl DevicePolicy {
    /// The policy of the agent `spec` describes.
    pub fn for_spec(spec: &BottleSpec, admin: &AdminPolicy) -> Result<DevicePolicy, DeviceError> {
        DevicePolicy::new(&spec.manifest_path, &spec.agent_name, &spec.agent, admin)
    }

    /// Merges the agent's `devices` and `devices_blacklist` with the admin
    /// policy. `manifest` and `agent_name` only name things in errors.
    ///
    /// The manifest can only add blacklist entries: built-ins come first,
    /// then the admin's, then the manifest's, and nothing is ever removed.
    pub fn new(
        manifest: &Path,
        agent_name: &str,
        agent: &Agent,
        admin: &AdminPolicy,
    ) -> Result<DevicePolicy, DeviceError> {
        let mut blacklist = Vec::new();
        for pattern in BUILTIN_BLACKLIST {
            // The built-in list is a constant; a bad entry is caught by the
            // unit test below, so here it is merely skipped, never fatal.
            if let Ok(entry) = BlacklistEntry::new((*pattern).to_string(), BlacklistSource::BuiltIn)
            {
                blacklist.push(entry);
            }
        }
        let admin_file = admin.file.clone().unwrap_or_default();
        for (index, pattern) in admin.devices_blacklist.iter().enumerate() {
            let bad = |problem| DeviceError::BadBlacklistPattern {
                file: admin_file.clone(),
                field: format!("devices_blacklist[{index}]"),
                pattern: pattern.clone(),
                problem,
            };
            let normalized = normalize(pattern).map_err(bad)?;
            blacklist.push(
                BlacklistEntry::new(normalized, BlacklistSource::Admin(admin_file.clone()))
                    .map_err(bad)?,
            );
        }
        for (index, pattern) in agent.devices_blacklist.iter().enumerate() {
            let bad = |problem| DeviceError::BadBlacklistPattern {
                file: manifest.to_path_buf(),
                field: format!("agents.{agent_name}.devices_blacklist[{index}]"),
                pattern: pattern.clone(),
                problem,
            };
            let normalized = normalize(pattern).map_err(bad)?;
            blacklist
                .push(BlacklistEntry::new(normalized, BlacklistSource::Manifest).map_err(bad)?);
        }

        let explicit = agent.devices.is_some();
        let mut requests = Vec::new();
        match &agent.devices {
            None => requests.extend(DEFAULT_DEVICES.iter().map(|p| (*p).to_string())),
            Some(list) => {
                for (index, pattern) in list.iter().enumerate() {
                    let field = format!("agents.{agent_name}.devices[{index}]");
                    let bad = |problem| DeviceError::BadDevicePattern {
                        file: manifest.to_path_buf(),
                        field: field.clone(),
                        pattern: pattern.clone(),
                        problem,
                    };
                    let normalized = normalize(pattern).map_err(bad)?;
                    glob::Pattern::new(&normalized)
                        .map_err(|err| bad(format!("is not a valid glob: {err}")))?;
                    if too_broad(&normalized) {
                        return Err(DeviceError::TooBroad {
                            file: manifest.to_path_buf(),
                            field,
                            pattern: pattern.clone(),
                        });
                    }
                    requests.push(normalized);
                }
            }
        }
        Ok(DevicePolicy {
            requests,
            explicit,
            blacklist,
            policy_file: admin.file.clone(),
        })
    }

    /// The device globs to expand: the manifest's, or [`DEFAULT_DEVICES`].
    pub fn requests(&self) -> &[String] {
        &self.requests
    }

    /// Whether the manifest set `devices` (rather than taking the defaults).
    pub fn is_explicit(&self) -> bool {
        self.explicit
    }

    /// The merged blacklist, built-ins first, then the admin's, then the
    /// manifest's.
    pub fn blacklist(&self) -> &[BlacklistEntry] {
        &self.blacklist
    }
}

/// Checks that `pattern` is an absolute glob strictly under `/dev/` and
/// returns it without empty components. `.` and `..` are refused so that no
/// entry can name something outside `/dev`.
pub(super) fn normalize(pattern: &str) -> Result<String, String> {
    let Some(rest) = pattern.strip_prefix("/dev/") else {
        return Err("is not under /dev/".into());
    };
    let parts: Vec<&str> = rest.split('/').filter(|part| !part.is_empty()).collect();
    if parts.is_empty() {
        return Err("names /dev itself".into());
    }
    if parts.iter().any(|part| *part == "." || *part == "..") {
        return Err("contains a . or .. component".into());
    }
    if pattern.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    let normalized = format!("/dev/{}", parts.join("/"));
    glob::Pattern::new(&normalized).map_err(|err| format!("is not a valid glob: {err}"))?;
    Ok(normalized)
}

/// Whether the first component below `/dev/` is nothing but wildcards, so
/// the entry could match every node (`/dev/*`, `/dev/**`, `/dev/?*/x`).
fn too_broad(normalized: &str) -> bool {
    let first = normalized
        .trim_start_matches("/dev/")
        .split('/')
        .next()
        .unwrap_or_default();
    let mut literal = false;
    let mut in_class = false;
    for c in first.chars() {
        match c {
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '*' | '?' => {}
            _ if in_class => {}
            _ => literal = true,
        }
    }
    !literal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_blacklist_entries_are_valid() {
        for pattern in BUILTIN_BLACKLIST {
            assert_eq!(normalize(pattern).as_deref(), Ok(*pattern));
        }
        for pattern in DEFAULT_DEVICES {
            assert_eq!(normalize(pattern).as_deref(), Ok(*pattern));
            assert!(!too_broad(pattern), "{pattern}");
        }
    }

    #[test]
    fn normalize_refuses_escapes() {
        assert!(normalize("/etc/shadow").is_err());
        assert!(normalize("/dev").is_err());
        assert!(normalize("/dev/").is_err());
        assert!(normalize("/dev/../etc/shadow").is_err());
        assert!(normalize("/dev/./mem").is_err());
        assert!(normalize("dev/mem").is_err());
        assert!(normalize("/dev/[").is_err());
        assert_eq!(normalize("/dev//snd/").as_deref(), Ok("/dev/snd"));
    }

    #[test]
    fn too_broad_catches_whole_dev_globs() {
        for pattern in ["/dev/*", "/dev/**", "/dev/?*", "/dev/[a-z]*", "/dev/*/x"] {
            assert!(too_broad(pattern), "{pattern}");
        }
        for pattern in ["/dev/nvidia*", "/dev/snd", "/dev/s*", "/dev/*a"] {
            assert!(!too_broad(pattern), "{pattern}");
        }
    }

    #[test]
    fn covers_matches_ancestors() {
        let entry = BlacklistEntry::new("/dev/pts".into(), BlacklistSource::BuiltIn).unwrap();
        assert!(entry.covers("/dev/pts"));
        assert!(entry.covers("/dev/pts/3"));
        assert!(!entry.covers("/dev/ptsx"));
        assert!(!entry.covers("/dev/ptmx"));
        let entry = BlacklistEntry::new("/dev/sd*".into(), BlacklistSource::BuiltIn).unwrap();
        assert!(entry.covers("/dev/sda1"));
        assert!(!entry.covers("/dev/snd/pcmC0D0p"));
    }

    #[test]
    fn unknown_policy_key_names_the_key() {
        let err = AdminPolicy::parse(Path::new("/p.toml"), "devices_blacklst = []\n").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("/p.toml:1:1: devices_blacklst: unknown field"),
            "{text}"
        );
    }
}
