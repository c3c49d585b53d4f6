//! Cases for supervise's JSON-RPC endpoint: valid MCP messages, then
//! deep nesting, huge numbers, wrong types, batches and invalid UTF-8,
//! inside valid and mutated HTTP.

use super::mutate::{Case, framed_body, mutate_bytes};
use crate::rng::Rng;

/// Case `rng` for supervise; `denied` is a host the proxy must keep
/// refusing whatever supervise is asked.
pub fn case(rng: &mut Rng, denied: &str) -> Case {
    let mut body = message(rng, denied);
    if rng.one_in(3) {
        mutate_bytes(rng, &mut body);
    }
    let (framing, body) = framed_body(rng, &body);
    let method = *rng.pick(&["POST", "POST", "POST", "GET", "DELETE", "PUT"]);
    let path = *rng.pick(&["/mcp", "/mcp", "/mcp/", "/MCP", "/mcp?x=1", "//mcp"]);
    let mut bytes = format!(
        "{method} {path} HTTP/1.1\r\nHost: bundle\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{framing}\r\n"
    )
    .into_bytes();
    bytes.extend(body);
    if rng.one_in(4) {
        mutate_bytes(rng, &mut bytes);
    }
    Case::deliver(rng, bytes)
}

fn message(rng: &mut Rng, denied: &str) -> Vec<u8> {
    let id = rng.pick(&[
        "1",
        "\"a\"",
        "null",
        "{}",
        "[]",
        "1.5",
        "-0",
        "1e400",
        "123456789012345678901234567890",
        "true",
    ]);
    let valid = [
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"2024-11-05"}}}}"#
        ),
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"request_egress","arguments":{{"host":"{denied}","reason":"fuzz"}}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"request_status","arguments":{{"id":"../../etc/passwd"}}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"notify","arguments":{{"message":"\u001b]0;x\u0007\u202e"}}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"request_push","arguments":{{"repo":"repo","ref":"refs/heads/main","reason":"x"}}}}}}"#
        ),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
    ];
    let one = rng.pick(&valid).clone();
    match rng.below(8) {
        0 => {
            let depth = 1 << rng.below(16);
            let open = rng.pick(&["[", "{\"a\":"]).repeat(depth);
            let close = if open.starts_with('[') { "]" } else { "}" }.repeat(depth);
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{open}1{close}}}"#)
                .into_bytes()
        }
        1 => {
            let numbers = [
                "1e999999".to_string(),
                "-1e-999999".into(),
                "18446744073709551616".into(),
                "9".repeat(4096),
                "0.".into(),
                "NaN".into(),
            ];
            let n = rng.pick(&numbers).clone();
            format!(r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/list","params":{{"n":{n}}}}}"#)
                .into_bytes()
        }
        2 => {
            let wrong = rng.pick(&["5", "null", "[1]", "\"\"", "{}", "true"]);
            let field = rng.pick(&["jsonrpc", "method", "params", "id"]);
            let mut v = one.clone();
            let key = format!("\"{field}\":");
            if let Some(pos) = v.find(&key) {
                v.insert_str(pos, &format!("\"{field}\":{wrong},"));
            }
            v.into_bytes()
        }
        3 => {
            let n = rng.pick(&[0usize, 1, 2, 50, 2000]);
            let items = vec![one; *n].join(",");
            format!("[{items}]").into_bytes()
        }
        4 => {
            let mut v = one.into_bytes();
            let at = rng.below(v.len() + 1);
            v.splice(
                at..at,
                rng.pick(&[
                    &b"\xff"[..],
                    b"\xc0\xaf",
                    b"\xed\xa0\x80",
                    b"\\ud800",
                    b"\0",
                ])
                .iter()
                .copied(),
            );
            v
        }
        _ => one.into_bytes(),
    }
}
