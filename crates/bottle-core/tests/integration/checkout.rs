//! Working checkouts behind git-gate, with real git: the mirror a launch
//! makes, and the sync that brings the agent's pushes back as refs, with
//! no hook of the checkout run and nothing but refs touched.
//!
//! The agent's side is played by pushing straight into the mirror (what
//! git-gate's receive-pack does once the push rules pass); a compromised
//! bundle, by writing the mirror's refs with no rule at all.

#![expect(
    clippy::unwrap_used,
    reason = "helpers that set up repositories shared by tests; a failed step should panic"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bottle_core::checkout::{
    self, CheckoutPaths, Outcome, RepoKind, SYNC_RECORD_VERSION, SyncRecord, SyncReport, SyncedRepo,
};
use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use bottle_test_support::RecordingRunner;

/// Runs git in `dir` with a fixed identity, hooks left as they are (the
/// tests' own commands run the checkout's hooks: the planted ones must
/// work), and returns its stdout; a failure fails the test.
fn git(dir: &Path, args: &[&str]) -> String {
    let spec = CommandSpec::new("git")
        .args([
            "-c",
            "user.name=Operator",
            "-c",
            "user.email=op@example.com",
            "-c",
        ])
        .arg("init.defaultBranch=main")
        .arg("-C")
        .arg(dir)
        .args(args);
    let out = SystemRunner.run(&spec).unwrap();
    assert!(
        out.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        out.stderr_text()
    );
    out.stdout_text().trim().to_string()
}

/// A working checkout with one commit on `main`, a dirty file, an untracked
/// one, and hooks that would each write a marker file: in `.git/hooks` and
/// in a `core.hooksPath` of the checkout's own config.
struct Host {
    _dir: tempfile::TempDir,
    root: PathBuf,
    checkout: PathBuf,
    marker: PathBuf,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let checkout = root.join("work");
        std::fs::create_dir(&checkout).unwrap();
        git(&checkout, &["init", "-q"]);
        std::fs::write(checkout.join("README"), "hello\n").unwrap();
        git(&checkout, &["add", "README"]);
        git(&checkout, &["commit", "-qm", "first"]);
        // Now the hooks: from here on, any hook git runs leaves a marker.
        let marker = root.join("hook-ran");
        let script = format!(
            "#!/bin/sh\necho \"$0 $*\" >> {}\ncat > /dev/null\n",
            marker.display()
        );
        let own_hooks = root.join("own-hooks");
        std::fs::create_dir(&own_hooks).unwrap();
        for dir in [checkout.join(".git/hooks"), own_hooks.clone()] {
            for hook in [
                "reference-transaction",
                "post-update",
                "pre-auto-gc",
                "post-checkout",
                "post-merge",
                "post-rewrite",
            ] {
                let path = dir.join(hook);
                std::fs::write(&path, &script).unwrap();
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        git(
            &checkout,
            &["config", "core.hooksPath", own_hooks.to_str().unwrap()],
        );
        std::fs::write(checkout.join("README"), "hello, edited\n").unwrap();
        std::fs::write(checkout.join("notes.txt"), "untracked\n").unwrap();
        Host {
            _dir: dir,
            root,
            checkout,
            marker,
        }
    }

    fn hooks_ran(&self) -> Option<String> {
        std::fs::read_to_string(&self.marker).ok()
    }

    /// What must not change: the working tree's state, the index, the
    /// config, the hooks.
    fn untouched_state(&self) -> (String, Vec<u8>, String, Vec<u8>) {
        (
            git(&self.checkout, &["status", "--porcelain"]),
            std::fs::read(self.checkout.join(".git/index")).unwrap(),
            std::fs::read_to_string(self.checkout.join(".git/config")).unwrap(),
            std::fs::read(self.checkout.join(".git/hooks/reference-transaction")).unwrap(),
        )
    }

    fn head(&self, refname: &str) -> Option<String> {
        let spec = CommandSpec::new("git").arg("-C").arg(&self.checkout).args([
            "rev-parse",
            "--verify",
            "--quiet",
            refname,
        ]);
        let out = SystemRunner.run(&spec).unwrap();
        out.success().then(|| out.stdout_text().trim().to_string())
    }
}

/// A bottle's state dir with a mirror of the host's checkout and the
/// record of it, as a launch leaves them.
struct Bottle {
    state_dir: PathBuf,
    mirror: PathBuf,
    /// A clone of the mirror: the agent's working copy.
    agent: PathBuf,
}

impl Bottle {
    fn launch(host: &Host, push: &[&str], force: bool, delete: bool) -> Bottle {
        let state_dir = host.root.join("state/demo");
        let paths = CheckoutPaths::of_state_dir(&state_dir);
        std::fs::create_dir_all(&paths.dir).unwrap();
        let mirror = paths.mirror("app");
        let baseline = checkout::create_mirror(&SystemRunner, &host.checkout, &mirror).unwrap();
        checkout::write_record(
            &paths,
            &SyncRecord {
                v: SYNC_RECORD_VERSION,
                bottle: "bot-bottle-demo".into(),
                repos: vec![SyncedRepo {
                    name: "app".into(),
                    checkout: host.checkout.clone(),
                    mirror: mirror.clone(),
                    push: push.iter().map(|s| (*s).to_string()).collect(),
                    allow_force: force,
                    allow_delete: delete,
                    baseline,
                }],
            },
        )
        .unwrap();
        let agent = host.root.join("agent");
        git(
            &host.root,
            &[
                "clone",
                "-q",
                mirror.to_str().unwrap(),
                agent.to_str().unwrap(),
            ],
        );
        Bottle {
            state_dir,
            mirror,
            agent,
        }
    }

