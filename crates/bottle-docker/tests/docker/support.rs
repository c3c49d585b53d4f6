//! Shared setup for the tests that drive the real Docker daemon: probing
//! (skip with a printed line, or fail under `BOTTLE_REQUIRE_DOCKER=1`), the
//! demo agent image, manifests, and guards that remove what a test made
//! even when it fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use bollard::query_parameters::{ListContainersOptionsBuilder, ListNetworksOptionsBuilder};
use bottle_core::{BottleBackend, BottleLauncher, BottleSpec};
use bottle_docker::{DockerBackend, DockerOptions};
use tempfile::TempDir;

/// The tests share one daemon and assert on global state ("no bot-bottle-
/// resources remain"), so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The demo image, built once per test process.
static DEMO_IMAGE: OnceLock<Result<String, String>> = OnceLock::new();

/// The demo agent image tag the tests build.
pub(crate) const DEMO_TAG: &str = "bottle-demo-agent:test";

/// Skips (prints why) or, when Docker is required, fails.
pub(crate) fn unavailable(test: &str, why: &str) -> Option<Fixture> {
    bottle_test_support::skip_docker_test(test, why);
    None
}

/// One test's world: the backend, its state root and manifest dir.
pub(crate) struct Fixture {
    pub backend: DockerBackend,
    pub state: TempDir,
    pub dir: TempDir,
    pub image: String,
    _serial: MutexGuard<'static, ()>,
}

/// The workspace's `examples/demo-agent`.
pub(crate) fn demo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent")
}

/// Sets up a test, or returns `None` after printing why it is skipped.
pub(crate) fn setup(test: &str) -> Option<Fixture> {
    setup_with(test, |_| {})
}

/// Like [`setup`], adjusting the backend options first.
pub(crate) fn setup_with(test: &str, adjust: impl FnOnce(&mut DockerOptions)) -> Option<Fixture> {
    let serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(bundle) = std::env::var_os("BOTTLE_BUNDLE_BIN").map(PathBuf::from) else {
        return unavailable(
            test,
            &format!(
                "BOTTLE_BUNDLE_BIN is not set (build the static bundle with `{}`)",
                bottle_docker::BUNDLE_BUILD_HINT
            ),
        );
    };
    if !bundle.is_file() {
        return unavailable(
            test,
            &format!("BOTTLE_BUNDLE_BIN={} is not a file", bundle.display()),
        );
    }
    let state = bottle_test_support::temp_state_root();
    let dir = tempfile::tempdir().unwrap();
    let mut options = DockerOptions::new(state.path());
    options.bundle_bin = Some(bundle);
    adjust(&mut options);
    let backend = DockerBackend::new(options).unwrap();
    if let Err(err) = backend.preflight() {
        return unavailable(test, &format!("the docker daemon is not reachable: {err}"));
    }
    let image = DEMO_IMAGE.get_or_init(|| {
        let busybox = Path::new("/bin/busybox");
        if !busybox.is_file() {
            return Err("/bin/busybox is missing (apt-get install busybox-static)".into());
        }
        backend
            .build_demo_agent(&demo_dir(), busybox, DEMO_TAG)
            .map(|_| DEMO_TAG.to_string())
            .map_err(|err| format!("could not build the demo image: {err}"))
    });
    let image = match image {
        Ok(image) => image.clone(),
        Err(why) => return unavailable(test, why),
    };
    Some(Fixture {
        backend,
        state,
        dir,
        image,
        _serial: serial,
    })
}

impl Fixture {
    /// Writes the test manifest (agent `demo`) and returns its path.
    pub(crate) fn manifest(&self) -> PathBuf {
        self.manifest_with("")
    }

    /// Like [`Fixture::manifest`], appending `extra` TOML (tables under
    /// `[agents.demo]`). The first call writes the file.
    pub(crate) fn manifest_with(&self, extra: &str) -> PathBuf {
        self.manifest_with_keys("", extra)
    }

    /// Like [`Fixture::manifest_with`], with `keys` (lines of keys of
    /// `[agents.demo]` itself, e.g. `isolation = "gvisor"`) too.
    pub(crate) fn manifest_with_keys(&self, keys: &str, extra: &str) -> PathBuf {
        let path = self.dir.path().join("bottle.toml");
        if !path.exists() {
            std::fs::write(self.dir.path().join("prompt.md"), "do the thing\n").unwrap();
            let skill = self.dir.path().join("skills/review");
            std::fs::create_dir_all(&skill).unwrap();
            std::fs::write(skill.join("SKILL.md"), "review carefully\n").unwrap();
            std::fs::write(
                &path,
                format!(
                    r#"
[agents.demo]
image = "{}"
command = ["/bin/sh"]
prompt = "prompt.md"
skills = ["skills/review"]
{keys}

[agents.demo.env]
BOTTLE_TEST = "yes"

[agents.demo.egress]
allow = ["demo.bottle.test"]

[agents.demo.limits]
memory = "256m"
pids = 128
cpus = 0.5
{extra}
"#,
                    self.image
                ),
            )
            .unwrap();
        }
        path
    }

