//! A docker bottle's ways in and out beyond the proxy: a published port's
//! connections reach the box's own loopback through the in-box agent's
//! relay over an attached exec (`Bottle::connect_port`), and a host
//! service is reached from the box at `host.bottle.internal` through the
//! bundle's relay and the unix socket the host serves (the test serves it
//! here, as `bottle`'s forwarder does).

use std::io::{Read as _, Write as _};
use std::time::Duration;

use bottle_core::port_relay::{RelayStatus, read_status};

use crate::support::{self, name, sh};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Serves `socket` (the host's side of a host service) for one connection:
/// answers `said: ` and what it read.
fn serve_host_side(socket: &std::path::Path) -> std::thread::JoinHandle<Vec<u8>> {
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).unwrap();
        conn.write_all(b"said: ").unwrap();
        conn.write_all(&got).unwrap();
        got.to_vec()
    })
}

#[test]
fn published_ports_and_host_services_cross_without_a_route() {
    let test = "published_ports_and_host_services_cross_without_a_route";
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_none() {
        support::unavailable(
            test,
            "BOTTLE_TOOLBOX_BIN is not set (`cargo xtask dist` builds the static bottle-toolbox)",
        );
        return;
    }
    let Some(fx) = support::setup(test) else {
        return;
    };
    std::fs::write(
        fx.dir.path().join("bottle.toml"),
        format!(
            "[agents.demo]\nimage = \"{}\"\ncommand = [\"/bin/sh\"]\n\n\
             [agents.demo.egress]\nhost_services = [\"127.0.0.1:15432\"]\n\n\
             [agents.demo.limits]\nmemory = \"256m\"\npids = 128\n",
            fx.image
        ),
    )
    .unwrap();
    let name = name("ports");
    let (_guard, bottle) = fx.start(&name);
    let state_dir = fx
        .state
        .path()
        .join(bottle_core::slug::slugify(&name).unwrap());
    let routes_before = sh(&*bottle, "cat /proc/net/route");

    // A server on the box's loopback, reached through the relay.
    let served = sh(
        &*bottle,
        "mkdir -p /tmp/www && echo hello-from-the-box > /tmp/www/index.html && httpd -p 127.0.0.1:8000 -h /tmp/www",
    );
    assert_eq!(served.exit_code, 0, "{}", text(&served.stderr));
    let mut stream = bottle.connect_port(8000).unwrap();
    assert_eq!(
        read_status(&mut *stream.from_agent).unwrap(),
        RelayStatus::Connected
    );
    stream
        .to_agent
        .write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .unwrap();
    let mut response = Vec::new();
    stream.from_agent.read_to_end(&mut response).unwrap();
    let response = text(&response);
    assert!(
        response.starts_with("HTTP/1.") && response.contains(" 200 "),
        "{response}"
    );
    assert!(response.contains("hello-from-the-box"), "{response}");

    // A port nothing listens on is said at once.
    let started = std::time::Instant::now();
    let mut refused = bottle.connect_port(8001).unwrap();
    let status = read_status(&mut *refused.from_agent).unwrap();
    assert!(
        matches!(&status, RelayStatus::Refused(why) if why.contains("port 8001")),
        "{status:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // The host service, by its name, through the bundle and the socket
    // the host serves; the box names the bundle for it.
    let hosts = sh(&*bottle, "cat /etc/hosts");
    assert!(
        text(&hosts.stdout).contains("host.bottle.internal"),
        "{}",
        text(&hosts.stdout)
    );
    let host_side = serve_host_side(
        &bottle_core::bundle::host_services_dir(&state_dir)
            .join(bottle_core::bundle::host_service_socket(15432)),
    );
    let out = sh(
        &*bottle,
        "printf ping | nc -w 10 host.bottle.internal 15432",
    );
    assert_eq!(host_side.join().unwrap(), b"ping");
    assert_eq!(text(&out.stdout), "said: ping", "{}", text(&out.stderr));

    // Neither gave the box a route.
    assert_eq!(
        sh(&*bottle, "cat /proc/net/route").stdout,
        routes_before.stdout
    );
    let audit = std::fs::read_to_string(state_dir.join("logs/audit.jsonl")).unwrap();
    assert!(
        audit.lines().any(|l| l.contains("\"daemon\":\"relay\"")
            && l.contains("\"method\":\"CLOSE\"")
            && l.contains("\"port\":15432")),
        "{audit}"
    );
}
