//! The plan: what a launch will do, shown to the operator before y/N and
//! stored in the bottle's state dir so `stop` and `cleanup` can find
//! everything a launch created.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::audit_files::DEFAULT_AUDIT_LOG_MAX_BYTES;
use crate::backend::BackendKind;
use crate::isolation::Isolation;
use crate::manifest::endpoint::HOST_SERVICES_NAME;
use crate::manifest::{HostService, Published, TcpDestination};
use crate::spec::{BottleSpec, DEFAULT_MEMORY_BYTES, DEFAULT_PIDS};
use crate::upstream_trust::UpstreamTrust;

/// Version of the serialized plan format.
pub const PLAN_VERSION: u32 = 1;

/// A credential as the plan shows it: never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedCredential {
    /// The credential's name.
    pub name: String,
    /// The host it is injected for.
    pub host: String,
    /// The header it is injected into.
    pub header: String,
}

/// A git repository as the plan shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRepo {
    /// The name the agent sees.
    pub name: String,
    /// `read-only` or `read-write`.
    pub mode: String,
    /// Globs of the refs the agent may push to (see
    /// [`manifest::push_glob`](crate::manifest::push_glob)).
    pub push: Vec<String>,
    /// What the manifest's `url` is; `None` in plans written before it was
    /// recorded, or for a host path that is no longer a repository.
    #[serde(default)]
    pub kind: Option<crate::checkout::RepoKind>,
    /// The host path, for a bare repository or a working checkout (a
    /// remote's URL is not shown: it may hold a credential).
    #[serde(default)]
    pub path: Option<String>,
}

impl PlannedRepo {
    /// What the plan says of the repository's kind: `: working checkout
    /// /srv/app, served through a mirror; ...`.
    fn describe(&self) -> String {
        use crate::checkout::RepoKind;
        let path = self.path.as_deref().unwrap_or_default();
        match self.kind {
            Some(RepoKind::Remote) => ": remote, mirrored by git-gate".into(),
            Some(RepoKind::Bare) => format!(": bare repository {path}, served as it is"),
            Some(RepoKind::Checkout) if self.mode == "read-write" => format!(
                ": working checkout {path}, served through a mirror; accepted pushes come back to it as refs"
            ),
            Some(RepoKind::Checkout) => {
                format!(": working checkout {path}, served through a mirror")
            }
            None => String::new(),
        }
    }
}

/// A device node the policy lets through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedDevice {
    /// The node's real path on the host.
    pub host_path: String,
    /// The path it appears at inside the bottle.
    pub container_path: String,
    /// One line for the plan: path, target and device number.
    pub summary: String,
}

/// A device the policy dropped, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedDevice {
    /// The path as requested or resolved.
    pub path: String,
    /// Why it was dropped.
    pub reason: String,
}

