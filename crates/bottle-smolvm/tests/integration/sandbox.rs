//! The sandbox interface on a microVM bottle, against the fake: tool calls
//! through the in-box agent, and the verified reset, which reverts the
//! guest's files and processes and halts the bottle when any one of its
//! three sources is made to lie.

use std::path::PathBuf;
use std::time::Duration;

use bottle_core::Coded as _;
use bottle_core::backend::{Bottle, BottleBackend as _, BottleLauncher as _};
use bottle_core::sandbox::reset::halted;
use bottle_core::sandbox::{ResetFiles, SandboxError, Source, ToolCall};

use crate::backend::{MACHINE, Setup, assert_nothing_left, setup};
use crate::support::sandbox_available;

/// The static in-box agent (`cargo xtask test` builds it and sets
/// `BOTTLE_TOOLBOX_BIN`); `None` after a skip line without it (a failure
/// under `BOTTLE_REQUIRE_DOCKER=1`, as CI runs), so `cargo test -p
/// bottle-smolvm` works on its own.
pub(crate) fn toolbox() -> Option<PathBuf> {
    let path = std::env::var_os(bottle_core::bundle_binary::TOOLBOX_BIN_ENV)
        .map(PathBuf::from)
        .filter(|path| path.is_file());
    if path.is_none() {
        bottle_test_support::skip_docker_test(
            "bottle-smolvm's sandbox tests",
            "BOTTLE_TOOLBOX_BIN is not set to the static bottle-toolbox (`cargo xtask dist` builds it; `cargo xtask test` sets it)",
        );
    }
    path
}

/// A running bottle with the in-box agent, the fake in fault `mode`;
/// `None` (with a skip line) where the fake cannot confine guests or the
/// in-box agent is not built.
fn launched(mode: &str) -> Option<(Setup, Box<dyn Bottle>)> {
    let toolbox = toolbox()?;
    let s = setup("1.9.3", mode);
    if !sandbox_available(&s.world) {
        return None;
    }
    let backend = s.backend.with_toolbox_binary(Some(toolbox));
    let s = Setup { backend, ..s };
    let plan = s.backend.prepare(&s.spec).unwrap();
    let bottle = s.backend.launch(&plan).unwrap();
    // (The fake's image has no trust store: the CA's warnings are expected.)
    let warnings = bottle.launch_warnings();
    assert!(
        warnings.iter().all(|w| w.starts_with("ca: ")),
        "{warnings:?}"
    );
    Some((s, bottle))
}

