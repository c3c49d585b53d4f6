//! Credential formats, each generated from the shape its provider or a
//! public rule set publishes. `source` names where: provider documentation
//! first, else the public detector rules of gitleaks
//! (`config/gitleaks.toml`), trufflehog (`pkg/detectors/*`), GitGuardian's
//! detector pages or Google's osv-scalibr.
//!
//! The PEM armor lines are assembled at run time (`pem`), so this file
//! holds no complete credential of any format, only the prefixes.

use sha2::{Digest, Sha256};

use super::{BASE62, BASE64, BASE64URL, HEX_UPPER, LETTERS, Rng, UPPER_ALNUM, b64, b64url};

/// A credential format and how it travels.
#[derive(Debug)]
pub struct Format {
    /// A short name (`github_classic_pat`).
    pub name: &'static str,
    /// Where the shape is published.
    pub source: &'static str,
    /// The JSON key, form field and query parameter it is sent under.
    pub field: &'static str,
    /// The header it is sent in.
    pub header: &'static str,
    /// What precedes it in that header (`Bearer `).
    pub scheme: &'static str,
    /// One sample of the format.
    pub generate: fn(&mut Rng) -> String,
}

const fn f(
    name: &'static str,
    source: &'static str,
    field: &'static str,
    header: &'static str,
    scheme: &'static str,
    generate: fn(&mut Rng) -> String,
) -> Format {
    Format {
        name,
        source,
        field,
        header,
        scheme,
        generate,
    }
}

const BEARER: &str = "Bearer ";

