//! Semantic checks on a deserialised manifest: the rules serde types cannot
//! express (version, names, host rules, paths that must exist, limits).
//!
//! Every check records a [`Problem`] located by field path; the earliest in
//! the document wins, so the operator fixes problems top to bottom. Checks
//! that compare two parts of the manifest (a credential's host against the
//! allowlist) run only once every part is valid on its own, so their advice
//! never points at a value that is itself wrong.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::codes;
#[cfg(doc)]
use super::endpoint::HOST_SERVICES_NAME;
use super::endpoint::{EndpointError, HostService, PublishEntry, Published, TcpDestination};
use super::host::{HostRule, HostRuleError};
use super::paths::{self, Expect};
use super::push_glob::push_glob_problem;
use super::span::{Doc, FieldPath};
use super::{
    Agent, Credential, CredentialSource, GitMode, Manifest, Problem, parse_memory, resolve_path,
};
use crate::bundle::{GIT_GATE_PORT, PROXY_PORT, SUPERVISE_PORT};
use crate::slug;

/// The fix for a loopback address where the operator meant the host's
/// (it names [`HOST_SERVICES_NAME`], a test checks).
const LOOPBACK_FIX: &str = "to reach a service on this host's loopback, list it in \
     egress.host_services, e.g. [\"127.0.0.1:5432\"]: the agent reaches it at \
     host.bottle.internal:5432";

/// The smallest audit log rotation size: room for many bounded records
/// (each at most a few KiB) between rotations.
const MIN_AUDIT_LOG_BYTES: u64 = 1 << 20;
/// The smallest memory limit a bottle may have.
pub const MIN_MEMORY_BYTES: u64 = 64 << 20;
/// The smallest writable-layer cap a bottle may have: less does not hold
/// an agent's own tool caches, so the bottle would fail in confusing ways.
pub const MIN_DISK_BYTES: u64 = 256 << 20;
/// The smallest process limit a bottle may have.
pub const MIN_PIDS: u32 = 16;

/// Which span of a located path a problem points at.
#[derive(Clone, Copy)]
enum On {
    Key,
    Value,
}

struct Checks<'a, 'i> {
    doc: &'a Doc<'i>,
    base_dir: &'a Path,
    found: Vec<Problem>,
}

/// The first problem of `manifest` in document order, if any.
pub(crate) fn validate(manifest: &Manifest, doc: &Doc<'_>, base_dir: &Path) -> Option<Problem> {
    let mut checks = Checks {
        doc,
        base_dir,
        found: Vec::new(),
    };
    checks.manifest(manifest);
    if checks.found.is_empty() {
        for (name, agent) in &manifest.agents {
            let path = FieldPath::root().key("agents").key(name);
            checks.credential_hosts(&path, agent);
            checks.resolve(&path.key("egress"), agent);
            checks.on_secret(&path.key("egress"), agent);
        }
    }
    checks
        .found
        .into_iter()
        .min_by_key(|p| p.span.as_ref().map_or(usize::MAX, |s| s.start))
}

impl Checks<'_, '_> {
    /// The span for a path, walking up to the nearest ancestor that is in
    /// the text when the path itself is a default.
    fn span(&self, path: &FieldPath, on: On) -> Option<Range<usize>> {
        let mut path = path.clone();
        loop {
            if let Some(found) = self.doc.locate(&path) {
                return Some(match on {
                    On::Key => found.key.unwrap_or(found.value),
                    On::Value => found.value,
                });
            }
            if !path.pop() {
                return None;
            }
        }
    }

    fn report(
        &mut self,
        code: &'static str,
        path: FieldPath,
        on: On,
        message: String,
        fix: String,
    ) {
        let span = self.span(&path, on);
        self.found
            .push(Problem::new(code, path, span, message, fix));
    }

    fn manifest(&mut self, manifest: &Manifest) {
        let root = FieldPath::root();
        if manifest.version != 1 {
            self.report(
                codes::VERSION,
                root.key("version"),
                On::Value,
                format!("version {} is not supported", manifest.version),
                "set version = 1".into(),
            );
        }
        if manifest.agents.is_empty() {
            self.report(
                codes::NO_AGENTS,
                root.key("agents"),
                On::Value,
                "no agents defined".into(),
                "add an agent table, e.g. [agents.claude] with image = \"my-agent:latest\"".into(),
            );
        }
        for (name, agent) in &manifest.agents {
            let path = root.key("agents").key(name);
            if slug::slugify(name).is_err() {
                self.report(
                    codes::AGENT_NAME,
                    path.clone(),
                    On::Key,
                    format!("agent name {name:?} has no letters or digits"),
                    "name the agent with letters, digits and dashes, e.g. [agents.claude]".into(),
                );
            }
            self.agent(&path, agent);
        }
    }

