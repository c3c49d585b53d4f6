//! Cases for the proxy's HTTP/CONNECT parser: valid requests to the
//! allowed and the denied host (absolute-form, CONNECT, pipelined, with
//! bodies), then mutated at the HTTP level and below.

use super::mutate::{Case, find, framed_body, mutate_bytes, replace_first};
use crate::rng::Rng;

/// The authorities a proxy case may name.
#[derive(Debug, Clone)]
pub struct ProxyHosts {
    /// `host:port` of the allowed host (an upstream on this machine).
    pub allowed: String,
    /// `host:port` spellings of the denied host (its canary listens there).
    pub denied: Vec<String>,
}

/// Case `rng` for the proxy.
pub fn case(rng: &mut Rng, hosts: &ProxyHosts) -> Case {
    let allowed = hosts.allowed.as_str();
    let denied = rng.pick(&hosts.denied).clone();
    let mut bytes = seed(rng, allowed, &denied);
    match rng.below(4) {
        0 => {}
        1 => mutate_http(rng, &mut bytes, allowed, &denied),
        2 => mutate_bytes(rng, &mut bytes),
        _ => {
            mutate_http(rng, &mut bytes, allowed, &denied);
            mutate_bytes(rng, &mut bytes);
        }
    }
    Case::deliver(rng, bytes)
}

fn seed(rng: &mut Rng, allowed: &str, denied: &str) -> Vec<u8> {
    let target = if rng.one_in(2) { allowed } else { denied };
    let other = if target == allowed { denied } else { allowed };
    let version = *rng.pick(&["HTTP/1.1", "HTTP/1.0", "HTTP/1.1", "HTTP/0.9", "HTTP/2.0"]);
    match rng.below(9) {
        0 => format!("GET http://{target}/p?q=1 {version}\r\nHost: {target}\r\n\r\n").into_bytes(),
        1 => format!("CONNECT {target} {version}\r\nHost: {target}\r\n\r\n").into_bytes(),
        2 => {
            // CONNECT, then whatever the tunnel gets: a request naming the
            // other host in the clear, or random bytes.
            let mut out = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes();
            if rng.one_in(2) {
                out.extend(format!("GET /x HTTP/1.1\r\nHost: {other}\r\n\r\n").into_bytes());
            } else {
                out.extend(rng.bytes_below(300));
            }
            out
        }
        3 => {
            let body = rng.bytes_below(200);
            let (framing, body) = framed_body(rng, &body);
            let mut out = format!("POST http://{target}/upload HTTP/1.1\r\nHost: {target}\r\n{framing}\r\n")
                .into_bytes();
            out.extend(body);
            out
        }
        4 => {
            // Pipelined: the second request names the other host.
            format!(
                "GET http://{target}/a HTTP/1.1\r\nHost: {target}\r\n\r\nGET http://{other}/b HTTP/1.1\r\nHost: {other}\r\n\r\n"
            )
            .into_bytes()
        }
        5 => {
            // The request line and Host disagree.
            format!("GET http://{target}/ HTTP/1.1\r\nHost: {other}\r\n\r\n").into_bytes()
        }
        6 => format!("GET / HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes(),
        7 => {
            // A body that is itself a request (smuggling shape).
            let inner = format!("GET http://{other}/ HTTP/1.1\r\nHost: {other}\r\n\r\n");
            let (framing, body) = framed_body(rng, inner.as_bytes());
            let mut out = format!("POST http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{framing}\r\n").into_bytes();
            out.extend(body);
            out
        }
        _ => format!(
            "{} http://{target}/ HTTP/1.1\r\nHost: {target}\r\nConnection: Upgrade\r\nUpgrade: {}\r\n\r\n",
            rng.pick(&["OPTIONS", "PUT", "DELETE", "PATCH", "TRACE", "PRI", "get", "G\tET"]),
            rng.pick(&["websocket", "h2c", "tls/1.0"])
        )
        .into_bytes(),
    }
}

/// Mutations that know HTTP: header tricks, host spellings, whitespace.
fn mutate_http(rng: &mut Rng, bytes: &mut Vec<u8>, allowed: &str, denied: &str) {
    let Some(head_end) = find(bytes, b"\r\n") else {
        return;
    };
    let header = |rng: &mut Rng| -> Vec<u8> {
        let lines: [String; 12] = [
            format!("Host: {denied}\r\n"),
            format!("Host: {allowed}\r\n"),
            "Content-Length: 5\r\n".into(),
            "Content-Length: 0\r\nContent-Length: 7\r\n".into(),
            "Transfer-Encoding: chunked\r\n".into(),
            "Transfer-Encoding : chunked\r\n".into(),
            "X-Folded: a\r\n b\r\n".into(),
            "X-Folded: a\r\n\tHost: x\r\n".into(),
            format!("X-Long: {}\r\n", "v".repeat(1 << rng.below(17))),
            ": no-name\r\n".into(),
            "no-colon\r\n".into(),
            "Proxy-Connection: keep-alive\r\nConnection: close, Host\r\n".into(),
        ];
        rng.pick(&lines).clone().into_bytes()
    };
    match rng.below(6) {
        0 | 1 => {
            let h = header(rng);
            bytes.splice(head_end + 2..head_end + 2, h);
        }
        2 => {
            let spellings = [
                denied.to_ascii_uppercase(),
                denied.replacen(':', ".:", 1),
                format!("{allowed}@{denied}"),
                format!("{denied}#{allowed}"),
                format!("{}.{denied}", allowed.split(':').next().unwrap_or(allowed)),
                denied.replacen('.', "%2e", 1),
                format!("[{denied}]"),
                format!("{denied} {allowed}"),
                denied.replacen(':', "\0:", 1),
            ];
            let to = rng.pick(&spellings).clone();
            replace_first(bytes, allowed.as_bytes(), to.as_bytes());
        }
        3 => {
            // Odd whitespace in the request line.
            let ws = *rng.pick(&[&b"  "[..], b"\t", b"\x0b", b"\x0c", b" \r\n "]);
            replace_first(bytes, b" ", ws);
        }
        4 => {
            // Leading empty lines, or a request line in lowercase.
            let prefix = *rng.pick(&[&b"\r\n"[..], b"\r\n\r\n", b"\n"]);
            bytes.splice(0..0, prefix.iter().copied());
        }
        _ => {
            let end = rng.below(bytes.len() + 1);
            bytes.truncate(end);
        }
    }
}
