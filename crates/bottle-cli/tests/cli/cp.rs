//! `bottle cp` through the real binary on a docker bottle: both ways, with
//! `docker cp`'s argument shapes (a tar on stdin and on stdout), each
//! refusal with its code, exit code and fix, and nothing left behind.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image) and
//! `BOTTLE_BUNDLE_BIN`; skips with a line unless `BOTTLE_REQUIRE_DOCKER=1`.
//! The same against the microVM backend is in `smolmachines.rs`.

use std::path::Path;

use predicates::prelude::*;

use crate::bottle;

const IMAGE: &str = "bottle-demo-agent:cli-cp";

/// Stops the test's bottle however the test ends.
struct World {
    dir: tempfile::TempDir,
    name: String,
}

impl World {
    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.dir.path().join("state"));
        cmd.arg("--manifest")
            .arg(self.dir.path().join("bottle.toml"))
            .args(["--backend", "docker"]);
        cmd
    }

    fn exec(&self, script: &str) -> String {
        let out = self
            .bottle()
            .args(["exec", &self.name, "--", "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn at(&self, path: &str) -> String {
        format!("{}:{path}", self.name)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.bottle().args(["stop", &self.name]).output();
        // The stop's finisher removes the bundle and the state dir; wait for
        // it before the state root goes with the temp dir, or it finds no
        // record and leaves the bundle running.
        let state_dir = self.dir.path().join("state/bottle").join(&self.name);
        let gone = bottle_test_support::eventually(std::time::Duration::from_secs(60), || {
            !state_dir.exists()
        });
        if !gone {
            let _ = self.bottle().args(["--yes", "cleanup"]).output();
        }
    }
}

/// Every name under `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        builder.append_data(&mut header, name, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn cp_goes_both_ways_and_refuses_what_a_hostile_box_plants() {
    let test = "cp_goes_both_ways_and_refuses_what_a_hostile_box_plants";
    let _serial = crate::one_launch_at_a_time();
    let Some(_engine) = crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN"]) else {
        return;
    };
    let world = World {
        dir: tempfile::tempdir().unwrap(),
        name: format!("cp-{}", std::process::id()),
    };
    std::fs::write(
        world.dir.path().join("bottle.toml"),
        format!(
            "[agents.coder]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\"]\n\n[agents.coder.egress]\nallow = [\"api.example.com\"]\n"
        ),
    )
    .unwrap();
    world
        .bottle()
        .args(["start", "coder", "--name", &world.name, "--yes", "--detach"])
        .assert()
        .success();

    // In: a host tree, keeping its times, owned by the agent.
    let proj = world.dir.path().join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::write(proj.join("sub/a.txt"), "alpha\n").unwrap();
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_650_000_000);
    std::fs::File::options()
        .write(true)
        .open(proj.join("sub/a.txt"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    world
        .bottle()
        .args(["cp"])
        .arg(&proj)
        .arg(world.at("/home/agent"))
        .assert()
        .success();
    assert_eq!(
        world.exec("stat -c '%U %Y' /home/agent/proj/sub/a.txt"),
        "agent 1650000000\n"
    );
    // A tar on stdin, into a directory.
    world
        .bottle()
        .args(["cp", "-", &world.at("/home/agent/proj")])
        .write_stdin(tar_of(&[("from-stdin.txt", b"piped\n")]))
        .assert()
        .success();
    assert_eq!(world.exec("cat /home/agent/proj/from-stdin.txt"), "piped\n");

    // Out: to a directory, to a new name, and as a tar on stdout.
    let out = world.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    world
        .bottle()
        .args(["cp", &world.at("/home/agent/proj"), out.to_str().unwrap()])
        .assert()
        .success();
    assert_eq!(
        std::fs::read_to_string(out.join("proj/sub/a.txt")).unwrap(),
        "alpha\n"
    );
    world
        .bottle()
        .args(["cp", &world.at("/home/agent/proj/sub/a.txt")])
        .arg(out.join("renamed.txt"))
        .assert()
        .success();
    assert_eq!(
        std::fs::read_to_string(out.join("renamed.txt")).unwrap(),
        "alpha\n"
    );
    let tar = world
        .bottle()
        .args(["cp", &world.at("/home/agent/proj/sub"), "-"])
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

    // The agent plants links: into what bottle owns, and out of a tree.
    world.exec(
        "cd /home/agent && ln -s /etc/bottle drop && ln -s /.bottle bin \
         && mkdir hostile && echo x > hostile/data && ln -s /etc/passwd hostile/abs \
         && mkdir fifo && mkfifo fifo/pipe",
    );
    let before = world.exec("ls -la /etc/bottle /.bottle; cat /etc/bottle/mcp.json");
    let mcp = world.dir.path().join("mcp.json");
    std::fs::write(&mcp, "{}\n").unwrap();
    for dest in ["/home/agent/drop", "/home/agent/bin", "/home/agent/drop/x"] {
        world
            .bottle()
            .args(["cp"])
            .arg(&mcp)
            .arg(world.at(dest))
            .assert()
            .code(5)
            .stderr(
                predicate::str::contains("error[BOT-F003]")
                    .and(predicate::str::contains("never follows a link"))
                    .and(predicate::str::contains("fix:")),
            );
    }
    world
        .bottle()
        .args(["cp"])
        .arg(&mcp)
        .arg(world.at("/etc/bottle"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-F002]"));
    assert_eq!(
        world.exec("ls -la /etc/bottle /.bottle; cat /etc/bottle/mcp.json"),
        before
    );

    let empty = world.dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (path, why) in [
        ("/home/agent/hostile", "outside the copy"),
        ("/home/agent/fifo", "fifo"),
    ] {
        world
            .bottle()
            .args(["cp", &world.at(path), empty.to_str().unwrap()])
            .assert()
            .code(5)
            .stderr(predicate::str::contains("error[BOT-F010]").and(predicate::str::contains(why)));
        world
            .bottle()
            .args(["cp", &world.at(path), "-"])
            .assert()
            .code(5)
            .stdout(predicate::str::is_empty());
    }
    assert_eq!(
        names(&empty),
        Vec::<String>::new(),
        "nothing was left behind"
    );

    // The bound, and a destination that exists.
    world
        .bottle()
        .args(["cp", "--max-size", "2k", &world.at("/home/agent/proj")])
        .arg(&empty)
        .assert()
        .code(5)
        .stderr(
            predicate::str::contains("error[BOT-F011]").and(predicate::str::contains("--max-size")),
        );
    world
        .bottle()
        .args(["cp", &world.at("/home/agent/proj"), out.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-F020]"));
    assert_eq!(names(&empty), Vec::<String>::new());
    assert_eq!(names(&out), ["proj", "renamed.txt"]);

    // Neither side a bottle.
    world
        .bottle()
        .args(["cp", "a", "b"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-C006]"));
}
