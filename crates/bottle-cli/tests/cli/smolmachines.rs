//! The smolmachines backend through the real `bottle` binary, with the
//! `fake-smolvm` test double standing in for `smolvm` (its state in a real
//! SQLite database of smolvm's schema under a temp `SMOLVM_DATA_DIR`) and
//! the real Docker daemon running the bundle.
//!
//! The double boots nothing, so these runs set `BOTTLE_SMOLVM` to it and
//! `BOTTLE_TEST_FAKE_SMOLVM_NO_KVM=1`, the only way to skip the KVM check
//! (honoured for the double alone, and announced on stderr).
//!
//! The double is built on first use with `cargo build -p fake-smolvm`
//! into this build's target dir (a binary of another package is not built
//! for these tests otherwise); set `BOTTLE_FAKE_SMOLVM` to a built one to
//! skip that. Tests needing Docker
//! print a skip line unless `BOTTLE_REQUIRE_DOCKER=1`; they also need
//! `BOTTLE_BUNDLE_BIN` (the static bundle from `cargo xtask dist`).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::MutexGuard;
use std::time::Duration;

use bottle_core::exec::SystemRunner;
use bottle_docker::client::Engine;
use bottle_smolvm::SmolvmError;
use predicates::prelude::*;
use serde_json::Value;

use crate::{bottle, repo_root};

/// The test double, built once per test process.
pub(crate) fn fake_smolvm() -> PathBuf {
    let path = fake_smolvm::executable().unwrap_or_else(|err| panic!("{err}"));
    assert!(path.is_file(), "{} is not a file", path.display());
    path
}

/// One test's world: temp state, cache, home and smolvm data dirs, and a
/// manifest whose agent image is `image`.
struct World {
    dir: tempfile::TempDir,
    fake: PathBuf,
    prefix: String,
}

impl World {
    fn new(image: &str, prefix: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["state", "cache", "home", "smolvm", "project"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("project/prompt.md"), "do the thing\n").unwrap();
        std::fs::write(
            dir.path().join("project/bottle.toml"),
            format!(
                "[agents.coder]\nimage = \"{image}\"\nprompt = \"prompt.md\"\n\n[agents.coder.egress]\nallow = [\"api.example.com\"]\n"
            ),
        )
        .unwrap();
        World {
            dir,
            fake: fake_smolvm(),
            prefix: prefix.to_string(),
        }
    }

    /// A bottle name no other test run uses.
    fn name(&self) -> String {
        format!("{}-{}", self.prefix, std::process::id())
    }

    fn machine(&self) -> String {
        bottle_core::slug::bottle_name(&self.name())
    }

    /// `bottle` against the double pretending to be `version`, with `mode`
    /// faults.
    fn bottle(&self, version: &str, mode: &str) -> assert_cmd::Command {
        let root = self.dir.path();
        let mut cmd = bottle(&root.join("state"));
        cmd.envs(self.double_env(version, mode))
            .env_remove("XDG_DATA_HOME")
            .arg("--manifest")
            .arg(root.join("project/bottle.toml"));
        cmd
    }

    /// The environment that points `bottle` at the double.
    fn double_env(&self, version: &str, mode: &str) -> Vec<(&'static str, std::ffi::OsString)> {
        let root = self.dir.path();
        vec![
            ("HOME", root.join("home").into()),
            ("XDG_CACHE_HOME", root.join("cache").into()),
            ("SMOLVM_DATA_DIR", root.join("smolvm").into()),
            ("BOTTLE_SMOLVM", self.fake.clone().into()),
            ("BOTTLE_TEST_FAKE_SMOLVM_NO_KVM", "1".into()),
            ("FAKE_SMOLVM_VERSION", version.into()),
            ("FAKE_SMOLVM_MODE", mode.into()),
        ]
    }

    /// Where the double keeps smolvm's state database.
    fn db(&self) -> PathBuf {
        self.dir
            .path()
            .join("smolvm/.local/share/smolvm/server/smolvm.db")
    }

