//! Running a bundle on Docker: the one component both a docker bottle and
//! a microVM's bundle host ([`crate::vm_bundle`]) use. It creates the
//! bottle network and the shared egress network, creates the bundle
//! container and writes its files (config, CA, credentials), starts it,
//! verifies its addresses and networks, and waits until it is healthy.
//! Each resource is registered for undo as soon as it exists.
//!
//! A microVM's bundle runs all of it ([`Launch::run_bundle`]); a docker
//! bottle runs [`Launch::prepare_bundle`], starts the bundle together with
//! the agent container, then runs [`Launch::check_bundle`].

use std::time::{Duration, Instant};

use bollard::models::NetworkConnectRequest;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, LogsOptionsBuilder,
};
use futures_util::StreamExt;

use super::{BundleOutput, Launch, Step};
use crate::archive::upload;
use crate::bottle::exec_captured;
use crate::client::Engine;
use crate::config::{
    self, BUNDLE_BINARY_PATH, BUNDLE_CA_CERT, BUNDLE_CA_KEY, BUNDLE_CREDENTIALS_DIR, HostOnBridge,
};
use crate::data::{self, CredentialRef};
use crate::error::{DockerError, is_address_pool_full, is_not_found, is_pool_overlap};
use crate::isolation;
use crate::lifecycle;
use crate::names::{EGRESS_NETWORK, role};
use crate::tarball::{Ownership, TarBuilder, entry_name};

impl<'a, D> Launch<'a, D> {
    /// The bundle steps alone (a microVM's bundle): the bottle network,
    /// the egress network, and the bundle running, verified and healthy.
    pub(super) fn run_bundle(&mut self) -> Result<(), DockerError> {
        self.prepare_bundle()?;
        let bundle = self.bundle.container.clone();
        let (started, output) = self
            .engine
            .block_on(start_watched(&self.engine.docker, &bundle));
        self.bundle_output = output;
        started.map_err(|err| self.bundle_start_failed(err))?;
        self.egress_lock = None;
        self.step_done(Step::BundleStart)?;
        self.check_bundle()
    }

