//! The audit flood against fake proxies that keep connections alive: a
//! strict one that refuses everything (the probe is blocked, and the fake
//! counts that the flood came: distinct long paths over varying names,
//! then an identical run), one that forwards (reached), and none at all
//! (an error: no flood, nothing proven).

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
    /// Requests on a connection that had already carried one.
    reused: usize,
    identical: usize,
    hosts: BTreeSet<String>,
    longest_path: usize,
}

fn serve(forward: bool) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let counts = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let counts = counts.clone();
            std::thread::spawn(move || handle(s, forward, &counts));
        }
    });
    (addr, seen)
}

/// Answers every request on the connection until the client closes it.
fn handle(s: TcpStream, forward: bool, seen: &Mutex<Seen>) {
    let mut out = s.try_clone().unwrap();
    let mut reader = BufReader::new(s);
    let mut on_this_connection = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
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
            seen.longest_path = seen.longest_path.max(path.len());
        }
        on_this_connection += 1;
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
    let (addr, seen) = serve(false);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Blocked, "{r:?}");
    assert_eq!(r.category, "audit");
    let seen = seen.lock().unwrap();
    assert!(seen.requests >= 1100, "{seen:?}");
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
    let (addr, _) = serve(true);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Reached, "{r:?}");
}

#[test]
fn no_proxy_to_flood_is_an_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Error, "{r:?}");
}
