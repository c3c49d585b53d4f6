//! Shared test fixtures: the fake smolvm in a private data dir, a
//! docker-save archive built in the test, a recording bundle host, and a
//! raw HTTP client.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bottle_core::backend::{BackendError, CleanupReport};
use bottle_core::bundle_host::{BundleEndpoint, BundleHost, PreparedBundle};
use bottle_core::exec::SystemRunner;
use bottle_core::images::{AgentImage, ImageStore};
use bottle_core::plan::Plan;
use bottle_smolvm::Smolvm;
use sha2::{Digest as _, Sha256};

/// The fake smolvm binary (built on first use; see
/// [`fake_smolvm::executable`]).
pub(crate) fn fake() -> PathBuf {
    fake_smolvm::executable().unwrap_or_else(|err| panic!("{err}"))
}

/// A private world for one test: a temp dir holding the fake's data, the
/// bottle state root and the image cache.
pub(crate) struct World {
    pub dir: tempfile::TempDir,
}

impl World {
    pub(crate) fn new() -> World {
        World {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub(crate) fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Where smolvm keeps its database in this world.
    pub(crate) fn db(&self) -> PathBuf {
        self.data().join("smolvm/server/smolvm.db")
    }

    pub(crate) fn fake_dir(&self) -> PathBuf {
        self.data().join("smolvm/fake")
    }

    pub(crate) fn guest(&self, machine: &str) -> PathBuf {
        self.fake_dir().join("guests").join(machine)
    }

    pub(crate) fn state_root(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub(crate) fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// The fake, pretending to be `version`, with `mode` faults.
    pub(crate) fn smolvm(&self, version: &str, mode: &str) -> Smolvm {
        Smolvm::with_program(fake(), Arc::new(SystemRunner))
            .env("HOME", self.home())
            .env("XDG_DATA_HOME", self.data())
            .env("SMOLVM_DATA_DIR", "")
            .env("FAKE_SMOLVM_VERSION", version)
            .env("FAKE_SMOLVM_MODE", mode)
    }

    /// What the fake's `machine start` booted `machine` with.
    pub(crate) fn booted(&self, machine: &str) -> Option<serde_json::Value> {
        let path = self
            .fake_dir()
            .join("started")
            .join(format!("{machine}.json"));
        std::fs::read(path)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }
}

/// Whether the fake can confine guest commands on this host (it needs user
/// and mount namespaces). Tests that exec print a skip line without it.
pub(crate) fn sandbox_available(world: &World) -> bool {
    let smolvm = world.smolvm("1.9.3", "");
    let artifact = world.dir.path().join("probe.smolmachine");
    std::fs::write(
        &artifact,
        r#"{"format":"fake-smolmachine/1","image":"probe"}"#,
    )
    .unwrap();
    smolvm
        .create("bot-bottle-probe", &artifact, &[], None)
        .unwrap();
    smolvm.start("bot-bottle-probe").unwrap();
    let ok = match smolvm.exec("bot-bottle-probe", &["true".into()], &[]) {
        Ok(out) => out.exit_code == 0,
        Err(err) => {
            bottle_test_support::skip_docker_test(
                "this smolvm test",
                format!("fake-smolvm cannot sandbox guest commands here: {}", err),
            );
            false
        }
    };
    smolvm.delete("bot-bottle-probe").unwrap();
    ok
}

/// A layer tar holding one file.
pub(crate) fn layer(path: &str, contents: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(contents.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, path, contents).unwrap();
    builder.into_inner().unwrap()
}

pub(crate) fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A docker-save archive in the classic layout (`<id>/layer.tar`,
/// `<config hex>.json`, `manifest.json`), written to `dest`. Returns the
/// config digest (the image ID) and the layer digests.
pub(crate) struct SavedImage {
    pub id: String,
    pub layers: Vec<String>,
    pub config: Vec<u8>,
}

pub(crate) fn docker_save(
    dest: &Path,
    layers: &[Vec<u8>],
    symlink_last_to_first: bool,
) -> SavedImage {
    let diff_ids: Vec<String> = layers.iter().map(|l| digest(l)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Entrypoint": ["/bin/agent"], "Cmd": ["--serve"] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .unwrap();
    let id = digest(&config);
    let hex = id.trim_start_matches("sha256:").to_string();
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, path, data).unwrap();
    };
    let mut layer_paths = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let dir = format!("{:064x}", i + 1);
        let path = format!("{dir}/layer.tar");
        if symlink_last_to_first && i == layers.len() - 1 && i > 0 {
            layer_paths.push(path.clone());
            continue;
        }
        add(&path, layer);
        layer_paths.push(path);
    }
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{hex}.json"),
        "RepoTags": ["agent:test"],
        "Layers": layer_paths,
    }]))
    .unwrap();
    add(&format!("{hex}.json"), &config);
    add("manifest.json", &manifest);
    let mut bytes = builder.into_inner().unwrap();
    if symlink_last_to_first && layers.len() > 1 {
        // Docker writes a repeated layer as a symlink to the first copy.
        let mut builder = tar::Builder::new(Vec::new());
        let mut archive = tar::Archive::new(bytes.as_slice());
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut header = entry.header().clone();
            let path = entry.path().unwrap().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            builder
                .append_data(&mut header, path, data.as_slice())
                .unwrap();
        }
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        let last = layer_paths.last().unwrap().clone();
        builder
            .append_link(&mut header, last, format!("../{}", layer_paths[0]))
            .unwrap();
        bytes = builder.into_inner().unwrap();
    }
    std::fs::write(dest, bytes).unwrap();
    SavedImage {
        id,
        layers: diff_ids,
        config,
    }
}

