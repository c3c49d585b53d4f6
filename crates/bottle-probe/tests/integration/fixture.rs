//! Canaries on loopback and a way to run the probe binary.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use bottle_probe::contract::{ProbeConfig, ProbeResult, Targets};

/// The one place the tests spawn a process.
pub(crate) fn command(program: &str) -> Command {
    #[expect(
        clippy::disallowed_methods,
        reason = "the tests run the probe binary itself, not a host tool"
    )]
    Command::new(program)
}

/// Whether this process may bind ports below 1024; prints a skip line when
/// not (and fails when root is required).
#[expect(clippy::print_stderr, reason = "a skipped test says why")]
pub(crate) fn can_bind_low_ports() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        assert!(
            std::env::var("BOTTLE_REQUIRE_ROOT").as_deref() != Ok("1"),
            "BOTTLE_REQUIRE_ROOT=1 but the tests do not run as root"
        );
        eprintln!("skip: binding the canaries' fixed ports (80, 443, 53) needs root");
    }
    root
}

/// A loopback address of its own for this test process (all of 127/8 is
/// local), so parallel test runs do not collide on fixed ports.
pub(crate) fn loopback(last: u8) -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(
        127,
        100 + (pid % 100) as u8,
        ((pid / 100) % 250) as u8 + 1,
        last,
    )
}

/// An HTTP canary: every connection gets a 200 whose body carries `token`.
pub(crate) fn http_canary(addr: SocketAddr, token: &str) {
    let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let body = format!("canary {token}\n");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut s = s;
                let _ = read_head(&mut s);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
}

/// A request head, read with a bound.
pub(crate) fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while got.len() < 16 * 1024 && !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => got.push(b[0]),
            _ => break,
        }
    }
    got
}

fn udp_echo(addr: SocketAddr) {
    let s = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        }
    });
}

/// NXDOMAIN for every query, over UDP and TCP.
fn dns_canary(addr: SocketAddr) {
    let u = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            if n >= 12 {
                let mut r = buf[..n].to_vec();
                r[2] |= 0x80;
                r[3] = (r[3] & 0xf0) | 3;
                let _ = u.send_to(&r, from);
            }
        }
    });
    let t = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    std::thread::spawn(move || {
        for mut s in t.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut len = [0u8; 2];
            if s.read_exact(&mut len).is_err() {
                continue;
            }
            let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
            if s.read_exact(&mut q).is_err() || q.len() < 12 {
                continue;
            }
            q[2] |= 0x80;
            q[3] = (q[3] & 0xf0) | 3;
            let _ = s.write_all(&len);
            let _ = s.write_all(&q);
        }
    });
}

/// The canaries every test shares, started once per test process.
pub(crate) struct Canaries {
    pub token: String,
    pub targets: Targets,
    /// Whether `[::1]:80` could be bound for the IPv6 canary.
    pub v6: bool,
}

/// Starts the canaries (once).
pub(crate) fn canaries() -> &'static Canaries {
    static C: OnceLock<Canaries> = OnceLock::new();
    C.get_or_init(|| {
        let token = format!("tok-{}-canary", std::process::id());
        let internet = loopback(1);
        for port in [80, 443, 8443] {
            http_canary((internet, port).into(), &token);
        }
        udp_echo((internet, 5353).into());
        http_canary((loopback(2), 80).into(), &token);
        http_canary((loopback(3), 80).into(), &token);
        dns_canary((loopback(4), 53).into());
        // Host loopback and "0.0.0.0" services on ephemeral ports; the
        // latter bound on the stand-in gateway address only.
        let lo = TcpListener::bind("127.0.0.1:0").unwrap();
        let lo_port = lo.local_addr().unwrap().port();
        drop(lo);
        http_canary(([127, 0, 0, 1], lo_port).into(), &token);
        let gw = loopback(5);
        let any = TcpListener::bind((gw, 0)).unwrap();
        let any_port = any.local_addr().unwrap().port();
        drop(any);
        http_canary((gw, any_port).into(), &token);
        http_canary((loopback(6), 8888).into(), &token);
        // A named and an unnamed host service; the pinned TCP canary on
        // its port and another, and another canary host.
        let service_ports: Vec<u16> = (0..2)
            .map(|_| {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let port = l.local_addr().unwrap().port();
                drop(l);
                http_canary(([127, 0, 0, 1], port).into(), &token);
                port
            })
            .collect();
        for (last, port) in [(10, 7070), (10, 7071), (11, 7070)] {
            http_canary((loopback(last), port).into(), &token);
        }
        let v6 = TcpListener::bind("[::1]:80").is_ok_and(|l| {
            drop(l);
            true
        });
        if v6 {
            http_canary("[::1]:80".parse().unwrap(), &token);
        } else {
            #[expect(
                clippy::print_stderr,
                reason = "the test says what it leaves unchecked"
            )]
            {
                eprintln!("note: [::1]:80 is taken; the IPv6 canary is not checked");
            }
        }
        let targets = Targets {
            internet_v4: internet.to_string(),
            internet_v6: "::1".into(),
            metadata: loopback(2).to_string(),
            private: loopback(3).to_string(),
            dns_server: loopback(4).to_string(),
            host_loopback_port: lo_port,
            host_any_port: any_port,
            gateway: gw.to_string(),
            own_bundle: loopback(9).to_string(),
            other_bundle: loopback(6).to_string(),
            other_agent: loopback(7).to_string(),
            proxy: format!("http://{}:8888", loopback(9)),
            allowed_host: "allowed.bottle.test".into(),
            denied_host: "denied.bottle.test".into(),
            credential_host: String::new(),
            redact_host: String::new(),
            supervise_url: String::new(),
            git_gate_url: String::new(),
            git_repo: String::new(),
            rebind_hosts: vec!["rebind-loopback.bottle.test".into()],
            canary_names: vec!["leak.canary.bottle.test".into()],
            host_service_port: service_ports[0],
            host_service_unnamed_port: service_ports[1],
            pinned_tcp_host: "pinned-tcp.bottle.test".into(),
            pinned_tcp_addr: loopback(10).to_string(),
            pinned_tcp_port: 7070,
            pinned_tcp_other_port: 7071,
            other_tcp_host: "other-tcp.bottle.test".into(),
            other_tcp_addr: loopback(11).to_string(),
        };
        Canaries { token, targets, v6 }
    })
}

