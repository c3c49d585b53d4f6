//! The audit flood against fake proxies that keep connections alive: a
//! strict one that serves the allowed host and refuses everything else (the
//! probe is blocked, and the fake counts that the flood came: allowed
//! requests each with a method of its own, distinct long paths over
//! varying names, then an identical run), one that forwards everything
//! (reached), one that refuses even the allowed host (an error: the log
//! cannot be filled, nothing proven), and none at all (an error).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use bottle_probe::contract::{AUDIT_FLOOD_SAME_PATH, Outcome, ProbeResult};

use crate::fixture;

/// What the fake proxy saw.
#[derive(Debug, Default)]
struct Seen {
    requests: usize,
    /// Distinct methods of the requests to the allowed host.
    allowed_methods: BTreeSet<String>,
    /// Requests on a connection that had already carried one.
    reused: usize,
    identical: usize,
    hosts: BTreeSet<String>,
    longest_path: usize,
}

/// What a fake proxy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Serves the allowed host, refuses the rest, as the bundle does.
    Strict,
    /// Serves everything.
    Forward,
    /// Refuses everything, the allowed host too.
    RefuseAll,
}

const ALLOWED: &str = "allowed.bottle.test";

fn serve(policy: Policy) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let counts = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let counts = counts.clone();
            std::thread::spawn(move || handle(s, policy, &counts));
        }
    });
    (addr, seen)
}

/// Answers every request on the connection until the client closes it.
fn handle(s: TcpStream, policy: Policy, seen: &Mutex<Seen>) {
    let mut out = s.try_clone().unwrap();
    let mut reader = BufReader::new(s);
    let mut on_this_connection = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let method = line.split_whitespace().next().unwrap_or("").to_string();
        let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
        }
        let rest = target.strip_prefix("http://").unwrap_or(&target);
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        {
            let mut seen = seen.lock().unwrap();
            seen.requests += 1;
            seen.reused += usize::from(on_this_connection > 0);
            seen.identical += usize::from(path == AUDIT_FLOOD_SAME_PATH);
            seen.hosts.insert(host.to_string());
            if host == ALLOWED {
                seen.allowed_methods.insert(method.clone());
            }
            seen.longest_path = seen.longest_path.max(path.len());
        }
        on_this_connection += 1;
        let forward = match policy {
            Policy::Strict => host == ALLOWED,
            Policy::Forward => true,
            Policy::RefuseAll => false,
        };
        let answer = if forward {
            "HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\ncanary tok-audit\n"
        } else {
            "HTTP/1.1 403 Forbidden\r\nContent-Length: 14\r\n\r\nnot allowed.\r\n"
        };
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn run(proxy: SocketAddr) -> ProbeResult {
    let mut t = fixture::canaries_targets_without_listeners();
    t.proxy = format!("http://{proxy}");
    t.denied_host = "denied.bottle.test".into();
    let cfg = fixture::config("tok-audit", t, false, &["audit-flood"]);
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.results.len(), 1, "{}", run.stderr);
    run.results.into_iter().next().unwrap()
}

#[test]
fn a_refusing_proxy_is_flooded_and_the_probe_is_blocked() {
    let (addr, seen) = serve(Policy::Strict);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Blocked, "{r:?}");
    assert_eq!(r.category, "audit");
    let seen = seen.lock().unwrap();
    assert!(seen.requests >= 5100, "{seen:?}");
    assert!(
        seen.allowed_methods.len() >= 4000,
        "a method of its own each: {}",
        seen.allowed_methods.len()
    );
    assert!(seen.identical >= 100, "{seen:?}");
    assert!(
        seen.reused * 2 > seen.requests,
        "mostly keep-alive: {seen:?}"
    );
    assert!(seen.hosts.contains("denied.bottle.test"), "{seen:?}");
    assert!(
        seen.hosts.len() > 100,
        "varying names: {}",
        seen.hosts.len()
    );
    assert!(seen.longest_path >= 4000, "{seen:?}");
    assert!(r.observed.contains("x403"), "{}", r.observed);
}

#[test]
fn a_forwarding_proxy_is_reached() {
    let (addr, _) = serve(Policy::Forward);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Reached, "{r:?}");
}

#[test]
fn a_proxy_that_refuses_the_allowed_host_cannot_be_filled_and_is_an_error() {
    let (addr, _) = serve(Policy::RefuseAll);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Error, "{r:?}");
    assert!(
        r.observed.contains("allowed answered 2xx"),
        "{}",
        r.observed
    );
}

#[test]
fn no_proxy_to_flood_is_an_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Error, "{r:?}");
}
