//! A bounded, seeded fuzz campaign against the real `bottle-bundle`
//! binary over real loopback sockets: the proxy's HTTP/CONNECT parser,
//! git-gate's smart HTTP and pkt-line handling, and supervise's JSON-RPC.
//!
//! Cases are valid requests mutated by a seeded generator ([`crate::rng`]): each
//! is a pure function of (seed, target, index), so a failure replays from
//! the numbers it prints. Oracles, checked as the campaign goes:
//!
//! 1. no crash: the process is alive and printed no panic and no daemon
//!    restart after every case, and each daemon answers a known-good
//!    request after every batch;
//! 2. no hang: every connection is closed within the daemon's own timeouts
//!    plus [`bundle::MARGIN`] of the last byte sent, measured;
//! 3. no allowed decision for a denied host: the denied host's canary (a
//!    listener on 127.0.0.2) records no connection, the audit log has no
//!    `allow` but for the allowed host and the served repository, and the
//!    repository has no ref outside the pushable `agent/*`.
//!
//! The short run is a test of bottle-bundle; `cargo xtask fuzz` runs the
//! long one. Behind the `fuzz` feature.

pub mod bundle;
pub mod gitgate;
pub mod mutate;
pub mod proxy;
pub mod supervise;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::rng::Rng;
use bundle::{
    Bundle, DENIED_HOST, HEADER_READ_TIMEOUT, HalfClose, IDLE_TIMEOUT, MARGIN, REPO, exchange,
};
use mutate::{Case, Delivery};
use proxy::ProxyHosts;

/// A daemon under fuzz.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The proxy's HTTP/CONNECT parser.
    Proxy,
    /// git-gate's smart HTTP and pkt-line handling.
    GitGate,
    /// supervise's JSON-RPC endpoint.
    Supervise,
}

impl Target {
    /// Every target, in the order a campaign runs them.
    pub const ALL: [Target; 3] = [Target::Proxy, Target::GitGate, Target::Supervise];

    /// The name `--target` takes and reports print.
    pub fn name(self) -> &'static str {
        match self {
            Target::Proxy => "proxy",
            Target::GitGate => "gitgate",
            Target::Supervise => "supervise",
        }
    }

    /// The target called `name`.
    pub fn parse(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// How long each target is fuzzed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// This many cases per target.
    Cases(u64),
    /// Cases until this much time has passed, per target.
    Time(Duration),
}

/// What a campaign runs.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The seed every case derives from.
    pub seed: u64,
    /// The daemons fuzzed, one after the other.
    pub targets: Vec<Target>,
    /// How long each is fuzzed.
    pub budget: Budget,
    /// Cases between known-good checks.
    pub batch: u64,
}

/// What a target's run did, for the report.
#[derive(Debug, Clone)]
pub struct TargetSummary {
    /// The target.
    pub target: Target,
    /// Cases sent.
    pub cases: u64,
    /// The longest a connection stayed open after its last byte.
    pub slowest_close: Duration,
    /// How the daemon answered: cases per status code (`-` for none), to
    /// see how deep the cases got.
    pub statuses: BTreeMap<String, u64>,
}

/// Why a campaign stopped short.
#[derive(Debug)]
pub enum FuzzError {
    /// The harness could not set up (no git, no binary, no 127.0.0.2).
    Setup(String),
    /// An oracle failed.
    Finding {
        /// The campaign's seed.
        seed: u64,
        /// The target being fuzzed.
        target: Target,
        /// The case that was sent last.
        case: u64,
        /// Which oracle failed and how.
        what: String,
        /// The last case's bytes, escaped.
        input: String,
        /// The bundle's stderr.
        stderr: String,
    },
}

