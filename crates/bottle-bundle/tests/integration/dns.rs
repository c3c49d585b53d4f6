//! DNS-rebinding defence: egress checks the resolved address, not the name.
//! A tiny DNS server on 127.0.0.1 answers every A query with a fixed
//! address; the bundle is pointed at it with `nameservers`.

use std::net::Ipv4Addr;
use std::time::Duration;

use bottle_bundle::Decision;
use tokio::net::UdpSocket;

use crate::support::{Env, Options};

/// Answers every query with one A record (`answer`), TTL 1.
async fn dns_server(answer: Ipv4Addr) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
            if n < 12 {
                continue;
            }
            let q = &buf[..n];
            // Question: after the 12-byte header, labels up to a zero byte, then QTYPE+QCLASS.
            let mut i = 12;
            while i < n && q[i] != 0 {
                i += 1 + q[i] as usize;
            }
            let qend = (i + 5).min(n);
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            let mut resp = Vec::new();
            resp.extend_from_slice(&q[..2]); // id
            resp.extend_from_slice(&[0x81, 0x80]); // response, RD, RA, NOERROR
            resp.extend_from_slice(&[0, 1]); // QDCOUNT
            resp.extend_from_slice(&[0, u8::from(qtype == 1)]); // ANCOUNT
            resp.extend_from_slice(&[0, 0, 0, 0]); // NS, AR
            resp.extend_from_slice(&q[12..qend]);
            if qtype == 1 {
                resp.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
                resp.extend_from_slice(&answer.octets());
            }
            let _ = sock.send_to(&resp, peer).await;
        }
    });
    (addr, task)
}

async fn via_dns(answer: Ipv4Addr) -> (Env, tokio::task::JoinHandle<()>) {
    let (ns, task) = dns_server(answer).await;
    let opts = Options {
        allow: vec!["rebind.test".into(), "*.rebind.test".into()],
        nameservers: vec![ns.to_string()],
        resolve: Default::default(),
        ..Options::default()
    };
    (Env::start(opts).await, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_name_resolving_to_loopback_is_refused() {
    let (env, dns) = via_dns(Ipv4Addr::LOCALHOST).await;
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://rebind.test:{port}/ HTTP/1.1\r\nHost: rebind.test:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("must not dial"), "{}", resp.text());
    assert!(
        env.upstream.seen().is_empty(),
        "nothing reached the loopback server"
    );
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(5), || {
            let audit = env.audit();
            audit
                .iter()
                .any(|r| r.daemon == "egress" && r.reason == "dial_refused")
                && audit.iter().any(|r| {
                    r.daemon == "proxy"
                        && r.decision == Decision::Deny
                        && r.reason == "dial_refused"
                })
        })
        .await,
        "{:?}",
        env.audit()
    );
    dns.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_name_resolving_to_cloud_metadata_is_refused() {
    let (env, dns) = via_dns(Ipv4Addr::new(169, 254, 169, 254)).await;
    let authority = "api.rebind.test:443";
    let s = env.connect(authority).await.unwrap();
    let mut tls = crate::support::tls_client(&env.ca_pem, s, "api.rebind.test")
        .await
        .unwrap();
    use tokio::io::AsyncWriteExt;
    tls.write_all(
        b"GET /latest/meta-data/ HTTP/1.1\r\nHost: api.rebind.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let resp = crate::support::read_response(&mut tls).await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    dns.abort();
}