/// A config around `targets`.
pub(crate) fn config(token: &str, targets: Targets, control: bool, only: &[&str]) -> ProbeConfig {
    ProbeConfig {
        token: token.into(),
        control,
        only: only.iter().map(|s| (*s).to_string()).collect(),
        skip: Vec::new(),
        isolation: String::new(),
        timeout_ms: 1500,
        targets,
    }
}

/// The outcome of one run of the binary.
pub(crate) struct Run {
    pub code: Option<i32>,
    pub results: Vec<ProbeResult>,
    pub stderr: String,
}

/// Runs the probe binary with `config`, from `cwd`, through `/bin/sh -c`
/// when `shell_prefix` is given (to hand it descriptors).
pub(crate) fn run_probe(config: &ProbeConfig, cwd: &Path, shell_prefix: Option<&str>) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.json");
    std::fs::write(&path, serde_json::to_vec(config).unwrap()).unwrap();
    let exe = env!("CARGO_BIN_EXE_bottle-probe");
    let out = match shell_prefix {
        None => command(exe)
            .arg("--config")
            .arg(&path)
            .current_dir(cwd)
            .output(),
        Some(prefix) => command("/bin/sh")
            .arg("-c")
            .arg(format!("{prefix} exec \"$0\" --config \"$1\"",))
            .arg(exe)
            .arg(&path)
            .current_dir(cwd)
            .output(),
    }
    .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let results = stdout
        .lines()
        .map(|l| serde_json::from_str::<ProbeResult>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    Run {
        code: out.status.code(),
        results,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The names of the network probes the control runs.
pub(crate) fn network_probe_names(config: &ProbeConfig) -> Vec<String> {
    bottle_probe::probes::catalogue(config)
        .into_iter()
        .filter(|p| p.network)
        .map(|p| p.name)
        .collect()
}

/// Targets for tests whose probes dial only a fake proxy: every address is
/// a loopback one where nothing listens.
pub(crate) fn canaries_targets_without_listeners() -> Targets {
    let silent = loopback(30).to_string();
    Targets {
        internet_v4: silent.clone(),
        internet_v6: "::1".into(),
        metadata: silent.clone(),
        private: silent.clone(),
        dns_server: silent.clone(),
        host_loopback_port: 1,
        host_any_port: 1,
        gateway: String::new(),
        own_bundle: silent.clone(),
        other_bundle: silent,
        other_agent: String::new(),
        proxy: String::new(),
        allowed_host: "allowed.bottle.test".into(),
        denied_host: "denied.bottle.test".into(),
        credential_host: String::new(),
        redact_host: String::new(),
        supervise_url: String::new(),
        git_gate_url: String::new(),
        git_repo: String::new(),
        rebind_hosts: Vec::new(),
        canary_names: vec!["leak.canary.bottle.test".into()],
        host_service_port: 0,
        host_service_unnamed_port: 0,
        pinned_tcp_host: String::new(),
        pinned_tcp_addr: String::new(),
        pinned_tcp_port: 0,
        pinned_tcp_other_port: 0,
        other_tcp_host: String::new(),
        other_tcp_addr: String::new(),
    }
}