    /// The agent commits a file and pushes `refspec` into the mirror.
    fn commit_and_push(&self, file: &str, refspec: &[&str]) -> String {
        std::fs::write(self.agent.join(file), format!("{file}\n")).unwrap();
        git(&self.agent, &["add", file]);
        git(&self.agent, &["commit", "-qm", file]);
        let mut args = vec!["push", "-q", "origin"];
        args.extend_from_slice(refspec);
        git(&self.agent, &args);
        git(&self.agent, &["rev-parse", "HEAD"])
    }

    fn sync(&self) -> SyncReport {
        checkout::sync(&SystemRunner, &self.state_dir).unwrap()
    }
}

fn outcome<'a>(report: &'a SyncReport, refname: &str) -> &'a Outcome {
    &report
        .refs
        .iter()
        .find(|r| r.refname == refname)
        .unwrap_or_else(|| panic!("{refname} not in {report:?}"))
        .outcome
}

#[test]
fn the_mirror_is_bare_with_the_checkouts_refs_and_no_hooks_ran() {
    let host = Host::new();
    let before = host.untouched_state();
    let bottle = Bottle::launch(&host, &["agent/*"], false, false);
    assert_eq!(RepoKind::of_path(&host.checkout), Some(RepoKind::Checkout));
    assert_eq!(RepoKind::of_path(&bottle.mirror), Some(RepoKind::Bare));
    assert_eq!(
        git(&bottle.mirror, &["rev-parse", "refs/heads/main"]),
        host.head("refs/heads/main").unwrap()
    );
    // Neither the checkout's path nor anything of its config.
    let config = std::fs::read_to_string(bottle.mirror.join("config")).unwrap();
    assert!(!config.contains("origin"), "{config}");
    assert!(!config.contains("hooksPath"), "{config}");
    assert!(
        std::fs::read_dir(bottle.mirror.join("hooks")).is_err()
            || std::fs::read_dir(bottle.mirror.join("hooks"))
                .unwrap()
                .next()
                .is_none(),
        "the mirror has hooks"
    );
    // Objects are copies, never links to the checkout's files (the agent's
    // own clone of the mirror may link to the mirror's).
    use std::os::unix::fs::MetadataExt as _;
    let inodes = |dir: &Path| -> std::collections::BTreeSet<u64> {
        walk(dir)
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().ino())
            .collect()
    };
    let shared: Vec<u64> = inodes(&bottle.mirror.join("objects"))
        .intersection(&inodes(&host.checkout.join(".git/objects")))
        .copied()
        .collect();
    assert!(shared.is_empty(), "hard-linked to the checkout: {shared:?}");
    assert_eq!(host.untouched_state(), before);
    assert_eq!(host.hooks_ran(), None);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn an_allowed_push_lands_as_a_ref_and_nothing_else_of_the_checkout_changes() {
    let host = Host::new();
    let bottle = Bottle::launch(&host, &["agent/*"], false, false);
    let before = host.untouched_state();
    let pushed = bottle.commit_and_push("fix.txt", &["HEAD:refs/heads/agent/x"]);
    let report = bottle.sync();
    assert_eq!(outcome(&report, "refs/heads/agent/x"), &Outcome::Landed);
    assert_eq!(host.head("refs/heads/agent/x"), Some(pushed.clone()));
    // Plain git reads it: the operator reviews with log and diff.
    assert_eq!(
        git(&host.checkout, &["log", "--format=%s", "main..agent/x"]),
        "fix.txt"
    );
    assert_eq!(host.untouched_state(), before);
    assert!(!host.checkout.join("fix.txt").exists());
    assert_eq!(host.hooks_ran(), None, "a hook of the checkout ran");
    // Nothing new: nothing to do, and the record remembers the value.
    assert!(bottle.sync().is_empty());
    // The agent pushes again: a fast-forward lands.
    let again = bottle.commit_and_push("more.txt", &["HEAD:refs/heads/agent/x"]);
    assert_eq!(
        outcome(&bottle.sync(), "refs/heads/agent/x"),
        &Outcome::Landed
    );
    assert_eq!(host.head("refs/heads/agent/x"), Some(again));
    assert_eq!(host.hooks_ran(), None, "a hook of the checkout ran");
}

