//! What real clients send (npm, yarn, pip, git, curl, node, WebSocket
//! clients, recorded by bottle-cli's `real_clients` test under
//! `BOTTLE_RECORD_CLIENT_CORPUS`) replayed through the secret scanner
//! exactly as the proxy scans a request: the target, every header, then the
//! body (streamed, or buffered and decoded when it has a
//! `Content-Encoding`). None of it is a secret, so none may be a finding.
//!
//! The corpus format (one request per file, an HTTP/1.1-style head then
//! the raw body) is described in `tests/fixtures/real-clients/README.md`.

use std::path::{Path, PathBuf};

use bottle_bundle::encoding::{self, Refusal};
use bottle_bundle::scan::Scanner;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::Full;

/// Where the corpus lives.
const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/real-clients");
/// The body is fed to the stream scanner in chunks of this size, as a
/// connection delivers it.
const CHUNK: usize = 16 << 10;

/// One recorded request.
struct Recorded {
    file: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn parse(path: &Path) -> Recorded {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let bytes = std::fs::read(path).unwrap();
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{file}: no end of the request head"));
    let (head, body) = (&bytes[..end], &bytes[end + 4..]);
    let mut lines = head
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = String::from_utf8_lossy(lines.next().unwrap()).into_owned();
    let mut parts = request_line.split(' ');
    let (_method, target) = (parts.next().unwrap(), parts.next().unwrap().to_string());
    let headers = lines
        .map(|line| {
            let colon = line
                .iter()
                .position(|b| *b == b':')
                .unwrap_or_else(|| panic!("{file}: a header line without a colon"));
            let value = &line[colon + 1..];
            let value = value.strip_prefix(b" ").unwrap_or(value);
            (
                String::from_utf8_lossy(&line[..colon]).into_owned(),
                value.to_vec(),
            )
        })
        .collect();
    Recorded {
        file,
        target,
        headers,
        body: body.to_vec(),
    }
}

fn corpus_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(CORPUS)
        .unwrap_or_else(|e| panic!("{CORPUS}: {e}"))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "http"))
        .collect();
    files.sort();
    files
}

/// Every finding the proxy's scan of `request` would make, named by where
/// it is. The proxy stops at the first; this goes on, so one run names
/// every hit.
fn findings(
    scanner: &Scanner,
    runtime: &tokio::runtime::Runtime,
    request: &Recorded,
) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(f) = scanner.scan_target(&request.target) {
        found.push(format!("target {}: {}", request.target, f.kind));
    }
    let mut map = HeaderMap::new();
    for (name, value) in &request.headers {
        if let Some(f) = scanner.scan_header(name, value) {
            found.push(format!(
                "header {name}: {}: {}",
                String::from_utf8_lossy(value),
                f.kind
            ));
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    let codings = match encoding::codings(&map) {
        Ok(codings) => codings,
        Err(refusal) => {
            found.push(format!("body: unscannable: {}", refusal.reason()));
            return found;
        }
    };
    if codings.is_empty() {
        let mut stream = scanner.stream();
        for chunk in request.body.chunks(CHUNK) {
            if let Err(f) = stream.feed(chunk) {
                found.push(format!("body: {}", f.kind));
                return found;
            }
        }
        stream.finish();
    } else {
        let body = Full::new(Bytes::from(request.body.clone()));
        match runtime.block_on(encoding::buffer_and_scan(body, scanner, codings)) {
            Ok(_) => {}
            Err(Refusal::Secret(f)) => found.push(format!("encoded body: {}", f.kind)),
            Err(refusal) => found.push(format!("encoded body: {}", refusal.reason())),
        }
    }
    found
}

#[test]
fn every_request_real_clients_sent_passes_the_scanner() {
    let files = corpus_files();
    assert!(
        files.len() >= 20,
        "the corpus in {CORPUS} has {} requests; record it again with bottle-cli's real_clients test",
        files.len()
    );
    let scanner = Scanner::new().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut hits = Vec::new();
    for path in &files {
        let request = parse(path);
        for finding in findings(&scanner, &runtime, &request) {
            hits.push(format!("{}: {finding}", request.file));
        }
    }
    assert!(
        hits.is_empty(),
        "{} findings in real clients' requests (each is a request the proxy would refuse):\n{}",
        hits.len(),
        hits.join("\n")
    );
}

#[test]
fn the_corpus_covers_every_client() {
    let names: Vec<String> = corpus_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let agents: Vec<String> = corpus_files()
        .iter()
        .map(|path| parse(path))
        .filter_map(|r| {
            r.headers
                .iter()
                .find(|(name, _)| name == "user-agent")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        })
        .collect();
    for host in [
        "npm.clients.test",
        "pypi.clients.test",
        "git.clients.test",
        "files.clients.test",
    ] {
        assert!(
            names.iter().any(|n| n.contains(host)),
            "no request to {host} in {names:#?}"
        );
    }
    for client in ["npm/", "yarn/", "pip/", "git/", "curl/"] {
        assert!(
            agents.iter().any(|a| a.starts_with(client)),
            "no request from {client} in {agents:#?}"
        );
    }
}
