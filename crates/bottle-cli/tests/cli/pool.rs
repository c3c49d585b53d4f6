//! The warm pool on docker: `pool fill` prepares bottles, `start` claims
//! one (concurrent starts get different ones), a claimed bottle denies
//! what a cold one denies, an entry made from another manifest or image,
//! or changed while it waited, is removed instead of claimed, `cleanup`
//! removes a broken one, and `pool drain` leaves nothing behind.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image), `BOTTLE_BUNDLE_BIN`
//! and `BOTTLE_TOOLBOX_BIN`; skips with a line unless
//! `BOTTLE_REQUIRE_DOCKER=1`.

use std::path::{Path, PathBuf};

use bottle_docker::client::Engine;

use crate::bottle;

const IMAGE: &str = "bottle-demo-agent:cli-pool";

/// The test's manifest and state, and the removal of everything the test
/// made however it ends.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn manifest(&self) -> PathBuf {
        self.dir.path().join("bottle.toml")
    }

    fn write_manifest(&self, allow: &str) {
        self.write_agent(allow, "");
    }

    /// The agent with `extra` lines in its table (e.g. `pool = 1`).
    fn write_agent(&self, allow: &str, extra: &str) {
        std::fs::write(
            self.manifest(),
            format!(
                "[agents.pooled]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\", \"-c\", \"echo hello-from-the-pool\"]\n{extra}\n[agents.pooled.egress]\nallow = [\"{allow}\"]\n"
            ),
        )
        .unwrap();
    }

    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.state());
        cmd.arg("--manifest")
            .arg(self.manifest())
            .args(["--backend", "docker", "--yes"]);
        cmd
    }

    fn run(&self, args: &[&str]) -> (String, String) {
        let out = self.bottle().args(args).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
        (stdout, stderr)
    }

    fn pool(&self) -> Vec<(String, String)> {
        let (stdout, _) = self.run(&["--json", "pool", "list"]);
        let entries: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
        entries
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn ready(&self) -> Vec<String> {
        self.pool()
            .into_iter()
            .filter(|(_, state)| state == "ready")
            .map(|(name, _)| name)
            .collect()
    }

    /// What fetching a host the manifest does not allow says, from inside
    /// the bottle (through its proxy, as every tool's traffic goes).
    fn denied_answer(&self, name: &str) -> String {
        let (stdout, _) = self.run(&[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "timeout 10 wget -q -O- http://evil.example/ 2>&1; echo exit=$?",
        ]);
        stdout
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.bottle().args(["pool", "drain"]).output();
        if let Ok(out) = self.bottle().args(["--json", "list"]).output()
            && let Ok(bottles) = serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        {
            for b in bottles {
                if let Some(name) = b["name"].as_str() {
                    let _ = self.bottle().args(["stop", "--wait", name]).output();
                }
            }
        }
    }
}

/// The one-launch-at-a-time guard, the Engine with the demo image, and an
/// empty world; `None` (a printed skip) without Docker.
fn setup(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Engine, World)> {
    let serial = crate::one_launch_at_a_time();
    let engine =
        crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN", "BOTTLE_TOOLBOX_BIN"])?;
    let world = World {
        dir: tempfile::tempdir().unwrap(),
    };
    Some((serial, engine, world))
}

/// Every container and network Docker holds for bottles of this test's
/// agent.
fn leftovers(engine: &Engine) -> Vec<String> {
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec!["bottle.agent=pooled".to_string()],
    )]);
    let containers = engine
        .block_on(
            engine.docker.list_containers(Some(
                bollard::query_parameters::ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            )),
        )
        .unwrap();
    let networks = engine
        .block_on(
            engine.docker.list_networks(Some(
                bollard::query_parameters::ListNetworksOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            )),
        )
        .unwrap();
    containers
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .chain(networks.into_iter().filter_map(|n| n.name))
        .collect()
}