    /// What the double's `machine start` booted the machine with.
    fn booted(&self) -> Option<Value> {
        let path = self
            .dir
            .path()
            .join("smolvm/.local/share/smolvm/fake/started")
            .join(format!("{}.json", self.machine()));
        std::fs::read(path)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn guest(&self) -> PathBuf {
        self.dir
            .path()
            .join("smolvm/.local/share/smolvm/fake/guests")
            .join(self.machine())
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state/bottle").join(self.name())
    }

    /// Whether smolvm's database holds a record of the machine.
    fn has_record(&self) -> bool {
        match bottle_smolvm::statedb::read(&self.db(), &self.machine()) {
            Ok(_) => true,
            Err(SmolvmError::StateRowMissing { .. } | SmolvmError::StateDbMissing { .. }) => false,
            Err(err) => panic!("{err}"),
        }
    }
}

/// Docker, the bundle binary and the agent image (the bundle image doubles
/// as one: the double runs guest commands on the host, so its contents do
/// not matter), or a printed skip.
struct Docker {
    engine: Engine,
    image: String,
    _serial: MutexGuard<'static, ()>,
}

fn docker(test: &str) -> Option<Docker> {
    let serial = crate::one_launch_at_a_time();
    let skip = |why: String| {
        bottle_test_support::skip_docker_test(test, why);
        None
    };
    let Some(bundle) = std::env::var_os("BOTTLE_BUNDLE_BIN").map(PathBuf::from) else {
        return skip(format!(
            "BOTTLE_BUNDLE_BIN is not set (build the static bundle with `{}`)",
            bottle_docker::BUNDLE_BUILD_HINT
        ));
    };
    let engine = match Engine::connect(None) {
        Ok(engine) => engine,
        Err(err) => return skip(format!("Docker is not reachable: {}", err)),
    };
    if let Err(err) = engine.block_on(engine.docker.ping()) {
        return skip(format!("Docker is not reachable: {err}"));
    }
    let image = bottle_docker::images::ensure_bundle_image(&engine, &bundle, &[], None)
        .unwrap_or_else(|err| panic!("{test}: the bundle image: {}", err));
    Some(Docker {
        engine,
        image,
        _serial: serial,
    })
}

/// Whether the double can confine guest commands here (user and mount
/// namespaces); provisioning needs it.
fn sandbox_available(world: &World, test: &str) -> bool {
    sandbox_available_in(world.dir.path(), &world.fake, test)
}

/// Whether the double `fake` can confine guest commands here, probed with
/// a machine of its own under `dir`; prints a skip line when it cannot.
pub(crate) fn sandbox_available_in(
    dir: &std::path::Path,
    fake: &std::path::Path,
    test: &str,
) -> bool {
    let data = dir.join("probe");
    let smolvm = bottle_smolvm::Smolvm::with_program(fake, std::sync::Arc::new(SystemRunner))
        .env("SMOLVM_DATA_DIR", &data)
        .env("FAKE_SMOLVM_VERSION", "1.9.3");
    let artifact = dir.join("probe.smolmachine");
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
                test,
                format!("fake-smolvm cannot sandbox guest commands here: {}", err),
            );
            false
        }
    };
    smolvm.delete("bot-bottle-probe").unwrap();
    std::fs::remove_dir_all(&data).unwrap();
    ok
}

fn container_exists(engine: &Engine, name: &str) -> bool {
    match engine.block_on(engine.docker.inspect_container(name, None)) {
        Ok(_) => true,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => false,
        Err(err) => panic!("inspect container {name}: {err}"),
    }
}

fn network(engine: &Engine, name: &str) -> Option<bollard::models::NetworkInspect> {
    match engine.block_on(engine.docker.inspect_network(name, None)) {
        Ok(inspect) => Some(inspect),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => None,
        Err(err) => panic!("inspect network {name}: {err}"),
    }
}

