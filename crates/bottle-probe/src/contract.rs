//! The harness ⇄ probe contract. The harness (xtask) writes a [`ProbeConfig`]
//! as JSON, copies it and the static probe into the bottle, runs
//! `bottle-probe --config FILE`, and reads one [`ProbeResult`] per line from
//! stdout. The same binary and config run on the host as the positive
//! control (`control: true`): there every network probe must *reach* its
//! canary, or the run fails.

use serde::{Deserialize, Serialize};

/// What the harness tells the probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeConfig {
    /// The run's secret token: every canary listener answers with it, so a
    /// probe that sees it in a reply has reached a canary.
    pub token: String,
    /// Run on the host as the positive control: only the network probes
    /// run, and the expected outcome is "reached".
    #[serde(default)]
    pub control: bool,
    /// Run only these probes (by name); empty: all.
    #[serde(default)]
    pub only: Vec<String>,
    /// Leave these probes out (by name), after `only`.
    #[serde(default)]
    pub skip: Vec<String>,
    /// The bottle's isolation tier (`container`, `gvisor`; empty:
    /// `container`). Where a limit is enforced differently under gVisor,
    /// the probe reads it where gVisor keeps it.
    #[serde(default)]
    pub isolation: String,
    /// Per-attempt timeout in milliseconds (connects, reads).
    pub timeout_ms: u64,
    /// The addresses and names the probes aim at.
    pub targets: Targets,
}

/// Every canary and bottle address the probes aim at. All are on this
/// machine: TEST-NET addresses on the harness's canary interface, host
/// loopback, the Docker bridges of the run's bottles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Targets {
    /// "The internet": TCP 80/443/8443 answer HTTP with the token, UDP
    /// 5353 echoes the token (e.g. `198.51.100.10`).
    pub internet_v4: String,
    /// "The internet" over IPv6, TCP 80 (e.g. `2001:db8::10`).
    pub internet_v6: String,
    /// The metadata address, held locally by the harness
    /// (`169.254.169.254`, TCP 80).
    pub metadata: String,
    /// A private-range address held locally (TCP 80).
    pub private: String,
    /// The recording DNS server (UDP/TCP 53); any query it records from a
    /// bottle is an escape. `ip` (port 53) or `ip:port`.
    pub dns_server: String,
    /// A TCP port listening on the host's 127.0.0.1.
    pub host_loopback_port: u16,
    /// A TCP port listening on the host's 0.0.0.0 (reachable on every host
    /// address, including Docker bridge gateways).
    pub host_any_port: u16,
    /// The bottle's Docker gateway / host-side address of its network
    /// (empty when the network has none, as on the docker backend).
    #[serde(default)]
    pub gateway: String,
    /// This bottle's bundle IP.
    pub own_bundle: String,
    /// Another bottle's bundle IP (a second bottle of the same run).
    pub other_bundle: String,
    /// Another bottle's agent IP.
    #[serde(default)]
    pub other_agent: String,
    /// The proxy URL as the agent sees it (`http://<bundle>:8888`).
    pub proxy: String,
    /// An allowlisted host pinned to `internet_v4`; `http://<it>/` through
    /// the proxy answers with the token (the proxy's positive control).
    pub allowed_host: String,
    /// A host the manifest does not allow.
    pub denied_host: String,
    /// An allowlisted host, pinned to `internet_v4`, for which the bundle
    /// holds a credential: the secret may only ever travel over TLS to it
    /// (empty: no credential probes).
    #[serde(default)]
    pub credential_host: String,
    /// An allowlisted host, pinned to `internet_v4`, whose requests the
    /// bundle redacts (`on_secret = "redact"`): a secret in one goes on
    /// masked (empty: no redaction probes).
    #[serde(default)]
    pub redact_host: String,
    /// The bottle's supervise endpoint as the agent sees it
    /// (`http://<bundle>:9100/mcp`; empty: no supervise probes).
    #[serde(default)]
    pub supervise_url: String,
    /// The bottle's git-gate base URL as the agent sees it
    /// (`$GIT_GATE_URL`, `http://<bundle>:9418`; empty: no git probes).
    #[serde(default)]
    pub git_gate_url: String,
    /// The repository the git probes push to, served read-write with
    /// `push = ["agent/*"]` (`<git_gate_url>/<git_repo>.git`).
    #[serde(default)]
    pub git_repo: String,
    /// Allowed names the run's resolver maps to forbidden addresses:
    /// loopback, metadata, the bundle itself, a private range.
    pub rebind_hosts: Vec<String>,
    /// Names whose lookups the DNS canary records if they get out.
    pub canary_names: Vec<String>,
    /// The port of the host loopback service the manifest names
    /// (`egress.host_services`): in a bottle, reached only at
    /// [`HOST_SERVICES_NAME`]`:<port>` through the bundle's relay; on the
    /// host, at `127.0.0.1:<port>` (0: no host-service probes).
    #[serde(default)]
    pub host_service_port: u16,
    /// The port of a second host loopback service, one the manifest does
    /// not name: unreachable from a bottle by any address.
    #[serde(default)]
    pub host_service_unnamed_port: u16,
    /// The manifest's `egress.tcp` name: the box's `/etc/hosts` points it
    /// at the bundle, which resolves it (the run's DNS gives it
    /// [`Targets::pinned_tcp_addr`]) and relays to it (empty: no pinned-TCP
    /// probes).
    #[serde(default)]
    pub pinned_tcp_host: String,
    /// The canary address the pinned name resolves to.
    #[serde(default)]
    pub pinned_tcp_addr: String,
    /// The pinned destination's port (a canary answering with the token).
    #[serde(default)]
    pub pinned_tcp_port: u16,
    /// Another port on [`Targets::pinned_tcp_addr`], which the manifest
    /// does not name (a canary listens there too).
    #[serde(default)]
    pub pinned_tcp_other_port: u16,
    /// Another canary host no manifest names (the run's DNS knows it),
    /// listening at [`Targets::pinned_tcp_port`].
    #[serde(default)]
    pub other_tcp_host: String,
    /// Its address.
    #[serde(default)]
    pub other_tcp_addr: String,
}

