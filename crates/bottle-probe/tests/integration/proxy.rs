//! The proxy probes against fake proxies: a strict one that refuses
//! everything the bundle refuses, a leaky one that forwards anything, and
//! a naive one that scans only what it sees verbatim (each chunk on its
//! own, encoded bodies as bytes, no entropy). Every probe must come out
//! blocked against the first and reached against the second; against the
//! third exactly the hidden-secret probes must reach.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use bottle_probe::contract::Outcome;

use crate::fixture::{self, read_head};

const ALLOWED: &str = "allowed.bottle.test";
/// The host the strict proxy holds a credential for: plain HTTP to it is
/// refused, a tunnel to its TLS port opens but takes only TLS.
const CREDENTIAL: &str = "cred.bottle.test";
/// The host whose secrets the strict proxy masks instead of refusing.
const REDACT: &str = "redact.bottle.test";

/// How a fake proxy treats what it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Leaky,
    Naive,
}

fn serve(mode: Mode, token: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let token = token.clone();
            std::thread::spawn(move || handle(s, mode, &token));
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

fn handle(mut s: TcpStream, mode: Mode, token: &str) {
    let head = String::from_utf8_lossy(&read_head(&mut s)).into_owned();
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    if header(&head, "upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
        if mode == Mode::Leaky || target.starts_with(&format!("http://{ALLOWED}/")) {
            let _ = s.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            );
            websocket(&mut s, mode);
        } else {
            refuse(&mut s, 403);
        }
        return;
    }
    if method == "POST" && target.starts_with(&format!("http://{REDACT}/")) {
        // The body comes back as the upstream would see it: masked whole
        // (strict), masked chunk by chunk (naive), or as sent (leaky).
        let chunks = read_body(&mut s, &head);
        let echoed = match mode {
            Mode::Leaky => chunks.concat(),
            Mode::Strict => mask_keys(&chunks.concat()),
            Mode::Naive => chunks.iter().flat_map(|c| mask_keys(c)).collect(),
        };
        let mut body = format!("canary {token}\n").into_bytes();
        body.extend_from_slice(&echoed);
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(&body);
        return;
    }
    if mode == Mode::Leaky {
        if method == "CONNECT" && target == format!("{CREDENTIAL}:443") && starts_tls(&mut s) {
            // Forwards the request, credential and all, and the answer.
            answer_in_tls(s, |_| {
                let body = format!("canary {token}\n");
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            });
        } else if method == "CONNECT" {
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
            // Forwards the body as it came, secrets and all.
            let _ = read_body(&mut s, &head);
            ok(&mut s, token);
        }
        return;
    }
    // Like the bundle: the body as its content (de-chunked, decoded), and
    // random-looking tokens in the path and header values.
    let chunks = read_body(&mut s, &head);
    let has_secret = |t: &[u8]| {
        key_at(t, b"AKIA", 16, |b| {
            b.is_ascii_uppercase() || b.is_ascii_digit()
        }) || key_at(t, b"ghp_", 36, |b| b.is_ascii_alphanumeric())
    };
    let secret = has_secret(head.as_bytes())
        || match mode {
            Mode::Naive => chunks.iter().any(|c| has_secret(c)),
            _ => {
                random_in_target_or_headers(&head)
                    || decode(&head, chunks.concat()).is_none_or(|b| has_secret(&b))
            }
        };
    match method {
        "CONNECT" if target == format!("{CREDENTIAL}:443") => {
            if starts_tls(&mut s) {
                // Like the bundle: the credential's TLS to the canary fails.
                answer_in_tls(s, |_| {
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .into()
                });
            } else {
                // Not TLS: hang up.
                let _ = read_head(&mut s);
            }
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
        "CONNECT" => {
            // Like the bundle: a denied tunnel opens only to answer 403
            // to the request inside.
            let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
            let _ = read_head(&mut s);
            refuse(&mut s, 403)
        }
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

/// A WebSocket's messages, echoed back whole; a secret closes it (1008)
/// where the proxy scans: in the whole message (strict) or in each frame
/// alone (naive). Bounded: a few messages, a few seconds.
fn websocket(s: &mut TcpStream, mode: Mode) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut message = Vec::new();
    for _ in 0..16 {
        let mut head = [0u8; 2];
        if s.read_exact(&mut head).is_err() {
            return;
        }
        let len = match head[1] & 0x7F {
            126 => {
                let mut ext = [0u8; 2];
                if s.read_exact(&mut ext).is_err() {
                    return;
                }
                usize::from(u16::from_be_bytes(ext))
            }
            n => usize::from(n),
        };
        let mut mask = [0u8; 4];
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut mask).is_err() || s.read_exact(&mut payload).is_err() {
            return;
        }
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        let scanned = match mode {
            Mode::Leaky => false,
            Mode::Naive => has_key(&payload),
            Mode::Strict => has_key(&[message.as_slice(), &payload].concat()),
        };
        if scanned {
            let _ = s.write_all(&[0x88, 2, 0x03, 0xF0]);
            return;
        }
        message.extend_from_slice(&payload);
        if head[0] & 0x80 != 0 {
            let mut frame = vec![0x81, message.len() as u8];
            frame.append(&mut message);
            let _ = s.write_all(&frame);
        }
    }
}

/// Whether `t` holds a fake AWS key.
fn has_key(t: &[u8]) -> bool {
    key_at(t, b"AKIA", 16, |b| {
        b.is_ascii_uppercase() || b.is_ascii_digit()
    })
}

/// `t` with every fake AWS key masked as the bundle masks it.
fn mask_keys(t: &[u8]) -> Vec<u8> {
    let mut out = t.to_vec();
    let mut i = 0;
    while i + 20 <= out.len() {
        if has_key(&out[i..i + 20]) {
            out[i..i + 20].copy_from_slice(b"REDACTED************");
            i += 20;
        } else {
            i += 1;
        }
    }
    out
}

/// Opens the tunnel and tells whether the client starts TLS in it (a
/// handshake record's first byte), without taking the byte.
fn starts_tls(s: &mut TcpStream) -> bool {
    let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut first = [0u8; 1];
    s.peek(&mut first).is_ok_and(|n| n == 1 && first[0] == 22)
}

/// Serves TLS for [`CREDENTIAL`] (a self-signed leaf) on `s`, reads the
/// request head inside and writes `answer(head)`.
fn answer_in_tls(s: TcpStream, answer: impl FnOnce(&str) -> String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![CREDENTIAL.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], der)
    .unwrap();
    let conn = rustls::ServerConnection::new(std::sync::Arc::new(config)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, s);
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
        match tls.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return,
        }
    }
    let reply = answer(&String::from_utf8_lossy(&head));
    let _ = tls.write_all(reply.as_bytes());
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// Whether `t` holds `prefix` followed by `len` bytes that all pass `ok`
/// (the scanner's key shapes, without a regex).
fn key_at(t: &[u8], prefix: &[u8], len: usize, ok: fn(&u8) -> bool) -> bool {
    t.windows(prefix.len() + len)
        .any(|w| w.starts_with(prefix) && w[prefix.len()..].iter().all(ok))
}

