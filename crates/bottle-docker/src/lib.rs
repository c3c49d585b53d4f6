//! `bottle-docker` is the docker backend: a [`DockerBackend`] implementing
//! [`bottle_core::BottleBackend`] over the Docker Engine API (bollard). It
//! never shells out to the `docker` CLI; the only host programs it runs are
//! `git --exec-path` and `ldd`, when a bottle has git repositories, to
//! collect the git runtime the bundle image carries for git-gate, and
//! `cp -a`, to copy the agent's writable layer for [`reset`].
//!
//! A bottle is a per-bottle internal bridge `bot-bottle-<slug>` whose host
//! side has no address, the bundle container `bot-bottle-<slug>-bundle`
//! pinned at `.2` and also attached to the shared `bot-bottle-egress`
//! bridge, and the agent container `bot-bottle-<slug>-agent` at `.3` on the
//! internal bridge only (see [`config`] for why this closes the host and
//! DNS paths Docker's `--internal` leaves open).
//!
//! Module map: [`backend`] (the trait impl, prepare), [`launch`] (steps,
//! unwinding, failpoints), [`lifecycle`] (list, stop, cleanup),
//! [`bottle`] (exec, tool calls through the in-box agent:
//! `toolbox` finds its binary for the launch and holds the bottle's one
//! channel to it, `toolbox_stream` bridges its exec to that channel),
//! [`copy`] (`bottle cp` both ways over the archive API, a copy in checked
//! and written with the agent's container paused),
//! [`reset`] (the verified reset's snapshot, revert and sources),
//! [`config`] (pure request builders),
//! [`images`], [`cache`] (facts remembered under `<state_root>/.cache/`),
//! [`names`] (labels), [`data`] (plan data, state dir),
//! [`vm_bundle`] (the bundle and the agent image of a microVM bottle,
//! through bottle-core's `BundleHost` and `ImageStore`).
//!
//! **Architecture Invariant:** every Docker resource a launch creates
//! carries the `bottle.*` labels of [`names`] and is registered for undo
//! before the next step runs.

pub mod api_version;
pub mod archive;
pub mod backend;
pub mod bottle;
pub mod cache;
pub mod client;
pub mod commit;
pub mod config;
pub mod copy;
pub mod data;
mod error;
pub mod gvisor;
pub mod host_checks;
pub mod images;
mod isolation;
pub mod launch;
pub mod lifecycle;
pub mod names;
pub mod pause;
mod pool;
mod pool_entry;
pub mod reset;
pub mod runsc;
pub mod storage;
pub mod tarball;
mod toolbox;
mod toolbox_stream;
mod tty;
pub mod users;
pub mod vm_bundle;

pub use backend::{DEFAULT_HEALTH_TIMEOUT, DockerBackend, DockerOptions, SUBNET_POOL_ENV};
pub use bottle::DockerBottle;
pub use error::{BUNDLE_BUILD_HINT, DockerError};
pub use images::{BUNDLE_BIN_ENV, Progress};
pub use launch::{FAILPOINT_ENV, Step};
pub use vm_bundle::{DockerBundleHost, EngineImages};