#[test]
fn refs_outside_the_rules_never_land_even_when_the_mirror_has_them() {
    let host = Host::new();
    let bottle = Bottle::launch(&host, &["agent/*"], false, false);
    let main = host.head("refs/heads/main").unwrap();
    // A compromised bundle writes the mirror directly: main, a tag, a
    // branch outside the globs.
    let pushed = bottle.commit_and_push(
        "evil.txt",
        &[
            "HEAD:refs/heads/main",
            "HEAD:refs/tags/v9",
            "HEAD:refs/heads/other",
        ],
    );
    let report = bottle.sync();
    for refname in ["refs/heads/main", "refs/tags/v9", "refs/heads/other"] {
        assert!(
            matches!(outcome(&report, refname), Outcome::Kept(why) if why.starts_with("outside the push rules")),
            "{refname}: {report:?}"
        );
    }
    assert_eq!(host.head("refs/heads/main"), Some(main));
    assert_eq!(host.head("refs/tags/v9"), None);
    assert_eq!(host.head("refs/heads/other"), None);
    assert_ne!(host.head("refs/heads/main"), Some(pushed));
    // Said once, not at every sync.
    assert!(bottle.sync().is_empty());
    assert_eq!(host.hooks_ran(), None);
}

#[test]
fn a_rewind_needs_allow_force_and_never_overwrites_the_operators_move() {
    let host = Host::new();
    let bottle = Bottle::launch(&host, &["agent/*"], false, false);
    let first = bottle.commit_and_push("a.txt", &["HEAD:refs/heads/agent/x"]);
    bottle.sync();
    // The agent rewrites its branch in the mirror (as a compromised bundle
    // could without allow_force).
    git(&bottle.agent, &["reset", "-q", "--hard", "HEAD~1"]);
    let rewritten = bottle.commit_and_push("b.txt", &["+HEAD:refs/heads/agent/x"]);
    let report = bottle.sync();
    assert!(
        matches!(outcome(&report, "refs/heads/agent/x"), Outcome::Kept(why) if why.contains("allow_force is off")),
        "{report:?}"
    );
    assert_eq!(host.head("refs/heads/agent/x"), Some(first.clone()));

    // With allow_force, the same rewrite lands, while the operator has not
    // moved the ref.
    let host = Host::new();
    let bottle = Bottle::launch(&host, &["agent/*"], true, false);
    bottle.commit_and_push("a.txt", &["HEAD:refs/heads/agent/x"]);
    bottle.sync();
    git(&bottle.agent, &["reset", "-q", "--hard", "HEAD~1"]);
    let rewritten_ok = bottle.commit_and_push("b.txt", &["+HEAD:refs/heads/agent/x"]);
    assert_eq!(
        outcome(&bottle.sync(), "refs/heads/agent/x"),
        &Outcome::Landed
    );
    assert_eq!(host.head("refs/heads/agent/x"), Some(rewritten_ok));

    // The operator commits on the agent's branch; the agent, not knowing,
    // pushes over it: even with allow_force the operator's commit stays.
    git(&host.checkout, &["branch", "-q", "-f", "review", "agent/x"]);
    let operator = {
        let spec = CommandSpec::new("git")
            .args([
                "-c",
                "user.name=Operator",
                "-c",
                "user.email=op@example.com",
            ])
            .arg("-C")
            .arg(&host.checkout)
            .args([
                "commit-tree",
                "-p",
                "agent/x",
                "-m",
                "operator's",
                "agent/x^{tree}",
            ]);
        SystemRunner
            .run(&spec)
            .unwrap()
            .stdout_text()
            .trim()
            .to_string()
    };
    git(
        &host.checkout,
        &["update-ref", "refs/heads/agent/x", &operator],
    );
    git(&bottle.agent, &["reset", "-q", "--hard", "HEAD~1"]);
    bottle.commit_and_push("c.txt", &["+HEAD:refs/heads/agent/x"]);
    let report = bottle.sync();
    assert!(
        matches!(outcome(&report, "refs/heads/agent/x"), Outcome::Kept(why) if why.contains("operator moved it")),
        "{report:?}"
    );
    assert_eq!(host.head("refs/heads/agent/x"), Some(operator));
    let _ = rewritten;
}

