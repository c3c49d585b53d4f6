//! A working checkout behind git-gate, end to end with real git through
//! the real `bottle` binary on the docker backend: the agent clones the
//! operator's checkout through git-gate, commits and pushes `agent/x`; the
//! checkout gets `refs/heads/agent/x` from the detached bottle's holder
//! within seconds, and a last push from `bottle stop`; its working tree,
//! index, config and hooks are untouched and none of its hooks ran (each
//! would leave a marker); a push to `main` is refused and `main` stays.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image, here with the
//! host's git added) and `BOTTLE_BUNDLE_BIN`; skips with a line unless
//! `BOTTLE_REQUIRE_DOCKER=1`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use bottle_docker::client::Engine;
use bottle_docker::tarball::{Ownership, TarBuilder};
use bottle_test_support::wait_for;

use crate::bottle;

const DEMO: &str = "bottle-demo-agent:cli-checkout";
/// The demo agent plus the host's git, so the agent has a real client.
const IMAGE: &str = "bottle-demo-agent:cli-checkout-git";
const WAIT: Duration = Duration::from_secs(60);
const HOOKS: [&str; 7] = [
    "reference-transaction",
    "post-update",
    "pre-auto-gc",
    "post-checkout",
    "post-merge",
    "pre-push",
    "fsmonitor-watchman",
];

fn build_git_image(engine: &Engine) {
    let files = bottle_docker::images::git_runtime_files(&SystemRunner).unwrap();
    let mut tar = TarBuilder::new();
    let dockerfile = format!("FROM {DEMO}\nCOPY rootfs/ /\n");
    tar.file("Dockerfile", dockerfile.as_bytes(), 0o644, Ownership::ROOT)
        .unwrap();
    tar.dir("rootfs", 0o755, Ownership::ROOT).unwrap();
    for (host, in_image) in files.iter().filter(|(_, p)| !p.starts_with("/etc/")) {
        let data = std::fs::read(host).unwrap();
        let name = format!("rootfs/{}", in_image.trim_start_matches('/'));
        tar.file(&name, &data, 0o755, Ownership::ROOT).unwrap();
    }
    bottle_docker::images::build_from_tar(
        engine,
        tar.finish().unwrap(),
        "Dockerfile",
        IMAGE,
        &HashMap::new(),
        &HashMap::new(),
        None,
    )
    .unwrap();
}

