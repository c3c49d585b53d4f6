//! The verified reset: a reset really reverts the box, and each of its
//! three sources lying on purpose halts the bottle (none is a soft pass).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions};
use bottle_core::backend::BackendError;
use bottle_core::sandbox::reset::{self, halted};
use bottle_core::sandbox::{ResetSubstrate, RevertMethod, SandboxError, Source};
use bottle_core::{Bottle, BottleBackend, BottleLauncher, Coded};
use bottle_docker::DockerBottle;
use bottle_docker::reset::DockerResetSubstrate;

use crate::support::{self, Fixture, Guard, name, sh};

/// Launches `name` and returns the concrete bottle.
fn start<'a>(fx: &'a Fixture, name: &str) -> (Guard<'a>, DockerBottle) {
    let spec = fx.spec(name);
    let guard = Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    let plan = fx.backend.prepare(&spec).unwrap();
    let bottle = fx.backend.launch_bottle(&plan).unwrap();
    assert!(
        bottle
            .launch_warnings()
            .iter()
            .all(|w| !w.contains("reset")),
        "{:?}",
        bottle.launch_warnings()
    );
    (guard, bottle)
}

/// Runs `script` as root in the agent container: what an agent whose
/// image runs it as root could do.
fn sh_as_root(fx: &Fixture, bottle: &DockerBottle, script: &str) -> String {
    let engine = fx.backend.engine().unwrap();
    let argv = ["sh".into(), "-c".into(), script.into()];
    let out = engine
        .block_on(bottle_docker::bottle::exec_captured(
            engine,
            bottle.container(),
            &argv,
            Some("0:0"),
        ))
        .unwrap();
    assert_eq!(
        out.exit_code,
        0,
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn text(bottle: &DockerBottle, script: &str) -> String {
    let out = sh(bottle, script);
    String::from_utf8(out.stdout).unwrap()
}

/// What the box holds that an agent may change: a listing of its writable
/// places with contents, its processes, and its environment.
fn box_state(bottle: &DockerBottle) -> String {
    text(
        bottle,
        "find /home/agent /tmp /etc | sort; cat /etc/passwd /etc/group /home/agent/.profile; \
         ps -o user,args; env | sort",
    )
}

#[test]
fn a_reset_reverts_files_processes_and_environment() {
    let Some(fx) = support::setup("a_reset_reverts_files_processes_and_environment") else {
        return;
    };
    let name = name("reset");
    let (guard, bottle) = start(&fx, &name);
    let before = box_state(&bottle);
    assert!(before.contains("/.bottle/pause"), "{before}");

    let mut timings = Vec::new();
    for round in 0..3 {
        // Files created (in $HOME, /tmp and a new dir), modified and
        // deleted (an image file too), a process left running, and an
        // environment change for the next login shell.
        let agent = sh(
            &bottle,
            "echo mine > /home/agent/new.txt && mkdir -p /tmp/newdir && echo x > /tmp/newdir/f \
             && echo 'export LEFT_BEHIND=1' >> /home/agent/.profile \
             && (setsid sleep 1000 >/dev/null 2>&1 &)",
        );
        assert_eq!(
            agent.exit_code,
            0,
            "{}",
            String::from_utf8_lossy(&agent.stderr)
        );
        sh_as_root(
            &fx,
            &bottle,
            "rm /etc/group && echo 'intruder:x:0:0::/:/bin/sh' >> /etc/passwd && touch /etc/new",
        );
        let dirty = box_state(&bottle);
        assert!(dirty.contains("sleep 1000"), "{dirty}");
        assert!(
            dirty.contains("new.txt") && dirty.contains("intruder"),
            "{dirty}"
        );
        assert_ne!(dirty, before);

        let report = bottle
            .reset()
            .unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(report.verified);
        assert!(report.checks.iter().all(|c| c.matched), "{report:?}");
        timings.push(report.revert + report.verify);

        assert_eq!(box_state(&bottle), before, "round {round}");
        assert_eq!(
            text(&bottle, "sh -lc 'echo ${LEFT_BEHIND:-unset}'"),
            "unset\n"
        );
    }
    timings.sort();
    eprintln!("reset times (revert + verify): {timings:?}");
    assert!(halted(bottle.reset_substrate().files()).is_none());
    drop(guard);
}

/// Makes one lie, runs resets until the bottle halts (at most `resets`),
/// and checks the halt: X006 naming `source` alone, the agent stopped, the
/// bottle listed as halted, no second reset, and a stop that leaves
/// nothing (the golden copies included).
fn assert_lie_halts(
    fx: &Fixture,
    bottle: &DockerBottle,
    substrate: &dyn ResetSubstrate,
    source: Source,
    resets: usize,
) {
    let files = bottle.reset_substrate().files().clone();
    let upper = bottle.reset_substrate().upper_dir().unwrap();
    let layer = upper.parent().unwrap().to_path_buf();
    let mut outcome = None;
    for _ in 0..resets {
        match reset::reset(substrate, &files) {
            Ok(report) => assert!(report.verified),
            Err(err) => {
                outcome = Some(err);
                break;
            }
        }
    }
    let err = outcome.expect("the lie was never caught");
    assert_eq!(err.exit_code(), 5);
    assert_eq!(diverged_sources(&err), [source]);

    // Halted: both containers stopped and kept, listed as halted.
    for container in [
        bottle.container().to_string(),
        format!("{}-bundle", bottle.name()),
    ] {
        let state = support::inspect(&fx.backend, &container).state.unwrap();
        assert_eq!(state.running, Some(false), "{container}");
    }
    let listed = fx.backend.list_active().unwrap();
    let this = listed.iter().find(|b| b.name == bottle.name()).unwrap();
    assert_eq!(this.state, "halted");
    assert!(halted(&files).unwrap().reason.contains(source.as_str()));

    // Never reset again.
    let again = bottle.reset().unwrap_err();
    assert_eq!(again.code(), "BOT-X005", "{again}");

    // Stop removes everything, the snapshot's copies too.
    let report = fx.backend.stop(bottle.name()).unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(support::resources_of(&fx.backend, bottle.name()).is_empty());
    assert!(!files.state_dir.exists());
    for leftover in [
        layer.clone(),
        sibling(&upper, ".next"),
        sibling(&upper, ".old"),
    ] {
        assert!(!leftover.exists(), "{} is left", leftover.display());
    }
}

/// The sources a reset's divergence (`BOT-X006`) names.
fn diverged_sources(err: &SandboxError) -> Vec<Source> {
    assert_eq!(err.code(), "BOT-X006", "{err}");
    let SandboxError::ResetDivergence { report } = err else {
        panic!("{err}")
    };
    report
        .checks
        .iter()
        .filter(|c| !c.matched)
        .map(|c| c.source)
        .collect()
}

fn sibling(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[test]
fn a_file_planted_in_the_golden_snapshot_halts_the_bottle() {
    let Some(fx) = support::setup("a_file_planted_in_the_golden_snapshot_halts_the_bottle") else {
        return;
    };
    let name = name("plant");
    let (_guard, bottle) = start(&fx, &name);
    let substrate = bottle.reset_substrate();
    std::fs::write(substrate.golden_upper().join("planted"), "from the host").unwrap();
    // The copy this reset swaps in was prepared at launch, before the
    // plant; the copy it prepares for the next one carries the planted
    // file, and the filesystem source compares both with the baseline.
    assert_lie_halts(&fx, &bottle, &substrate, Source::Filesystem, 1);
}

/// The real substrate, whose revert leaves a process holding a descriptor
/// open: a revert that did not end everything.
struct LeavesAProcess {
    real: DockerResetSubstrate,
    engine: bottle_docker::client::Engine,
    container: String,
}

impl LeavesAProcess {
    /// Starts `sh -c 'exec 3</etc/hostname; sleep 100'` detached and waits
    /// until it holds descriptor 3.
    fn leave_process(&self) {
        let docker = &self.engine.docker;
        let exec = self
            .engine
            .block_on(docker.create_exec(
                &self.container,
                CreateExecOptions::<String> {
                    cmd: Some(vec![
                        "sh".into(),
                        "-c".into(),
                        "exec 3</etc/hostname; sleep 100".into(),
                    ]),
                    ..CreateExecOptions::default()
                },
            ))
            .unwrap();
        self.engine
            .block_on(docker.start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: true,
                    ..StartExecOptions::default()
                }),
            ))
            .unwrap();
        bottle_test_support::wait_until(
            "the process to hold fd 3",
            Duration::from_secs(10),
            || {
                let pid = self
                    .engine
                    .block_on(docker.inspect_exec(&exec.id))
                    .ok()
                    .and_then(|i| i.pid);
                pid.is_some_and(|pid| PathBuf::from(format!("/proc/{pid}/fd/3")).exists())
            },
        );
    }
}

