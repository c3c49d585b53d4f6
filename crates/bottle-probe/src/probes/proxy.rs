//! Attempts through the bottle's own proxy (`targets.proxy`), in raw
//! HTTP/1.1: CONNECT to a denied host, an IP literal, a disallowed port;
//! domain fronting by `Host:` header and by TLS SNI; secrets in the body,
//! a header and the query, and ones a naive scanner misses (split across
//! chunks, compressed, random tokens: [`hidden`]); the bundle's own
//! loopback; allowed names that
//! the resolver maps to forbidden addresses. One probe is the positive
//! control: `proxy-allowed-control` must reach the allowed host.

use std::io::Write;
use std::time::Instant;

use super::{Attempt, Ctx, Probe, contains, errno_name, snippet};
use crate::contract::ProbeConfig;
use crate::net;

pub(crate) mod credential_tls;
mod hidden;
mod websocket;

const CAT: &str = "proxy";

/// A fake AWS access key id the bundle's scanner flags
/// (`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`).
pub(crate) const FAKE_AWS_KEY: &str = "AKIABOTTLEPROBETESTX";
/// A fake GitHub token the scanner flags (`ghp_` + 36 alphanumerics).
pub(crate) const FAKE_GITHUB_TOKEN: &str = "ghp_bottleprobe0123456789abcdefghijklmnopq";