    fn agent(&mut self, path: &FieldPath, agent: &Agent) {
        self.image(path, agent);
        for (i, arg) in agent.command.iter().enumerate() {
            if arg.is_empty() {
                let what = if i == 0 {
                    "the program name is empty".to_string()
                } else {
                    format!("command argument {i} is empty")
                };
                self.report(
                    codes::EMPTY_ARGUMENT,
                    path.key("command").index(i),
                    On::Value,
                    what,
                    "remove the empty string, or write the argument you meant".into(),
                );
            }
        }
        for key in agent.env.keys() {
            self.env_key(&path.key("env").key(key), key);
        }
        self.host_paths(path, agent);
        self.egress(&path.key("egress"), agent);
        self.credentials(&path.key("credentials"), &agent.credentials);
        self.git(&path.key("git"), agent);
        self.limits(&path.key("limits"), agent);
        self.publish(&path.key("publish"), agent);
        if let Some(devices) = &agent.devices {
            for (i, device) in devices.iter().enumerate() {
                self.device(
                    codes::DEVICE_PATH,
                    "device",
                    &path.key("devices").index(i),
                    device,
                );
            }
        }
        for (i, device) in agent.devices_blacklist.iter().enumerate() {
            self.device(
                codes::BLACKLIST_PATH,
                "blacklist entry",
                &path.key("devices_blacklist").index(i),
                device,
            );
        }
    }

    fn image(&mut self, path: &FieldPath, agent: &Agent) {
        match (&agent.image, &agent.build) {
            (None, None) => self.report(
                codes::NO_IMAGE,
                path.clone(),
                On::Value,
                "neither image nor build is set".into(),
                "add image = \"name:tag\" to run a local image, or build = { context = \"DIR\" } \
                 to build one from a Dockerfile"
                    .into(),
            ),
            (Some(_), Some(_)) => self.report(
                codes::IMAGE_AND_BUILD,
                path.key("build"),
                On::Key,
                "both image and build are set".into(),
                "keep one: image to run a local image, or build to build one from a Dockerfile"
                    .into(),
            ),
            _ => {}
        }
        if let Some(image) = &agent.image {
            if image.trim().is_empty() {
                self.report(
                    codes::EMPTY_IMAGE,
                    path.key("image"),
                    On::Value,
                    "image is empty".into(),
                    "name a local image, e.g. image = \"my-agent:latest\"".into(),
                );
            } else if image.contains(char::is_whitespace) {
                self.report(
                    codes::EMPTY_IMAGE,
                    path.key("image"),
                    On::Value,
                    format!("image {image:?} contains whitespace"),
                    format!(
                        "write the image reference without spaces, e.g. {:?}",
                        image.split_whitespace().collect::<String>()
                    ),
                );
            }
        }
    }

    fn env_key(&mut self, path: &FieldPath, key: &str) {
        if !is_env_name(key) {
            self.report(
                codes::ENV_NAME,
                path.clone(),
                On::Key,
                format!("environment variable name {key:?} is not valid"),
                format!(
                    "use letters, digits and underscores, not starting with a digit, e.g. {:?}",
                    env_name_like(key)
                ),
            );
            return;
        }
        if let Some(why) = crate::agent::reserved(key) {
            self.report(
                codes::ENV_RESERVED,
                path.clone(),
                On::Key,
                format!("{key} is set by the bundle"),
                format!("remove it: the bundle sets {key} {why}"),
            );
        }
    }

    /// Checks that each host path the agent names is there and of the
    /// right kind, reporting it as written.
    fn host_paths(&mut self, path: &FieldPath, agent: &Agent) {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let mut agent = agent.clone();
        for host_path in paths::host_paths(path, &mut agent) {
            let value = host_path.value.as_str();
            let wanted = match host_path.expect {
                Expect::Unchecked => continue,
                _ if value.is_empty() => continue,
                Expect::File => "a file",
                Expect::Dir | Expect::GitRepository => "a directory",
            };
            let resolved = resolve_path(self.base_dir, value, home.as_deref());
            let problem = match resolved.as_deref().map(|p| (p, std::fs::metadata(p))) {
                Some((_, Ok(meta))) if meta.is_file() && host_path.expect == Expect::File => {
                    continue;
                }
                Some((_, Ok(meta))) if meta.is_dir() && host_path.expect == Expect::Dir => continue,
                Some((dir, Ok(meta)))
                    if meta.is_dir() && host_path.expect == Expect::GitRepository =>
                {
                    if crate::checkout::RepoKind::of_path(dir).is_some() {
                        continue;
                    }
                    self.report(
                        codes::GIT_NOT_A_REPOSITORY,
                        host_path.field,
                        On::Value,
                        format!(
                            "{} {value:?} is neither a working checkout (no .git in it) nor a bare repository",
                            host_path.noun
                        ),
                        "point url at a git working checkout or a bare repository, or make this \
                         directory one (`git init`)"
                            .to_string(),
                    );
                    continue;
                }
                Some((_, Ok(_))) => format!("is not {wanted}"),
                Some((_, Err(_))) => "does not exist".to_string(),
                None => "is in a home directory, but HOME is not set".to_string(),
            };
            self.report(
                host_path.code,
                host_path.field,
                On::Value,
                format!("{} {value:?} {problem}", host_path.noun),
                host_path.fix.to_string(),
            );
        }
    }

