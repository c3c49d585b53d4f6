//! `isolation = "gvisor"`: the agent's box under the daemon's `runsc`
//! runtime. The tests that run a box skip (or fail under
//! `BOTTLE_REQUIRE_GVISOR=1`) when the daemon has no runsc; the refusals
//! need only Docker.

use bottle_core::backend::BackendErrorKind;
use bottle_core::copy::{CopyIn, GuestPath};
use bottle_core::sandbox::{SandboxError, Source, ToolCall};
use bottle_core::{Bottle, BottleBackend, BottleLauncher};
use bottle_docker::DockerBottle;

use crate::support::{self, Fixture, Guard, name, resources_of, sh};

/// The runtime CI registers that claims to be gVisor and is runc (its
/// flags are runsc's, dropped before runc runs): the post-launch
/// confirmation must refuse it.
const FAKE_RUNSC: &str = "bottle-test-fake-runsc";

const GVISOR: &str = "isolation = \"gvisor\"";

/// A fixture whose daemon has `runtime`, or `None` after skipping.
fn setup_with_runtime(test: &str, runtime: &str) -> Option<Fixture> {
    if let Err(why) = bottle_test_support::daemon_has_runtime(runtime) {
        // Without Docker at all, the Docker rule decides.
        if why.starts_with("cannot") {
            support::unavailable(test, &why);
        } else {
            bottle_test_support::skip_gvisor_test(test, why);
        }
        return None;
    }
    support::setup_with(test, |options| {
        options.gvisor_runtime = Some(runtime.to_string());
    })
}

fn start_gvisor<'a>(fx: &'a Fixture, name: &str) -> (Guard<'a>, DockerBottle) {
    fx.manifest_with_keys(GVISOR, "");
    let spec = fx.spec(name);
    let guard = Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    let plan = fx.backend.prepare(&spec).unwrap();
    let lines: Vec<String> = plan
        .render()
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("isolation") && l.contains("gvisor")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("runtime") && l.contains("runsc")),
        "{lines:?}"
    );
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

