//! Cases for git-gate: smart-HTTP requests whose bodies are pkt-line
//! streams (upload-pack v0 and v2, receive-pack with commands, push
//! certificates and packs), with mutated lengths, hex, flush and delim
//! packets, oversize lines and HTTP framing.

use super::mutate::{Case, framed_body, mutate_bytes};
use crate::rng::Rng;

const ZERO: &str = "0000000000000000000000000000000000000000";
const ONE: &str = "1111111111111111111111111111111111111111";

/// Case `rng` for git-gate, serving a repository named `repo`.
pub fn case(rng: &mut Rng, repo: &str) -> Case {
    let mut bytes = match rng.below(6) {
        0 => {
            let service = rng.pick(&["git-upload-pack", "git-receive-pack", "git-nope", ""]);
            let path = rng
                .pick(&[
                    format!("/{repo}.git/info/refs?service={service}"),
                    format!("/{repo}/info/refs?service={service}"),
                    format!("/../{repo}.git/info/refs?service={service}"),
                    format!("/{repo}.git/info/refs?service={service}&service=git-receive-pack"),
                ])
                .clone();
            format!("GET {path} HTTP/1.1\r\nHost: gate\r\nGit-Protocol: version=2\r\n\r\n")
                .into_bytes()
        }
        1 | 2 => {
            let body = upload_body(rng);
            post(rng, repo, "git-upload-pack", body)
        }
        _ => {
            let body = receive_body(rng);
            post(rng, repo, "git-receive-pack", body)
        }
    };
    if rng.one_in(3) {
        mutate_bytes(rng, &mut bytes);
    }
    Case::deliver(rng, bytes)
}

fn post(rng: &mut Rng, repo: &str, service: &str, mut body: Vec<u8>) -> Vec<u8> {
    if rng.one_in(2) {
        mutate_pkt(rng, &mut body);
    }
    let (framing, body) = framed_body(rng, &body);
    let encoding = if rng.one_in(8) {
        "Content-Encoding: gzip\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "POST /{repo}.git/{service} HTTP/1.1\r\nHost: gate\r\nContent-Type: application/x-{service}-request\r\nGit-Protocol: version=2\r\n{encoding}{framing}\r\n"
    )
    .into_bytes();
    out.extend(body);
    out
}

/// One pkt-line carrying `data`.
fn pkt(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:04x}", data.len() + 4).into_bytes();
    out.extend_from_slice(data);
    out
}

fn upload_body(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    if rng.one_in(2) {
        // Protocol v2.
        out.extend(pkt(format!(
            "command={}\n",
            rng.pick(&["ls-refs", "fetch", "object-info", "bogus"])
        )
        .as_bytes()));
        out.extend(pkt(b"agent=git/2.43\n"));
        out.extend_from_slice(b"0001");
        out.extend(pkt(b"peel\n"));
        out.extend(pkt(b"ref-prefix refs/heads/\n"));
        out.extend(pkt(format!("want {ONE}\n").as_bytes()));
        out.extend_from_slice(b"0000");
    } else {
        out.extend(pkt(format!(
            "want {ONE} multi_ack side-band-64k ofs-delta\n"
        )
        .as_bytes()));
        out.extend(pkt(b"deepen 1\n"));
        out.extend_from_slice(b"0000");
        out.extend(pkt(format!("have {ZERO}\n").as_bytes()));
        out.extend(pkt(b"done\n"));
    }
    out
}

fn receive_body(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    let reference = *rng.pick(&[
        "refs/heads/main",
        "refs/heads/agent/x",
        "refs/tags/v1",
        "refs/heads/agent/../main",
        "refs/heads/agent/x\0refs/heads/main",
    ]);
    let (old, new) = *rng.pick(&[(ZERO, ONE), (ONE, ZERO), (ONE, ONE)]);
    if rng.one_in(4) {
        // A push certificate in front of the commands.
        out.extend(pkt(b"push-cert\0report-status\n"));
        out.extend(pkt(b"certificate version 0.1\n"));
        out.extend(pkt(b"pusher agent 0 +0000\n"));
        out.extend(pkt(b"\n"));
        out.extend(pkt(format!("{old} {new} {reference}\n").as_bytes()));
        out.extend(pkt(b"push-cert-end\n"));
    } else if rng.one_in(4) {
        out.extend(pkt(format!("shallow {ONE}\n").as_bytes()));
    }
    let caps = if rng.one_in(2) {
        "\0report-status side-band-64k atomic"
    } else {
        ""
    };
    out.extend(pkt(format!("{old} {new} {reference}{caps}\n").as_bytes()));
    if rng.one_in(2) {
        out.extend(pkt(format!("{old} {new} refs/heads/main\n").as_bytes()));
    }
    out.extend_from_slice(b"0000");
    out.extend_from_slice(b"PACK\0\0\0\x02\0\0\0\x01");
    out.extend(rng.bytes_below(64));
    out
}

/// Mutations that know pkt-line framing.
fn mutate_pkt(rng: &mut Rng, body: &mut Vec<u8>) {
    let at = rng.below(body.len() + 1);
    match rng.below(6) {
        0 => {
            // Any length 0000-ffff, with or without the bytes it promises.
            let len = rng.below(0x1_0000);
            let mut line = format!("{len:04x}").into_bytes();
            line.extend(rng.bytes_below(len.min(2048) + 1));
            body.splice(at..at, line);
        }
        1 => {
            let bad = *rng.pick(&[
                &b"zzzz"[..],
                b"00g0",
                b"-001",
                b"0x10",
                b"FFFF",
                b" 0a\n",
                b"\xff\xff\xff\xff",
            ]);
            body.splice(at..at, bad.iter().copied());
        }
        2 => {
            let special = *rng.pick(&[
                &b"0000"[..],
                b"0001",
                b"0002",
                b"0003",
                b"0004",
                b"00000000",
            ]);
            body.splice(at..at, special.iter().copied());
        }
        3 => {
            // An oversize line: longer than a pkt-line may be.
            let len = 65_516 + rng.below(100);
            let mut line = format!("{:04x}", len.min(0xffff)).into_bytes();
            line.extend(vec![b'a'; len]);
            body.splice(at..at, line);
        }
        4 => body.truncate(at),
        _ => {
            let copy = body.clone();
            body.extend(copy);
        }
    }
}
