//! The git probes against two fake git-gates: a strict one that refuses
//! signed pushes and pushes outside `agent/*` (as the bundle's gate does)
//! and a leaky one that reads only the plain command list and so accepts
//! whatever a certificate carries. The control must land on both; the
//! signed probes must come out blocked against the first and reached
//! against the second.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bottle_probe::contract::{Outcome, git_probe_ref};

use crate::fixture::{self, read_head};

const MAIN: &str = "1111111111111111111111111111111111111111";
const BASE: &str = "2222222222222222222222222222222222222222";
const ZERO: &str = "0000000000000000000000000000000000000000";
const EMPTY_PACK_TRAILER: &[u8] =
    b"\x02\x9d\x08\x82\x3b\xd8\xa8\xea\xb5\x10\xad\x6a\xc7\x5c\x82\x3c\xfd\x3e\xd3\x1e";

/// The commands a fake gate accepted, as `old new ref`.
type Accepted = Arc<Mutex<Vec<String>>>;

fn serve(leaky: bool) -> (SocketAddr, Accepted) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Accepted::default();
    let seen = accepted.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || handle(s, leaky, &seen));
        }
    });
    (addr, accepted)
}

fn pkt(payload: &str) -> String {
    format!("{:04x}{payload}", payload.len() + 4)
}

fn packets(mut at: &[u8]) -> (Vec<Option<String>>, &[u8]) {
    let mut out = Vec::new();
    while at.len() >= 4 && !at.starts_with(b"PACK") {
        let len = usize::from_str_radix(std::str::from_utf8(&at[..4]).unwrap(), 16).unwrap();
        if len == 0 {
            out.push(None);
            at = &at[4..];
            continue;
        }
        out.push(Some(String::from_utf8_lossy(&at[4..len]).into_owned()));
        at = &at[len..];
    }
    (out, at)
}

/// The answer, chunked (as hyper streams receive-pack's output).
fn answer(s: &mut TcpStream, content_type: &str, body: &str) {
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
}

fn handle(mut s: TcpStream, leaky: bool, accepted: &Accepted) {
    let head = String::from_utf8_lossy(&read_head(&mut s)).into_owned();
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    match (method, target) {
        ("GET", "/probe.git/info/refs?service=git-receive-pack") => {
            let body = format!(
                "{}0000{}{}0000",
                pkt("# service=git-receive-pack\n"),
                pkt(&format!(
                    "{MAIN} refs/heads/main\0report-status delete-refs ofs-delta\n"
                )),
                pkt(&format!("{BASE} refs/heads/base\n")),
            );
            answer(
                &mut s,
                "application/x-git-receive-pack-advertisement",
                &body,
            );
        }
        ("POST", "/probe.git/git-receive-pack") => {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; len];
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            if s.read_exact(&mut body).is_err() {
                return;
            }
            let (lines, pack) = packets(&body);
            assert_eq!(pack.len(), 32, "the empty pack follows the framing");
            assert!(pack.starts_with(b"PACK\0\0\0\x02\0\0\0\0"));
            assert!(pack.ends_with(EMPTY_PACK_TRAILER));
            let lines: Vec<String> = lines.into_iter().flatten().collect();
            let signed = lines.first().is_some_and(|l| l.starts_with("push-cert\0"));
            // A leaky gate reads commands only from the plain list; the
            // strict one finds them in the certificate too.
            let commands: Vec<String> = if signed {
                lines
                    .iter()
                    .skip_while(|l| l.as_str() != "\n")
                    .skip(1)
                    .take_while(|l| !l.starts_with("-----BEGIN"))
                    .map(|l| l.trim_end().to_string())
                    .collect()
            } else {
                lines
                    .iter()
                    .map(|l| l.split('\0').next().unwrap_or(l).to_string())
                    .collect()
            };
            let mut report = pkt("unpack ok\n");
            for c in &commands {
                let name = c.rsplit(' ').next().unwrap_or_default();
                let refusal = if leaky {
                    None
                } else if signed {
                    Some("bottle: signed push")
                } else if !name.starts_with("refs/heads/agent/") {
                    Some("bottle: protected")
                } else {
                    None
                };
                match refusal {
                    None => {
                        accepted.lock().unwrap().push(c.clone());
                        report.push_str(&pkt(&format!("ok {name}\n")));
                    }
                    Some(why) => report.push_str(&pkt(&format!("ng {name} {why}\n"))),
                }
            }
            report.push_str("0000");
            answer(&mut s, "application/x-git-receive-pack-result", &report);
        }
        _ => {
            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
    }
}

