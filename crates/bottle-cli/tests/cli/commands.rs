//! Command-surface behaviour that needs no backend.

use bottle_test_support::temp_state_root;
use predicates::prelude::*;

use crate::{bottle, repo_root};

fn example_manifest() -> std::path::PathBuf {
    repo_root().join("examples/bottle.toml")
}

#[test]
fn plan_prints_the_plan_of_the_example() {
    let state = temp_state_root();
    bottle(state.path())
        .arg("--manifest")
        .arg(example_manifest())
        .args(["plan", "demo"])
        .assert()
        .success()
        .stdout(predicate::str::contains("bottle       bot-bottle-demo"))
        .stdout(predicate::str::contains("egress"));
}

#[test]
fn plan_json_is_machine_readable() {
    let state = temp_state_root();
    let output = bottle(state.path())
        .arg("--manifest")
        .arg(example_manifest())
        .args(["plan", "demo", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(plan["bottle"], "bot-bottle-demo");
    assert_eq!(plan["version"], 1);
}

#[test]
fn unknown_agent_suggests_the_close_one() {
    let state = temp_state_root();
    bottle(state.path())
        .arg("--manifest")
        .arg(example_manifest())
        .args(["plan", "dem"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("did you mean \"demo\"?"));
}

#[test]
fn unknown_backend_is_a_usage_error() {
    let state = temp_state_root();
    bottle(state.path())
        .env("BOT_BOTTLE_BACKEND", "podman")
        .arg("--manifest")
        .arg(example_manifest())
        .args(["plan", "demo"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "error[BOT-C001]: unknown backend \"podman\"",
        ))
        .stderr(predicate::str::contains(
            "fix: use one of: docker, smolmachines",
        ));
}

#[test]
fn missing_manifest_names_the_file_and_the_fix() {
    let state = temp_state_root();
    bottle(state.path())
        .current_dir(state.path())
        .args(["plan", "demo"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("error[BOT-M001]: bottle.toml"))
        .stderr(predicate::str::contains("fix:"));
}

#[test]
fn check_reports_a_missing_relative_git_repository_from_another_directory() {
    let state = temp_state_root();
    let sub = state.path().join("project");
    std::fs::create_dir_all(sub.join("git")).unwrap();
    std::fs::write(
        sub.join("bottle.toml"),
        "[agents.claude]\nimage = \"x\"\n\n[[agents.claude.git]]\nname = \"app\"\nurl = \"git/app.git\"\n",
    )
    .unwrap();
    bottle(state.path())
        .current_dir(state.path())
        .args(["--manifest", "project/bottle.toml", "check"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with(
            "error[BOT-M070]: project/bottle.toml:6:7: agents.claude.git[0].url: \
             git repository \"git/app.git\" does not exist",
        ))
        .stderr(predicate::str::contains(
            "fix: point url at an existing working checkout or bare repository",
        ));
    // Created next to the manifest, not in the working directory: it loads
    // once it is a repository.
    std::fs::create_dir(sub.join("git/app.git")).unwrap();
    bottle(state.path())
        .current_dir(state.path())
        .args(["--manifest", "project/bottle.toml", "check"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("error[BOT-M071]: "));
    for d in ["objects", "refs"] {
        std::fs::create_dir(sub.join("git/app.git").join(d)).unwrap();
    }
    std::fs::write(sub.join("git/app.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    bottle(state.path())
        .current_dir(state.path())
        .args(["--manifest", "project/bottle.toml", "check"])
        .assert()
        .success();
}

#[test]
fn start_without_a_terminal_or_yes_refuses_and_leaves_nothing() {
    let state = temp_state_root();
    let assert = bottle(state.path())
        .env("BOT_BOTTLE_BACKEND", "smolmachines")
        .arg("--manifest")
        .arg(example_manifest())
        .args(["start", "demo"])
        .assert()
        .failure();
    let code = assert.get_output().status.code();
    assert!(code.is_some_and(|c| c != 0 && c != 1), "exit {code:?}");
    assert!(std::fs::read_dir(state.path()).unwrap().next().is_none());
}

#[test]
fn completions_are_generated() {
    let state = temp_state_root();
    bottle(state.path())
        .args(["completions", "bash"])
        .assert()
        .success()
        .stdout(predicate::str::contains("list-bottles"));
}

#[test]
fn list_alias_and_help_work() {
    let state = temp_state_root();
    bottle(state.path())
        .args(["list-bottles", "--help"])
        .assert()
        .success();
}

#[test]
fn doctor_reports_every_check_and_exits_by_its_verdict() {
    let state = temp_state_root();
    let output = bottle(state.path())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let ids: Vec<&str> = checks.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "platform",
            "kernel.version",
            "kvm.device",
            "kvm.access",
            "kvm.module",
            "kvm.cpu",
            "kvm.group",
            "kvm.guest",
            "smolvm.version",
            "docker.daemon",
            "docker.disk_quota",
            "docker.gvisor",
            "bundle.binary",
            "toolbox.binary"
        ]
    );
    let failed = checks.iter().any(|c| c["status"] == "fail");
    assert_eq!(output.status.code(), Some(if failed { 3 } else { 0 }));
    if bottle_test_support::docker_required() {
        let docker = checks.iter().find(|c| c["id"] == "docker.daemon").unwrap();
        assert_eq!(docker["status"], "ok", "{docker:#}");
    }
}

#[test]
fn doctor_says_microvm_guests_cannot_run_without_hardware_virtualisation() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo.lines().filter(|line| line.starts_with("flags"));
    if flags
        .flat_map(str::split_whitespace)
        .any(|flag| flag == "vmx" || flag == "svm")
    {
        println!("skip: this host's cpu has vmx or svm; kvm here can run guests");
        return;
    }
    let state = temp_state_root();
    let output = bottle(state.path())
        .args(["--backend", "smolmachines", "doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    if !std::path::Path::new("/dev/kvm").exists() {
        return;
    }
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let cpu = checks.iter().find(|c| c["id"] == "kvm.cpu").unwrap();
    assert_eq!(cpu["status"], "fail", "{cpu:#}");
    assert!(
        cpu["message"]
            .as_str()
            .unwrap()
            .contains("microVM guests cannot run"),
        "{cpu:#}"
    );
}

#[test]
fn plan_shows_dropped_devices_and_why() {
    let state = temp_state_root();
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        "[agents.gpu]\nimage = \"x:1\"\ndevices = [\"/dev/null\", \"/dev/zero\"]\ndevices_blacklist = [\"/dev/zero\"]\n",
    )
    .unwrap();
    bottle(state.path())
        .arg("--manifest")
        .arg(&manifest)
        .args(["plan", "gpu"])
        .assert()
        .success()
        .stdout(predicate::str::contains("device       /dev/null"))
        .stdout(predicate::str::contains("dropped      /dev/zero"))
        .stderr(predicate::str::contains("warning:"));
}

/// The lines of stderr that carry a fix.
fn fix_lines(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|line| line.contains("fix:"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_manifest_error_prints_its_fix_once() {
    let state = temp_state_root();
    let manifest = state.path().join("bottle.toml");
    std::fs::write(&manifest, "[agents.a]\nimage = \"x\"\nimgae = \"y\"\n").unwrap();
    let output = bottle(state.path())
        .arg("--manifest")
        .arg(&manifest)
        .arg("check")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error[BOT-M003]: "), "{stderr}");
    assert_eq!(
        fix_lines(&output.stderr),
        ["  fix: did you mean `image`?"],
        "{stderr}"
    );
}

#[test]
fn a_backend_error_with_causes_prints_its_fix_once() {
    // A daemon socket that does not exist: the docker backend fails with a
    // typed error whose cause is the client's error.
    let state = temp_state_root();
    let socket = state.path().join("no-daemon.sock");
    let output = bottle(state.path())
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .args(["--backend", "docker", "list"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "preflight exit code");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error[BOT-D001]: "), "{stderr}");
    let fixes = fix_lines(&output.stderr);
    assert_eq!(fixes.len(), 1, "{stderr}");
    assert!(
        fixes[0].starts_with("  fix: start the docker daemon"),
        "{stderr}"
    );
    assert!(stderr.ends_with(&format!("{}\n", fixes[0])), "{stderr}");
}

#[test]
fn logs_print_the_rotated_generations_oldest_first() {
    let state = temp_state_root();
    let logs = state.path().join("bottle").join("claude").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let line = |host: &str| format!("{}\n", serde_json::json!({ "v": 2, "host": host }));
    std::fs::write(logs.join("audit.jsonl.2"), line("oldest")).unwrap();
    std::fs::write(logs.join("audit.jsonl.1"), line("older")).unwrap();
    std::fs::write(logs.join("audit.jsonl"), line("live")).unwrap();
    let output = bottle(state.path())
        .args(["logs", "--json", "claude"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let hosts: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["host"].to_string())
        .collect();
    assert_eq!(hosts, [r#""oldest""#, r#""older""#, r#""live""#]);
}

#[test]
fn logs_show_one_readable_line_per_decision_in_local_time() {
    let state = temp_state_root();
    let logs = state.path().join("bottle").join("claude").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let record = |time: &str,
                  daemon: &str,
                  decision: &str,
                  target: (&str, u16),
                  request: (&str, &str),
                  status: u16,
                  reason: &str,
                  count: u64| {
        serde_json::json!({
            "v": 2, "time": time, "bottle": "bot-bottle-claude", "daemon": daemon,
            "decision": decision, "host": target.0, "port": target.1,
            "method": request.0, "path": request.1, "status": status,
            "bytes_up": 0, "bytes_down": 0, "duration_ms": 1,
            "reason": reason, "rule": "", "count": count,
        })
    };
    let lines = [
        record(
            "2025-01-02T03:04:05.678Z",
            "proxy",
            "allow",
            ("api.example.com", 443),
            ("GET", "/v1/models"),
            200,
            "allowed",
            1,
        ),
        record(
            "2025-01-02T03:04:06.001Z",
            "proxy",
            "deny",
            ("evil.example", 443),
            ("CONNECT", ""),
            403,
            "host_not_allowed",
            12,
        ),
        record(
            "2025-01-02T23:59:59.000Z",
            "supervise",
            "allow",
            ("docs.rs", 0),
            ("egress", "claude-3"),
            0,
            "operator_approved",
            1,
        ),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(logs.join("audit.jsonl"), text).unwrap();
    let output = bottle(state.path())
        // Two hours east of UTC (POSIX writes the offset west-positive).
        .env("TZ", "UTC-2")
        .args(["logs", "claude"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "2025-01-02 05:04:05  allow  GET api.example.com:443/v1/models  200  allowed\n\
         2025-01-02 05:04:06  deny  CONNECT evil.example:443  403  host_not_allowed  (x12)\n\
         2025-01-03 01:59:59  allow  egress docs.rs claude-3  -  operator_approved\n"
    );
}

#[test]
fn logs_read_the_kept_lines_and_the_dropped_summary_before_the_stream_every_version() {
    let state = temp_state_root();
    let logs = state.path().join("bottle").join("claude").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let base = |time: &str, daemon: &str, decision: &str, host: &str| {
        serde_json::json!({
            "v": 3, "time": time, "bottle": "bot-bottle-claude", "daemon": daemon,
            "decision": decision, "host": host, "port": 443, "method": "POST",
            "path": "/upload", "status": 403, "bytes_up": 0, "bytes_down": 0,
            "duration_ms": 1, "reason": "secret:aws_access_key_id", "rule": "", "count": 1,
        })
    };
    let finding = base(
        "2025-01-02T03:04:05.000Z",
        "proxy",
        "blocked_secret",
        "api.example.com",
    );
    let mut inject = base(
        "2025-01-02T03:04:06.000Z",
        "egress",
        "inject",
        "api.github.com",
    );
    inject["reason"] = "credential:github".into();
    inject["status"] = 0.into();
    let tool = serde_json::json!({
        "v": 3, "time": "2025-01-02T03:04:07.000Z", "bottle": "bot-bottle-claude",
        "daemon": "sandbox", "decision": "allow", "host": "", "port": 0, "method": "EXEC",
        "path": "make test", "status": 0, "bytes_up": 0, "bytes_down": 3, "duration_ms": 9,
        "reason": "exit_0", "rule": "", "count": 1, "evidence": "sha256:ab12",
    });
    std::fs::write(
        logs.join("audit.jsonl.kept"),
        format!(
            "{finding}
{inject}
{tool}
"
        ),
    )
    .unwrap();
    let summary = serde_json::json!({
        "v": 3, "time": "2025-01-02T03:10:00.000Z", "bottle": "bot-bottle-claude",
        "daemon": "audit", "decision": "dropped", "host": "", "port": 0, "method": "",
        "path": "", "status": 0, "bytes_up": 0, "bytes_down": 0, "duration_ms": 0,
        "reason": "rotated", "rule": "", "count": 85850, "since": "2025-01-02T03:04:08.000Z",
        "lines": 2288, "unkept": 0, "hosts": ["a.test", "b.test"],
        "dropped": [
            {"daemon": "proxy", "decision": "deny", "reason": "host_not_allowed", "count": 85000},
            {"daemon": "proxy", "decision": "allow", "reason": "allowed", "count": 850},
        ],
    });
    std::fs::write(
        logs.join("audit.jsonl.dropped"),
        format!(
            "{summary}
"
        ),
    )
    .unwrap();
    let mut merged = base(
        "2025-01-02T03:11:00.000Z",
        "proxy",
        "deny",
        "h9.denied.test",
    );
    merged["reason"] = "host_not_allowed".into();
    merged["method"] = "GET".into();
    merged["count"] = 4000.into();
    merged["hosts"] = (1..=8)
        .map(|i| format!("h{i}.denied.test"))
        .collect::<Vec<_>>()
        .into();
    // Lines of older versions, in older generations, still read.
    let v1 = r#"{"v":1,"time":"2025-01-02T03:10:30.000Z","bottle":"b","daemon":"proxy","decision":"allow","host":"old.example","port":443,"method":"GET","path":"/","bytes_up":0,"bytes_down":0,"duration_ms":1,"reason":"allowed","rule":""}"#;
    std::fs::write(
        logs.join("audit.jsonl.1"),
        format!(
            "{v1}
"
        ),
    )
    .unwrap();
    std::fs::write(
        logs.join("audit.jsonl"),
        format!(
            "{merged}
"
        ),
    )
    .unwrap();

    let output = bottle(state.path())
        .env("TZ", "UTC")
        .args(["logs", "claude"])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        "2025-01-02 03:04:05  blocked_secret  POST api.example.com:443/upload  403  secret:aws_access_key_id\n\
         2025-01-02 03:04:06  inject  POST api.github.com:443/upload  -  credential:github\n\
         2025-01-02 03:04:07  allow  EXEC  make test  -  exit_0  evidence sha256:ab12\n\
         2025-01-02 03:10:00  dropped  85850 decisions rotated out since 2025-01-02 03:04:08: proxy deny host_not_allowed x85000, proxy allow allowed x850; hosts a.test, b.test, …\n\
         2025-01-02 03:10:30  allow  GET old.example:443/  -  allowed\n\
         2025-01-02 03:11:00  deny  GET h9.denied.test:443/upload  403  host_not_allowed  (x4000; hosts h1.denied.test, h2.denied.test, h3.denied.test, h4.denied.test, h5.denied.test, h6.denied.test, h7.denied.test, h8.denied.test, …)\n"
    );
    let json = bottle(state.path())
        .args(["logs", "--json", "claude"])
        .output()
        .unwrap();
    let decisions: Vec<String> = String::from_utf8(json.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["decision"].to_string())
        .collect();
    assert_eq!(
        decisions,
        [
            r#""blocked_secret""#,
            r#""inject""#,
            r#""allow""#,
            r#""dropped""#,
            r#""allow""#,
            r#""deny""#
        ]
    );
}

/// Plants a kept run of bottle `slug`'s audit log, stopped at `run`, whose
/// one line names `host`.
fn plant_kept_run(state: &std::path::Path, slug: &str, run: &str, host: &str) {
    let dir = state.join("bottle/retained_logs").join(slug).join(run);
    std::fs::create_dir_all(&dir).unwrap();
    let line = serde_json::json!({ "v": 2, "decision": "allow", "host": host });
    std::fs::write(dir.join("audit.jsonl"), format!("{line}\n")).unwrap();
}

/// The hosts of `bottle logs --json ARGS`' lines.
fn logged_hosts(state: &std::path::Path, args: &[&str]) -> Vec<String> {
    let output = bottle(state)
        .args(["logs", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["host"].to_string())
        .collect()
}

#[test]
fn logs_of_a_stopped_bottle_read_its_kept_runs_newest_first_and_by_run() {
    let state = temp_state_root();
    plant_kept_run(state.path(), "claude", "2025-01-01T10:00:00.000Z", "first");
    plant_kept_run(state.path(), "claude", "2025-01-02T10:00:00.000Z", "second");
    plant_kept_run(
        state.path(),
        "other",
        "2025-01-03T10:00:00.000Z",
        "not-mine",
    );
    assert_eq!(logged_hosts(state.path(), &["claude"]), [r#""second""#]);
    assert_eq!(
        logged_hosts(state.path(), &["bot-bottle-claude", "--run", "2025-01-01"]),
        [r#""first""#]
    );
    bottle(state.path())
        .args(["logs", "claude", "--runs"])
        .assert()
        .success()
        .stdout(predicate::str::starts_with("RUN "))
        .stdout(predicate::str::contains("2025-01-01T10:00:00.000Z"))
        .stdout(predicate::str::contains("2025-01-02T10:00:00.000Z"))
        .stdout(predicate::str::contains("2025-01-03").not());
    bottle(state.path())
        .args(["logs", "claude", "--run", "2024"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("error[BOT-C020]"))
        .stderr(predicate::str::contains(
            "fix: use one of: 2025-01-01T10:00:00.000Z, 2025-01-02T10:00:00.000Z",
        ));
    // Started again under the same name: the live log is read, not a run.
    let live = state.path().join("bottle/claude/logs");
    std::fs::create_dir_all(&live).unwrap();
    std::fs::write(
        live.join("audit.jsonl"),
        format!("{}\n", serde_json::json!({ "v": 2, "host": "live" })),
    )
    .unwrap();
    assert_eq!(logged_hosts(state.path(), &["claude"]), [r#""live""#]);
}