/// The name a box reaches the host's services at (`egress.host_services`;
/// bottle-core's `HOST_SERVICES_NAME`, repeated here: the probe depends on
/// nothing else in the workspace).
pub const HOST_SERVICES_NAME: &str = "host.bottle.internal";

/// What a box-side listener started with `bottle-probe --child serve`
/// answers each connection with (the published-port rows).
pub fn serve_reply(token: &str) -> String {
    format!("bottle-canary {token} published\n")
}

/// What counts as blocked for a probe, as one word for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The attempt was refused, timed out, or never got an answer carrying
    /// the token.
    Blocked,
    /// The attempt reached its target (an escape inside a bottle; the
    /// expected result for a control).
    Reached,
    /// The probe could not run its attempt at all (a harness problem, not a
    /// verdict); the harness treats it as a failed run.
    Error,
}

/// One line of the probe's stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// Stable probe name, e.g. `tcp-internet-v4`.
    pub probe: String,
    /// Category: `network`, `dns`, `proxy`, `filesystem`, `kernel`,
    /// `privilege`, `resources`, `secrets`, `operator`, `copy`, `git`,
    /// `audit`.
    pub category: String,
    /// What was attempted and what counts as blocked, for the report.
    pub expected: String,
    /// The outcome.
    pub outcome: Outcome,
    /// What actually happened (the error, the status, the bytes seen).
    pub observed: String,
    /// Whether the probe is a network probe (the control runs only these).
    pub network: bool,
}

