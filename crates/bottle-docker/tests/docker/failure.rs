//! Unwinding: a failure at any launch step leaves nothing behind, and
//! `cleanup` removes what a killed launch left.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use bottle_core::launch_steps::LaunchStep as _;
use bottle_core::life::{BottleRecord, StateDir};
use bottle_core::process::Owner;
use bottle_core::{BackendKind, BottleBackend, BottleLauncher};
use bottle_docker::data::{self, StatePaths};
use bottle_docker::names::{EGRESS_NETWORK, owner_from_labels};
use bottle_test_support::wait_until;

use crate::support::{self, all_bottle_resources, name, resources_of};

#[test]
fn every_failed_step_unwinds_everything() {
    let Some(fx) = support::setup("every_failed_step_unwinds_everything") else {
        return;
    };
    for step in bottle_docker::Step::ALL.iter().map(|step| step.name()) {
        let mut options = fx.backend.options().clone();
        options.failpoint = Some(step.to_string());
        let backend = bottle_docker::DockerBackend::new(options).unwrap();
        let name = name(&format!("fail-{step}"));
        let spec = fx.spec(&name);
        let guard = support::Guard {
            backend: &fx.backend,
            name: spec.name.clone(),
        };
        let plan = backend.prepare(&spec).unwrap();
        let err = backend
            .launch(&plan)
            .err()
            .unwrap_or_else(|| panic!("{step}: launch succeeded"));
        assert_eq!(err.code, "BOT-D060", "{step}: {err}");
        assert!(err.message.contains(step), "{step}: {err}");
        assert_eq!(
            resources_of(&fx.backend, &name),
            Vec::<String>::new(),
            "{step}: resources left behind"
        );
        assert!(!spec.state_dir.exists(), "{step}: state dir left behind");
        drop(guard);
    }
    let (containers, networks) = all_bottle_resources(&fx.backend);
    assert!(containers.is_empty(), "{containers:?}");
    // The shared egress network may outlive its last bottle (a stop keeps
    // it for the next launch); nothing of these launches is left.
    assert!(networks.iter().all(|n| n == EGRESS_NETWORK), "{networks:?}");
}

#[test]
fn unknown_failpoints_are_refused() {
    let mut options = bottle_docker::DockerOptions::new("/tmp/bottle-unused-state");
    options.failpoint = Some("bundle-strat".into());
    let err = bottle_docker::DockerBackend::new(options).unwrap_err();
    assert_eq!(err.code, "BOT-D061");
    assert!(err.message.contains("bundle-start"), "{err}");
}

/// The `launch` example, built by `cargo test` next to this test binary.
fn launch_example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("launch");
    assert!(
        path.is_file(),
        "{} missing: run the tests with cargo test",
        path.display()
    );
    path
}

#[test]
fn cleanup_removes_the_orphan_of_a_killed_launch() {
    let Some(fx) = support::setup("cleanup_removes_the_orphan_of_a_killed_launch") else {
        return;
    };
    let name = name("orphan");
    let _guard = support::Guard {
        backend: &fx.backend,
        name: format!("bot-bottle-{name}"),
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "the test needs a real owner process to kill mid-launch"
    )]
    let mut child = std::process::Command::new(launch_example())
        .args([
            fx.manifest().to_str().unwrap(),
            "demo",
            &name,
            fx.state.path().to_str().unwrap(),
        ])
        .env("BOTTLE_FAILPOINT", "agent-start:sleep")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let agent = format!("bot-bottle-{name}-agent");
    wait_until(
        "the child to start the agent",
        Duration::from_secs(90),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the launching child exited early"
            );
            let engine = fx.backend.engine().unwrap();
            engine
                .block_on(engine.docker.inspect_container(&agent, None))
                .ok()
                .and_then(|c| c.state)
                .and_then(|s| s.running)
                == Some(true)
        },
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        resources_of(&fx.backend, &name).len(),
        3,
        "the orphan should be there"
    );

    // Another install on this host (another state root) neither lists nor
    // removes this install's orphan.
    let other_root = bottle_test_support::temp_state_root();
    let mut options = bottle_docker::DockerOptions::new(other_root.path());
    options.bundle_bin = fx.backend.options().bundle_bin.clone();
    let other = bottle_docker::DockerBackend::new(options).unwrap();
    let listed = other.cleanup_plan().unwrap();
    assert!(
        !listed
            .iter()
            .any(|item| item.name == format!("bot-bottle-{name}")),
        "{listed:?}"
    );
    other.cleanup_orphans().unwrap();
    assert_eq!(
        resources_of(&fx.backend, &name).len(),
        3,
        "another install's cleanup removed this install's orphan"
    );
    // This install's lists it, and removes it only once approved.
    let listed = fx.backend.cleanup_plan().unwrap();
    assert!(
        listed
            .iter()
            .any(|item| item.kind == "bottle" && item.name == format!("bot-bottle-{name}")),
        "{listed:?}"
    );
    assert!(fx.backend.cleanup_approved(&[]).unwrap().removed.is_empty());
    assert_eq!(resources_of(&fx.backend, &name).len(), 3);

    // A live owner's bottle is left alone (this test process owns nothing
    // here, so launch one that it does own).
    let (_live_guard, live) = fx.start(&support::name("orphan-live"));

    let report = fx.backend.cleanup_orphans().unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(
        report.removed.contains(&format!("container {agent}")),
        "{:?}",
        report.removed
    );
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
    assert!(!fx.state.path().join(&name).exists());
    assert_eq!(
        support::sh(&*live, "echo alive").stdout,
        b"alive\n",
        "cleanup touched a bottle whose owner lives"
    );
    fx.backend.stop(live.name()).unwrap();

    let (containers, networks) = all_bottle_resources(&fx.backend);
    assert!(containers.is_empty(), "{containers:?}");
    // With no bottle left, cleanup removes the shared egress network too.
    assert!(fx.backend.cleanup_orphans().unwrap().failed.is_empty());
    let (_, networks_after) = all_bottle_resources(&fx.backend);
    assert!(
        networks_after.is_empty(),
        "{networks:?} -> {networks_after:?}"
    );
}