impl fmt::Display for FuzzError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FuzzError::Setup(detail) => write!(f, "fuzz setup failed: {detail}"),
            FuzzError::Finding {
                seed,
                target,
                case,
                what,
                input,
                stderr,
            } => write!(
                f,
                "fuzz finding in {target} at case {case} (seed {seed}): {what}\n\
                 replay: cargo xtask fuzz --target {target} --seed {seed} --cases {}\n\
                 last input: {input}\n\
                 bundle stderr:\n{stderr}",
                case + 1,
                target = target.name(),
            ),
        }
    }
}

impl std::error::Error for FuzzError {}

/// Case `index` of `target` in campaign `seed`, for this bundle.
pub fn case(bundle: &Bundle, seed: u64, target: Target, index: u64) -> Case {
    let mut rng = Rng::for_case(seed, target.name(), index);
    match target {
        Target::Proxy => proxy::case(
            &mut rng,
            &ProxyHosts {
                allowed: bundle.allowed_authority(),
                denied: bundle.denied_authorities(),
            },
        ),
        Target::GitGate => gitgate::case(&mut rng, REPO),
        Target::Supervise => supervise::case(&mut rng, DENIED_HOST),
    }
}

/// Runs `campaign` against the `bottle-bundle` binary `bin`; `progress`
/// hears one line per batch.
pub fn run(
    bin: &Path,
    campaign: &Campaign,
    mut progress: impl FnMut(&str),
) -> Result<Vec<TargetSummary>, FuzzError> {
    let mut bundle = Bundle::start(bin)?;
    bundle
        .touch_canary()
        .map_err(|e| FuzzError::Setup(format!("the canary cannot be reached: {e}")))?;
    if !crate::eventually(Duration::from_secs(5), || bundle.canary_connections() == 1) {
        return Err(FuzzError::Setup(
            "the canary did not see its positive control".into(),
        ));
    }
    let mut summaries = Vec::new();
    for &target in &campaign.targets {
        summaries.push(run_target(&mut bundle, campaign, target, &mut progress)?);
    }
    Ok(summaries)
}

fn run_target(
    bundle: &mut Bundle,
    campaign: &Campaign,
    target: Target,
    progress: &mut impl FnMut(&str),
) -> Result<TargetSummary, FuzzError> {
    let limit = HEADER_READ_TIMEOUT + IDLE_TIMEOUT + MARGIN;
    let addr = match target {
        Target::Proxy => bundle.proxy,
        Target::GitGate => bundle.git_gate,
        Target::Supervise => bundle.supervise,
    };
    let started = Instant::now();
    let mut slowest_close = Duration::ZERO;
    let mut statuses = BTreeMap::new();
    let mut index = 0;
    loop {
        let more = match campaign.budget {
            Budget::Cases(n) => index < n,
            Budget::Time(t) => started.elapsed() < t,
        };
        if !more {
            break;
        }
        let case = case(bundle, campaign.seed, target, index);
        let sent = index;
        let finding = |bundle: &Bundle, what: String| FuzzError::Finding {
            seed: campaign.seed,
            target,
            case: sent,
            what,
            input: case
                .bytes
                .escape_ascii()
                .to_string()
                .chars()
                .take(4096)
                .collect(),
            stderr: bundle.stderr(),
        };
        let (pieces, pause, half_close) = match case.delivery {
            Delivery::Whole => (1, Duration::ZERO, HalfClose::Now),
            Delivery::AwaitReply => (1, Duration::ZERO, HalfClose::AfterReply),
            Delivery::Drip { pieces, pause } => (pieces, pause, HalfClose::Now),
            Delivery::HoldOpen => (1, Duration::ZERO, HalfClose::Never),
        };
        match exchange(addr, &case.bytes, pieces, pause, half_close, limit) {
            Ok(closed) => {
                slowest_close = slowest_close.max(closed.after);
                *statuses.entry(status_of(&closed.reply)).or_default() += 1;
            }
            Err(waited) => {
                return Err(finding(
                    bundle,
                    format!(
                        "the connection was still open {} ms after the last byte (bound {} ms: the daemon's timeouts plus margin)",
                        waited.as_millis(),
                        limit.as_millis()
                    ),
                ));
            }
        }
        if let Some(status) = bundle.exited() {
            return Err(finding(bundle, format!("bottle-bundle exited: {status}")));
        }
        let deaths = bundle.death_lines();
        if !deaths.is_empty() {
            return Err(finding(
                bundle,
                format!("a daemon died: {}", deaths.join(" | ")),
            ));
        }
        index += 1;
        if index % campaign.batch == 0 {
            check_batch(bundle, limit).map_err(|what| finding(bundle, what))?;
            progress(&format!(
                "{}: {index} cases, slowest close {} ms",
                target.name(),
                slowest_close.as_millis()
            ));
        }
    }
    check_batch(bundle, limit).map_err(|what| FuzzError::Finding {
        seed: campaign.seed,
        target,
        case: index.saturating_sub(1),
        what,
        input: String::new(),
        stderr: bundle.stderr(),
    })?;
    Ok(TargetSummary {
        target,
        cases: index,
        slowest_close,
        statuses,
    })
}

