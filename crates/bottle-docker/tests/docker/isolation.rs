//! What the agent can and cannot reach, its confinement, and its lack of
//! DNS.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bottle_docker::names::EGRESS_NETWORK;

use crate::support::{self, inspect, ip_on, name, sh};

/// `nc` from inside a bottle: true if the TCP connection was made. `nc`
/// fails fast (refused, unreachable, 2 s connect timeout) or connects; a
/// connected peer that never closes is cut off by `timeout`, which also
/// counts as connected.
fn connects(bottle: &dyn bottle_core::Bottle, ip: &str, port: u16) -> bool {
    let out = sh(
        bottle,
        &format!("timeout 5 nc -w 2 {ip} {port} </dev/null >/dev/null 2>&1; echo $?"),
    );
    let rc: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    rc == 0 || rc >= 124
}

#[test]
fn bottles_cannot_reach_each_other_or_the_host() {
    let Some(fx) = support::setup("bottles_cannot_reach_each_other_or_the_host") else {
        return;
    };
    let (a_name, b_name) = (name("iso-a"), name("iso-b"));
    let (_a_guard, a) = fx.start(&a_name);
    let (_b_guard, b) = fx.start(&b_name);
    let net = |n: &str| format!("bot-bottle-{n}");
    let a_bundle = ip_on(
        &fx.backend,
        &format!("{}-bundle", net(&a_name)),
        &net(&a_name),
    );
    let b_bundle = ip_on(
        &fx.backend,
        &format!("{}-bundle", net(&b_name)),
        &net(&b_name),
    );
    let b_agent = ip_on(
        &fx.backend,
        &format!("{}-agent", net(&b_name)),
        &net(&b_name),
    );
    let b_bundle_egress = ip_on(
        &fx.backend,
        &format!("{}-bundle", net(&b_name)),
        EGRESS_NETWORK,
    );

    // Positive control: A reaches its own bundle's proxy.
    assert!(
        connects(&*a, &a_bundle, 8888),
        "A cannot reach its own proxy at {a_bundle}"
    );
    // ...but not the bundle's egress daemon, bound to its loopback.
    assert!(!connects(&*a, &a_bundle, 9099), "A reached the egress port");

    // B's agent listens; B itself can connect (control), A cannot.
    let listen = sh(
        &*b,
        // Connect until the listener answers (bounded: 50 tries 0.1 s apart).
        "nc -ll -p 7000 -e true </dev/null >/dev/null 2>&1 & \
         i=0; while [ $i -lt 50 ]; do nc -w 2 127.0.0.1 7000 </dev/null >/dev/null 2>&1 && exit 0; \
         i=$((i + 1)); sleep 0.1; done; exit 1",
    );
    assert_eq!(listen.exit_code, 0, "B's own listener does not answer B");
    assert!(
        !connects(&*a, &b_agent, 7000),
        "A reached B's agent at {b_agent}"
    );
    assert!(
        !connects(&*a, &b_bundle, 8888),
        "A reached B's bundle at {b_bundle}"
    );
    assert!(
        !connects(&*a, &b_bundle_egress, 8888),
        "A reached B's bundle on the egress network at {b_bundle_egress}"
    );

    // The host: a listener on every host address. The host reaches it on
    // the egress bridge's gateway (control); the agent reaches it on no
    // address it could route to.
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hang up, so a leak shows as a quick success.
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let engine = fx.backend.engine().unwrap();
    let egress_gateway = engine
        .block_on(engine.docker.inspect_network(EGRESS_NETWORK, None))
        .unwrap()
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().find_map(|c| c.gateway))
        .expect("the egress network has a gateway");
    let gateway_ip: Ipv4Addr = egress_gateway.parse().unwrap();
    assert!(
        std::net::TcpStream::connect_timeout(
            &SocketAddr::from((gateway_ip, port)),
            Duration::from_secs(2)
        )
        .is_ok(),
        "control: the host cannot reach its own listener on {egress_gateway}"
    );
    let a_gateway = {
        let octets: Vec<&str> = a_bundle.split('.').collect();
        format!("{}.{}.{}.1", octets[0], octets[1], octets[2])
    };
    for target in [egress_gateway.as_str(), a_gateway.as_str(), "172.17.0.1"] {
        assert!(
            !connects(&*a, target, port),
            "the agent reached a host listener at {target}:{port}"
        );
    }
}

#[test]
fn the_agent_is_confined() {
    let Some(fx) = support::setup("the_agent_is_confined") else {
        return;
    };
    let name = name("confined");
    let (_guard, bottle) = fx.start(&name);
    let agent = format!("bot-bottle-{name}-agent");
    let host = inspect(&fx.backend, &agent).host_config.unwrap();
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(host.cap_add.unwrap_or_default(), Vec::<String>::new());
    assert!(
        host.security_opt
            .unwrap()
            .iter()
            .any(|o| o == "no-new-privileges")
    );
    assert_eq!(host.memory, Some(256 << 20));
    assert_eq!(host.memory_swap, Some(256 << 20));
    assert_eq!(host.pids_limit, Some(128));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_ne!(host.privileged, Some(true));

    // From inside: no effective capabilities, no privilege gain, not root.
    let status = String::from_utf8(sh(&*bottle, "cat /proc/self/status; id -u").stdout).unwrap();
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.trim_end().ends_with("\n1000"), "{status}");
    // The pid limit holds inside the container too.
    let pids = sh(
        &*bottle,
        "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max",
    );
    assert_eq!(String::from_utf8(pids.stdout).unwrap().trim(), "128");

    // The bundle is hardened the same way.
    let bundle = inspect(&fx.backend, &format!("bot-bottle-{name}-bundle"))
        .host_config
        .unwrap();
    assert_eq!(bundle.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(
        bundle
            .security_opt
            .unwrap()
            .iter()
            .any(|o| o == "no-new-privileges")
    );
}