fn sh(bottle: &dyn Bottle, script: &str) -> String {
    let result = bottle
        .execute(&ToolCall::argv(["sh", "-c", script]))
        .unwrap();
    assert_eq!(
        result.exit_code,
        0,
        "{script}: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    String::from_utf8(result.stdout).unwrap()
}

fn files(s: &Setup) -> ResetFiles {
    ResetFiles::new(s.world.state_root().join("coder"))
}

/// Stops the bottle: nothing of its reset may be left.
fn stopped_clean(s: &Setup) {
    s.backend.stop(MACHINE).unwrap();
    let files = files(s);
    assert!(!files.golden_dir().exists(), "golden disks left");
    assert!(!files.halted().exists(), "halt record left");
    assert_nothing_left(s);
}

fn listed_state(s: &Setup) -> String {
    s.backend
        .list_active()
        .unwrap()
        .into_iter()
        .find(|b| b.name == MACHINE)
        .map(|b| b.state)
        .unwrap()
}

#[test]
fn tool_calls_run_through_the_in_box_agent() {
    let Some((s, bottle)) = launched("") else {
        return;
    };
    let mut call = ToolCall::argv(["sh", "-c", "cat; echo err >&2; exit 3"]);
    call.stdin = b"from stdin".to_vec();
    let result = bottle.execute(&call).unwrap();
    assert_eq!(result.exit_code, 3);
    assert_eq!(result.stdout, b"from stdin");
    assert_eq!(result.stderr, b"err\n");
    assert!(result.evidence_hash.starts_with("sha256:"));
    // The agent's environment reaches the calls, over the same channel.
    assert_eq!(sh(bottle.as_ref(), "echo $EDITOR"), "vi\n");

    let mut slow = ToolCall::argv(["sleep", "30"]);
    slow.deadline = Duration::from_millis(300);
    let err = bottle.execute(&slow).unwrap_err();
    assert_eq!(err.code(), "BOT-X003", "{err}");
    // The channel outlives a timed-out call.
    assert_eq!(sh(bottle.as_ref(), "echo still"), "still\n");
    stopped_clean(&s);
}

#[test]
fn without_the_in_box_agent_execute_is_not_available_and_reset_never_passes() {
    let s = setup("1.9.3", "");
    if !sandbox_available(&s.world) {
        return;
    }
    let backend = s.backend.with_toolbox_binary(None);
    let s = Setup { backend, ..s };
    let plan = s.backend.prepare(&s.spec).unwrap();
    let bottle = s.backend.launch(&plan).unwrap();
    let err = bottle.execute(&ToolCall::argv(["true"])).unwrap_err();
    assert_eq!(err.code(), "BOT-X001", "{err}");
    assert!(err.fix().unwrap().contains("BOTTLE_TOOLBOX_BIN"));
    // No golden snapshot was taken: nothing to revert to, and no pass.
    let err = bottle.reset().unwrap_err();
    assert_eq!(err.code(), "BOT-X005", "{err}");
    assert!(err.to_string().contains("no golden snapshot"), "{err}");
    assert!(halted(&files(&s)).is_some());
    assert_eq!(listed_state(&s), "halted");
    stopped_clean(&s);
}

#[test]
fn a_reset_reverts_the_agents_files_and_processes_and_verifies() {
    let Some((s, bottle)) = launched("") else {
        return;
    };
    let bottle = bottle.as_ref();
    let provisioned = sh(bottle, "cat /etc/bottle/env");
    sh(
        bottle,
        "echo new > /root/created; echo changed >> /etc/bottle/env; rm /etc/bottle/prompt.md",
    );
    sh(bottle, "sleep 1000 </dev/null >/dev/null 2>&1 &");
    let processes = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '";
    assert!(sh(bottle, processes).contains("sleep 1000"));

    for round in 0..2 {
        let report = bottle.reset().unwrap();
        assert!(report.verified, "round {round}: {report:?}");
        assert_eq!(sh(bottle, "cat /etc/bottle/env"), provisioned);
        assert_eq!(sh(bottle, "cat /etc/bottle/prompt.md"), "do the thing\n");
        assert_eq!(
            sh(bottle, "ls /root/created 2>/dev/null || echo gone"),
            "gone\n"
        );
        assert!(!sh(bottle, processes).contains("sleep 1000"));
        sh(bottle, "echo again > /root/created");
    }
    assert!(halted(&files(&s)).is_none());
    assert_eq!(listed_state(&s), "running");
    stopped_clean(&s);
}

#[test]
fn a_baseline_never_recorded_is_not_a_pass() {
    let Some((s, bottle)) = launched("") else {
        return;
    };
    std::fs::remove_file(files(&s).baseline()).unwrap();
    let err = bottle.reset().unwrap_err();
    let SandboxError::ResetDivergence { report } = &err else {
        panic!("not a divergence: {err}")
    };
    assert!(
        report
            .checks
            .iter()
            .all(|c| !c.matched && c.expected == "none recorded"),
        "{report:?}"
    );
    assert!(halted(&files(&s)).is_some());
    assert_eq!(listed_state(&s), "halted");
    stopped_clean(&s);
}

/// Resets `bottle`, which must halt with exactly the sources `diverged`
/// disagreeing; returns the check of `shown`.
fn assert_halts(
    s: &Setup,
    bottle: &dyn Bottle,
    diverged: &[Source],
    shown: Source,
) -> bottle_core::sandbox::SourceCheck {
    let err = bottle.reset().unwrap_err();
    assert_eq!(err.code(), "BOT-X006", "{err}");
    assert_eq!(err.exit_code(), 5);
    let SandboxError::ResetDivergence { report } = err else {
        unreachable!()
    };
    let disagreeing: Vec<Source> = report
        .checks
        .iter()
        .filter(|c| !c.matched)
        .map(|c| c.source)
        .collect();
    assert_eq!(disagreeing, diverged, "{report:?}");
    let check = report
        .checks
        .iter()
        .find(|c| c.source == shown)
        .unwrap()
        .clone();
    assert!(halted(&files(s)).is_some(), "the halt is recorded");
    assert_eq!(listed_state(s), "halted");
    let machine = s
        .backend
        .smolvm()
        .list()
        .unwrap()
        .into_iter()
        .find(|m| m.name == MACHINE)
        .unwrap();
    assert_eq!(machine.state(), "stopped", "a halted bottle is stopped");
    check
}

#[test]
fn a_file_planted_in_the_golden_disk_halts_the_reset() {
    let Some((s, bottle)) = launched("") else {
        return;
    };
    let golden = files(&s).golden_dir().join("overlay.raw");
    let disk = std::fs::OpenOptions::new()
        .write(true)
        .open(&golden)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&disk, b"planted", 7 << 20).unwrap();
    let check = assert_halts(
        &s,
        bottle.as_ref(),
        &[Source::Filesystem],
        Source::Filesystem,
    );
    assert!(check.observed.starts_with("sha256:"), "{check:?}");
    stopped_clean(&s);
}

#[test]
fn a_process_that_survives_the_revert_halts_the_reset() {
    let Some((s, bottle)) = launched("keep-guest-processes") else {
        return;
    };
    sh(bottle.as_ref(), "sleep 1000 </dev/null >/dev/null 2>&1 &");
    let check = assert_halts(&s, bottle.as_ref(), &[Source::OpenFds], Source::OpenFds);
    assert!(
        check.observed.parse::<u64>().unwrap() > check.expected.parse::<u64>().unwrap(),
        "{check:?}"
    );
    stopped_clean(&s);
}