#[test]
fn a_checked_out_branch_and_a_deletion_without_allow_delete_stay() {
    let host = Host::new();
    let bottle = Bottle::launch(&host, &["agent/*", "main"], false, false);
    let main = host.head("refs/heads/main").unwrap();
    // main is the checkout's HEAD: a push to it (allowed here) is not
    // written under the operator's working tree.
    let pushed = bottle.commit_and_push("m.txt", &["HEAD:refs/heads/main"]);
    let report = bottle.sync();
    assert!(
        matches!(outcome(&report, "refs/heads/main"), Outcome::Kept(why) if why.contains("checked out")),
        "{report:?}"
    );
    assert_eq!(host.head("refs/heads/main"), Some(main));
    // Its commit is in the checkout's objects, for the operator to merge.
    git(&host.checkout, &["cat-file", "-e", &pushed]);

    bottle.commit_and_push("x.txt", &["HEAD:refs/heads/agent/x"]);
    bottle.sync();
    let kept = host.head("refs/heads/agent/x");
    git(
        &bottle.agent,
        &["push", "-q", "origin", ":refs/heads/agent/x"],
    );
    let report = bottle.sync();
    assert!(
        matches!(outcome(&report, "refs/heads/agent/x"), Outcome::Kept(why) if why.contains("allow_delete")),
        "{report:?}"
    );
    assert_eq!(host.head("refs/heads/agent/x"), kept);
    assert_eq!(host.hooks_ran(), None);
}

#[test]
fn a_bottle_without_a_record_syncs_nothing_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let runner = RecordingRunner::refusing();
    let report = checkout::sync(&runner, dir.path()).unwrap();
    assert!(report.is_empty());
    assert!(runner.calls().is_empty());
}