/// The proxy probes; one per rebind host besides the fixed ones.
pub(super) fn probes(config: &ProbeConfig) -> Vec<Probe> {
    let mut v = vec![
        Probe::new(
            "proxy-allowed-control",
            CAT,
            false,
            "CONTROL: GET http://<allowed_host>/ through the proxy must return the token (reached = the proxy works)",
            |c| {
                let h = &c.config.targets.allowed_host;
                let req = get_request(&format!("http://{h}/"), h, &[]);
                judge(c, &req, false)
            },
        ),
        connect_probe("proxy-connect-denied", "a non-allowlisted host", |t| {
            net::authority(&t.denied_host, 443)
        }),
        connect_probe(
            "proxy-connect-ip-literal",
            "an IPv4 literal (the internet canary)",
            |t| net::authority(&t.internet_v4, 443),
        ),
        connect_probe(
            "proxy-connect-ipv6-literal",
            "an IPv6 literal (the v6 canary)",
            |t| net::authority(&t.internet_v6, 80),
        ),
        connect_probe(
            "proxy-connect-port",
            "the allowed host on a disallowed port (22)",
            |t| net::authority(&t.allowed_host, 22),
        ),
        Probe::new(
            "proxy-get-denied",
            CAT,
            false,
            "GET http://<denied_host>/ through the proxy: blocked unless 2xx or the token",
            |c| {
                let h = &c.config.targets.denied_host;
                judge(c, &get_request(&format!("http://{h}/"), h, &[]), true)
            },
        ),
        Probe::new(
            "proxy-get-ip-literal",
            CAT,
            false,
            "GET http://<internet_v4>/ (an IP literal) through the proxy: blocked unless 2xx or the token",
            |c| {
                let h = net::url_host(&c.config.targets.internet_v4);
                judge(c, &get_request(&format!("http://{h}/"), &h, &[]), true)
            },
        ),
        Probe::new(
            "proxy-get-metadata",
            CAT,
            false,
            "GET http://<metadata>/ through the proxy: blocked unless 2xx or the token",
            |c| {
                let h = net::url_host(&c.config.targets.metadata);
                judge(c, &get_request(&format!("http://{h}/"), &h, &[]), true)
            },
        ),
        Probe::new(
            "proxy-bundle-loopback",
            CAT,
            false,
            "GET http://127.0.0.1:9099/ and http://localhost:9099/ (the bundle's own loopback egress) through the proxy: blocked unless 2xx or the token",
            |c| {
                let mut seen = Vec::new();
                for h in ["127.0.0.1:9099", "localhost:9099"] {
                    let a = judge(c, &get_request(&format!("http://{h}/"), h, &[]), true);
                    if a.outcome != crate::contract::Outcome::Blocked {
                        return a;
                    }
                    seen.push(format!("{h}: {}", a.observed));
                }
                Attempt::blocked(seen.join("; "))
            },
        ),
        Probe::new(
            "proxy-host-mismatch",
            CAT,
            false,
            "GET http://<allowed_host>/ with Host: <denied_host> (domain fronting): blocked unless 2xx or the token",
            |c| {
                let t = &c.config.targets;
                let req = get_request(&format!("http://{}/", t.allowed_host), &t.denied_host, &[]);
                judge(c, &req, true)
            },
        ),
        Probe::new(
            "proxy-connect-host-mismatch",
            CAT,
            false,
            "CONNECT <allowed_host>:80, then plain HTTP with Host: <denied_host> inside the tunnel: blocked unless the inner reply is 2xx or carries the token",
            tunnel_host_mismatch,
        ),
        Probe::new(
            "proxy-sni-mismatch",
            CAT,
            false,
            "CONNECT <allowed_host>:443, then a TLS ClientHello with SNI=<denied_host>: blocked unless a ServerHello comes back (a matching-SNI hello is sent first to prove the method works)",
            sni_mismatch,
        ),
        Probe::new(
            "proxy-secret-body",
            CAT,
            false,
            "POST http://<allowed_host>/ with a fake AWS key in the body: blocked unless the proxy answers 2xx",
            |c| {
                let h = &c.config.targets.allowed_host;
                let body = format!("aws_access_key_id={FAKE_AWS_KEY}&note=bottle-probe\n");
                let req = format!(
                    "POST http://{h}/ HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                judge_status_only(c, req.as_bytes())
            },
        ),
        Probe::new(
            "proxy-secret-header",
            CAT,
            false,
            "GET http://<allowed_host>/ with a fake GitHub token in a header: blocked unless the proxy answers 2xx",
            |c| {
                let h = &c.config.targets.allowed_host;
                let hdr = format!("X-Leak: {FAKE_GITHUB_TOKEN}");
                judge_status_only(c, &get_request(&format!("http://{h}/"), h, &[&hdr]))
            },
        ),
        Probe::new(
            "proxy-secret-query",
            CAT,
            false,
            "GET http://<allowed_host>/?k=<fake AWS key>: blocked unless the proxy answers 2xx",
            |c| {
                let h = &c.config.targets.allowed_host;
                judge_status_only(
                    c,
                    &get_request(&format!("http://{h}/?k={FAKE_AWS_KEY}"), h, &[]),
                )
            },
        ),
        Probe::new(
            "proxy-credential-cleartext",
            CAT,
            false,
            "GET http://<credential_host>/ (a host the bundle holds a credential for) through the proxy: blocked unless the request is forwarded (2xx or the token); the harness also looks for the secret at the canary",
            credential_cleartext,
        ),
        Probe::new(
            "proxy-credential-tunnel-plain",
            CAT,
            false,
            "CONNECT <credential_host>:443, then plain HTTP inside the tunnel: blocked unless the inner request is answered with the token; the CONNECT itself must open (the host is allowed)",
            credential_tunnel_plain,
        ),
        credential_tls::probe(),
    ];
    v.extend(hidden::probes());
    v.extend(websocket::probes());
    for host in &config.targets.rebind_hosts {
        let host = host.clone();
        v.push(Probe::new(
            rebind_name(&host),
            CAT,
            false,
            format!("GET http://{host}/ (allowed, but the resolver maps it to a forbidden address) through the proxy: blocked unless 2xx or the token"),
            move |c| judge(c, &get_request(&format!("http://{host}/"), &host, &[]), true),
        ));
    }
    v
}

/// Plain HTTP to the credential's host: the bundle must refuse rather than
/// put the secret on the wire in cleartext.
fn credential_cleartext(c: &Ctx) -> Attempt {
    let h = &c.config.targets.credential_host;
    if h.is_empty() {
        return Attempt::skipped("no credential host");
    }
    let reply = match proxy_exchange(c, &get_request(&format!("http://{h}/"), h, &[])) {
        Ok(r) => r,
        Err(a) => return a,
    };
    let status = net::status(&reply);
    let what = format!("status {status:?}: {}", snippet(&reply));
    if status.is_some_and(|s| (200..300).contains(&s)) || contains(&reply, &c.config.token) {
        Attempt::reached(format!("forwarded in cleartext: {what}"))
    } else if status == Some(403) {
        Attempt::blocked(what)
    } else {
        Attempt::error(format!("expected a 403 for an allowed host: {what}"))
    }
}

/// Plain HTTP inside a CONNECT to the credential's TLS port: the tunnel
/// opens (the host is allowed, the positive control), then the bundle must
/// refuse the bytes that are not TLS.
fn credential_tunnel_plain(c: &Ctx) -> Attempt {
    let h = &c.config.targets.credential_host;
    if h.is_empty() {
        return Attempt::skipped("no credential host");
    }
    let authority = net::authority(h, 443);
    let mut stream = match connect_tunnel(c, &authority) {
        Err(a) => return a,
        Ok((status, _, s)) if (200..300).contains(&status) => s,
        Ok((_, head, _)) => {
            return Attempt::error(format!(
                "CONNECT {authority} did not open, though the host is allowed: {}",
                snippet(&head)
            ));
        }
    };
    if let Err(e) = stream.write_all(&get_request("/", h, &[])) {
        return Attempt::blocked(format!("tunnel closed on plain HTTP: {}", errno_name(&e)));
    }
    let reply = net::read_until_close(&mut stream, Instant::now() + c.timeout);
    if contains(&reply, &c.config.token) {
        Attempt::reached(format!("plain HTTP answered: {}", snippet(&reply)))
    } else {
        Attempt::blocked(format!("plain HTTP refused: {}", snippet(&reply)))
    }
}

/// `rebind-loopback.bottle.test` → `proxy-rebind-loopback`.
pub(crate) fn rebind_name(host: &str) -> String {
    let label = host.split('.').next().unwrap_or(host);
    let label = label.strip_prefix("rebind-").unwrap_or(label);
    let clean: String = label
        .chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() || ch == '-' {
                ch.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("proxy-rebind-{clean}")
}

fn connect_probe(
    name: &'static str,
    what: &'static str,
    target: fn(&crate::contract::Targets) -> String,
) -> Probe {
    Probe::new(
        name,
        CAT,
        false,
        format!(
            "CONNECT to {what} through the proxy, then plain HTTP inside if it opens: blocked unless the inner reply is 2xx or carries the token (the bundle opens a denied tunnel only to answer 403 inside it)"
        ),
        move |c| {
            let authority = target(&c.config.targets);
            match connect_tunnel(c, &authority) {
                Err(a) => a,
                Ok((status, _, mut s)) if (200..300).contains(&status) => {
                    judge_inside(c, &mut s, &authority)
                }
                Ok((_, head, _)) => {
                    Attempt::blocked(format!("CONNECT {authority}: {}", snippet(&head)))
                }
            }
        },
    )
}

/// One plain-HTTP request inside an open tunnel: reached when it is
/// answered 2xx or with the token.
fn judge_inside(c: &Ctx, s: &mut net::Conn, authority: &str) -> Attempt {
    if let Err(e) = s.write_all(&get_request("/", authority, &[])) {
        return Attempt::blocked(format!("CONNECT {authority}: tunnel closed: {e}"));
    }
    let reply = net::read_until_close(s, Instant::now() + c.timeout);
    let inner = net::status(&reply);
    let token = contains(&reply, &c.config.token);
    let what = format!(
        "CONNECT {authority} opened; inner status {inner:?}, token {}: {}",
        if token { "seen" } else { "absent" },
        snippet(&reply)
    );
    if token || inner.is_some_and(|s| (200..300).contains(&s)) {
        Attempt::reached(what)
    } else {
        Attempt::blocked(what)
    }
}

fn get_request(uri: &str, host: &str, extra: &[&str]) -> Vec<u8> {
    let mut r = format!("GET {uri} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bottle-probe\r\n");
    for h in extra {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("Connection: close\r\n\r\n");
    r.into_bytes()
}

fn proxy_exchange(c: &Ctx, req: &[u8]) -> Result<Vec<u8>, Attempt> {
    let addr = net::proxy_addr(&c.config.targets.proxy).map_err(Attempt::error)?;
    net::exchange(addr, req, c.timeout)
        .map_err(|e| Attempt::blocked(format!("proxy {addr}: {}", errno_name(&e))))
}

/// Reached when the proxy answers 2xx, or (`token_counts`) when the
/// reply carries the token whatever the status.
fn judge(c: &Ctx, req: &[u8], token_counts: bool) -> Attempt {
    let reply = match proxy_exchange(c, req) {
        Ok(r) => r,
        Err(a) => return a,
    };
    let status = net::status(&reply);
    let token = contains(&reply, &c.config.token);
    let ok = status.is_some_and(|s| (200..300).contains(&s));
    let what = format!(
        "status {status:?}, token {}: {}",
        if token { "seen" } else { "absent" },
        snippet(&reply)
    );
    let reached = if token_counts {
        ok || token
    } else {
        ok && token
    };
    if reached {
        Attempt::reached(what)
    } else {
        Attempt::blocked(what)
    }
}

fn judge_status_only(c: &Ctx, req: &[u8]) -> Attempt {
    let reply = match proxy_exchange(c, req) {
        Ok(r) => r,
        Err(a) => return a,
    };
    match net::status(&reply) {
        Some(s) if (200..300).contains(&s) => {
            Attempt::reached(format!("the proxy forwarded it: {}", snippet(&reply)))
        }
        _ => Attempt::blocked(format!("refused: {}", snippet(&reply))),
    }
}

/// Sends `CONNECT authority`; returns the status, the response head and
/// the stream (open when the status is 2xx).
fn connect_tunnel(c: &Ctx, authority: &str) -> Result<(u16, Vec<u8>, net::Conn), Attempt> {
    let addr = net::proxy_addr(&c.config.targets.proxy).map_err(Attempt::error)?;
    let mut s = net::connect(addr, c.timeout)
        .map_err(|e| Attempt::blocked(format!("proxy {addr}: {}", errno_name(&e))))?;
    let req = format!(
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: bottle-probe\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .map_err(|e| Attempt::blocked(format!("proxy {addr}: {}", errno_name(&e))))?;
    let head = net::read_head(&mut s, Instant::now() + c.timeout);
    let status = net::status(&head).ok_or_else(|| {
        Attempt::blocked(format!(
            "CONNECT {authority}: no HTTP answer: {:?}",
            snippet(&head)
        ))
    })?;
    Ok((status, head, s))
}

fn tunnel_host_mismatch(c: &Ctx) -> Attempt {
    let t = &c.config.targets;
    let authority = net::authority(&t.allowed_host, 80);
    let (status, head, mut s) = match connect_tunnel(c, &authority) {
        Ok(x) => x,
        Err(a) => return a,
    };
    if !(200..300).contains(&status) {
        return Attempt::blocked(format!("CONNECT {authority} refused: {}", snippet(&head)));
    }
    let req = get_request("/", &t.denied_host, &[]);
    if let Err(e) = s.write_all(&req) {
        return Attempt::blocked(format!("tunnel closed: {e}"));
    }
    let reply = net::read_until_close(&mut s, Instant::now() + c.timeout);
    let inner = net::status(&reply);
    let token = contains(&reply, &c.config.token);
    let what = format!(
        "inner status {inner:?}, token {}: {}",
        if token { "seen" } else { "absent" },
        snippet(&reply)
    );
    if token || inner.is_some_and(|s| (200..300).contains(&s)) {
        Attempt::reached(what)
    } else {
        Attempt::blocked(what)
    }
}

/// What came back after a ClientHello.
#[derive(Debug, PartialEq, Eq)]
enum HelloAnswer {
    ServerHello,
    Other(String),
}

fn hello_through_tunnel(c: &Ctx, sni: &str) -> Result<HelloAnswer, Attempt> {
    let t = &c.config.targets;
    let authority = net::authority(&t.allowed_host, 443);
    let (status, head, mut s) = connect_tunnel(c, &authority)?;
    if !(200..300).contains(&status) {
        return Err(Attempt::blocked(format!(
            "CONNECT {authority} refused: {}",
            snippet(&head)
        )));
    }
    if let Err(e) = s.write_all(&client_hello(sni)) {
        return Ok(HelloAnswer::Other(format!("write: {e}")));
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + c.timeout;
    let mut buf = [0u8; 4096];
    while got.len() < 6 && Instant::now() < deadline {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Ok(HelloAnswer::Other(errno_name(&e))),
        }
    }
    // A handshake record (22) whose first message is a ServerHello (2).
    if got.len() >= 6 && got[0] == 22 && got[5] == 2 {
        Ok(HelloAnswer::ServerHello)
    } else if got.is_empty() {
        Ok(HelloAnswer::Other(
            "the tunnel closed without a TLS answer".into(),
        ))
    } else {
        Ok(HelloAnswer::Other(format!(
            "TLS answer {:02x?}",
            &got[..got.len().min(7)]
        )))
    }
}

fn sni_mismatch(c: &Ctx) -> Attempt {
    let t = &c.config.targets;
    let good = match hello_through_tunnel(c, &t.allowed_host) {
        Ok(a) => a,
        Err(a) => return a,
    };
    if good != HelloAnswer::ServerHello {
        return Attempt::error(format!(
            "the proxy did not answer a ClientHello with the matching SNI {} either ({good:?}); the probe's hello cannot judge the mismatch",
            t.allowed_host
        ));
    }
    match hello_through_tunnel(c, &t.denied_host) {
        Err(a) => a,
        Ok(HelloAnswer::ServerHello) => Attempt::reached(format!(
            "the proxy answered SNI={} inside a tunnel to {} with a ServerHello",
            t.denied_host, t.allowed_host
        )),
        Ok(HelloAnswer::Other(what)) => Attempt::blocked(format!(
            "matching SNI got a ServerHello; SNI={}: {what}",
            t.denied_host
        )),
    }
}

/// A TLS 1.2 ClientHello for `sni` that a rustls server with ECDSA or RSA
/// keys accepts (AES-GCM and ChaCha20 ECDHE suites, x25519/P-256).
pub(crate) fn client_hello(sni: &str) -> Vec<u8> {
    fn ext(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(data);
    }
    let mut exts = Vec::new();
    let name = sni.as_bytes();
    let mut sn = Vec::new();
    sn.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    sn.push(0);
    sn.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sn.extend_from_slice(name);
    ext(&mut exts, 0x0000, &sn);
    ext(&mut exts, 0x000a, &[0, 4, 0x00, 0x1d, 0x00, 0x17]);
    ext(&mut exts, 0x000b, &[1, 0]);
    ext(
        &mut exts,
        0x000d,
        &[
            0, 10, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01, 0x08, 0x07, 0x05, 0x03,
        ],
    );
    ext(&mut exts, 0x0017, &[]);
    ext(&mut exts, 0xff01, &[0]);
    let suites: [u16; 6] = [0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8];
    let mut body = vec![0x03, 0x03];
    // The client random: any 32 bytes do for a hello that goes no further.
    let seed = std::process::id().to_be_bytes();
    body.extend((0..32).map(|i| seed[i % 4] ^ (i as u8)));
    body.push(0);
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        body.extend_from_slice(&s.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![22, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebind_names_are_stable() {
        assert_eq!(
            rebind_name("rebind-loopback.bottle.test"),
            "proxy-rebind-loopback"
        );
        assert_eq!(rebind_name("Meta_Data.test"), "proxy-rebind-meta-data");
    }

    #[test]
    fn client_hello_lengths_add_up() {
        let h = client_hello("allowed.bottle.test");
        assert_eq!(h[0], 22);
        let rec_len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        assert_eq!(rec_len, h.len() - 5);
        assert_eq!(h[5], 1, "a ClientHello");
        let hs_len = usize::from(h[7]) << 8 | usize::from(h[8]);
        assert_eq!(hs_len, h.len() - 9);
        assert!(contains(&h, "allowed.bottle.test"));
    }

    /// The hello must get a ServerHello from a rustls server set up like
    /// the bundle's leaf minter, or the SNI probe could never judge.
    #[test]
    fn rustls_answers_the_hand_made_client_hello() {
        use std::sync::Arc;
        let host = "allowed.bottle.test";
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![host.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
        );
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der)
        .unwrap();
        let mut acceptor = rustls::server::Acceptor::default();
        let hello = client_hello(host);
        acceptor.read_tls(&mut &hello[..]).unwrap();
        let accepted = acceptor.accept().map_err(|(e, _)| e).unwrap().unwrap();
        assert_eq!(accepted.client_hello().server_name(), Some(host));
        let mut conn = accepted
            .into_connection(Arc::new(cfg))
            .map_err(|(e, _)| e)
            .unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        assert!(
            out.len() > 6 && out[0] == 22 && out[5] == 2,
            "{:02x?}",
            &out[..out.len().min(8)]
        );
    }

    #[test]
    fn fake_secrets_match_the_scanner_shapes() {
        assert_eq!(FAKE_AWS_KEY.len(), 20);
        assert!(FAKE_AWS_KEY.starts_with("AKIA"));
        assert!(
            FAKE_AWS_KEY[4..]
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        );
        let gh = FAKE_GITHUB_TOKEN.strip_prefix("ghp_").unwrap();
        assert!(gh.len() >= 36 && gh.bytes().all(|b| b.is_ascii_alphanumeric()));
    }
}
