//! `bottle cp` on a real docker bottle: a copy in lands owned by the agent
//! with the host's times; through a link the agent planted (to
//! `/etc/bottle`, to `/.bottle`, above or below the destination) it is
//! refused and nothing bottle owns changes, while the same copy to a plain
//! directory works; a tree comes out whole, and an archive with a link out
//! of it comes out as nothing. The agent's container runs again after
//! every copy, refused or not.

use std::path::Path;

use bottle_core::copy::host::{self, HostTarget};
use bottle_core::copy::{ArchiveSource, CopyIn, GuestPath};

use crate::support::{self, name, sh};

fn guest(path: &str) -> GuestPath {
    GuestPath::parse(path).unwrap()
}

/// What bottle owns in the box, as the agent sees it: every file's name,
/// mode, owner, size, time and content hash.
fn owned_state(bottle: &dyn bottle_core::Bottle) -> String {
    let out = sh(
        bottle,
        "find /etc/bottle /.bottle | sort | while read -r f; do stat -c '%n %a %u %s %Y' \"$f\"; [ -f \"$f\" ] && [ -r \"$f\" ] && sha256sum \"$f\"; done",
    );
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn container_state(fx: &support::Fixture, container: &str) -> String {
    let engine = fx.backend.engine().unwrap();
    let inspect = engine
        .block_on(engine.docker.inspect_container(container, None))
        .unwrap();
    inspect
        .state
        .and_then(|s| s.status)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

fn set_mtime(path: &Path, secs: u64) {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let file = std::fs::File::open(path).unwrap();
    file.set_times(std::fs::FileTimes::new().set_modified(when))
        .unwrap();
}

#[test]
fn cp_keeps_times_gives_the_agent_its_files_and_never_follows_a_planted_link() {
    let Some(fx) =
        support::setup("cp_keeps_times_gives_the_agent_its_files_and_never_follows_a_planted_link")
    else {
        return;
    };
    let name = name("cp");
    let (guard, bottle) = fx.start(&name);
    let container = format!("bot-bottle-{name}-agent");

    // A host tree with known times and an executable.
    let proj = fx.dir.path().join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::write(proj.join("sub/notes.md"), "notes\n").unwrap();
    std::fs::write(proj.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(proj.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    set_mtime(&proj.join("sub/notes.md"), 1_600_000_000);
    set_mtime(&proj.join("run.sh"), 1_600_000_100);
    set_mtime(&proj.join("sub"), 1_600_000_200);

    let copy = CopyIn::from_host(&proj).unwrap();
    bottle.copy_in(&copy, &guest("/home/agent")).unwrap();
    let stat = sh(
        &*bottle,
        "cd /home/agent && stat -c '%n %U %a %Y' proj/run.sh proj/sub/notes.md proj/sub && ./proj/run.sh",
    );
    assert_eq!(
        String::from_utf8(stat.stdout).unwrap(),
        "proj/run.sh agent 755 1600000100\nproj/sub/notes.md agent 644 1600000000\nproj/sub agent 755 1600000200\nran\n",
        "{}",
        String::from_utf8_lossy(&stat.stderr)
    );
    assert_eq!(container_state(&fx, &container), "running");

    // Docker's rules: to a new name, and over a file.
    let notes = proj.join("sub/notes.md");
    let one = CopyIn::from_host(&notes).unwrap();
    bottle
        .copy_in(&one, &guest("/home/agent/renamed.md"))
        .unwrap();
    bottle
        .copy_in(&one, &guest("/home/agent/renamed.md"))
        .unwrap();
    let cat = sh(&*bottle, "cat /home/agent/renamed.md");
    assert_eq!(cat.stdout, b"notes\n");

    // The agent plants links: to what bottle owns, above a destination,
    // and inside a tree an operator copies into again.
    let planted = sh(
        &*bottle,
        "cd /home/agent && ln -s /etc/bottle drop && ln -s /.bottle bin && ln -s /etc up \
         && mkdir -p again/proj && ln -s /etc/bottle again/proj/sub && mkdir plain",
    );
    assert_eq!(
        planted.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&planted.stderr)
    );
    let before = owned_state(&*bottle);
    assert!(before.contains("/etc/bottle/mcp.json"), "{before}");

    let mcp = fx.dir.path().join("mcp.json");
    std::fs::write(&mcp, "{\"planted\": true}\n").unwrap();
    let toolbox = fx.dir.path().join("pause");
    std::fs::write(&toolbox, "#!/bin/sh\necho owned\n").unwrap();
    let mcp_copy = CopyIn::from_host(&mcp).unwrap();
    for (copy, dest, link) in [
        (&mcp_copy, "/home/agent/drop", "/home/agent/drop"),
        (&mcp_copy, "/home/agent/drop/mcp.json", "/home/agent/drop"),
        (
            &CopyIn::from_host(&toolbox).unwrap(),
            "/home/agent/bin",
            "/home/agent/bin",
        ),
        (&mcp_copy, "/home/agent/up/bottle", "/home/agent/up"),
        (&copy, "/home/agent/again", "/home/agent/again/proj/sub"),
    ] {
        let err = bottle.copy_in(copy, &guest(dest)).unwrap_err();
        assert_eq!(err.code, "BOT-F003", "{dest}: {err}");
        assert_eq!(
            err.kind,
            bottle_core::backend::BackendErrorKind::IsolationUnconfirmed
        );
        assert!(err.message.contains(link), "{dest}: {err}");
        assert_eq!(container_state(&fx, &container), "running", "{dest}");
    }
    // Named outright, what bottle owns is refused too.
    for dest in ["/etc/bottle", "/.bottle", "/etc/bottle/skills"] {
        let err = bottle.copy_in(&mcp_copy, &guest(dest)).unwrap_err();
        assert_eq!(err.code, "BOT-F002", "{dest}: {err}");
    }
    assert_eq!(owned_state(&*bottle), before, "nothing bottle owns changed");

    // The control: the same copies to a plain directory land.
    bottle
        .copy_in(&mcp_copy, &guest("/home/agent/plain"))
        .unwrap();
    bottle.copy_in(&copy, &guest("/home/agent/plain")).unwrap();
    let landed = sh(
        &*bottle,
        "cat /home/agent/plain/mcp.json; stat -c %U /home/agent/plain/proj/sub/notes.md",
    );
    assert_eq!(
        String::from_utf8(landed.stdout).unwrap(),
        "{\"planted\": true}\nagent\n"
    );

    // Out: the tree comes out whole, with its times, owned by us.
    let out = tempfile::tempdir().unwrap();
    let from = ArchiveSource::Bottle(bottle.name().to_string());
    let receive = |path: &str, dest: &Path| {
        let path = guest(path);
        let target = HostTarget::resolve(dest, path.file_name().unwrap()).unwrap();
        let mut archive = Vec::new();
        bottle.copy_out(&path, &mut archive)?;
        host::receive(archive.as_slice(), &from, &target, 1 << 30, None)
            .and_then(host::Received::commit)
            .map_err(Into::into)
    };
    let at: Result<_, bottle_core::BackendError> = receive("/home/agent/proj", out.path());
    let at = at.unwrap();
    assert_eq!(
        std::fs::read_to_string(at.join("sub/notes.md")).unwrap(),
        "notes\n"
    );
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(at.join("sub/notes.md")).unwrap();
    assert_eq!(meta.mtime(), 1_600_000_000);
    assert_eq!(meta.uid(), nix::unistd::getuid().as_raw());

    // A link out of the tree: refused, nothing written.
    let hostile = sh(
        &*bottle,
        "mkdir -p /home/agent/out && echo data > /home/agent/out/data && ln -s /etc/passwd /home/agent/out/abs",
    );
    assert_eq!(hostile.exit_code, 0);
    let empty = tempfile::tempdir().unwrap();
    let err = receive("/home/agent/out", empty.path()).unwrap_err();
    assert_eq!(err.code, "BOT-F010", "{err}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
    // A path that is not there.
    let err = receive("/home/agent/nothing", empty.path()).unwrap_err();
    assert_eq!(err.code, "BOT-F004", "{err}");
    assert_eq!(container_state(&fx, &container), "running");

    // The race the pause closes: the agent swaps a directory for a link to
    // /etc/bottle and back as fast as it can while the operator copies
    // into it. Each copy sees a directory (and lands in it) or a link (and
    // is refused); none lands in /etc/bottle.
    let racing = sh(
        &*bottle,
        "cd /home/agent && (while [ ! -e stop-racing ]; do rm -rf race; mkdir race; rm -rf race; ln -s /etc/bottle race; done) </dev/null >/dev/null 2>&1 &",
    );
    assert_eq!(racing.exit_code, 0);
    bottle_test_support::wait_until(
        "the agent's swapping loop to run",
        std::time::Duration::from_secs(20),
        || sh(&*bottle, "ls -d /home/agent/race").exit_code == 0,
    );
    let probe = fx.dir.path().join("race-probe.txt");
    std::fs::write(&probe, "raced\n").unwrap();
    let probe = CopyIn::from_host(&probe).unwrap();
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..60 {
        let code = match bottle.copy_in(&probe, &guest("/home/agent/race")) {
            Ok(()) => "landed",
            Err(err) => err.code,
        };
        *outcomes.entry(code).or_insert(0) += 1;
    }
    sh(&*bottle, "touch /home/agent/stop-racing");
    let leaked = sh(
        &*bottle,
        "ls /etc/bottle; cat /etc/bottle/race-probe.txt 2>&1",
    );
    assert!(
        !String::from_utf8_lossy(&leaked.stdout).contains("raced"),
        "a copy went through the link: {outcomes:?}"
    );
    assert!(
        outcomes
            .keys()
            .all(|code| ["landed", "BOT-F003", "BOT-F004", "BOT-F005"].contains(code)),
        "{outcomes:?}"
    );
    assert_eq!(owned_state(&*bottle), before, "nothing bottle owns changed");
    assert_eq!(container_state(&fx, &container), "running");
    eprintln!("raced copies: {outcomes:?}");

    drop(bottle);
    drop(guard);
}
