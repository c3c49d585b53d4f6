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

use bottle_test_support::secret_corpus::Request;

use crate::like_proxy::LikeProxy;

/// Where the corpus lives.
const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/real-clients");
/// The body is fed whole, and in chunks of these sizes, as a connection may
/// deliver it.
const CHUNKS: &[usize] = &[usize::MAX, 16 << 10, 61];

/// One recorded request.
struct Recorded {
    file: String,
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Recorded {
    /// As the scan the scanner bench and quality test share takes it.
    fn request(&self) -> Request {
        let method = match self.method.as_str() {
            "GET" => "GET",
            "POST" => "POST",
            "PUT" => "PUT",
            "PATCH" => "PATCH",
            "DELETE" => "DELETE",
            "HEAD" => "HEAD",
            other => panic!("{}: a method the corpus does not hold: {other}", self.file),
        };
        Request {
            method,
            path_and_query: self.target.clone(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_ascii_lowercase(),
                        String::from_utf8_lossy(v).into_owned(),
                    )
                })
                .collect(),
            body: self.body.clone(),
            content_len: self.body.len(),
        }
    }
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
    let (method, target) = (
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
    );
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
        method,
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

#[test]
fn every_request_real_clients_sent_passes_the_scanner() {
    let files = corpus_files();
    assert!(
        files.len() >= 20,
        "the corpus in {CORPUS} has {} requests; record it again with bottle-cli's real_clients test",
        files.len()
    );
    let proxy = LikeProxy::new().unwrap();
    let mut hits = Vec::new();
    for path in &files {
        let recorded = parse(path);
        let verdict = proxy
            .scan(&recorded.request(), CHUNKS)
            .unwrap_or_else(|e| panic!("{}: {e}", recorded.file));
        for flag in verdict.flags {
            hits.push(format!(
                "{}: {}: {}",
                recorded.file, flag.location, flag.kind
            ));
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
