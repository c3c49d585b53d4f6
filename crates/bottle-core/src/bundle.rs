//! The contract between a backend and the sidecar bundle it starts.
//!
//! The backend writes a [`BundleConfig`] as JSON into the bundle at
//! [`BUNDLE_CONFIG_PATH`]; the bundle binary reads it at start. Both sides
//! depend on this one definition so they cannot drift apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the bundle config format.
pub const BUNDLE_CONFIG_VERSION: u32 = 1;
/// Where the config lives inside the bundle.
pub const BUNDLE_CONFIG_PATH: &str = "/run/bottle/bundle.json";
/// Directory inside the bundle holding the config, CA and credential files.
pub const BUNDLE_RUN_DIR: &str = "/run/bottle";
/// Directory inside the bundle the audit log is written to (host-mounted).
pub const BUNDLE_LOG_DIR: &str = "/var/log/bottle";
/// The agent-facing proxy port.
pub const PROXY_PORT: u16 = 8888;
/// The agent-facing git-gate port.
pub const GIT_GATE_PORT: u16 = 9418;
/// The agent-facing supervise (MCP) port.
pub const SUPERVISE_PORT: u16 = 9100;
/// The line the bundle writes to its stderr once every listener is bound
/// and served (after the lines naming them): a launch that attached to the
/// bundle before starting it waits for this line instead of probing the
/// proxy through an exec, which costs two Engine round trips per probe.
pub const BUNDLE_READY_LINE: &str = "bottle-bundle: ready";
/// Where the bottle's request queue (`<state_dir>/requests` on the host) is
/// mounted inside the bundle.
pub const BUNDLE_REQUESTS_DIR: &str = "/run/bottle/requests";
/// Where the agent finds its MCP configuration naming supervise.
pub const AGENT_MCP_CONFIG: &str = "/etc/bottle/mcp.json";
/// Where the bottle's host-services directory (`<state_dir>/host-services`
/// on the host, [`host_services_dir`]) is mounted inside the bundle,
/// read-only: one unix socket per host service, served by the host.
pub const BUNDLE_HOST_SERVICES_DIR: &str = "/run/bottle/host-services";

/// The directory of a bottle's host-service sockets on the host.
pub fn host_services_dir(state_dir: &std::path::Path) -> std::path::PathBuf {
    state_dir.join("host-services")
}

/// The file name of the unix socket through which the bundle reaches the
/// host service on `port`, in [`host_services_dir`] (host) and
/// [`BUNDLE_HOST_SERVICES_DIR`] (bundle).
pub fn host_service_socket(port: u16) -> String {
    format!("{port}.sock")
}

/// Supervise's MCP endpoint for a bundle at `address` (an IP literal).
pub fn supervise_url(address: &str) -> String {
    format!("http://{address}:{SUPERVISE_PORT}/mcp")
}

/// The agent's MCP configuration (the `mcpServers` format Claude Code and
/// most MCP clients read) pointing at supervise on `address`.
pub fn mcp_config(address: &str) -> String {
    let config = serde_json::json!({
        "mcpServers": {
            "supervise": {
                "type": "http",
                "url": supervise_url(address),
            }
        }
    });
    format!("{config:#}\n")
}

/// A credential the bundle injects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleCredential {
    /// Name for audit lines.
    pub name: String,
    /// Requests to this host get the header.
    pub host: String,
    /// Header name.
    pub header: String,
    /// Value template; `{}` is replaced by the secret.
    pub format: String,
    /// File inside the bundle holding the secret.
    pub file: String,
}