/// One raw HTTP/1.1 exchange (`Connection: close`).
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) fn http(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body,
    }
}

/// What [`RecordingBundles`] "resolves" at prepare: a typed stand-in for a
/// real host's data, to prove it travels through the plan to `start`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RecordedBundle {
    pub network: String,
}

/// The address a [`RecordingBundles`] plans a bundle at, and its plan
/// lines.
pub(crate) type PlannedBundle = (Ipv4Addr, Vec<(String, String)>);

/// A bundle host that starts nothing: it hands out a fixed address and a CA
/// file, and records what it was asked.
pub(crate) struct RecordingBundles {
    pub address: Ipv4Addr,
    pub ca: PathBuf,
    pub calls: Mutex<Vec<String>>,
    pub live: Mutex<Vec<String>>,
    /// What `prepare` says (default: where `start` puts it, no lines).
    pub planned: Mutex<Option<PlannedBundle>>,
    /// What `start` was handed back from the plan.
    pub started_with: Mutex<Option<RecordedBundle>>,
    /// Interrupted by `start`, as an operator's ^C during it would.
    pub interrupt_on_start: Mutex<Option<bottle_core::undo::Interrupt>>,
    /// The bottles whose bundle stands for one started again (its
    /// `standing` changes).
    pub restarted: Mutex<Vec<String>>,
    /// Why the bundles' health checks fail (`None`: they answer).
    pub unhealthy: Mutex<Option<String>>,
    /// What the bundles are made from, for the pool's fingerprint.
    pub made_from: Mutex<String>,
}

impl RecordingBundles {
    pub(crate) fn new(world: &World, address: Ipv4Addr) -> Arc<RecordingBundles> {
        let ca = world.dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        Arc::new(RecordingBundles {
            address,
            ca,
            calls: Mutex::new(Vec::new()),
            live: Mutex::new(Vec::new()),
            planned: Mutex::new(None),
            started_with: Mutex::new(None),
            interrupt_on_start: Mutex::new(None),
            restarted: Mutex::new(Vec::new()),
            unhealthy: Mutex::new(None),
            made_from: Mutex::new("bundle v1".into()),
        })
    }

    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    pub(crate) fn live(&self) -> Vec<String> {
        self.live.lock().unwrap().clone()
    }
}

impl BundleHost for RecordingBundles {
    type Prepared = RecordedBundle;

