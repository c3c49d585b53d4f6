//! What the end-to-end tests of real clients (`real_agent.rs`,
//! `real_clients.rs`) share: host commands bounded in time, the host's curl
//! through a corporate network, and the bottles a test started, each
//! stopped however the test ends.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};
use bottle_test_support::corp_net::{CorpNet, Site, TestInterface};

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
fn host_curl(
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

/// A test's corporate network: the TLS-re-signing proxy at `proxy` on an
/// interface the test made, serving the test's upstreams, and its CA in a
/// file for the host's clients. The proxy stops before the interface goes.
pub(crate) struct Corp {
    pub(crate) net: CorpNet,
    /// The proxy's CA, PEM.
    pub(crate) ca: PathBuf,
    proxy: Ipv4Addr,
    _interface: TestInterface,
}

impl Corp {
    /// Makes `interface` holding `proxy` and serves `site` there, the CA
    /// written into `dir`; `None`, after `test`'s skip line, where the
    /// interface cannot be made.
    pub(crate) fn start(
        test: &str,
        interface: &str,
        proxy: Ipv4Addr,
        site: Site,
        dir: &Path,
    ) -> Option<Corp> {
        let made = match TestInterface::create(interface, &[IpAddr::V4(proxy)]) {
            Ok(made) => made,
            Err(why) => {
                bottle_test_support::skip_docker_test(test, why);
                return None;
            }
        };
        let net = CorpNet::start(SocketAddr::from((proxy, 443)), site).unwrap();
        let ca = dir.join("corp-ca.pem");
        std::fs::write(&ca, net.corp_ca.cert_pem()).unwrap();
        Some(Corp {
            net,
            ca,
            proxy,
            _interface: made,
        })
    }

    /// The host's curl through this network ([`host_curl`]).
    pub(crate) fn curl(&self, url: &str, extra: &[&str]) -> CommandOutput {
        host_curl(&self.net, self.proxy, &self.ca, url, extra)
    }

    /// The positive controls: each of `urls` answers 200 over HTTP/1.1
    /// through the proxy from the host, and `h2_url` over HTTP/2.
    pub(crate) fn assert_upstreams_answer(&self, urls: &[String], h2_url: &str) {
        for url in urls {
            let out = self.curl(url, &["--http1.1"]);
            assert_eq!(out.stdout_text(), "200 1.1", "{url}: {}", both(&out));
        }
        let h2 = self.curl(h2_url, &["--http2"]);
        assert_eq!(h2.stdout_text(), "200 2", "{}", both(&h2));
    }
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
                .args(["--backend", "docker", "stop", "--wait", name])
                .timeout(Duration::from_secs(120))
                .output();
        }
    }
}