    fn egress(&mut self, path: &FieldPath, agent: &Agent) {
        let mut seen: HashMap<HostRule, usize> = HashMap::new();
        for (i, rule) in agent.egress.allow.iter().enumerate() {
            let item = path.key("allow").index(i);
            match HostRule::parse(rule) {
                Ok(parsed) => {
                    if let Some(first) = seen.get(&parsed) {
                        self.report(
                            codes::HOST_DUPLICATE,
                            item,
                            On::Value,
                            format!("egress rule {rule:?} is listed twice"),
                            format!("remove it; it repeats allow[{first}]"),
                        );
                    } else {
                        seen.insert(parsed, i);
                    }
                }
                Err(err) => self.host_problem(item, "egress rule", rule, &err),
            }
            if super::endpoint::is_loopback_host(rule) {
                self.report(
                    codes::LOOPBACK,
                    path.key("allow").index(i),
                    On::Value,
                    format!(
                        "egress rule {rule:?} is the loopback of the bundle that dials it, never \
                         the host's"
                    ),
                    LOOPBACK_FIX.into(),
                );
            }
        }
        self.relays(path, agent);
        if let Some(ports) = &agent.egress.ports {
            if ports.is_empty() {
                self.report(
                    codes::PORT_INVALID,
                    path.key("ports"),
                    On::Value,
                    "egress.ports is empty, so no connection could leave".into(),
                    "list the ports to allow, e.g. [443], or remove the key for the default \
                     [443, 80]"
                        .into(),
                );
            }
            let mut seen: HashMap<u16, usize> = HashMap::new();
            for (i, port) in ports.iter().enumerate() {
                let item = path.key("ports").index(i);
                if *port == 0 {
                    self.report(
                        codes::PORT_INVALID,
                        item,
                        On::Value,
                        "port 0 is not a port".into(),
                        "use a port from 1 to 65535, e.g. 443".into(),
                    );
                } else if let Some(first) = seen.get(port) {
                    self.report(
                        codes::PORT_DUPLICATE,
                        item,
                        On::Value,
                        format!("port {port} is listed twice"),
                        format!("remove it; it repeats ports[{first}]"),
                    );
                } else {
                    seen.insert(*port, i);
                }
            }
        }
        self.upstream_ca(path, &agent.egress.upstream_ca);
    }

    /// Each `egress.upstream_ca` file must be readable and hold a PEM
    /// certificate, so `check` and `plan` catch the wrong file before a
    /// launch does.
    fn upstream_ca(&mut self, path: &FieldPath, files: &[String]) {
        let home = std::env::home_dir();
        for (i, file) in files.iter().enumerate() {
            let item = path.key("upstream_ca").index(i);
            let fix = "fix the path of the PEM file holding your network's CA certificate \
                       (relative to the manifest's directory, absolute, or \"~/...\")";
            let resolved = if file.is_empty() || (file.starts_with('~') && !file.starts_with("~/"))
            {
                None
            } else {
                super::resolve_path(self.base_dir, file, home.as_deref())
            };
            let Some(resolved) = resolved else {
                self.report(
                    codes::UPSTREAM_CA_FILE,
                    item,
                    On::Value,
                    format!("upstream CA file {file:?} is not a path bottle can resolve"),
                    fix.into(),
                );
                continue;
            };
            let text = match std::fs::metadata(&resolved) {
                Ok(meta) if meta.is_file() => std::fs::read(&resolved)
                    .map_err(|err| format!("cannot be read ({})", err.kind())),
                Ok(_) => Err("is not a file".to_string()),
                Err(_) => Err("does not exist".to_string()),
            };
            match text {
                Err(problem) => self.report(
                    codes::UPSTREAM_CA_FILE,
                    item,
                    On::Value,
                    format!("upstream CA file {file:?} {problem}"),
                    fix.into(),
                ),
                Ok(text) => {
                    if let Err(problem) = crate::upstream_trust::certificate_count(&text) {
                        self.report(
                            codes::UPSTREAM_CA_PEM,
                            item,
                            On::Value,
                            format!("upstream CA file {file:?} {}", problem.describe()),
                            "give the CA certificate in PEM (-----BEGIN CERTIFICATE-----); \
                             convert DER with `openssl x509 -inform der -in ca.der -out ca.pem`"
                                .into(),
                        );
                    }
                }
            }
        }
    }

