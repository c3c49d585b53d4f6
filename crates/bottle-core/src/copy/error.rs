//! `bottle cp`'s errors (`BOT-F…`).

use std::fmt;
use std::path::PathBuf;

use crate::backend::{BackendError, BackendErrorKind};
use crate::error::Coded;

/// Where an archive `bottle cp` reads came from: a box (hostile), or the
/// operator's stdin (`bottle cp - BOTTLE:DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveSource {
    /// Out of the named bottle.
    Bottle(String),
    /// This process's stdin.
    Stdin,
}

impl fmt::Display for ArchiveSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArchiveSource::Bottle(name) => write!(f, "{name}"),
            ArchiveSource::Stdin => f.write_str("stdin"),
        }
    }
}

/// Why `bottle cp` did not copy. Names and link targets that came out of a
/// box are quoted with `{:?}`, so none reaches a terminal raw.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A path in the box that `bottle cp` does not take.
    #[error("{path:?} is not a path in a bottle `bottle cp` takes: {why}")]
    GuestPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A destination in the box under what bottle owns there.
    #[error("{path} is under {owned}, which bottle provisions and owns in the box")]
    OwnedByBottle {
        /// The path the copy would write.
        path: String,
        /// The directory bottle owns ([`crate::agent::BOTTLE_OWNED_DIRS`]).
        owned: &'static str,
    },
    /// A symbolic link inside the box on the way to where the copy writes.
    #[error(
        "{path} in {bottle} goes through {link}, a symbolic link: `bottle cp` never follows a link inside a box"
    )]
    LinkOnTheWay {
        /// The bottle.
        bottle: String,
        /// Where the copy was to write.
        path: String,
        /// The link found on the way (it may be `path` itself).
        link: String,
    },
    /// A path in the box that does not exist.
    #[error("{path} does not exist in {bottle}")]
    Missing {
        /// The bottle.
        bottle: String,
        /// The path.
        path: String,
    },
    /// Something of another kind in the box where the copy needs a
    /// directory, or a directory where it puts a file.
    #[error("{path} in {bottle} is {found}, where the copy needs {wanted}")]
    InTheWay {
        /// The bottle.
        bottle: String,
        /// The path.
        path: String,
        /// What is there ("a file", "a directory", ...).
        found: &'static str,
        /// What the copy needs there.
        wanted: &'static str,
    },
    /// An archive entry that breaks the rules every archive read is held
    /// to ([`super::check`]); nothing was written.
    #[error("the archive from {from} was refused at entry {entry:?}: {why}")]
    Refused {
        /// Where the archive came from.
        from: ArchiveSource,
        /// The entry's name as the archive gave it.
        entry: String,
        /// Which rule it breaks.
        why: String,
    },
    /// An archive past the size bound; nothing was written.
    #[error("the archive from {from} is larger than {limit} bytes")]
    TooLarge {
        /// Where the archive came from.
        from: ArchiveSource,
        /// The bound, in bytes.
        limit: u64,
    },
    /// An archive that is not a tar archive; nothing was written.
    #[error("the archive from {from} cannot be read: {detail}")]
    Malformed {
        /// Where the archive came from.
        from: ArchiveSource,
        /// What the reader said.
        detail: String,
    },
    /// The host destination already has something where the copy would go.
    #[error("{} already exists", path.display())]
    HostExists {
        /// The path.
        path: PathBuf,
    },
    /// The host destination's directory does not exist (or is not one).
    #[error("{} is not a directory", path.display())]
    HostNoDirectory {
        /// The directory the copy would go into.
        path: PathBuf,
    },
    /// Reading or writing on the host failed.
    #[error("cannot {action} {}: {source}", path.display())]
    HostIo {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A host file or tree that cannot go into a box.
    #[error("{} cannot be copied into a bottle: {why}", path.display())]
    HostSource {
        /// The path.
        path: PathBuf,
        /// Why not.
        why: String,
    },
    /// The operator interrupted the copy (^C, `SIGTERM`); nothing was
    /// written.
    #[error("the copy was interrupted; nothing was written")]
    Interrupted,
}