/// Bottle state dirs (anything but the kept logs and the HMAC key).
fn state_dirs(state: &Path) -> Vec<String> {
    let root = state.join("bottle");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        // Not a bottle's: kept logs and the bundle digest cache.
        .filter(|name| name != "retained_logs" && name != ".cache")
        .collect()
}

/// Gives `IMAGE` a new image ID: the same demo agent with one more label.
fn rebuild_image(engine: &Engine) {
    let mut tar = bottle_docker::tarball::TarBuilder::new();
    tar.file(
        "Dockerfile",
        format!(
            "FROM {IMAGE}\nLABEL bottle.test.rebuilt={}\n",
            std::process::id()
        )
        .as_bytes(),
        0o644,
        bottle_docker::tarball::Ownership::ROOT,
    )
    .unwrap();
    bottle_docker::images::build_from_tar(
        engine,
        tar.finish().unwrap(),
        "Dockerfile",
        IMAGE,
        &Default::default(),
        &Default::default(),
        None,
    )
    .unwrap();
}

#[test]
fn a_pool_is_claimed_checked_refused_when_changed_and_drained() {
    let test = "a_pool_is_claimed_checked_refused_when_changed_and_drained";
    let Some((_serial, engine, world)) = setup(test) else {
        return;
    };
    world.write_manifest("api.example.com");

    // Fill 2: both wait, `list` shows them pooled.
    let (stdout, _) = world.run(&["pool", "fill", "pooled", "2"]);
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert_eq!(world.ready().len(), 2);
    let (listed, _) = world.run(&["--json", "list"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        listed.iter().filter(|b| b["state"] == "pooled").count(),
        2,
        "{listed:?}"
    );

    // An attached start claims one, runs the command and stops it.
    let (stdout, stderr) = world.run(&["start", "pooled"]);
    assert!(stdout.contains("hello-from-the-pool"), "{stdout}");
    assert!(stderr.contains("claimed pooled bottle"), "{stderr}");
    assert_eq!(world.ready().len(), 1);

    // Two detached starts at once, with two entries waiting: each claims
    // one, never the same.
    world.run(&["pool", "fill", "pooled", "2"]);
    let start = || {
        world
            .bottle()
            .args(["start", "pooled", "--detach"])
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(start);
        let b = scope.spawn(start);
        (a.join().unwrap(), b.join().unwrap())
    });
    let name = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (a_name, b_name) = (name(&a), name(&b));
    assert_ne!(a_name, b_name);
    for out in [&a, &b] {
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("claimed pooled bottle"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(world.ready().is_empty());

    // The claimed bottle's proxy denies what the manifest does not allow,
    // as a cold bottle's does.
    let claimed = world.denied_answer(&a_name);
    assert!(claimed.contains("403"), "{claimed}");
    let (cold, _) = world.run(&["start", "pooled", "--detach", "--name", "cold"]);
    assert_eq!(cold.trim(), "bot-bottle-cold");
    assert_eq!(world.denied_answer("cold"), claimed);
    for bottle in [&a_name, &b_name, "cold"] {
        world.run(&["stop", bottle]);
    }

    // A changed manifest: the entry is removed, the start is cold.
    world.run(&["pool", "fill", "pooled", "1"]);
    world.write_manifest("api.example.org");
    let (stdout, stderr) = world.run(&["start", "pooled", "--detach"]);
    assert!(stderr.contains("refused and removed"), "{stderr}");
    assert!(!stderr.contains("claimed pooled bottle"), "{stderr}");
    assert_eq!(stdout.trim(), "bot-bottle-pooled");
    world.run(&["stop", "pooled"]);
    assert!(world.pool().is_empty(), "{:?}", world.pool());

    // A changed image: the same.
    world.run(&["pool", "fill", "pooled", "1"]);
    rebuild_image(&engine);
    let (stdout, stderr) = world.run(&["start", "pooled", "--detach"]);
    assert!(stderr.contains("refused and removed"), "{stderr}");
    assert_eq!(stdout.trim(), "bot-bottle-pooled");
    world.run(&["stop", "pooled"]);

    // A box changed while it waited: its filesystem no longer hashes as
    // its golden snapshot, so the claim refuses it.
    world.run(&["pool", "fill", "pooled", "1"]);
    let entry = world.ready().pop().unwrap();
    world.run(&["exec", &entry, "--", "touch", "/tmp/planted"]);
    let (stdout, stderr) = world.run(&["start", "pooled", "--detach"]);
    assert!(
        stderr.contains("refused and removed") && stderr.contains("filesystem"),
        "{stderr}"
    );
    assert_eq!(stdout.trim(), "bot-bottle-pooled");
    world.run(&["stop", "pooled"]);

    // An entry whose agent container was restarted is broken: `cleanup`
    // removes it.
    world.run(&["pool", "fill", "pooled", "1"]);
    let entry = world.ready().pop().unwrap();
    engine
        .block_on(engine.docker.restart_container(
            &format!("{entry}-agent"),
            None::<bollard::query_parameters::RestartContainerOptions>,
        ))
        .unwrap();
    world.run(&["cleanup"]);
    assert!(world.pool().is_empty(), "{:?}", world.pool());

    // Drain leaves nothing: containers, networks, state dirs.
    world.run(&["pool", "fill", "pooled", "2"]);
    world.run(&["pool", "drain", "pooled"]);
    assert!(world.pool().is_empty(), "{:?}", world.pool());
    // A stopped bottle's bundle and network go in its detached finisher.
    bottle_test_support::wait_until(
        "nothing of the test's bottles left",
        std::time::Duration::from_secs(60),
        || leftovers(&engine).is_empty(),
    );
    assert!(
        state_dirs(&world.state()).is_empty(),
        "{:?}",
        state_dirs(&world.state())
    );
}

/// An agent whose manifest sets `pool = 1` is kept topped up: the start
/// that claims its entry refills the pool in the background, and an
/// operator's fill at the same time does not make a second one (both
/// count under the agent's fill lock).
#[test]
fn a_manifest_pool_is_refilled_after_a_claim_exactly_once() {
    let test = "a_manifest_pool_is_refilled_after_a_claim_exactly_once";
    let Some((_serial, engine, world)) = setup(test) else {
        return;
    };
    world.write_agent("api.example.com", "pool = 1\n");
    world.run(&["pool", "fill", "pooled"]);
    let first = world.ready();
    assert_eq!(first.len(), 1, "{first:?}");

    let (claimed, stderr) = world.run(&["start", "pooled", "--detach"]);
    assert!(stderr.contains("claimed pooled bottle"), "{stderr}");
    assert_eq!(claimed.trim(), first[0]);
    // The operator fills at the same moment as the refill runs.
    world.run(&["pool", "fill", "pooled"]);

    let log = world
        .state()
        .join("bottle")
        .join(".cache")
        .join("pool-refill-pooled.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_to_string(&log)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no refill finished within 120 s ({} missing or empty)",
            log.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let refilled = world.ready();
    assert_eq!(
        refilled.len(),
        1,
        "{refilled:?}; refill log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_ne!(refilled[0], first[0]);

    world.run(&["stop", claimed.trim()]);
    world.run(&["pool", "drain", "pooled"]);
    // A stopped bottle's bundle and network go in its detached finisher.
    bottle_test_support::wait_until(
        "nothing of the test's bottles left",
        std::time::Duration::from_secs(60),
        || leftovers(&engine).is_empty(),
    );
}

/// What `bottle pool fill` refuses before it touches any backend: no
/// count, too many.
#[test]
fn pool_fill_refuses_no_count_and_too_many() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(&manifest, format!("[agents.pooled]\nimage = \"{IMAGE}\"\n")).unwrap();
    let refused = |args: &[&str], code: &str| {
        let out = bottle(&dir.path().join("state"))
            .arg("--manifest")
            .arg(&manifest)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("error[{code}]")) && stderr.contains("fix:"),
            "{args:?}: {stderr}"
        );
    };
    refused(&["pool", "fill", "pooled"], "BOT-C061");
    refused(&["pool", "fill", "pooled", "65"], "BOT-C062");
}