/// A network interface the test creates for its fake "internet" resolver,
/// removed when dropped.
struct TestInterface {
    name: &'static str,
}

impl TestInterface {
    fn ip(args: &[&str]) -> bottle_core::exec::CommandOutput {
        SystemRunner
            .run(&CommandSpec::new("ip").args(args.iter().copied()))
            .expect("run ip")
    }

    /// A dummy interface (or, on kernels without the dummy driver, an empty
    /// bridge, which behaves the same) holding `addr`/32.
    fn create(name: &'static str, addr: &str) -> Result<TestInterface, String> {
        let _ = Self::ip(&["link", "del", name]);
        let created = Self::ip(&["link", "add", name, "type", "dummy"]).success()
            || Self::ip(&["link", "add", name, "type", "bridge"]).success();
        if !created {
            return Err(format!(
                "cannot create interface {name} (needs root / CAP_NET_ADMIN)"
            ));
        }
        let iface = TestInterface { name };
        for args in [
            vec!["addr", "add", &format!("{addr}/32"), "dev", name],
            vec!["link", "set", name, "up"],
        ] {
            let args: Vec<&str> = args.iter().map(|s| s.as_ref()).collect();
            let out = Self::ip(&args);
            if !out.success() {
                return Err(format!("ip {}: {}", args.join(" "), out.stderr_text()));
            }
        }
        Ok(iface)
    }
}

impl Drop for TestInterface {
    fn drop(&mut self) {
        let _ = Self::ip(&["link", "del", self.name]);
    }
}

/// Records every datagram to `addr:53` until it sees `marker` (or times
/// out), and returns the ones before it.
fn record_until(socket: UdpSocket, marker: &'static [u8]) -> mpsc::Receiver<(Vec<Vec<u8>>, bool)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        let mut buf = [0u8; 1500];
        while Instant::now() < deadline {
            if let Ok((n, _)) = socket.recv_from(&mut buf) {
                if &buf[..n] == marker {
                    let _ = tx.send((seen, true));
                    return;
                }
                seen.push(buf[..n].to_vec());
            }
        }
        let _ = tx.send((seen, false));
    });
    rx
}

#[test]
fn the_agent_has_no_dns() {
    const RESOLVER: &str = "198.51.100.53";
    let upstream: Ipv4Addr = RESOLVER.parse().unwrap();
    let Some(fx) = support::setup_with("the_agent_has_no_dns", |o| {
        // The strongest case: the agent's embedded resolver is told to
        // forward to a real (recording) resolver on this host.
        o.dns_upstream = Some(upstream);
    }) else {
        return;
    };
    let iface = match TestInterface::create("bottletestdns", RESOLVER) {
        Ok(iface) => iface,
        Err(why) => {
            support::unavailable("the_agent_has_no_dns", &why);
            return;
        }
    };
    let route = TestInterface::ip(&["route", "get", RESOLVER]).stdout_text();
    assert!(
        route.starts_with(&format!("local {RESOLVER} ")),
        "{RESOLVER} is not delivered to this host: {route}"
    );
    let addrs = TestInterface::ip(&["-4", "addr", "show", "dev", iface.name]).stdout_text();
    assert!(addrs.contains(&format!("inet {RESOLVER}/32")), "{addrs}");

    let udp = UdpSocket::bind((upstream, 53)).unwrap();
    let tcp = TcpListener::bind((upstream, 53)).unwrap();
    tcp.set_nonblocking(true).unwrap();
    let recorded = record_until(udp, b"bottle-dns-control");

    let name = name("nodns");
    let (_guard, bottle) = fx.start(&name);
    let agent = format!("bot-bottle-{name}-agent");
    let dns = inspect(&fx.backend, &agent)
        .host_config
        .unwrap()
        .dns
        .unwrap();
    assert_eq!(dns, [RESOLVER], "the recorder is not the agent's upstream");

    let resolv = String::from_utf8(sh(&*bottle, "cat /etc/resolv.conf").stdout).unwrap();
    assert!(!resolv.contains("nameserver"), "{resolv}");
    // Through the embedded resolver, straight at the upstream, and through
    // the resolver config: every lookup fails.
    for (label, server) in [
        ("embedded", " 127.0.0.11"),
        ("direct", " 198.51.100.53"),
        ("default", ""),
    ] {
        let out = sh(
            &*bottle,
            &format!("nslookup bottle-exfil-{label}.example{server}"),
        );
        assert_ne!(
            out.exit_code,
            0,
            "{label}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    // Positive control: the recorder hears the host.
    let host = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    host.send_to(b"bottle-dns-control", (upstream, 53)).unwrap();
    let (seen, control) = recorded.recv().unwrap();
    assert!(control, "control: the recorder never heard the host");
    assert!(seen.is_empty(), "the recorder heard the agent: {seen:?}");
    match tcp.accept() {
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a TCP connection reached the recorder: {other:?}"),
    }
}