/// Everything a launch will do. `D` is what the backend resolved for it
/// (its typed plan data); a plan made before any backend saw it has `()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan<D = ()> {
    /// [`PLAN_VERSION`].
    pub version: u32,
    /// `bot-bottle-<slug>`.
    pub bottle: String,
    /// The slug.
    pub slug: String,
    /// The agent's name in the manifest.
    pub agent: String,
    /// The backend that will run it.
    pub backend: BackendKind,
    /// The box's isolation tier (`isolation` in the manifest).
    #[serde(default)]
    pub isolation: Isolation,
    /// The agent image (reference or image ID once built).
    pub image: String,
    /// The agent's command; empty means the image default.
    pub command: Vec<String>,
    /// Hosts the proxy lets through.
    pub egress_allow: Vec<String>,
    /// Ports the proxy lets through.
    pub egress_ports: Vec<u16>,
    /// Allowed names pinned to addresses (`egress.resolve`).
    #[serde(default)]
    pub egress_resolve: std::collections::BTreeMap<String, String>,
    /// The `allow` rules whose secrets are redacted, not blocked
    /// (`egress.on_secret`).
    #[serde(default)]
    pub egress_redact: Vec<String>,
    /// The roots the bundle trusts for upstream TLS besides `upstream_ca`.
    #[serde(default)]
    pub upstream_trust: UpstreamTrust,
    /// Extra CA files for upstream TLS, as the manifest names them.
    #[serde(default)]
    pub upstream_ca: Vec<String>,
    /// Credentials the bundle injects.
    pub credentials: Vec<PlannedCredential>,
    /// Repositories behind git-gate.
    pub git: Vec<PlannedRepo>,
    /// The agent's ports published on the host's loopback (`publish`),
    /// forwarded once the bottle runs.
    #[serde(default)]
    pub publish: Vec<Published>,
    /// Services on the host's loopback the agent reaches through the
    /// bundle (`egress.host_services`).
    #[serde(default)]
    pub host_services: Vec<HostService>,
    /// Remote TCP destinations the bundle relays, unscanned
    /// (`egress.tcp`).
    #[serde(default)]
    pub tcp: Vec<TcpDestination>,
    /// Device nodes passed through.
    pub devices: Vec<PlannedDevice>,
    /// Device requests the policy dropped.
    pub devices_dropped: Vec<DroppedDevice>,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Process limit.
    pub pids: u32,
    /// CPU limit, if any.
    pub cpus: Option<f64>,
    /// The cap on the agent's writable layer in bytes (`limits.disk`), if
    /// any; the backend's `disk` line says whether and how it holds.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// The bottle's state dir.
    pub state_dir: PathBuf,
    /// Size at which the bundle rotates the audit log (`limits.audit_log`).
    #[serde(default = "default_audit_log_max_bytes")]
    pub audit_log_max_bytes: u64,
    /// Backend-specific lines for the summary (label, value).
    pub backend_lines: Vec<(String, String)>,
    /// What the backend resolved at prepare and reads back at launch.
    pub backend_data: D,
}

fn default_audit_log_max_bytes() -> u64 {
    DEFAULT_AUDIT_LOG_MAX_BYTES
}

impl Plan {
    /// The backend-independent part of a plan. `memory_bytes` must already be
    /// validated (the manifest parser checks the size syntax).
    pub fn from_spec(spec: &BottleSpec, backend: BackendKind, memory_bytes: Option<u64>) -> Plan {
        let agent = &spec.agent;
        Plan {
            version: PLAN_VERSION,
            bottle: spec.name.clone(),
            slug: spec.slug.clone(),
            agent: spec.agent_name.clone(),
            backend,
            isolation: agent.isolation,
            image: agent
                .image
                .clone()
                .or_else(|| agent.build.as_ref().map(|b| format!("build {}", b.context)))
                .unwrap_or_default(),
            command: agent.command.clone(),
            egress_allow: agent.egress.allow.clone(),
            egress_ports: spec.egress_ports(),
            egress_resolve: agent.egress.resolve.clone(),
            egress_redact: agent
                .egress
                .on_secret
                .iter()
                .filter(|(_, action)| **action == crate::manifest::SecretAction::Redact)
                .map(|(host, _)| host.clone())
                .collect(),
            upstream_trust: spec.upstream_trust,
            upstream_ca: agent.egress.upstream_ca.clone(),
            credentials: agent
                .credentials
                .iter()
                .map(|c| PlannedCredential {
                    name: c.name.clone(),
                    host: c.host.clone(),
                    header: c.header.clone(),
                })
                .collect(),
            git: agent
                .git
                .iter()
                .map(|g| PlannedRepo {
                    name: g.name.clone(),
                    mode: match g.mode {
                        crate::manifest::GitMode::ReadOnly => "read-only".into(),
                        crate::manifest::GitMode::ReadWrite => "read-write".into(),
                    },
                    push: g.push.clone(),
                    kind: crate::checkout::RepoKind::of_url(&g.url),
                    path: (!crate::manifest::is_remote_git_url(&g.url)).then(|| g.url.clone()),
                })
                .collect(),
            publish: spec.published_ports(),
            host_services: spec.host_services(),
            tcp: spec.tcp_destinations(),
            devices: Vec::new(),
            devices_dropped: Vec::new(),
            memory_bytes: memory_bytes.unwrap_or(DEFAULT_MEMORY_BYTES),
            pids: agent.limits.pids.unwrap_or(DEFAULT_PIDS),
            cpus: agent.limits.cpus,
            disk_bytes: agent.disk_bytes(),
            state_dir: spec.state_dir.clone(),
            audit_log_max_bytes: agent
                .audit_log_bytes()
                .unwrap_or(DEFAULT_AUDIT_LOG_MAX_BYTES),
            backend_lines: Vec::new(),
            backend_data: (),
        }
    }

