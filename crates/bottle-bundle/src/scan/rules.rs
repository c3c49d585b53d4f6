//! The credential formats the scanner knows, one [`Rule`] each.
//!
//! A rule's pattern is bounded (the longest match sizes the stream's
//! hold-back) and needs only the start of a secret: enough of a token's
//! prefix and body to tell it from ordinary text. What follows the match
//! and still belongs to the token (its [`Tail`]) is redacted with it. A
//! [`Check`] judges a match where a regex alone would flag ordinary text
//! (`sk-` followed by a kebab-case name), and a documented example value
//! ([`is_documented_example`]) is no secret: it is redacted where the host
//! says so, and never blocks a request.
//!
//! Where a secret carries `/`, `+`, `=` or spaces, the pattern also
//! accepts them as a form encoder (`%2F`, `+`) or a JSON encoder (`\/`)
//! writes them, so a body does not need decoding to be scanned.
//!
//! Order matters: the first rule that matches names the finding
//! (Anthropic keys also look like OpenAI ones).

/// What a secret goes on with after its pattern's match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tail {
    /// Nothing: the pattern matches the whole secret.
    None,
    /// Letters, digits, `_` and `-`.
    Word,
    /// Base64 of either alphabet with its padding, and `.` (JWT parts).
    Base64,
    /// The body of a PEM block, however it is carried: base64 and line
    /// breaks (raw, `\n` in JSON, `%0A` in a form). Not spaces, so the
    /// text after a block cut short is not masked with it.
    Pem,
    /// The rest of a secret URL's path: `/`, escaped or not, letters,
    /// digits, `_` and `-`.
    Path,
}

impl Tail {
    /// Whether `b` goes on a token of this kind.
    pub(super) fn continues(self, b: u8) -> bool {
        let word = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-');
        match self {
            Self::None => false,
            Self::Word => word,
            Self::Base64 => word || matches!(b, b'+' | b'/' | b'=' | b'.'),
            // No `-`: the block's END line is no secret, and ends it.
            Self::Pem => {
                b.is_ascii_alphanumeric()
                    || matches!(b, b'+' | b'/' | b'=' | b'\\' | b'%' | b'\r' | b'\n')
            }
            Self::Path => word || matches!(b, b'/' | b'\\' | b'%'),
        }
    }
}

/// A judgement of a match beyond its pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// The pattern is distinctive enough.
    None,
    /// The token after the prefix has lower case and upper case or a
    /// digit: random base62 does, kebab-case words do not.
    Random,
    /// Letters of both cases.
    BothCases,
    /// Hex with letters and digits (a run of one kind is a word or a
    /// number).
    HexMixed,
    /// A password in a URL that is not a placeholder.
    UrlPassword,
}

/// One credential format.
#[derive(Debug)]
pub(super) struct Rule {
    /// The finding's kind (`secret:<kind>` in the audit log).
    pub kind: &'static str,
    /// A bounded regex over bytes (compiled with `(?-u)`).
    pub pattern: &'static str,
    /// What follows the match and is redacted with it.
    pub tail: Tail,
    /// The judgement of a match.
    pub check: Check,
}

const fn rule(kind: &'static str, pattern: &'static str, tail: Tail, check: Check) -> Rule {
    Rule {
        kind,
        pattern,
        tail,
        check,
    }
}

/// A `/` as a URL, a form and a JSON string write it.
macro_rules! slash {
    () => {
        r"(?:/|\\/|%2[Ff])"
    };
}