/// Text an agent plants for the operator's terminal (`operator-hostile-text`):
/// a screen clear through the C1 CSI byte, an OSC title through the C1 OSC
/// and ST bytes, an OSC 8 hyperlink, a right-to-left override, an isolate,
/// line and paragraph separators, BEL and DEL, and text that does not show:
/// zero-width space and joiner, word joiner, byte-order mark, soft hyphen, a
/// message in tag characters and private-use characters. The harness reads
/// them back through `bottle requests` and `bottle logs`, where none may
/// come out raw.
pub const HOSTILE_TEXT: &[&str] = &[
    "\u{9b}2J\u{202e}moc.live",
    "\u{9d}0;owned\u{9c}\u{2066}ok\u{2069}",
    "\u{1b}]8;;http://x/\u{1b}\\click\u{1b}]8;;\u{1b}\\\u{2028}\u{2029}\u{7}\u{7f}",
    "pay\u{200b}pal\u{200d}\u{2060}\u{feff}.com\u{ad}\u{e0068}\u{e0069}\u{e007f}\u{e000}\u{f0000}",
];

/// The host the planted `request_egress` asks for (so the harness can tell
/// that the operator's listing shows the planted request).
pub const HOSTILE_EGRESS_HOST: &str = "hostile-text.bottle.test";

/// The characters of [`HOSTILE_TEXT`] that act on a terminal or do not
/// show; none may reach the operator's output raw.
pub const TERMINAL_ACTIVE: &[char] = &[
    '\u{1b}',
    '\u{7}',
    '\u{7f}',
    '\u{9b}',
    '\u{9c}',
    '\u{9d}',
    '\u{202e}',
    '\u{2066}',
    '\u{2069}',
    '\u{2028}',
    '\u{2029}',
    '\u{200b}',
    '\u{200d}',
    '\u{2060}',
    '\u{feff}',
    '\u{ad}',
    '\u{e0068}',
    '\u{e0069}',
    '\u{e007f}',
    '\u{e000}',
    '\u{f0000}',
];

/// The ref the git probe `kind` creates (`control`: the plain push that
/// must land; `signed`: the one wrapped in a push certificate, which must
/// not), named after the run's token so the harness can look for it in
/// the host's bare repository: `refs/heads/agent/probe-<kind>-<token>`.
pub fn git_probe_ref(kind: &str, token: &str) -> String {
    format!("refs/heads/agent/probe-{kind}-{}", run_tag(token))
}

/// The path of every request in the audit-flood probe's identical run
/// (`audit-flood`): the harness finds the run's records in the bottle's
/// audit log by it and checks that they were coalesced into counted ones.
pub const AUDIT_FLOOD_SAME_PATH: &str = "/bottle-probe/audit-flood-same";

/// The start of the paths of the audit-flood probe's denials to distinct
/// hosts: the harness finds their records by it and checks that they were
/// merged.
pub const AUDIT_FLOOD_DENY_PREFIX: &str = "/bottle-probe/audit-flood/deny/";

/// The start of the paths of the audit-flood probe's allowed requests,
/// each with a method of its own, which no merging can save: they fill the
/// log past its whole stream, so that rotation drops what came before.
pub const AUDIT_FLOOD_ROTATE_PREFIX: &str = "/bottle-probe/audit-flood/rotate/";

/// Where `cp-plant` plants what the harness then copies with the real
/// `bottle cp`, both ways.
pub const CP_DIR: &str = "/tmp/bottle-cp-probe";

/// A plain directory in [`CP_DIR`]: the copies in to it are the controls.
pub const CP_PLAIN_IN: &str = "plain-in";

/// The links `cp-plant` makes in [`CP_DIR`] (name, target): to what bottle
/// owns in the box, and to the directory above it. A copy in through any
/// of them must be refused and change nothing there.
pub const CP_LINKS: &[(&str, &str)] = &[
    ("to-etc-bottle", "/etc/bottle"),
    ("to-dot-bottle", "/.bottle"),
    ("to-etc", "/etc"),
];

/// Trees in [`CP_DIR`] the harness copies out, each holding
/// [`CP_DATA`] (the run's token): a plain one (the control), one with a
/// link out of it (`abs` to `/etc/passwd`, `up` climbing out), one with a
/// fifo, and one with a set-uid file ([`CP_SETUID_FILE`]).
pub const CP_OUT_PLAIN: &str = "out-plain";
/// See [`CP_OUT_PLAIN`].
pub const CP_OUT_LINK: &str = "out-link";
/// See [`CP_OUT_PLAIN`].
pub const CP_OUT_FIFO: &str = "out-fifo";
/// See [`CP_OUT_PLAIN`].
pub const CP_OUT_SETUID: &str = "out-setuid";
/// The file of the run's token in each tree of [`CP_OUT_PLAIN`].
pub const CP_DATA: &str = "data";
/// The set-uid file in [`CP_OUT_SETUID`].
pub const CP_SETUID_FILE: &str = "tool";