impl ResetSubstrate for LeavesAProcess {
    fn bottle(&self) -> &str {
        self.real.bottle()
    }
    fn snapshot(&self) -> Result<(), BackendError> {
        self.real.snapshot()
    }
    fn revert(&self) -> Result<RevertMethod, BackendError> {
        let method = self.real.revert()?;
        self.leave_process();
        Ok(method)
    }
    fn read_fs_hash(&self) -> Result<String, BackendError> {
        self.real.read_fs_hash()
    }
    fn read_open_fds(&self) -> Result<u64, BackendError> {
        self.real.read_open_fds()
    }
    fn read_engine(&self) -> Result<BTreeMap<String, String>, BackendError> {
        self.real.read_engine()
    }
    fn halt(&self) -> Result<(), BackendError> {
        self.real.halt()
    }
}

#[test]
fn a_descriptor_held_past_the_revert_halts_the_bottle() {
    let Some(fx) = support::setup("a_descriptor_held_past_the_revert_halts_the_bottle") else {
        return;
    };
    let name = name("fds");
    let (_guard, bottle) = start(&fx, &name);
    let substrate = LeavesAProcess {
        real: bottle.reset_substrate(),
        engine: fx.backend.engine().unwrap().clone(),
        container: bottle.container().to_string(),
    };
    assert_lie_halts(&fx, &bottle, &substrate, Source::OpenFds, 1);
}