/// Every format the corpus generates.
pub static FORMATS: &[Format] = &[
    // AWS IAM User Guide, "Unique identifiers" (AKIA: access key, ASIA:
    // temporary); gitleaks aws-access-token: prefix + 16 of [A-Z2-7].
    f(
        "aws_access_key_id",
        "AWS IAM User Guide, unique ID prefixes (AKIA/ASIA); gitleaks aws-access-token [A-Z2-7]{16}",
        "aws_access_key_id",
        "x-aws-access-key-id",
        "",
        |r| {
            format!(
                "{}{}",
                r.pick(&["AKIA", "ASIA"]),
                r.string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
            )
        },
    ),
    // AWS docs' example `wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY`: 40 of
    // base64, in an `aws_secret_access_key` setting.
    f(
        "aws_secret_access_key",
        "AWS IAM User Guide, managing access keys (40 base64 chars, aws_secret_access_key)",
        "aws_secret_access_key",
        "x-aws-secret-access-key",
        "",
        |r| r.string(BASE64, 40),
    ),
    // GitHub blog, "Behind GitHub's new authentication token formats"
    // (2021-04-05): prefix + 30 base62 + base62 CRC32 of those 30.
    f(
        "github_classic_pat",
        "GitHub blog 2021-04-05 token formats: ghp_ + 30 base62 + 6 base62 CRC32",
        "token",
        "authorization",
        "token ",
        |r| github_style(r, "ghp_", 30),
    ),
    f(
        "github_oauth",
        "GitHub blog 2021-04-05 token formats: gho_ + 30 base62 + 6 base62 CRC32",
        "access_token",
        "authorization",
        BEARER,
        |r| github_style(r, "gho_", 30),
    ),
    f(
        "github_user_to_server",
        "GitHub blog 2021-04-05 token formats: ghu_ + 30 base62 + 6 base62 CRC32",
        "token",
        "authorization",
        BEARER,
        |r| github_style(r, "ghu_", 30),
    ),
    f(
        "github_server_to_server",
        "GitHub blog 2021-04-05 token formats: ghs_ + 30 base62 + 6 base62 CRC32",
        "token",
        "authorization",
        "token ",
        |r| github_style(r, "ghs_", 30),
    ),
    // The refresh token in GitHub's "Refreshing user access tokens" docs
    // example is `ghr_` + 76; trufflehog takes 36 to 255.
    f(
        "github_refresh",
        "GitHub docs, refreshing user access tokens (ghr_ + 76 base62); trufflehog github {36,255}",
        "refresh_token",
        "x-refresh-token",
        "",
        |r| github_style(r, "ghr_", 70),
    ),
    // GitHub docs, fine-grained PATs; gitleaks github-fine-grained-pat:
    // `github_pat_` + 22 + `_` + 59.
    f(
        "github_fine_grained_pat",
        "GitHub docs fine-grained PAT; gitleaks github-fine-grained-pat: github_pat_ + 22 + _ + 59",
        "token",
        "authorization",
        BEARER,
        |r| {
            format!(
                "github_pat_11{}_{}",
                r.string(UPPER_ALNUM, 20),
                r.string(BASE62, 59)
            )
        },
    ),
    // GitLab docs, "Token prefixes"; gitleaks gitlab-pat: glpat- + 20.
    f(
        "gitlab_pat",
        "GitLab docs, token prefixes (glpat-); gitleaks gitlab-pat [\\w-]{20}",
        "private_token",
        "private-token",
        "",
        |r| format!("glpat-{}", r.string(BASE64URL, 20)),
    ),
    f(
        "gitlab_deploy_token",
        "GitLab docs, token prefixes (gldt-); gitleaks gitlab-deploy-token [0-9a-zA-Z_-]{20}",
        "deploy_token",
        "deploy-token",
        "",
        |r| format!("gldt-{}", r.string(BASE64URL, 20)),
    ),
    f(
        "gitlab_runner_auth_token",
        "GitLab docs, token prefixes (glrt-); gitleaks gitlab-runner-authentication-token {20}",
        "token",
        "private-token",
        "",
        |r| format!("glrt-{}", r.string(BASE64URL, 20)),
    ),
    f(
        "gitlab_pipeline_trigger_token",
        "GitLab docs, token prefixes (glptt-); gitleaks gitlab-ptt: glptt- + 40 hex",
        "token",
        "x-api-key",
        "",
        |r| format!("glptt-{}", r.hex(40)),
    ),
    f(
        "gitlab_runner_registration_token",
        "GitLab docs, token prefixes (GR1348941); gitleaks gitlab-rrt: GR1348941 + [\\w-]{20}",
        "registration_token",
        "x-api-key",
        "",
        |r| format!("GR1348941{}", r.string(BASE64URL, 20)),
    ),
    // Slack API docs, "Token types" (xoxb bot, xoxp user, xapp app-level);
    // gitleaks slack-bot-token / slack-user-token / slack-app-token.
    f(
        "slack_bot_token",
        "Slack API docs, token types (xoxb-); gitleaks slack-bot-token xoxb-\\d{10,13}-\\d{10,13}-...",
        "token",
        "authorization",
        BEARER,
        |r| {
            let team = r.between(10, 13);
            format!(
                "xoxb-{}-{}-{}",
                r.number(team),
                r.number(13),
                r.string(BASE62, 24)
            )
        },
    ),
    f(
        "slack_user_token",
        "Slack API docs, token types (xoxp-); gitleaks slack-user-token xoxp(-\\d{10,13}){3}-[a-zA-Z0-9-]{28,34}",
        "token",
        "authorization",
        BEARER,
        |r| {
            let team = r.between(10, 13);
            format!(
                "xoxp-{}-{}-{}-{}",
                r.number(team),
                r.number(13),
                r.number(13),
                r.hex(32)
            )
        },
    ),
    f(
        "slack_app_token",
        "Slack API docs, app-level tokens (xapp-); gitleaks slack-app-token xapp-\\d-[A-Z0-9]+-\\d+-[a-z0-9]+",
        "app_token",
        "authorization",
        BEARER,
        |r| {
            format!(
                "xapp-1-A{}-{}-{}",
                r.string(UPPER_ALNUM, 10),
                r.number(13),
                r.hex(64)
            )
        },
    ),
    // Slack docs, "Sending messages using incoming webhooks"; trufflehog
    // slackwebhook: services/T.../B.../[A-Za-z0-9]{23,25}.
    f(
        "slack_webhook_url",
        "Slack docs, incoming webhooks; trufflehog slackwebhook hooks.slack.com/services/T../B../24",
        "webhook_url",
        "x-webhook-url",
        "",
        |r| {
            let (t, b) = (r.between(8, 10), r.between(8, 10));
            format!(
                "https://hooks.slack.com/services/T{}/B{}/{}",
                r.string(UPPER_ALNUM, t),
                r.string(UPPER_ALNUM, b),
                r.string(BASE62, 24)
            )
        },
    ),
    // Stripe docs, "API keys" (sk_live_, rk_live_; keys up to 255 chars,
    // today's `51…` accounts give about 107); trufflehog stripe
    // [rs]k_live_[a-zA-Z0-9]{20,247}.
    f(
        "stripe_secret_key",
        "Stripe docs, API keys (sk_live_); trufflehog stripe [rs]k_live_[a-zA-Z0-9]{20,247}",
        "api_key",
        "authorization",
        BEARER,
        |r| format!("sk_live_51{}", r.string(BASE62, 97)),
    ),
    f(
        "stripe_restricted_key",
        "Stripe docs, restricted API keys (rk_live_); trufflehog stripe",
        "api_key",
        "authorization",
        BEARER,
        |r| format!("rk_live_51{}", r.string(BASE62, 97)),
    ),
    f(
        "stripe_webhook_secret",
        "Stripe docs, webhook endpoint secrets (whsec_); GitGuardian Stripe Webhook Secret",
        "webhook_secret",
        "x-webhook-secret",
        "",
        |r| format!("whsec_{}", r.string(BASE62, 32)),
    ),
    // gitleaks openai-api-key: sk-proj- + 74 + T3BlbkFJ + 74, and the
    // legacy sk- + 20 + T3BlbkFJ + 20 (48 after `sk-`).
    f(
        "openai_project_key",
        "OpenAI API keys (sk-proj-); gitleaks openai-api-key 74 + T3BlbkFJ + 74",
        "api_key",
        "authorization",
        BEARER,
        |r| {
            format!(
                "sk-proj-{}T3BlbkFJ{}",
                r.string(BASE64URL, 74),
                r.string(BASE64URL, 74)
            )
        },
    ),
    f(
        "openai_legacy_key",
        "OpenAI legacy user keys; gitleaks openai-api-key sk- + 20 + T3BlbkFJ + 20",
        "api_key",
        "authorization",
        BEARER,
        |r| {
            format!(
                "sk-{}T3BlbkFJ{}",
                r.string(BASE62, 20),
                r.string(BASE62, 20)
            )
        },
    ),
    // gitleaks anthropic-api-key / anthropic-admin-api-key, trufflehog
    // anthropic: sk-ant-(api03|admin01)- + 93 + AA.
    f(
        "anthropic_api_key",
        "Anthropic API keys (sk-ant-api03-); gitleaks anthropic-api-key [\\w-]{93}AA",
        "api_key",
        "x-api-key",
        "",
        |r| format!("sk-ant-api03-{}AA", r.string(BASE64URL, 93)),
    ),
    f(
        "anthropic_admin_key",
        "Anthropic Admin API keys (sk-ant-admin01-); gitleaks anthropic-admin-api-key [\\w-]{93}AA",
        "api_key",
        "x-api-key",
        "",
        |r| format!("sk-ant-admin01-{}AA", r.string(BASE64URL, 93)),
    ),
    // Google Cloud docs, "API keys" (every key starts AIzaSy); gitleaks
    // gcp-api-key AIza[\w-]{35}.
    f(
        "google_api_key",
        "Google Cloud docs, API keys (AIza...); gitleaks gcp-api-key AIza[\\w-]{35}",
        "key",
        "x-goog-api-key",
        "",
        |r| format!("AIzaSy{}", r.string(BASE64URL, 33)),
    ),
    f(
        "google_oauth_client_secret",
        "Google OAuth client secrets (GOCSPX-); osv-scalibr gcpoauth2client GOCSPX-[a-zA-Z0-9_-]{28}",
        "client_secret",
        "x-client-secret",
        "",
        |r| format!("GOCSPX-{}", r.string(BASE64URL, 28)),
    ),
    // GitHub blog, "Announcing npm's new access token format"
    // (2021-09-23): npm_ + 30 base62 + 6 base62 CRC32, as GitHub's.
    f(
        "npm_token",
        "GitHub blog 2021-09-23 npm's new token format: npm_ + 30 base62 + 6 base62 CRC32",
        "token",
        "authorization",
        BEARER,
        |r| github_style(r, "npm_", 30),
    ),
    // PyPI docs, API tokens: `pypi-` + a macaroon (v2 binary, base64url)
    // whose location is pypi.org, hence `pypi-AgEIcHlwaS5vcmc`; gitleaks
    // pypi-upload-token.
    f(
        "pypi_token",
        "PyPI help, API tokens (pypi- + base64url macaroon, location pypi.org); gitleaks pypi-upload-token",
        "password",
        "x-api-key",
        "",
        pypi,
    ),
    // RFC 7468 textual encodings; the DER inside as RFC 8017 (PKCS#1),
    // SEC1 (RFC 5915), PKCS#8 (RFC 5208/8410) and OpenSSH's PROTOCOL.key.
    f(
        "private_key_rsa",
        "RFC 7468 PEM + RFC 8017 PKCS#1 RSAPrivateKey (2048-bit)",
        "private_key",
        "x-private-key",
        "",
        |r| {
            let mut der = vec![
                0x30, 0x82, 0x04, 0xa4, 0x02, 0x01, 0x00, 0x02, 0x82, 0x01, 0x01, 0x00,
            ];
            der.extend(r.bytes(1180));
            pem(&["RSA", "PRIVATE KEY"].join(" "), &der, 64)
        },
    ),
    f(
        "private_key_ec",
        "RFC 7468 PEM + RFC 5915 SEC1 ECPrivateKey (P-256)",
        "private_key",
        "x-private-key",
        "",
        |r| {
            let mut der = vec![0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
            der.extend(r.bytes(32));
            der.extend([
                0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0xa1, 0x44,
                0x03, 0x42, 0x00, 0x04,
            ]);
            der.extend(r.bytes(64));
            pem(&["EC", "PRIVATE KEY"].join(" "), &der, 64)
        },
    ),
    f(
        "private_key_openssh",
        "OpenSSH PROTOCOL.key (openssh-key-v1, ed25519), 70-column PEM armor",
        "private_key",
        "x-private-key",
        "",
        openssh_key,
    ),
    f(
        "private_key_pkcs8",
        "RFC 7468 PEM + RFC 5208 PKCS#8 PrivateKeyInfo (RSA or RFC 8410 Ed25519)",
        "private_key",
        "x-private-key",
        "",
        |r| {
            let der = if r.below(2) == 0 {
                let mut der = vec![
                    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04,
                    0x22, 0x04, 0x20,
                ];
                der.extend(r.bytes(32));
                der
            } else {
                let mut der = vec![
                    0x30, 0x82, 0x04, 0xbe, 0x02, 0x01, 0x00, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86,
                    0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00, 0x04, 0x82, 0x04, 0xa8,
                    0x30, 0x82, 0x04, 0xa4, 0x02, 0x01, 0x00, 0x02, 0x82, 0x01, 0x01, 0x00,
                ];
                der.extend(r.bytes(1180));
                der
            };
            pem("PRIVATE KEY", &der, 64)
        },
    ),
    // RFC 7519 (JWT) with RFC 7515 HS256: base64url(header).
    // base64url(claims).base64url(HMAC-SHA256).
    f(
        "jwt_hs256",
        "RFC 7519 JWT, RFC 7515 JWS HS256 (HMAC-SHA256), registered claims",
        "token",
        "authorization",
        BEARER,
        jwt,
    ),
    // Twilio SendGrid docs, API keys: SG. + 22 + . + 43; gitleaks
    // sendgrid-api-token, trufflehog sendgrid.
    f(
        "sendgrid_api_key",
        "SendGrid docs, API keys; trufflehog sendgrid SG\\.[\\w-]{20,24}\\.[\\w-]{39,50}",
        "api_key",
        "authorization",
        BEARER,
        |r| format!("SG.{}.{}", r.string(BASE64URL, 22), r.string(BASE64URL, 43)),
    ),
    f(
        "twilio_api_key",
        "Twilio docs, API keys (SID SK + 32 hex); gitleaks twilio-api-key SK[0-9a-fA-F]{32}",
        "api_key",
        "x-api-key",
        "",
        |r| format!("SK{}", r.hex(32)),
    ),
    f(
        "mailgun_api_key",
        "Mailgun docs, private API key (key- + 32 hex); gitleaks mailgun-private-api-token",
        "mailgun_api_key",
        "x-api-key",
        "",
        |r| format!("key-{}", r.hex(32)),
    ),
    f(
        "shopify_access_token",
        "Shopify docs, access tokens (shpat_); gitleaks shopify-access-token shpat_[a-fA-F0-9]{32}",
        "access_token",
        "x-shopify-access-token",
        "",
        |r| format!("shpat_{}", r.hex(32)),
    ),
    f(
        "huggingface_token",
        "Hugging Face docs, user access tokens (hf_); gitleaks huggingface-access-token hf_[a-zA-Z]{34}",
        "token",
        "authorization",
        BEARER,
        |r| format!("hf_{}", r.string(LETTERS, 34)),
    ),
    f(
        "digitalocean_pat",
        "DigitalOcean docs, token prefixes (dop_v1_); gitleaks digitalocean-pat dop_v1_[a-f0-9]{64}",
        "token",
        "authorization",
        BEARER,
        |r| format!("dop_v1_{}", r.hex(64)),
    ),
    f(
        "databricks_token",
        "Databricks docs, personal access tokens (dapi); gitleaks databricks-api-token dapi[a-f0-9]{32}",
        "token",
        "authorization",
        BEARER,
        |r| format!("dapi{}", r.hex(32)),
    ),
    // Azure Storage docs, "Configure a connection string": AccountKey is
    // the base64 of a 512-bit key (88 chars); trufflehog azure_storage.
    f(
        "azure_storage_connection_string",
        "Azure Storage docs, connection strings (AccountKey = 88 base64); trufflehog azure_storage",
        "connection_string",
        "x-connection-string",
        "",
        |r| {
            let account = format!(
                "{}{}",
                r.string(b"abcdefghijklmnopqrstuvwxyz", 6),
                r.number(6)
            );
            format!(
                "DefaultEndpointsProtocol=https;AccountName={account};AccountKey={};EndpointSuffix=core.windows.net",
                b64(&r.bytes(64))
            )
        },
    ),
    // Atlassian API tokens (2023 format): ATATT3xFfGF0 + ... + `=` + 8
    // hex checksum, 192 in all; gitleaks atlassian-api-token ATATT3 + 186.
    f(
        "atlassian_api_token",
        "Atlassian API tokens (ATATT3, 192 chars); gitleaks atlassian-api-token ATATT3[A-Za-z0-9_=-]{186}",
        "api_token",
        "x-api-token",
        "",
        |r| {
            format!(
                "ATATT3xFfGF0{}={}",
                r.string(BASE64URL, 171),
                r.string(HEX_UPPER, 8)
            )
        },
    ),
    // Vault docs, "Tokens" (1.10+: hvs. service tokens, ~95 chars);
    // gitleaks vault-service-token hvs\.[\w-]{90,120}.
    f(
        "vault_service_token",
        "HashiCorp Vault docs, token prefixes (hvs.); gitleaks vault-service-token hvs\\.[\\w-]{90,120}",
        "token",
        "x-vault-token",
        "",
        |r| format!("hvs.CAESI{}", r.string(BASE64URL, 86)),
    ),
    f(
        "doppler_token",
        "Doppler docs, token formats (dp.pt.); gitleaks doppler-api-token dp\\.pt\\.[a-z0-9]{43}",
        "token",
        "authorization",
        BEARER,
        |r| format!("dp.pt.{}", r.string(BASE62, 43)),
    ),
    f(
        "linear_api_key",
        "Linear API docs, personal API keys (lin_api_); gitleaks linear-api-key lin_api_[a-z0-9]{40}",
        "api_key",
        "authorization",
        "",
        |r| format!("lin_api_{}", r.string(BASE62, 40)),
    ),
    f(
        "postman_api_key",
        "Postman API docs, API keys (PMAK-); gitleaks postman-api-token PMAK-[a-f0-9]{24}-[a-f0-9]{34}",
        "api_key",
        "x-api-key",
        "",
        |r| format!("PMAK-{}-{}", r.hex(24), r.hex(34)),
    ),
    // Grafana Cloud access policy tokens: glc_ + base64 of a JSON with
    // the org, name, key and region (trufflehog grafana glc_eyJ...).
    f(
        "grafana_cloud_token",
        "Grafana Cloud access policy tokens (glc_ + base64 JSON); trufflehog grafana glc_eyJ[A-Za-z0-9+/=]{60,160}",
        "token",
        "authorization",
        BEARER,
        |r| {
            let json = format!(
                r#"{{"o":"{}","n":"stack-{}-hm-read-{}","k":"{}","m":{{"r":"{}"}}}}"#,
                r.number(7),
                r.number(6),
                r.pick(&["metrics", "logs", "traces", "alloy"]),
                r.string(BASE62, 24),
                r.pick(&["prod-us-east-0", "prod-eu-west-2", "prod-ap-southeast-1"])
            );
            format!("glc_{}", b64(json.as_bytes()))
        },
    ),
    f(
        "grafana_service_account_token",
        "Grafana docs, service account tokens (glsa_); gitleaks grafana-service-account-token glsa_ + 32 + _ + 8 hex",
        "token",
        "authorization",
        BEARER,
        |r| format!("glsa_{}_{}", r.string(BASE62, 32), r.hex(8)),
    ),
    // age spec (C2SP age.md): an X25519 identity is Bech32 (BIP 173) with
    // HRP `age-secret-key-`, upper-cased; gitleaks age-secret-key.
    f(
        "age_secret_key",
        "C2SP age spec: AGE-SECRET-KEY-1 + Bech32 (BIP 173) of 32 bytes, upper case",
        "identity",
        "x-age-identity",
        "",
        |r| bech32("age-secret-key-", &r.bytes(32)).to_ascii_uppercase(),
    ),
    // Telegram Bot API docs ("123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11"):
    // bot id, `:`, 35 chars (AA + 33 today); trufflehog telegrambottoken.
    f(
        "telegram_bot_token",
        "Telegram Bot API docs, bot tokens (<id>:<35>); trufflehog telegrambottoken [0-9]{8,10}:[\\w-]{35}",
        "telegram_bot_token",
        "x-telegram-bot-token",
        "",
        |r| {
            let id = r.between(8, 10);
            format!("{}:AA{}", r.number(id), r.string(BASE64URL, 33))
        },
    ),
    f(
        "square_access_token",
        "Square docs, access tokens (EAAA); gitleaks square-access-token (EAAA|sq0atp-)[\\w-]{22,60}",
        "access_token",
        "authorization",
        BEARER,
        |r| format!("EAAA{}", r.string(BASE64URL, 60)),
    ),
    f(
        "heroku_api_key",
        "Heroku changelog 2024, new API key format (HRKU-AA); gitleaks heroku-api-key-v2 HRKU-AA[0-9a-zA-Z_-]{58}",
        "api_key",
        "authorization",
        BEARER,
        |r| format!("HRKU-AA{}", r.string(BASE64URL, 58)),
    ),
    f(
        "new_relic_user_key",
        "New Relic docs, user keys (NRAK-); gitleaks new-relic-user-api-key NRAK-[a-z0-9]{27}",
        "api_key",
        "api-key",
        "",
        |r| format!("NRAK-{}", r.string(UPPER_ALNUM, 27)),
    ),
    // RFC 3986 userinfo (`user:password@`), as libpq's connection URIs,
    // MySQL's, MongoDB's, Redis's and AMQP's take it.
    f(
        "url_password",
        "RFC 3986 userinfo; PostgreSQL libpq connection URIs (postgres://user:password@host)",
        "database_url",
        "x-database-url",
        "",
        |r| {
            let (scheme, user, host, port, path) = *r.pick(&[
                ("postgres", "app", "db.internal.example", ":5432", "/app"),
                ("postgresql", "postgres", "10.0.3.12", ":5432", "/orders"),
                ("mysql", "root", "mysql.prod.example", ":3306", "/shop"),
                (
                    "mongodb+srv",
                    "admin",
                    "cluster0.ab1cd.mongodb.net",
                    "",
                    "/test",
                ),
                ("redis", "default", "cache.example", ":6379", "/0"),
                ("amqp", "rabbit", "mq.example", ":5672", "/vhost"),
            ]);
            let len = r.between(16, 24);
            format!(
                "{scheme}://{user}:{}@{host}{port}{path}",
                r.string(BASE62, len)
            )
        },
    ),
];

/// GitHub's (and npm's) checksummed token: `prefix`, `random_len` base62
/// characters, and the CRC32 of those characters in base62 (digits, upper,
/// lower), left-padded with `0` to 6.
fn github_style(r: &mut Rng, prefix: &str, random_len: usize) -> String {
    let random = r.string(BASE62, random_len);
    let mut crc = flate2::Crc::new();
    crc.update(random.as_bytes());
    format!("{prefix}{random}{}", base62_fixed(crc.sum(), 6))
}

/// `n` in base62 (`0-9A-Za-z`), left-padded with `0` to `width`.
pub fn base62_fixed(mut n: u32, width: usize) -> String {
    let mut digits = Vec::new();
    while n > 0 {
        digits.push(BASE62[(n % 62) as usize]);
        n /= 62;
    }
    while digits.len() < width {
        digits.push(b'0');
    }
    digits.iter().rev().map(|&b| char::from(b)).collect()
}

/// RFC 7468 armor around `der`, wrapped at `width` columns.
fn pem(label: &str, der: &[u8], width: usize) -> String {
    let body = b64(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(width) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// An unencrypted ed25519 key in OpenSSH's own format (PROTOCOL.key).
fn openssh_key(r: &mut Rng) -> String {
    fn string(out: &mut Vec<u8>, data: &[u8]) {
        out.extend(u32::try_from(data.len()).unwrap_or(0).to_be_bytes());
        out.extend(data);
    }
    let public = r.bytes(32);
    let secret = r.bytes(32);
    let mut public_blob = Vec::new();
    string(&mut public_blob, b"ssh-ed25519");
    string(&mut public_blob, &public);
    let mut private = Vec::new();
    let check = r.bytes(4);
    private.extend(&check);
    private.extend(&check);
    string(&mut private, b"ssh-ed25519");
    string(&mut private, &public);
    string(
        &mut private,
        &[secret.as_slice(), public.as_slice()].concat(),
    );
    let comment = format!(
        "{}@{}",
        r.pick(&["dev", "ci", "deploy", "alice"]),
        r.pick(&["laptop", "build-01", "bastion"])
    );
    string(&mut private, comment.as_bytes());
    let mut pad = 1u8;
    while private.len() % 8 != 0 {
        private.push(pad);
        pad += 1;
    }
    let mut key = b"openssh-key-v1\0".to_vec();
    string(&mut key, b"none");
    string(&mut key, b"none");
    string(&mut key, b"");
    key.extend(1u32.to_be_bytes());
    string(&mut key, &public_blob);
    string(&mut key, &private);
    pem(&["OPENSSH", "PRIVATE KEY"].join(" "), &key, 70)
}

/// A PyPI API token: `pypi-` + base64url of a version-2 binary macaroon
/// (location `pypi.org`, a UUID identifier, PyPI's JSON caveats, a 32-byte
/// signature).
fn pypi(r: &mut Rng) -> String {
    fn field(out: &mut Vec<u8>, kind: u8, data: &[u8]) {
        out.push(kind);
        let mut len = data.len();
        // LEB128 length, as the v2 format has it.
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend(data);
    }
    let mut m = vec![2u8];
    field(&mut m, 1, b"pypi.org");
    field(&mut m, 2, r.uuid().as_bytes());
    m.push(0);
    let caveat = if r.below(2) == 0 {
        r#"{"version": 1, "permissions": "user"}"#.to_string()
    } else {
        let project = r.pick(&["requests-toolbelt", "fastapi-utils", "mypkg", "acme-sdk"]);
        format!(r#"{{"version": 1, "permissions": {{"projects": ["{project}"]}}}}"#)
    };
    field(&mut m, 2, caveat.as_bytes());
    m.push(0);
    m.push(0);
    field(&mut m, 6, &r.bytes(32));
    format!("pypi-{}", b64url(&m))
}

/// An HS256 JWT with realistic registered claims.
fn jwt(r: &mut Rng) -> String {
    let header = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let iat = 1_700_000_000 + r.below(60_000_000);
    let claims = format!(
        r#"{{"sub":"{}","name":"{}","iss":"https://auth.{}.example","aud":"{}","iat":{iat},"exp":{},"scope":"{}","jti":"{}"}}"#,
        r.uuid(),
        r.pick(&[
            "Ada Lovelace",
            "Grace Hopper",
            "Alan Turing",
            "Barbara Liskov"
        ]),
        r.pick(&["acme", "initech", "globex"]),
        r.pick(&["api", "https://api.acme.example", "billing"]),
        iat + 3600,
        r.pick(&["read write", "repo:read", "admin", "openid profile email"]),
        r.hex(16)
    );
    let signing_input = format!("{header}.{}", b64url(claims.as_bytes()));
    let key = r.bytes(32);
    let signature = hmac_sha256(&key, signing_input.as_bytes());
    format!("{signing_input}.{}", b64url(&signature))
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

const BECH32: &[u8] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";

/// Bech32 (BIP 173) of `data` under `hrp`, checksum included.
pub fn bech32(hrp: &str, data: &[u8]) -> String {
    fn polymod(values: &[u8]) -> u32 {
        const GEN: [u32; 5] = [
            0x3b6a_57b2,
            0x2650_8e6d,
            0x1ea1_19fa,
            0x3d42_33dd,
            0x2a14_62b3,
        ];
        let mut chk: u32 = 1;
        for &v in values {
            let top = chk >> 25;
            chk = ((chk & 0x01ff_ffff) << 5) ^ u32::from(v);
            for (i, g) in GEN.iter().enumerate() {
                if (top >> i) & 1 == 1 {
                    chk ^= g;
                }
            }
        }
        chk
    }
    // 8-bit bytes regrouped into 5-bit groups, zero-padded.
    let mut groups = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in data {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            groups.push(((acc >> bits) & 31) as u8);
        }
    }
    if bits > 0 {
        groups.push(((acc << (5 - bits)) & 31) as u8);
    }
    let mut values: Vec<u8> = hrp.bytes().map(|c| c >> 5).collect();
    values.push(0);
    values.extend(hrp.bytes().map(|c| c & 31));
    values.extend(&groups);
    values.extend([0; 6]);
    let pm = polymod(&values) ^ 1;
    let checksum = (0..6).map(|i| ((pm >> (5 * (5 - i))) & 31) as u8);
    let mut out = format!("{hrp}1");
    for g in groups.into_iter().chain(checksum) {
        out.push(char::from(BECH32[usize::from(g)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231, test case 2.
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn bech32_matches_bip_173() {
        // BIP 173's valid test vector `A12UEL5L` (HRP `a`, no data).
        assert_eq!(bech32("a", &[]), "a12uel5l");
        let key = bech32("age-secret-key-", &[0u8; 32]).to_ascii_uppercase();
        assert!(key.starts_with("AGE-SECRET-KEY-1"), "{key}");
        assert_eq!(key.len(), "AGE-SECRET-KEY-1".len() + 58);
    }

    #[test]
    fn github_checksums_verify() {
        let mut r = Rng::new(3, "gh");
        for _ in 0..20 {
            let token = github_style(&mut r, "ghp_", 30);
            assert_eq!(token.len(), 40);
            let (random, check) = token["ghp_".len()..].split_at(30);
            let mut crc = flate2::Crc::new();
            crc.update(random.as_bytes());
            // Decode the checksum back, as a verifier would.
            let decoded = check.bytes().fold(0u64, |acc, c| {
                acc * 62 + BASE62.iter().position(|&b| b == c).unwrap() as u64
            });
            assert_eq!(decoded, u64::from(crc.sum()), "{token}");
        }
        assert_eq!(base62_fixed(0, 6), "000000");
        assert_eq!(base62_fixed(61, 2), "0z");
        assert_eq!(base62_fixed(u32::MAX, 6), "4gfFC3");
    }

    #[test]
    fn shapes_have_their_published_lengths() {
        let mut r = Rng::new(5, "len");
        let len = |name: &str, r: &mut Rng| {
            let format = FORMATS.iter().find(|f| f.name == name).unwrap();
            (format.generate)(r).len()
        };
        assert_eq!(len("aws_access_key_id", &mut r), 20);
        assert_eq!(len("aws_secret_access_key", &mut r), 40);
        assert_eq!(len("github_fine_grained_pat", &mut r), 93);
        assert_eq!(len("anthropic_api_key", &mut r), 108);
        assert_eq!(len("openai_legacy_key", &mut r), 51);
        assert_eq!(len("openai_project_key", &mut r), 164);
        assert_eq!(len("google_api_key", &mut r), 39);
        assert_eq!(len("npm_token", &mut r), 40);
        assert_eq!(len("sendgrid_api_key", &mut r), 69);
        assert_eq!(len("atlassian_api_token", &mut r), 192);
        assert_eq!(len("github_refresh", &mut r), 80);
        assert_eq!(len("heroku_api_key", &mut r), 65);
        let pypi = (FORMATS
            .iter()
            .find(|f| f.name == "pypi_token")
            .unwrap()
            .generate)(&mut r);
        assert!(pypi.starts_with("pypi-AgEIcHlwaS5vcmc"), "{pypi}");
        let jwt = jwt(&mut r);
        assert!(
            jwt.starts_with("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJ"),
            "{jwt}"
        );
        let ssh = openssh_key(&mut r);
        assert!(
            ssh.contains(
                "\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
            ),
            "{ssh}"
        );
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = FORMATS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FORMATS.len());
        assert!(FORMATS.len() >= 40);
    }
}