/// Nothing a launch of `world`'s bottle creates remains: no machine record,
/// no bundle container or network, no state dir.
fn assert_nothing_left(world: &World, engine: &Engine) {
    let machine = world.machine();
    assert!(!world.has_record(), "machine {machine} left in smolvm's db");
    assert!(!container_exists(engine, &format!("{machine}-bundle")));
    assert!(
        network(engine, &machine).is_none(),
        "network {machine} left"
    );
    assert!(
        !world.state_dir().exists(),
        "state dir left: {:?}",
        std::fs::read_dir(world.state_dir())
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}

/// Waits (bounded) for a stop's background finisher to remove the
/// machine, the bundle, its network and the state dir.
fn wait_for_the_finisher(world: &World, engine: &Engine) {
    let machine = world.machine();
    let log = world.state_dir().join("stopping.log");
    let finished = bottle_test_support::eventually(Duration::from_secs(60), || {
        !world.has_record()
            && !container_exists(engine, &format!("{machine}-bundle"))
            && network(engine, &machine).is_none()
            && !world.state_dir().exists()
    });
    assert!(
        finished,
        "the stop's finisher did not finish in 60 s; its log: {:?}",
        std::fs::read_to_string(&log)
    );
}

fn list(world: &World, backend: &str) -> Vec<Value> {
    let out = world
        .bottle("1.9.3", "")
        .env("BOT_BOTTLE_BACKEND", backend)
        .args(["--json", "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

#[test]
fn a_launch_whose_allowlist_takes_runs_is_listed_and_stops_clean() {
    let test = "a_launch_whose_allowlist_takes_runs_is_listed_and_stops_clean";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "smol-ok");
    if !sandbox_available(&world, test) {
        return;
    }
    let machine = world.machine();
    let start = world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .args(["--name", &world.name(), "--detach"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(start.status.success(), "start failed: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&start.stdout),
        format!("{machine}\n")
    );
    assert!(stderr.contains("the KVM check is skipped"), "{stderr}");
    assert!(
        stderr.contains("/32 only"),
        "the plan shows the allowlist: {stderr}"
    );

    // Listed (BOT_BOTTLE_BACKEND picks the backend) with its bundle address.
    let listed = list(&world, "smolmachines");
    let entry = listed
        .iter()
        .find(|b| b["name"] == machine.as_str())
        .unwrap_or_else(|| panic!("{machine} not listed: {listed:?}"));
    assert_eq!(entry["backend"], "smolmachines");
    assert_eq!(entry["agent"], "coder");
    assert_eq!(entry["state"], "running");
    let address: Ipv4Addr = entry["bundle_address"].as_str().unwrap().parse().unwrap();
    let [a, b, _, d] = address.octets();
    assert_eq!((a, b, d), (192, 168, 2), "{address}");

    // smolvm's record, read back from its database, allows that /32 only,
    // and the machine booted with it.
    let cidr = format!("{address}/32");
    let record = bottle_smolvm::statedb::read(&world.db(), &machine).unwrap();
    assert_eq!(record["allowed_cidrs"], serde_json::json!([cidr]));
    assert_eq!(record["dns_filter_hosts"], serde_json::json!([]));
    assert_eq!(
        world.booted().unwrap()["allowed_cidrs"],
        serde_json::json!([cidr])
    );

    // The bundle runs at that address on an internal bridge whose host side
    // has an address, and the host reaches the proxy there (smolvm dials it
    // from the host).
    let engine = &docker.engine;
    let bundle = engine
        .block_on(
            engine
                .docker
                .inspect_container(&format!("{machine}-bundle"), None),
        )
        .unwrap();
    assert_eq!(bundle.state.unwrap().running, Some(true));
    let labels = bundle.config.unwrap().labels.unwrap();
    assert_eq!(labels["bottle.managed"], "smolmachines");
    let net = network(engine, &machine).expect("the bottle network exists");
    assert_eq!(net.internal, Some(true));
    assert!(
        !net.options
            .unwrap_or_default()
            .contains_key("com.docker.network.bridge.inhibit_ipv4"),
        "the host needs its gateway address on the bridge"
    );
    TcpStream::connect_timeout(
        &SocketAddr::from((address, bottle_core::bundle::PROXY_PORT)),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|err| panic!("the host cannot reach the bundle at {address}: {err}"));

    // The guest trusts the bundle's CA and got the prompt.
    let ca = std::fs::read_to_string(world.state_dir().join("ca/ca.pem")).unwrap();
    assert_eq!(
        std::fs::read_to_string(world.guest().join("etc/bottle/ca.pem")).unwrap(),
        ca
    );
    assert_eq!(
        std::fs::read_to_string(world.guest().join("etc/bottle/prompt.md")).unwrap(),
        "do the thing\n"
    );

    // The docker backend neither lists nor owns the microVM's bundle.
    assert!(
        !list(&world, "docker")
            .iter()
            .any(|b| b["name"] == machine.as_str()),
        "the docker backend lists a microVM's bundle"
    );

    world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "stop", "--wait", &world.name()])
        .assert()
        .success()
        .stdout(format!("stopped {machine}\n"))
        .stderr(predicate::str::contains(format!("removed vm {machine}")))
        .stderr(predicate::str::contains(format!(
            "removed container {machine}-bundle"
        )))
        .stderr(predicate::str::contains(format!(
            "removed network {machine}"
        )));
    assert_nothing_left(&world, engine);
    assert!(list(&world, "smolmachines").is_empty());
}

#[test]
fn a_patch_that_does_not_take_is_refused_and_leaves_nothing() {
    let test = "a_patch_that_does_not_take_is_refused_and_leaves_nothing";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "smol-refused");
    // 1.7.7 drops --allow-cidr with --from, so the state-DB patch is what
    // would put the /32 there; the double's trigger undoes every write.
    world
        .bottle("1.7.7", "revert-db-writes")
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .args(["--name", &world.name(), "--detach"])
        .assert()
        .code(5)
        .stdout("")
        .stderr(predicate::str::contains("error[BOT-K015]"))
        .stderr(predicate::str::contains("did not persist"))
        .stderr(predicate::str::contains("fix: "));
    assert!(world.booted().is_none(), "the machine must never start");
    assert_nothing_left(&world, &docker.engine);
}

#[test]
fn a_smolvm_that_does_not_enforce_allowlists_is_a_preflight_failure() {
    let world = World::new("unused:latest", "smol-old");
    world
        .bottle("1.1.2", "")
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .args(["--name", &world.name(), "--detach"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("error[BOT-K004]"))
        .stderr(predicate::str::contains(
            "smolvm 1.1.2 does not enforce an egress allowlist",
        ))
        .stderr(predicate::str::contains(
            "fix: upgrade smolvm to 1.1.3 or later",
        ));
    assert!(!world.state_dir().exists());
    assert!(
        !world.db().exists(),
        "nothing was asked of smolvm but its version"
    );
}

#[test]
fn a_missing_smolvm_is_a_preflight_failure_and_the_kvm_switch_is_for_the_double_only() {
    let world = World::new("unused:latest", "smol-missing");
    let missing = world.dir.path().join("no/smolvm");
    // Whichever check fails first on this host (KVM, then smolvm), it is a
    // preflight failure with a fix, and the test switch does not apply to
    // a program that is not the double.
    world
        .bottle("1.9.3", "")
        .env("BOTTLE_SMOLVM", &missing)
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains(
            "BOTTLE_TEST_FAKE_SMOLVM_NO_KVM is ignored",
        ))
        .stderr(predicate::str::contains("fix: "))
        .stderr(predicate::str::contains("smolvm").or(predicate::str::contains("kvm")));
    assert!(!world.state_dir().exists());
}

#[test]
fn the_kvm_check_runs_without_the_test_switch() {
    // On a host without usable KVM this is the preflight failure with its
    // remediation; where KVM works, the double passes it and says nothing
    // about skipping.
    let world = World::new("unused:latest", "smol-kvm");
    let host = bottle_preflight::require_microvm_host(&bottle_preflight::Context::from_host(
        &SystemRunner,
        bottle_core::BackendKind::Smolmachines,
    ));
    let assert = world
        .bottle("1.1.2", "")
        .env_remove("BOTTLE_TEST_FAKE_SMOLVM_NO_KVM")
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("KVM check is skipped").not());
    match host {
        Ok(()) => assert.stderr(predicate::str::contains("error[BOT-K004]")),
        Err(_) => assert.stderr(predicate::str::contains("error[BOT-P004]")),
    };
}

/// The agent's environment as `env` prints it inside bottle `name`, with
/// the bottle's own bundle address replaced by `<bundle>`: what the agent
/// sees, independent of which subnet the launch chose.
fn agent_environment(world: &World, backend: &str, name: &str) -> Vec<String> {
    let listed = list(world, backend);
    let bottle = bottle_core::slug::bottle_name(name);
    let address = listed
        .iter()
        .find(|b| b["name"] == bottle.as_str())
        .and_then(|b| b["bundle_address"].as_str())
        .unwrap_or_else(|| panic!("{bottle} is not listed with an address: {listed:?}"))
        .to_string();
    let out = world
        .bottle("1.9.3", "")
        .args(["--backend", backend, "exec", name, "--", "env"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "env in {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut env: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| {
            let name = line.split('=').next().unwrap_or_default();
            bottle_core::agent::reserved(name).is_some()
        })
        // NO_PROXY also names the box's own hostname and address, which
        // only the docker backend knows: compare its loopback-and-bundle
        // part alone.
        .map(|line| match line.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("NO_PROXY") => format!(
                "{key}={}",
                value
                    .split(',')
                    .filter(|host| {
                        host.starts_with("localhost")
                            || host.starts_with("127.")
                            || host.contains("::1")
                            || *host == address
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => line.to_string(),
        })
        .map(|line| line.replace(&address, "<bundle>"))
        .collect();
    env.sort();
    env
}

/// The busybox demo agent built as `bottle-demo-agent:<tag>`: a real
/// image for the docker side (the double runs guest commands on the host).
fn demo_agent_image(test: &str, tag: &str) -> String {
    let state = tempfile::tempdir().unwrap();
    let builder =
        bottle_docker::DockerBackend::new(bottle_docker::DockerOptions::new(state.path())).unwrap();
    let image = format!("bottle-demo-agent:{tag}");
    builder
        .build_demo_agent(
            &repo_root().join("examples/demo-agent"),
            std::path::Path::new("/bin/busybox"),
            &image,
        )
        .unwrap_or_else(|err| panic!("{test}: the demo agent image: {err}"));
    image
}

#[test]
fn both_backends_give_the_agent_the_same_environment() {
    let test = "both_backends_give_the_agent_the_same_environment";
    let Some(_docker) = docker(test) else { return };
    let world = World::new(&demo_agent_image(test, "cli-env"), "env-both");
    if !sandbox_available(&world, test) {
        return;
    }
    let vm = format!("{}-vm", world.name());
    let container = format!("{}-ct", world.name());
    for (backend, name) in [("smolmachines", &vm), ("docker", &container)] {
        let start = world
            .bottle("1.9.3", "")
            .args(["--backend", backend, "--yes", "start", "coder"])
            .args(["--name", name, "--detach"])
            .output()
            .unwrap();
        assert!(
            start.status.success(),
            "start on {backend}: {}",
            String::from_utf8_lossy(&start.stderr)
        );
    }
    let on_vm = agent_environment(&world, "smolmachines", &vm);
    let in_container = agent_environment(&world, "docker", &container);
    for (backend, name) in [("smolmachines", &vm), ("docker", &container)] {
        world
            .bottle("1.9.3", "")
            .args(["--backend", backend, "stop", "--wait", name])
            .assert()
            .success();
    }
    // Every variable bottle_core::agent_env sets for this agent (a prompt,
    // no repositories), which docs/MANIFEST.md lists (bottle-core's tests
    // hold the two equal), read from inside the box; ALL_PROXY among them.
    let expected: Vec<String> =
        bottle_core::agent::agent_env(&bottle_core::agent::AgentEnvInputs {
            manifest_env: &std::collections::BTreeMap::new(),
            bundle_address: Ipv4Addr::new(192, 168, 7, 2),
            own: &bottle_core::agent::OwnAddresses::default(),
            git: &[],
            prompt: true,
            host_services: false,
        })
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let mut names: Vec<&str> = on_vm
        .iter()
        .map(|v| v.split('=').next().unwrap_or_default())
        .collect();
    names.sort_unstable();
    assert_eq!(names, expected, "{on_vm:?}");
    for variable in ["HTTPS_PROXY", "ALL_PROXY", "all_proxy"] {
        let proxy = format!("{variable}=http://<bundle>:8888");
        assert!(on_vm.contains(&proxy), "{proxy} on the vm: {on_vm:?}");
    }
    assert_eq!(on_vm, in_container);
}

#[test]
fn a_declined_start_leaves_nothing_on_either_backend() {
    let test = "a_declined_start_leaves_nothing_on_either_backend";
    let Some(docker) = docker(test) else { return };
    if !std::path::Path::new("/usr/bin/script").is_file() {
        bottle_test_support::skip_docker_test(
            test,
            "util-linux `script` (a terminal to answer y/N on) is missing",
        );
        return;
    }
    let world = World::new(&docker.image, "declined");
    let bottle_bin = assert_cmd::cargo::cargo_bin("bottle");
    for backend in ["smolmachines", "docker"] {
        // `start` asks y/N only on a terminal: `script` gives it one, and
        // the answer is "n".
        let line = format!(
            "{} --backend {backend} --manifest {} start coder --name {}",
            bottle_bin.display(),
            world.dir.path().join("project/bottle.toml").display(),
            world.name()
        );
        let root = world.dir.path();
        let out = assert_cmd::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("XDG_STATE_HOME", root.join("state"))
            .env("HOME", root.join("home"))
            .env("XDG_CACHE_HOME", root.join("cache"))
            .env("SMOLVM_DATA_DIR", root.join("smolvm"))
            .env("BOTTLE_SMOLVM", &world.fake)
            .env("BOTTLE_TEST_FAKE_SMOLVM_NO_KVM", "1")
            .env("FAKE_SMOLVM_VERSION", "1.9.3")
            .env_remove("BOT_BOTTLE_BACKEND")
            .write_stdin("n\n")
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(7), "{backend}: {text}");
        assert!(text.contains("start this bottle?"), "{backend}: {text}");
        assert!(text.contains("not started"), "{backend}: {text}");
        assert_nothing_left(&world, &docker.engine);
        assert!(
            !container_exists(&docker.engine, &format!("{}-agent", world.machine())),
            "{backend}: an agent container was left"
        );
        assert!(
            !root.join("state/bottle").join(world.name()).exists(),
            "{backend}: the state dir (and a CA key) was left"
        );
    }
}

/// `bottle exec NAME -- argv` without `-t`, fed `input` on stdin.
fn exec_with_stdin(
    world: &World,
    backend: &str,
    name: &str,
    argv: &[&str],
    input: &[u8],
) -> std::process::Output {
    world
        .bottle("1.9.3", "")
        .args(["--backend", backend, "exec", name, "--"])
        .args(argv)
        .write_stdin(input.to_vec())
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap()
}

#[test]
fn exec_passes_stdin_through_to_eof_on_both_backends() {
    let test = "exec_passes_stdin_through_to_eof_on_both_backends";
    let Some(_docker) = docker(test) else { return };
    let world = World::new(&demo_agent_image(test, "cli-stdin"), "stdin");
    if !sandbox_available(&world, test) {
        return;
    }
    // Every byte value, and more than any pipe or channel buffer holds, so
    // the input must stream while the output drains.
    let binary: Vec<u8> = (0..4 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let vm = format!("{}-vm", world.name());
    let container = format!("{}-ct", world.name());
    let mut failures = Vec::new();
    for (backend, name) in [("smolmachines", &vm), ("docker", &container)] {
        let start = world
            .bottle("1.9.3", "")
            .args(["--backend", backend, "--yes", "start", "coder"])
            .args(["--name", name, "--detach"])
            .output()
            .unwrap();
        if !start.status.success() {
            failures.push(format!(
                "start on {backend}: {}",
                String::from_utf8_lossy(&start.stderr)
            ));
            continue;
        }
        let hi = exec_with_stdin(&world, backend, name, &["cat"], b"hi\n");
        if hi.stdout != b"hi\n" || !hi.status.success() {
            failures.push(format!("{backend}: `echo hi | exec cat` gave {hi:?}"));
        }
        let copied = exec_with_stdin(&world, backend, name, &["cat"], &binary);
        if copied.stdout != binary {
            failures.push(format!(
                "{backend}: {} bytes through cat came back as {} bytes (equal: false)",
                binary.len(),
                copied.stdout.len()
            ));
        }
        let counted = exec_with_stdin(
            &world,
            backend,
            name,
            &["sh", "-c", "wc -c; echo end >&2; exit 3"],
            &binary,
        );
        let stdout = String::from_utf8_lossy(&counted.stdout);
        if stdout.trim() != binary.len().to_string()
            || !String::from_utf8_lossy(&counted.stderr).contains("end")
            || counted.status.code() != Some(3)
        {
            failures.push(format!(
                "{backend}: `wc -c` saw {stdout:?} (want {}), status {:?}, stderr {:?}",
                binary.len(),
                counted.status,
                String::from_utf8_lossy(&counted.stderr)
            ));
        }
    }
    for (backend, name) in [("smolmachines", &vm), ("docker", &container)] {
        let _ = world
            .bottle("1.9.3", "")
            .args(["--backend", backend, "stop", "--wait", name])
            .output();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn what_the_ca_install_could_not_do_reaches_stderr_with_detach_escaped() {
    let test = "what_the_ca_install_could_not_do_reaches_stderr_with_detach_escaped";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "smol-ca");
    if !sandbox_available(&world, test) {
        return;
    }
    // The guest's /etc before boot: no trust bundle, and a link that
    // dangles to a name written to clear the operator's screen.
    let ssl = world.guest().join("etc/ssl");
    std::fs::create_dir_all(&ssl).unwrap();
    std::os::unix::fs::symlink("/nix/\u{1b}[2Jgone/ca-bundle.crt", ssl.join("cert.pem")).unwrap();

    let start = world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .args(["--name", &world.name(), "--detach"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(start.status.success(), "start failed: {stderr}");
    assert!(
        stderr.contains(
            "warning: ca: /etc/ssl/cert.pem is a symlink to /nix/\\u{1b}[2Jgone/ca-bundle.crt, which does not exist"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: ca: the image has no system trust bundle"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "a raw ESC reached stderr: {stderr:?}"
    );

    // Stopped in two parts: the machine is stopped before `stop` returns,
    // and the finisher it leaves in the background removes the rest.
    world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "stop", &world.name()])
        .assert()
        .success();
    wait_for_the_finisher(&world, &docker.engine);
    assert_nothing_left(&world, &docker.engine);
}

#[test]
fn the_python_client_demo_runs_against_a_microvm_bottle() {
    let test = "the_python_client_demo_runs_against_a_microvm_bottle";
    let Some(docker) = docker(test) else { return };
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        bottle_test_support::skip_docker_test(test, "BOTTLE_TOOLBOX_BIN is not set");
        return;
    }
    let world = World::new(&demo_agent_image(test, "cli-serve-vm"), "serve-vm");
    if !sandbox_available(&world, test) {
        return;
    }
    let root = world.dir.path();
    let serve =
        crate::serve::Serve::start_with(&root.join("state"), root, Some("smolmachines"), |cmd| {
            cmd.envs(world.double_env("1.9.3", ""))
                .env_remove("XDG_DATA_HOME");
        });
    crate::serve::run_python_demo(
        &serve,
        &root.join("project/bottle.toml"),
        "coder",
        &world.name(),
    );
    drop(serve);
    // The shutdown answered once the microVM was stopped; its finisher
    // removes the rest.
    wait_for_the_finisher(&world, &docker.engine);
    assert_nothing_left(&world, &docker.engine);
}

/// What bottle owns in a guest, read from the guest root on the host:
/// every path under it with its kind and contents.
fn owned_in_guest(world: &World) -> Vec<(String, Vec<u8>)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let contents = if meta.is_file() {
                std::fs::read(&path).unwrap()
            } else {
                Vec::new()
            };
            out.push((path.display().to_string(), contents));
            if meta.is_dir() {
                walk(&path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&world.guest().join("etc/bottle"), &mut out);
    walk(&world.guest().join(".bottle"), &mut out);
    out.sort();
    out
}

#[test]
fn cp_goes_both_ways_on_a_microvm_and_never_through_a_planted_link() {
    let test = "cp_goes_both_ways_on_a_microvm_and_never_through_a_planted_link";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "cp-vm");
    if !sandbox_available(&world, test) {
        return;
    }
    let name = world.name();
    let at = |path: &str| format!("{name}:{path}");
    let vm = || {
        let mut cmd = world.bottle("1.9.3", "");
        cmd.args(["--backend", "smolmachines"]);
        cmd
    };
    let exec = |script: &str| -> String {
        let out = vm()
            .args(["exec", &name, "--", "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    vm().args(["--yes", "start", "coder", "--name", &name, "--detach"])
        .assert()
        .success();

    // In: a tree keeps its times and belongs to the user commands run as.
    let proj = world.dir.path().join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::write(proj.join("sub/a.txt"), "alpha\n").unwrap();
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_650_000_000);
    std::fs::File::options()
        .write(true)
        .open(proj.join("sub/a.txt"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    vm().arg("cp").arg(&proj).arg(at("/tmp")).assert().success();
    assert_eq!(
        exec("echo \"$(stat -c '%u %Y' /tmp/proj/sub/a.txt) $(id -u)\""),
        format!(
            "{} 1650000000 {}\n",
            exec("id -u").trim(),
            exec("id -u").trim()
        )
    );
    let mut stdin_tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(6);
    header.set_mode(0o644);
    stdin_tar
        .append_data(&mut header, "piped.txt", &b"piped\n"[..])
        .unwrap();
    vm().args(["cp", "-", &at("/tmp/proj")])
        .write_stdin(stdin_tar.into_inner().unwrap())
        .assert()
        .success();
    assert_eq!(exec("cat /tmp/proj/piped.txt"), "piped\n");

    // Out: a tree, and a tar on stdout.
    let out = world.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    vm().args(["cp", &at("/tmp/proj"), out.to_str().unwrap()])
        .assert()
        .success();
    assert_eq!(
        std::fs::read_to_string(out.join("proj/sub/a.txt")).unwrap(),
        "alpha\n"
    );
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(out.join("proj/sub/a.txt"))
            .unwrap()
            .mtime(),
        1_650_000_000
    );
    let tar = vm()
        .args(["cp", &at("/tmp/proj/sub"), "-"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let mut archive = tar::Archive::new(tar.as_slice());
    let listed: Vec<String> = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(listed, ["sub", "sub/a.txt"]);

    // The agent plants links; copies through them are refused and nothing
    // bottle owns changes, while the same copy to a plain directory lands.
    exec(
        "mkdir -p /.bottle && cd /tmp && ln -s /etc/bottle drop && ln -s /.bottle bin && ln -s /etc up \
         && mkdir plain hostile && echo x > hostile/data && ln -s /etc/passwd hostile/abs",
    );
    let before = owned_in_guest(&world);
    assert!(
        before
            .iter()
            .any(|(p, _)| p.ends_with("etc/bottle/mcp.json")),
        "{before:?}"
    );
    let mcp = world.dir.path().join("mcp.json");
    std::fs::write(&mcp, "{\"planted\": true}\n").unwrap();
    for dest in ["/tmp/drop", "/tmp/bin", "/tmp/up/bottle", "/tmp/drop/x"] {
        vm().arg("cp")
            .arg(&mcp)
            .arg(at(dest))
            .assert()
            .code(5)
            .stderr(predicate::str::contains("error[BOT-F003]"));
    }
    vm().arg("cp")
        .arg(&mcp)
        .arg(at("/etc/bottle"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-F002]"));
    assert_eq!(owned_in_guest(&world), before);
    vm().arg("cp")
        .arg(&mcp)
        .arg(at("/tmp/plain"))
        .assert()
        .success();
    assert_eq!(exec("cat /tmp/plain/mcp.json"), "{\"planted\": true}\n");

    // A link out of the copied tree: refused, nothing written.
    let empty = world.dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    vm().args(["cp", &at("/tmp/hostile"), empty.to_str().unwrap()])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("error[BOT-F010]"));
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    vm().args(["cp", &at("/tmp/nothing"), empty.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-F004]"));

    vm().args(["stop", "--wait", &name]).assert().success();
    assert_nothing_left(&world, &docker.engine);
}

/// A published port and a host service on a microVM bottle. The double
/// runs guest commands on the host's network, so "the agent's server" is
/// a listener on the host's loopback here: what is tested is the path, the
/// forwarder through `machine exec -i` of the in-box agent's relay, and
/// the guest's `/etc/hosts` naming the bundle, whose relay reaches the
/// host's service through the forwarder's socket.
#[test]
fn a_published_port_and_a_host_service_cross_a_microvm_bottle() {
    let test = "a_published_port_and_a_host_service_cross_a_microvm_bottle";
    let Some(docker) = docker(test) else { return };
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        bottle_test_support::skip_docker_test(test, "BOTTLE_TOOLBOX_BIN is not set");
        return;
    }
    let world = World::new(&docker.image, "smol-ports");
    if !sandbox_available(&world, test) {
        return;
    }
    let serve = |tag: &'static str| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in listener.incoming().take(2) {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
                let mut buf = [0u8; 16];
                let got = std::io::Read::read(&mut conn, &mut buf).unwrap_or(0);
                let _ = std::io::Write::write_all(&mut conn, format!("{tag}: ").as_bytes());
                let _ = std::io::Write::write_all(&mut conn, &buf[..got]);
            }
        });
        port
    };
    let agent_port = serve("box-said");
    let service_port = serve("host-said");
    let host_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        world.dir.path().join("project/bottle.toml"),
        format!(
            "[agents.coder]\nimage = \"{}\"\npublish = [\"{agent_port}:{host_port}\"]\n\n\
             [agents.coder.egress]\nhost_services = [\"127.0.0.1:{service_port}\"]\n",
            docker.image
        ),
    )
    .unwrap();
    let start = world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "--yes", "start", "coder"])
        .args(["--name", &world.name(), "--detach"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(start.status.success(), "start failed: {stderr}");

    // The host's loopback reaches the agent's port through the relay.
    let mut conn = TcpStream::connect(("127.0.0.1", host_port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    std::io::Write::write_all(&mut conn, b"ping").unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = String::new();
    std::io::Read::read_to_string(&mut conn, &mut back).unwrap();
    assert_eq!(back, "box-said: ping");
    let listed = list(&world, "smolmachines");
    let me = listed
        .iter()
        .find(|b| b["name"] == world.machine())
        .expect("listed");
    assert_eq!(me["ports"][0]["port"], u64::from(agent_port));

    // The guest reaches the host's service at its name.
    let out = world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "exec", &world.name(), "--"])
        .args([
            "sh",
            "-c",
            &format!("printf ping | busybox nc -w 10 host.bottle.internal {service_port}"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "host-said: ping",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    world
        .bottle("1.9.3", "")
        .args(["--backend", "smolmachines", "stop", "--wait", &world.name()])
        .assert()
        .success();
    assert!(
        TcpStream::connect(("127.0.0.1", host_port)).is_err(),
        "the published port outlived its bottle"
    );
    assert_nothing_left(&world, &docker.engine);
}

/// `bottle start --timings` on smolmachines: every step of the microVM's
/// launch, in order, with the bundle host's steps inside `bundle`.
#[test]
fn start_with_timings_names_every_step_of_the_microvms_launch() {
    use bottle_core::launch_steps::LaunchStep as _;
    let test = "start_with_timings_names_every_step_of_the_microvms_launch";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "smol-timings");
    if !sandbox_available(&world, test) {
        return;
    }
    let start = world
        .bottle("1.9.3", "")
        .args([
            "--backend",
            "smolmachines",
            "--yes",
            "--quiet",
            "start",
            "coder",
        ])
        .args(["--name", &world.name(), "--detach", "--timings"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(start.status.success(), "start failed: {stderr}");
    let laps: Vec<&str> = stderr
        .lines()
        .skip_while(|line| *line != "timings:")
        .skip(2)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    let position = |lap: &str| {
        laps.iter()
            .position(|l| *l == lap)
            .unwrap_or_else(|| panic!("no {lap} lap: {stderr}"))
    };
    let steps: Vec<usize> = bottle_smolvm::launch::Step::ALL
        .iter()
        .map(|step| position(step.name()))
        .collect();
    assert!(steps.is_sorted(), "out of order: {stderr}");
    let (bottle_state, bundle) = (position("bottle-state"), position("bundle"));
    for step in ["network", "bundle-files", "bundle-start", "bundle-health"] {
        assert!(
            (bottle_state..bundle).contains(&position(step)),
            "{step}: {stderr}"
        );
    }
    assert!(position("confirm") < steps[0], "{stderr}");
    world
        .bottle("1.9.3", "")
        .args([
            "--backend",
            "smolmachines",
            "--quiet",
            "stop",
            "--wait",
            &world.name(),
        ])
        .assert()
        .success();
    assert_nothing_left(&world, &docker.engine);
}

/// `BOTTLE_FAILPOINT` on smolmachines: a step of the microVM's launch or
/// of its bundle's fails the start there and leaves nothing; a name of
/// neither is refused before anything starts.
#[test]
fn failpoints_fail_a_microvm_start_at_either_launchs_steps() {
    let test = "failpoints_fail_a_microvm_start_at_either_launchs_steps";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "smol-failpoint");
    if !sandbox_available(&world, test) {
        return;
    }
    for (failpoint, code) in [
        ("machine-start", "BOT-K074"),
        ("bundle-files", "BOT-D060"),
        ("agent-create", "BOT-K075"),
    ] {
        world
            .bottle("1.9.3", "")
            .env("BOTTLE_FAILPOINT", failpoint)
            .args(["--backend", "smolmachines", "--yes", "start", "coder"])
            .args(["--name", &world.name(), "--detach"])
            .assert()
            .failure()
            .stdout("")
            .stderr(predicate::str::contains(format!("error[{code}]")))
            .stderr(predicate::str::contains(failpoint));
        assert!(world.booted().is_none(), "{failpoint}: the machine booted");
        assert_nothing_left(&world, &docker.engine);
    }
}

/// `bottle pool` on the smolmachines backend: a fill launches a pooled
/// microVM bottle, `list` shows it pooled, `start` claims it (after its
/// checks, the bundle's health among them) instead of launching, and
/// `pool drain` removes what waits.
#[test]
fn a_microvm_pool_is_filled_claimed_by_start_and_drained() {
    let test = "a_microvm_pool_is_filled_claimed_by_start_and_drained";
    let Some(docker) = docker(test) else { return };
    let world = World::new(&docker.image, "smol-pool");
    if !sandbox_available(&world, test) {
        return;
    }
    let smol = || {
        let mut cmd = world.bottle("1.9.3", "");
        cmd.args(["--backend", "smolmachines", "--yes"]);
        cmd
    };
    let filled = smol()
        .args(["pool", "fill", "coder", "2"])
        .output()
        .unwrap();
    assert!(
        filled.status.success(),
        "fill: {}",
        String::from_utf8_lossy(&filled.stderr)
    );
    let entries: Vec<String> = String::from_utf8_lossy(&filled.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let pooled = smol().args(["--json", "pool", "list"]).output().unwrap();
    let pooled: Vec<Value> = serde_json::from_slice(&pooled.stdout).unwrap();
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    assert!(
        pooled
            .iter()
            .all(|e| e["backend"] == "smolmachines" && e["state"] == "ready"),
        "{pooled:?}"
    );
    let listed = list(&world, "smolmachines");
    assert!(
        entries.iter().all(|name| listed
            .iter()
            .any(|b| b["name"] == name.as_str() && b["state"] == "pooled")),
        "{listed:?}"
    );

    let start = smol()
        .args(["start", "coder", "--detach"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(start.status.success(), "start: {stderr}");
    let claimed = String::from_utf8_lossy(&start.stdout).trim().to_string();
    assert!(entries.contains(&claimed), "{claimed} of {entries:?}");
    assert!(
        stderr.contains(&format!("claimed pooled bottle {claimed}")),
        "{stderr}"
    );
    // Claimed, it runs the agent's commands like any bottle.
    smol()
        .args(["exec", &claimed, "--", "sh", "-c", "echo from the pool"])
        .assert()
        .success()
        .stdout("from the pool\n");

    let drained = smol().args(["pool", "drain", "coder"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&drained.stderr);
    assert!(drained.status.success(), "drain: {stderr}");
    let waiting = entries.iter().find(|e| **e != claimed).unwrap();
    assert!(
        stderr.contains(&format!("removed vm {waiting}")),
        "{stderr}"
    );
    smol().args(["stop", "--wait", &claimed]).assert().success();
    let engine = &docker.engine;
    for name in &entries {
        assert!(
            !container_exists(engine, &format!("{name}-bundle")),
            "{name}'s bundle left"
        );
        assert!(network(engine, name).is_none(), "{name}'s network left");
    }
    assert!(list(&world, "smolmachines").is_empty());
    let state = world.dir.path().join("state/bottle");
    let dirs: Vec<_> = std::fs::read_dir(&state)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        dirs.iter().all(|d| d.to_string_lossy().starts_with('.')
            || d == "pool-fingerprint.key"
            || d == "retained_logs"),
        "state left: {dirs:?}"
    );
}
