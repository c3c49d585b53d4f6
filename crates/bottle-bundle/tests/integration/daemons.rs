//! The supervisor restarts crashed daemons and fails closed; the binary
//! exits non-zero when it cannot bind.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bottle_bundle::daemons::{Daemon, RestartPolicy, ServeFn, bind, keep_up};
use bottle_core::Coded;
use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn quick_policy(max_restarts: u32) -> RestartPolicy {
    RestartPolicy {
        max_restarts,
        window: Duration::from_secs(60),
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_daemon_is_restarted_on_the_same_port() {
    let listener = bind("flaky", "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let serve: ServeFn = Arc::new(move |l: tokio::net::TcpListener| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            assert!(n >= 2, "simulated crash {n}");
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                s.write_all(b"up").await.unwrap();
            }
        })
    });
    let daemon = Daemon {
        name: "flaky",
        addr,
        listener,
        serve,
    };
    let sup = tokio::spawn(keep_up(vec![daemon], quick_policy(5)));
    let mut got = Vec::new();
    let ok = bottle_test_support::eventually_async(Duration::from_secs(10), || {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(ok, "restarted twice");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.read_to_end(&mut got).await.unwrap_or_default();
    assert_eq!(got, b"up");
    assert!(!sup.is_finished(), "the supervisor keeps running");
    sup.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_that_keeps_crashing_ends_the_supervisor() {
    let listener = bind("doomed", "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let serve: ServeFn = Arc::new(|_l| {
        Box::pin(async {
            Err(bottle_bundle::BundleError::Daemon {
                daemon: "doomed".into(),
                detail: "simulated".into(),
            })
        })
    });
    let daemon = Daemon {
        name: "doomed",
        addr,
        listener,
        serve,
    };
    let res = tokio::time::timeout(
        Duration::from_secs(20),
        keep_up(vec![daemon], quick_policy(3)),
    )
    .await
    .unwrap();
    let err = res.unwrap_err();
    assert_eq!(err.code(), "BOT-B011", "{err}");
    assert!(err.to_string().contains("simulated"));
}

fn write_config(dir: &std::path::Path, proxy_listen: &str) -> std::path::PathBuf {
    let ca = bottle_bundle::generate_ca("bin").unwrap();
    std::fs::write(dir.join("ca.pem"), &ca.cert_pem).unwrap();
    std::fs::write(dir.join("ca.key"), &ca.key_pem).unwrap();
    let config = serde_json::json!({
        "version": 1,
        "bottle": "bin",
        "proxy_listen": proxy_listen,
        "allow": ["api.allowed.test"],
        "ports": [443],
        "credentials": [],
        "ca_cert": dir.join("ca.pem"),
        "ca_key": dir.join("ca.key"),
        "audit_log": dir.join("audit.jsonl"),
    });
    let path = dir.join("bundle.json");
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

#[test]
fn binary_exits_non_zero_when_its_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &addr.to_string());
    let out = SystemRunner
        .run(
            &CommandSpec::new(env!("CARGO_BIN_EXE_bottle-bundle")).args([
                "run",
                "--config",
                config.to_str().unwrap(),
            ]),
        )
        .unwrap();
    assert!(!out.success());
    let err = out.stderr_text();
    assert!(err.contains("BOT-B005"), "{err}");
    assert!(err.contains("could not bind proxy"), "{err}");
}

#[test]
fn binary_rejects_a_bad_config_version() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "127.0.0.1:0");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"version\":1", "\"version\":99");
    std::fs::write(&config, text).unwrap();
    let out = SystemRunner
        .run(
            &CommandSpec::new(env!("CARGO_BIN_EXE_bottle-bundle")).args([
                "run",
                "--config",
                config.to_str().unwrap(),
            ]),
        )
        .unwrap();
    assert!(!out.success());
    assert!(
        out.stderr_text().contains("BOT-B002"),
        "{}",
        out.stderr_text()
    );
}

#[test]
fn binary_serves_health_until_killed() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &addr.to_string());
    #[expect(
        clippy::disallowed_methods,
        reason = "the test runs the binary under test as a daemon and must hold its child handle to stop it"
    )]
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_bottle-bundle"))
        .args(["run", "--config", config.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let health = CommandSpec::new(env!("CARGO_BIN_EXE_bottle-bundle")).args([
        "health",
        "--addr",
        &addr.to_string(),
    ]);
    let healthy = bottle_test_support::eventually(Duration::from_secs(5), || {
        SystemRunner.run(&health).unwrap().success()
    });
    let still_running = child.try_wait().unwrap().is_none();
    let listening = listening_ports(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(healthy, "bottle-bundle health never succeeded");
    assert!(still_running);
    // The proxy is the only socket the bundle listens on: egress is called
    // in-process, so no other process in the bundle can use it as a relay.
    assert_eq!(listening, vec![addr.port()]);
}

/// The local ports of the TCP sockets `pid` listens on (from `/proc`).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // local_address is column 1 (`ADDR:PORT` in hex), st column 3
            // (`0A` is LISTEN), inode column 9.
            if cols.len() > 9 && cols[3] == "0A" && inodes.iter().any(|i| i == cols[9]) {
                let port = cols[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports.sort_unstable();
    ports
}