fn text(out: &bottle_core::ExecOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn host_kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/version")
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn a_gvisor_box_runs_under_runsc_and_works_like_a_container() {
    let test = "a_gvisor_box_runs_under_runsc_and_works_like_a_container";
    let Some(fx) = setup_with_runtime(test, "runsc") else {
        return;
    };
    let name = name("gvisor");
    let (guard, bottle) = start_gvisor(&fx, &name);

    // The Engine runs the agent under runsc with the translated limits;
    // the bundle stays on runc.
    let agent = support::inspect(&fx.backend, bottle.container());
    let host = agent.host_config.unwrap();
    assert_eq!(host.runtime.as_deref(), Some("runsc"));
    let headroom = bottle_core::isolation::GVISOR_MEMORY_HEADROOM as i64;
    assert_eq!(host.memory, Some((256 << 20) + headroom));
    assert_eq!(host.memory_swap, host.memory);
    assert_eq!(host.pids_limit, Some(256 + 12 * 128));
    let nproc = &host.ulimits.unwrap()[0];
    assert_eq!(
        (nproc.name.as_deref(), nproc.hard),
        (Some("nproc"), Some(128))
    );
    let bundle = support::inspect(&fx.backend, &format!("{}-bundle", guard.name));
    assert_eq!(
        bundle.host_config.unwrap().runtime.as_deref(),
        Some("runc"),
        "the bundle stays on runc"
    );

    // Every process the Engine starts for the agent runs under bottle's
    // system-call filter (gVisor applies the container's own profile to
    // the container's first process only): no new user namespace, as
    // under runc, and execute's calls inherit it from the in-box agent.
    let status = text(&sh(
        &bottle,
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status",
    ));
    assert!(status.contains("Seccomp:\t2"), "{status}");
    let unshare = sh(&bottle, "unshare -U true");
    assert_ne!(unshare.exit_code, 0, "{}", text(&unshare));
    let called = bottle
        .execute(&ToolCall::argv(["grep", "^Seccomp:", "/proc/self/status"]))
        .unwrap();
    assert!(
        String::from_utf8_lossy(&called.stdout).contains("Seccomp:\t2"),
        "{called:?}"
    );

    // gVisor's kernel answers the box, not the host's.
    let version = text(&sh(&bottle, "cat /proc/version"));
    assert!(!version.contains(&host_kernel_version()), "{version}");
    let dmesg = text(&sh(&bottle, "dmesg 2>/dev/null | head -1"));
    assert!(dmesg.contains("gVisor") || dmesg.is_empty(), "{dmesg}");

    // /tmp is the box's own directory, as in a container: what the host
    // copies there, the box sees.
    let file = fx.dir.path().join("hello.txt");
    std::fs::write(&file, "from the host\n").unwrap();
    let copy = CopyIn::from_host(&file).unwrap();
    bottle
        .copy_in(&copy, &GuestPath::parse("/tmp").unwrap())
        .unwrap();
    assert_eq!(text(&sh(&bottle, "cat /tmp/hello.txt")), "from the host\n");
    bottle
        .copy_in(&copy, &GuestPath::parse("/home/agent").unwrap())
        .unwrap();
    assert_eq!(
        text(&sh(&bottle, "cat /home/agent/hello.txt")),
        "from the host\n"
    );

    // The in-box agent, when one is built.
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_some() {
        let result = bottle
            .execute(&ToolCall::argv(["sh", "-c", "id -u; echo tool"]))
            .unwrap();
        assert_eq!(result.exit_code, 0, "{result:?}");
        assert_eq!(String::from_utf8_lossy(&result.stdout), "1000\ntool\n");
    }

    // The box's process limit is gVisor's RLIMIT_NPROC: a fork past it
    // fails, and the box lives on.
    let forks = sh(
        &bottle,
        "n=0; while [ $n -lt 300 ]; do sleep 30 & n=$((n+1)); done 2>/dev/null; echo $n",
    );
    let spawned: u32 = text(&forks).trim().parse().unwrap_or(0);
    assert!(spawned < 300, "{} forks went through", spawned);
    sh(&bottle, "kill $(jobs -p) 2>/dev/null; pkill sleep; true");
    assert_eq!(text(&sh(&bottle, "echo alive")), "alive\n");

    // A verified reset reverts what the agent wrote.
    sh(
        &bottle,
        "echo dirt > /home/agent/dirt; echo tmp > /tmp/dirt",
    );
    let report = bottle.reset().unwrap();
    assert!(report.verified, "{report:?}");
    let left = sh(
        &bottle,
        "ls /home/agent/dirt /tmp/dirt /tmp/hello.txt 2>&1; true",
    );
    assert!(!text(&left).contains("dirt\n"), "{}", text(&left));
    assert_eq!(text(&sh(&bottle, "echo after")), "after\n");

    drop(bottle);
    drop(guard);
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
}

#[test]
fn the_agent_cannot_forge_or_plant_a_tool_result_in_a_gvisor_box() {
    let test = "the_agent_cannot_forge_or_plant_a_tool_result_in_a_gvisor_box";
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        support::unavailable(
            test,
            "BOTTLE_TOOLBOX_BIN is not set (`cargo xtask dist` builds the static bottle-toolbox)",
        );
        return;
    }
    let Some(fx) = setup_with_runtime(test, "runsc") else {
        return;
    };
    let name = name("gvforge");
    let (_guard, bottle) = start_gvisor(&fx, &name);
    crate::execute::the_agent_is_kept_off_the_channel(&bottle);
}

#[test]
fn a_host_process_left_in_the_boxs_cgroup_halts_the_reset() {
    let test = "a_host_process_left_in_the_boxs_cgroup_halts_the_reset";
    let Some(fx) = setup_with_runtime(test, "runsc") else {
        return;
    };
    let name = name("gvstray");
    let (_guard, bottle) = start_gvisor(&fx, &name);
    let agent = support::inspect(&fx.backend, bottle.container());
    let sandbox = agent.state.unwrap().pid.unwrap();
    let cgroup = std::fs::read_to_string(format!("/proc/{sandbox}/cgroup")).unwrap();
    let procs = cgroup
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == "pids") {
                Some(format!("/sys/fs/cgroup/pids{path}/cgroup.procs"))
            } else if controllers.is_empty() {
                Some(format!("/sys/fs/cgroup{path}/cgroup.procs"))
            } else {
                None
            }
        })
        .unwrap();

    // A host process in the box's cgroup that is not the sandbox's: what
    // could outlive the revert.
    #[expect(
        clippy::disallowed_methods,
        reason = "the test holds the stray's handle to move it into the box's cgroup and kill it"
    )]
    let mut stray = std::process::Command::new("sleep")
        .arg("120")
        .spawn()
        .unwrap();
    std::fs::write(&procs, stray.id().to_string()).unwrap();

    let err = bottle.reset().unwrap_err();
    let _ = stray.kill();
    let _ = stray.wait();
    match &err {
        SandboxError::ResetDivergence { report } => {
            let diverged: Vec<Source> = report
                .checks
                .iter()
                .filter(|c| !c.matched)
                .map(|c| c.source)
                .collect();
            assert_eq!(diverged, [Source::OpenFds], "{err}");
        }
        other => panic!("expected a divergence, got {other}"),
    }
    let halted = fx.backend.attach(&format!("bot-bottle-{name}"));
    assert!(halted.is_err(), "a halted bottle is not attached to");
}

