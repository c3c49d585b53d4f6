//! What the agent sees: the one definition of its environment and of the
//! paths bottle provisions inside the box, shared by every backend.
//!
//! A backend decides *how* files get into the box (`docker` uploads a tar,
//! `smolmachines` runs `machine cp`); *what* the agent finds is decided
//! here, so two backends cannot drift apart (ARCHITECTURE.md invariant 4).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::bundle::{GIT_GATE_PORT, PROXY_PORT, supervise_url};
use crate::manifest::endpoint::HOST_SERVICES_NAME;
use crate::manifest::{HostService, TcpDestination};
use crate::spec::BottleSpec;

/// The directory inside the box holding the agent's files bottle puts
/// there: its CA, prompt, skills, MCP configuration and environment.
pub const AGENT_DIR: &str = "/etc/bottle";
/// The directory inside the box holding bottle's own programs (the
/// keep-alive, the in-box agent), root's and `0755`.
pub const BOTTLE_BIN_DIR: &str = "/.bottle";
/// What bottle owns inside a box: every path it provisions lies under one
/// of these. `bottle cp` never writes there, named or through a link, so an
/// operator's copy cannot replace what bottle put in the box for itself or
/// the agent.
pub const BOTTLE_OWNED_DIRS: [&str; 2] = [BOTTLE_BIN_DIR, AGENT_DIR];
/// The bundle's CA certificate inside the box.
pub const AGENT_CA_PATH: &str = "/etc/bottle/ca.pem";
/// The prompt file inside the box.
pub const AGENT_PROMPT_PATH: &str = "/etc/bottle/prompt.md";
/// The skills directory inside the box.
pub const AGENT_SKILLS_DIR: &str = "/etc/bottle/skills";
/// The MCP configuration naming supervise (`bottle_core::bundle::mcp_config`).
pub const AGENT_MCP_CONFIG: &str = crate::bundle::AGENT_MCP_CONFIG;

/// The variables that point every common client at the bundle's proxy.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Makes node's built-in `fetch` (and, in later releases, `http`/`https`)
/// follow the proxy variables: node ≥ 24.0 and ≥ 22.21 read it, older ones
/// ignore it.
const NODE_PROXY_SWITCH: &str = "NODE_USE_ENV_PROXY";

/// The variables under which common clients look for extra or replacement
/// trust roots: node, OpenSSL, Python requests, curl, git.
const CA_VARIABLES: [&str; 5] = [
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
];

/// Why bottle owns `name` (matched in any letter case), or `None` when the
/// manifest's `env` may set it. Covers every name [`agent_env`] can set.
pub fn reserved(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    let upper = upper.as_str();
    if PROXY_VARIABLES
        .iter()
        .chain(&["NO_PROXY", NODE_PROXY_SWITCH])
        .any(|v| v.eq_ignore_ascii_case(upper))
    {
        return Some("so the agent's traffic goes through its proxy");
    }
    if CA_VARIABLES.contains(&upper) {
        return Some("so the agent trusts the bottle's CA");
    }
    if upper == "GIT_GATE_URL"
        || upper == "GIT_CONFIG_COUNT"
        || upper.starts_with("GIT_CONFIG_KEY_")
        || upper.starts_with("GIT_CONFIG_VALUE_")
    {
        return Some("so git goes through git-gate");
    }
    match upper {
        "MCP_SUPERVISE_URL" | "BOTTLE_MCP_CONFIG" => {
            Some("so the agent can ask the operator through supervise")
        }
        "BOTTLE_PROMPT_FILE" => Some("to name the provisioned prompt"),
        _ => None,
    }
}

/// The environment of `spec`'s agent reaching its bundle at
/// `bundle_address`, in a box known as `own`: [`agent_env`] with the spec's
/// variables, repositories and prompt.
pub fn agent_env_of(
    spec: &BottleSpec,
    bundle_address: Ipv4Addr,
    own: &OwnAddresses,
) -> Vec<(String, String)> {
    let git: Vec<GitRoute> = spec
        .agent
        .git
        .iter()
        .map(|repo| GitRoute {
            name: repo.name.clone(),
            url: repo.url.clone(),
        })
        .collect();
    agent_env(&AgentEnvInputs {
        manifest_env: &spec.agent.env,
        bundle_address,
        own,
        git: &git,
        prompt: spec.agent.prompt.is_some(),
        host_services: !spec.agent.egress.host_services.is_empty(),
    })
}

