//! `bottle-core` owns the vocabulary every other crate speaks: the manifest
//! (`bottle.toml`), the validated [`BottleSpec`], the [`Plan`] an operator
//! confirms, the [`BottleBackend`] / [`Bottle`] traits, and stable error codes.
//!
//! It drives neither Docker nor smolvm, knowing only the versions of each
//! that bottle requires ([`requirements`]), and opens no socket; it spawns
//! processes only in [`exec`], on behalf of callers. The only I/O it does is reading the manifest file it is asked to
//! parse, so that parse errors can quote the file, the plain file I/O
//! of the supervise request queue ([`requests`]), which the bundle and the
//! CLI must agree on, and asking `/proc` whether a bottle's launching
//! process still runs ([`process`]). It reads the audit log and its health
//! marker ([`audit_files`]) for `bottle logs` and `bottle list`, and moves a
//! stopping bottle's log to the retained logs, which it lists and prunes.
//! It keeps each bottle's record in its state dir ([`life`]).
//! For `bottle cp` ([`copy`]) it reads the host tree copied in and writes
//! what is copied out under the operator's destination.

pub mod agent;
pub mod agent_box;
pub mod audit_files;
pub mod backend;
pub mod bundle;
pub mod bundle_binary;
pub mod bundle_host;
pub mod ca_install;
pub mod checkout;
pub mod copy;
pub mod devices;
pub mod disk;
pub mod display;
pub mod error;
pub mod exec;
pub mod files;
pub mod images;
pub mod isolation;
pub mod launch_steps;
pub mod life;
pub mod manifest;
pub mod plan;
pub mod pool;
pub mod port_relay;
pub mod process;
pub mod requests;
pub mod requirements;
pub mod sandbox;
pub mod slug;
pub mod spec;
pub mod state;
pub mod subject_hash;
pub mod time;
pub mod timeline;
pub mod undo;
pub mod upstream_trust;

pub use backend::{
    BackendError, BackendKind, Bottle, BottleBackend, BottleInfo, BottleLauncher, CleanupItem,
    CleanupPass, CleanupReport, CommitReport, ExecOutput,
};
pub use error::Coded;
pub use manifest::{Manifest, ManifestError};
pub use plan::Plan;
pub use spec::BottleSpec;
