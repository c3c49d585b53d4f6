//! The operator probe against a fake supervise: one that takes every call
//! (the probe plants its text and says so) and one that refuses (the probe
//! reports an error, since nothing reached the operator to check).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use bottle_probe::contract::{HOSTILE_EGRESS_HOST, Outcome};

use crate::fixture::{self, read_head};

/// A fake supervise on loopback; returns its address and the bodies it got.
fn serve(takes: bool) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let head = String::from_utf8_lossy(&read_head(&mut s)).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; len];
            s.read_exact(&mut body).unwrap();
            seen.lock().unwrap().push(String::from_utf8(body).unwrap());
            let answer = if takes {
                r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#
            } else {
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}"#
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (addr, bodies)
}

fn run(addr: SocketAddr) -> bottle_probe::contract::ProbeResult {
    let mut t = fixture::canaries_targets_without_listeners();
    t.supervise_url = format!("http://{addr}/mcp");
    let cfg = fixture::config("tok-operator", t, false, &["operator-hostile-text"]);
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.results.len(), 1, "{}", run.stderr);
    run.results.into_iter().next().unwrap()
}

#[test]
fn hostile_text_is_planted_through_every_supervise_tool() {
    let (addr, bodies) = serve(true);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Blocked, "{r:?}");
    let bodies = bodies.lock().unwrap();
    assert!(
        bodies.iter().any(|b| b.contains("\"notify\"")),
        "{bodies:?}"
    );
    assert!(
        bodies.iter().any(|b| b.contains(HOSTILE_EGRESS_HOST)),
        "{bodies:?}"
    );
    // serde_json escapes the C0 controls; the C1 and bidi ones travel raw.
    assert!(bodies.iter().any(|b| b.contains('\u{9b}')), "{bodies:?}");
}

#[test]
fn a_refusing_supervise_is_an_error_not_a_pass() {
    let (addr, _) = serve(false);
    let r = run(addr);
    assert_eq!(r.outcome, Outcome::Error, "{r:?}");
}