    fn prepare(
        &self,
        spec: &bottle_core::spec::BottleSpec,
    ) -> Result<PreparedBundle<RecordedBundle>, BackendError> {
        let (address, lines) = self
            .planned
            .lock()
            .unwrap()
            .clone()
            .unwrap_or((self.address, Vec::new()));
        Ok(PreparedBundle {
            address,
            lines,
            data: RecordedBundle {
                network: spec.name.clone(),
            },
        })
    }

    fn start<D>(
        &self,
        plan: &Plan<D>,
        prepared: &RecordedBundle,
    ) -> Result<BundleEndpoint, BackendError> {
        *self.started_with.lock().unwrap() = Some(prepared.clone());
        if let Some(interrupt) = &*self.interrupt_on_start.lock().unwrap() {
            interrupt.request();
        }
        self.calls
            .lock()
            .unwrap()
            .push(format!("start {}", plan.bottle));
        self.live.lock().unwrap().push(plan.bottle.clone());
        Ok(BundleEndpoint {
            address: self.address,
            ca_cert: self.ca.clone(),
        })
    }

    fn stop(&self, bottle: &str) -> Result<CleanupReport, BackendError> {
        self.calls.lock().unwrap().push(format!("stop {bottle}"));
        let mut live = self.live.lock().unwrap();
        let mut report = CleanupReport::default();
        if let Some(i) = live.iter().position(|b| b == bottle) {
            live.remove(i);
            report.removed.push(format!("bundle {bottle}"));
            // As the real host does with the bundle's audit log.
            report.kept.push(format!("audit log of {bottle}"));
        }
        Ok(report)
    }

    fn bottles(&self) -> Result<Vec<String>, BackendError> {
        Ok(self.live())
    }

    fn standing(
        &self,
        bottle: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, BackendError> {
        Ok(std::collections::BTreeMap::from([
            (
                "running".to_string(),
                self.live().iter().any(|b| b == bottle).to_string(),
            ),
            (
                "restarted".to_string(),
                self.restarted
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|b| b == bottle)
                    .to_string(),
            ),
        ]))
    }

    fn answers(&self, bottle: &str, _: &RecordedBundle) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!("health {bottle}"));
        match &*self.unhealthy.lock().unwrap() {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    fn fingerprint(
        &self,
        _: &bottle_core::spec::BottleSpec,
        fingerprint: &mut bottle_core::pool::Fingerprint,
    ) -> Result<(), BackendError> {
        fingerprint.field("bundle", self.made_from.lock().unwrap().as_bytes());
        Ok(())
    }
}

/// Agent images from a test-made docker-save archive; the backend packs
/// them for real through the local registry and the fake's `pack create`.
pub(crate) struct ArchiveImages {
    pub archive: PathBuf,
    pub image: AgentImage,
}

impl ArchiveImages {
    pub(crate) fn new(world: &World) -> Arc<ArchiveImages> {
        let archive = world.dir.path().join("image.tar");
        let saved = docker_save(
            &archive,
            &[layer("bin/agent", b"#!/bin/sh\necho agent\n")],
            false,
        );
        Arc::new(ArchiveImages {
            archive,
            image: AgentImage {
                reference: "agent:test".into(),
                id: saved.id,
                entrypoint: vec!["/bin/agent".into()],
                cmd: vec!["--serve".into()],
            },
        })
    }
}

impl ImageStore for ArchiveImages {
    fn inspect(&self, reference: &str) -> Result<AgentImage, BackendError> {
        assert_eq!(reference, self.image.reference);
        Ok(self.image.clone())
    }

    fn export(&self, id: &str, dest: &Path) -> Result<(), BackendError> {
        assert_eq!(id, self.image.id);
        std::fs::copy(&self.archive, dest).unwrap();
        Ok(())
    }
}

/// Docker, when it answers; absent is a skip unless BOTTLE_REQUIRE_DOCKER=1.
pub(crate) fn docker_available(test: &str) -> Option<bollard::Docker> {
    let answering = bollard::Docker::connect_with_defaults().and_then(|docker| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(docker.ping())
            .map(|_| docker)
    });
    bottle_test_support::require_docker(
        test,
        answering.map_err(|err| format!("Docker is not reachable: {err}")),
    )
}
