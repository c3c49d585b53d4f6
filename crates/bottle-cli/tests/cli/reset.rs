//! `bottle reset` through the real binary on the docker backend: a
//! detached start prepares the first reset's standby in the background,
//! and each reset the next one; a reset swaps it in, reverts what the
//! agent wrote and prints the three sources' verdicts (text and `--json`);
//! an Engine state changed behind bottle's back (the waiting standby's)
//! halts the bottle, exits 5 and names the source and the fact; the halted
//! bottle is listed as halted, is not reset again, and `stop` removes it,
//! its standby and the boxes earlier resets retired.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image) and
//! `BOTTLE_BUNDLE_BIN`; skips with a line unless `BOTTLE_REQUIRE_DOCKER=1`.

use std::path::PathBuf;

use bottle_docker::client::Engine;
use serde_json::Value;

use crate::bottle;

const IMAGE: &str = "bottle-demo-agent:cli-reset";

struct World {
    dir: tempfile::TempDir,
    name: String,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl World {
    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.dir.path().join("state"));
        cmd.arg("--manifest")
            .arg(self.dir.path().join("bottle.toml"))
            .args(["--backend", "docker"]);
        cmd
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state/bottle").join(&self.name)
    }

    /// Waits (bounded) for the standby the background preparation makes.
    fn wait_for_standby(&self) {
        let golden = self.state_dir().join("golden");
        let ready = bottle_test_support::eventually(std::time::Duration::from_secs(60), || {
            golden.join("standby.json").exists()
        });
        assert!(
            ready,
            "no standby was prepared; its log: {}",
            std::fs::read_to_string(golden.join("prepare.log")).unwrap_or_default()
        );
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.bottle().args(["stop", "--wait", &self.name]).output();
    }
}

fn setup(test: &str) -> Option<(World, Engine)> {
    let serial = crate::one_launch_at_a_time();
    let engine = crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN"])?;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(
        dir.path().join("bottle.toml"),
        format!(
            "[agents.demo]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\"]\n\n[agents.demo.limits]\nmemory = \"256m\"\n"
        ),
    )
    .unwrap();
    let world = World {
        dir,
        name: format!("reset-{}", std::process::id()),
        _serial: serial,
    };
    Some((world, engine))
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn reset_reverts_reports_and_halts_on_a_changed_engine_state() {
    let Some((world, engine)) = setup("reset_reverts_reports_and_halts_on_a_changed_engine_state")
    else {
        return;
    };
    let name = world.name.clone();
    let started = world
        .bottle()
        .args(["--yes", "start", "demo", "--name", &name, "--detach"])
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", stderr(&started));
    assert!(!stderr(&started).contains("reset is unavailable"));
    world.wait_for_standby();

    let wrote = world
        .bottle()
        .args([
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo mine > /home/agent/left",
        ])
        .output()
        .unwrap();
    assert!(wrote.status.success(), "{}", stderr(&wrote));

    let reset = world.bottle().args(["reset", &name]).output().unwrap();
    assert!(reset.status.success(), "{}", stderr(&reset));
    let text = stdout(&reset);
    for source in ["filesystem", "open_fds", "engine"] {
        let row = text
            .lines()
            .find(|line| line.starts_with(source))
            .unwrap_or_else(|| panic!("no {source} row: {text}"));
        assert!(row.ends_with('✓'), "{row}");
    }
    assert!(
        text.contains("reset verified (revert by standby "),
        "{text}"
    );
    let gone = world
        .bottle()
        .args(["exec", &name, "--", "test", "-e", "/home/agent/left"])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1), "{}", stderr(&gone));

    let json = world
        .bottle()
        .args(["--json", "reset", &name])
        .output()
        .unwrap();
    assert!(json.status.success(), "{}", stderr(&json));
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["verified"], true);
    assert_eq!(report["checks"].as_array().unwrap().len(), 3);

    // The Engine's view of the box the next reset swaps in changed behind
    // bottle's back: halted, exit 5.
    let agent = format!("bot-bottle-{name}-agent");
    world.wait_for_standby();
    engine
        .block_on(engine.docker.update_container(
            &format!("{agent}-standby"),
            bollard::models::ContainerUpdateBody {
                memory: Some(200 * 1024 * 1024),
                ..Default::default()
            },
        ))
        .unwrap();
    let halted = world.bottle().args(["reset", &name]).output().unwrap();
    assert_eq!(halted.status.code(), Some(5), "{}", stderr(&halted));
    let said = stderr(&halted);
    assert!(said.contains("error[BOT-X006]"), "{said}");
    assert!(said.contains("engine: expected memory=268435456"), "{said}");
    assert!(said.contains("observed memory=209715200"), "{said}");
    assert!(stdout(&halted).contains('✗'));

    let listed = world.bottle().args(["--json", "list"]).output().unwrap();
    let all: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let this = all
        .iter()
        .find(|b| b["name"] == format!("bot-bottle-{name}").as_str())
        .unwrap();
    assert_eq!(this["state"], "halted");

    let again = world.bottle().args(["reset", &name]).output().unwrap();
    assert!(!again.status.success());
    assert!(stderr(&again).contains("halted"), "{}", stderr(&again));

    let stopped = world.bottle().args(["stop", &name]).output().unwrap();
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    // The agent's box, its standby and the boxes resets retired.
    let left = crate::interrupted::docker_objects(&engine, &agent);
    assert!(left.is_empty(), "{left:?} are left");
    // The state dir goes with the rest, after `stop` returned.
    bottle_test_support::wait_until(
        "the state dir to go",
        std::time::Duration::from_secs(60),
        || !world.state_dir().exists(),
    );
}
