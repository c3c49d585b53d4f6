//! `bottle-bundle` is the per-bottle sidecar bundle: the agent-facing proxy,
//! the loopback-only egress daemon, the audit log, and the supervisor that
//! keeps them up (or exits non-zero so the bottle fails closed).
//!
//! Entry points: [`start`] (library, used by the binary and the tests),
//! [`generate_ca`] (the backend calls it at prepare time), [`read_audit`] /
//! [`AuditFollower`] (`bottle logs`), [`git_runtime_files`] (the backend
//! copies them into the bundle image so that git-gate can run git),
//! [`supervise`] (the MCP server through which the agent asks the operator).

mod accept;
pub mod allowlist;
pub mod audit;
pub mod body;
pub mod ca;
pub mod daemons;
pub mod egress;
mod error;
pub mod gitgate;
pub mod io;
pub mod proxy;
pub mod scan;
pub mod supervise;

// ca.rs (moving to its own crate, issue 12) still names the allowlist by
// its old module path; remove this alias when ca.rs has moved.
use allowlist as policy;

pub use audit::{AuditFollower, AuditLog, AuditRecord, Decision, read_audit};
pub use ca::{CaPair, generate_ca};
pub use daemons::{RunningBundle, load_config, start};
pub use error::BundleError;
pub use gitgate::git_runtime_files;
