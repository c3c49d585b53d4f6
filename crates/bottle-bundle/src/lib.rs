//! `bottle-bundle` is the per-bottle sidecar bundle: the agent-facing proxy,
//! egress (the only code that dials out, called by the proxy in-process),
//! the audit log, and the supervisor that keeps the daemons up (or exits non-zero so the bottle fails closed).
//!
//! Entry points: [`start`] (library, used by the binary and the tests),
//! [`read_audit`] / [`AuditFollower`] (`bottle logs`), [`supervise`] (the
//! MCP server through which the agent asks the operator). What the host
//! prepares for the bundle (the per-bottle CA, git's runtime files) is
//! `bottle-bundle-files`, so that the CLI does not link the proxy stack;
//! [`generate_ca`] is re-exported from it.

mod accept;
pub mod allowlist;
pub mod audit;
pub mod body;
pub mod ca;
pub mod daemons;
pub mod egress;
pub mod encoding;
mod error;
pub mod gitgate;
pub mod io;
pub mod log;
pub mod proxy;
pub mod relay;
pub mod scan;
pub mod supervise;
pub mod websocket;

pub use audit::{AuditFollower, AuditLog, AuditRecord, Decision, DroppedSummary, read_audit};
pub use bottle_bundle_files::{CaPair, generate_ca};
pub use daemons::{RunningBundle, load_config, start};
pub use error::BundleError;
