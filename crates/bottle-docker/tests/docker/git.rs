//! git-gate through the docker backend: the bundle serves the manifest's
//! repositories, and an agent with the real git client clones, pushes to
//! an allowed branch (which lands in the host's bare repository) and is
//! refused on main (which stays as it was).

use std::collections::HashMap;
use std::path::Path;

use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bottle_docker::tarball::{Ownership, TarBuilder};

use crate::support::{self, DEMO_TAG, name, sh};

/// The demo agent plus the host's git (the files git-gate's own image
/// gets), so that the agent has a real git client.
const GIT_AGENT_TAG: &str = "bottle-demo-agent:test-git";

fn build_git_agent(fx: &support::Fixture) -> String {
    let files = bottle_docker::images::git_runtime_files(&SystemRunner).unwrap();
    let mut tar = TarBuilder::new();
    let dockerfile = format!("FROM {DEMO_TAG}\nCOPY rootfs/ /\n");
    tar.file("Dockerfile", dockerfile.as_bytes(), 0o644, Ownership::ROOT)
        .unwrap();
    tar.dir("rootfs", 0o755, Ownership::ROOT).unwrap();
    // The host's CA bundle is not needed for http:// and the bottle has
    // its own CA.
    for (host, in_image) in files.iter().filter(|(_, p)| !p.starts_with("/etc/")) {
        let data = std::fs::read(host).unwrap();
        let name = format!("rootfs/{}", in_image.trim_start_matches('/'));
        tar.file(&name, &data, 0o755, Ownership::ROOT).unwrap();
    }
    let engine = fx.backend.engine().unwrap();
    bottle_docker::images::build_from_tar(
        engine,
        tar.finish().unwrap(),
        "Dockerfile",
        GIT_AGENT_TAG,
        &HashMap::new(),
        &HashMap::new(),
        None,
    )
    .unwrap();
    GIT_AGENT_TAG.to_string()
}

/// Runs the host's git, failing the test unless it succeeds.
fn host_git(dir: &Path, args: &[&str]) -> String {
    let mut spec = CommandSpec::new("git")
        .args([
            "-c",
            "user.name=operator",
            "-c",
            "user.email=op@bottle.invalid",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0");
    spec.cwd = Some(dir.to_path_buf());
    let out = SystemRunner.run(&spec).expect("run git");
    assert!(out.success(), "git {args:?}: {}", out.stderr_text());
    out.stdout_text()
}

fn refs(bare: &Path) -> String {
    host_git(bare, &["for-each-ref", "--format=%(refname) %(objectname)"])
}

/// The bottle's audit lines from git-gate.
fn gate_audit(state: &Path) -> Vec<bottle_bundle::AuditRecord> {
    let mut stack = vec![state.to_path_buf()];
    let mut records = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "audit.jsonl") {
                records.extend(bottle_bundle::read_audit(&path).unwrap());
            }
        }
    }
    records.retain(|r| r.daemon == "git-gate");
    records
}

#[test]
fn the_agent_clones_and_pushes_through_the_gate() {
    let Some(mut fx) = support::setup("the_agent_clones_and_pushes_through_the_gate") else {
        return;
    };
    fx.image = build_git_agent(&fx);

    // The host's bare repository, with one commit on main.
    let repo = fx.dir.path().join("work.git");
    let seed = fx.dir.path().join("seed");
    host_git(
        fx.dir.path(),
        &["init", "-q", "--bare", "-b", "main", repo.to_str().unwrap()],
    );
    host_git(
        fx.dir.path(),
        &["init", "-q", "-b", "main", seed.to_str().unwrap()],
    );
    std::fs::write(seed.join("README"), "from the host\n").unwrap();
    host_git(&seed, &["add", "README"]);
    host_git(&seed, &["commit", "-q", "-m", "seed"]);
    host_git(&seed, &["push", "-q", repo.to_str().unwrap(), "main"]);
    let seeded = host_git(&seed, &["rev-parse", "HEAD"]);

    fx.manifest_with(
        "\n[[agents.demo.git]]\nname = \"work\"\nurl = \"work.git\"\nmode = \"read-write\"\npush = [\"agent/*\"]\n",
    );
    let name = name("git");
    let (_guard, bottle) = fx.start(&name);
    let bundle = format!("bot-bottle-{name}-bundle");

    // The bundle config lists the repository at its bind mount.
    let (config, _, _) = support::download(&fx.backend, &bundle, "/run/bottle/bundle.json");
    let config: bottle_core::bundle::BundleConfig = serde_json::from_slice(&config).unwrap();
    assert_eq!(config.git_gate_listen.as_deref(), Some("0.0.0.0:9418"));
    assert_eq!(config.git[0].name, "work");
    assert_eq!(config.git[0].path_in_bundle, "/run/bottle/git/work.git");
    let binds = support::inspect(&fx.backend, &bundle)
        .host_config
        .unwrap()
        .binds
        .unwrap();
    assert!(
        binds.contains(&format!("{}:/run/bottle/git/work.git:rw", repo.display())),
        "{binds:?}"
    );
    let env = String::from_utf8(sh(&*bottle, "echo $GIT_GATE_URL").stdout).unwrap();
    let url = env.trim();
    assert!(
        url.starts_with("http://192.168.") && url.ends_with(":9418"),
        "{url}"
    );

    // Clone, commit, push to an allowed branch.
    let out = sh(
        &*bottle,
        "set -e; export GIT_TERMINAL_PROMPT=0; \
         git clone -q \"$GIT_GATE_URL/work.git\" work; cd work; cat README; \
         echo change > agent.txt; git add agent.txt; \
         git -c user.name=agent -c user.email=agent@bottle.invalid commit -q -m agent; \
         git push -q origin HEAD:agent/x; git rev-parse HEAD",
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.exit_code,
        0,
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("from the host"));
    let pushed = lines.next().unwrap().to_string();
    let after_push = refs(&repo);
    assert!(
        after_push.contains(&format!("refs/heads/agent/x {pushed}")),
        "{after_push}"
    );

    // A push to main is refused with the gate's message; main stays.
    let out = sh(&*bottle, "cd work && git push origin HEAD:main");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_ne!(out.exit_code, 0, "{stderr}");
    assert!(
        stderr.contains("[remote rejected] HEAD -> main"),
        "{stderr}"
    );
    assert!(
        stderr.contains("pushing to refs/heads/main in work is not allowed"),
        "{stderr}"
    );
    assert_eq!(refs(&repo), after_push);
    assert!(after_push.contains(&format!("refs/heads/main {}", seeded.trim())));

    // A repository the manifest does not list is not there.
    let out = sh(&*bottle, "git ls-remote \"$GIT_GATE_URL/other.git\"");
    assert_ne!(out.exit_code, 0);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("there is no repository"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The audit log has the fetch, both pushes and the unknown repository.
    let audit = gate_audit(fx.state.path());
    let find = |method: &str, reason: &str| {
        audit
            .iter()
            .any(|r| r.method == method && r.reason.starts_with(reason))
    };
    assert!(find("fetch", "allowed"), "{audit:#?}");
    assert!(find("push", "allowed"), "{audit:#?}");
    assert!(find("push", "ref_not_allowed"), "{audit:#?}");
    assert!(
        audit.iter().any(|r| r.reason == "unknown_repo"),
        "{audit:#?}"
    );
}
