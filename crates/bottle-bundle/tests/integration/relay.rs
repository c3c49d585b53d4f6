//! The TCP relays (`egress.host_services`, `egress.tcp`): each connection
//! reaches its relay's one destination, both ways, with half-closes passed
//! on; it is audited when it opens and when it closes, with its bytes; a
//! destination that cannot be reached closes the agent's connection at
//! once, audited with why.

use std::path::Path;
use std::time::{Duration, Instant};

use bottle_bundle::Decision;
use bottle_bundle::relay::{HOST_SERVICE, PINNED_TCP};
use bottle_core::bundle::{BundleRelay, RelayVia};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use crate::support::{Env, Options};

/// Serves one connection: reads to its end, answers `said: ` and what it
/// read, closes.
async fn answer_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut conn: S) {
    let mut got = Vec::new();
    conn.read_to_end(&mut got).await.unwrap();
    conn.write_all(b"said: ").await.unwrap();
    conn.write_all(&got).await.unwrap();
    conn.shutdown().await.unwrap();
}

async fn exchange(addr: std::net::SocketAddr, message: &[u8]) -> Vec<u8> {
    let mut agent = TcpStream::connect(addr).await.unwrap();
    agent.write_all(message).await.unwrap();
    agent.shutdown().await.unwrap();
    let mut back = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), agent.read_to_end(&mut back)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the relay did not answer in time: {read:?}"
    );
    back
}

/// The relay's audit lines, once both have been written.
async fn relay_lines(env: &Env, want: usize) -> Vec<bottle_bundle::AuditRecord> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<_> = env
            .audit()
            .into_iter()
            .filter(|r| r.daemon == "relay")
            .collect();
        if lines.len() >= want || Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn relay(host: &str, port: u16, via: RelayVia) -> BundleRelay {
    BundleRelay {
        listen: "127.0.0.1:0".into(),
        host: host.into(),
        port,
        via,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_destination_is_relayed_both_ways_and_audited_with_its_bytes() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = server.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (conn, _) = server.accept().await.unwrap();
        answer_one(conn).await;
    });
    let mut opts = Options::default();
    // The operator's pin: egress's own resolve map, as for HTTP.
    opts.resolve
        .insert("db.pinned.test".into(), "127.0.0.1".into());
    let env = Env::start_configured(opts, |config| {
        config.relays = vec![relay("db.pinned.test", port, RelayVia::Tcp)];
    })
    .await;
    let back = exchange(env.bundle.relay_addrs[0], b"select 1;").await;
    assert_eq!(back, b"said: select 1;");
    let lines = relay_lines(&env, 2).await;
    let shape: Vec<(Decision, &str, &str, u16, &str, u64, u64)> = lines
        .iter()
        .map(|r| {
            (
                r.decision,
                r.method.as_str(),
                r.host.as_str(),
                r.port,
                r.reason.as_str(),
                r.bytes_up,
                r.bytes_down,
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                Decision::Allow,
                "OPEN",
                "db.pinned.test",
                port,
                PINNED_TCP,
                0,
                0
            ),
            (
                Decision::Allow,
                "CLOSE",
                "db.pinned.test",
                port,
                PINNED_TCP,
                9,
                15
            ),
        ]
    );
    assert_eq!(lines[1].rule, "egress.tcp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_does_not_resolve_closes_the_connection_at_once() {
    let mut opts = Options {
        // Nothing answers DNS here: the name cannot resolve.
        nameservers: vec!["127.0.0.1:9".into()],
        ..Options::default()
    };
    opts.limits.connect_timeout_ms = 2_000;
    let env = Env::start_configured(opts, |config| {
        config.relays = vec![relay("nowhere.test", 22, RelayVia::Tcp)];
    })
    .await;
    let started = Instant::now();
    let back = exchange(env.bundle.relay_addrs[0], b"SSH-2.0-probe\r\n").await;
    assert!(back.is_empty(), "{back:?}");
    assert!(started.elapsed() < Duration::from_secs(9));
    let lines = relay_lines(&env, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].decision, Decision::Error);
    assert_eq!(lines[0].reason, "dial_refused");
}

async fn serve_unix(socket: &Path) {
    let listener = UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        answer_one(conn).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_service_goes_through_its_socket_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("5432.sock");
    serve_unix(&socket).await;
    let missing = dir.path().join("6543.sock");
    let env = Env::start_configured(Options::default(), |config| {
        config.relays = vec![
            relay(
                "127.0.0.1",
                5432,
                RelayVia::HostService {
                    socket: socket.display().to_string(),
                },
            ),
            relay(
                "localhost",
                6543,
                RelayVia::HostService {
                    socket: missing.display().to_string(),
                },
            ),
        ];
    })
    .await;
    let back = exchange(env.bundle.relay_addrs[0], b"\x00\x00\x00\x08startup").await;
    assert_eq!(back, b"said: \x00\x00\x00\x08startup");
    // The host serves no socket for the other: closed at once, and why.
    let back = exchange(env.bundle.relay_addrs[1], b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(back.is_empty(), "{back:?}");
    let lines = relay_lines(&env, 3).await;
    let shape: Vec<(Decision, &str, &str, u16, &str)> = lines
        .iter()
        .map(|r| {
            (
                r.decision,
                r.method.as_str(),
                r.host.as_str(),
                r.port,
                r.reason.as_str(),
            )
        })
        .collect();
    // Each connection's lines in order; the first one's CLOSE may be
    // written after the second one's refusal (it is logged once both
    // directions ended, after the client read its answer).
    let of_port = |port: u16| -> Vec<_> { shape.iter().filter(|l| l.3 == port).cloned().collect() };
    assert_eq!(
        of_port(5432),
        [
            (Decision::Allow, "OPEN", "127.0.0.1", 5432, HOST_SERVICE),
            (Decision::Allow, "CLOSE", "127.0.0.1", 5432, HOST_SERVICE),
        ],
        "{shape:?}"
    );
    assert_eq!(
        of_port(6543),
        [(
            Decision::Error,
            "OPEN",
            "localhost",
            6543,
            "host_service_unavailable"
        )],
        "{shape:?}"
    );
    assert!(
        lines
            .iter()
            .filter(|line| line.port == 5432)
            .all(|line| line.rule == "egress.host_services"),
        "{lines:?}"
    );
}