/// The names the box's `/etc/hosts` gives the bundle's address, so the
/// agent, which has no DNS, reaches each relay by a name:
/// [`HOST_SERVICES_NAME`] when it has host services, and the name of each
/// pinned TCP destination (the bundle listens on its port). Every backend
/// writes these, and only these.
pub fn bundle_host_names(host_services: &[HostService], tcp: &[TcpDestination]) -> Vec<String> {
    let mut names = Vec::new();
    if !host_services.is_empty() {
        names.push(HOST_SERVICES_NAME.to_string());
    }
    for destination in tcp {
        if !names.contains(&destination.host) {
            names.push(destination.host.clone());
        }
    }
    names
}

/// The names and address, beyond loopback, on which the box's own services
/// (an agent's dev server) answer: what the backend gives the box. `None`
/// where the backend does not know it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnAddresses {
    /// The box's hostname.
    pub hostname: Option<String>,
    /// The box's own address on the bottle's network.
    pub address: Option<Ipv4Addr>,
}

/// A repository the agent reaches through git-gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRoute {
    /// The name the agent sees (`$GIT_GATE_URL/<name>.git`).
    pub name: String,
    /// The URL the manifest gives for it; git rewrites it to the gate.
    pub url: String,
}

/// What the agent's environment depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEnvInputs<'a> {
    /// The manifest's `env` (reserved names are refused by the parser).
    pub manifest_env: &'a BTreeMap<String, String>,
    /// The one address at which the agent reaches its bundle.
    pub bundle_address: Ipv4Addr,
    /// The box's own names and address, which must not go to the proxy.
    pub own: &'a OwnAddresses,
    /// The repositories git-gate serves; none means the gate does not run.
    pub git: &'a [GitRoute],
    /// Whether a prompt file is provisioned at [`AGENT_PROMPT_PATH`].
    pub prompt: bool,
    /// Whether the agent has host services, at [`HOST_SERVICES_NAME`],
    /// which clients must then reach directly, not through the proxy.
    pub host_services: bool,
}

/// The agent's environment, sorted by name: the manifest's variables, then
/// those bottle owns (which the manifest parser refuses in `env`).
///
/// - every proxy variable names the bundle's proxy, an IP literal: the
///   agent has no DNS;
/// - `NO_PROXY` exempts only the box itself (loopback in the spellings
///   clients differ on, its hostname and its own address, so the agent's
///   own servers are reached directly and not refused by the proxy) and
///   the bundle's address (git-gate and supervise are reached directly
///   there);
/// - `NODE_USE_ENV_PROXY=1` makes node's built-in clients follow the proxy
///   variables (node ignores them otherwise, and fails without DNS);
/// - every CA variable names the bundle's CA, which the proxy's
///   interception certificates chain to;
/// - git is configured through `GIT_CONFIG_COUNT`/`KEY`/`VALUE` (git ≥
///   2.31), so the manifest's repository URLs go to git-gate without a
///   config file that would shadow the agent's own `~/.gitconfig`;
/// - supervise's URL and the MCP config path are always set: supervise
///   runs in every bundle.
pub fn agent_env(inputs: &AgentEnvInputs<'_>) -> Vec<(String, String)> {
    let address = inputs.bundle_address;
    let mut env = inputs.manifest_env.clone();
    let proxy = format!("http://{address}:{PROXY_PORT}");
    for key in PROXY_VARIABLES {
        env.insert(key.into(), proxy.clone());
    }
    let no_proxy = no_proxy(inputs.own, address, inputs.host_services);
    for key in ["NO_PROXY", "no_proxy"] {
        env.insert(key.into(), no_proxy.clone());
    }
    env.insert(NODE_PROXY_SWITCH.into(), "1".into());
    for key in CA_VARIABLES {
        env.insert(key.into(), AGENT_CA_PATH.into());
    }
    if !inputs.git.is_empty() {
        let gate = format!("http://{address}:{GIT_GATE_PORT}");
        for (index, repo) in inputs.git.iter().enumerate() {
            env.insert(
                format!("GIT_CONFIG_KEY_{index}"),
                format!("url.{gate}/{}.git.insteadOf", repo.name),
            );
            env.insert(format!("GIT_CONFIG_VALUE_{index}"), repo.url.clone());
        }
        env.insert("GIT_CONFIG_COUNT".into(), inputs.git.len().to_string());
        env.insert("GIT_GATE_URL".into(), gate);
    }
    env.insert(
        "MCP_SUPERVISE_URL".into(),
        supervise_url(&address.to_string()),
    );
    env.insert("BOTTLE_MCP_CONFIG".into(), AGENT_MCP_CONFIG.into());
    if inputs.prompt {
        env.insert("BOTTLE_PROMPT_FILE".into(), AGENT_PROMPT_PATH.into());
    }
    env.into_iter().collect()
}