/// Every rule, in the order their findings are named.
pub(super) const RULES: &[Rule] = &[
    // The armor and the start of the key inside it (or the armor headers
    // of an encrypted or PGP block): code that merely names the armor is
    // no key.
    rule(
        "private_key",
        r"-----BEGIN[ +A-Z0-9]{0,32}PRIVATE[ +]KEY(?:[ +]BLOCK)?-----(?:\\[rn]|[\r\n]|%0[AaDd]|[ +]){1,4}(?:Proc-Type:|Version:|Comment:|(?:[A-Za-z0-9+/=]|\\/|%2[BbFf]|%3[Dd]){64})",
        Tail::Pem,
        Check::None,
    ),
    rule(
        "gcp_service_account",
        r#""type"\s{0,8}:\s{0,8}"service_account""#,
        Tail::None,
        Check::None,
    ),
    rule(
        "gcp_service_account",
        r#""private_key"\s{0,8}:\s{0,8}"-----BEGIN"#,
        Tail::None,
        Check::None,
    ),
    // AWS: key ids by their documented four-letter prefixes; a secret key
    // (40 base64 characters, nothing to tell it by) only where it is named.
    rule(
        "aws_access_key_id",
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",
        Tail::None,
        Check::None,
    ),
    rule(
        "aws_secret_access_key",
        r#"(?i:aws[_\-]?secret[_\-]?(?:access[_\-]?)?key)["']?\s{0,4}(?::|=|%3[Dd])\s{0,4}["']?(?:[A-Za-z0-9+/]|%2[BbFf]){40}"#,
        Tail::None,
        Check::None,
    ),
    rule(
        "github_token",
        r"\bgh[pousr]_[A-Za-z0-9]{36}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "github_token",
        r"\bgithub_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "gitlab_token",
        r"\bgl(?:pat|dt|rt|ptt|ft|soat|oas|cbt|imt|agent|ffct|wt)-[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "gitlab_token",
        r"\bGR1348941[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "slack_token",
        r"\bxox[abposre]-[A-Za-z0-9\-]{10}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "slack_token",
        r"\bxapp-[0-9]-[A-Za-z0-9\-]{10}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "slack_webhook",
        concat!(
            r"hooks\.slack\.com",
            slash!(),
            r"(?:services|workflows|triggers)",
            slash!(),
            r"T[A-Z0-9]{8}"
        ),
        Tail::Path,
        Check::None,
    ),
    rule(
        "discord_webhook",
        concat!(
            r"discord(?:app)?\.com",
            slash!(),
            r"api",
            slash!(),
            r"webhooks",
            slash!(),
            r"[0-9]{17,20}",
            slash!(),
            r"[A-Za-z0-9_\-]{20}"
        ),
        Tail::Word,
        Check::None,
    ),
    rule(
        "stripe_key",
        r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "stripe_webhook_secret",
        r"\bwhsec_[A-Za-z0-9+/]{24}",
        Tail::Base64,
        Check::None,
    ),
    rule(
        "anthropic_key",
        r"\bsk-ant-[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "openai_key",
        r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::Random,
    ),
    rule(
        "google_api_key",
        r"\bAIza[0-9A-Za-z_\-]{35}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "google_oauth_secret",
        r"\bGOCSPX-[A-Za-z0-9_\-]{28}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "npm_token",
        r"\bnpm_[A-Za-z0-9]{36}",
        Tail::Word,
        Check::None,
    ),
    // A macaroon whose first bytes say `pypi.org` (or test.pypi.org).
    rule(
        "pypi_token",
        r"\bpypi-AgE[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    // A signed JWT: a JSON header and a JSON payload, base64url. The
    // signature and the rest of the payload are its tail.
    rule(
        "jwt",
        r"\beyJ[A-Za-z0-9_\-]{10,300}\.eyJ[A-Za-z0-9_\-]{10}",
        Tail::Base64,
        Check::None,
    ),
    rule(
        "sendgrid_key",
        r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "twilio_api_key",
        r"\bSK[0-9a-f]{32}\b",
        Tail::None,
        Check::HexMixed,
    ),
    rule(
        "mailgun_key",
        r"\bkey-[0-9a-f]{32}\b",
        Tail::None,
        Check::HexMixed,
    ),
    rule(
        "mailchimp_key",
        r"\b[0-9a-f]{32}-us[0-9]{1,2}\b",
        Tail::None,
        Check::HexMixed,
    ),
    rule(
        "shopify_token",
        r"\bshp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}",
        Tail::None,
        Check::None,
    ),
    rule(
        "huggingface_token",
        r"\bhf_[A-Za-z]{34}\b",
        Tail::None,
        Check::BothCases,
    ),
    rule(
        "digitalocean_token",
        r"\bdo[por]_v1_[a-f0-9]{64}",
        Tail::None,
        Check::None,
    ),
    rule(
        "databricks_token",
        r"\bdapi[a-f0-9]{32}",
        Tail::Word,
        Check::HexMixed,
    ),
    rule(
        "azure_storage_key",
        r"(?i:AccountKey)(?:=|%3[Dd])(?:[A-Za-z0-9+/]|%2[BbFf]){40}",
        Tail::Path,
        Check::None,
    ),
    rule(
        "square_token",
        r"\bsq0(?:atp|csp)-[0-9A-Za-z_\-]{22}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "square_token",
        r"\bEAAA[A-Za-z0-9_\-]{40}",
        Tail::Word,
        Check::Random,
    ),
    rule(
        "atlassian_token",
        r"\bATATT3[A-Za-z0-9_\-=]{30}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "doppler_token",
        r"\bdp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40}",
        Tail::None,
        Check::None,
    ),
    rule(
        "linear_key",
        r"\blin_(?:api|oauth)_[A-Za-z0-9]{40}",
        Tail::None,
        Check::None,
    ),
    rule(
        "postman_key",
        r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}",
        Tail::None,
        Check::None,
    ),
    rule(
        "vault_token",
        r"\bhv[sbr]\.[A-Za-z0-9_\-]{24}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "grafana_token",
        r"\bglc_[A-Za-z0-9+/]{32}",
        Tail::Base64,
        Check::None,
    ),
    rule(
        "grafana_token",
        r"\bglsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}",
        Tail::None,
        Check::None,
    ),
    rule(
        "age_secret_key",
        r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",
        Tail::None,
        Check::None,
    ),
    rule(
        "telegram_bot_token",
        r"\b[0-9]{8,10}(?::|%3[Aa])AA[A-Za-z0-9_\-]{33}",
        Tail::None,
        Check::None,
    ),
    rule(
        "heroku_key",
        r"\bHRKU-[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "newrelic_key",
        r"\bNRAK-[A-Z0-9]{27}",
        Tail::None,
        Check::None,
    ),
    rule(
        "flyio_token",
        r"\bfo1_[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "supabase_token",
        r"\bsbp_[a-f0-9]{40}",
        Tail::None,
        Check::None,
    ),
    rule(
        "pulumi_token",
        r"\bpul-[a-f0-9]{40}",
        Tail::None,
        Check::None,
    ),
    rule(
        "terraform_token",
        r"\b[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_\-]{20}",
        Tail::Word,
        Check::None,
    ),
    rule(
        "sentry_token",
        r"\bsntry[su]_[A-Za-z0-9+/=_\-]{40}",
        Tail::Base64,
        Check::None,
    ),
    rule(
        "cloudflare_origin_ca_key",
        r"\bv1\.0-[a-f0-9]{24}-[a-f0-9]{32}",
        Tail::Word,
        Check::None,
    ),
    // `scheme://user:password@`: a password written into a URL (or a
    // form's encoding of one).
    rule(
        "url_password",
        r#"\b[a-z][a-zA-Z0-9+.%\-]{1,15}(?:://|%3[Aa]%2[Ff]%2[Ff])[^\s/:@"'<>%]{1,64}(?::|%3[Aa])[^\s/:@"'<>]{8,64}(?:@|%40)"#,
        Tail::None,
        Check::UrlPassword,
    ),
];

