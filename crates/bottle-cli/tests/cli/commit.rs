//! `bottle commit` through the real binary on the docker backend: the
//! agent installs something (a file in its home, a program under
//! /usr/local/bin), the bottle is committed, and the image has it with the
//! original image's user, command, environment, working dir, ports and
//! labels, and nothing of bottle's (its files, its CA, its proxy
//! environment, its keep-alive); a new bottle started from the image finds
//! what the agent installed.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image) and
//! `BOTTLE_BUNDLE_BIN`; skips with a line unless `BOTTLE_REQUIRE_DOCKER=1`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bottle_docker::client::Engine;
use bottle_docker::tarball::{Ownership, TarBuilder};

use crate::bottle;

const DEMO: &str = "bottle-demo-agent:cli-commit";
/// The demo agent with a configuration of its own to keep.
const IMAGE: &str = "bottle-demo-agent:cli-commit-base";

struct World {
    dir: tempfile::TempDir,
    engine: Engine,
    names: Vec<String>,
    committed: String,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl World {
    fn bottle(&self, manifest: &str) -> assert_cmd::Command {
        let mut cmd = bottle(&self.dir.path().join("state"));
        cmd.arg("--manifest")
            .arg(self.dir.path().join(manifest))
            .args(["--backend", "docker"]);
        cmd
    }

    fn start(&mut self, manifest: &str, name: &str) {
        self.names.push(name.to_string());
        let out = self
            .bottle(manifest)
            .args(["--yes", "--quiet", "start", "demo", "--name", name, "-d"])
            .timeout(Duration::from_secs(300))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn exec(&self, name: &str, script: &str) -> String {
        let out = self
            .bottle("bottle.toml")
            .args(["exec", name, "--", "sh", "-c", script])
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{script}: {text}");
        text
    }

    fn manifest(&self, file: &str, image: &str) -> PathBuf {
        let path = self.dir.path().join(file);
        std::fs::write(
            &path,
            format!(
                "[agents.demo]\nimage = \"{image}\"\n\n[agents.demo.limits]\nmemory = \"256m\"\n"
            ),
        )
        .unwrap();
        path
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = self
                .bottle("bottle.toml")
                .args(["stop", "--wait", name])
                .output();
        }
        let _ = self.engine.block_on(self.engine.docker.remove_image(
            &self.committed,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        ));
    }
}

fn build_base(engine: &Engine) {
    let dockerfile = format!(
        "FROM {DEMO}\nUSER root\nRUN mkdir -p /usr/local/bin && chown agent /usr/local/bin\n\
         USER agent\nENV GREETING=hello\nEXPOSE 8080\nLABEL org.example.kept=yes\n\
         CMD [\"/bin/sh\", \"-c\", \"sleep 600\"]\n"
    );
    let mut tar = TarBuilder::new();
    tar.file("Dockerfile", dockerfile.as_bytes(), 0o644, Ownership::ROOT)
        .unwrap();
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

fn config(engine: &Engine, image: &str) -> bollard::models::ImageConfig {
    engine
        .block_on(engine.docker.inspect_image(image))
        .unwrap()
        .config
        .unwrap()
}

#[test]
fn a_committed_bottle_starts_again_with_what_the_agent_installed() {
    let test = "a_committed_bottle_starts_again_with_what_the_agent_installed";
    let serial = crate::one_launch_at_a_time();
    let Some(engine) = crate::docker_with_demo_image(test, DEMO, &["BOTTLE_BUNDLE_BIN"]) else {
        return;
    };
    build_base(&engine);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    let pid = std::process::id();
    let mut world = World {
        dir,
        engine,
        names: Vec::new(),
        committed: format!("bottle-test-committed:{pid}"),
        _serial: serial,
    };
    world.manifest("bottle.toml", IMAGE);
    let first = format!("commit-a-{pid}");
    world.start("bottle.toml", &first);

    // The agent installs something, and bottle's CA is in its trust dir.
    world.exec(
        &first,
        "echo kept > /home/agent/note.txt && \
         printf '#!/bin/sh\\necho installed\\n' > /usr/local/bin/hello && \
         chmod +x /usr/local/bin/hello",
    );
    let trusted = world.exec(&first, "ls /etc/ssl/certs");
    let ca_files: Vec<String> = trusted.split_whitespace().map(str::to_string).collect();
    assert!(
        !ca_files.is_empty(),
        "the launch put no CA in /etc/ssl/certs"
    );

    let out = world
        .bottle("bottle.toml")
        .args(["commit", &first, &world.committed])
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!("{} sha256:", world.committed)),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("left out /etc/bottle"), "{stderr}");

    // The original image's configuration, and none of bottle's.
    let (was, now) = (
        config(&world.engine, IMAGE),
        config(&world.engine, &world.committed),
    );
    assert_eq!(now.user, was.user);
    assert_eq!(now.user.as_deref(), Some("agent"));
    assert_eq!(now.cmd, was.cmd);
    assert_eq!(now.entrypoint, was.entrypoint);
    assert_eq!(now.env, was.env);
    assert_eq!(now.working_dir, was.working_dir);
    assert_eq!(now.exposed_ports, was.exposed_ports);
    assert_eq!(now.labels, was.labels);
    for variable in now.env.iter().flatten() {
        assert!(
            bottle_core::agent::reserved(variable.split('=').next().unwrap()).is_none(),
            "bottle's {variable} is in the image"
        );
    }
    // Nothing of bottle's in its filesystem.
    let has = |path: &str| {
        bottle_docker::commit::image_has_path(&world.engine, &world.committed, path).unwrap()
    };
    assert!(has("/home/agent/note.txt"));
    assert!(!has("/etc/bottle"), "/etc/bottle is in the image");
    assert!(!has("/.bottle/pause"), "the keep-alive is in the image");
    for file in &ca_files {
        assert!(
            !has(&format!("/etc/ssl/certs/{file}")),
            "the bottle's CA /etc/ssl/certs/{file} is in the image"
        );
    }

    // The next bottle starts from it and finds what the agent installed,
    // as the image's user.
    world.manifest("next.toml", &world.committed);
    let second = format!("commit-b-{pid}");
    world.start("next.toml", &second);
    let found = world.exec(
        &second,
        "cat /home/agent/note.txt; /usr/local/bin/hello; id -u; echo \"$GREETING\"",
    );
    assert_eq!(found, "kept\ninstalled\n1000\nhello\n");

    // A name the Engine cannot tag is bad input.
    let bad = world
        .bottle("bottle.toml")
        .args(["commit", &second, "not a name"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("error[BOT-D095]"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
