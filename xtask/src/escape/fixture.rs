//! What the gate launches: the agent image's build context (the demo agent,
//! static busybox on an empty image) and the manifest naming one agent per
//! bottle the run starts, each with its own allowlist.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::process::workspace_root;

/// The DNS zone every test name lives in.
pub(crate) const ZONE: &str = super::dns::ZONE;

/// The name allowed to agent `agent`, answered with the internet canary.
pub(crate) fn allowed_host(agent: &str) -> String {
    format!("allowed-{}.{ZONE}", short(agent))
}

/// The name `agent`'s bundle holds a credential for, allowed and pinned
/// to the internet canary like [`allowed_host`].
pub(crate) fn credential_host(agent: &str) -> String {
    format!("cred-{}.{ZONE}", short(agent))
}

/// The name whose requests `agent`'s bundle redacts secrets from
/// (`on_secret = "redact"`), allowed and pinned to the internet canary
/// like [`allowed_host`].
pub(crate) fn redact_host(agent: &str) -> String {
    format!("redact-{}.{ZONE}", short(agent))
}

/// The header the bundle sets on the credential host's requests.
pub(crate) const CREDENTIAL_HEADER: &str = "x-bottle-canary-credential";

/// The repository every agent is served through its git-gate
/// (`$GIT_GATE_URL/probe.git`): read-write, pushes only to `agent/*`.
pub(crate) const GIT_REPO: &str = "probe";

/// The branch globs the agents may push to.
pub(crate) const GIT_PUSH: &str = "agent/*";

/// `agent`'s host-side bare repository under `git_root`.
pub(crate) fn git_repo_path(git_root: &Path, agent: &str) -> PathBuf {
    git_root.join(format!("{agent}.git"))
}

/// The rebinding name that resolves to `agent`'s own bundle.
pub(crate) fn rebind_bundle_host(agent: &str) -> String {
    format!("rebind-bundle-{}.{ZONE}", short(agent))
}

/// The rebinding names every probing agent is allowed (they resolve to
/// addresses egress must refuse to dial).
pub(crate) const REBIND_HOSTS: &[&str] = &[
    "rebind-loopback.bottle.test",
    "rebind-metadata.bottle.test",
    "rebind-private.bottle.test",
];

/// The `egress.tcp` name every probing agent gets: the run's DNS resolves
/// it to the pinned TCP canary, which the bundle relays to unscanned.
pub(crate) const PINNED_TCP_HOST: &str = "pinned-tcp.bottle.test";

/// Another canary host the run's DNS knows and no manifest names.
pub(crate) const OTHER_TCP_HOST: &str = "other-tcp.bottle.test";

/// The agent's port a publishing agent publishes on the host's loopback
/// (`publish = ["8000:<host port>"]`).
pub(crate) const PUBLISH_AGENT_PORT: u16 = 8000;

/// The agent key without the common prefix (`escape-a` -> `a`).
pub(crate) fn short(agent: &str) -> &str {
    agent.strip_prefix("escape-").unwrap_or(agent)
}

/// One agent of the run's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentDef {
    /// `[agents.<key>]`; also the bottle's name (`bot-bottle-<key>`).
    pub key: String,
    /// Whether its allowlist includes the rebinding names.
    pub rebind: bool,
    /// Whether it gets the run's host service (`egress.host_services`) and
    /// pinned TCP destination (`egress.tcp`).
    pub relays: bool,
    /// The host port its [`PUBLISH_AGENT_PORT`] is published on, if any.
    pub publish: Option<u16>,
}

/// Memory limit every agent gets.
pub(crate) const MEMORY: &str = "256m";
/// The same in bytes.
pub(crate) const MEMORY_BYTES: i64 = 256 << 20;
/// PID limit every agent gets.
pub(crate) const PIDS: i64 = 128;
/// The audit log's rotation size every agent gets: the least the manifest
/// takes, so the `audit-flood` probe's bounded flood passes it.
pub(crate) const AUDIT_LOG: &str = "1m";
/// The same in bytes.
pub(crate) const AUDIT_LOG_BYTES: u64 = 1 << 20;
/// Ports the proxy lets through.
pub(crate) const PORTS: &[u16] = &[80, 443];

/// Where the agents' image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentSource {
    /// Built by the backend from this context (docker).
    Build(PathBuf),
    /// An image the Engine already holds (smolmachines, which cannot build
    /// Dockerfiles itself).
    Image(String),
}

impl AgentSource {
    fn line(&self) -> String {
        match self {
            AgentSource::Build(context) => {
                format!(
                    "build = {{ context = {:?} }}",
                    context.display().to_string()
                )
            }
            AgentSource::Image(tag) => format!("image = {tag:?}"),
        }
    }
}

