//! What the end-to-end tests of real clients (`real_agent.rs`,
//! `real_clients.rs`) share: host commands bounded in time, the host's curl
//! through a corporate network, and the bottles a test started, each
//! stopped however the test ends.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};
use bottle_test_support::corp_net::CorpNet;

use crate::bottle;

/// How long a host-side command may take.
const HOST_LIMIT: Duration = Duration::from_secs(60);
/// How long one command may run inside a bottle (`timeout` there), and
/// how long `bottle exec` may take around it.
const IN_BOX_LIMIT_SECS: u64 = 150;
const EXEC_LIMIT: Duration = Duration::from_secs(IN_BOX_LIMIT_SECS + 30);

/// Runs a host command, bounded.
pub(crate) fn run(spec: CommandSpec) -> CommandOutput {
    SystemRunner
        .run(&spec.timeout(HOST_LIMIT))
        .expect("command starts")
}

/// Both outputs of a command, for assertions and failure messages.
pub(crate) fn both(out: &CommandOutput) -> String {
    format!("{}{}", out.stdout_text(), out.stderr_text())
}

/// `text` as one single-quoted shell word.
pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The host's curl through the corporate proxy at `proxy` (its port from
/// `net`), trusting its CA `ca`: the positive control that each upstream
/// works before a bottle tries it. Prints the status and HTTP version.
pub(crate) fn host_curl(
    net: &CorpNet,
    proxy: Ipv4Addr,
    ca: &Path,
    url: &str,
    extra: &[&str],
) -> CommandOutput {
    let host = url
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap();
    run(CommandSpec::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            "--max-time",
            "20",
            "--cacert",
        ])
        .arg(ca)
        .args([
            "--connect-to",
            &format!("{host}:443:{proxy}:{}", net.proxy_addr.port()),
        ])
        .args(extra.iter().copied())
        .arg(url))
}

/// Bottles a test started on the docker backend from `manifest`, stopped
/// however it ends.
pub(crate) struct Bottles {
    pub state: PathBuf,
    pub manifest: PathBuf,
    pub names: Vec<String>,
}

impl Bottles {
    /// `bottle start AGENT --detach` under a name of this process.
    pub(crate) fn start(&mut self, agent: &str) -> String {
        let name = format!("e2e-{agent}-{}", std::process::id());
        self.names.push(name.clone());
        let out = bottle(&self.state)
            .args(["--backend", "docker", "--yes", "--manifest"])
            .arg(&self.manifest)
            .args(["start", agent, "--name", &name, "--detach"])
            .timeout(Duration::from_secs(300))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "start {agent}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        name
    }

    /// `bottle ARGS` on the docker backend: its exit code and both streams.
    pub(crate) fn cli(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = bottle(&self.state)
            .args(["--backend", "docker"])
            .args(args)
            .timeout(EXEC_LIMIT)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `bottle exec NAME -- timeout N sh -c SCRIPT`: whether it succeeded,
    /// and both streams.
    pub(crate) fn exec(&self, name: &str, script: &str) -> (bool, String) {
        let out = bottle(&self.state)
            .args(["--backend", "docker", "exec", name, "--", "timeout"])
            .arg(IN_BOX_LIMIT_SECS.to_string())
            .args(["sh", "-c", script])
            .timeout(EXEC_LIMIT)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `bottle logs NAME --json`, one parsed line each.
    pub(crate) fn audit(&self, name: &str) -> Vec<serde_json::Value> {
        let out = bottle(&self.state)
            .args(["--backend", "docker", "logs", "--json", name])
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Drop for Bottles {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = bottle(&self.state)
                .args(["--backend", "docker", "stop", name])
                .timeout(Duration::from_secs(120))
                .output();
        }
    }
}
