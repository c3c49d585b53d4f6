//! `bottle stop` through the real binary on the docker backend: it returns
//! with the agent's container gone (the agent can neither run nor reach
//! anything), a detached finisher removes the bundle and the rest, and a bottle of the
//! same name starts right after; a finisher killed half-way leaves a
//! bottle `list` shows as `stopping`, a second `stop` of it succeeds, and
//! `cleanup` finishes it: no container, network or state dir left, its
//! audit log kept.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image) and
//! `BOTTLE_BUNDLE_BIN`; skips with a line unless `BOTTLE_REQUIRE_DOCKER=1`.

use std::path::PathBuf;
use std::time::Duration;

use bottle_docker::client::Engine;
use bottle_test_support::{wait_for, wait_until};
use serde_json::Value;

use crate::bottle;
use crate::session::process_runs;

const IMAGE: &str = "bottle-demo-agent:cli-stop";
const WAIT: Duration = Duration::from_secs(60);

struct World {
    dir: tempfile::TempDir,
    name: String,
    engine: Engine,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl World {
    fn state_root(&self) -> PathBuf {
        self.dir.path().join("state/bottle")
    }

    fn state_dir(&self) -> PathBuf {
        self.state_root().join(&self.name)
    }

    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.dir.path().join("state"));
        cmd.arg("--manifest")
            .arg(self.dir.path().join("bottle.toml"))
            .args(["--backend", "docker"]);
        cmd
    }

    fn start(&self) {
        let out = self
            .bottle()
            .args([
                "--yes", "--quiet", "start", "demo", "--name", &self.name, "-d",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }

    fn stop(&self) -> std::process::Output {
        self.bottle().args(["stop", &self.name]).output().unwrap()
    }

    fn container_exists(&self, role: &str) -> bool {
        let container = format!("bot-bottle-{}-{role}", self.name);
        self.engine
            .block_on(self.engine.docker.inspect_container(&container, None))
            .is_ok()
    }

    fn network_exists(&self) -> bool {
        let network = format!("bot-bottle-{}", self.name);
        self.engine
            .block_on(self.engine.docker.inspect_network(&network, None))
            .is_ok()
    }

    fn listed_state(&self) -> Option<String> {
        let out = self.bottle().args(["--json", "list"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        all.into_iter()
            .find(|b| b["name"] == format!("bot-bottle-{}", self.name).as_str())
            .map(|b| b["state"].as_str().unwrap_or_default().to_string())
    }

    /// Nothing of the bottle is left but its kept audit logs (`runs` of
    /// them).
    fn assert_nothing_left_but_logs(&self, runs: usize) {
        assert!(
            !self.container_exists("agent"),
            "the agent container is left"
        );
        assert!(
            !self.container_exists("bundle"),
            "the bundle container is left"
        );
        assert!(!self.network_exists(), "the bottle's network is left");
        assert!(!self.state_dir().exists(), "the state dir is left");
        let kept = bottle_core::audit_files::retained_runs(&self.state_root(), &self.name).unwrap();
        assert_eq!(kept.len(), runs, "kept audit logs: {kept:?}");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.stop();
        // The finisher removes the rest; wait for it before the state root
        // goes with the temp dir.
        let gone = bottle_test_support::eventually(WAIT, || {
            !self.network_exists() && !self.state_dir().exists()
        });
        if !gone {
            let _ = self.bottle().args(["--yes", "cleanup"]).output();
        }
    }
}

fn setup(test: &str, prefix: &str) -> Option<World> {
    let serial = crate::one_launch_at_a_time();
    let engine = crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN"])?;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(
        dir.path().join("bottle.toml"),
        format!(
            "[agents.demo]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\", \"-c\", \"sleep 600\"]\n\n[agents.demo.limits]\nmemory = \"256m\"\n"
        ),
    )
    .unwrap();
    Some(World {
        dir,
        name: format!("{prefix}-{}", std::process::id()),
        engine,
        _serial: serial,
    })
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The running `bottle __finish-stop` processes of the bottle `name`.
fn finishers(name: &str) -> Vec<u32> {
    let wanted = format!("bot-bottle-{name}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.contains(&b"__finish-stop".as_slice()) && args.contains(&wanted.as_bytes())
        })
        .filter(|pid| process_runs(*pid))
        .collect()
}

fn kill(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
}

#[test]
fn stop_returns_with_the_agent_gone_and_the_rest_follows() {
    let test = "stop_returns_with_the_agent_gone_and_the_rest_follows";
    let Some(world) = setup(test, "stop-fast") else {
        return;
    };
    world.start();
    assert!(world.container_exists("agent") && world.container_exists("bundle"));

    let stopped = world.stop();
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    // Before the command returned: the agent can neither run nor reach
    // anything.
    assert!(
        !world.container_exists("agent"),
        "stop returned with the agent up"
    );

    // A bottle of the same name starts right away: the launch finishes the
    // old stop first if the finisher has not yet.
    world.start();
    assert!(world.container_exists("agent"));
    let stopped = world.stop();
    assert!(stopped.status.success(), "{}", stderr(&stopped));

    wait_until("the finisher to remove the rest", WAIT, || {
        !world.container_exists("bundle") && !world.network_exists() && !world.state_dir().exists()
    });
    world.assert_nothing_left_but_logs(2);
}

/// `stop --wait` finishes the stop itself: when it returns, nothing of
/// the bottle is left and no finisher runs (a script may remove the state
/// root next).
#[test]
fn stop_wait_returns_with_nothing_left() {
    let Some(world) = setup("stop_wait_returns_with_nothing_left", "stop-wait") else {
        return;
    };
    world.start();
    let stopped = world
        .bottle()
        .args(["stop", "--wait", &world.name])
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    assert!(finishers(&world.name).is_empty(), "a finisher was started");
    world.assert_nothing_left_but_logs(1);
    let said = stderr(&stopped);
    assert!(
        said.contains(&format!(
            "removed container bot-bottle-{}-bundle",
            world.name
        )) && said.contains(&format!("removed network bot-bottle-{}", world.name)),
        "{said}"
    );
}

#[test]
fn a_killed_finisher_leaves_a_stopping_bottle_that_cleanup_finishes() {
    let test = "a_killed_finisher_leaves_a_stopping_bottle_that_cleanup_finishes";
    let Some(world) = setup(test, "stop-crash") else {
        return;
    };
    world.start();
    // A session holder that ignores SIGTERM keeps the finisher waiting on
    // it (for 10 s, then SIGKILL): time to kill the finisher half-way.
    #[expect(
        clippy::disallowed_methods,
        reason = "the test holds the stubborn holder's handle to kill it"
    )]
    let mut stubborn = std::process::Command::new("setsid")
        .args(["sh", "-c", "trap '' TERM; exec sleep 120"])
        .spawn()
        .unwrap();
    let session = world.state_dir().join("session");
    std::fs::create_dir_all(&session).unwrap();
    std::fs::write(
        session.join("holder.json"),
        format!(r#"{{"pid":{},"start":0}}"#, stubborn.id()),
    )
    .unwrap();

    // Each finisher is killed the moment it is seen, well inside the
    // holder's window: nothing slow (a whole `bottle stop` on a loaded
    // machine) runs between a finisher's start and its kill.
    let kill_the_finisher = || {
        let first = wait_for("the finisher", WAIT, || finishers(&world.name).pop());
        for pid in finishers(&world.name) {
            kill(pid);
        }
        wait_until("the finishers to die", WAIT, || {
            !process_runs(first) && finishers(&world.name).is_empty()
        });
        assert!(world.network_exists(), "the finisher was killed too late");
    };
    let stopped = world.stop();
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    assert!(!world.container_exists("agent"));
    kill_the_finisher();

    // Stopping a bottle that is already stopping is no error: it is
    // recorded as stopping still, and a finisher starts again.
    let again = world.stop();
    assert!(again.status.success(), "{}", stderr(&again));
    kill_the_finisher();
    let _ = stubborn.kill();
    let _ = stubborn.wait();

    assert_eq!(world.listed_state().as_deref(), Some("stopping"));

    // Without a terminal, cleanup lists the bottle and refuses to go on
    // unconfirmed; nothing is removed.
    let refused = world.bottle().arg("cleanup").output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let said = stderr(&refused);
    assert!(
        said.contains("cleanup would remove:")
            && said.contains(&format!("bottle bot-bottle-{}", world.name))
            && said.contains("error[BOT-C003]: no terminal to confirm the cleanup on"),
        "{said}"
    );
    assert!(world.network_exists(), "an unconfirmed cleanup removed it");
    let cleanup = world.bottle().args(["--yes", "cleanup"]).output().unwrap();
    assert!(cleanup.status.success(), "{}", stderr(&cleanup));
    world.assert_nothing_left_but_logs(1);
    assert_eq!(world.listed_state(), None);
}
