//! The audit log under a hostile agent: a flood of denied requests costs a
//! few merged lines, a flood that rotates the log leaves its
//! security-relevant lines and stays within its bound, and a log that
//! cannot be written stops all traffic.

use std::path::Path;
use std::time::Duration;

use bottle_bundle::audit::{AUDIT_UNAVAILABLE, PATH_BOUND};
use bottle_core::audit_files::{
    AUDIT_DEGRADED_MARKER, AUDIT_GENERATIONS, AUDIT_OK_MARKER, AuditHealth, audit_health,
    generation,
};
use bottle_core::bundle::BundleLimits;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::support::{ALLOWED, Env, OTHER_ALLOWED, Options};

const CAP: u64 = 64 * 1024;

/// Sends `GET http://<host><path>` for each target over one keep-alive
/// connection; returns the statuses.
async fn send_all(proxy: std::net::SocketAddr, targets: Vec<(String, String)>) -> Vec<u16> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let mut statuses = Vec::with_capacity(targets.len());
    for (host, path) in targets {
        let req = Request::get(format!("http://{host}{path}"))
            .header("host", &host)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        statuses.push(resp.status().as_u16());
        resp.into_body().collect().await.unwrap();
    }
    drop(sender);
    driver.await.unwrap().unwrap();
    statuses
}

