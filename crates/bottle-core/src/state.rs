//! Where a bottle keeps its state on the host.
//!
//! `$XDG_STATE_HOME/bottle/<slug>/`, defaulting to
//! `~/.local/state/bottle/<slug>/`. The environment is passed in so this
//! module stays free of I/O and is testable.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::error::Coded;

/// Version of the on-disk state layout; bumped on incompatible changes.
pub const STATE_VERSION: u32 = 1;

/// Neither `XDG_STATE_HOME` nor `HOME` is usable.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "cannot locate the state directory: neither XDG_STATE_HOME nor HOME is set to an absolute path"
)]
pub struct StateDirError;

impl Coded for StateDirError {
    fn code(&self) -> &'static str {
        "BOT-S002"
    }

    fn fix(&self) -> Option<String> {
        Some("set XDG_STATE_HOME or HOME to an absolute path".into())
    }
}

/// The root under which every bottle's state dir lives.
pub fn state_root(env: impl Fn(&str) -> Option<String>) -> Result<PathBuf, StateDirError> {
    let absolute = |value: Option<String>| value.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(xdg) = absolute(env("XDG_STATE_HOME")) {
        return Ok(xdg.join("bottle"));
    }
    absolute(env("HOME"))
        .map(|home| home.join(".local/state/bottle"))
        .ok_or(StateDirError)
}

/// Where a detached bottle's agent session keeps its files:
/// `<state root>/<slug>/session/`, owner-only, read by `bottle attach`,
/// `bottle list` and `bottle stop`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPaths {
    /// The session directory.
    pub dir: PathBuf,
}

impl SessionPaths {
    /// The session files of the bottle `slug` under `state_root`.
    pub fn new(state_root: &Path, slug: &str) -> SessionPaths {
        Self::of_state_dir(&state_root.join(slug))
    }

    /// The session files of the bottle whose state dir is `state_dir`.
    pub fn of_state_dir(state_dir: &Path) -> SessionPaths {
        SessionPaths {
            dir: state_dir.join("session"),
        }
    }

    /// Written by the holder once the agent's command is known to run: a
    /// detached launch is complete only then (before it, a `start` that
    /// died left an incomplete bottle).
    pub fn started(&self) -> PathBuf {
        self.dir.join("started")
    }

    /// The agent's command as the session ran it (JSON argv; empty: the
    /// image's), so that a reset can start it again.
    pub fn command(&self) -> PathBuf {
        self.dir.join("command.json")
    }

    /// The unix socket `bottle attach` connects to while the agent runs.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("session.sock")
    }

    /// The session holder's identity ([`crate::process::Owner`] as JSON).
    pub fn holder(&self) -> PathBuf {
        self.dir.join("holder.json")
    }

    /// The agent's exit code, written once it has exited.
    pub fn exit_code(&self) -> PathBuf {
        self.dir.join("exit-code")
    }

    /// The agent's last output, kept when it exits.
    pub fn scrollback(&self) -> PathBuf {
        self.dir.join("scrollback")
    }

    /// The holder's own stdout and stderr before the agent's terminal
    /// exists (why it could not start).
    pub fn log(&self) -> PathBuf {
        self.dir.join("holder.log")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn xdg_state_home_wins() {
        let root = state_root(env_of(&[("XDG_STATE_HOME", "/x"), ("HOME", "/h")]));
        assert_eq!(root, Ok(PathBuf::from("/x/bottle")));
    }

    #[test]
    fn falls_back_to_home() {
        let root = state_root(env_of(&[("HOME", "/h")]));
        assert_eq!(root, Ok(PathBuf::from("/h/.local/state/bottle")));
    }

    #[test]
    fn relative_values_are_ignored() {
        let root = state_root(env_of(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")]));
        assert_eq!(root, Ok(PathBuf::from("/h/.local/state/bottle")));
        assert_eq!(state_root(env_of(&[])), Err(StateDirError));
    }
}
