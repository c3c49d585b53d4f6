//! Device policy errors and their stable `BOT-V` codes.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::error::Coded;

/// Why the device policy could not be loaded or applied. Every variant fails
/// the launch: a policy that cannot be read or checked is not guessed at.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// The admin policy file exists but cannot be read.
    #[error(
        "{}: cannot read the admin device policy: {source}",
        file.display()
    )]
    PolicyUnreadable {
        /// The policy file.
        file: PathBuf,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// The admin policy file is not valid TOML, has an unknown key, or a
    /// value of the wrong type.
    #[error(
        "{}{}: {field}: {message}",
        file.display(),
        position.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default()
    )]
    PolicyInvalid {
        /// The policy file.
        file: PathBuf,
        /// 1-based line and column, when known.
        position: Option<(usize, usize)>,
        /// The offending key, e.g. `devices_blacklist` or `devices_blacklst`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A blacklist entry (admin file or manifest) that is not a glob under
    /// `/dev/`.
    #[error(
        "{}: {field}: {pattern:?} {problem}",
        file.display()
    )]
    BadBlacklistPattern {
        /// The admin policy file or the manifest.
        file: PathBuf,
        /// E.g. `devices_blacklist[2]` or `agents.claude.devices_blacklist[0]`.
        field: String,
        /// The entry as written.
        pattern: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A `devices` entry that is not a glob under `/dev/`.
    #[error(
        "{}: {field}: {pattern:?} {problem}",
        file.display()
    )]
    BadDevicePattern {
        /// The manifest.
        file: PathBuf,
        /// E.g. `agents.claude.devices[1]`.
        field: String,
        /// The entry as written.
        pattern: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A `devices` entry that would pass all of `/dev` (`/dev/*`, `/dev/**`).
    #[error(
        "{}: {field}: {pattern:?} would expose all of /dev",
        file.display()
    )]
    TooBroad {
        /// The manifest.
        file: PathBuf,
        /// E.g. `agents.claude.devices[0]`.
        field: String,
        /// The entry as written.
        pattern: String,
    },
    /// Part of `/dev` covered by the blacklist could not be listed or
    /// stat'ed, so an alias of a blacklisted node could go unnoticed.
    #[error(
        "{}: cannot check the device blacklist: {source}",
        path.display()
    )]
    BlacklistUnreadable {
        /// The path that could not be read.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A pattern matched more paths than the resolver will look at.
    #[error("device pattern {pattern:?} matches more than {limit} paths under /dev")]
    TooManyMatches {
        /// The pattern.
        pattern: String,
        /// The limit it exceeded.
        limit: usize,
    },
}

impl Coded for DeviceError {
    fn code(&self) -> &'static str {
        match self {
            DeviceError::PolicyUnreadable { .. } => "BOT-V001",
            DeviceError::PolicyInvalid { .. } => "BOT-V002",
            DeviceError::BadBlacklistPattern { .. } => "BOT-V003",
            DeviceError::BadDevicePattern { .. } => "BOT-V004",
            DeviceError::TooBroad { .. } => "BOT-V005",
            DeviceError::BlacklistUnreadable { .. } => "BOT-V006",
            DeviceError::TooManyMatches { .. } => "BOT-V007",
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            DeviceError::PolicyUnreadable { .. } => format!(
                "make the file readable by this user (it should be root-owned, mode 0644), or point {} at the right file; bottle does not start without the admin policy once the file exists",
                super::POLICY_FILE_ENV
            ),
            DeviceError::PolicyInvalid { .. } => "the admin policy may only set devices_blacklist = [\"/dev/...\", ...]; see docs/DEVICES.md".into(),
            DeviceError::BadBlacklistPattern { .. } => "write each entry as an absolute glob under /dev/, e.g. \"/dev/sd*\"".into(),
            DeviceError::BadDevicePattern { .. } => "write each entry as an absolute glob under /dev/, e.g. \"/dev/nvidia*\"".into(),
            DeviceError::TooBroad { .. } => "list only the nodes the agent needs, e.g. \"/dev/nvidia*\" or \"/dev/snd\"".into(),
            DeviceError::BlacklistUnreadable { .. } => "make the path readable by this user, or set devices = [] in the manifest; bottle does not pass devices it cannot check against the blacklist".into(),
            DeviceError::TooManyMatches { .. } => "narrow the pattern to the nodes the agent needs".into(),
        };
        Some(fix)
    }
}

/// Every code with a one-line summary, in code order (for `docs/ERRORS.md`).
pub const CODES: &[(&str, &str)] = &[
    (
        "BOT-V001",
        "the admin device policy file exists but cannot be read",
    ),
    ("BOT-V002", "the admin device policy file is invalid"),
    (
        "BOT-V003",
        "a device blacklist entry that is not a glob under /dev/",
    ),
    (
        "BOT-V004",
        "a `devices` entry that is not a glob under /dev/",
    ),
    (
        "BOT-V005",
        "a `devices` entry that would expose all of /dev",
    ),
    (
        "BOT-V006",
        "part of /dev covered by the blacklist cannot be read",
    ),
    ("BOT-V007", "a device pattern matches too many paths"),
];