/// The host's git in `dir`, as the operator runs it (their hooks on).
fn git(dir: &Path, args: &[&str]) -> String {
    let spec = CommandSpec::new("git")
        .args([
            "-c",
            "user.name=operator",
            "-c",
            "user.email=op@example.com",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .timeout(WAIT);
    let out = SystemRunner.run(&spec).unwrap();
    assert!(out.success(), "git {args:?}: {}", out.stderr_text());
    out.stdout_text().trim().to_string()
}

fn rev(dir: &Path, refname: &str) -> Option<String> {
    let spec = CommandSpec::new("git").arg("-C").arg(dir).args([
        "rev-parse",
        "--verify",
        "--quiet",
        refname,
    ]);
    let out = SystemRunner.run(&spec).unwrap();
    out.success().then(|| out.stdout_text().trim().to_string())
}

struct World {
    dir: tempfile::TempDir,
    name: String,
    checkout: PathBuf,
    marker: PathBuf,
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

    /// Runs `script` in the bottle; its success and both outputs.
    fn exec(&self, script: &str) -> (bool, String) {
        let out = self
            .bottle()
            .args(["exec", &self.name, "--", "sh", "-c", script])
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// What must not change in the checkout: the working tree's state, the
    /// index, the config and every hook.
    fn untouched(&self) -> Vec<Vec<u8>> {
        let mut state = vec![
            git(&self.checkout, &["status", "--porcelain"]).into_bytes(),
            std::fs::read(self.checkout.join(".git/index")).unwrap(),
            std::fs::read(self.checkout.join(".git/config")).unwrap(),
            std::fs::read(self.checkout.join("README")).unwrap(),
        ];
        for hook in HOOKS {
            state.push(std::fs::read(self.checkout.join(".git/hooks").join(hook)).unwrap());
        }
        state
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.bottle().args(["stop", &self.name]).output();
        let _ = bottle_test_support::eventually(WAIT, || !self.state_dir().exists());
    }
}

fn setup(test: &str) -> Option<World> {
    let serial = crate::one_launch_at_a_time();
    let engine = crate::docker_with_demo_image(test, DEMO, &["BOTTLE_BUNDLE_BIN"])?;
    build_git_image(&engine);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();

    // The operator's checkout: a commit on main, an edit not committed, a
    // file not tracked, and hooks that each leave a marker if they run.
    let checkout = dir.path().join("work");
    std::fs::create_dir(&checkout).unwrap();
    git(&checkout, &["init", "-q", "-b", "main"]);
    std::fs::write(checkout.join("README"), "from the operator\n").unwrap();
    git(&checkout, &["add", "README"]);
    git(&checkout, &["commit", "-qm", "first"]);
    let marker = dir.path().join("hook-ran");
    for hook in HOOKS {
        let path = checkout.join(".git/hooks").join(hook);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho {hook} >> {}\n", marker.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(checkout.join("README"), "from the operator, edited\n").unwrap();
    std::fs::write(checkout.join("scratch.txt"), "not tracked\n").unwrap();

    std::fs::write(
        dir.path().join("bottle.toml"),
        format!(
            "[agents.demo]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\", \"-c\", \"sleep 600\"]\n\n\
             [agents.demo.limits]\nmemory = \"256m\"\n\n\
             [[agents.demo.git]]\nname = \"work\"\nurl = \"work\"\nmode = \"read-write\"\npush = [\"agent/*\"]\n"
        ),
    )
    .unwrap();
    Some(World {
        name: format!("checkout-{}", std::process::id()),
        dir,
        checkout,
        marker,
        _serial: serial,
    })
}

/// The agent's side: clone through the gate, commit `file`, push `refspec`.
fn commit_and_push(file: &str, refspec: &str) -> String {
    format!(
        "set -e; export GIT_TERMINAL_PROMPT=0 HOME=/tmp; cd /tmp; \
         [ -d work ] || git clone -q \"$GIT_GATE_URL/work.git\" work; cd work; \
         echo {file} > {file}; git add {file}; \
         git -c user.name=agent -c user.email=agent@bottle.invalid commit -q -m {file}; \
         git push -q origin {refspec}; git rev-parse HEAD"
    )
}

#[test]
fn the_agent_pushes_a_branch_into_the_operators_checkout_and_nothing_else() {
    let test = "the_agent_pushes_a_branch_into_the_operators_checkout_and_nothing_else";
    let Some(world) = setup(test) else {
        return;
    };
    let main = rev(&world.checkout, "refs/heads/main").unwrap();

    // The plan says what the url is.
    let plan = world.bottle().args(["plan", "demo"]).output().unwrap();
    let plan_text = String::from_utf8_lossy(&plan.stdout).into_owned();
    assert!(plan.status.success(), "{plan_text}");
    assert!(
        plan_text.contains(&format!(
            "work (read-write, push: agent/*): working checkout {}",
            world.checkout.display()
        )),
        "{plan_text}"
    );

    let before = world.untouched();
    let out = world
        .bottle()
        .args([
            "--yes",
            "--quiet",
            "start",
            "demo",
            "--name",
            &world.name,
            "-d",
        ])
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Clone (the operator's README as committed), commit, push agent/x.
    let (ok, output) = world.exec(&format!(
        "{} && cat README",
        commit_and_push("fix.txt", "HEAD:agent/x")
    ));
    assert!(ok, "{output}");
    assert!(output.contains("from the operator\n"), "{output}");
    let pushed = output.lines().next().unwrap().to_string();

    // The detached bottle's holder brings it into the checkout.
    wait_for("refs/heads/agent/x in the checkout", WAIT, || {
        rev(&world.checkout, "refs/heads/agent/x").filter(|r| *r == pushed)
    });
    assert_eq!(
        git(&world.checkout, &["log", "--format=%s", "main..agent/x"]),
        "fix.txt"
    );

    // A push to main is refused by the gate; main stays.
    let (ok, output) = world.exec(&commit_and_push("main.txt", "HEAD:main"));
    assert!(!ok, "{output}");
    assert!(output.contains("[remote rejected]"), "{output}");

    // A last push, then stop: the stop brings it in before the mirror goes.
    let (ok, output) = world.exec(&commit_and_push("last.txt", "HEAD:agent/y"));
    assert!(ok, "{output}");
    let last = output.lines().next().unwrap().to_string();
    let stopped = world
        .bottle()
        .args(["stop", &world.name])
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    assert_eq!(rev(&world.checkout, "refs/heads/agent/y"), Some(last));
    assert_eq!(rev(&world.checkout, "refs/heads/main"), Some(main));

    // Only refs: the working tree, the index, the config and the hooks are
    // as they were, and no hook ran.
    assert_eq!(world.untouched(), before);
    assert!(!world.checkout.join("fix.txt").exists());
    assert_eq!(
        std::fs::read_to_string(&world.marker).ok(),
        None,
        "a hook of the checkout ran"
    );
    // The mirror went with the bottle.
    wait_for("the state dir to go", WAIT, || {
        (!world.state_dir().exists()).then_some(())
    });
}
