//! The smolvm check: lookup on an injected PATH, `--version` through fake
//! and real runners, the supported version range.

use std::io;

use bottle_core::BackendKind;
use bottle_core::exec::{CommandOutput, SystemRunner};
use bottle_preflight::smolvm::check_smolvm;
use bottle_preflight::{Check, Status};

use bottle_test_support::RecordingRunner;

use crate::support::FakeHost;

/// A fake host with an executable `smolvm` in `<root>/bin`, and that dir as PATH.
fn host_with_smolvm(script: &str) -> FakeHost {
    let host = FakeHost::new();
    host.write("/bin/smolvm", script);
    host.chmod("/bin/smolvm", 0o755);
    host
}

fn run(host: &FakeHost, runner: &RecordingRunner, backend: BackendKind) -> Check {
    let mut ctx = host.ctx(runner, backend);
    ctx.path = Some(host.path("/bin").into_os_string());
    check_smolvm(&ctx)
}

#[test]
fn supported_version_passes_and_argv_is_path_then_flag() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::printing("smolvm 1.9.3\n");
    let check = run(&host, &runner, BackendKind::Smolmachines);
    let binary = host.path("/bin/smolvm");
    assert_eq!(check.status, Status::Ok);
    assert_eq!(
        check.message,
        format!("smolvm 1.9.3 at {}", binary.display())
    );
    assert_eq!(
        runner.calls(),
        [vec![binary.display().to_string(), "--version".to_owned()]]
    );
}

#[test]
fn real_process_is_run_and_parsed() {
    let host = host_with_smolvm("#!/bin/sh\necho \"smolvm 1.8.0\"\n");
    let mut ctx = host.ctx(&SystemRunner, BackendKind::Smolmachines);
    ctx.path = Some(host.path("/bin").into_os_string());
    let check = check_smolvm(&ctx);
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert!(
        check.message.starts_with("smolvm 1.8.0 at "),
        "{}",
        check.message
    );
}

#[test]
fn too_old_fails_naming_the_tsi_fix() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::printing("smolvm 0.8.0\n");
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.contains("is older than 1.1.3: before 1.1.3 smolvm did not enforce the TSI allowlist (smolvm PR #427)"),
        "{}",
        check.message
    );
    assert!(
        check
            .remediation
            .unwrap()
            .starts_with("upgrade smolvm to 1.8.0 or newer")
    );
}

#[test]
fn too_old_only_warns_for_the_docker_backend() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::printing("smolvm 0.8.0\n");
    let check = run(&host, &runner, BackendKind::Docker);
    assert_eq!(check.status, Status::Warn);
    assert!(
        check
            .message
            .ends_with("(only the smolmachines backend needs it)")
    );
}

#[test]
fn below_1_8_is_supported_with_the_state_db_note() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::printing("smolvm 1.1.3\n");
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Ok);
    assert!(
        check.message.ends_with("below 1.8.0 smolvm drops `--allow-cidr` with `--from`, so the allowlist will be written into smolvm's state DB and verified before each start"),
        "{}",
        check.message
    );
}

#[test]
fn major_2_is_untested() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::printing("smolvm 2.0.1\n");
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Warn);
    assert!(check.message.contains("is untested"), "{}", check.message);
}

#[test]
fn not_on_path_fails_when_selected_and_skips_otherwise() {
    let host = FakeHost::new();
    host.mkdir("/bin");
    let runner = RecordingRunner::refusing();
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Fail);
    assert_eq!(check.message, "smolvm is not on PATH");
    assert!(
        check
            .remediation
            .unwrap()
            .contains("https://smolmachines.com/install.sh")
    );

    let check = run(&host, &runner, BackendKind::Docker);
    assert_eq!(check.status, Status::Skip);
    assert!(runner.calls().is_empty());
}

#[test]
fn non_executable_file_is_not_found() {
    let host = FakeHost::new();
    host.write("/bin/smolvm", "");
    host.chmod("/bin/smolvm", 0o644);
    let runner = RecordingRunner::refusing();
    assert_eq!(
        run(&host, &runner, BackendKind::Smolmachines).message,
        "smolvm is not on PATH"
    );
}

#[test]
fn failing_version_command_fails() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::with(|_| {
        Ok(CommandOutput {
            code: Some(2),
            stdout: Vec::new(),
            stderr: b"error: unknown flag\n".to_vec(),
        })
    });
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check
            .message
            .ends_with("--version` exited with code 2: error: unknown flag"),
        "{}",
        check.message
    );
}

#[test]
fn unstartable_binary_fails() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::with(|_| Err(io::Error::from(io::ErrorKind::PermissionDenied)));
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.starts_with("could not run `"),
        "{}",
        check.message
    );
}

#[test]
fn unparseable_version_fails() {
    let host = host_with_smolvm("");
    let runner = RecordingRunner::printing("smolvm (development build)\n");
    let check = run(&host, &runner, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.contains("could not find a version"),
        "{}",
        check.message
    );
}