#[test]
fn detached_bottles_outlive_their_launcher() {
    let Some(fx) = support::setup("detached_bottles_outlive_their_launcher") else {
        return;
    };
    let name = name("detached");
    let _guard = support::Guard {
        backend: &fx.backend,
        name: format!("bot-bottle-{name}"),
    };
    // `bottle start --detach`: the launching process exits once it is up.
    #[expect(
        clippy::disallowed_methods,
        reason = "the launcher must be a process that exits"
    )]
    let status = std::process::Command::new(launch_example())
        .args([
            fx.manifest().to_str().unwrap(),
            "demo",
            &name,
            fx.state.path().to_str().unwrap(),
            "--detach",
        ])
        .env_remove("BOTTLE_FAILPOINT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let agent = format!("bot-bottle-{name}-agent");
    let labels = support::inspect(&fx.backend, &agent)
        .config
        .unwrap()
        .labels
        .unwrap();
    assert_eq!(labels["bottle.detached"], "1");
    let owner = owner_from_labels(&labels).unwrap();
    assert!(!owner.is_alive(), "the launcher should be gone");

    let report = fx.backend.cleanup_orphans().unwrap();
    assert!(
        !report.removed.iter().any(|l| l.contains(&name)),
        "cleanup removed a detached bottle: {:?}",
        report.removed
    );
    let bottle = fx.backend.attach(&name).unwrap();
    assert_eq!(support::sh(&*bottle, "echo up").stdout, b"up\n");
    let report = fx.backend.stop(bottle.name()).unwrap();
    assert!(report.removed.contains(&format!("container {agent}")));
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
}

#[test]
fn a_declined_plan_leaves_nothing_and_cleanup_removes_an_abandoned_stage() {
    let Some(fx) =
        support::setup("a_declined_plan_leaves_nothing_and_cleanup_removes_an_abandoned_stage")
    else {
        return;
    };
    let declined = name("declined");
    let spec = fx.spec(&declined);
    let plan = fx.backend.prepare(&spec).unwrap();
    // Prepared, not confirmed: no state dir, no CA key, nothing in Docker.
    assert!(
        !spec.state_dir.exists(),
        "a prepared plan wrote its state dir"
    );
    assert_eq!(resources_of(&fx.backend, &declined), Vec::<String>::new());
    // A launch killed after writing its stage and before creating anything
    // in Docker leaves what this writes.
    let paths = StatePaths::new(&spec.state_dir);
    let record = StateDir::new(&spec.state_dir);
    let mut launching = BottleRecord::launching(&plan.bottle, &plan.agent, BackendKind::Docker);
    record.begin(&launching).unwrap();
    data::write_plan(&paths, &plan).unwrap();
    data::write_file(&paths.ca_key(), b"key", 0o600).unwrap();
    // While its owner (this process) lives, the stage stays.
    fx.backend.cleanup_orphans().unwrap();
    assert!(paths.plan().is_file());
    // The owner is gone: a PID above the kernel's maximum is never alive.
    launching.owner = Owner {
        pid: 4_194_305,
        start: 1,
    };
    record.begin(&launching).unwrap();
    let report = fx.backend.cleanup_orphans().unwrap();
    assert!(
        report
            .removed
            .contains(&format!("state dir {}", spec.state_dir.display())),
        "{:?}",
        report.removed
    );
    assert!(!spec.state_dir.exists());
    // A directory that is not a docker stage is never removed.
    let foreign = fx.state.path().join("not-a-bottle");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("plan.json"), "{}").unwrap();
    fx.backend.cleanup_orphans().unwrap();
    assert!(foreign.join("plan.json").exists());
}