    /// This plan with the backend's resolved data.
    pub fn with_data<D>(self, backend_data: D) -> Plan<D> {
        Plan {
            version: self.version,
            bottle: self.bottle,
            slug: self.slug,
            agent: self.agent,
            backend: self.backend,
            isolation: self.isolation,
            image: self.image,
            command: self.command,
            egress_allow: self.egress_allow,
            egress_ports: self.egress_ports,
            egress_resolve: self.egress_resolve,
            egress_redact: self.egress_redact,
            upstream_trust: self.upstream_trust,
            upstream_ca: self.upstream_ca,
            credentials: self.credentials,
            git: self.git,
            publish: self.publish,
            host_services: self.host_services,
            tcp: self.tcp,
            devices: self.devices,
            devices_dropped: self.devices_dropped,
            memory_bytes: self.memory_bytes,
            pids: self.pids,
            cpus: self.cpus,
            disk_bytes: self.disk_bytes,
            state_dir: self.state_dir,
            audit_log_max_bytes: self.audit_log_max_bytes,
            backend_lines: self.backend_lines,
            backend_data,
        }
    }
}

impl<D> Plan<D> {
    /// What a secret in a request does, host by host: `block` unless the
    /// manifest says `redact` for the host.
    fn secret_actions(&self) -> String {
        if self.egress_redact.is_empty() {
            return "block (a request carrying one is refused)".into();
        }
        let blocked: Vec<&str> = self
            .egress_allow
            .iter()
            .filter(|h| !self.egress_redact.contains(h))
            .map(String::as_str)
            .collect();
        let mut out = format!("redact for {}", self.egress_redact.join(", "));
        if !blocked.is_empty() {
            out.push_str(&format!("; block for {}", blocked.join(", ")));
        }
        out
    }