/// Everything the bundle needs to enforce one bottle's policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleConfig {
    /// [`BUNDLE_CONFIG_VERSION`].
    pub version: u32,
    /// The bottle this bundle serves (for audit lines).
    pub bottle: String,
    /// The manifest's name for the bottle's agent, so that a denial tells
    /// the agent whose allowlist refused it and which section the operator
    /// would edit. Empty in configs written before it existed.
    #[serde(default)]
    pub agent: String,
    /// Proxy listen address, normally `0.0.0.0:8888`.
    pub proxy_listen: String,
    /// Allowlist rules: exact hosts, `*.suffix`, IP literals.
    pub allow: Vec<String>,
    /// Allowed destination ports.
    pub ports: Vec<u16>,
    /// Credentials to inject.
    pub credentials: Vec<BundleCredential>,
    /// PEM file of the per-bottle CA certificate.
    pub ca_cert: String,
    /// PEM file of the per-bottle CA private key (never leaves the bundle).
    pub ca_key: String,
    /// JSON-lines audit log file.
    pub audit_log: String,
    /// Host → IP overrides for upstream resolution (like curl's `--resolve`),
    /// used by tests to map names onto servers they started.
    #[serde(default)]
    pub resolve: BTreeMap<String, String>,
    /// `allow` rules whose requests have their secrets redacted (masked in
    /// place, the request sent on) instead of blocked.
    #[serde(default)]
    pub redact: Vec<String>,
    /// PEM files of roots the egress daemon trusts for upstream TLS: the
    /// manifest's `egress.upstream_ca` and, when asked, the host's system
    /// store (copied into the bundle).
    #[serde(default)]
    pub upstream_roots: Vec<String>,
    /// Whether the compiled-in web roots are trusted too; `false` when the
    /// operator asked for the system store alone (`upstream_trust =
    /// "system"`). Configs written before it existed trusted them.
    #[serde(default = "trust_web_roots")]
    pub upstream_web_roots: bool,
    /// DNS servers (`ip` or `ip:port`) the egress daemon asks for upstream
    /// names not in `resolve`. Empty: the bundle's `/etc/resolv.conf`.
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// Timeouts and size bounds; every field has a default, so configs
    /// written before these existed still load.
    #[serde(default)]
    pub limits: BundleLimits,
    /// Git-gate listen address, normally `0.0.0.0:9418`. `None`: the gate
    /// does not run (the manifest lists no repositories).
    #[serde(default)]
    pub git_gate_listen: Option<String>,
    /// The repositories git-gate serves.
    #[serde(default)]
    pub git: Vec<BundleGitRepo>,
    /// The program git-gate's `pre-receive` hook runs (`<program>
    /// git-hook`): a `bottle-bundle` binary. `None`: the running
    /// executable, which is right inside the bundle; tests that run the
    /// bundle library in-process name the built binary here.
    #[serde(default)]
    pub git_hook_program: Option<String>,
    /// Supervise (MCP) listen address, normally `0.0.0.0:9100`. `None`:
    /// supervise does not run.
    #[serde(default)]
    pub supervise_listen: Option<String>,
    /// The request queue supervise writes to and reads the operator's
    /// decisions from, normally [`BUNDLE_REQUESTS_DIR`] (a bind mount of
    /// the bottle's `<state_dir>/requests`). Required with
    /// `supervise_listen`.
    #[serde(default)]
    pub requests_dir: Option<String>,
    /// TCP relays: the host services and pinned TCP destinations of the
    /// manifest, each a listener of its own. Configs written before they
    /// existed have none.
    #[serde(default)]
    pub relays: Vec<BundleRelay>,
}

/// One TCP relay of the bundle: a listener on the agent-facing address at
/// the destination's port, each connection relayed to one destination and
/// nothing else, audited when it opens and when it closes (with bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleRelay {
    /// Where it listens: `<agent-facing address>:<port>`.
    pub listen: String,
    /// The destination's host, as the manifest names it (audit lines).
    pub host: String,
    /// The destination's port.
    pub port: u16,
    /// How the bundle reaches it.
    pub via: RelayVia,
}

/// How a relay reaches its destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RelayVia {
    /// A service on the host's loopback: through this unix socket, which
    /// the host serves and connects to exactly that port. The bundle has
    /// no route to the host.
    HostService {
        /// The socket inside the bundle.
        socket: String,
    },
    /// A remote destination: the bundle resolves `host` (the config's
    /// `resolve` first, then DNS, refusing the addresses egress refuses)
    /// and dials it at `port`. The bytes are not scanned.
    Tcp,
}

/// The relays of a bottle whose agent reaches its bundle at `listen_ip`:
/// one per host service, then one per pinned TCP destination, each on the
/// destination's port.
pub fn relays(
    listen_ip: std::net::Ipv4Addr,
    host_services: &[crate::manifest::HostService],
    tcp: &[crate::manifest::TcpDestination],
) -> Vec<BundleRelay> {
    let services = host_services.iter().map(|service| BundleRelay {
        listen: format!("{listen_ip}:{}", service.port),
        host: service.host.clone(),
        port: service.port,
        via: RelayVia::HostService {
            socket: format!(
                "{BUNDLE_HOST_SERVICES_DIR}/{}",
                host_service_socket(service.port)
            ),
        },
    });
    let remote = tcp.iter().map(|destination| BundleRelay {
        listen: format!("{listen_ip}:{}", destination.port),
        host: destination.host.clone(),
        port: destination.port,
        via: RelayVia::Tcp,
    });
    services.chain(remote).collect()
}