#[test]
fn an_engine_state_changed_behind_bottles_back_halts_the_bottle() {
    let Some(fx) = support::setup("an_engine_state_changed_behind_bottles_back_halts_the_bottle")
    else {
        return;
    };
    let name = name("engine");
    let (_guard, bottle) = start(&fx, &name);
    let engine = fx.backend.engine().unwrap();
    engine
        .block_on(engine.docker.update_container(
            bottle.container(),
            bollard::models::ContainerUpdateBody {
                memory: Some(200 * 1024 * 1024),
                ..Default::default()
            },
        ))
        .unwrap();
    let substrate = bottle.reset_substrate();
    assert_lie_halts(&fx, &bottle, &substrate, Source::Engine, 1);
}

#[test]
fn a_baseline_never_recorded_is_not_a_pass() {
    let Some(fx) = support::setup("a_baseline_never_recorded_is_not_a_pass") else {
        return;
    };
    let name = name("nobase");
    let (_guard, bottle) = start(&fx, &name);
    let substrate = bottle.reset_substrate();
    std::fs::remove_file(substrate.files().baseline()).unwrap();
    let err = bottle.reset().unwrap_err();
    assert_eq!(err.code(), "BOT-X006", "{err}");
    let SandboxError::ResetDivergence { report } = err else {
        panic!("not a divergence")
    };
    assert!(
        report
            .checks
            .iter()
            .all(|c| !c.matched && c.expected == "none recorded"),
        "{report:?}"
    );
    assert!(halted(substrate.files()).is_some());
    assert!(
        !support::inspect(&fx.backend, bottle.container())
            .state
            .unwrap()
            .running
            .unwrap()
    );
}

