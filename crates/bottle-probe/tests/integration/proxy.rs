//! The proxy probes against two fake proxies: a strict one that refuses
//! everything the bundle refuses, and a leaky one that forwards anything.
//! Every probe must come out blocked against the first and reached (bar
//! the one it cannot judge) against the second.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use bottle_probe::contract::Outcome;

use crate::fixture::{self, read_head};

const ALLOWED: &str = "allowed.bottle.test";
/// The host the strict proxy holds a credential for: plain HTTP to it is
/// refused, a tunnel to its TLS port opens but takes only TLS.
const CREDENTIAL: &str = "cred.bottle.test";

fn serve(leaky: bool, token: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let token = token.clone();
            std::thread::spawn(move || handle(s, leaky, &token));
        }
    });
    addr
}

fn ok(s: &mut TcpStream, token: &str) {
    let body = format!("canary {token}\n");
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn refuse(s: &mut TcpStream, code: u16) {
    let _ = write!(
        s,
        "HTTP/1.1 {code} Refused\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn handle(mut s: TcpStream, leaky: bool, token: &str) {
    let head = String::from_utf8_lossy(&read_head(&mut s)).into_owned();
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    if leaky {
        if method == "CONNECT" {
            let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
            let mut first = [0u8; 1];
            if s.read_exact(&mut first).is_ok() && first[0] == 22 {
                // Any ClientHello gets the start of a ServerHello.
                let _ = s.write_all(&[22, 3, 3, 0, 4, 2, 0, 0, 0]);
            } else {
                let _ = read_head(&mut s);
                ok(&mut s, token);
            }
        } else {
            ok(&mut s, token);
        }
        return;
    }
    let len = header(&head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(64 * 1024)];
    let _ = s.read_exact(&mut body);
    let body = String::from_utf8_lossy(&body);
    let secret = [head.as_str(), &body]
        .iter()
        .any(|t| t.contains("AKIA") || t.contains("ghp_"));
    match method {
        "CONNECT" if target == format!("{CREDENTIAL}:443") => {
            let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
            // Not TLS: hang up.
            let _ = read_head(&mut s);
        }
        "CONNECT" if target == format!("{ALLOWED}:80") => {
            let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
            let inner = String::from_utf8_lossy(&read_head(&mut s)).into_owned();
            if header(&inner, "host") == Some(ALLOWED) {
                ok(&mut s, token)
            } else {
                refuse(&mut s, 421)
            }
        }
        "CONNECT" if target == format!("{ALLOWED}:443") => {
            let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut hello = vec![0u8; 5];
            if s.read_exact(&mut hello).is_err() {
                return;
            }
            let mut rest = vec![0u8; usize::from(u16::from_be_bytes([hello[3], hello[4]]))];
            if s.read_exact(&mut rest).is_err() {
                return;
            }
            // SNI matches the tunnel: answer; otherwise hang up.
            if rest.windows(ALLOWED.len()).any(|w| w == ALLOWED.as_bytes()) {
                let _ = s.write_all(&[22, 3, 3, 0, 4, 2, 0, 0, 0]);
            }
        }
        "CONNECT" => refuse(&mut s, 403),
        "GET" | "POST" if target.starts_with(&format!("http://{ALLOWED}/")) => {
            if secret {
                refuse(&mut s, 403)
            } else if header(&head, "host") != Some(ALLOWED) {
                refuse(&mut s, 421)
            } else {
                ok(&mut s, token)
            }
        }
        _ => refuse(&mut s, 403),
    }
}

fn proxy_config(token: &str, proxy: SocketAddr) -> bottle_probe::contract::ProbeConfig {
    let mut t = fixture::canaries_targets_without_listeners();
    t.proxy = format!("http://{proxy}");
    t.credential_host = CREDENTIAL.into();
    t.rebind_hosts = vec![
        "rebind-loopback.bottle.test".into(),
        "rebind-metadata.bottle.test".into(),
    ];
    let names: Vec<String> =
        bottle_probe::probes::catalogue(&fixture::config(token, t.clone(), false, &[]))
            .into_iter()
            .filter(|p| p.category == "proxy")
            .map(|p| p.name)
            .collect();
    let only: Vec<&str> = names.iter().map(String::as_str).collect();
    fixture::config(token, t, false, &only)
}

#[test]
fn a_strict_proxy_blocks_every_proxy_probe_and_passes_the_control() {
    let token = "tok-proxy-strict";
    let cfg = proxy_config(token, serve(false, token.into()));
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.results.len() >= 15, "{}", run.results.len());
    for r in &run.results {
        let want = if r.probe == "proxy-allowed-control" {
            Outcome::Reached
        } else {
            Outcome::Blocked
        };
        assert_eq!(r.outcome, want, "{r:?}");
        assert_eq!(r.category, "proxy");
    }
}

#[test]
fn a_leaky_proxy_is_caught_by_every_proxy_probe() {
    let token = "tok-proxy-leaky";
    let cfg = proxy_config(token, serve(true, token.into()));
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for r in &run.results {
        assert_eq!(r.outcome, Outcome::Reached, "{r:?}");
    }
}

#[test]
fn a_dead_proxy_blocks_everything_including_the_control() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let cfg = proxy_config("tok-dead", addr);
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    for r in &run.results {
        assert_eq!(r.outcome, Outcome::Blocked, "{r:?}");
    }
}
