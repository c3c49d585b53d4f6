//! `bottle-bundle-files` makes what the host prepares for a bottle's
//! bundle: the per-bottle CA ([`generate_ca`]) and the list of git's
//! runtime files the bundle image carries ([`git_runtime_files`]).
//!
//! Both the `bottle` CLI (through the backends) and the bundle link it, so
//! it stays small: no proxy, no TLS stack, no async runtime.

pub mod ca;
mod error;
pub mod git_runtime;

pub use ca::{CaPair, generate_ca};
pub use error::BundleFilesError;
pub use git_runtime::{BUNDLE_GIT, git_runtime_files};
