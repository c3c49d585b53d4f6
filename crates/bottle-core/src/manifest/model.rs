//! The manifest's data model: what `bottle.toml` may say, as serde types.
//!
//! Unknown keys are errors everywhere (`deny_unknown_fields`), so a misspelt
//! key never silently weakens a policy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::isolation::Isolation;
use crate::upstream_trust::UpstreamTrust;

/// The whole `bottle.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Manifest format version; only `1` exists.
    #[serde(default = "default_version")]
    pub version: u32,
    /// Agents by name (`[agents.<name>]`).
    pub agents: BTreeMap<String, Agent>,
}

fn default_version() -> u32 {
    1
}

/// One agent: what runs in the bottle and what it may reach.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    /// A local image reference (`name:tag` or `sha256:...`). Exactly one of
    /// `image` and `build` is required.
    pub image: Option<String>,
    /// A Dockerfile build context.
    pub build: Option<Build>,
    /// The agent's command (argv). Defaults to the image's entrypoint/cmd.
    #[serde(default)]
    pub command: Vec<String>,
    /// Extra environment for the agent. Must not set the proxy variables the
    /// backend owns.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A prompt file copied into the bottle (relative to the manifest).
    pub prompt: Option<String>,
    /// Skills directories copied into the bottle (relative to the manifest).
    #[serde(default)]
    pub skills: Vec<String>,
    /// Git repositories reached through git-gate.
    #[serde(default)]
    pub git: Vec<GitRepo>,
    /// The egress allowlist enforced by the bundle's proxy.
    #[serde(default)]
    pub egress: Egress,
    /// Credentials the bundle injects; the agent never holds them.
    #[serde(default)]
    pub credentials: Vec<Credential>,
    /// Device nodes requested from the host (globs against `/dev`).
    pub devices: Option<Vec<String>>,
    /// Extra device blacklist entries (can only add to the admin's list).
    #[serde(default)]
    pub devices_blacklist: Vec<String>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// The agent's ports published on the host's loopback: `8000` (the
    /// same port) or `"3000:13000"` (the agent's 3000 on the host's
    /// 13000).
    #[serde(default)]
    pub publish: Vec<super::endpoint::PublishEntry>,
    /// How many prepared bottles `bottle pool fill <agent>` keeps ready
    /// when it is given no count; with it set, each `start` that claims a
    /// pooled bottle refills the pool in the background.
    pub pool: Option<u32>,
    /// The box's isolation tier: `container` (runc, the default) or
    /// `gvisor` (the Engine's `runsc` runtime; docker backend only).
    #[serde(default)]
    pub isolation: Isolation,
}

/// A Dockerfile build context.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// The context directory (relative to the manifest).
    pub context: String,
    /// The Dockerfile, relative to the context. Default `Dockerfile`.
    pub dockerfile: Option<String>,
    /// Build arguments.
    #[serde(default)]
    pub args: BTreeMap<String, String>,
}

/// The egress allowlist.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// Exact hosts (`api.example.com`), suffix rules (`*.example.com`, which
    /// match subdomains only), or IP literals.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Destination ports the proxy lets through. Default `[443, 80]`.
    pub ports: Option<Vec<u16>>,
    /// Names pinned to addresses, like curl's `--resolve`: the bundle dials
    /// these instead of asking DNS. Each name must be an exact `allow` rule;
    /// the address is the operator's choice, so it may be private (an
    /// internal service) where a DNS answer could not be.
    #[serde(default)]
    pub resolve: BTreeMap<String, String>,
    /// PEM files of CAs the bundle trusts for upstream TLS besides its
    /// roots (relative to the manifest, or absolute; `~/` expands): a
    /// network that re-signs TLS needs its CA here.
    #[serde(default)]
    pub upstream_ca: Vec<String>,
    /// Which roots the bundle trusts for upstream TLS: `web` (the
    /// compiled-in web roots), `system` (the host's store) or
    /// `web+system`. Unset: `BOTTLE_UPSTREAM_TRUST`, else `web`.
    pub upstream_trust: Option<UpstreamTrust>,
    /// What a secret found in a request to a host does, by `allow` rule:
    /// `block` (the default for every host) or `redact`.
    #[serde(default)]
    pub on_secret: BTreeMap<String, SecretAction>,
    /// Services on the host's loopback the agent may reach, `HOST:PORT`
    /// (`127.0.0.1:5432`, `localhost:11434`, `[::1]:8080`): relayed by the
    /// bundle, through the host, to exactly that port; the agent dials
    /// `host.bottle.internal` at the same port.
    #[serde(default)]
    pub host_services: Vec<String>,
    /// Pinned remote TCP destinations, `NAME:PORT` (`git.example.com:22`):
    /// the bundle resolves the name and relays the bytes unscanned; the
    /// agent dials the same name and port.
    #[serde(default)]
    pub tcp: Vec<String>,
}

/// What the bundle does with a request that carries a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretAction {
    /// Refuse the request (403), before any byte of the secret leaves.
    #[default]
    Block,
    /// Replace the secret by a marker of the same length and send the
    /// request on.
    Redact,
}

impl SecretAction {
    /// The manifest's spellings, for the schema check.
    pub const CHOICES: [&'static str; 2] = ["block", "redact"];
}

/// A credential the bundle injects into requests to one host.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// A name for plans and audit lines (never the secret).
    pub name: String,
    /// Where the secret comes from on the host.
    pub source: CredentialSource,
    /// The host whose requests get the header. Must be on the allowlist.
    pub host: String,
    /// The header to set, e.g. `x-api-key` or `authorization`.
    pub header: String,
    /// How the header value is built; `{}` is replaced by the secret.
    /// Default `{}`; e.g. `Bearer {}`.
    pub format: Option<String>,
}

/// Where a credential's secret lives on the host.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum CredentialSource {
    /// A file (relative to the manifest, or absolute; `~` expands).
    File(String),
    /// An environment variable of the `bottle` process.
    Env(String),
}

/// A git repository the agent may fetch from and push to via git-gate.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GitRepo {
    /// The name the agent sees (`<GIT_GATE_URL>/<name>.git`).
    pub name: String,
    /// The host-side URL or path of the real remote.
    pub url: String,
    /// `read-only` (default) or `read-write`.
    #[serde(default)]
    pub mode: GitMode,
    /// Globs of the refs the agent may push to (read-write only): branch
    /// globs, or full ref globs starting with `refs/`, the only way to
    /// allow tags (see [`push_glob`](super::push_glob)).
    #[serde(default)]
    pub push: Vec<String>,
    /// Allow non-fast-forward pushes to those refs.
    #[serde(default)]
    pub allow_force: bool,
    /// Allow deleting those refs.
    #[serde(default)]
    pub allow_delete: bool,
    /// A host-side file holding the remote's credential.
    pub credential: Option<String>,
}

/// Whether the agent may push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GitMode {
    /// Fetch only.
    #[default]
    ReadOnly,
    /// Fetch, and push to the refs `push` lists.
    ReadWrite,
}

/// Resource limits applied to the agent.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory, e.g. `"4g"`, `"512m"`. Default 4 GiB.
    pub memory: Option<String>,
    /// Maximum number of processes. Default 1024.
    pub pids: Option<u32>,
    /// CPUs (fractional allowed). Default: all.
    pub cpus: Option<f64>,
    /// The agent's writable layer, e.g. `"10g"`. Default: not capped by
    /// bottle (whatever the backend's storage gives).
    pub disk: Option<String>,
    /// Size at which the audit log rotates, e.g. `"64m"` (the default).
    pub audit_log: Option<String>,
}