/// The request body `head` declares, as it came: `Content-Length` bytes
/// or each chunk of a chunked body, bounded.
fn read_body(s: &mut TcpStream, head: &str) -> Vec<Vec<u8>> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if header(head, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut reader = std::io::BufReader::new(s);
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            if std::io::BufRead::read_line(&mut reader, &mut size).unwrap_or(0) == 0 {
                return body;
            }
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
                return body;
            };
            // The data and its CRLF (the last chunk: the final CRLF).
            let mut data = vec![0u8; n.min(64 * 1024) + 2];
            if reader.read_exact(&mut data).is_err() || n == 0 {
                return body;
            }
            data.truncate(n);
            body.push(data);
        }
    }
    let len = header(head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(64 * 1024)];
    let _ = s.read_exact(&mut body);
    vec![body]
}

/// The body decoded through its `Content-Encoding` (`None`: it does not
/// decode, which the bundle refuses too).
fn decode(head: &str, body: Vec<u8>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let ok = match header(head, "content-encoding") {
        None | Some("identity") => return Some(body),
        Some("gzip") => flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut out),
        Some("deflate") => flate2::read::ZlibDecoder::new(&body[..]).read_to_end(&mut out),
        Some("br") => brotli_decompressor::Decompressor::new(&body[..], 4096).read_to_end(&mut out),
        Some(_) => return None,
    };
    ok.ok().map(|_| out)
}