/// The `NO_PROXY` list: loopback as a name, a CIDR (curl ≥ 7.86, Go,
/// Python's `ipaddress`-aware clients), its usual address and both
/// spellings of `::1` (some clients compare the URL's bracketed host, some
/// the bare one), then the box's own hostname and address, then the
/// bundle, then the name of the host's services when the agent has some.
fn no_proxy(own: &OwnAddresses, bundle_address: Ipv4Addr, host_services: bool) -> String {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.0/8", "127.0.0.1", "::1", "[::1]"]
        .map(String::from)
        .to_vec();
    hosts.extend(own.hostname.iter().cloned());
    hosts.extend(own.address.iter().map(Ipv4Addr::to_string));
    hosts.push(bundle_address.to_string());
    if host_services {
        hosts.push(HOST_SERVICES_NAME.to_string());
    }
    hosts.join(",")
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn render(env: &[(String, String)]) -> String {
        env.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
    }

    #[test]
    fn every_provisioned_path_is_under_what_bottle_owns() {
        let owned = |path: &str| {
            BOTTLE_OWNED_DIRS
                .iter()
                .any(|dir| path.starts_with(&format!("{dir}/")))
        };
        for path in [
            AGENT_CA_PATH,
            AGENT_PROMPT_PATH,
            AGENT_SKILLS_DIR,
            AGENT_MCP_CONFIG,
            crate::sandbox::TOOLBOX_PATH,
        ] {
            assert!(
                owned(path),
                "{path} is provisioned outside BOTTLE_OWNED_DIRS"
            );
        }
    }

    #[test]
    fn the_agent_environment() {
        let manifest_env = BTreeMap::from([("EDITOR".to_string(), "vi".to_string())]);
        let git = [
            GitRoute {
                name: "app".into(),
                url: "https://git.example.com/team/app.git".into(),
            },
            GitRoute {
                name: "lib".into(),
                url: "/srv/git/lib.git".into(),
            },
        ];
        let env = agent_env(&AgentEnvInputs {
            manifest_env: &manifest_env,
            bundle_address: Ipv4Addr::new(192, 168, 40, 2),
            own: &OwnAddresses {
                hostname: Some("bottle".into()),
                address: Some(Ipv4Addr::new(192, 168, 40, 3)),
            },
            git: &git,
            prompt: true,
            host_services: false,
        });
        expect![[r#"
            ALL_PROXY=http://192.168.40.2:8888
            BOTTLE_MCP_CONFIG=/etc/bottle/mcp.json
            BOTTLE_PROMPT_FILE=/etc/bottle/prompt.md
            CURL_CA_BUNDLE=/etc/bottle/ca.pem
            EDITOR=vi
            GIT_CONFIG_COUNT=2
            GIT_CONFIG_KEY_0=url.http://192.168.40.2:9418/app.git.insteadOf
            GIT_CONFIG_KEY_1=url.http://192.168.40.2:9418/lib.git.insteadOf
            GIT_CONFIG_VALUE_0=https://git.example.com/team/app.git
            GIT_CONFIG_VALUE_1=/srv/git/lib.git
            GIT_GATE_URL=http://192.168.40.2:9418
            GIT_SSL_CAINFO=/etc/bottle/ca.pem
            HTTPS_PROXY=http://192.168.40.2:8888
            HTTP_PROXY=http://192.168.40.2:8888
            MCP_SUPERVISE_URL=http://192.168.40.2:9100/mcp
            NODE_EXTRA_CA_CERTS=/etc/bottle/ca.pem
            NODE_USE_ENV_PROXY=1
            NO_PROXY=localhost,127.0.0.0/8,127.0.0.1,::1,[::1],bottle,192.168.40.3,192.168.40.2
            REQUESTS_CA_BUNDLE=/etc/bottle/ca.pem
            SSL_CERT_FILE=/etc/bottle/ca.pem
            all_proxy=http://192.168.40.2:8888
            http_proxy=http://192.168.40.2:8888
            https_proxy=http://192.168.40.2:8888
            no_proxy=localhost,127.0.0.0/8,127.0.0.1,::1,[::1],bottle,192.168.40.3,192.168.40.2
        "#]]
        .assert_eq(&render(&env));
    }

    #[test]
    fn without_repositories_or_prompt_there_is_no_git_or_prompt_variable() {
        let env = agent_env(&AgentEnvInputs {
            manifest_env: &BTreeMap::new(),
            bundle_address: Ipv4Addr::new(192, 168, 7, 2),
            own: &OwnAddresses::default(),
            git: &[],
            prompt: false,
            host_services: false,
        });
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("GIT_CONFIG") || *n == "GIT_GATE_URL"),
            "{names:?}"
        );
        assert!(!names.contains(&"BOTTLE_PROMPT_FILE"), "{names:?}");
        assert!(names.contains(&"MCP_SUPERVISE_URL"), "{names:?}");
    }

    #[test]
    fn every_variable_bottle_sets_is_reserved_and_no_other() {
        let git = [GitRoute {
            name: "app".into(),
            url: "/srv/app.git".into(),
        }];
        let manifest_env = BTreeMap::from([("EDITOR".to_string(), "vi".to_string())]);
        let env = agent_env(&AgentEnvInputs {
            manifest_env: &manifest_env,
            bundle_address: Ipv4Addr::new(192, 168, 7, 2),
            own: &OwnAddresses::default(),
            git: &git,
            prompt: true,
            host_services: false,
        });
        for (name, _) in &env {
            assert_eq!(reserved(name).is_some(), name != "EDITOR", "{name}");
            assert_eq!(
                reserved(&name.to_ascii_lowercase()).is_some(),
                name != "EDITOR",
                "{name}"
            );
        }
    }

    #[test]
    fn bottle_owned_variables_win_over_the_manifest() {
        // The parser refuses these names; this is the second line of defence.
        let manifest_env =
            BTreeMap::from([("HTTPS_PROXY".to_string(), "http://evil:1".to_string())]);
        let env = agent_env(&AgentEnvInputs {
            manifest_env: &manifest_env,
            bundle_address: Ipv4Addr::new(192, 168, 7, 2),
            own: &OwnAddresses::default(),
            git: &[],
            prompt: false,
            host_services: false,
        });
        let proxy = env
            .iter()
            .find(|(k, _)| k == "HTTPS_PROXY")
            .map(|(_, v)| v.as_str());
        assert_eq!(proxy, Some("http://192.168.7.2:8888"));
    }

    #[test]
    fn an_unknown_box_is_exempt_by_loopback_and_the_bundle_only() {
        assert_eq!(
            no_proxy(&OwnAddresses::default(), Ipv4Addr::new(10, 0, 0, 2), false),
            "localhost,127.0.0.0/8,127.0.0.1,::1,[::1],10.0.0.2"
        );
    }

    #[test]
    fn host_services_are_reached_directly_by_their_name() {
        assert_eq!(
            no_proxy(&OwnAddresses::default(), Ipv4Addr::new(10, 0, 0, 2), true),
            "localhost,127.0.0.0/8,127.0.0.1,::1,[::1],10.0.0.2,host.bottle.internal"
        );
    }

    #[test]
    fn the_box_names_the_bundle_for_host_services_and_each_pinned_destination() {
        let text = "[agents.a]\nimage = \"x\"\n[agents.a.egress]\n\
             host_services = [\"127.0.0.1:5432\"]\n\
             tcp = [\"git.example.com:22\", \"GIT.example.com:2222\", \"db.test:5432\"]\n";
        let m = crate::manifest::parse(std::path::Path::new("bottle.toml"), text);
        // 5432 twice: a port clash.
        assert!(m.is_err());
        let text = text.replace("db.test:5432", "db.test:6432");
        let m = crate::manifest::parse(std::path::Path::new("bottle.toml"), &text).unwrap();
        let spec = BottleSpec::new(
            &m,
            std::path::Path::new("bottle.toml"),
            "a",
            None,
            std::path::Path::new("/s"),
        )
        .unwrap();
        assert_eq!(
            bundle_host_names(&spec.host_services(), &spec.tcp_destinations()),
            ["host.bottle.internal", "git.example.com", "db.test"]
        );
    }
}