#[test]
fn a_runtime_that_is_not_gvisor_is_refused_after_launch_and_unwound() {
    let test = "a_runtime_that_is_not_gvisor_is_refused_after_launch_and_unwound";
    let Some(fx) = setup_with_runtime(test, FAKE_RUNSC) else {
        return;
    };
    fx.manifest_with_keys(GVISOR, "");
    let name = name("gvfake");
    let spec = fx.spec(&name);
    let _guard = Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    let plan = fx.backend.prepare(&spec).unwrap();
    let err = fx.backend.launch(&plan).err().expect("refused");
    assert_eq!(err.code, "BOT-D092", "{err}");
    assert_eq!(err.kind, BackendErrorKind::IsolationUnconfirmed);
    assert!(err.message.contains("not gVisor's sandbox"), "{err}");
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
    assert!(!spec.state_dir.exists(), "the state dir was left behind");
}

#[test]
fn a_daemon_without_the_runtime_refuses_before_creating_anything() {
    let test = "a_daemon_without_the_runtime_refuses_before_creating_anything";
    let Some(fx) = support::setup_with(test, |options| {
        options.gvisor_runtime = Some("bottle-test-no-such-runtime".into());
    }) else {
        return;
    };
    fx.manifest_with_keys(GVISOR, "");
    let name = name("gvmissing");
    let spec = fx.spec(&name);
    let err = fx.backend.prepare(&spec).expect_err("refused");
    assert_eq!(err.code, "BOT-D090", "{err}");
    assert_eq!(err.kind, BackendErrorKind::Preflight);
    assert!(err.fix.contains("kill -HUP"), "{}", err.fix);
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
    assert!(!spec.state_dir.exists());
}

/// Past its memory limit the host's OOM killer ends a gVisor box whole,
/// and under runsc 20221219 the daemon's exec in it usually never ends: a
/// command in that box (captured, or piped as `bottle exec` runs it) ends
/// with the box instead, either with its own exit (when the daemon does
/// see it) or with `BOT-D044` saying the box ran out of memory. The bound
/// is a liveness check (the hang it replaces is forever), not a speed
/// claim.
///
/// The command can end (dd's exit 128, seen under load) a moment before
/// the Engine records the box's end, so the record is awaited, bounded.
#[test]
fn a_command_ends_when_the_oom_killer_ends_its_gvisor_box() {
    let test = "a_command_ends_when_the_oom_killer_ends_its_gvisor_box";
    let Some(fx) = setup_with_runtime(test, "runsc") else {
        return;
    };
    // 2 GiB through dd's 1 GiB buffer, past the box's 256m (and gVisor's
    // headroom).
    let hog: Vec<String> = ["sh", "-c", "dd if=/dev/zero of=/dev/null bs=1024M count=2"]
        .map(String::from)
        .to_vec();
    for piped in [false, true] {
        let name = name(if piped { "oom-piped" } else { "oom-captured" });
        let (_guard, bottle) = start_gvisor(&fx, &name);
        let container = bottle.container().to_string();
        let (done, ended) = std::sync::mpsc::channel();
        let command = hog.clone();
        std::thread::spawn(move || {
            let result = if piped {
                bottle.exec_piped(&command).map(|code| code.to_string())
            } else {
                bottle
                    .exec(&command)
                    .map(|out| format!("{} {}", out.exit_code, text(&out)))
            };
            let _ = done.send(result);
        });
        let result = ended
            .recv_timeout(std::time::Duration::from_secs(180))
            .unwrap_or_else(|_| panic!("piped {piped}: the command did not end with its box"));
        let mut state = Default::default();
        bottle_test_support::eventually(std::time::Duration::from_secs(30), || {
            state = support::inspect(&fx.backend, &container)
                .state
                .unwrap_or_default();
            state.running != Some(true)
        });
        assert_eq!(
            (state.running, state.oom_killed),
            (Some(false), Some(true)),
            "piped {piped}: the box was not killed at its limit; the command said {result:?}"
        );
        if let Err(err) = result {
            assert_eq!(bottle_core::Coded::code(&err), "BOT-D044", "{err}");
            assert!(err.to_string().contains("out of memory"), "{err}");
        }
    }
}