    /// The summary the operator confirms with y/N.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |label: &str, value: &str| {
            let _ = writeln!(out, "  {label:<12} {value}");
        };
        line("bottle", &self.bottle);
        line("agent", &self.agent);
        line("backend", self.backend.as_str());
        line("isolation", self.isolation.describe());
        line("image", &self.image);
        line(
            "command",
            &if self.command.is_empty() {
                "(image default)".to_string()
            } else {
                self.command.join(" ")
            },
        );
        line(
            "egress",
            &if self.egress_allow.is_empty() {
                "nothing (deny all)".to_string()
            } else {
                self.egress_allow.join(", ")
            },
        );
        line(
            "ports",
            &self
                .egress_ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        );
        for (host, addr) in &self.egress_resolve {
            line("resolve", &format!("{host} -> {addr}"));
        }
        if !self.egress_allow.is_empty() {
            line("secrets", &self.secret_actions());
        }
        line(
            "upstream TLS",
            &self.upstream_trust.describe(&self.upstream_ca),
        );
        for cred in &self.credentials {
            line(
                "credential",
                &format!("{} -> {} ({})", cred.name, cred.host, cred.header),
            );
        }
        for repo in &self.git {
            let push = if repo.push.is_empty() {
                String::new()
            } else {
                format!(", push: {}", repo.push.join(", "))
            };
            line(
                "git",
                &format!("{} ({}{push}){}", repo.name, repo.mode, repo.describe()),
            );
        }
        for service in &self.host_services {
            line(
                "host service",
                &format!(
                    "{HOST_SERVICES_NAME}:{} -> this host's {} (relayed by the bundle, unscanned)",
                    service.port,
                    service.address()
                ),
            );
        }
        for destination in &self.tcp {
            line(
                "tcp",
                &format!(
                    "{} (resolved and dialled by the bundle, UNSCANNED)",
                    destination.address()
                ),
            );
        }
        for published in &self.publish {
            line(
                "publish",
                &format!(
                    "the agent's port {} on this host's 127.0.0.1:{}",
                    published.port, published.host_port
                ),
            );
        }
        for device in &self.devices {
            line("device", &device.summary);
        }
        for dropped in &self.devices_dropped {
            line("dropped", &format!("{} ({})", dropped.path, dropped.reason));
        }
        let cpus = self.cpus.map(|c| format!(", cpus {c}")).unwrap_or_default();
        line(
            "limits",
            &format!(
                "memory {} MiB, pids {}{cpus}",
                self.memory_bytes >> 20,
                self.pids
            ),
        );
        // A backend that resolved the plan says whether the cap holds on
        // its storage; before that, say what was asked and who decides.
        if !self.backend_lines.iter().any(|(label, _)| label == "disk") {
            line("disk", &match self.disk_bytes {
                Some(bytes) => format!(
                    "cap of {} asked (limits.disk); `bottle start` refuses the bottle where the storage cannot hold it",
                    crate::disk::format_size(bytes)
                ),
                None => "NOT capped by bottle (limits.disk not set; `bottle doctor` says what the storage allows)".to_string(),
            });
        }
        for (label, value) in &self.backend_lines {
            line(label, value);
        }
        line("state", &self.state_dir.display().to_string());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest;

    fn plan(limits: &str) -> Plan {
        let text = format!("[agents.a]\nimage = \"x\"\n{limits}");
        let m = manifest::parse(std::path::Path::new("bottle.toml"), &text).unwrap();
        let spec = BottleSpec::new(
            &m,
            std::path::Path::new("bottle.toml"),
            "a",
            None,
            std::path::Path::new("/s"),
        )
        .unwrap();
        Plan::from_spec(&spec, BackendKind::Docker, None)
    }

    fn disk_line(plan: &Plan) -> String {
        let rendered = plan.render();
        let lines: Vec<&str> = rendered
            .lines()
            .filter(|l| l.trim_start().starts_with("disk "))
            .collect();
        assert_eq!(lines.len(), 1, "{rendered}");
        lines[0].trim_start().to_string()
    }

    fn secrets_line(plan: &Plan) -> Option<String> {
        plan.render()
            .lines()
            .find(|l| l.trim_start().starts_with("secrets "))
            .map(|l| {
                l.trim_start()
                    .trim_start_matches("secrets")
                    .trim()
                    .to_string()
            })
    }

    #[test]
    fn the_plan_says_what_a_secret_does_host_by_host() {
        assert_eq!(secrets_line(&plan("")), None, "nothing is allowed");
        let blocking = plan("egress.allow = [\"a.example\"]\n");
        assert_eq!(
            secrets_line(&blocking).as_deref(),
            Some("block (a request carrying one is refused)")
        );
        let mixed = plan(
            "egress.allow = [\"api.anthropic.com\", \"github.com\"]\n\
             egress.on_secret = { \"api.anthropic.com\" = \"redact\", \"github.com\" = \"block\" }\n",
        );
        assert_eq!(mixed.egress_redact, ["api.anthropic.com"]);
        assert_eq!(
            secrets_line(&mixed).as_deref(),
            Some("redact for api.anthropic.com; block for github.com")
        );
    }

    #[test]
    fn the_plan_names_every_port_and_relay() {
        let plan = plan(
            "publish = [8000, \"3000:13000\"]\n\
             egress.host_services = [\"localhost:11434\"]\n\
             egress.tcp = [\"git.example.com:22\"]\n",
        );
        let rendered = plan.render();
        for line in [
            "host service host.bottle.internal:11434 -> this host's localhost:11434 (relayed by the bundle, unscanned)",
            "tcp          git.example.com:22 (resolved and dialled by the bundle, UNSCANNED)",
            "publish      the agent's port 8000 on this host's 127.0.0.1:8000",
            "publish      the agent's port 3000 on this host's 127.0.0.1:13000",
        ] {
            assert!(rendered.contains(line), "{line}\n{rendered}");
        }
    }

    #[test]
    fn the_plan_always_has_one_disk_line() {
        assert!(
            disk_line(&plan("")).contains("NOT capped by bottle (limits.disk not set"),
            "{}",
            disk_line(&plan(""))
        );
        let capped = plan("limits.disk = \"10g\"\n");
        assert!(
            disk_line(&capped).contains("cap of 10 GiB asked"),
            "{}",
            disk_line(&capped)
        );
        let mut resolved = capped;
        resolved.backend_lines.push((
            "disk".into(),
            "capped at 10 GiB (overlay2 on xfs, pquota)".into(),
        ));
        assert_eq!(
            disk_line(&resolved),
            "disk         capped at 10 GiB (overlay2 on xfs, pquota)"
        );
    }
}
