//! The connection to the Docker Engine: a bollard client and the tokio
//! runtime the synchronous backend blocks on.
//!
//! The client's API version is negotiated down to the daemon's (bollard
//! defaults to a newer one than Debian's dockerd 20.10 speaks), and every
//! request this crate sends is valid at [`DOCKER_MIN_API`].

use std::future::Future;
use std::sync::Arc;

use bollard::Docker;
use bottle_core::timeline::Timeline;

use crate::api_version::{DOCKER_MIN_API, DockerApiVersion};
use crate::error::DockerError;

/// Where the daemon listens unless `DOCKER_HOST` says otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// A connected client plus the runtime its futures run on.
#[derive(Clone)]
pub struct Engine {
    /// The bollard client (cheap to clone).
    pub docker: Docker,
    runtime: Arc<tokio::runtime::Runtime>,
    /// The daemon's API version after negotiation.
    pub api_version: String,
    /// Where `bottle start --timings` counts this client's round trips.
    timeline: Option<Timeline>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("api_version", &self.api_version)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Connects to `host` (a `unix://` or `tcp://` URL), or to `DOCKER_HOST`
    /// / the local socket when `None`, and negotiates the API version.
    pub fn connect(host: Option<&str>) -> Result<Engine, DockerError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bottle-docker")
            .enable_all()
            .build()
            .map_err(DockerError::Runtime)?;
        let endpoint = host
            .map(str::to_string)
            .or_else(|| std::env::var("DOCKER_HOST").ok())
            .unwrap_or_else(|| format!("unix://{DEFAULT_SOCKET}"));
        let connect_err = |source| DockerError::Connect {
            endpoint: endpoint.clone(),
            source,
        };
        // bollard's client holds a hyper connection pool that must be
        // created inside the runtime it will be driven by.
        let docker = runtime.block_on(async {
            let docker = match host {
                Some(host) => Docker::connect_with_host(host),
                None => Docker::connect_with_defaults(),
            }
            .map_err(connect_err)?;
            docker.negotiate_version().await.map_err(connect_err)
        })?;
        let version = docker.client_version();
        let api = DockerApiVersion::new(
            u32::try_from(version.major_version).unwrap_or(u32::MAX),
            u32::try_from(version.minor_version).unwrap_or(u32::MAX),
        );
        let api_version = api.to_string();
        if api < DOCKER_MIN_API {
            return Err(DockerError::ApiTooOld { found: api_version });
        }
        Ok(Engine {
            docker,
            runtime: Arc::new(runtime),
            api_version,
            timeline: None,
        })
    }

    /// This client with every later [`Engine::block_on`] counted as a
    /// round trip into `timeline`.
    pub fn counting_into(mut self, timeline: Option<Timeline>) -> Engine {
        self.timeline = timeline;
        self
    }

    /// Runs a future to completion on the backend's runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        if let Some(timeline) = &self.timeline {
            timeline.count_round_trip();
        }
        self.runtime.block_on(future)
    }

    /// Starts `future` on the runtime without waiting for it: a request
    /// that overlaps the caller's next ones, counted as a round trip.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if let Some(timeline) = &self.timeline {
            timeline.count_round_trip();
        }
        self.runtime.spawn(future)
    }

    /// The runtime, for spawning tasks that outlive one call.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime.handle().clone()
    }
}

/// Removes a container (killing it first). `Ok(false)` if it was gone.
pub fn remove_container(engine: &Engine, name: &str) -> Result<bool, DockerError> {
    engine.block_on(remove_container_async(engine, name))
}

/// [`remove_container`], for a caller already on the runtime.
pub(crate) async fn remove_container_async(
    engine: &Engine,
    name: &str,
) -> Result<bool, DockerError> {
    let options = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match engine.docker.remove_container(name, Some(options)).await {
        Ok(()) => Ok(true),
        Err(err) if crate::error::is_not_found(&err) => Ok(false),
        // "removal already in progress": someone else is removing it.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(false),
        Err(err) => Err(DockerError::api(format!("remove container {name}"))(err)),
    }
}