fn git_config(token: &str, gate: SocketAddr) -> bottle_probe::contract::ProbeConfig {
    let mut t = fixture::canaries_targets_without_listeners();
    t.git_gate_url = format!("http://{gate}");
    t.git_repo = "probe".into();
    let names: Vec<String> =
        bottle_probe::probes::catalogue(&fixture::config(token, t.clone(), false, &[]))
            .into_iter()
            .filter(|p| p.category == "git")
            .map(|p| p.name)
            .collect();
    assert_eq!(
        names,
        [
            "git-push-plain-control",
            "git-push-signed",
            "git-push-cert-protected"
        ]
    );
    let only: Vec<&str> = names.iter().map(String::as_str).collect();
    fixture::config(token, t, false, &only)
}

fn outcomes(run: &fixture::Run) -> Vec<(String, Outcome)> {
    run.results
        .iter()
        .map(|r| (r.probe.clone(), r.outcome))
        .collect()
}

#[test]
fn a_strict_gate_blocks_the_signed_pushes_and_takes_the_control() {
    let token = "tok-git-strict";
    let (gate, accepted) = serve(false);
    let run = fixture::run_probe(&git_config(token, gate), std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        outcomes(&run),
        [
            ("git-push-plain-control".into(), Outcome::Reached),
            ("git-push-signed".into(), Outcome::Blocked),
            ("git-push-cert-protected".into(), Outcome::Blocked),
        ],
        "{:#?}",
        run.results
    );
    assert!(
        run.results
            .iter()
            .all(|r| r.category == "git" && !r.network)
    );
    assert!(
        run.results[1].observed.contains("bottle: signed push"),
        "{}",
        run.results[1].observed
    );
    assert_eq!(
        *accepted.lock().unwrap(),
        [format!("{ZERO} {MAIN} {}", git_probe_ref("control", token))]
    );
}

#[test]
fn a_gate_that_misses_certificates_is_caught() {
    let token = "tok-git-leaky";
    let (gate, accepted) = serve(true);
    let run = fixture::run_probe(&git_config(token, gate), std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for r in &run.results {
        assert_eq!(r.outcome, Outcome::Reached, "{r:?}");
    }
    assert_eq!(
        *accepted.lock().unwrap(),
        [
            format!("{ZERO} {MAIN} {}", git_probe_ref("control", token)),
            format!("{ZERO} {MAIN} {}", git_probe_ref("signed", token)),
            // Main to another advertised oid, not merely to itself.
            format!("{MAIN} {BASE} refs/heads/main"),
        ]
    );
}

#[test]
fn a_dead_gate_fails_the_control_and_proves_nothing_else() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let run = fixture::run_probe(
        &git_config("tok-git-dead", addr),
        std::path::Path::new("/"),
        None,
    );
    assert_eq!(
        outcomes(&run),
        [
            ("git-push-plain-control".into(), Outcome::Blocked),
            ("git-push-signed".into(), Outcome::Error),
            ("git-push-cert-protected".into(), Outcome::Error),
        ],
        "{:#?}",
        run.results
    );
}

#[test]
fn without_a_gate_the_git_probes_are_skipped() {
    let mut t = fixture::canaries_targets_without_listeners();
    t.git_repo = "probe".into();
    let cfg = fixture::config(
        "tok",
        t,
        false,
        &["git-push-plain-control", "git-push-signed"],
    );
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    for r in &run.results {
        assert_eq!(r.outcome, Outcome::Blocked, "{r:?}");
        assert!(r.observed.starts_with("skipped:"), "{r:?}");
    }
}