    /// Runs after every egress rule parsed on its own.
    fn resolve(&mut self, path: &FieldPath, agent: &Agent) {
        let mut exact: Vec<HostRule> = agent
            .egress
            .allow
            .iter()
            .filter_map(|r| HostRule::parse(r).ok())
            .filter(|r| matches!(r, HostRule::Exact(_)))
            .collect();
        // A pinned TCP destination's name may be pinned to an address too.
        exact.extend(
            agent
                .egress
                .tcp
                .iter()
                .filter_map(|t| TcpDestination::parse(t).ok())
                .map(|t| HostRule::Exact(t.host)),
        );
        for (name, address) in &agent.egress.resolve {
            let item = path.key("resolve").key(name);
            let listed = HostRule::parse_exact(name)
                .ok()
                .is_some_and(|host| exact.contains(&host));
            if !listed {
                self.report(
                    codes::RESOLVE_NAME,
                    item,
                    On::Key,
                    format!("resolve pins {name:?}, which is not an exact egress.allow rule"),
                    format!("add {name:?} to egress.allow (or egress.tcp), or remove the pin"),
                );
            } else if address.parse::<std::net::IpAddr>().is_err() {
                self.report(
                    codes::RESOLVE_ADDRESS,
                    item,
                    On::Value,
                    format!("resolve address {address:?} is not an IP address"),
                    "write an IPv4 or IPv6 address, e.g. \"192.0.2.10\"".into(),
                );
            } else if super::endpoint::is_loopback_host(address) {
                self.report(
                    codes::LOOPBACK,
                    item,
                    On::Value,
                    format!(
                        "resolve pins {name:?} to {address:?}, the loopback of the bundle that \
                         dials it, never the host's"
                    ),
                    LOOPBACK_FIX.into(),
                );
            }
        }
    }

    /// The agent's published ports: each a port or `"PORT:HOST_PORT"`,
    /// each host port once.
    fn publish(&mut self, path: &FieldPath, agent: &Agent) {
        let mut seen: HashMap<u16, usize> = HashMap::new();
        for (i, entry) in agent.publish.iter().enumerate() {
            let item = path.index(i);
            match Published::from_entry(entry) {
                Ok(published) => {
                    if let Some(first) = seen.get(&published.host_port) {
                        self.report(
                            codes::PUBLISH_DUPLICATE,
                            item,
                            On::Value,
                            format!("host port {} is published twice", published.host_port),
                            format!(
                                "publish it once (publish[{first}] has it), or pick another host \
                                 port: \"{}:HOST_PORT\"",
                                published.port
                            ),
                        );
                    } else {
                        seen.insert(published.host_port, i);
                    }
                }
                Err(err) => self.report(
                    codes::PUBLISH_INVALID,
                    item,
                    On::Value,
                    match entry {
                        PublishEntry::Number(n) => {
                            format!("published port {n} is not a port from 1 to 65535")
                        }
                        PublishEntry::Text(_) => {
                            format!("publish entry {entry} {}", err.problem())
                        }
                    },
                    "write the agent's port, e.g. 8000 (the same port on the host's 127.0.0.1), \
                     or \"PORT:HOST_PORT\", e.g. \"3000:13000\""
                        .into(),
                ),
            }
        }
    }

    /// The host services and pinned TCP destinations: each entry valid,
    /// and each on a port of its own, since the agent reaches every one
    /// at the bundle's one address.
    fn relays(&mut self, path: &FieldPath, agent: &Agent) {
        let mut taken: HashMap<u16, String> = [
            (PROXY_PORT, "the bundle's proxy"),
            (GIT_GATE_PORT, "the bundle's git-gate"),
            (SUPERVISE_PORT, "the bundle's supervise endpoint"),
        ]
        .into_iter()
        .map(|(port, what)| (port, what.to_string()))
        .collect();
        let mut claim = |checks: &mut Self, item: FieldPath, port: u16, name: String| {
            if let Some(holder) = taken.get(&port) {
                checks.report(
                    codes::RELAY_PORT,
                    item,
                    On::Value,
                    format!("port {port} is taken by {holder}"),
                    "the agent reaches every host service and TCP destination at the bundle's \
                     one address, on the destination's port, so each port can lead to one \
                     destination only: keep one of them"
                        .into(),
                );
            } else {
                taken.insert(port, name);
            }
        };
        for (i, entry) in agent.egress.host_services.iter().enumerate() {
            let item = path.key("host_services").index(i);
            match HostService::parse(entry) {
                Ok(service) => claim(
                    self,
                    item,
                    service.port,
                    format!("egress.host_services[{i}]"),
                ),
                Err(err) => {
                    let (message, fix) = match err {
                        EndpointError::NotLoopback(host) => (
                            format!("host service {entry:?} is not on the host's loopback"),
                            format!(
                                "a host service is a port on this host's 127.0.0.1, e.g. \
                                 \"127.0.0.1:5432\"; to reach {host} write egress.tcp = \
                                 [\"NAME:PORT\"] with NAME pinned to it in egress.resolve"
                            ),
                        ),
                        _ => (
                            format!("host service {entry:?} is not HOST:PORT on the loopback"),
                            "write \"127.0.0.1:PORT\", \"localhost:PORT\" or \"[::1]:PORT\", \
                             e.g. \"127.0.0.1:5432\""
                                .into(),
                        ),
                    };
                    self.report(codes::HOST_SERVICE, item, On::Value, message, fix);
                }
            }
        }
        for (i, entry) in agent.egress.tcp.iter().enumerate() {
            let item = path.key("tcp").index(i);
            match TcpDestination::parse(entry) {
                Ok(destination) => claim(self, item, destination.port, format!("egress.tcp[{i}]")),
                Err(EndpointError::Loopback(_)) => self.report(
                    codes::LOOPBACK,
                    item,
                    On::Value,
                    format!(
                        "tcp destination {entry:?} is the loopback of the bundle that dials it, \
                         never the host's"
                    ),
                    LOOPBACK_FIX.into(),
                ),
                Err(EndpointError::Host(HostRuleError::NotExact)) => self.report(
                    codes::TCP_DESTINATION,
                    item,
                    On::Value,
                    format!("tcp destination {entry:?} is a wildcard"),
                    "name the one host the bundle may dial, e.g. \"git.example.com:22\"".into(),
                ),
                Err(EndpointError::Host(err)) => {
                    let host = entry.rsplit_once(':').map_or(entry.as_str(), |(h, _)| h);
                    self.host_problem(item, "tcp destination host", host, &err);
                }
                Err(err) => {
                    let (message, fix) = match err {
                        EndpointError::Address(address) => (
                            format!("tcp destination {entry:?} is an IP address"),
                            format!(
                                "the agent has no DNS and reaches a destination by the name the \
                                 box's /etc/hosts gives it: name it and pin the name, e.g. tcp = \
                                 [\"db.internal:PORT\"] and resolve = {{ \"db.internal\" = \
                                 \"{address}\" }}"
                            ),
                        ),
                        _ => (
                            format!("tcp destination {entry:?} is not NAME:PORT"),
                            "write one host name and its port, e.g. \"git.example.com:22\"".into(),
                        ),
                    };
                    self.report(codes::TCP_DESTINATION, item, On::Value, message, fix);
                }
            }
        }
    }