/// Sends `per_connection` requests on each of four connections at once.
async fn flood(
    proxy: std::net::SocketAddr,
    per_connection: usize,
    target: impl Fn(usize, usize) -> (String, String),
) -> Vec<u16> {
    let tasks: Vec<_> = (0..4)
        .map(|c| {
            let targets = (0..per_connection).map(|i| target(c, i)).collect();
            tokio::spawn(send_all(proxy, targets))
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    statuses
}

fn total_log_bytes(log: &Path) -> u64 {
    (0..=AUDIT_GENERATIONS + 1)
        .filter_map(|n| std::fs::metadata(generation(log, n)).ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denials_costs_a_few_lines_and_repeats_are_counted() {
    let env = Env::start(Options {
        limits: BundleLimits {
            audit_log_max_bytes: CAP,
            ..Options::default().limits
        },
        ..Options::default()
    })
    .await;
    let log = Path::new(&env.config.audit_log).to_path_buf();
    let long = "a".repeat(4 * PATH_BOUND);
    let started = std::time::Instant::now();
    let flooded = tokio::time::timeout(Duration::from_secs(120), async {
        // Distinct hosts, one reason: merged, with a sample of the hosts.
        let distinct = flood(env.proxy(), 500, |c, i| {
            (format!("h{c}-{i}.denied.test"), format!("/{i}/{long}"))
        })
        .await;
        // One decision repeated: counted, not written.
        let repeated = flood(env.proxy(), 750, |_, i| {
            ("same.denied.test".to_string(), format!("/{i}"))
        })
        .await;
        (distinct, repeated)
    })
    .await
    .expect("the flood finished in time");
    assert!(flooded.0.iter().chain(&flooded.1).all(|&s| s == 403));
    let requests = u64::try_from(flooded.0.len() + flooded.1.len()).unwrap();
    // The last window's count.
    bottle_test_support::wait_until("every denial counted", Duration::from_secs(10), || {
        env.audit().iter().map(|r| r.count).sum::<u64>() == requests
    });
    let seconds = started.elapsed().as_secs() + 1;

    // 5000 records of more than a KiB each would hold over 5 MiB: merged,
    // a few lines a window written as they came, then its count.
    let records = env.audit();
    let per_window = u64::from(bottle_bundle::audit::WRITTEN_PER_WINDOW) + 1;
    assert!(
        (records.len() as u64) <= per_window * seconds + 2,
        "{} lines for {requests} denials in {seconds} s",
        records.len()
    );
    let total = total_log_bytes(&log);
    assert!(total < CAP, "{total} bytes on disk");
    assert!(!generation(&log, 1).exists(), "a few lines rotated");
    for r in &records {
        assert_eq!(r.reason, "host_not_allowed");
        assert!(r.hosts.len() <= bottle_bundle::audit::HOST_SAMPLE);
        if r.host.starts_with('h') {
            assert!(r.truncated, "{}", r.path);
            assert!(r.path.len() < PATH_BOUND + 32, "{}", r.path.len());
            assert!(r.path.contains("…[+"), "{}", r.path);
        }
    }
    assert!(
        records
            .iter()
            .any(|r| r.count > 1 && r.hosts.len() == bottle_bundle::audit::HOST_SAMPLE),
        "no merged line names a sample of hosts"
    );
}

#[tokio::test]
async fn a_log_that_cannot_be_written_stops_all_traffic_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(logs.join(AUDIT_OK_MARKER), "").unwrap();
    // Every write to /dev/full fails with ENOSPC, as on a full disk.
    let log = logs.join("audit.jsonl");
    std::os::unix::fs::symlink("/dev/full", &log).unwrap();
    let env = Env::start_with_audit_log(Options::default(), &log).await;

    // Allowed traffic flows until the first write fails...
    let first = env
        .raw(
            format!("GET http://{ALLOWED}:{}/one HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n", env.upstream.http.port())
                .as_bytes(),
        )
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    bottle_test_support::wait_until(
        "the audit log to be marked degraded",
        Duration::from_secs(10),
        || audit_health(&logs) == AuditHealth::Degraded,
    );
    assert!(logs.join(AUDIT_DEGRADED_MARKER).exists());
    assert!(!logs.join(AUDIT_OK_MARKER).exists());

    // ...and then nothing does, plain or tunnelled.
    let seen_before = env.upstream.seen.lock().unwrap().len();
    let refused = env
        .raw(
            format!("GET http://{ALLOWED}:{}/two HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n", env.upstream.http.port())
                .as_bytes(),
        )
        .await;
    assert_eq!(refused.status, 503);
    assert!(
        refused.text().contains(AUDIT_UNAVAILABLE),
        "{}",
        refused.text()
    );
    let tunnel = env
        .connect(&format!("{ALLOWED}:{}", env.upstream.https.port()))
        .await;
    let Err(refusal) = tunnel else {
        panic!("CONNECT was let through with no audit log");
    };
    assert_eq!(refusal.status, 503);
    assert!(refusal.text().contains(AUDIT_UNAVAILABLE));
    assert_eq!(env.upstream.seen.lock().unwrap().len(), seen_before);
}

/// The flood, bounded and local: at most [`FLOOD_REQUESTS`] within
/// [`FLOOD_TIME`] over four keep-alive connections, two in three to a
/// distinct denied host, the third an allowed request with a method of its
/// own (a line no merging can save, so the stream rotates whole several
/// times), every path 1 KiB.
const FLOOD_REQUESTS: usize = 90_000;
const FLOOD_TIME: Duration = Duration::from_secs(15);
/// `limits.audit_log`'s least value, as the bottles had it.
const MANIFEST_MIN_CAP: u64 = 1 << 20;

/// What one flooding connection got back.
#[derive(Debug, Default)]
struct Flooded {
    sent: usize,
    denied: usize,
    allowed: usize,
}

async fn flood_connection(
    proxy: std::net::SocketAddr,
    upstream_port: u16,
    c: usize,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    deadline: tokio::time::Instant,
) -> Flooded {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let pad = "p".repeat(1024);
    let mut got = Flooded::default();
    while tokio::time::Instant::now() < deadline {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if i >= FLOOD_REQUESTS {
            break;
        }
        let req = if i % 3 == 2 {
            // Not the credential's host, which takes only TLS.
            let host = format!("{OTHER_ALLOWED}:{upstream_port}");
            Request::builder()
                .method(hyper::Method::from_bytes(format!("FLOOD{i}").as_bytes()).unwrap())
                .uri(format!("http://{host}/{i}/{pad}"))
                .header("host", host)
        } else {
            let host = format!("h{c}-{i}.denied.test");
            Request::get(format!("http://{host}/{i}/{pad}")).header("host", host)
        }
        .body(Empty::<Bytes>::new())
        .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        match resp.status().as_u16() {
            403 => got.denied += 1,
            200 => got.allowed += 1,
            other => panic!("flood request {i}: status {other}"),
        }
        got.sent += 1;
        resp.into_body().collect().await.unwrap();
    }
    drop(sender);
    driver.await.unwrap().unwrap();
    got
}

/// Every line `bottle logs` would print, as JSON values.
fn logged(log: &Path) -> Vec<serde_json::Value> {
    bottle_core::audit_files::AuditLines::new(log)
        .poll()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

fn log_dir_bytes(log: &Path) -> (u64, Vec<String>) {
    let dir = log.parent().unwrap();
    let mut total = 0;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("audit.jsonl") {
            let len = entry.metadata().unwrap().len();
            total += len;
            files.push(format!("{name} {len}"));
        }
    }
    files.sort();
    (total, files)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_flood_the_finding_the_credential_and_the_evidence_are_still_in_the_log() {
    const SECRET: &str = "bundle-held-Secret-flood-7c1e";
    let env = Env::start(Options {
        credentials: vec![(
            ALLOWED.into(),
            "Authorization".into(),
            "Bearer {}".into(),
            SECRET.into(),
        )],
        limits: BundleLimits {
            audit_log_max_bytes: MANIFEST_MIN_CAP,
            ..Options::default().limits
        },
        ..Options::default()
    })
    .await;
    let log = Path::new(&env.config.audit_log).to_path_buf();

    // 1. A secret finding.
    let body = "aws_access_key_id=AKIAZ7Q3HN2XK5WJ4T6M";
    let blocked = env
        .raw(
            format!(
                "POST http://{ALLOWED}:{port}/upload HTTP/1.1\r\nHost: {ALLOWED}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len(),
                port = env.upstream.http.port()
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(blocked.status, 403, "{}", blocked.text());
    // 2. A credential injected.
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let injected = env
        .https(
            &authority,
            format!("GET /whoami HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
    assert_eq!(injected.status, 200, "{}", injected.text());
    // 3. A tool call's line, as the host appends it.
    let evidence = "sha256:0f0e0d0c0b0a09080706050403020100";
    bottle_core::sandbox::audit::append(
        &log,
        &bottle_core::sandbox::audit::SandboxRecord::tool(
            "test",
            "make test",
            0,
            false,
            0,
            12,
            Duration::from_millis(30),
            evidence,
        ),
    )
    .unwrap();
    bottle_test_support::wait_until(
        "the three lines before the flood",
        Duration::from_secs(10),
        || {
            let lines = logged(&log);
            lines.iter().any(|l| l["decision"] == "blocked_secret")
                && lines.iter().any(|l| l["evidence"] == evidence)
        },
    );

    // 4. The flood.
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + FLOOD_TIME;
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|c| {
            tokio::spawn(flood_connection(
                env.proxy(),
                env.upstream.http.port(),
                c,
                next.clone(),
                deadline,
            ))
        })
        .collect();
    let mut flooded = Flooded::default();
    for t in tasks {
        let f = t.await.unwrap();
        flooded.sent += f.sent;
        flooded.denied += f.denied;
        flooded.allowed += f.allowed;
    }
    let took = started.elapsed();
    // The last windows' counts.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let lines = logged(&log);
    let (bytes, files) = log_dir_bytes(&log);
    let finding = lines
        .iter()
        .any(|l| l["decision"] == "blocked_secret" && l["reason"] == "secret:aws_access_key_id");
    let credential = lines
        .iter()
        .any(|l| l["decision"] == "inject" && l["host"] == ALLOWED);
    let evidence_kept = lines.iter().any(|l| l["evidence"] == evidence);
    let denial_lines = lines.iter().filter(|l| l["decision"] == "deny").count();
    eprintln!(
        "flood: {} requests ({} denied to distinct hosts, {} allowed) in {took:?}; \
         the log: {} lines, {bytes} bytes in [{}], {denial_lines} denial lines; \
         finding kept: {finding}, credential line: {credential}, evidence kept: {evidence_kept}",
        flooded.sent,
        flooded.denied,
        flooded.allowed,
        lines.len(),
        files.join(", "),
    );
    assert!(flooded.sent >= 5_000, "too small a flood: {flooded:?}");
    assert!(finding, "the secret finding was rotated away");
    assert!(credential, "no credential line survived");
    assert!(evidence_kept, "the tool call's evidence was rotated away");
    // The control: the stream was rotated whole, so the three lines'
    // generation was dropped and they live on only because they were kept.
    let summary = lines
        .iter()
        .find(|l| l["decision"] == "dropped")
        .expect("rotation dropped nothing: the flood proves nothing");
    assert!(summary["count"].as_u64().unwrap() > 1000, "{summary}");
    let bound = bottle_core::audit_files::audit_log_bound(MANIFEST_MIN_CAP);
    assert!(bytes <= bound, "{bytes} bytes on disk, bound {bound}");
    // Denials to distinct hosts cost a few lines a window.
    let windows = took.as_secs() + 2;
    let per_window = u64::from(bottle_bundle::audit::WRITTEN_PER_WINDOW) + 1;
    assert!(
        (denial_lines as u64) <= per_window * windows,
        "{denial_lines} denial lines over {took:?}"
    );
    let raw: Vec<u8> = std::fs::read_dir(log.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("audit.jsonl"))
        .flat_map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    assert!(
        !raw.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
        "the credential's value reached the log"
    );
}
