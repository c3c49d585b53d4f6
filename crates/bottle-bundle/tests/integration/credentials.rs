//! Credential injection: the upstream gets the bundle's secret, the agent's
//! own value is replaced, and the secret never comes back to the agent.

use crate::support::{ALLOWED, Env, OTHER_ALLOWED, Options};

const SECRET: &str = "bundle-held-Secret-9f8e7d6c";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_credential_reaches_upstream_and_never_the_agent() {
    let opts = Options {
        credentials: vec![(
            ALLOWED.into(),
            "Authorization".into(),
            "Bearer {}".into(),
            SECRET.into(),
        )],
        ..Options::default()
    };
    let env = Env::start(opts).await;
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!("GET /whoami HTTP/1.1\r\nHost: {ALLOWED}\r\nAuthorization: Bearer agent-made-up\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        vec![format!("Bearer {SECRET}")]
    );
    assert_eq!(
        seen[0].header("accept-encoding"),
        vec!["identity".to_string()]
    );
    // The upstream echoed the header in its body and in a response header;
    // both are masked on the way back.
    let all = resp.everything();
    assert!(!all.contains(SECRET), "{all}");
    assert!(!all.contains("agent-made-up"));
    assert!(
        all.contains(&format!(
            "authorization: Bearer {}",
            "*".repeat(SECRET.len())
        )),
        "{all}"
    );
    assert_eq!(
        resp.header("x-echo-authorization"),
        Some(format!("Bearer {}", "*".repeat(SECRET.len())))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_hosts_do_not_get_the_credential() {
    let opts = Options {
        credentials: vec![(
            ALLOWED.into(),
            "x-api-key".into(),
            "{}".into(),
            SECRET.into(),
        )],
        ..Options::default()
    };
    let env = Env::start(opts).await;
    let port = env.upstream.http.port();
    let resp = env
        .raw(format!("GET http://{OTHER_ALLOWED}:{port}/ HTTP/1.1\r\nHost: {OTHER_ALLOWED}:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 200);
    let seen = env.upstream.seen();
    assert!(seen[0].header("x-api-key").is_empty());
    // Over TLS the credential's own host gets it.
    let authority = format!("{ALLOWED}:{}", env.upstream.https.port());
    let resp = env
        .https(
            &authority,
            format!(
                "GET / HTTP/1.1\r\nHost: {ALLOWED}\r\nX-Api-Key: mine\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = env.upstream.seen();
    assert_eq!(seen[1].header("x-api-key"), vec![SECRET.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_never_travels_in_plain_http() {
    let opts = Options {
        credentials: vec![(
            ALLOWED.into(),
            "x-api-key".into(),
            "{}".into(),
            SECRET.into(),
        )],
        ..Options::default()
    };
    let env = Env::start(opts).await;
    let port = env.upstream.http.port();
    // Absolute-form plain HTTP to the credential's host: refused, nothing
    // reaches the upstream, and the agent is told why.
    let resp = env
        .raw(format!("GET http://{ALLOWED}:{port}/ HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert!(resp.text().contains("only over TLS"), "{}", resp.text());
    // Plain HTTP inside a CONNECT tunnel to a non-TLS port: the same.
    let resp = env
        .raw(format!("CONNECT {ALLOWED}:{port} HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\nGET / HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    let all = resp.everything();
    assert!(all.contains("403 Forbidden"), "{all}");
    assert!(all.contains("only over TLS"), "{all}");
    assert!(env.upstream.seen().is_empty(), "the upstream was reached");
    assert!(!all.contains(SECRET));
    let refused: Vec<_> = env
        .audit()
        .into_iter()
        .filter(|r| r.reason == "credential_needs_tls")
        .collect();
    for daemon in ["proxy", "egress"] {
        assert_eq!(
            refused.iter().filter(|r| r.daemon == daemon).count(),
            2,
            "{daemon} audits both refusals: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_to_a_tls_port_must_start_tls() {
    let env = Env::start(Options::default()).await;
    // Port 443 is allowed; nothing listens there, and nothing is dialed:
    // the refusal comes from the first byte the client sends.
    let resp = env
        .raw(format!("CONNECT {ALLOWED}:443 HTTP/1.1\r\nHost: {ALLOWED}:443\r\n\r\nGET / HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    let all = resp.everything();
    assert!(all.contains("403 Forbidden"), "{all}");
    assert!(all.contains("did not start TLS"), "{all}");
    assert!(
        env.audit()
            .iter()
            .any(|r| r.reason == "tunnel_not_tls" && r.port == 443),
        "the refusal is audited"
    );
    assert!(env.upstream.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_secret_file_stops_the_bundle_from_starting() {
    use bottle_core::Coded;
    let dir = tempfile::tempdir().unwrap();
    let upstream = crate::support::Upstream::start(dir.path()).await;
    let opts = Options::default();
    let (mut config, _) = crate::support::base_config(dir.path(), &upstream, &opts);
    config
        .credentials
        .push(bottle_core::bundle::BundleCredential {
            name: "gh".into(),
            host: ALLOWED.into(),
            header: "authorization".into(),
            format: "token {}".into(),
            file: dir.path().join("nope").display().to_string(),
        });
    let err = bottle_bundle::start(config).await.unwrap_err();
    assert_eq!(err.code(), "BOT-B008");
    assert!(err.fix().is_some_and(|fix| fix.contains("secret")));
}