/// The containers whose name starts with `prefix`, with their state and
/// networks.
fn boxes_named(fx: &Fixture, prefix: &str) -> Vec<(String, String, Vec<String>)> {
    let engine = fx.backend.engine().unwrap();
    let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .build();
    let mut found: Vec<_> = engine
        .block_on(engine.docker.list_containers(Some(options)))
        .unwrap()
        .into_iter()
        .filter_map(|c| {
            let name = c.names?.first()?.trim_start_matches('/').to_string();
            name.starts_with(prefix).then(|| {
                let inspect = support::inspect(&fx.backend, &name);
                let networks = inspect
                    .network_settings
                    .and_then(|n| n.networks)
                    .unwrap_or_default()
                    .into_keys()
                    .collect();
                let state = inspect.state.unwrap().status.unwrap().to_string();
                (name, state, networks)
            })
        })
        .collect();
    found.sort();
    found
}

#[test]
fn a_reset_swaps_in_a_verified_standby_and_cuts_the_old_box_off() {
    let Some(fx) = support::setup("a_reset_swaps_in_a_verified_standby_and_cuts_the_old_box_off")
    else {
        return;
    };
    let name = name("standby");
    let (guard, bottle) = start(&fx, &name);
    let agent = bottle.container().to_string();
    let networks = support::inspect(&fx.backend, &agent)
        .network_settings
        .and_then(|n| n.networks)
        .unwrap();
    assert_eq!(networks.len(), 1, "{networks:?}");
    let network = networks.into_keys().next().unwrap();
    let before = box_state(&bottle);
    let address = |container: &str| {
        support::inspect(&fx.backend, container)
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|n| n.get(&network).cloned())
            .and_then(|endpoint| endpoint.ip_address)
    };
    let planned = address(&agent).expect("the agent is on the bottle network");

    for round in 0..3 {
        let said = bottle.prepare_reset().unwrap();
        assert!(said.contains("standby waits"), "{said}");
        // The standby waits paused, on no network; the boxes earlier
        // resets retired are gone.
        let standby = format!("{agent}-standby");
        assert_eq!(
            boxes_named(&fx, &format!("{agent}-")),
            [(standby.clone(), "paused".to_string(), vec![])],
            "round {round}"
        );
        let old_id = support::inspect(&fx.backend, &agent).id.unwrap();
        let standby_id = support::inspect(&fx.backend, &standby).id.unwrap();

        sh(
            &bottle,
            "echo mine > /home/agent/new.txt && (setsid sleep 1000 >/dev/null 2>&1 &)",
        );
        let report = bottle
            .reset()
            .unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(report.verified, "{report:?}");
        assert_eq!(report.method, RevertMethod::Standby);

        // The agent's name is the standby's box now, at the planned
        // address, as the snapshot left it.
        assert_eq!(
            support::inspect(&fx.backend, &agent).id.unwrap(),
            standby_id
        );
        assert_eq!(address(&agent).as_deref(), Some(planned.as_str()));
        assert_eq!(box_state(&bottle), before, "round {round}");
        // The old box is paused and on no network.
        let retired = boxes_named(&fx, &format!("{agent}-old-"));
        assert_eq!(retired.len(), 1, "{retired:?}");
        assert_eq!((retired[0].1.as_str(), retired[0].2.len()), ("paused", 0));
        assert_eq!(
            support::inspect(&fx.backend, &retired[0].0).id.unwrap(),
            old_id
        );
        // Listed once, as the running bottle.
        let listed = fx.backend.list_active().unwrap();
        let this: Vec<_> = listed.iter().filter(|b| b.name == bottle.name()).collect();
        assert_eq!(this.len(), 1, "{listed:?}");
        assert_eq!(this[0].state, "running");
    }

    // With no standby waiting, a reset restarts the box swapped in last.
    sh(&bottle, "echo mine > /home/agent/new.txt");
    let report = bottle.reset().unwrap();
    assert!(report.verified, "{report:?}");
    assert_eq!(report.method, RevertMethod::Restart);
    assert_eq!(box_state(&bottle), before);

    // A stop removes the standby and the retired boxes with the bottle.
    assert!(bottle.prepare_reset().unwrap().contains("standby waits"));
    drop(guard);
    assert!(support::resources_of(&fx.backend, bottle.name()).is_empty());
    assert!(boxes_named(&fx, &agent).is_empty());
}