    /// Runs after every egress rule parsed on its own: a host's choice of
    /// what a secret does names one of the agent's `allow` rules, as
    /// written.
    fn on_secret(&mut self, path: &FieldPath, agent: &Agent) {
        for host in agent.egress.on_secret.keys() {
            if !agent.egress.allow.contains(host) {
                self.report(
                    codes::ON_SECRET_HOST,
                    path.key("on_secret").key(host),
                    On::Key,
                    format!("on_secret names {host:?}, which is not an egress.allow rule"),
                    format!(
                        "write the host as egress.allow lists it, or add {host:?} to egress.allow"
                    ),
                );
            }
        }
    }

    fn host_problem(&mut self, path: FieldPath, noun: &str, value: &str, err: &HostRuleError) {
        let (code, message, fix) = host_message(noun, value, err);
        self.report(code, path, On::Value, message, fix);
    }

    fn credentials(&mut self, path: &FieldPath, credentials: &[Credential]) {
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, cred) in credentials.iter().enumerate() {
            let item = path.index(i);
            if cred.name.trim().is_empty() {
                self.report(
                    codes::CREDENTIAL_NAME,
                    item.key("name"),
                    On::Value,
                    "credential name is empty".into(),
                    "name it for plans and audit lines, e.g. name = \"anthropic\"".into(),
                );
            } else if let Some(first) = names.get(cred.name.as_str()) {
                self.report(
                    codes::CREDENTIAL_NAME,
                    item.key("name"),
                    On::Value,
                    format!("credential name {:?} is used twice", cred.name),
                    format!("rename one of them; the other is credentials[{first}]"),
                );
            } else {
                names.insert(&cred.name, i);
            }
            match &cred.source {
                CredentialSource::Env(var) if !is_env_name(var) => self.report(
                    codes::CREDENTIAL_ENV,
                    item.key("source").key("env"),
                    On::Value,
                    format!("environment variable name {var:?} is not valid"),
                    format!(
                        "use letters, digits and underscores, not starting with a digit, e.g. {:?}",
                        env_name_like(var)
                    ),
                ),
                CredentialSource::File(file) if file.is_empty() => self.report(
                    codes::CREDENTIAL_FILE,
                    item.key("source").key("file"),
                    On::Value,
                    "credential file path is empty".into(),
                    "write the path of the file holding the secret, e.g. \"~/.config/anthropic/key\""
                        .into(),
                ),
                CredentialSource::File(file) if file.starts_with('~') && !file.starts_with("~/") => {
                    self.report(
                        codes::CREDENTIAL_FILE,
                        item.key("source").key("file"),
                        On::Value,
                        format!("credential file {file:?} uses \"~\" other than \"~/\""),
                        "write \"~/...\" for a file in your home, or an absolute path".into(),
                    );
                }
                _ => {}
            }
            if let Err(err) = HostRule::parse_exact(&cred.host) {
                self.host_problem(item.key("host"), "credential host", &cred.host, &err);
            }
            self.header(&item.key("header"), &cred.header);
            if let Some(format) = &cred.format {
                self.format(&item.key("format"), format);
            }
        }
    }

    fn header(&mut self, path: &FieldPath, header: &str) {
        if header.is_empty() {
            self.report(
                codes::CREDENTIAL_HEADER,
                path.clone(),
                On::Value,
                "header is empty".into(),
                "name the header the secret goes in, e.g. \"x-api-key\" or \"authorization\""
                    .into(),
            );
        } else if !header.bytes().all(is_tchar) {
            self.report(
                codes::CREDENTIAL_HEADER,
                path.clone(),
                On::Value,
                format!("header {header:?} is not a valid HTTP header name"),
                format!(
                    "use letters, digits and \"-\", e.g. {:?}",
                    header_like(header)
                ),
            );
        }
    }

    fn format(&mut self, path: &FieldPath, format: &str) {
        let placeholders = format.matches("{}").count();
        let (message, fix) = if format.chars().any(char::is_control) {
            (
                "format contains a control character".to_string(),
                "remove line breaks and control characters; the value goes into one HTTP header"
                    .to_string(),
            )
        } else if placeholders == 0 {
            (
                format!("format {format:?} has no {{}} for the secret"),
                "put {} where the secret goes, e.g. \"Bearer {}\"".to_string(),
            )
        } else if placeholders > 1 {
            (
                format!("format {format:?} has {placeholders} {{}} placeholders"),
                "keep exactly one {}; the secret is inserted once".to_string(),
            )
        } else {
            return;
        };
        self.report(
            codes::CREDENTIAL_FORMAT,
            path.clone(),
            On::Value,
            message,
            fix,
        );
    }

    /// Runs after every egress rule and credential host parsed on its own.
    fn credential_hosts(&mut self, path: &FieldPath, agent: &Agent) {
        let rules: Vec<HostRule> = agent
            .egress
            .allow
            .iter()
            .filter_map(|r| HostRule::parse(r).ok())
            .collect();
        for (i, cred) in agent.credentials.iter().enumerate() {
            let Ok(host) = HostRule::parse_exact(&cred.host) else {
                continue;
            };
            if !rules.iter().any(|rule| rule.covers(&host)) {
                self.report(
                    codes::CREDENTIAL_HOST,
                    path.key("credentials").index(i).key("host"),
                    On::Value,
                    format!(
                        "credential host {:?} is not on the egress allowlist",
                        cred.host
                    ),
                    format!("add {:?} to egress.allow", cred.host),
                );
            }
        }
    }

    fn git(&mut self, path: &FieldPath, agent: &Agent) {
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, repo) in agent.git.iter().enumerate() {
            let item = path.index(i);
            if !is_repo_name(&repo.name) {
                self.report(
                    codes::GIT_NAME,
                    item.key("name"),
                    On::Value,
                    format!("git repository name {:?} is not valid", repo.name),
                    format!(
                        "use lowercase letters, digits, \".\", \"_\" and \"-\", starting with a \
                         letter or digit, e.g. {:?}",
                        repo_name_like(&repo.name)
                    ),
                );
            } else if let Some(first) = names.get(repo.name.as_str()) {
                self.report(
                    codes::GIT_DUPLICATE,
                    item.key("name"),
                    On::Value,
                    format!("git repository name {:?} is used twice", repo.name),
                    format!("rename one of them; the other is git[{first}]"),
                );
            } else {
                names.insert(&repo.name, i);
            }
            match repo.mode {
                GitMode::ReadOnly if !repo.push.is_empty() => self.report(
                    codes::GIT_PUSH_READ_ONLY,
                    item.key("push"),
                    On::Key,
                    "push is set but the repository is read-only".into(),
                    "set mode = \"read-write\", or remove push".into(),
                ),
                GitMode::ReadWrite if repo.push.is_empty() => self.report(
                    codes::GIT_NO_PUSH,
                    item.key("mode"),
                    On::Value,
                    "read-write repository with no push globs".into(),
                    "list the refs the agent may push to, e.g. push = [\"agent/*\"] for branches \
                     or \"refs/tags/agent-*\" for tags, or set mode = \"read-only\""
                        .into(),
                ),
                _ => {}
            }
            for (j, glob) in repo.push.iter().enumerate() {
                if let Some(problem) = push_glob_problem(glob) {
                    self.report(
                        codes::INVALID_VALUE,
                        item.key("push").index(j),
                        On::Value,
                        format!("push glob {glob:?} {problem}"),
                        "write a branch glob such as \"agent/*\", or a full ref glob starting \
                         with refs/ such as \"refs/tags/agent-*\""
                            .into(),
                    );
                }
            }
        }
    }

    fn limits(&mut self, path: &FieldPath, agent: &Agent) {
        let limits = &agent.limits;
        if let Some(memory) = &limits.memory {
            match parse_memory(memory) {
                None => self.report(
                    codes::MEMORY_SYNTAX,
                    path.key("memory"),
                    On::Value,
                    format!("memory {memory:?} is not a size"),
                    "write a number with an optional unit: \"512m\", \"4g\", \"4GiB\", or bytes \
                     \"1073741824\""
                        .into(),
                ),
                Some(bytes) if bytes < MIN_MEMORY_BYTES => self.report(
                    codes::MEMORY_SMALL,
                    path.key("memory"),
                    On::Value,
                    format!("memory {memory:?} is below the 64 MiB minimum"),
                    "use at least \"64m\"; the default is \"4g\"".into(),
                ),
                Some(_) => {}
            }
        }
        if let Some(disk) = &limits.disk {
            match parse_memory(disk) {
                None => self.report(
                    codes::DISK_SYNTAX,
                    path.key("disk"),
                    On::Value,
                    format!("disk {disk:?} is not a size"),
                    "write a number with an optional unit: \"512m\", \"10g\", \"10GiB\", or bytes \
                     \"1073741824\"; or remove it to leave the writable layer uncapped"
                        .into(),
                ),
                Some(bytes) if bytes < MIN_DISK_BYTES => self.report(
                    codes::DISK_SMALL,
                    path.key("disk"),
                    On::Value,
                    format!("disk {disk:?} is below the 256 MiB minimum"),
                    "use at least \"256m\", e.g. \"10g\"".into(),
                ),
                Some(_) => {}
            }
        }
        if let Some(audit_log) = &limits.audit_log {
            match parse_memory(audit_log) {
                None => self.report(
                    codes::AUDIT_LOG_SYNTAX,
                    path.key("audit_log"),
                    On::Value,
                    format!("audit_log {audit_log:?} is not a size"),
                    "write a number with an optional unit: \"64m\", \"1g\", or bytes \"67108864\""
                        .into(),
                ),
                Some(bytes) if bytes < MIN_AUDIT_LOG_BYTES => self.report(
                    codes::AUDIT_LOG_SMALL,
                    path.key("audit_log"),
                    On::Value,
                    format!("audit_log {audit_log:?} is below the 1 MiB minimum"),
                    "use at least \"1m\"; the default is \"64m\"".into(),
                ),
                Some(_) => {}
            }
        }
        if let Some(pids) = limits.pids
            && pids < MIN_PIDS
        {
            self.report(
                codes::PIDS_SMALL,
                path.key("pids"),
                On::Value,
                format!("pids {pids} is below the minimum of {MIN_PIDS}"),
                format!("use at least {MIN_PIDS}; the default is 1024"),
            );
        }
        if let Some(cpus) = limits.cpus {
            let message = if !cpus.is_finite() {
                Some(format!("cpus {cpus} is not a finite number"))
            } else if cpus <= 0.0 {
                Some(format!("cpus {cpus} is not a positive number"))
            } else {
                None
            };
            if let Some(message) = message {
                self.report(
                    codes::CPUS,
                    path.key("cpus"),
                    On::Value,
                    message,
                    "use a positive number such as 2 or 0.5, or remove it to allow all CPUs".into(),
                );
            }
        }
    }

    fn device(&mut self, code: &'static str, noun: &str, path: &FieldPath, device: &str) {
        let (message, fix) = if !device.starts_with("/dev/") {
            let fix = if let Some(rest) = device.strip_prefix("dev/") {
                format!("write the full path: \"/dev/{rest}\"")
            } else if !device.contains('/') && !device.is_empty() {
                format!("write the full path: \"/dev/{device}\"")
            } else {
                "name device nodes under /dev/, e.g. \"/dev/ttyUSB0\"".to_string()
            };
            (format!("{noun} {device:?} is not under /dev/"), fix)
        } else if device.split('/').any(|part| part == "..") {
            (
                format!("{noun} {device:?} leaves /dev/ through \"..\""),
                "remove the \"..\" parts".to_string(),
            )
        } else if device.trim_end_matches('/') == "/dev" {
            (
                format!("{noun} {device:?} names no device"),
                "name a device node or a glob, e.g. \"/dev/ttyUSB*\"".to_string(),
            )
        } else {
            return;
        };
        self.report(code, path.clone(), On::Value, message, fix);
    }
}