/// A path segment or header value holding a run of 32+ base64 characters
/// with upper case, lower case and digits (the bundle also weighs its
/// entropy; these fakes need no more).
fn random_in_target_or_headers(head: &str) -> bool {
    let random = |text: &str| {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || "+/_-=".contains(c)))
            .filter(|t| t.len() >= 32)
            .any(|t| {
                t.bytes().any(|b| b.is_ascii_uppercase())
                    && t.bytes().any(|b| b.is_ascii_lowercase())
                    && t.bytes().any(|b| b.is_ascii_digit())
            })
    };
    let mut lines = head.lines();
    let target = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    path.split('/').any(random)
        || lines
            .filter_map(|l| l.split_once(':'))
            .any(|(_, v)| random(v.trim()))
}

fn proxy_config(token: &str, proxy: SocketAddr) -> bottle_probe::contract::ProbeConfig {
    let mut t = fixture::canaries_targets_without_listeners();
    t.proxy = format!("http://{proxy}");
    t.credential_host = CREDENTIAL.into();
    t.redact_host = REDACT.into();
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
    let cfg = proxy_config(token, serve(Mode::Strict, token.into()));
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.results.len() >= 15, "{}", run.results.len());
    for r in &run.results {
        let want = if CONTROLS.contains(&r.probe.as_str()) {
            Outcome::Reached
        } else {
            Outcome::Blocked
        };
        assert_eq!(r.outcome, want, "{r:?}");
        assert_eq!(r.category, "proxy");
    }
    let redacted = run
        .results
        .iter()
        .find(|r| r.probe == "proxy-redact-secret");
    assert!(
        redacted.is_some_and(|r| r.observed.contains("arrived masked")),
        "{redacted:?}"
    );
    // The request to the credential's host came back from inside the TLS.
    let tls = run
        .results
        .iter()
        .find(|r| r.probe == "proxy-credential-tls")
        .expect("proxy-credential-tls ran");
    assert!(tls.observed.contains("status Some(502)"), "{tls:?}");
    // The hidden secrets are refused (or masked) for what they carry, not
    // lost on the way.
    for name in HIDDEN {
        let r = run.results.iter().find(|r| r.probe == *name);
        let r = r.unwrap_or_else(|| panic!("{name} did not run"));
        assert!(
            r.observed.contains("status Some(403)")
                || r.observed.contains("403 Refused")
                || r.observed.contains("closed with 1008")
                || r.observed.contains("arrived masked"),
            "{r:?}"
        );
    }
}

/// The probes that must reach through a proxy that works.
const CONTROLS: &[&str] = &["proxy-allowed-control", "proxy-websocket-control"];

/// The probes of secrets a naive scanner misses.
const HIDDEN: &[&str] = &[
    "proxy-secret-split",
    "proxy-websocket-split",
    "proxy-redact-secret",
    "proxy-secret-gzip",
    "proxy-secret-deflate",
    "proxy-secret-br",
    "proxy-secret-entropy-path",
    "proxy-secret-entropy-header",
];

#[test]
fn a_leaky_proxy_is_caught_by_every_proxy_probe() {
    let token = "tok-proxy-leaky";
    let cfg = proxy_config(token, serve(Mode::Leaky, token.into()));
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

#[test]
fn a_proxy_that_scans_only_what_it_sees_verbatim_is_caught_by_the_hidden_secret_probes() {
    let token = "tok-proxy-naive";
    let cfg = proxy_config(token, serve(Mode::Naive, token.into()));
    let run = fixture::run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for r in &run.results {
        let want = if CONTROLS.contains(&r.probe.as_str()) || HIDDEN.contains(&r.probe.as_str()) {
            Outcome::Reached
        } else {
            Outcome::Blocked
        };
        assert_eq!(r.outcome, want, "{r:?}");
    }
}