#[test]
fn a_handle_that_calls_finds_its_channel_open_in_the_box_a_reset_swaps_in() {
    let test = "a_handle_that_calls_finds_its_channel_open_in_the_box_a_reset_swaps_in";
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        support::unavailable(test, "BOTTLE_TOOLBOX_BIN is not set (`cargo xtask dist`)");
        return;
    }
    let Some(fx) = support::setup(test) else {
        return;
    };
    let name = name("ahead");
    let (_guard, bottle) = start(&fx, &name);
    let agent = bottle.container().to_string();
    let standby = format!("{agent}-standby");
    let call = |script: &str| {
        let result = bottle
            .execute(&bottle_core::sandbox::ToolCall::argv(["sh", "-c", script]))
            .unwrap();
        assert_eq!(result.exit_code, 0, "{result:?}");
        String::from_utf8(result.stdout).unwrap()
    };
    let execs = |container: &str| {
        support::inspect(&fx.backend, container)
            .exec_ids
            .unwrap_or_default()
    };
    // The parent of a call's process: the in-box agent serving it.
    let server =
        "cat /proc/$PPID/cmdline | tr '\\0' ' '; echo; cat /proc/$PPID/stat | cut -d' ' -f22";
    let before = box_state(&bottle);

    for round in 0..2 {
        // A handle that called prepares a standby whose agent already runs.
        call("true");
        let said = bottle.prepare_reset().unwrap();
        assert!(said.contains("channel open"), "{said}");
        let ahead = execs(&standby);
        assert_eq!(ahead.len(), 1, "round {round}: {ahead:?}");

        call("echo mine > /home/agent/new.txt && (setsid sleep 1000 >/dev/null 2>&1 &)");
        // Verified from all three sources with the agent's process in the
        // box: the descriptor source left exactly that process out.
        let report = bottle.reset().unwrap();
        assert!(report.verified, "{report:?}");
        assert_eq!(report.method, RevertMethod::Standby);
        assert_eq!(execs(&agent), ahead, "round {round}");

        // The calls after the reset run on the channel opened ahead: no
        // exec is made, and one agent serves them all.
        let first = call(server);
        assert!(first.starts_with("/.bottle/toolbox"), "{first}");
        assert_eq!(call(server), first);
        assert_eq!(execs(&agent), ahead, "round {round}");
    }
    // The box as the snapshot left it, but for the agent now serving.
    let after = box_state(&bottle);
    let without_agent = |state: &str| {
        state
            .lines()
            .filter(|line| !line.contains("/.bottle/toolbox"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(without_agent(&after), without_agent(&before));

    // A handle that never called prepares no channel: its first call
    // after the reset starts the agent.
    let other = fx.backend.attach_bottle(&name).unwrap();
    let said = other.prepare_reset().unwrap();
    assert!(!said.contains("channel open"), "{said}");
    assert!(execs(&standby).is_empty());
}

#[test]
fn a_standby_changed_while_it_waits_is_never_a_pass() {
    let Some(fx) = support::setup("a_standby_changed_while_it_waits_is_never_a_pass") else {
        return;
    };
    let name = name("sbylie");
    let (_guard, bottle) = start(&fx, &name);
    let agent = bottle.container().to_string();
    let standby = format!("{agent}-standby");
    let engine = fx.backend.engine().unwrap();

    // Unpaused behind bottle's back: not the standby that was verified,
    // so it is removed and the reset restarts the box.
    bottle.prepare_reset().unwrap();
    engine
        .block_on(engine.docker.unpause_container(&standby))
        .unwrap();
    let report = bottle.reset().unwrap();
    assert!(report.verified);
    assert_eq!(report.method, RevertMethod::Restart);
    assert!(boxes_named(&fx, &standby).is_empty());

    // A file planted in its layer while it waits: swapped in, and the
    // reset's filesystem source halts the bottle.
    bottle.prepare_reset().unwrap();
    let upper = support::inspect(&fx.backend, &standby)
        .graph_driver
        .unwrap()
        .data["UpperDir"]
        .clone();
    std::fs::write(PathBuf::from(upper).join("planted"), "x").unwrap();
    let err = bottle.reset().unwrap_err();
    assert_eq!(diverged_sources(&err), [Source::Filesystem]);
    assert!(halted(bottle.reset_substrate().files()).is_some());
}