    /// Creates the empty `audit.ok` marker beside the audit log, which the
    /// bundle renames to `audit.degraded` when it cannot write the log
    /// (`bottle list` shows it). This step serves both backends: a microVM's
    /// bundle is launched through it too.
    fn mark_audit_ok(&self) -> Result<(), DockerError> {
        use bottle_core::audit_files::{AUDIT_DEGRADED_MARKER, AUDIT_OK_MARKER};
        let stale = self.paths.logs().join(AUDIT_DEGRADED_MARKER);
        match std::fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(DockerError::io("remove", &stale)(e));
            }
            _ => {}
        }
        data::write_file(&self.paths.logs().join(AUDIT_OK_MARKER), b"", 0o600)
    }

    /// Up to `bundle-files`: the networks and the bundle container, created
    /// and filled but not started. Holds the egress lock from ensuring the
    /// egress network until the bundle is connected to it.
    pub(super) fn prepare_bundle(&mut self) -> Result<(), DockerError> {
        // The CA's key is made while the Engine creates the networks.
        let bottle = self.plan.bottle.clone();
        let ca = std::thread::spawn(move || bottle_bundle_files::generate_ca(&bottle));
        // And the mirrors of working checkouts, cloned on the host.
        let mirrors = self.spawn_mirrors();
        data::create_private_dir(&self.paths.logs())?;
        self.mark_audit_ok()?;
        data::create_private_dir(&self.paths.requests())?;
        if !self.plan.host_services.is_empty() {
            data::create_private_dir(&self.paths.host_services())?;
        }
        let names = (self.bundle.network.clone(), self.bundle.container.clone());
        let (network, bundle) = (&names.0, &names.1);

        // Exclusive until the bundle is attached: Docker does not keep
        // network names unique, so two launches that both saw no egress
        // network would each create one, and every later launch would
        // fail on the ambiguous name.
        self.egress_lock = Some(lifecycle::egress_lock());
        self.create_networks(network)?;
        self.check_network(network)?;
        let ca = ca.join().unwrap_or_else(|_| {
            Err(bottle_bundle_files::BundleFilesError::Ca {
                detail: "its generation panicked".into(),
            })
        });
        self.write_stage(ca)?;
        mirrors.join().unwrap_or_else(|_| {
            Err(DockerError::PlanData {
                detail: "mirroring the working checkouts panicked".into(),
            })
        })?;
        self.step_done(Step::Network)?;
        self.step_done(Step::EgressNetwork)?;

        self.create_bundle(bundle)?;
        self.step_done(Step::BundleCreate)?;

        self.block("connect the bundle to the egress network", async {
            self.engine
                .docker
                .connect_network(
                    EGRESS_NETWORK,
                    NetworkConnectRequest {
                        container: bundle.clone(),
                        endpoint_config: None,
                    },
                )
                .await
        })?;
        // The bundle now uses the egress network (created containers count
        // for `remove_egress_if_unused`), so no stop can remove it: let the
        // next launch in. Held to the start, it made launches at once queue
        // through every upload (50 at once: a minute for the last).
        self.egress_lock = None;
        self.step_done(Step::BundleConnect)?;

        self.write_bundle_files(bundle)?;
        self.step_done(Step::BundleFiles)?;
        Ok(())
    }

    /// Starts, on a thread, the bare mirror of each working checkout the
    /// bundle serves (`<state_dir>/git/<name>.git`, made before the bundle
    /// exists) and the host's sync record of the read-write ones, their
    /// first baseline the mirror's refs as cloned.
    fn spawn_mirrors(&self) -> std::thread::JoinHandle<Result<(), DockerError>> {
        use bottle_core::checkout::{self, CheckoutPaths, SyncRecord, SyncedRepo};
        let repos: Vec<data::GitRef> = self
            .bundle
            .git
            .iter()
            .filter(|repo| repo.checkout)
            .cloned()
            .collect();
        let paths = CheckoutPaths::of_state_dir(&self.paths.root);
        let bottle = self.plan.bottle.clone();
        std::thread::spawn(move || {
            if repos.is_empty() {
                return Ok(());
            }
            data::create_private_dir(&paths.dir)?;
            let mut record = SyncRecord {
                v: checkout::SYNC_RECORD_VERSION,
                bottle,
                repos: Vec::new(),
            };
            let runner = bottle_core::exec::SystemRunner;
            for repo in &repos {
                let Some(source) = &repo.local_path else {
                    continue;
                };
                let mirror = paths.mirror(&repo.name);
                let baseline = checkout::create_mirror(&runner, source, &mirror)?;
                if repo.mode == bottle_core::manifest::GitMode::ReadWrite {
                    record.repos.push(SyncedRepo {
                        name: repo.name.clone(),
                        checkout: source.clone(),
                        mirror,
                        push: repo.push.clone(),
                        allow_force: repo.allow_force,
                        allow_delete: repo.allow_delete,
                        baseline,
                    });
                }
            }
            if !record.repos.is_empty() {
                checkout::write_record(&paths, &record)?;
            }
            Ok(())
        })
    }

    /// Writes the bundle's CA and, for the operator to read, its config
    /// into the state dir. Done at launch, not at prepare, so a declined
    /// plan leaves nothing behind.
    fn write_stage(
        &self,
        ca: Result<bottle_bundle_files::CaPair, bottle_bundle_files::BundleFilesError>,
    ) -> Result<(), DockerError> {
        let ca = ca.map_err(|err| DockerError::Ca {
            detail: err.to_string(),
        })?;
        data::write_file(&self.paths.ca_cert(), ca.cert_pem.as_bytes(), 0o644)?;
        data::write_file(&self.paths.ca_key(), ca.key_pem.as_bytes(), 0o600)?;
        let config = serde_json::to_vec_pretty(&config::bundle_config(self.plan, self.bundle))
            .map_err(|err| DockerError::PlanData {
                detail: err.to_string(),
            })?;
        data::write_file(&self.paths.bundle_config(), &config, 0o600)
    }

    /// `bundle-verify` and `bundle-health` of a started bundle.
    pub(super) fn check_bundle(&mut self) -> Result<(), DockerError> {
        let (network, bundle) = (self.bundle.network.clone(), self.bundle.container.clone());
        let (network, bundle) = (&network, &bundle);
        self.verify_bundle(network, bundle)?;
        self.step_done(Step::BundleVerify)?;

        let output = self.bundle_output.take();
        self.wait_healthy(bundle, output)?;
        if self.component.host_on_bridge == HostOnBridge::Gateway {
            self.wait_host_reaches(bundle)?;
        }
        self.step_done(Step::BundleHealth)?;
        Ok(())
    }

    /// Creates the bottle network and, if missing, the shared egress
    /// network, both at once; registers the undo of each that exists
    /// before returning either's error.
    fn create_networks(&mut self, network: &str) -> Result<(), DockerError> {
        let labels = self.labels_for(role::NETWORK);
        let request = config::bottle_network(
            network,
            &self.bundle.subnet,
            self.bundle.gateway,
            self.component.host_on_bridge,
            labels,
        );
        let docker = &self.engine.docker;
        let (created, egress) = self.engine.block_on(async {
            tokio::join!(docker.create_network(request), ensure_egress(docker))
        });
        let engine = self.engine;
        if created.is_ok() {
            let name = network.to_string();
            self.undo.push("the bottle network", move || {
                lifecycle::remove_network(engine, &name)
                    .map(drop)
                    .map_err(|e| e.to_string())
            });
        }
        if egress.is_ok() {
            self.undo.push("the egress network", move || {
                lifecycle::remove_egress_if_unused(engine)
                    .map(drop)
                    .map_err(|e| e.to_string())
            });
        }
        match created {
            Err(err) if is_pool_overlap(&err) => {
                return Err(DockerError::SubnetTaken {
                    subnet: self.bundle.subnet.clone(),
                    network: network.to_string(),
                });
            }
            created => created.map_err(DockerError::api(format!("create network {network}")))?,
        };
        egress
    }

    /// Fails closed unless the network is internal, gives the host an
    /// address exactly when the component says so, and has the planned
    /// subnet.
    pub(super) fn check_network(&self, network: &str) -> Result<(), DockerError> {
        let inspect = self.block(&format!("inspect network {network}"), async {
            self.engine.docker.inspect_network(network, None).await
        })?;
        isolation::check_bottle_network(
            network,
            &inspect,
            &self.bundle.subnet,
            self.component.host_on_bridge,
        )
        .map_err(|what| DockerError::IsolationUnconfirmed { what })
    }

    /// Why the bundle did not start: the egress network's address pool is
    /// used up (the daemon gives a connected container its address at the
    /// start), or the Engine's own error.
    pub(super) fn bundle_start_failed(&self, err: bollard::errors::Error) -> DockerError {
        if is_address_pool_full(&err, EGRESS_NETWORK) {
            return self.egress_full();
        }
        DockerError::api(format!("start {}", self.bundle.container))(err)
    }

    /// The egress network's pool is used up: says how full, as far as the
    /// daemon tells (an inspect that fails still names the network).
    fn egress_full(&self) -> DockerError {
        let inspect = self
            .engine
            .block_on(self.engine.docker.inspect_network(EGRESS_NETWORK, None))
            .ok();
        let subnets = inspect
            .as_ref()
            .and_then(|n| n.ipam.as_ref()?.config.as_ref())
            .map(|configs| {
                configs
                    .iter()
                    .filter_map(|c| c.subnet.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "subnet unknown".into());
        let bundles = inspect
            .as_ref()
            .and_then(|n| n.containers.as_ref())
            .map_or(0, std::collections::HashMap::len);
        DockerError::EgressAddressesExhausted {
            network: EGRESS_NETWORK.to_string(),
            subnets,
            bundles,
        }
    }

    fn create_bundle(&mut self, bundle: &str) -> Result<(), DockerError> {
        let logs = self.paths.logs().display().to_string();
        let requests = self.paths.requests().display().to_string();
        let host_services = (!self.plan.host_services.is_empty())
            .then(|| self.paths.host_services().display().to_string());
        let body = config::bundle_container(
            self.bundle,
            &self.paths.root,
            &logs,
            &requests,
            host_services.as_deref(),
            self.labels_for(role::BUNDLE),
        );
        let options = CreateContainerOptionsBuilder::default()
            .name(bundle)
            .build();
        self.block(&format!("create container {bundle}"), async {
            self.engine
                .docker
                .create_container(Some(options), body)
                .await
        })?;
        self.undo_container("the bundle container", bundle);
        Ok(())
    }

    fn write_bundle_files(&self, bundle: &str) -> Result<(), DockerError> {
        let (uid, gid) = self.bundle.user;
        let owner = Ownership {
            uid: u64::from(uid),
            gid: u64::from(gid),
        };
        let bundle_config = config::bundle_config(self.plan, self.bundle);
        let json =
            serde_json::to_vec_pretty(&bundle_config).map_err(|err| DockerError::PlanData {
                detail: err.to_string(),
            })?;
        let read =
            |path: std::path::PathBuf| std::fs::read(&path).map_err(DockerError::io("read", path));
        let cert = read(self.paths.ca_cert())?;
        let key = read(self.paths.ca_key())?;
        let mut tar = TarBuilder::new();
        tar.dir(
            &entry_name(bottle_core::bundle::BUNDLE_RUN_DIR),
            0o700,
            owner,
        )?;
        tar.file(
            &entry_name(bottle_core::bundle::BUNDLE_CONFIG_PATH),
            &json,
            0o600,
            owner,
        )?;
        tar.file(&entry_name(BUNDLE_CA_CERT), &cert, 0o644, owner)?;
        tar.file(&entry_name(BUNDLE_CA_KEY), &key, 0o600, owner)?;
        tar.dir(&entry_name(BUNDLE_CREDENTIALS_DIR), 0o700, owner)?;
        for (credential, file) in self
            .bundle
            .credentials
            .iter()
            .zip(&bundle_config.credentials)
        {
            let secret = read_secret(credential)?;
            tar.file(&entry_name(&file.file), &secret, 0o600, owner)?;
        }
        if !self.bundle.git.is_empty() {
            tar.dir(
                &entry_name(config::BUNDLE_GIT_CREDENTIALS_DIR),
                0o700,
                owner,
            )?;
            tar.dir("var/lib/bottle", 0o700, owner)?;
            tar.dir(&entry_name(config::BUNDLE_GIT_MIRRORS), 0o700, owner)?;
        }
        tar.dir(&entry_name(config::BUNDLE_UPSTREAM_CA_DIR), 0o700, owner)?;
        for (source, file) in self
            .bundle
            .upstream_ca
            .iter()
            .zip(&bundle_config.upstream_roots)
        {
            tar.file(&entry_name(file), &read_upstream_ca(source)?, 0o644, owner)?;
        }
        for (repo, served) in self.bundle.git.iter().zip(&bundle_config.git) {
            if let (Some(source), Some(file)) = (&repo.credential, &served.credential_file) {
                let secret = std::fs::read(source).map_err(|e| DockerError::Credential {
                    name: format!("git {}", repo.name),
                    detail: format!("{}: {e}", source.display()),
                })?;
                tar.file(&entry_name(file), &secret, 0o600, owner)?;
            }
        }
        upload(self.engine, bundle, tar.finish()?)
    }

    /// Fails closed unless the bundle sits at its pinned address on the
    /// (still internal) bottle network and also on the egress network.
    fn verify_bundle(&self, network: &str, bundle: &str) -> Result<(), DockerError> {
        self.check_network(network)?;
        let inspect = self.block(&format!("inspect container {bundle}"), async {
            self.engine.docker.inspect_container(bundle, None).await
        })?;
        // A bundle that already exited has no address to check: say so.
        if let Some(exited) = exited(&inspect) {
            return Err(self.unhealthy(bundle, exited));
        }
        isolation::check_bundle(network, &inspect, self.bundle.ip)
            .map_err(|what| DockerError::IsolationUnconfirmed { what })
    }

    /// Waits until the bundle serves: its ready line on the stderr
    /// attached before the start, or else (no attach, or the stream ended
    /// or stayed without the line for [`READY_LINE_WAIT`]) the proxy's
    /// health endpoint on the bundle's bottle-network address, polled from
    /// inside the bundle (works wherever the Engine API does, including
    /// daemons whose container addresses the host cannot reach), which also
    /// tells a bundle that exited from one still coming up.
    fn wait_healthy(&self, bundle: &str, output: Option<BundleOutput>) -> Result<(), DockerError> {
        let deadline = Instant::now() + self.settings.health_timeout;
        if let Some(output) = output {
            let within = self.settings.health_timeout.min(READY_LINE_WAIT);
            if self.engine.block_on(ready_line_seen(output, within)) {
                return Ok(());
            }
        }
        let addr = format!("{}:{}", self.bundle.ip, bottle_core::bundle::PROXY_PORT);
        let argv = [
            BUNDLE_BINARY_PATH.to_string(),
            "health".to_string(),
            "--addr".to_string(),
            addr.clone(),
        ];
        // A bundle that is not up at the first probe usually is a few
        // milliseconds later: the pause grows from 5 ms to 100 ms.
        let mut pause = Duration::from_millis(5);
        let mut last;
        loop {
            let state = self.block(&format!("inspect container {bundle}"), async {
                self.engine.docker.inspect_container(bundle, None).await
            })?;
            if let Some(exited) = exited(&state) {
                return Err(self.unhealthy(bundle, exited));
            }
            match self
                .engine
                .block_on(exec_captured(self.engine, bundle, &argv, None))
            {
                Ok(out) if out.exit_code == 0 => return Ok(()),
                Ok(out) => {
                    last = String::from_utf8_lossy(&out.stderr).trim().to_string();
                }
                // The container may be going down; the next inspect says.
                Err(err) => last = err.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(self.unhealthy(
                    bundle,
                    format!(
                        "no healthy answer from {addr} within {} s (last: {last})",
                        self.settings.health_timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Polls a TCP connection from the host to the bundle's proxy port,
    /// the path smolvm's gateway takes for the guest's traffic.
    fn wait_host_reaches(&self, bundle: &str) -> Result<(), DockerError> {
        let addr = std::net::SocketAddr::from((self.bundle.ip, bottle_core::bundle::PROXY_PORT));
        let deadline = Instant::now() + self.settings.health_timeout;
        loop {
            let last = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            if Instant::now() >= deadline {
                return Err(self.unhealthy(
                    bundle,
                    format!(
                        "the host cannot connect to {addr} within {} s (last: {last}); smolvm dials the bundle from the host",
                        self.settings.health_timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn unhealthy(&self, bundle: &str, reason: String) -> DockerError {
        DockerError::BundleUnhealthy {
            name: self.plan.bottle.clone(),
            reason,
            logs: container_logs(self.engine, bundle, 50),
        }
    }
}

/// Creates the shared egress network unless it exists; the caller holds
/// the egress lock.
async fn ensure_egress(docker: &bollard::Docker) -> Result<(), DockerError> {
    match docker.inspect_network(EGRESS_NETWORK, None).await {
        Ok(_) => return Ok(()),
        Err(err) if is_not_found(&err) => {}
        Err(err) => {
            return Err(DockerError::api(format!(
                "inspect network {EGRESS_NETWORK}"
            ))(err));
        }
    }
    match docker.create_network(config::egress_network()).await {
        // Another launch (by another user: the lock is per user) created
        // it meanwhile.
        Ok(_)
        | Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(err) => Err(DockerError::api(format!("create network {EGRESS_NETWORK}"))(err)),
    }
}

/// A host CA file for upstream TLS, checked again at launch (it may have
/// changed since `check`): a bundle given no certificate would refuse to
/// start with less to say.
fn read_upstream_ca(path: &std::path::Path) -> Result<Vec<u8>, DockerError> {
    let fail = |detail: String| DockerError::UpstreamCa {
        path: path.display().to_string(),
        detail,
    };
    let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    bottle_core::upstream_trust::certificate_count(&pem)
        .map_err(|problem| fail(problem.describe().into()))?;
    Ok(pem)
}

/// Reads a credential's secret on the host.
fn read_secret(credential: &CredentialRef) -> Result<Vec<u8>, DockerError> {
    let err = |detail: String| DockerError::Credential {
        name: credential.name.clone(),
        detail,
    };
    match (&credential.file, &credential.env) {
        (Some(path), _) => std::fs::read(path).map_err(|e| err(format!("{}: {e}", path.display()))),
        (None, Some(var)) => std::env::var(var)
            .map(String::into_bytes)
            .map_err(|_| err(format!("environment variable {var} is not set"))),
        (None, None) => Err(err("it has no source".into())),
    }
}

/// The last `lines` of a container's output, for error messages.
pub fn container_logs(engine: &Engine, container: &str, lines: usize) -> String {
    let options = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail(&lines.to_string())
        .build();
    engine.block_on(async {
        let mut stream = engine.docker.logs(container, Some(options));
        let mut text = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(chunk.as_ref()));
        }
        text
    })
}

/// Why a container the Engine describes is not running, if it is not.
fn exited(inspect: &bollard::models::ContainerInspectResponse) -> Option<String> {
    let state = inspect.state.as_ref();
    match state.and_then(|state| state.running) {
        Some(true) => None,
        _ => Some(format!(
            "the bundle exited (code {})",
            state.and_then(|state| state.exit_code).unwrap_or(-1)
        )),
    }
}

/// Attaches to the bundle's stderr, then starts it: attached first, so the
/// ready line cannot be written before anyone reads. An attach the Engine
/// refuses is no error: `bundle-health` then probes.
pub(super) async fn start_watched(
    docker: &bollard::Docker,
    bundle: &str,
) -> (Result<(), bollard::errors::Error>, Option<BundleOutput>) {
    let options = AttachContainerOptionsBuilder::default()
        .stderr(true)
        .stream(true)
        .build();
    let output = docker
        .attach_container(bundle, Some(options))
        .await
        .ok()
        .map(|attached| attached.output);
    (docker.start_container(bundle, None).await, output)
}

/// How long `bundle-health` waits for the ready line before it probes
/// instead: a bundle says it within milliseconds of its start, and one
/// that never will (a binary older than the line) must not cost the whole
/// health timeout.
const READY_LINE_WAIT: Duration = Duration::from_secs(2);

/// The most of the bundle's stderr read while waiting for its ready line:
/// a bundle says a few lines before it.
const READY_OUTPUT_LIMIT: usize = 64 * 1024;

/// Whether the bundle's stderr shows [`bottle_core::bundle::BUNDLE_READY_LINE`]
/// as a whole line within `within`; false when the stream ends, fails or
/// says too much first.
async fn ready_line_seen(mut output: BundleOutput, within: Duration) -> bool {
    let read = async {
        let mut said = Vec::new();
        while let Some(Ok(chunk)) = output.next().await {
            said.extend_from_slice(&chunk.into_bytes());
            if has_ready_line(&said) {
                return true;
            }
            if said.len() > READY_OUTPUT_LIMIT {
                return false;
            }
        }
        false
    };
    tokio::time::timeout(within, read).await.unwrap_or(false)
}

/// Whether `said` holds the ready line, ended by a newline.
fn has_ready_line(said: &[u8]) -> bool {
    let ready = bottle_core::bundle::BUNDLE_READY_LINE.as_bytes();
    let mut lines = said.split(|byte| *byte == b'\n');
    // The last piece has no newline yet.
    let finished = said.iter().filter(|byte| **byte == b'\n').count();
    lines
        .by_ref()
        .take(finished)
        .any(|line| line.strip_suffix(b"\r").unwrap_or(line) == ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_files_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut credential = CredentialRef {
            name: "k".into(),
            host: "h".into(),
            header: "x".into(),
            format: "{}".into(),
            file: Some(file),
            env: None,
        };
        assert_eq!(read_secret(&credential).unwrap(), b"s3cret\n");
        credential.file = None;
        credential.env = Some("BOTTLE_DOCKER_TEST_UNSET_VARIABLE".into());
        let err = read_secret(&credential).unwrap_err();
        assert!(
            err.to_string()
                .contains("BOTTLE_DOCKER_TEST_UNSET_VARIABLE")
        );
    }

    #[test]
    fn only_a_whole_ready_line_counts() {
        let ready = bottle_core::bundle::BUNDLE_READY_LINE;
        let lines = format!("bottle-bundle: proxy on 0.0.0.0:8888\n{ready}\n");
        assert!(has_ready_line(lines.as_bytes()));
        assert!(has_ready_line(format!("{ready}\r\n").as_bytes()));
        // Not yet ended, inside another line, or only its start.
        assert!(!has_ready_line(ready.as_bytes()));
        assert!(!has_ready_line(format!("x {ready}\n").as_bytes()));
        assert!(!has_ready_line(format!("{ready} not\n").as_bytes()));
        assert!(!has_ready_line(b"bottle-bundle: error[BOT-B001]: ...\n"));
    }

    #[test]
    fn a_stream_that_ends_or_fails_before_the_line_is_not_ready() {
        use bollard::container::LogOutput;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let line = |text: &str| {
            Ok(LogOutput::StdErr {
                message: text.as_bytes().to_vec().into(),
            })
        };
        let ready = format!("{}\n", bottle_core::bundle::BUNDLE_READY_LINE);
        let within = Duration::from_secs(5);
        // The line split across two chunks is still seen.
        let (head, tail) = ready.split_at(7);
        let split: BundleOutput =
            Box::pin(futures_util::stream::iter(vec![line(head), line(tail)]));
        assert!(runtime.block_on(ready_line_seen(split, within)));
        let ended: BundleOutput = Box::pin(futures_util::stream::iter(vec![line("starting\n")]));
        assert!(!runtime.block_on(ready_line_seen(ended, within)));
        let failed: BundleOutput = Box::pin(futures_util::stream::iter(vec![
            Err(bollard::errors::Error::IOError {
                err: std::io::Error::other("gone"),
            }),
            line(&ready),
        ]));
        assert!(!runtime.block_on(ready_line_seen(failed, within)));
        let quiet: BundleOutput = Box::pin(futures_util::stream::pending());
        assert!(!runtime.block_on(ready_line_seen(quiet, Duration::from_millis(20))));
    }
}
