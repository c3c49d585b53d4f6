//! `bottle cp`, both ways: the one definition of what moves between the
//! host and a box and by which rules, shared by every backend.
//!
//! Into a box ([`archive::CopyIn`], [`guest`]): a host file or tree, read
//! without following its links, or a tar on stdin checked entry by entry,
//! lands by `docker cp`'s rules, owned by the agent's user with the host's
//! times. It never follows a link inside the box and never writes under
//! what bottle owns there ([`crate::agent::BOTTLE_OWNED_DIRS`]): a
//! backend walks the destination with [`guest::walk`] and checks what is
//! already there with [`guest::check_existing`], at a moment the agent
//! cannot change the box (docker: the container paused) or writing with
//! no more than the agent's own rights (smolmachines: an extraction run as
//! the agent's user), so that the agent cannot swap a directory for a link
//! between the check and the write to any gain.
//!
//! Out of a box ([`check`], [`host`]): the box's archive of a path is
//! hostile input. Every entry is checked before it is written; it is
//! written into a fresh directory beside the destination and renamed into
//! place only when the whole archive passed, so a refused archive leaves
//! nothing behind.

pub mod archive;
pub mod check;
mod error;
pub mod guest;
pub mod host;

pub use archive::{ArchiveEntry, CopyIn, CopySource, EntryKind, Owner};
pub use error::{ArchiveSource, CopyError};
pub use guest::{GuestEntry, GuestPath, Placement};
