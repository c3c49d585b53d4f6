//! The audit log under a hostile agent: a flood of denied requests stays
//! within the log's cap, repeats are counted rather than written, and a log
//! that cannot be written stops all traffic.

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

use crate::support::{ALLOWED, Env, Options};

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
async fn a_flood_of_denials_stays_within_the_cap_and_repeats_are_counted() {
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
    let flooded = tokio::time::timeout(Duration::from_secs(120), async {
        // Distinct hosts are distinct decisions: each one is written.
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
    let repeated = u64::try_from(flooded.1.len()).unwrap();

    // A different decision closes the repeats' window.
    let closer = flood(env.proxy(), 1, |c, _| {
        (format!("closer{c}.denied.test"), "/".into())
    })
    .await;
    assert_eq!(closer, [403; 4]);

    // 2000 records of more than a KiB each: without the cap the log would
    // hold over 2 MiB.
    let bound = CAP * u64::from(AUDIT_GENERATIONS + 1);
    let total = total_log_bytes(&log);
    assert!(total <= bound, "{total} bytes on disk, bound {bound}");
    assert!(generation(&log, AUDIT_GENERATIONS).exists(), "no rotation");
    assert!(!generation(&log, AUDIT_GENERATIONS + 1).exists());

    let records = env.audit();
    let long_ones: Vec<_> = records
        .iter()
        .filter(|r| r.host.ends_with(".denied.test") && r.host.starts_with('h'))
        .collect();
    assert!(!long_ones.is_empty());
    for r in &long_ones {
        assert!(r.truncated, "{}", r.path);
        assert!(r.path.len() < PATH_BOUND + 32, "{}", r.path.len());
        assert!(r.path.contains("…[+"), "{}", r.path);
    }
    let same: Vec<_> = records
        .iter()
        .filter(|r| r.host == "same.denied.test")
        .collect();
    assert_eq!(same.iter().map(|r| r.count).sum::<u64>(), repeated);
    assert!(
        same.len() < 100,
        "{} lines for one repeated decision",
        same.len()
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