impl CopyError {
    /// How the CLI classifies it (and so its exit code): what the box held
    /// refused is [`BackendErrorKind::IsolationUnconfirmed`] (5), the
    /// operator's input [`BackendErrorKind::NotFound`] (bad input, 2), a
    /// host I/O failure [`BackendErrorKind::Failed`].
    pub fn kind(&self) -> BackendErrorKind {
        match self {
            CopyError::LinkOnTheWay { .. } => BackendErrorKind::IsolationUnconfirmed,
            CopyError::Refused { from, .. }
            | CopyError::TooLarge { from, .. }
            | CopyError::Malformed { from, .. } => match from {
                ArchiveSource::Bottle(_) => BackendErrorKind::IsolationUnconfirmed,
                ArchiveSource::Stdin => BackendErrorKind::NotFound,
            },
            CopyError::GuestPath { .. }
            | CopyError::OwnedByBottle { .. }
            | CopyError::Missing { .. }
            | CopyError::InTheWay { .. }
            | CopyError::HostExists { .. }
            | CopyError::HostNoDirectory { .. }
            | CopyError::HostSource { .. } => BackendErrorKind::NotFound,
            CopyError::HostIo { .. } | CopyError::Interrupted => BackendErrorKind::Failed,
        }
    }
}

impl Coded for CopyError {
    fn code(&self) -> &'static str {
        match self {
            CopyError::GuestPath { .. } => "BOT-F001",
            CopyError::OwnedByBottle { .. } => "BOT-F002",
            CopyError::LinkOnTheWay { .. } => "BOT-F003",
            CopyError::Missing { .. } => "BOT-F004",
            CopyError::InTheWay { .. } => "BOT-F005",
            CopyError::Refused { .. } => "BOT-F010",
            CopyError::TooLarge { .. } => "BOT-F011",
            CopyError::Malformed { .. } => "BOT-F012",
            CopyError::HostExists { .. } => "BOT-F020",
            CopyError::HostNoDirectory { .. } => "BOT-F021",
            CopyError::HostIo { .. } => "BOT-F022",
            CopyError::HostSource { .. } => "BOT-F023",
            CopyError::Interrupted => "BOT-F024",
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            CopyError::GuestPath { .. } => {
                "write the path in the bottle without `..`, e.g. demo:/home/agent/work".into()
            }
            CopyError::OwnedByBottle { .. } => {
                "copy to where the agent works instead, e.g. its home directory or /tmp".into()
            }
            CopyError::LinkOnTheWay { bottle, link, .. } => format!(
                "copy to a directory that is not a link, e.g. under /tmp; if you did not make {link}, the agent did: see what it points to with `bottle exec {bottle} -- ls -l {link}`"
            ),
            CopyError::Missing { bottle, path } => {
                format!("create it first (`bottle exec {bottle} -- mkdir -p {path}`), or check the name")
            }
            CopyError::InTheWay { .. } => {
                "copy to another name, or remove what is there first with `bottle exec`".into()
            }
            CopyError::Refused { from, .. } | CopyError::Malformed { from, .. } => {
                match from {
                    ArchiveSource::Bottle(_) => "nothing was written; copy out only the files you need, leaving out the entry named (`bottle exec` shows what it is)".into(),
                    ArchiveSource::Stdin => "nothing was copied; give a tar archive of relative names, regular files, directories and links that stay inside it".into(),
                }
            }
            CopyError::TooLarge { .. } => {
                "nothing was written; raise the bound with --max-size (e.g. --max-size 4G), or copy less".into()
            }
            CopyError::HostExists { .. } => {
                "remove it first, or name a destination that does not exist yet".into()
            }
            CopyError::HostNoDirectory { .. } => "create the directory first, or check the name".into(),
            CopyError::HostIo { .. } => {
                "check that the destination is writable by you and has room".into()
            }
            CopyError::HostSource { .. } => "rename or leave out what is named".into(),
            CopyError::Interrupted => "run the copy again".into(),
        };
        Some(fix)
    }
}

impl From<CopyError> for BackendError {
    fn from(err: CopyError) -> BackendError {
        BackendError::from_coded(err.kind(), err)
    }
}

/// `CopyError::HostIo` for `action` on `path`.
pub(crate) fn host_io(
    action: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> CopyError {
    let path = path.to_path_buf();
    move |source| CopyError::HostIo {
        action,
        path,
        source,
    }
}