#[test]
fn a_record_changed_behind_bottles_back_halts_the_reset_and_is_never_started() {
    let Some((s, bottle)) = launched("") else {
        return;
    };
    let db = rusqlite::Connection::open(s.world.db()).unwrap();
    let data: Vec<u8> = db
        .query_row("SELECT data FROM vms WHERE name = ?1", [MACHINE], |r| {
            r.get(0)
        })
        .unwrap();
    let mut record: serde_json::Value = serde_json::from_slice(&data).unwrap();
    record["allowed_cidrs"] = serde_json::json!(["192.168.77.2/32", "0.0.0.0/0"]);
    db.execute(
        "UPDATE vms SET data = ?1 WHERE name = ?2",
        rusqlite::params![serde_json::to_vec(&record).unwrap(), MACHINE],
    )
    .unwrap();
    // Never started with that record, the machine has no in-box agent to
    // count its descriptors either.
    let check = assert_halts(
        &s,
        bottle.as_ref(),
        &[Source::OpenFds, Source::Engine],
        Source::Engine,
    );
    assert!(check.observed.contains("0.0.0.0/0"), "{check:?}");
    assert!(
        s.world
            .booted(MACHINE)
            .is_some_and(|b| b["allowed_cidrs"] == serde_json::json!(["192.168.77.2/32"])),
        "the widened record was never booted"
    );
    stopped_clean(&s);
}

/// Waits for the forging attack logging to `log` to finish its rounds.
fn attack_log(bottle: &dyn Bottle, log: &str) -> String {
    let mut said = String::new();
    bottle_test_support::wait_until("the attack to finish", Duration::from_secs(30), || {
        said = sh(bottle, &format!("cat {log} 2>/dev/null || true"));
        said.ends_with("done\n")
    });
    said
}

/// A call's outcome: the real one, or a `BOT-X` error; never the forged.
fn real_or_refused(
    outcome: Result<bottle_core::sandbox::ToolResult, SandboxError>,
    real: &[u8],
    exit_code: i32,
) {
    match outcome {
        Ok(result) => {
            assert!(
                !String::from_utf8_lossy(&result.stdout)
                    .contains(bottle_test_support::forge::FORGED),
                "a forged result was taken: {result:?}"
            );
            assert_eq!((result.exit_code, &result.stdout[..]), (exit_code, real));
        }
        Err(err) => assert!(err.code().starts_with("BOT-X"), "{err}"),
    }
}

fn no_toolbox_write(said: &str) -> bool {
    !said
        .lines()
        .any(|l| l.starts_with("toolbox") && l.ends_with("wrote"))
}

#[test]
fn the_agent_cannot_forge_or_plant_a_tool_result() {
    let Some((s, bottle)) = launched("") else {
        return;
    };
    // The attack of issue 25 from inside a call: a forged answer written
    // into the in-box agent's stdout while the call runs.
    let attack = bottle_test_support::forge::attack_script(
        bottle_test_support::forge::IN_BOX,
        "/tmp/forge.log",
        1,
        "0",
    );
    let call = ToolCall::argv([
        "sh".to_string(),
        "-c".to_string(),
        format!("( {attack} ) > /dev/null 2>&1 & sleep 0.3; echo real-output; exit 3"),
    ]);
    real_or_refused(bottle.execute(&call), b"real-output\n", 3);
    let said = attack_log(bottle.as_ref(), "/tmp/forge.log");
    assert!(
        said.contains(": denied\n") && !said.contains("toolbox: not found"),
        "{said}"
    );
    assert!(no_toolbox_write(&said), "{said}");
    // The same write into a process of the call's own uid goes through.
    assert!(said.contains("control: wrote\n"), "{said}");
    // The calls hold no capability (the fake's guest root has them all):
    // none to trace the in-box agent with.
    assert_eq!(
        sh(
            bottle.as_ref(),
            "grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status | cut -f2 | sort -u"
        ),
        "0000000000000000\n"
    );

    // Planted ahead, through the channel the bottle keeps open.
    let attack = bottle_test_support::forge::attack_script(
        bottle_test_support::forge::IN_BOX,
        "/tmp/plant.log",
        10,
        "0.1",
    );
    let planter = ToolCall::argv([
        "sh".to_string(),
        "-c".to_string(),
        format!("( {attack} ) > /dev/null 2>&1 &"),
    ]);
    real_or_refused(bottle.execute(&planter), b"", 0);
    for _ in 0..5 {
        real_or_refused(
            bottle.execute(&ToolCall::argv(["echo", "real-later"])),
            b"real-later\n",
            0,
        );
        real_or_refused(
            bottle.execute(&ToolCall::tool(
                "read_file",
                serde_json::json!({"path": "/etc/bottle/env"}),
            )),
            sh(bottle.as_ref(), "cat /etc/bottle/env").as_bytes(),
            0,
        );
    }
    let said = attack_log(bottle.as_ref(), "/tmp/plant.log");
    assert!(no_toolbox_write(&said), "{said}");
    assert!(said.contains("control: wrote\n"), "{said}");
    stopped_clean(&s);
}