/// Whether `matched` (a match of `kind`) passes the rule's check.
pub(super) fn passes(check: Check, kind: &str, matched: &[u8]) -> bool {
    let body = token_body(kind, matched);
    match check {
        Check::None => true,
        Check::Random => {
            body.iter().any(u8::is_ascii_lowercase)
                && body
                    .iter()
                    .any(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        }
        Check::BothCases => {
            body.iter().any(u8::is_ascii_lowercase) && body.iter().any(u8::is_ascii_uppercase)
        }
        Check::HexMixed => {
            body.iter().any(u8::is_ascii_digit) && body.iter().any(|b| b.is_ascii_alphabetic())
        }
        Check::UrlPassword => url_password_is_real(matched),
    }
}

/// The part of a match after its fixed prefix, where the checks look.
fn token_body<'a>(kind: &str, matched: &'a [u8]) -> &'a [u8] {
    let prefix = match kind {
        "openai_key" => ["sk-proj-", "sk-svcacct-", "sk-admin-", "sk-"]
            .iter()
            .find(|p| matched.starts_with(p.as_bytes()))
            .map_or(0, |p| p.len()),
        "huggingface_token" => 3,
        "twilio_api_key" => 2,
        "mailgun_key" => 4,
        "databricks_token" => 4,
        "square_token" => 4,
        _ => 0,
    };
    matched.get(prefix..).unwrap_or(matched)
}

/// Whether the password of a `scheme://user:password@` match is a real
/// one: not a placeholder (`password`, `${DB_PASSWORD}`, `<pass>`,
/// `****`), with letters and digits. A form's encoding is undone first.
fn url_password_is_real(matched: &[u8]) -> bool {
    let decoded = super::percent_decode(matched);
    let Some(at) = decoded.iter().rposition(|&b| b == b'@') else {
        return false;
    };
    let Some(colon) = decoded[..at].iter().rposition(|&b| b == b':') else {
        return false;
    };
    let password = &decoded[colon + 1..at];
    let lower = password.to_ascii_lowercase();
    let placeholder = [
        "password", "passwd", "changeme", "example", "secret", "xxxx", "****",
    ]
    .iter()
    .any(|p| lower.windows(p.len()).any(|w| w == p.as_bytes()))
        || password
            .iter()
            .any(|b| matches!(b, b'$' | b'{' | b'}' | b'[' | b']' | b'<' | b'>'))
        || lower.windows(2).any(|w| w == b"%(");
    password.len() >= 8
        && !placeholder
        && password.iter().any(u8::is_ascii_alphabetic)
        && password.iter().any(u8::is_ascii_digit)
}

/// Values the providers publish in their documentation: no secret, so a
/// request carrying one is never refused for it (a host that redacts
/// still masks it). AWS marks every example key with `EXAMPLE`; Stripe's
/// documentation shows one test key to every reader.
pub(super) fn is_documented_example(kind: &str, matched: &[u8]) -> bool {
    match kind {
        "aws_access_key_id" => matched.ends_with(b"EXAMPLE"),
        "aws_secret_access_key" => matched.ends_with(b"EXAMPLEKEY"),
        // The match is the key's first 24 characters of 32.
        "stripe_key" => matched == b"sk_test_4eC39HqLyjWDarjt",
        _ => false,
    }
}
