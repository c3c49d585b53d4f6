//! The network and DNS probes as the positive control and against closed
//! ports.

use bottle_probe::contract::Outcome;

use crate::fixture::{self, canaries, config, loopback, network_probe_names, run_probe};

#[test]
fn the_control_reaches_every_network_canary_with_the_token() {
    if !fixture::can_bind_low_ports() {
        return;
    }
    let c = canaries();
    let cfg = config(&c.token, c.targets.clone(), true, &[]);
    let run = run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let names = network_probe_names(&cfg);
    let got: Vec<&str> = run.results.iter().map(|r| r.probe.as_str()).collect();
    assert_eq!(got, names, "the control runs exactly the network probes");
    for r in &run.results {
        assert!(r.network, "{r:?}");
        if r.probe == "tcp-internet-v6" && !c.v6 {
            continue;
        }
        assert_eq!(r.outcome, Outcome::Reached, "{r:?}");
    }
    let http = run
        .results
        .iter()
        .find(|r| r.probe == "tcp-internet-v4-80")
        .unwrap();
    assert!(http.observed.contains("token"), "{http:?}");
    let dns = run
        .results
        .iter()
        .find(|r| r.probe == "dns-canary-udp")
        .unwrap();
    assert!(dns.observed.contains("NXDOMAIN"), "{dns:?}");
}

#[test]
fn closed_ports_and_silent_addresses_are_blocked() {
    if !fixture::can_bind_low_ports() {
        return;
    }
    let c = canaries();
    let mut t = c.targets.clone();
    // Addresses of this process's block where nothing listens; ICMP is
    // left out, since every loopback address answers an echo.
    for (field, last) in [
        (&mut t.internet_v4, 21),
        (&mut t.metadata, 22),
        (&mut t.private, 23),
        (&mut t.dns_server, 24),
        (&mut t.gateway, 25),
        (&mut t.other_bundle, 26),
        (&mut t.own_bundle, 27),
    ] {
        *field = loopback(last).to_string();
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    t.host_loopback_port = closed.local_addr().unwrap().port();
    drop(closed);
    t.internet_v6 = "::1".into();
    // The relays' probes: no listener at the pinned addresses or the
    // service ports, and this host's /etc/hosts names neither relay.
    t.pinned_tcp_addr = loopback(28).to_string();
    t.other_tcp_addr = loopback(29).to_string();
    t.host_service_port = t.host_loopback_port;
    t.host_service_unnamed_port = t.host_loopback_port;
    let only = [
        "tcp-internet-v4-80",
        "tcp-internet-v4-443",
        "tcp-internet-v4-8443",
        "udp-internet-v4",
        "tcp-host-loopback",
        "tcp-gateway-host-port",
        "tcp-gateway-loopback-port",
        "tcp-metadata",
        "tcp-private",
        "tcp-other-bundle",
        "tcp-own-bundle-egress",
        "noproxy-direct-http",
        "dns-canary-udp",
        "dns-canary-tcp",
        "host-service-control",
        "host-service-other-port",
        "host-service-loopback-direct",
        "tcp-pinned-control",
        "tcp-pinned-direct",
        "tcp-pinned-other-port",
        "tcp-pinned-other-host",
    ];
    let cfg = config(&c.token, t, false, &only);
    let run = run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.results.len(), only.len());
    for r in &run.results {
        assert_eq!(r.outcome, Outcome::Blocked, "{r:?}");
    }
}

#[test]
fn a_canary_that_answers_without_the_token_does_not_count() {
    if !fixture::can_bind_low_ports() {
        return;
    }
    let c = canaries();
    let cfg = config(
        "a-token-no-canary-knows",
        c.targets.clone(),
        true,
        &["tcp-internet-v4-80", "udp-internet-v4", "icmp-internet-v4"],
    );
    let run = run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.results.len(), 3);
    let http = &run.results[0];
    assert_eq!(http.outcome, Outcome::Blocked, "{http:?}");
    assert!(http.observed.contains("no token"), "{http:?}");
    // The echo services return what they were sent, token included.
    assert_eq!(
        run.results[1].outcome,
        Outcome::Reached,
        "{:?}",
        run.results[1]
    );
    assert_eq!(
        run.results[2].outcome,
        Outcome::Reached,
        "{:?}",
        run.results[2]
    );
}
