//! Allow and deny decisions, over plain HTTP and CONNECT.

use bottle_bundle::Decision;

use tokio::io::AsyncWriteExt;

use crate::support::{AGENT, ALLOWED, Env, Options, read_response};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_host_over_plain_http_reaches_upstream() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://API.Allowed.Test.:{port}/hello?x=1 HTTP/1.1\r\nHost: api.allowed.test:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(
        resp.text().starts_with("GET /hello?x=1\n"),
        "{}",
        resp.text()
    );
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/hello?x=1")
    );
    assert_eq!(seen[0].header("host"), vec![format!("{ALLOWED}:{port}")]);
    let audit = env.audit();
    let line = audit
        .iter()
        .find(|r| r.daemon == "proxy" && r.method == "GET")
        .unwrap();
    assert_eq!(line.decision, Decision::Allow);
    assert_eq!(line.host, ALLOWED);
    assert_eq!(line.path, "/hello?x=…", "query values never reach the log");
    assert_eq!(line.status, 200);
    assert!(line.bytes_down > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_host_gets_403_naming_the_rule_to_add() {
    let env = Env::start(Options::default()).await;
    let mut tls = env.tls("Evil.Example.:443", "evil.example").await.unwrap();
    tls.write_all(b"GET /in HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let resp = read_response(&mut tls).await;
    assert_eq!(resp.status, 403);
    assert!(
        resp.text().contains(&format!(
            r#"adds "evil.example" to [agents.{AGENT}.egress] allow"#
        )),
        "{}",
        resp.text()
    );
    let resp = env
        .raw(
            b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
        )
        .await;
    assert_eq!(resp.status, 403);
    assert!(resp.text().contains("request_egress"), "{}", resp.text());
    assert!(
        resp.text().contains(&format!(
            r#"adds "evil.example" to [agents.{AGENT}.egress] allow"#
        )),
        "{}",
        resp.text()
    );
    // A suffix of an allowed name is not allowed.
    let (resp, _) = env
        .plain_in_tunnel(
            "allowed.test:443",
            b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        )
        .await;
    assert_eq!(resp.status, 403);
    let audit = env.audit();
    let denies: Vec<_> = audit
        .iter()
        .filter(|r| r.decision == Decision::Deny)
        .map(|r| (r.method.as_str(), r.host.as_str(), r.path.as_str()))
        .collect();
    assert_eq!(
        denies,
        [
            ("CONNECT", "evil.example", ""),
            ("GET", "evil.example", "/in"),
            ("GET", "evil.example", "/"),
            ("CONNECT", "allowed.test", ""),
            ("GET", "allowed.test", "/"),
        ],
        "{audit:?}"
    );
    assert_eq!(audit[0].reason, "host_not_allowed");
    assert_eq!(audit[0].rule, "evil.example");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_literals_are_refused_in_every_spelling() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.https.port();
    // Canonical literals: a tunnel that carries the denial.
    for authority in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::1]:{port}"),
        format!("169.254.169.254:{port}"),
    ] {
        let (resp, _) = env
            .plain_in_tunnel(&authority, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        assert_eq!(resp.status, 403, "{authority}: {}", resp.text());
        assert!(
            resp.text().contains("IP address"),
            "{authority}: {}",
            resp.text()
        );
    }
    // Ambiguous spellings are refused on the CONNECT itself.
    for authority in [
        format!("127.1:{port}"),
        format!("2130706433:{port}"),
        format!("0x7f000001:{port}"),
    ] {
        let err = env.connect(&authority).await.unwrap_err();
        assert_eq!(err.status, 403, "{authority}: {}", err.text());
    }
    assert!(env.upstream.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_ip_literal_is_operator_chosen_and_reachable() {
    let opts = Options {
        allow: vec!["127.0.0.1".into()],
        ..Options::default()
    };
    let env = Env::start(opts).await;
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://127.0.0.1:{port}/ip HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disallowed_port_is_refused() {
    let env = Env::start(Options::default()).await;
    let (resp, _) = env
        .plain_in_tunnel(
            &format!("{ALLOWED}:22"),
            format!("GET / HTTP/1.1\r\nHost: {ALLOWED}:22\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 403);
    assert!(
        resp.text()
            .contains(&format!("add 22 to [agents.{AGENT}.egress] ports")),
        "{}",
        resp.text()
    );
    let audit = env.audit();
    let reasons: Vec<_> = audit
        .iter()
        .map(|r| (r.method.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [("CONNECT", "port_not_allowed"), ("GET", "port_not_allowed")]
    );
    assert!(env.upstream.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_answered_by_the_proxy_and_origin_form_is_refused() {
    let env = Env::start(Options::default()).await;
    let resp = env
        .raw(b"GET /__bottle/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text().trim(), "ok");
    let resp = env
        .raw(b"GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 400);
    assert!(resp.text().contains("HTTPS_PROXY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_header_redirects_a_request() {
    // The proxy hands egress its destination in-process; a header the agent
    // sets, named like the old hop's, goes to the allowed upstream as is.
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nx-bottle-target: evil.example:443\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(env.upstream.seen().len(), 1, "went to the allowed upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_host_header_must_match_the_uri() {
    let env = Env::start(Options::default()).await;
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 421, "{}", resp.text());
    assert!(env.upstream.seen().is_empty());
    assert_eq!(env.audit().last().unwrap().reason, "host_mismatch");
}
