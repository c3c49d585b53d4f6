//! `bottle-smolvm` is the smolmachines backend: one libkrun microVM per
//! bottle, driven through the `smolvm` CLI, whose only way out is the
//! bottle's sidecar bundle.
//!
//! It owns:
//! - [`cli`]: the `smolvm` wrapper (every argv built in one place, run
//!   through [`bottle_core::exec::CommandRunner`]), version-aware
//!   ([`version`]);
//! - [`statedb`]: where smolvm's state database is, and the fail-closed
//!   patch that makes a machine's egress policy exactly one `/32` (and no DNS
//!   names) before it starts;
//! - [`registry`] and [`pack`]: the agent image exported from an
//!   [`bottle_core::images::ImageStore`] (the Docker Engine), served over a read-only OCI registry on an ephemeral port, packed
//!   by `smolvm pack create` into a `.smolmachine` cached by image ID;
//! - [`provision`]: CA, prompt, skills, git and supervise settings copied
//!   into the guest;
//! - [`backend`]: [`backend::SmolvmBackend`], the
//!   [`bottle_core::BottleBackend`], and `prepare`; laid out like
//!   bottle-docker: [`launch`] (the ordered steps and their unwinding),
//!   [`lifecycle`] (list, stop, cleanup), [`bottle`] (exec, tool calls),
//!   [`copy`] (`bottle cp` both ways, through the guest's `tar` run as the
//!   agent's user), [`data`] (plan data, the state file);
//! - [`reset`] and [`sparse`]: the verified reset, by restoring the
//!   machine's sparse disks from golden copies taken at launch;
//! - [`bundle_address`]: why the bundle's address is what it is; the
//!   bundle itself runs on a [`bottle_core::bundle_host::BundleHost`];
//! - [`host`]: KVM and real-smolvm availability.
//!
//! **Architecture Invariant:** a machine is never started unless its record
//! in smolvm's state database was read back holding exactly the bundle's
//! `/32`; every other outcome removes what the launch created.

pub mod backend;
pub mod bottle;
pub mod bundle_address;
pub mod cli;
pub mod copy;
pub mod data;
pub mod error;
pub mod host;
pub mod interactive;
pub mod launch;
pub mod lifecycle;
pub mod pack;
mod pool;
pub mod provision;
pub mod registry;
pub mod reset;
pub mod sparse;
pub mod statedb;
pub mod version;

pub use backend::SmolvmBackend;
pub use bottle::SmolvmBottle;
pub use cli::Smolvm;
pub use error::SmolvmError;
pub use host::real_smolvm_available;
pub use version::SmolvmVersion;