#[test]
fn the_orphan_child_reports_its_launch() {
    // The example launches and stops a bottle on its own; this is its
    // happy path, so the orphan test above cannot pass by accident of the
    // child never getting anywhere.
    let Some(fx) = support::setup("the_orphan_child_reports_its_launch") else {
        return;
    };
    let name = name("child");
    let _guard = support::Guard {
        backend: &fx.backend,
        name: format!("bot-bottle-{name}"),
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "runs the example binary as a real launcher process"
    )]
    let mut child = std::process::Command::new(launch_example())
        .args([
            fx.manifest().to_str().unwrap(),
            "demo",
            &name,
            fx.state.path().to_str().unwrap(),
        ])
        .env_remove("BOTTLE_FAILPOINT")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("launched bot-bottle-{name}"));
    assert_eq!(resources_of(&fx.backend, &name).len(), 3);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
}

#[test]
fn cleanup_prunes_bundle_images_of_other_binaries_only() {
    use std::collections::HashMap;

    use bottle_docker::images::{self, LABEL_BUNDLE_SHA256, LABEL_BUNDLE_STATE_ROOT};
    use bottle_docker::tarball::{Ownership, TarBuilder};
    let Some(fx) = support::setup("cleanup_prunes_bundle_images_of_other_binaries_only") else {
        return;
    };
    // The current binary's image, as a launch builds it.
    let bundle = std::env::var_os("BOTTLE_BUNDLE_BIN")
        .map(PathBuf::from)
        .unwrap();
    let engine = fx.backend.engine().unwrap();
    let current = images::ensure_bundle_image(engine, &bundle, &[], None).unwrap();
    // Bundle images of older binaries: one this install built, one another
    // install on this host built, one from before images were labelled.
    let root = fx.backend.options().state_root.display().to_string();
    let pid = std::process::id();
    let ours = format!("bottle-bundle:stale-ours-{pid}");
    let theirs = format!("bottle-bundle:stale-theirs-{pid}");
    let unknown = format!("bottle-bundle:stale-unknown-{pid}");
    for (tag, sha, install) in [
        (&ours, "0", Some(root.as_str())),
        (&theirs, "1", Some("/srv/another-install/bottle")),
        (&unknown, "2", None),
    ] {
        let mut tar = TarBuilder::new();
        tar.file("Dockerfile", b"FROM scratch\n", 0o644, Ownership::ROOT)
            .unwrap();
        let mut labels = HashMap::from([(LABEL_BUNDLE_SHA256.to_string(), sha.repeat(64))]);
        if let Some(install) = install {
            labels.insert(LABEL_BUNDLE_STATE_ROOT.to_string(), install.to_string());
        }
        images::build_from_tar(
            engine,
            tar.finish().unwrap(),
            "Dockerfile",
            tag,
            &HashMap::new(),
            &labels,
            None,
        )
        .unwrap();
        assert!(images::image_exists(engine, tag).unwrap());
    }

    // Listed first, removing nothing: this install's own alone.
    let plan = fx.backend.cleanup_plan().unwrap();
    let listed: Vec<&str> = plan
        .iter()
        .filter(|item| item.kind == "image")
        .map(|item| item.name.as_str())
        .collect();
    assert_eq!(listed, [ours.as_str()], "{plan:?}");
    assert!(images::image_exists(engine, &ours).unwrap());

    let report = fx.backend.cleanup_approved(&plan).unwrap();
    assert!(
        report.removed.contains(&format!("image {ours}")),
        "{:?}",
        report.removed
    );
    assert!(!images::image_exists(engine, &ours).unwrap());
    for kept in [&theirs, &unknown, &current] {
        assert!(
            images::image_exists(engine, kept).unwrap(),
            "{kept} was pruned"
        );
    }
    for tag in [&theirs, &unknown] {
        let _ = engine.block_on(engine.docker.remove_image(
            tag,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        ));
    }
}

/// A bundle that exits before it says it is ready (here a static busybox
/// in the bundle's place, which knows no `bottle-bundle` applet) fails the
/// launch at `bundle-health` as soon as its output ends, naming the exit
/// and showing its logs, and leaves nothing behind.
#[test]
fn a_bundle_that_exits_before_it_is_ready_fails_the_launch_at_once() {
    let busybox = std::path::Path::new("/bin/busybox");
    if !busybox.is_file() {
        support::unavailable(
            "a_bundle_that_exits_before_it_is_ready_fails_the_launch_at_once",
            "/bin/busybox is missing (apt-get install busybox-static)",
        );
        return;
    }
    let Some(fx) = support::setup_with(
        "a_bundle_that_exits_before_it_is_ready_fails_the_launch_at_once",
        |options| {
            options.bundle_bin = Some(busybox.to_path_buf());
            options.health_timeout = Duration::from_secs(120);
        },
    ) else {
        return;
    };
    let name = name("bundle-exits");
    let spec = fx.spec(&name);
    let _guard = support::Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    let plan = fx.backend.prepare(&spec).unwrap();
    let started = std::time::Instant::now();
    let err = fx
        .backend
        .launch(&plan)
        .err()
        .expect("the launch succeeded");
    assert_eq!(err.code, "BOT-D051", "{err}");
    assert!(err.message.contains("the bundle exited"), "{err}");
    assert!(err.message.contains("applet not found"), "{err}");
    // It did not wait out the health timeout.
    assert!(started.elapsed() < Duration::from_secs(60), "{err}");
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
    assert!(!spec.state_dir.exists());
}