/// The status code a reply starts with, or `-`.
fn status_of(reply: &[u8]) -> String {
    reply
        .strip_prefix(b"HTTP/1.1 ".as_slice())
        .or_else(|| reply.strip_prefix(b"HTTP/1.0 ".as_slice()))
        .and_then(|rest| rest.get(..3))
        .map_or_else(
            || "-".to_string(),
            |code| String::from_utf8_lossy(code).into_owned(),
        )
}

/// The known-good requests every daemon must still answer, and the
/// policy oracles.
fn check_batch(bundle: &Bundle, limit: Duration) -> Result<(), String> {
    let allowed = bundle.allowed_authority();
    let upstream_before = bundle.upstream_connections();
    let checks = [
        (
            "proxy health",
            bundle.proxy,
            b"GET /__bottle/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        ),
        (
            "proxy to the allowed host",
            bundle.proxy,
            format!("GET http://{allowed}/ HTTP/1.1\r\nHost: {allowed}\r\nConnection: close\r\n\r\n")
                .into_bytes(),
        ),
        (
            "git-gate advertisement",
            bundle.git_gate,
            format!("GET /{REPO}.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: gate\r\nConnection: close\r\n\r\n")
                .into_bytes(),
        ),
        (
            "supervise tools/list",
            bundle.supervise,
            {
                let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
                format!(
                    "POST /mcp HTTP/1.1\r\nHost: bundle\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            },
        ),
    ];
    for (what, addr, request) in checks {
        // `Connection: close`: the daemon answers, then closes.
        let closed = exchange(addr, &request, 1, Duration::ZERO, HalfClose::Never, limit)
            .map_err(|waited| format!("{what}: no answer in {} ms", waited.as_millis()))?;
        if !closed.reply.starts_with(b"HTTP/1.1 200") {
            return Err(format!(
                "{what}: expected 200, got {} (audit: {})",
                closed
                    .reply
                    .escape_ascii()
                    .to_string()
                    .chars()
                    .take(300)
                    .collect::<String>(),
                bundle.audit_tail()
            ));
        }
    }
    if bundle.upstream_connections() <= upstream_before {
        return Err(
            "the allowed host's upstream saw no connection: the proxy forwards nothing".into(),
        );
    }
    // The positive control made the one connection the canary may have.
    let canary = bundle.canary_connections();
    if canary != 1 {
        return Err(format!(
            "the denied host's canary had {} connection(s) through the bundle",
            canary - 1
        ));
    }
    let wrong = bundle::wrong_allows(&bundle.audit_text().map_err(|e| e.to_string())?);
    if !wrong.is_empty() {
        return Err(format!(
            "audit allowed what the policy denies: {}",
            wrong.join(" | ")
        ));
    }
    let refs = bundle.forbidden_refs().map_err(|e| e.to_string())?;
    if !refs.is_empty() {
        return Err(format!(
            "the repository gained refs outside agent/*: {}",
            refs.join(" ")
        ));
    }
    Ok(())
}