    /// The spec of bottle `name` running agent `demo`.
    pub(crate) fn spec(&self, name: &str) -> BottleSpec {
        let path = self.manifest();
        let manifest = bottle_core::manifest::load(&path).unwrap();
        BottleSpec::new(&manifest, &path, "demo", Some(name), self.state.path()).unwrap()
    }

    /// Prepares and launches `name`, returning a guard that stops it.
    pub(crate) fn start(&self, name: &str) -> (Guard<'_>, Box<dyn bottle_core::Bottle>) {
        let spec = self.spec(name);
        let guard = Guard {
            backend: &self.backend,
            name: spec.name.clone(),
        };
        let plan = self.backend.prepare(&spec).unwrap();
        let bottle = self.backend.launch(&plan).unwrap();
        (guard, bottle)
    }
}

/// Stops a bottle when dropped, whatever happened in the test.
pub(crate) struct Guard<'a> {
    pub backend: &'a DockerBackend,
    pub name: String,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let _ = self.backend.stop(&self.name);
    }
}

/// A unique bottle name for this process and test.
pub(crate) fn name(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

/// Runs a shell command in the bottle.
pub(crate) fn sh(bottle: &dyn bottle_core::Bottle, script: &str) -> bottle_core::ExecOutput {
    bottle
        .exec(&["sh".to_string(), "-c".to_string(), script.to_string()])
        .unwrap()
}

/// Every container and network labelled with this bottle's slug.
pub(crate) fn resources_of(backend: &DockerBackend, name: &str) -> Vec<String> {
    let slug = bottle_core::slug::slugify(name).unwrap();
    let filter = HashMap::from([("label".to_string(), vec![format!("bottle.slug={slug}")])]);
    let mut found = Vec::new();
    let engine = backend.engine().unwrap();
    let containers = engine
        .block_on(
            engine.docker.list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filter)
                    .build(),
            )),
        )
        .unwrap();
    for c in containers {
        found.push(format!("container {:?}", c.names.unwrap_or_default()));
    }
    let networks = engine
        .block_on(
            engine.docker.list_networks(Some(
                ListNetworksOptionsBuilder::default()
                    .filters(&filter)
                    .build(),
            )),
        )
        .unwrap();
    for n in networks {
        found.push(format!("network {}", n.name.unwrap_or_default()));
    }
    found
}

/// Names of every container and network whose name starts `bot-bottle-`.
pub(crate) fn all_bottle_resources(backend: &DockerBackend) -> (Vec<String>, Vec<String>) {
    let engine = backend.engine().unwrap();
    let containers = engine
        .block_on(engine.docker.list_containers(Some(
            ListContainersOptionsBuilder::default().all(true).build(),
        )))
        .unwrap()
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .map(|n| n.trim_start_matches('/').to_string())
        .filter(|n| n.starts_with("bot-bottle-"))
        .collect();
    let networks = engine
        .block_on(engine.docker.list_networks(None))
        .unwrap()
        .into_iter()
        .filter_map(|n| n.name)
        .filter(|n| n.starts_with("bot-bottle-"))
        .collect();
    (containers, networks)
}

/// Inspects a container.
pub(crate) fn inspect(
    backend: &DockerBackend,
    container: &str,
) -> bollard::models::ContainerInspectResponse {
    let engine = backend.engine().unwrap();
    engine
        .block_on(engine.docker.inspect_container(container, None))
        .unwrap()
}

/// The IP of `container` on `network`.
pub(crate) fn ip_on(backend: &DockerBackend, container: &str, network: &str) -> String {
    inspect(backend, container)
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|mut n| n.remove(network))
        .and_then(|e| e.ip_address)
        .unwrap_or_else(|| panic!("{container} has no address on {network}"))
}

/// A file from a container through the archive API: contents, mode, uid.
pub(crate) fn download(
    backend: &DockerBackend,
    container: &str,
    path: &str,
) -> (Vec<u8>, u32, u64) {
    use futures_util::StreamExt;
    use std::io::Read;
    let engine = backend.engine().unwrap();
    let options = bollard::query_parameters::DownloadFromContainerOptionsBuilder::default()
        .path(path)
        .build();
    let archive = engine.block_on(async {
        let mut stream = engine
            .docker
            .download_from_container(container, Some(options));
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            archive.extend_from_slice(&chunk.unwrap());
        }
        archive
    });
    let mut tar = tar::Archive::new(&archive[..]);
    let mut entry = tar.entries().unwrap().next().unwrap().unwrap();
    let (mode, uid) = (
        entry.header().mode().unwrap(),
        entry.header().uid().unwrap(),
    );
    let mut contents = Vec::new();
    entry.read_to_end(&mut contents).unwrap();
    (contents, mode, uid)
}