#[test]
fn every_git_command_runs_without_hooks_or_the_callers_repository_variables() {
    let (checkout_dir, mirror) = (Path::new("/srv/work"), Path::new("/state/demo/git/app.git"));
    let clone = checkout::mirror_clone(checkout_dir, mirror);
    assert_eq!(
        clone.argv(),
        [
            "git",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
            "-c",
            "protocol.file.allow=always",
            "-C",
            "/state/demo/git",
            "clone",
            "--bare",
            "--no-hardlinks",
            "--quiet",
            "--template=",
            "--",
            "/srv/work",
            "/state/demo/git/app.git",
        ]
    );
    let fetch = checkout::fetch_objects(checkout_dir, mirror, &["refs/heads/agent/x"]);
    assert_eq!(
        fetch.argv()[9..],
        [
            "-C",
            "/srv/work",
            "-c",
            "fetch.fsckObjects=true",
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-recurse-submodules",
            "--no-prune",
            "--",
            "/state/demo/git/app.git",
            "refs/heads/agent/x",
        ]
    );
    for spec in [
        clone,
        fetch,
        checkout::list_mirror_refs(checkout_dir, mirror),
        checkout::list_worktrees(checkout_dir),
        checkout::is_ancestor(checkout_dir, "a", "b"),
    ] {
        assert_eq!(spec.argv()[1..3], ["-c", "core.hooksPath=/dev/null"]);
        for variable in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_CONFIG_PARAMETERS",
        ] {
            assert!(
                spec.env_removed.contains(std::ffi::OsStr::new(variable)),
                "{variable} is passed to {:?}",
                spec.argv()
            );
        }
        assert!(spec.timeout.is_some());
    }

    // The sequence one sync runs for one push, in the checkout: the
    // mirror's refs, the checkout's, the worktrees, the objects, the CAS.
    let dir = tempfile::tempdir().unwrap();
    let paths = CheckoutPaths::of_state_dir(dir.path());
    std::fs::create_dir_all(paths.mirror("app")).unwrap();
    std::fs::write(paths.mirror("app").join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let (a, b) = ("a".repeat(40), "b".repeat(40));
    checkout::write_record(
        &paths,
        &SyncRecord {
            v: SYNC_RECORD_VERSION,
            bottle: "bot-bottle-demo".into(),
            repos: vec![SyncedRepo {
                name: "app".into(),
                checkout: checkout_dir.into(),
                mirror: paths.mirror("app"),
                push: vec!["agent/*".into()],
                allow_force: false,
                allow_delete: false,
                baseline: BTreeMap::from([("refs/heads/main".to_string(), a.clone())]),
            }],
        },
    )
    .unwrap();
    let listing = format!("{a}\trefs/heads/main\n{b}\trefs/heads/agent/x\n");
    let runner = RecordingRunner::with(move |spec| {
        let argv = spec.argv();
        let stdout = if argv.contains(&"ls-remote".to_string()) {
            listing.clone()
        } else {
            String::new()
        };
        Ok(bottle_core::exec::CommandOutput {
            code: Some(0),
            stdout: stdout.into_bytes(),
            stderr: Vec::new(),
        })
    });
    let report = checkout::sync(&runner, dir.path()).unwrap();
    assert_eq!(
        outcome(&report, "refs/heads/agent/x"),
        &Outcome::Landed,
        "{report:?}"
    );
    let verbs: Vec<String> = runner
        .calls()
        .iter()
        .map(|argv| {
            let at = argv.iter().position(|a| a == "-C").unwrap() + 2;
            let mut rest = argv[at..].iter();
            loop {
                match rest.next().map(String::as_str) {
                    Some("-c") => {
                        rest.next();
                    }
                    Some(verb) => break verb.to_string(),
                    None => break String::new(),
                }
            }
        })
        .collect();
    assert_eq!(
        verbs,
        [
            "ls-remote",
            "for-each-ref",
            "worktree",
            "fetch",
            "update-ref"
        ]
    );
    let update = runner.specs().pop().unwrap();
    assert_eq!(
        String::from_utf8(update.stdin.unwrap()).unwrap(),
        format!("create refs/heads/agent/x {b}\n")
    );
}
