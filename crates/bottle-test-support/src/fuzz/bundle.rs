//! The real `bottle-bundle` binary under fuzz: its config (a local
//! allowlist, short timeouts), the upstream of the allowed host, the
//! canary of the denied host, and what the oracles read back (stderr, the
//! audit log, the repository's refs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};

use super::FuzzError;
use super::mutate::REPLY_WAIT;

/// The allowed host, mapped onto the local upstream.
pub const ALLOWED_HOST: &str = "api.fuzz.test";
/// The denied host, mapped onto the canary.
pub const DENIED_HOST: &str = "denied.fuzz.test";
/// The repository git-gate serves (pushes only to `agent/*`).
pub const REPO: &str = "repo";
/// The daemons' header-read timeout (also the keep-alive idle time).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_millis(1_000);
/// The daemons' mid-request idle timeout.
pub const IDLE_TIMEOUT: Duration = Duration::from_millis(2_000);
/// Slack on top of the daemon's own timeouts before a connection counts as
/// hung (a loaded 2-core machine runs three daemons and the harness).
pub const MARGIN: Duration = Duration::from_millis(3_000);
/// Where the denied host's canary listens: a loopback address no allowed
/// rule names.
const CANARY_IP: &str = "127.0.0.2";

/// A listener on this machine that counts its connections; it answers each
/// with a small 200 when `answer` is set (the allowed host's upstream), and
/// says nothing otherwise (the denied host's canary).
struct Listener {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    fn start(ip: &str, answer: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind((ip, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        if answer {
                            std::thread::spawn(move || answer_ok(stream));
                        }
                    }
                    // Nothing pending: look again shortly (the stop flag
                    // is only seen between accepts).
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Self {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer_ok(mut stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
}

/// A running `bottle-bundle run` with proxy, git-gate and supervise on
/// ephemeral loopback ports.
pub struct Bundle {
    child: Child,
    _dir: tempfile::TempDir,
    stderr: Arc<Mutex<Vec<String>>>,
    /// The proxy's address.
    pub proxy: SocketAddr,
    /// git-gate's address.
    pub git_gate: SocketAddr,
    /// supervise's address.
    pub supervise: SocketAddr,
    audit_log: PathBuf,
    repo: PathBuf,
    upstream: Listener,
    canary: Listener,
}

impl Drop for Bundle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn setup(what: &str) -> impl FnOnce(std::io::Error) -> FuzzError + '_ {
    move |e| FuzzError::Setup(format!("{what}: {e}"))
}

fn run_ok(spec: &CommandSpec) -> Result<(), FuzzError> {
    let out = SystemRunner
        .run(spec)
        .map_err(setup(&spec.argv().join(" ")))?;
    if out.success() {
        Ok(())
    } else {
        Err(FuzzError::Setup(format!(
            "`{}` failed: {}",
            spec.argv().join(" "),
            out.stderr_text()
        )))
    }
}

impl Bundle {
    /// Starts `bin` (a built `bottle-bundle`) and waits, bounded, until it
    /// names all three listening addresses.
    pub fn start(bin: &Path) -> Result<Self, FuzzError> {
        let dir = tempfile::tempdir().map_err(setup("temp dir"))?;
        let root = dir.path();
        let upstream = Listener::start("127.0.0.1", true).map_err(setup("upstream"))?;
        let canary = Listener::start(CANARY_IP, false).map_err(setup("canary on 127.0.0.2"))?;
        let repo = root.join(format!("{REPO}.git"));
        run_ok(
            &CommandSpec::new("git")
                .args(["init", "-q", "--bare", "-b", "main"])
                .arg(&repo),
        )?;
        run_ok(
            &CommandSpec::new(bin)
                .args(["gen-ca", "--bottle", "fuzz", "--cert"])
                .arg(root.join("ca.pem"))
                .arg("--key")
                .arg(root.join("ca.key")),
        )?;
        let audit_log = root.join("audit.jsonl");
        let config = serde_json::json!({
            "version": bottle_core::bundle::BUNDLE_CONFIG_VERSION,
            "bottle": "fuzz",
            "proxy_listen": "127.0.0.1:0",
            "allow": [ALLOWED_HOST],
            "ports": [80, 443, upstream.addr.port(), canary.addr.port()],
            "credentials": [],
            "ca_cert": root.join("ca.pem"),
            "ca_key": root.join("ca.key"),
            "audit_log": audit_log,
            "resolve": {ALLOWED_HOST: "127.0.0.1", DENIED_HOST: CANARY_IP},
            "limits": {
                "header_read_timeout_ms": HEADER_READ_TIMEOUT.as_millis() as u64,
                "idle_timeout_ms": IDLE_TIMEOUT.as_millis() as u64,
                "connect_timeout_ms": 2_000,
            },
            "git_gate_listen": "127.0.0.1:0",
            "git": [{
                "name": REPO,
                "path_in_bundle": repo,
                "mode": "read-write",
                "push": ["agent/*"],
            }],
            "git_hook_program": bin,
            "supervise_listen": "127.0.0.1:0",
            "requests_dir": root.join("requests"),
        });
        let config_path = root.join("bundle.json");
        std::fs::write(&config_path, config.to_string()).map_err(setup("write the config"))?;
        std::fs::create_dir_all(root.join("requests")).map_err(setup("requests dir"))?;

        #[expect(
            clippy::disallowed_methods,
            reason = "the campaign holds the daemon under fuzz as a child, to see it die and to read its stderr as it runs"
        )]
        let mut child = std::process::Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(setup("spawn bottle-bundle"))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(pipe) = child.stderr.take() {
            let lines = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(line);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let (proxy, git_gate, supervise) = loop {
            let lines = stderr
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let found = |prefix: &str| -> Option<SocketAddr> {
                lines.iter().find_map(|l| {
                    let rest = l.split(prefix).nth(1)?;
                    rest.split([',', ' ']).next()?.parse().ok()
                })
            };
            if let (Some(p), Some(g), Some(s)) = (
                found("proxy on "),
                found("git-gate on "),
                found("supervise on "),
            ) {
                break (p, g, s);
            }
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                return Err(FuzzError::Setup(format!(
                    "bottle-bundle did not come up: {}",
                    lines.join("\n")
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Self {
            child,
            _dir: dir,
            stderr,
            proxy,
            git_gate,
            supervise,
            audit_log,
            repo,
            upstream,
            canary,
        })
    }

    /// `host:port` of the allowed host (its upstream on this machine).
    pub fn allowed_authority(&self) -> String {
        format!("{ALLOWED_HOST}:{}", self.upstream.addr.port())
    }

    /// Every way a case names the denied host: its name and its canary's
    /// IP literal, both on the canary's port.
    pub fn denied_authorities(&self) -> Vec<String> {
        let port = self.canary.addr.port();
        vec![
            format!("{DENIED_HOST}:{port}"),
            format!("{CANARY_IP}:{port}"),
        ]
    }

    /// Connections the allowed host's upstream has had.
    pub fn upstream_connections(&self) -> usize {
        self.upstream.accepted()
    }

    /// Connections the denied host's canary has had.
    pub fn canary_connections(&self) -> usize {
        self.canary.accepted()
    }

    /// Connects to the canary once itself: the oracle that watches it must
    /// be able to see a connection (positive control).
    pub fn touch_canary(&self) -> std::io::Result<()> {
        TcpStream::connect_timeout(&self.canary.addr, Duration::from_secs(2)).map(drop)
    }

    /// `Some(status)` once the binary has exited.
    pub fn exited(&mut self) -> Option<String> {
        self.child
            .try_wait()
            .ok()
            .flatten()
            .map(|status| status.to_string())
    }

    /// Lines the bundle printed that show a daemon died: a panic, or the
    /// supervisor restarting one.
    pub fn death_lines(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|l| l.contains("panicked") || l.contains("; restart "))
            .cloned()
            .collect()
    }

    /// The bundle's stderr so far, for a report.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n")
    }

    /// The audit log as written so far.
    pub fn audit_text(&self) -> Result<String, FuzzError> {
        match std::fs::read_to_string(&self.audit_log) {
            Ok(t) => Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(FuzzError::Setup(format!("read the audit log: {e}"))),
        }
    }

    /// The audit log's last lines, for a report.
    pub fn audit_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(3)..].join("\n")
    }

    /// Refs of the served repository that the agent may not push.
    pub fn forbidden_refs(&self) -> Result<Vec<String>, FuzzError> {
        let spec = CommandSpec::new("git")
            .args(["for-each-ref", "--format=%(refname)"])
            .env("GIT_DIR", &self.repo);
        let out = SystemRunner.run(&spec).map_err(setup("git for-each-ref"))?;
        Ok(out
            .stdout_text()
            .lines()
            .filter(|r| !r.starts_with("refs/heads/agent/"))
            .map(str::to_string)
            .collect())
    }
}

/// Audit lines in `text` that allowed what the policy denies: a proxy or
/// egress decision for any host but [`ALLOWED_HOST`], a git-gate decision
/// for any repository but [`REPO`], or anything another daemon allowed by
/// itself (supervise never does).
pub fn wrong_allows(text: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
            wrong.push(format!("unparsable audit line: {line}"));
            continue;
        };
        if record["decision"] != "allow" {
            continue;
        }
        let host = record["host"]
            .as_str()
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let fine = match record["daemon"].as_str().unwrap_or_default() {
            "proxy" | "egress" => host == ALLOWED_HOST,
            "git-gate" => host == REPO,
            _ => false,
        };
        if !fine {
            wrong.push(line.to_string());
        }
    }
    wrong
}