/// The manifest for `agents`, their image from `source`. Each agent's
/// allowed host and credential host are pinned to `pin` (the internet
/// canary), so the bundle never looks them up; the rebinding names are not
/// pinned and go through the Engine's resolver to the DNS recorder. The
/// credential's secret is read from `credential`. Each agent's git
/// repository is its bare repository under `git_root`. An agent with
/// relays may reach the host's `127.0.0.1:<host_service>` and
/// [`PINNED_TCP_HOST`] at [`canary::PINNED_TCP_PORT`](super::canary::PINNED_TCP_PORT).
/// With `gvisor`, every agent's box runs under gVisor.
pub(crate) fn manifest(
    source: &AgentSource,
    agents: &[AgentDef],
    pin: &str,
    credential: &Path,
    git_root: &Path,
    host_service: u16,
    gvisor: bool,
) -> String {
    let mut out =
        String::from("# Written by `cargo xtask sandbox-escape` for one run.\nversion = 1\n");
    for agent in agents {
        let mut allow = vec![
            allowed_host(&agent.key),
            credential_host(&agent.key),
            redact_host(&agent.key),
        ];
        if agent.rebind {
            allow.extend(REBIND_HOSTS.iter().map(|h| h.to_string()));
            allow.push(rebind_bundle_host(&agent.key));
        }
        let allow = allow
            .iter()
            .map(|h| format!("{h:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let ports = PORTS
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let publish = agent
            .publish
            .map(|host| format!("publish = [\"{PUBLISH_AGENT_PORT}:{host}\"]\n"))
            .unwrap_or_default();
        let relays = if agent.relays {
            format!(
                "host_services = [\"127.0.0.1:{host_service}\"]\ntcp = [\"{PINNED_TCP_HOST}:{}\"]\n",
                super::canary::PINNED_TCP_PORT
            )
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "\n[agents.{key}]\n{source}\ncommand = [\"/bin/sh\"]\n{publish}{isolation}\n\
             [agents.{key}.egress]\nallow = [{allow}]\nports = [{ports}]\nresolve = {{ {pinned:?} = {pin:?}, {cred:?} = {pin:?}, {redact:?} = {pin:?} }}\non_secret = {{ {redact:?} = \"redact\" }}\n{relays}\n\
             [[agents.{key}.credentials]]\nname = \"canary\"\nsource = {{ file = {file:?} }}\nhost = {cred:?}\nheader = \"{CREDENTIAL_HEADER}\"\n\n\
             [[agents.{key}.git]]\nname = \"{GIT_REPO}\"\nurl = {repo:?}\nmode = \"read-write\"\npush = [\"{GIT_PUSH}\"]\n\n\
             [agents.{key}.limits]\nmemory = \"{MEMORY}\"\npids = {PIDS}\naudit_log = \"{AUDIT_LOG}\"\n",
            key = agent.key,
            repo = git_repo_path(git_root, &agent.key).display().to_string(),
            pinned = allowed_host(&agent.key),
            cred = credential_host(&agent.key),
            redact = redact_host(&agent.key),
            file = credential.display().to_string(),
            source = source.line(),
            isolation = if gvisor {
                "isolation = \"gvisor\"\n"
            } else {
                ""
            },
        );
    }
    out
}

/// Writes the demo agent's build context into `dir`: the files of
/// `examples/demo-agent/` plus the host's static busybox.
pub(crate) fn write_context(dir: &Path) -> anyhow::Result<PathBuf> {
    let source = workspace_root().join("examples/demo-agent");
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(&source)
        .with_context(|| format!("could not read {}", source.display()))?
    {
        let entry = entry?;
        if entry.file_type()?.is_file() && entry.file_name() != ".gitignore" {
            std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
        }
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file());
    let Some(busybox) = busybox else {
        bail!("no static busybox for the demo agent image\n  fix: apt-get install busybox-static");
    };
    std::fs::copy(busybox, dir.join("busybox"))?;
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_gives_each_agent_its_own_allowlist() {
        let agents = [
            AgentDef {
                key: "escape-a".into(),
                rebind: true,
                relays: true,
                publish: Some(18000),
            },
            AgentDef {
                key: "escape-p1".into(),
                rebind: false,
                relays: false,
                publish: None,
            },
        ];
        let text = manifest(
            &AgentSource::Build("/tmp/ctx".into()),
            &agents,
            "198.51.100.10",
            Path::new("/tmp/credential"),
            Path::new("/tmp/git"),
            15432,
            false,
        );
        let expected = r#"# Written by `cargo xtask sandbox-escape` for one run.
version = 1

[agents.escape-a]
build = { context = "/tmp/ctx" }
command = ["/bin/sh"]
publish = ["8000:18000"]

[agents.escape-a.egress]
allow = ["allowed-a.bottle.test", "cred-a.bottle.test", "redact-a.bottle.test", "rebind-loopback.bottle.test", "rebind-metadata.bottle.test", "rebind-private.bottle.test", "rebind-bundle-a.bottle.test"]
ports = [80, 443]
resolve = { "allowed-a.bottle.test" = "198.51.100.10", "cred-a.bottle.test" = "198.51.100.10", "redact-a.bottle.test" = "198.51.100.10" }
on_secret = { "redact-a.bottle.test" = "redact" }
host_services = ["127.0.0.1:15432"]
tcp = ["pinned-tcp.bottle.test:7070"]

[[agents.escape-a.credentials]]
name = "canary"
source = { file = "/tmp/credential" }
host = "cred-a.bottle.test"
header = "x-bottle-canary-credential"

[[agents.escape-a.git]]
name = "probe"
url = "/tmp/git/escape-a.git"
mode = "read-write"
push = ["agent/*"]

[agents.escape-a.limits]
memory = "256m"
pids = 128
audit_log = "1m"

[agents.escape-p1]
build = { context = "/tmp/ctx" }
command = ["/bin/sh"]

[agents.escape-p1.egress]
allow = ["allowed-p1.bottle.test", "cred-p1.bottle.test", "redact-p1.bottle.test"]
ports = [80, 443]
resolve = { "allowed-p1.bottle.test" = "198.51.100.10", "cred-p1.bottle.test" = "198.51.100.10", "redact-p1.bottle.test" = "198.51.100.10" }
on_secret = { "redact-p1.bottle.test" = "redact" }

[[agents.escape-p1.credentials]]
name = "canary"
source = { file = "/tmp/credential" }
host = "cred-p1.bottle.test"
header = "x-bottle-canary-credential"

[[agents.escape-p1.git]]
name = "probe"
url = "/tmp/git/escape-p1.git"
mode = "read-write"
push = ["agent/*"]

[agents.escape-p1.limits]
memory = "256m"
pids = 128
audit_log = "1m"
"#;
        assert_eq!(text, expected);
    }

    #[test]
    fn the_manifest_parses_with_the_real_parser() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bottle.toml");
        std::fs::write(dir.path().join("credential"), "secret").unwrap();
        // The gate seeds the bare repositories before it starts a bottle;
        // a manifest naming a missing one does not load.
        let bare = dir.path().join("git/escape-a.git");
        for d in ["objects", "refs"] {
            std::fs::create_dir_all(bare.join(d)).unwrap();
        }
        std::fs::write(bare.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let agents = [AgentDef {
            key: "escape-a".into(),
            rebind: true,
            relays: true,
            publish: Some(18000),
        }];
        std::fs::write(
            &path,
            manifest(
                &AgentSource::Build(dir.path().to_path_buf()),
                &agents,
                "198.51.100.10",
                &dir.path().join("credential"),
                &dir.path().join("git"),
                15432,
                false,
            ),
        )
        .unwrap();
        let parsed = bottle_core::manifest::load(&path).unwrap();
        let agent = &parsed.agents["escape-a"];
        assert_eq!(agent.egress.allow.len(), 7);
        assert_eq!(agent.credentials[0].host, "cred-a.bottle.test");
        let git = &agent.git[0];
        assert_eq!(git.name, GIT_REPO);
        assert_eq!(
            git.url,
            dir.path().join("git/escape-a.git").display().to_string()
        );
        assert_eq!(git.mode, bottle_core::manifest::GitMode::ReadWrite);
        assert_eq!(git.push, [GIT_PUSH]);
        assert_eq!(agent.limits.pids, Some(128));
        assert_eq!(agent.egress.host_services.len(), 1);
        assert_eq!(agent.egress.tcp.len(), 1);
        assert_eq!(agent.publish.len(), 1);
        std::fs::write(
            &path,
            manifest(
                &AgentSource::Image("bottle-escape-agent:latest".into()),
                &agents,
                "198.51.100.10",
                &dir.path().join("credential"),
                &dir.path().join("git"),
                15432,
                false,
            ),
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\nimage = \"bottle-escape-agent:latest\"\n"),
            "{text}"
        );
        let parsed = bottle_core::manifest::load(&path).unwrap();
        assert_eq!(
            parsed.agents["escape-a"].isolation,
            bottle_core::isolation::Isolation::Container
        );
        // The gVisor run's: every agent under gVisor, nothing else changed.
        std::fs::write(
            &path,
            manifest(
                &AgentSource::Build(dir.path().to_path_buf()),
                &agents,
                "198.51.100.10",
                &dir.path().join("credential"),
                &dir.path().join("git"),
                15432,
                true,
            ),
        )
        .unwrap();
        let parsed = bottle_core::manifest::load(&path).unwrap();
        let agent = &parsed.agents["escape-a"];
        assert_eq!(agent.isolation, bottle_core::isolation::Isolation::Gvisor);
        assert_eq!(agent.egress.allow.len(), 7);
    }
}