/// The fake AWS access key id `proxy-secret-split` sends in two chunks of
/// one body: `AKIA` and 16 upper-case letters and digits drawn from the
/// run's token, so it is new each run and the harness can look for it.
pub fn split_secret(token: &str) -> String {
    run_secret(RunSecret::Split, token)
}

/// The probes that send a per-run fake key the harness then looks for at
/// the canaries, each its own key and lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSecret {
    /// `proxy-secret-split`: a body's two chunks.
    Split,
    /// `proxy-websocket-secret` and `-split`: a WebSocket message.
    WebSocket,
    /// `proxy-redact-secret`: a body to the host that redacts.
    Redact,
}

impl RunSecret {
    fn salt(self) -> &'static str {
        match self {
            Self::Split => "split",
            Self::WebSocket => "websocket",
            Self::Redact => "redact",
        }
    }
}

/// `kind`'s fake AWS access key id for the run: `AKIA` and 16 upper-case
/// letters and digits drawn from the token.
pub fn run_secret(kind: RunSecret, token: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let salt = format!("{}-secret", kind.salt());
    let mut next = seeded(&salt, token);
    let tail: String = (0..16)
        .map(|_| char::from(ALPHABET[(next() % ALPHABET.len() as u64) as usize]))
        .collect();
    format!("AKIA{tail}")
}

/// What `kind`'s probe sends just before its key: a field naming the run,
/// then `aws_access_key_id=`.
pub fn run_secret_lead(kind: RunSecret, token: &str) -> String {
    format!(
        "probe={}-{}&aws_access_key_id=",
        kind.salt(),
        run_tag(token)
    )
}

/// What the harness looks for at the canaries: `kind`'s lead and its key's
/// first byte, on the wire exactly when a byte of the key got through.
pub fn run_secret_wire_needle(kind: RunSecret, token: &str) -> String {
    format!(
        "{}{}",
        run_secret_lead(kind, token),
        &run_secret(kind, token)[..1]
    )
}

/// The marker a redacted secret starts with (the bundle's
/// `scan::MARKER`): after [`run_secret_lead`] at the canary, it shows the
/// request arrived with the key masked.
pub const REDACTION_MARKER: &str = "REDACTED";

/// The path a canary answers with what it received (the request's body,
/// or a WebSocket's messages echoed), so a probe can see what arrived.
pub const ECHO_PATH: &str = "/bottle-probe/echo";

/// How many bytes of [`split_secret`] the first chunk carries.
pub const SPLIT_SECRET_FIRST: usize = 10;

/// What the first chunk carries just before the split key: a field naming
/// the run, then `aws_access_key_id=`.
pub fn split_secret_lead(token: &str) -> String {
    run_secret_lead(RunSecret::Split, token)
}

/// The run's token as a name part: its first 24 letters and digits, lower
/// case.
fn run_tag(token: &str) -> String {
    token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(24)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// What the harness looks for at the canaries: [`split_secret_lead`] and
/// the key's first byte. The bytes stream in order, so this is on the wire
/// exactly when a byte of the key's first half got through.
pub fn split_secret_wire_needle(token: &str) -> String {
    run_secret_wire_needle(RunSecret::Split, token)
}

/// A deterministic stream of pseudo-random numbers for `token` (FNV-1a of
/// `salt` and the token, then SplitMix64): the same run gets the same
/// values, another run different ones.
pub(crate) fn seeded(salt: &str, token: &str) -> impl FnMut() -> u64 {
    let mut state = 0xcbf2_9ce4_8422_2325_u64;
    for b in salt.bytes().chain([0]).chain(token.bytes()) {
        state = (state ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
