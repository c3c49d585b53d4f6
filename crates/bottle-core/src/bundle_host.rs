//! The seam between a backend and whoever runs its sidecar bundle.
//!
//! The docker backend runs its own bundles; the smolmachines backend asks a
//! [`BundleHost`] (in practice bottle-docker's, composed by the CLI) to run
//! one where the microVM can reach it. Neither backend crate depends on the
//! other: both speak this trait.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::backend::{BackendError, CleanupReport};
use crate::plan::Plan;
use crate::pool::Fingerprint;
use crate::spec::BottleSpec;

/// What a bundle host resolved at `prepare`, before the operator confirms
/// and before anything is created. The plan carries it to
/// [`BundleHost::start`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreparedBundle<P> {
    /// Where the agent will reach the bundle; the launch refuses an
    /// endpoint at any other address.
    pub address: Ipv4Addr,
    /// Lines for the plan summary (label, value).
    pub lines: Vec<(String, String)>,
    /// The host's own typed data.
    pub data: P,
}

/// Where the agent reaches its bundle, once it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleEndpoint {
    /// The one address the agent dials. The bundle's agent-facing ports
    /// (`PROXY_PORT`, `GIT_GATE_PORT`, `SUPERVISE_PORT` of
    /// [`crate::bundle`]) answer on it.
    pub address: Ipv4Addr,
    /// Host path of the per-bottle CA certificate (PEM) the agent trusts.
    pub ca_cert: PathBuf,
}

/// Runs sidecar bundles for a backend that does not run them itself.
pub trait BundleHost: Send + Sync {
    /// What `prepare` resolves for `start`; stored in the plan.
    type Prepared: Clone + fmt::Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync;

    /// Resolves what the bundle of `spec` needs (images, its network and
    /// address) without creating anything: the operator may still decline.
    fn prepare(&self, spec: &BottleSpec) -> Result<PreparedBundle<Self::Prepared>, BackendError>;

    /// Starts the bundle of `plan`, as `prepared`, waits until its
    /// agent-facing daemons answer, and says where the agent reaches it. On
    /// failure everything it created is removed before it returns.
    fn start<D>(
        &self,
        plan: &Plan<D>,
        prepared: &Self::Prepared,
    ) -> Result<BundleEndpoint, BackendError>;

    /// Stops and removes `bottle`'s bundle and everything it owns.
    /// Succeeds, with an empty report, when there is nothing to remove.
    fn stop(&self, bottle: &str) -> Result<CleanupReport, BackendError>;

    /// The steps of [`BundleHost::start`] a `BOTTLE_FAILPOINT` may name
    /// (the host fails there itself); none by default.
    fn launch_steps(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Bottles of this install (its state root) whose bundle exists
    /// (running or not), for `cleanup`; another install's are not listed.
    fn bottles(&self) -> Result<Vec<String>, BackendError>;

    /// What the host says of `bottle`'s bundle now, by name: running, when
    /// it last started, its networks and addresses, limits, image. A
    /// restart or any change changes it: a pooled bottle's claim compares
    /// it with what it said at fill.
    fn standing(&self, bottle: &str) -> Result<BTreeMap<String, String>, BackendError>;

    /// Whether `bottle`'s bundle, started as `prepared`, answers its health
    /// check now; why not otherwise.
    fn answers(&self, bottle: &str, prepared: &Self::Prepared) -> Result<(), String>;

    /// Adds what the bundle of `spec` is made from to a pool fingerprint:
    /// its binary, its upstream CAs, its credentials.
    fn fingerprint(
        &self,
        spec: &BottleSpec,
        fingerprint: &mut Fingerprint,
    ) -> Result<(), BackendError>;
}
