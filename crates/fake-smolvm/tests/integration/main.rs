//! The double's CLI contract, which mirrors smolvm's: `--version`, the
//! argv shapes of each version (a wrong shape is clap's exit 2), smolvm's
//! own errors (`Error: …`, exit 1), and the call log. What the backend does
//! with it is tested in bottle-smolvm, bottle-cli and xtask.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers panic on setup failure, as tests do"
)]

mod disks;
mod exec;

use std::path::{Path, PathBuf};

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};

/// The double pretending to be `version`, its data under `dir`.
fn fake(dir: &Path, version: &str, args: &[&str]) -> CommandOutput {
    let spec = CommandSpec::new(env!("CARGO_BIN_EXE_fake-smolvm"))
        .args(args)
        .env("HOME", dir.join("home"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("SMOLVM_DATA_DIR", "")
        .env("FAKE_SMOLVM_VERSION", version)
        .env("FAKE_SMOLVM_MODE", "");
    SystemRunner.run(&spec).unwrap()
}

fn artifact(dir: &Path) -> PathBuf {
    let path = dir.join("a.smolmachine");
    std::fs::write(&path, r#"{"format":"fake-smolmachine/1","image":"i"}"#).unwrap();
    path
}

#[test]
fn version_is_the_one_it_pretends_to_be() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--version", "-V"] {
        let out = fake(dir.path(), "1.1.3", &[flag]);
        assert_eq!(out.code, Some(0), "{flag}");
        assert_eq!(out.stdout_text(), "smolvm 1.1.3\n", "{flag}");
    }
}

#[test]
fn the_machine_name_is_positional_before_1_1_and_a_flag_from_1_1() {
    let dir = tempfile::tempdir().unwrap();
    let from = artifact(dir.path());
    let from = from.to_str().unwrap();
    let cases = [
        (
            "1.0.5",
            ["machine", "create", "--name", "m", "--from", from],
            2,
        ),
        (
            "1.0.5",
            ["machine", "create", "m", "--from", from, "--net"],
            0,
        ),
        (
            "1.9.3",
            ["machine", "create", "n", "--from", from, "--net"],
            2,
        ),
        (
            "1.9.3",
            ["machine", "create", "--name", "n", "--from", from],
            0,
        ),
    ];
    for (version, argv, code) in cases {
        let out = fake(dir.path(), version, &argv);
        assert_eq!(
            out.code,
            Some(code),
            "{version} {argv:?}: {}",
            out.stderr_text()
        );
        if code == 2 {
            assert!(
                out.stderr_text().starts_with("error: "),
                "{}",
                out.stderr_text()
            );
        }
    }
    let out = fake(
        dir.path(),
        "1.0.5",
        &["machine", "delete", "--name", "m", "-f"],
    );
    assert_eq!(out.code, Some(2));
    let out = fake(dir.path(), "1.0.5", &["vm", "rm", "m", "-f"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let out = fake(
        dir.path(),
        "1.9.3",
        &["machine", "delete", "--name", "n", "-f"],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let out = fake(dir.path(), "1.9.3", &["machine", "ls", "--json"]);
    assert_eq!(out.stdout_text().trim(), "[]");
}

#[test]
fn smolvms_own_errors_exit_1_and_usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = fake(dir.path(), "1.9.3", &["machine", "start", "--name", "none"]);
    assert_eq!(out.code, Some(1));
    assert_eq!(out.stderr_text(), "Error: machine 'none' not found\n");

    for argv in [
        &["machine", "frobnicate"][..],
        &["machine", "exec", "--name", "m"],
        &[
            "machine", "exec", "--name", "m", "-e", "NOEQUALS", "--", "true",
        ],
        &["machine", "cp", "only-one"],
        &["pack", "create", "--image", "localhost:1/a:b"],
        &["machine", "create", "--name", "m"],
    ] {
        let out = fake(dir.path(), "1.9.3", argv);
        assert_eq!(out.code, Some(2), "{argv:?}: {}", out.stderr_text());
    }
}

#[test]
fn every_call_is_logged_with_its_argv() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), "1.9.3", &["machine", "ls"]);
    fake(dir.path(), "1.9.3", &["bogus"]);
    let log = std::fs::read_to_string(dir.path().join("data/smolvm/fake/calls.jsonl")).unwrap();
    let argvs: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["argv"].clone())
        .collect();
    assert_eq!(
        argvs,
        [
            serde_json::json!(["machine", "ls"]),
            serde_json::json!(["bogus"])
        ]
    );
}

#[test]
fn as_root_a_kvm_the_kvm_group_cannot_open_fails_start_and_leaves_created() {
    if !nix::unistd::geteuid().is_root() {
        println!("skip: the real smolvm drops privileges only when run as root");
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("kvm");
    std::fs::write(&device, "").unwrap();
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o600)).unwrap();
    let from = artifact(dir.path());
    let create = fake(
        dir.path(),
        "1.9.3",
        &[
            "machine",
            "create",
            "--name",
            "m",
            "--from",
            from.to_str().unwrap(),
        ],
    );
    assert_eq!(create.code, Some(0), "{}", create.stderr_text());
    let start = CommandSpec::new(env!("CARGO_BIN_EXE_fake-smolvm"))
        .args(["machine", "start", "--name", "m"])
        .env("HOME", dir.path().join("home"))
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .env("SMOLVM_DATA_DIR", "")
        .env("FAKE_SMOLVM_VERSION", "1.9.3")
        .env("FAKE_SMOLVM_KVM_DEVICE", &device);
    let out = SystemRunner.run(&start).unwrap();
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr_text()
            .starts_with("Error: start vm: krun_start_enter returned: -13 (KVM inaccessible to the VM process after privilege drop"),
        "{}",
        out.stderr_text()
    );
    let ls = fake(dir.path(), "1.9.3", &["machine", "ls", "--json"]);
    let machines: Vec<serde_json::Value> = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(machines.len(), 1, "{machines:?}");
    assert_eq!(machines[0]["state"], "created", "{machines:?}");

    // Group kvm read-write (or world read-write) lets the VM open it.
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(SystemRunner.run(&start).unwrap().code, Some(0));
}

#[test]
fn storage_sizes_the_machines_disk_and_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let from = artifact(dir.path());
    let from = from.to_str().unwrap();
    let create = |name: &str, storage: &str| {
        fake(
            dir.path(),
            "1.9.3",
            &[
                "machine",
                "create",
                "--name",
                name,
                "--from",
                from,
                "--storage",
                storage,
            ],
        )
    };
    let out = create("m", "10");
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    let out = fake(dir.path(), "1.9.3", &["machine", "ls", "--json"]);
    let machines: serde_json::Value = serde_json::from_str(&out.stdout_text()).unwrap();
    assert_eq!(machines[0]["storage_gb"], 10);
    let out = create("z", "0");
    assert_eq!(out.code, Some(1));
    assert_eq!(
        out.stderr_text(),
        "Error: storage disk size must be greater than 0 GiB\n"
    );
    assert_eq!(create("g", "1.5").code, Some(2), "GiB are whole");
}
