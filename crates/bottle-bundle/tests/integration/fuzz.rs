//! Arbitrary bytes at the proxy never take it down; policy decisions do not
//! depend on case or a trailing dot.

use bottle_bundle::allowlist::{Policy, Verdict, normalize_host, parse_authority};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{Env, Options};

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn host_parsing_never_panics(s in ".{0,80}") {
        let _ = normalize_host(&s);
        let _ = parse_authority(&s, None);
        let _ = parse_authority(&s, Some(443));
    }

    #[test]
    fn decisions_ignore_case_and_trailing_dot(
        labels in prop::collection::vec("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", 1..4),
        upper in prop::collection::vec(any::<bool>(), 0..40),
        dot in any::<bool>(),
        port in prop::sample::select(vec![80u16, 443, 22, 8080]),
    ) {
        let policy = Policy::new(
            &["api.example.com".into(), "*.cdn.example".into(), "a1.b2".into()],
            &[80, 443],
        ).unwrap();
        let name = labels.join(".");
        let mut variant: String = name
            .chars()
            .zip(upper.iter().chain(std::iter::repeat(&false)))
            .map(|(c, u)| if *u { c.to_ascii_uppercase() } else { c })
            .collect();
        if dot {
            variant.push('.');
        }
        let a = normalize_host(&name).ok().map(|h| policy.check(&h, port));
        let b = normalize_host(&variant).ok().map(|h| policy.check(&h, port));
        prop_assert_eq!(a, b);
        for suffix in [".cdn.example", ".api.example.com"] {
            let n = format!("{name}{suffix}");
            let allowed = normalize_host(&n).map(|h| matches!(policy.check(&h, port), Verdict::Allow { .. }));
            let expect = suffix == ".cdn.example" && (port == 80 || port == 443);
            prop_assert_eq!(allowed, Ok(expect), "{}", n);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_never_take_the_proxy_down() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let env = Env::start(Options::default()).await;
    let mut runner = TestRunner::deterministic();
    let strategy = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        "(GET|CONNECT|POST|PUT) [ -~]{0,200} HTTP/1\\.[01]\r\n([ -~]{0,60}\r\n){0,8}\r\n"
            .prop_map(String::into_bytes),
    ];
    for _ in 0..64 {
        let input = strategy.new_tree(&mut runner).unwrap().current();
        let mut s = tokio::net::TcpStream::connect(env.proxy()).await.unwrap();
        let _ = s.write_all(&input).await;
        let _ = s.shutdown().await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut sink))
            .await;
    }
    let resp = env
        .raw(b"GET /__bottle/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 200);
}
