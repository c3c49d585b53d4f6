//! `limits.disk` against the real daemon: a cap its storage cannot enforce
//! refuses the bottle (`BOT-D080`) and leaves nothing behind; a cap it can
//! enforce reaches the agent container's `StorageOpt`.

use bottle_core::{BottleBackend as _, BottleLauncher, BottleSpec};
use bottle_docker::DockerBackend;

use crate::support::{self, Fixture, inspect, name, resources_of};

const DISK: &str = "disk = \"1g\"";

fn spec_with_disk(fx: &Fixture, name: &str) -> BottleSpec {
    let path = fx.manifest_with(DISK);
    let manifest = bottle_core::manifest::load(&path).unwrap();
    BottleSpec::new(&manifest, &path, "demo", Some(name), fx.state.path()).unwrap()
}

fn assert_nothing_left(backend: &DockerBackend, spec: &BottleSpec) {
    assert_eq!(
        resources_of(backend, &spec.name),
        Vec::<String>::new(),
        "resources left behind"
    );
    assert!(!spec.state_dir.exists(), "state dir left behind");
}

fn assert_disk_refusal(err: &bottle_core::BackendError) {
    assert_eq!(err.code, "BOT-D080", "{err}");
    assert!(
        err.message
            .contains("cannot limit a container's writable layer"),
        "{err}"
    );
    assert!(err.fix.contains("pquota"), "{}", err.fix);
}

#[test]
fn a_disk_cap_the_storage_cannot_enforce_refuses_the_bottle() {
    let Some(fx) = support::setup("a_disk_cap_the_storage_cannot_enforce_refuses_the_bottle")
    else {
        return;
    };
    let spec = spec_with_disk(&fx, &name("disk-cap"));
    assert_eq!(spec.agent.disk_bytes(), Some(1 << 30));
    let _guard = support::Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    match fx.backend.prepare(&spec) {
        // overlay2 on ext4 (this project's machines): refused at prepare,
        // before anything exists.
        Err(err) => {
            assert_disk_refusal(&err);
            assert!(err.message.contains(" on "), "names the filesystem: {err}");
        }
        // A daemon whose storage may cap: the plan says so, and the launch
        // either carries the cap or is refused by the daemon.
        Ok(plan) => {
            let disk = plan.backend_lines.iter().find(|(label, _)| label == "disk");
            assert!(
                disk.is_some_and(|(_, line)| line.starts_with("capped at 1 GiB")),
                "{disk:?}"
            );
            match fx.backend.launch(&plan) {
                Ok(_) => {
                    let agent = inspect(&fx.backend, &plan.backend_data.agent.container);
                    let size = agent
                        .host_config
                        .and_then(|h| h.storage_opt)
                        .and_then(|o| o.get("size").cloned());
                    assert_eq!(size.as_deref(), Some("1073741824"));
                    fx.backend.stop(&spec.name).unwrap();
                    assert_eq!(resources_of(&fx.backend, &spec.name), Vec::<String>::new());
                    return;
                }
                Err(err) => assert_disk_refusal(&err),
            }
        }
    }
    assert_nothing_left(&fx.backend, &spec);
}

/// The daemon is the last word: a create it refuses for the storage
/// option (overlay2 on xfs without `pquota`, or here, on ext4) unwinds the
/// launch with the typed refusal. The cap is put on a plan prepared
/// without it, as prepare would pass it on xfs.
#[test]
fn the_daemons_refusal_of_the_cap_unwinds_the_launch() {
    let Some(fx) = support::setup("the_daemons_refusal_of_the_cap_unwinds_the_launch") else {
        return;
    };
    let spec = fx.spec(&name("disk-daemon"));
    let _guard = support::Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    let mut plan = fx.backend.prepare(&spec).unwrap();
    let disk = plan.backend_lines.iter().find(|(label, _)| label == "disk");
    assert!(
        disk.is_some_and(|(_, line)| line.starts_with("NOT capped")),
        "{disk:?}"
    );
    let can_cap = !disk.is_some_and(|(_, line)| line.contains("cannot limit"));
    plan.disk_bytes = Some(1 << 30);
    match fx.backend.launch(&plan) {
        Err(err) => {
            assert_disk_refusal(&err);
            assert!(err.message.contains("the docker daemon said"), "{err}");
        }
        Ok(_) => {
            assert!(can_cap, "the daemon accepted a cap its storage cannot hold");
            fx.backend.stop(&spec.name).unwrap();
            assert_eq!(resources_of(&fx.backend, &spec.name), Vec::<String>::new());
            return;
        }
    }
    assert_nothing_left(&fx.backend, &spec);
}