fn trust_web_roots() -> bool {
    true
}

/// One repository behind git-gate, as the bundle sees it.
///
/// Two kinds: a host-side bare repository that the backend bind-mounts at
/// `path_in_bundle` (`upstream` is `None`; the gate serves it directly), or
/// a remote (`upstream` is its URL, normally `https://...`): the gate keeps
/// a bare mirror at `path_in_bundle`, fetches into it before serving, and
/// forwards accepted pushes to the upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleGitRepo {
    /// The name the agent sees (`<GIT_GATE_URL>/<name>.git`).
    pub name: String,
    /// The bare repository inside the bundle: the bind mount
    /// (`/run/bottle/git/<name>.git`) or the mirror
    /// (`/var/lib/bottle/git/<name>.git`).
    pub path_in_bundle: String,
    /// The remote's URL when the gate mirrors it; `None` for a host-side
    /// bare repository.
    #[serde(default)]
    pub upstream: Option<String>,
    /// Whether the agent may push.
    #[serde(default)]
    pub mode: crate::manifest::GitMode,
    /// Ref globs the agent may push to: `agent/*` matches branches
    /// (`refs/heads/agent/x`); a glob starting with `refs/` matches full ref
    /// names, and is the only way to allow tags (`refs/tags/v*`).
    #[serde(default)]
    pub push: Vec<String>,
    /// Allow non-fast-forward updates of the pushable refs.
    #[serde(default)]
    pub allow_force: bool,
    /// Allow deleting the pushable refs.
    #[serde(default)]
    pub allow_delete: bool,
    /// File inside the bundle holding the upstream's credential (mirror
    /// mode only). One line: `user:token` (sent as HTTP Basic), a bare
    /// token (Basic with user `x-access-token`, GitHub's convention), or a
    /// whole `Authorization: ...` header line.
    #[serde(default)]
    pub credential_file: Option<String>,
}

/// Bounds the bundle enforces on every connection. Tests shorten them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BundleLimits {
    /// Largest request head (request line + headers) accepted; larger gets 431.
    pub max_header_bytes: usize,
    /// Connections the proxy serves at once; more wait in the accept backlog.
    pub max_connections: usize,
    /// Time a client has to send a complete request head (slowloris bound),
    /// also the keep-alive idle time between requests.
    pub header_read_timeout_ms: u64,
    /// Time a connection may see no bytes in either direction mid-request
    /// (e.g. a stalled body) before it is closed.
    pub idle_timeout_ms: u64,
    /// Time the egress daemon waits for an upstream TCP connect.
    pub connect_timeout_ms: u64,
    /// Restarts of one daemon tolerated within `restart_window_ms` before the
    /// bundle gives up and exits non-zero (fail closed).
    pub max_restarts: u32,
    /// Window for `max_restarts`.
    pub restart_window_ms: u64,
    /// Size at which the audit log is rotated; the bundle keeps
    /// [`AUDIT_GENERATIONS`](crate::audit_files::AUDIT_GENERATIONS) old ones,
    /// and the security-relevant lines of those it drops within
    /// [`KEPT_CAPS`](crate::audit_files::KEPT_CAPS) times this
    /// ([`audit_log_bound`](crate::audit_files::audit_log_bound)).
    pub audit_log_max_bytes: u64,
    /// The largest WebSocket message (and so frame) the agent may send; a
    /// larger one closes the socket with 1009.
    pub websocket_max_message_bytes: u64,
}

impl Default for BundleLimits {
    fn default() -> Self {
        Self {
            max_header_bytes: 32 * 1024,
            max_connections: 4096,
            header_read_timeout_ms: 30_000,
            idle_timeout_ms: 600_000,
            connect_timeout_ms: 10_000,
            max_restarts: 5,
            restart_window_ms: 60_000,
            audit_log_max_bytes: crate::audit_files::DEFAULT_AUDIT_LOG_MAX_BYTES,
            websocket_max_message_bytes: 16 << 20,
        }
    }
}
