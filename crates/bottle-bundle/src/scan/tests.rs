use super::rules::RULES;
use super::*;

/// A real-shaped AWS key id (not AWS's documented example).
const AWS: &str = "AKIAZ7Q3HN2XK5WJ4T6M";

/// One sample per rule that must be found, by kind.
const SAMPLES: &[(&str, &str)] = &[
    (
        "private_key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    ),
    (
        "private_key",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    ),
    (
        "private_key",
        r#"{"k":"-----BEGIN PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"}"#,
    ),
    (
        "private_key",
        "key=-----BEGIN+EC+PRIVATE+KEY-----%0AMHcCAQEEIBmUXZc%2FaH0jO3T9Wl1xzm%2BQ4GLDx1gKkEc7JfSNqpuoAoGCCqGSM49AwEHoUQDQgAE",
    ),
    (
        "private_key",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\nlQOYBF",
    ),
    (
        "private_key",
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,8A1",
    ),
    (
        "gcp_service_account",
        r#"{"type": "service_account", "project_id": "p"}"#,
    ),
    ("aws_access_key_id", "key=AKIAZ7Q3HN2XK5WJ4T6M;"),
    ("aws_access_key_id", "ASIAZ7Q3HN2XK5WJ4T6M"),
    (
        "aws_secret_access_key",
        r#""aws_secret_access_key": "k9Zq3Lr8Vx2Nw5Ty7Ub1Cm4Dn6Ep0Fq8Gr2Hs4Jt""#,
    ),
    (
        "aws_secret_access_key",
        "aws_secret_access_key=k9Zq3Lr8Vx2Nw5Ty7Ub1Cm4Dn6Ep0Fq8Gr2%2FHs4J",
    ),
    (
        "github_token",
        "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    ),
    ("github_token", "gho_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    (
        "github_token",
        "github_pat_11ABCDEFG0123456789abc_abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvw",
    ),
    ("gitlab_token", "glpat-abcdefghij0123456789"),
    ("gitlab_token", "glrt-abcdefghij0123456789"),
    ("gitlab_token", "GR1348941abcdefghij0123456789"),
    ("slack_token", "xoxb-123456789012-abcdefghij"),
    ("slack_token", "xapp-1-A0123456789-0123456789012-abc"),
    (
        "slack_webhook",
        "https://hooks.slack.com/services/T01234567/B0123456789/abcdefghij",
    ),
    (
        "slack_webhook",
        "url=https%3A%2F%2Fhooks.slack.com%2Fservices%2FT01234567%2FB0123",
    ),
    (
        "discord_webhook",
        "https://discord.com/api/webhooks/123456789012345678/abcdefghijklmnopqrstuvwxyz",
    ),
    ("stripe_key", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("stripe_key", "rk_test_51Hx0123456789abcdef"),
    ("stripe_webhook_secret", "whsec_abcdefghijklmnopqrstuvwx"),
    (
        "anthropic_key",
        "x-api-key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    ),
    (
        "openai_key",
        "Bearer sk-proj-Ab3dEf9hIjK2mNoP4rStUvWxYz012345",
    ),
    ("openai_key", "sk-Ab3dEf9hIjK2mNoP4rStUvWxYz012345"),
    ("google_api_key", "AIzaSyA0123456789abcdefghijklmnopqrstuv"),
    ("google_oauth_secret", "GOCSPX-abcdefghijklmnopqrstuvwxyz01"),
    ("npm_token", "npm_abcdefghijklmnopqrstuvwxyz0123456789"),
    (
        "pypi_token",
        "pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAw",
    ),
    (
        "jwt",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",
    ),
    (
        "sendgrid_key",
        "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
    ),
    ("twilio_api_key", "SK0123456789abcdef0123456789abcdef"),
    ("mailgun_key", "key-0123456789abcdef0123456789abcdef"),
    ("mailchimp_key", "0123456789abcdef0123456789abcdef-us21"),
    ("shopify_token", "shpat_0123456789abcdef0123456789abcdef"),
    ("huggingface_token", "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"),
    (
        "digitalocean_token",
        "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ),
    ("databricks_token", "dapi0123456789abcdef0123456789abcdef"),
    (
        "azure_storage_key",
        "AccountName=x;AccountKey=k9Zq3Lr8Vx2Nw5Ty7Ub1Cm4Dn6Ep0Fq8Gr2Hs4Jt+/==",
    ),
    ("square_token", "sq0atp-abcdefghijklmnopqrstuv"),
    ("atlassian_token", "ATATT3xFfGF0abcdefghijklmnopqrstuvwxyz"),
    (
        "doppler_token",
        "dp.pt.abcdefghijklmnopqrstuvwxyz0123456789ABCD",
    ),
    (
        "linear_key",
        "lin_api_abcdefghijklmnopqrstuvwxyz0123456789ABCD",
    ),
    (
        "postman_key",
        "PMAK-0123456789abcdef01234567-0123456789abcdef0123456789abcdef01",
    ),
    ("vault_token", "hvs.CAESIabcdefghijklmnopqrstuv"),
    ("grafana_token", "glc_abcdefghijklmnopqrstuvwxyz012345"),
    (
        "age_secret_key",
        "AGE-SECRET-KEY-1QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7LQPZRY9X8GF2TVDW0S3JN54KHCE6MU",
    ),
    (
        "telegram_bot_token",
        "123456789:AAabcdefghijklmnopqrstuvwxyz0123456",
    ),
    ("heroku_key", "HRKU-abcdefghijklmnopqrstuvwxyz"),
    ("newrelic_key", "NRAK-ABCDEFGHIJKLMNOPQRSTUVWXYZ0"),
    ("flyio_token", "fo1_abcdefghijklmnopqrstuvwxyz"),
    (
        "supabase_token",
        "sbp_0123456789abcdef0123456789abcdef01234567",
    ),
    (
        "pulumi_token",
        "pul-0123456789abcdef0123456789abcdef01234567",
    ),
    (
        "terraform_token",
        "abcdefghij0123.atlasv1.abcdefghijklmnopqrstuvwxyz",
    ),
    (
        "sentry_token",
        "sntrys_abcdefghijklmnopqrstuvwxyz0123456789ABCD",
    ),
    (
        "cloudflare_origin_ca_key",
        "v1.0-0123456789abcdef01234567-0123456789abcdef0123456789abcdef",
    ),
    (
        "url_password",
        "DATABASE_URL=postgres://app:Tr0ub4dor3x@db:5432/app",
    ),
];

#[test]
fn known_formats_are_found() {
    let s = Scanner::new().unwrap();
    for (kind, text) in SAMPLES {
        assert_eq!(
            s.scan(text.as_bytes()).map(|f| f.kind),
            Some(*kind),
            "{text}"
        );
    }
}

#[test]
fn every_rule_has_a_sample() {
    for rule in RULES {
        assert!(
            SAMPLES.iter().any(|(kind, _)| *kind == rule.kind),
            "no sample of {}",
            rule.kind
        );
    }
}

#[test]
fn ordinary_text_passes() {
    let s = Scanner::new().unwrap();
    for text in [
        "hello world",
        "task-abcdefghijklmnopqrstuvwxyz012345",
        "AKIA is a prefix",
        "ghp_short",
        r#"{"type":"user"}"#,
        "-----BEGIN CERTIFICATE-----",
        "-----BEGIN PUBLIC KEY-----",
        // Code that names the armor holds no key.
        r#"if line == "-----BEGIN PRIVATE KEY-----" { in_key = true; }"#,
        "-----BEGIN RSA PRIVATE KEY-----\nab\n-----END RSA PRIVATE KEY-----",
        // kebab-case after `sk-` is a name, not a key.
        "import sk-learn-random-forest-classifier-plugin",
        // hex of one kind only is a hash or a word.
        "SK00000000000000000000000000000000",
        "key-abcdefabcdefabcdefabcdefabcdefab",
        // A URL with a user and a placeholder password, or none.
        "postgres://user:password@localhost/db",
        "postgres://${DB_USER}:${DB_PASSWORD}@db/app",
        "git+ssh://git@github.com/o/r.git",
        "https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz",
    ] {
        assert_eq!(s.scan(text.as_bytes()), None, "{text}");
    }
}

#[test]
fn documented_example_keys_are_not_secrets() {
    let s = Scanner::new().unwrap();
    for text in [
        "AKIAIOSFODNN7EXAMPLE",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    ] {
        assert_eq!(s.scan(text.as_bytes()), None, "{text}");
    }
    // Next to a real one, the real one is still found.
    let both = format!("AKIAIOSFODNN7EXAMPLE {AWS}");
    assert_eq!(
        s.scan(both.as_bytes()).map(|f| f.kind),
        Some("aws_access_key_id")
    );
}

/// Where the first secret in `body` starts, by any rule.
fn secret_start(s: &Scanner, body: &[u8]) -> usize {
    s.hits(body).iter().map(|h| h.span.start).min().unwrap()
}

/// Feeds `parts` in order; what was released before the finding.
fn released_before_finding(s: &Scanner, parts: &[&[u8]]) -> (Vec<u8>, Option<Finding>) {
    let mut st = s.stream();
    let mut released = Vec::new();
    for part in parts {
        match st.feed(part) {
            Ok(ready) => released.extend_from_slice(&ready),
            Err(f) => return (released, Some(f)),
        }
    }
    released.extend_from_slice(&st.finish());
    (released, None)
}

/// Feeds `parts` to a redacting stream; everything it released.
fn redacted_stream(s: &Scanner, parts: &[&[u8]]) -> (Vec<u8>, BTreeSet<&'static str>) {
    let mut st = s.redacting_stream();
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(&st.feed(part).unwrap());
        assert!(st.held() <= s.window());
    }
    out.extend_from_slice(&st.finish());
    (out, st.redacted().clone())
}

#[test]
fn window_is_the_longest_possible_match() {
    let s = Scanner::new().unwrap();
    let sources: Vec<String> = RULES
        .iter()
        .map(|r| format!("(?-u){}", r.pattern))
        .collect();
    let longest = sources
        .iter()
        .map(|p| longest_match(std::slice::from_ref(p)).unwrap())
        .max()
        .unwrap();
    assert_eq!(s.window(), longest);
    // A JWT's header may be 300 characters: the window covers it.
    let jwt = format!("eyJ{}.eyJzdWIiOiIxMjM0NTY3ODkwIn0", "A".repeat(300));
    assert_eq!(s.scan(jwt.as_bytes()).map(|f| f.kind), Some("jwt"));
    assert!(s.window() >= 3 + 300 + 1 + 13);
}

#[test]
fn an_unbounded_pattern_is_refused() {
    let err = longest_match(&["(?-u)sk-[a-z]+".to_string()]).unwrap_err();
    assert!(err.contains("no longest match"), "{err}");
}

#[test]
fn no_byte_of_a_secret_is_released_at_any_split_point() {
    let s = Scanner::new().unwrap();
    for (kind, text) in SAMPLES {
        let body = format!("{}{text}{}", "a ".repeat(200), " b".repeat(200));
        let bytes = body.as_bytes();
        let start = secret_start(&s, bytes);
        // Split points further from the secret than the window all
        // behave alike: try every one near it.
        let near = start.saturating_sub(s.window() + 2)
            ..(start + text.len() + s.window() + 2).min(bytes.len());
        for split in near.step_by(3) {
            let (released, found) =
                released_before_finding(&s, &[&bytes[..split], &bytes[split..]]);
            let got = found.map(|f| f.kind);
            // A partial Anthropic key already looks like an OpenAI one;
            // either way it is blocked.
            let ok = got == Some(*kind) || (*kind == "anthropic_key" && got == Some("openai_key"));
            assert!(ok, "{text} @ {split}: {got:?}");
            assert!(
                released.len() <= start,
                "{text} @ {split}: released {} bytes, the secret starts at {start}",
                released.len()
            );
        }
    }
}

#[test]
fn byte_by_byte_stream_is_caught_before_any_of_it_leaves() {
    let s = Scanner::new().unwrap();
    let body = format!("xx {AWS} yy");
    let parts: Vec<&[u8]> = body.as_bytes().chunks(1).collect();
    let (released, found) = released_before_finding(&s, &parts);
    assert_eq!(found.map(|f| f.kind), Some("aws_access_key_id"));
    assert!(released.len() <= 3, "{released:?}");
}

#[test]
fn a_clean_body_comes_out_whole_and_in_order() {
    let s = Scanner::new().unwrap();
    let body: Vec<u8> = (0..10_000u32)
        .map(|i| b"abc def\n"[i as usize % 8])
        .collect();
    for size in [1, 7, 57, 58, 59, 4096] {
        for redacting in [false, true] {
            let parts: Vec<&[u8]> = body.chunks(size).collect();
            let mut st = if redacting {
                s.redacting_stream()
            } else {
                s.stream()
            };
            let mut out = Vec::new();
            for part in &parts {
                out.extend_from_slice(&st.feed(part).unwrap());
                assert!(st.held() <= s.window());
            }
            out.extend_from_slice(&st.finish());
            assert_eq!(out, body, "chunks of {size}");
        }
    }
}

#[test]
fn redaction_masks_every_byte_of_the_token_at_any_split_point() {
    let s = Scanner::new().unwrap();
    // An Anthropic key is longer than its pattern's match: the tail goes
    // with it, whichever chunk it arrives in.
    let key = format!("sk-ant-api03-{}", "Ab3".repeat(30));
    for (secret, kind) in [
        (key.as_str(), "anthropic_key"),
        (AWS, "aws_access_key_id"),
        ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
        (
            "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\\nMzEfYyjiWA4R4\\n",
            "private_key",
        ),
    ] {
        let body = format!(r#"{{"messages":[{{"content":"see {secret} here"}}]}}"#);
        let bytes = body.as_bytes();
        let at = body.find(secret).unwrap();
        for split in (0..bytes.len())
            .step_by(5)
            .chain([at, at + 1, at + secret.len()])
        {
            let split = split.min(bytes.len());
            for parts in [
                vec![&bytes[..split], &bytes[split..]],
                bytes.chunks(split.max(1)).collect(),
            ] {
                let (out, kinds) = redacted_stream(&s, &parts);
                assert_eq!(out.len(), bytes.len(), "same length");
                assert_eq!(&out[..at], &bytes[..at], "before the secret");
                assert_eq!(
                    &out[at + secret.len()..],
                    &bytes[at + secret.len()..],
                    "after the secret"
                );
                let masked = &out[at..at + secret.len()];
                assert!(
                    masked.starts_with(MARKER),
                    "{}",
                    String::from_utf8_lossy(masked)
                );
                assert!(
                    masked[MARKER.len()..].iter().all(|&b| b == b'*'),
                    "{secret} @ {split}: {}",
                    String::from_utf8_lossy(masked)
                );
                // As when blocking: a part of an Anthropic key already
                // looks like an OpenAI one, and is masked as one.
                let named: Vec<&str> = kinds.iter().copied().collect();
                assert!(
                    named == [kind] || (kind == "anthropic_key" && named == ["openai_key"]),
                    "{secret} @ {split}: {named:?}"
                );
            }
        }
    }
}

#[test]
fn headers_and_targets_are_redacted_in_place() {
    let s = Scanner::new().unwrap();
    let (value, kinds) = s
        .redact_header("authorization", format!("Bearer {AWS}").as_bytes())
        .unwrap();
    assert_eq!(value, b"Bearer REDACTED************");
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), ["aws_access_key_id"]);
    let random = "Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz";
    let (value, kinds) = s.redact_header("x-debug", random.as_bytes()).unwrap();
    assert_eq!(value.len(), random.len());
    assert!(s.scan_header("x-debug", &value).is_none());
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["high_entropy_header"]
    );
    let (clean, kinds) = s.redact_header("accept", b"*/*").unwrap();
    assert_eq!((clean.as_slice(), kinds.len()), (b"*/*".as_slice(), 0));

    let (target, kinds) = s
        .redact_target(&format!("/v1/{random}/x?k={AWS}&q=rust"))
        .unwrap();
    assert_eq!(
        target,
        format!("/v1/{}/x?k=REDACTED************&q=rust", "*".repeat(40))
    );
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["aws_access_key_id", "high_entropy_path"]
    );
    // A key percent-encoded across its characters cannot be masked as
    // sent: the request is refused instead.
    assert_eq!(
        s.redact_target("/x?k=AKIA%5A7Q3HN2XK5WJ4T6M")
            .map_err(|f| f.kind),
        Err("aws_access_key_id")
    );
}

#[test]
fn query_entropy() {
    let s = Scanner::new().unwrap();
    assert_eq!(
        s.scan_target("/x?token=Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz")
            .map(|f| f.kind),
        Some("high_entropy_query")
    );
    assert_eq!(
        s.scan_target("/x?ref=3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a"),
        None,
        "hex commit ids pass"
    );
    assert_eq!(
        s.scan_target("/x?id=123e4567-e89b-12d3-a456-426614174000"),
        None
    );
    assert_eq!(s.scan_target("/search?q=how+to+write+rust"), None);
    assert_eq!(
        s.scan_target("/x?k=AKIA%5A7Q3HN2XK5WJ4T6M").map(|f| f.kind),
        Some("aws_access_key_id"),
        "percent-encoding does not hide a key"
    );
}

#[test]
fn random_path_segments_are_found() {
    let s = Scanner::new().unwrap();
    for path in [
        "/upload/Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz",
        "/a/Zk3q9P%5FxL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz/b?x=1",
        "/jwt/eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.e30.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ] {
        assert_eq!(
            s.scan_target(path).map(|f| f.kind),
            Some("high_entropy_path"),
            "{path}"
        );
    }
}

#[test]
fn ordinary_paths_pass() {
    let s = Scanner::new().unwrap();
    for path in [
        "/packages/3b/12/0e6bd0a7cd1b4d1b2e8fbbc6f7b7f0f1e3fa5e6c5d6a3f1e0c2a9b8d7c6e5f4a/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "/packages/cryptography-42.0.5-cp39-abi3-manylinux_2_28_x86_64.whl",
        "/repos/o/r/git/commits/3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a",
        "/v2/library/ubuntu/blobs/sha256:3f2a9c1b0e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3f2a9c1b0e8d7f6a5b4c3d2e",
        "/uploads/123e4567-e89b-12d3-a456-426614174000",
        "/@typescript-eslint/parser/-/parser-7.1.0.tgz",
        "/github.com/!azure/azure-sdk-for-go/sdk/azcore/@v/v1.11.1.zip",
        "/nix-cache/0c1mzxrwsv0fl8bhlm4vqqnh4cq9bj3f.narinfo",
    ] {
        assert_eq!(s.scan_target(path), None, "{path}");
    }
}

#[test]
fn random_header_values_are_found_except_where_expected() {
    let s = Scanner::new().unwrap();
    let token = b"Zk3q9P_xL2mVb7RtY1cWn8Hd0sJgAeQ4uKoF6iTz";
    assert_eq!(
        s.scan_header("x-debug", token).map(|f| f.kind),
        Some("high_entropy_header")
    );
    assert_eq!(
        s.scan_header("authorization", &[b"Bearer ".as_slice(), token].concat())
            .map(|f| f.kind),
        Some("high_entropy_header")
    );
    assert_eq!(
        s.scan_header("Cookie", &[b"session=".as_slice(), token].concat()),
        None
    );
    for (name, value) in [
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
        ),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("x-request-id", "123e4567-e89b-12d3-a456-426614174000"),
        (
            "content-type",
            "multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW",
        ),
        (
            "content-digest",
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",
        ),
        // npm 9 and 10 send the tarball's SRI digest with every request
        // for it.
        (
            "pacote-integrity",
            "sha512-DhNtPOeqpqfbLsDh8bn0ycJbn5+qK8e/7Vtd6NPQn9d9zJU9A/KXrdSkW6s5wSYRBaWaH0lJXRPVDBD8KOBbdw==",
        ),
        ("accept", "application/vnd.github+json"),
    ] {
        assert_eq!(s.scan_header(name, value.as_bytes()), None, "{name}");
    }
    // Patterns still apply to exempt headers.
    assert_eq!(
        s.scan_header("cookie", format!("k={AWS}").as_bytes())
            .map(|f| f.kind),
        Some("aws_access_key_id")
    );
}
