//! The operator's work in and out of a docker bottle, through the real
//! `bottle` binary: a server on the agent's port answers `curl` on the
//! host's loopback (`publish`, `bottle port`), a server on the host's
//! loopback answers the agent at `host.bottle.internal`
//! (`egress.host_services`), and a pinned remote TCP destination answers
//! it at its own name (`egress.tcp`); each connection is in `bottle logs`,
//! and `stop` takes every forwarder with it.
//!
//! Needs Docker, `/bin/busybox`, `BOTTLE_BUNDLE_BIN`, `BOTTLE_TOOLBOX_BIN`
//! and root (a test-made interface holds the "remote" destination's
//! TEST-NET address, checked local with `ip route get`); skips with a line
//! unless `BOTTLE_REQUIRE_DOCKER=1`.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use bottle_test_support::corp_net::TestInterface;

use crate::bottle;

const IMAGE: &str = "bottle-demo-agent:cli-ports";
/// The "remote" destination of `egress.tcp`, on an interface the test
/// makes.
const REMOTE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 87);

/// Stops the test's bottle however the test ends.
struct World {
    state: PathBuf,
    manifest: PathBuf,
    name: String,
}

impl World {
    fn bottle(&self) -> assert_cmd::Command {
        let mut cmd = bottle(&self.state);
        cmd.arg("--manifest")
            .arg(&self.manifest)
            .args(["--backend", "docker"])
            .timeout(Duration::from_secs(300));
        cmd
    }

    /// `bottle exec NAME -- sh -c SCRIPT`: its stdout, and whether it
    /// succeeded.
    fn sh(&self, script: &str) -> (bool, String) {
        let out = self
            .bottle()
            .args(["exec", &self.name, "--", "sh", "-c", script])
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
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.bottle().args(["stop", "--wait", &self.name]).output();
    }
}

/// A free port of this host's loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Serves `listener` for up to `n` connections: each gets `<tag>: ` and
/// the first line it sent.
fn answer(listener: TcpListener, tag: &'static str, n: usize) {
    std::thread::spawn(move || {
        for conn in listener.incoming().take(n) {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
            let mut buf = [0u8; 64];
            let got = conn.read(&mut buf).unwrap_or(0);
            let _ = conn.write_all(format!("{tag}: ").as_bytes());
            let _ = conn.write_all(&buf[..got]);
        }
    });
}

/// The host's `curl` of `url`, bounded: its stdout, and whether it
/// succeeded.
fn curl(url: &str) -> (bool, String) {
    let out = SystemRunner
        .run(
            &CommandSpec::new("curl")
                .args(["-sS", "--noproxy", "*", "--max-time", "20", url])
                .timeout(Duration::from_secs(30)),
        )
        .expect("curl runs");
    (
        out.success(),
        format!("{}{}", out.stdout_text(), out.stderr_text()),
    )
}

/// Whether a connection to `addr` is answered with at least one byte
/// before it closes.
fn answers(addr: SocketAddr) -> Option<Vec<u8>> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    let _ = conn.write_all(b"GET / HTTP/1.0\r\n\r\n");
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    Some(got)
}

