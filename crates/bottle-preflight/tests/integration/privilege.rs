//! `/dev/kvm` as seen by a user who may not open it. (The Docker socket's
//! check is the docker backend's: bottle-docker's `host_checks` tests.)
//!
//! The access test is the real `access(2)` under the real process identity,
//! and root may open anything. So when the suite runs as root, this test
//! re-runs itself as `nobody` through `setpriv` against the same fake root
//! and reads the child's checks back as JSON.

use bottle_core::BackendKind;
use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use bottle_preflight::{Context, HostRoot, run_all};
use serde_json::Value;

use crate::support::{FakeHost, is_root};

const CHILD_ENV: &str = "BOTTLE_PREFLIGHT_CHILD_ROOT";
const MARKER: &str = "PREFLIGHT-CHILD-JSON ";
const THIS_TEST: &str = "privilege::unprivileged_user_is_denied_kvm";
const NOBODY: u32 = 65534;
const KVM_GID: u32 = 994;

#[test]
fn unprivileged_user_is_denied_kvm() {
    if let Some(root) = std::env::var_os(CHILD_ENV) {
        // Child mode: report what this (unprivileged) process sees. The
        // harness prints the test name on the same line, hence the marker.
        let mut ctx = Context::from_host(&SystemRunner, BackendKind::Smolmachines);
        ctx.root = HostRoot::new(root);
        ctx.path = None;
        println!(
            "{MARKER}{}",
            serde_json::to_string(&run_all(&ctx, &[])).unwrap()
        );
        return;
    }

    let host = FakeHost::new();
    host.chmod("/", 0o755);
    host.write(
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    );
    host.write("/etc/group", "root:x:0:\nkvm:x:994:\nnogroup:x:65534:\n");
    let kvm = host.write("/dev/kvm", "");

    let checks: Vec<Value> = if is_root() {
        if which::which("setpriv").is_err() {
            println!("skip: {THIS_TEST} runs as root and needs setpriv to drop to nobody");
            return;
        }
        nix::unistd::chown(&kvm, None, Some(nix::unistd::Gid::from_raw(KVM_GID))).unwrap();
        host.chmod("/dev/kvm", 0o660);
        let exe = std::env::current_exe().unwrap();
        let spec = CommandSpec::new("setpriv")
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(exe)
            .args(["--exact", THIS_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, host.dir.path());
        let out = SystemRunner.run(&spec).unwrap();
        let stdout = out.stdout_text();
        assert!(
            out.success(),
            "child failed: {stdout}\n{}",
            out.stderr_text()
        );
        let json = stdout
            .lines()
            .find_map(|line| line.split_once(MARKER).map(|(_, json)| json))
            .unwrap_or_else(|| panic!("no checks in child output: {stdout}"));
        serde_json::from_str(json).unwrap()
    } else {
        host.chmod("/dev/kvm", 0o000);
        let mut ctx = Context::from_host(&SystemRunner, BackendKind::Smolmachines);
        ctx.root = host.root();
        ctx.path = None;
        serde_json::from_str(&serde_json::to_string(&run_all(&ctx, &[])).unwrap()).unwrap()
    };

    let find = |id: &str| {
        checks
            .iter()
            .find(|check| check["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {checks:#?}"))
    };
    let access = find("kvm.access");
    assert_eq!(access["status"], "fail", "{access:#}");
    let remediation = access["remediation"].as_str().unwrap();
    assert!(
        remediation.contains("`sudo usermod -aG kvm "),
        "{remediation}"
    );
    if is_root() {
        assert_eq!(
            access["message"],
            "user nobody (uid 65534) cannot read and write /dev/kvm"
        );
        assert_eq!(
            remediation,
            "add nobody to the kvm group: `sudo usermod -aG kvm nobody`, then log out and back in so the new group applies"
        );
    }
}