/// The code, message and fix for a host that does not parse.
fn host_message(noun: &str, value: &str, err: &HostRuleError) -> (&'static str, String, String) {
    let invalid = |why: &str| format!("{noun} {value:?} is not a valid host name: {why}");
    match err {
        HostRuleError::Empty => (
            codes::HOST_NAME,
            format!("{noun} is empty"),
            "remove it, or write a host name such as \"api.example.com\"".into(),
        ),
        HostRuleError::Spaces { trimmed } => (
            codes::HOST_NAME,
            format!("{noun} {value:?} has spaces around it"),
            format!("write {trimmed:?}"),
        ),
        HostRuleError::Url { host } => (
            codes::HOST_URL,
            format!("{noun} {value:?} is a URL, not a host name"),
            match host {
                Some(host) => format!("write just the host: {host:?}"),
                None => "write just the host name, e.g. \"api.example.com\"".into(),
            },
        ),
        HostRuleError::Path { host } => (
            codes::HOST_PATH,
            format!("{noun} {value:?} has a path"),
            format!("write just the host: {host:?}; the proxy allows whole hosts, not paths"),
        ),
        HostRuleError::Port { host, .. } => (
            codes::HOST_PORT,
            format!("{noun} {value:?} has a port"),
            format!("write just the host {host:?} and put ports in egress.ports"),
        ),
        HostRuleError::Brackets { addr } => (
            codes::HOST_NAME,
            format!("{noun} {value:?} has brackets"),
            format!("write the address without brackets: {addr:?}"),
        ),
        HostRuleError::Wildcard => (
            codes::HOST_WILDCARD,
            format!("{noun} {value:?} has a wildcard that is not a leading \"*.\" label"),
            "put the wildcard only in front, as in \"*.example.com\", or list the exact hosts"
                .into(),
        ),
        HostRuleError::TooBroad => (
            codes::HOST_WILDCARD,
            format!("{noun} {value:?} is too broad"),
            match value.strip_prefix("*.") {
                Some(tld) => {
                    format!("allow the subdomains of one domain, e.g. \"*.example.{tld}\"")
                }
                None => "list the hosts the agent needs; \"*\" would allow every host".into(),
            },
        ),
        HostRuleError::NotExact => (
            codes::HOST_WILDCARD,
            format!("{noun} {value:?} is a wildcard"),
            format!(
                "name the one host the credential is for, e.g. \"api.{}\"",
                value.strip_prefix("*.").unwrap_or("example.com")
            ),
        ),
        HostRuleError::LeadingDot { domain } => (
            codes::HOST_NAME,
            format!("{noun} {value:?} starts with a dot"),
            format!("write \"*.{domain}\" for its subdomains, or {domain:?} for the host itself"),
        ),
        HostRuleError::TrailingDot { host } => (
            codes::HOST_NAME,
            format!("{noun} {value:?} ends with a dot"),
            format!("drop the trailing dot: {host:?}"),
        ),
        HostRuleError::EmptyLabel => (
            codes::HOST_NAME,
            invalid("it has two dots in a row"),
            "remove the extra dot".into(),
        ),
        HostRuleError::BadChar { ch, .. } => (
            codes::HOST_NAME,
            invalid(&format!("{ch:?} is not allowed")),
            "use only letters, digits, \"-\" and \".\" in host names".into(),
        ),
        HostRuleError::Hyphen { label } => (
            codes::HOST_NAME,
            invalid(&format!("{label:?} starts or ends with \"-\"")),
            format!("remove the \"-\" at the start or end of {label:?}"),
        ),
        HostRuleError::LongLabel { .. } => (
            codes::HOST_NAME,
            invalid("a label is longer than 63 characters"),
            "check the host name; each dot-separated part holds at most 63 characters".into(),
        ),
        HostRuleError::LongName => (
            codes::HOST_NAME,
            invalid("it is longer than 253 characters"),
            "check the host name; DNS names hold at most 253 characters".into(),
        ),
        HostRuleError::NotAnIp => (
            codes::HOST_NAME,
            format!("{noun} {value:?} looks like an IP address but is not one"),
            "write a valid IP address such as \"192.0.2.10\", or a host name".into(),
        ),
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A valid variable name close to `name`, for the fix.
fn env_name_like(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn header_like(header: &str) -> String {
    let words: Vec<&str> = header
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    if words.is_empty() {
        "x-api-key".into()
    } else {
        words.join("-").to_ascii_lowercase()
    }
}

/// `[a-z0-9][a-z0-9._-]*`.
fn is_repo_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

fn repo_name_like(name: &str) -> String {
    let lowered: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = lowered.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "my-repo".into()
    } else {
        trimmed.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert!(is_env_name("A_1"));
        assert!(is_env_name("_x"));
        assert!(!is_env_name("1A"));
        assert!(!is_env_name("MY-VAR"));
        assert!(!is_env_name(""));
        assert_eq!(env_name_like("MY-VAR"), "MY_VAR");
        assert_eq!(env_name_like("1A"), "_1A");
    }

    #[test]
    fn header_names() {
        assert!("x-api-key".bytes().all(is_tchar));
        assert!(!"x api key".bytes().all(is_tchar));
        assert!(!"x:y".bytes().all(is_tchar));
        assert_eq!(header_like("X Api Key"), "x-api-key");
    }

    #[test]
    fn repo_names() {
        assert!(is_repo_name("bottle"));
        assert!(is_repo_name("my.repo_2-x"));
        assert!(!is_repo_name("My Repo"));
        assert!(!is_repo_name("-x"));
        assert!(!is_repo_name(""));
        assert_eq!(repo_name_like("My Repo"), "my-repo");
        assert_eq!(repo_name_like("__"), "my-repo");
    }

    #[test]
    fn the_loopback_fix_names_where_the_agent_finds_host_services() {
        assert!(LOOPBACK_FIX.contains(&format!(
            "{}:5432",
            super::super::endpoint::HOST_SERVICES_NAME
        )));
    }
}