/// How one connection ended.
#[derive(Debug)]
pub struct Closed {
    /// From the last byte sent to the daemon closing the connection.
    pub after: Duration,
    /// What the daemon answered.
    pub reply: Vec<u8>,
}

/// When the client shuts its write side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfClose {
    /// Right after the last byte.
    Now,
    /// Once the daemon starts answering, or after [`REPLY_WAIT`].
    AfterReply,
    /// Never: the daemon must close.
    Never,
}

/// Sends `bytes` in `pieces` writes `pause` apart, shuts the write side as
/// `half_close` says, and reads until the daemon closes. `Err` with the
/// time waited when it has not closed by `limit` after the last write.
pub fn exchange(
    addr: SocketAddr,
    bytes: &[u8],
    pieces: usize,
    pause: Duration,
    half_close: HalfClose,
    limit: Duration,
) -> Result<Closed, Duration> {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return Err(Duration::ZERO);
    };
    let size = bytes.len().div_ceil(pieces.max(1)).max(1);
    for (i, piece) in bytes.chunks(size).enumerate() {
        if i > 0 {
            // Part of the input: a slow client, well within the timeouts.
            std::thread::sleep(pause);
        }
        if stream.write_all(piece).is_err() {
            // The daemon closed early; what it said is still readable.
            break;
        }
    }
    let start = Instant::now();
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    match half_close {
        HalfClose::Now => {
            let _ = stream.shutdown(Shutdown::Write);
        }
        HalfClose::AfterReply => {
            let _ = stream.set_read_timeout(Some(REPLY_WAIT));
            match stream.read(&mut buf) {
                Ok(0) => {
                    return Ok(Closed {
                        after: start.elapsed(),
                        reply,
                    });
                }
                Ok(n) => reply.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
            let _ = stream.shutdown(Shutdown::Write);
        }
        HalfClose::Never => {}
    }
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(start.elapsed());
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Enough to judge an answer by; the rest is drained.
                if reply.len() < 64 * 1024 {
                    reply.extend_from_slice(&buf[..n]);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(start.elapsed());
            }
            // A reset is a close.
            Err(_) => break,
        }
    }
    Ok(Closed {
        after: start.elapsed(),
        reply,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_for_anything_but_the_allowed_host_is_wrong() {
        let line = |daemon: &str, decision: &str, host: &str| {
            serde_json::json!({"daemon": daemon, "decision": decision, "host": host}).to_string()
        };
        let text = [
            line("proxy", "allow", "API.fuzz.test."),
            line("proxy", "deny", DENIED_HOST),
            line("git-gate", "allow", REPO),
            line("proxy", "allow", DENIED_HOST),
            line("egress", "allow", "127.0.0.2"),
            line("supervise", "allow", "docs.rs"),
        ]
        .join("\n");
        let wrong = wrong_allows(&text);
        assert_eq!(wrong.len(), 3, "{wrong:?}");
        assert!(wrong[0].contains(DENIED_HOST));
        assert_eq!(wrong_allows("not json").len(), 1);
    }

    #[test]
    fn a_daemon_that_never_closes_is_caught_at_the_bound() {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let limit = Duration::from_millis(300);
        let waited = exchange(
            addr,
            b"GET / HTTP/1.1\r\n\r\n",
            1,
            Duration::ZERO,
            HalfClose::Now,
            limit,
        )
        .unwrap_err();
        assert!(waited >= limit, "{waited:?}");
        drop(silent);
    }

    #[test]
    fn a_daemon_that_answers_and_closes_is_timed() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let answer = std::thread::spawn(move || {
            let (stream, _) = server.accept().unwrap();
            answer_ok(stream);
        });
        let closed = exchange(
            addr,
            b"GET / HTTP/1.1\r\n\r\n",
            2,
            Duration::from_millis(1),
            HalfClose::AfterReply,
            Duration::from_secs(5),
        )
        .unwrap();
        answer.join().unwrap();
        assert!(closed.reply.starts_with(b"HTTP/1.1 200"));
    }
}