#[test]
fn ports_host_services_and_pinned_tcp_cross_and_are_audited() {
    let test = "ports_host_services_and_pinned_tcp_cross_and_are_audited";
    let _serial = crate::one_launch_at_a_time();
    let Some(_engine) =
        crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN", "BOTTLE_TOOLBOX_BIN"])
    else {
        return;
    };
    let _iface = match TestInterface::create("bottleport0", &[IpAddr::V4(REMOTE)]) {
        Ok(iface) => iface,
        Err(why) => {
            bottle_test_support::skip_docker_test(test, why);
            return;
        }
    };
    // The host's service, on its loopback only.
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    let service_port = service.local_addr().unwrap().port();
    answer(service, "host-said", 4);
    // The remote destination, on the test-made interface.
    let remote = TcpListener::bind((REMOTE, 0)).unwrap();
    let remote_port = remote.local_addr().unwrap().port();
    answer(remote, "remote-said", 4);
    let host_port = free_port();

    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        format!(
            "[agents.coder]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\"]\npublish = [\"8000:{host_port}\"]\n\n\
             [agents.coder.egress]\nhost_services = [\"127.0.0.1:{service_port}\"]\n\
             tcp = [\"db.bottle.test:{remote_port}\"]\nresolve = {{ \"db.bottle.test\" = \"{REMOTE}\" }}\n"
        ),
    )
    .unwrap();
    let world = World {
        state: dir.path().join("state"),
        manifest,
        name: format!("ports-{}", std::process::id()),
    };
    let started = world
        .bottle()
        .args(["start", "coder", "--name", &world.name, "--yes", "--detach"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&started.stderr).into_owned();
    assert!(started.status.success(), "{said}");
    assert!(
        said.contains(&format!("port 8000 is on http://127.0.0.1:{host_port}")),
        "{said}"
    );

    // A server on the agent's port answers curl on the host's loopback.
    let (ok, out) = world.sh(
        "mkdir -p /tmp/www && echo hello-from-the-agent > /tmp/www/index.html && httpd -p 127.0.0.1:8000 -h /tmp/www",
    );
    assert!(ok, "{out}");
    let (ok, page) = curl(&format!("http://127.0.0.1:{host_port}/"));
    assert!(ok, "{page}");
    assert_eq!(page, "hello-from-the-agent\n");

    // `list` shows it, in both forms.
    let listed = world.bottle().args(["list", "--json"]).output().unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let me = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"].as_str().is_some_and(|n| n.ends_with(&world.name)))
        .expect("the bottle is listed");
    assert_eq!(
        me["ports"],
        serde_json::json!([{ "port": 8000, "listen": format!("127.0.0.1:{host_port}") }])
    );
    let table = world.bottle().arg("list").output().unwrap();
    assert!(
        String::from_utf8_lossy(&table.stdout).contains(&format!("8000->127.0.0.1:{host_port}")),
        "{}",
        String::from_utf8_lossy(&table.stdout)
    );

    // A port opened later, where nothing in the box listens: the
    // connection closes at once, and the forwarder's log says why.
    let opened = world
        .bottle()
        .args(["port", &world.name, "8001:0"])
        .output()
        .unwrap();
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    let listen = String::from_utf8_lossy(&opened.stdout).trim().to_string();
    let addr: SocketAddr = listen.parse().expect("`bottle port` prints the address");
    assert!(addr.ip().is_loopback(), "{addr}");
    let asked = Instant::now();
    assert_eq!(answers(addr), Some(Vec::new()));
    assert!(asked.elapsed() < Duration::from_secs(10));
    world
        .bottle()
        .args(["port", &world.name, "--close", &addr.port().to_string()])
        .assert()
        .success();
    let closed = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_ok() && Instant::now() < closed {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(TcpStream::connect(addr).is_err(), "{addr} still listens");

    // The host's service answers the agent at its name, and only its port
    // goes anywhere.
    let (ok, out) = world.sh(&format!(
        "printf ping | nc -w 10 host.bottle.internal {service_port}"
    ));
    assert!(ok, "{out}");
    assert_eq!(out, "host-said: ping");
    let other = free_port();
    let (_, out) = world.sh(&format!(
        "printf ping | nc -w 3 host.bottle.internal {other}; echo done"
    ));
    assert!(!out.contains("said"), "{out}");

    // The pinned destination answers at its own name.
    let (ok, out) = world.sh(&format!(
        "printf ping | nc -w 10 db.bottle.test {remote_port}"
    ));
    assert!(ok, "{out}");
    assert_eq!(out, "remote-said: ping");

    // Each is in the audit log.
    let logs = world
        .bottle()
        .args(["logs", "--json", &world.name])
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let has = |daemon: &str, method: &str, port: u16| {
        lines
            .iter()
            .any(|l| l["daemon"] == daemon && l["method"] == method && l["port"] == u64::from(port))
    };
    assert!(has("port", "OPEN", host_port), "{lines:#?}");
    assert!(has("port", "CLOSE", host_port), "{lines:#?}");
    assert!(
        has("port", "OPEN", addr.port()),
        "nothing_listens: {lines:#?}"
    );
    assert!(has("relay", "CLOSE", service_port), "{lines:#?}");
    assert!(has("relay", "CLOSE", remote_port), "{lines:#?}");

    // Stop takes the forwarders with it.
    world
        .bottle()
        .args(["stop", &world.name])
        .assert()
        .success();
    assert!(
        TcpStream::connect(("127.0.0.1", host_port)).is_err(),
        "the published port outlived its bottle"
    );
}
