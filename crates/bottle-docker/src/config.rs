//! Pure functions from a plan to the Docker objects a launch creates: the
//! networks, the two containers, the agent's environment and the bundle's
//! config. No I/O here, so the security-relevant shape of every request is
//! unit-tested.
//!
//! **Isolation design.** The bottle's network is `--internal` *and* its
//! bridge gets no IPv4 address on the host
//! (`com.docker.network.bridge.inhibit_ipv4`). On Docker 20.10 a container
//! on an internal network still gets a default route via the bridge's
//! gateway, and the host answers on that address: the agent could reach
//! every service listening on the host, and Docker's embedded DNS resolver
//! forwards queries from the agent's namespace along that route (measured:
//! a resolver on a host-local TEST-NET address received the agent's
//! queries). Without a host address on the bridge, the gateway does not
//! exist, so nothing beyond the bridge is routable from the agent. The
//! embedded resolver is further pointed at the bundle's own address
//! (`Dns: [bundle_ip]`, never a host loopback resolver, which dockerd would
//! query from the host's namespace: CVE-2024-29018), where nothing answers
//! DNS, and the agent's `/etc/resolv.conf` lists no nameserver at all.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam,
    IpamConfig, NetworkCreateRequest, NetworkingConfig, ResourcesUlimits,
};
use bottle_core::Plan;
use bottle_core::bundle::{
    BUNDLE_CONFIG_PATH, BUNDLE_CONFIG_VERSION, BUNDLE_HOST_SERVICES_DIR, BUNDLE_LOG_DIR,
    BUNDLE_REQUESTS_DIR, BundleConfig, BundleCredential, BundleGitRepo, BundleLimits,
    GIT_GATE_PORT, PROXY_PORT, SUPERVISE_PORT,
};

use crate::data::{BundleData, DockerPlan, DockerPlanData};
use crate::names::{EGRESS_NETWORK, LABEL_MANAGED, LABEL_ROLE, role};
use crate::pause::PAUSE_PATH;

pub use bottle_core::agent::{AGENT_CA_PATH, AGENT_PROMPT_PATH, AGENT_SKILLS_DIR};
/// The CA certificate inside the bundle.
pub const BUNDLE_CA_CERT: &str = "/run/bottle/ca.pem";
/// The CA key inside the bundle.
pub const BUNDLE_CA_KEY: &str = "/run/bottle/ca-key.pem";
/// Credential files inside the bundle.
pub const BUNDLE_CREDENTIALS_DIR: &str = "/run/bottle/credentials";
/// The audit log inside the bundle.
pub const BUNDLE_AUDIT_LOG: &str = "/var/log/bottle/audit.jsonl";
/// Host-side repositories are bind-mounted under this directory.
pub const BUNDLE_GIT_MOUNTS: &str = "/run/bottle/git";
/// Mirrors of remote repositories live under this directory.
pub const BUNDLE_GIT_MIRRORS: &str = "/var/lib/bottle/git";
/// The CA files the bundle trusts for upstream TLS, inside the bundle.
pub const BUNDLE_UPSTREAM_CA_DIR: &str = "/run/bottle/upstream-ca";
/// Git upstream credentials inside the bundle.
pub const BUNDLE_GIT_CREDENTIALS_DIR: &str = "/run/bottle/git-credentials";
/// Where the bundle binary sits in its image.
pub const BUNDLE_BINARY_PATH: &str = "/bottle-bundle";
/// The agent container's hostname; the agent's `NO_PROXY` names it so a
/// server in the box is reached directly by it.
pub const AGENT_HOSTNAME: &str = "bottle";

/// Bundle memory limit: the proxy holds connection buffers, nothing more.
pub const BUNDLE_MEMORY_BYTES: i64 = 512 << 20;
/// Bundle process (thread) limit.
pub const BUNDLE_PIDS: i64 = 512;

/// The agent's `/etc/resolv.conf`: no nameserver, so libc resolvers have
/// nothing to ask (they fall back to 127.0.0.1:53, where nothing listens).
pub const AGENT_RESOLV_CONF: &str = "# bottle: this agent has no DNS. Use the proxy in HTTPS_PROXY; it resolves\n# the hosts your manifest allows.\noptions ndots:0 attempts:1 timeout:1\n";

/// Driver option: give the host no address on the bridge.
pub const OPT_INHIBIT_IPV4: &str = "com.docker.network.bridge.inhibit_ipv4";
/// Driver option: inter-container communication on the bridge.
pub const OPT_ENABLE_ICC: &str = "com.docker.network.bridge.enable_icc";
/// Driver option: masquerade traffic leaving the bridge.
pub const OPT_MASQUERADE: &str = "com.docker.network.bridge.enable_ip_masquerade";

/// Whether the host holds an address on a bottle network's bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOnBridge {
    /// A container bottle's network: the host has no address there, so
    /// nothing on the host is reachable from the box.
    Withheld,
    /// A microVM's bundle network: the host keeps its gateway address,
    /// because smolvm dials the guest's traffic from the host.
    Gateway,
}

/// A bottle's private network: internal (no route off the bridge) and no
/// NAT. With [`HostOnBridge::Withheld`] (a container bottle's) the host
/// takes no address on the bridge, so nothing on the host is reachable from
/// the box; with [`HostOnBridge::Gateway`] (a microVM's bundle) the host
/// keeps its gateway address there, so smolvm can dial the bundle from the
/// host.
pub fn bottle_network(
    name: &str,
    subnet: &str,
    gateway: Ipv4Addr,
    host: HostOnBridge,
    labels: HashMap<String, String>,
) -> NetworkCreateRequest {
    let mut options = HashMap::from([
        (OPT_MASQUERADE.to_string(), "false".to_string()),
        (OPT_ENABLE_ICC.to_string(), "true".to_string()),
    ]);
    if host == HostOnBridge::Withheld {
        options.insert(OPT_INHIBIT_IPV4.to_string(), "true".to_string());
    }
    NetworkCreateRequest {
        name: name.to_string(),
        driver: Some("bridge".into()),
        internal: Some(true),
        attachable: Some(false),
        enable_ipv6: Some(false),
        ipam: Some(Ipam {
            driver: Some("default".into()),
            config: Some(vec![IpamConfig {
                subnet: Some(subnet.to_string()),
                gateway: Some(gateway.to_string()),
                ..IpamConfig::default()
            }]),
            options: None,
        }),
        options: Some(options),
        labels: Some(labels),
        ..NetworkCreateRequest::default()
    }
}

/// The shared egress network: a plain bridge with NAT, where bundles may
/// not talk to one another (ICC off).
pub fn egress_network() -> NetworkCreateRequest {
    NetworkCreateRequest {
        name: EGRESS_NETWORK.to_string(),
        driver: Some("bridge".into()),
        internal: Some(false),
        attachable: Some(false),
        enable_ipv6: Some(false),
        options: Some(HashMap::from([(
            OPT_ENABLE_ICC.to_string(),
            "false".to_string(),
        )])),
        labels: Some(HashMap::from([
            (LABEL_MANAGED.to_string(), "1".to_string()),
            (LABEL_ROLE.to_string(), role::EGRESS.to_string()),
        ])),
        ..NetworkCreateRequest::default()
    }
}

fn pinned_endpoint(network: &str, ip: Ipv4Addr) -> NetworkingConfig {
    NetworkingConfig {
        endpoints_config: Some(HashMap::from([(network.to_string(), pinned_at(ip))])),
    }
}

/// An endpoint at the fixed address `ip`.
fn pinned_at(ip: Ipv4Addr) -> EndpointSettings {
    EndpointSettings {
        ipam_config: Some(EndpointIpamConfig {
            ipv4_address: Some(ip.to_string()),
            ..EndpointIpamConfig::default()
        }),
        ..EndpointSettings::default()
    }
}

/// The agent's endpoint on the bottle network: at the plan's address. A
/// reset connects a standby with it.
pub fn agent_endpoint(plan: &DockerPlan) -> EndpointSettings {
    pinned_at(plan.backend_data.agent.ip)
}

/// A reset's standby box (`crate::reset`): the agent's container, but on
/// the bottle network at an address the daemon picks, which it leaves
/// right after its start. Starting on the network sets up the box's side
/// of it (the daemon's resolver), so the standby's connection at the
/// agent's address during a reset costs a third of a first one.
pub fn standby_container(
    plan: &DockerPlan,
    resolv_conf: &str,
    agent_box: &str,
    labels: HashMap<String, String>,
) -> ContainerCreateBody {
    let network = &plan.backend_data.bundle.network;
    ContainerCreateBody {
        networking_config: Some(NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                network.clone(),
                EndpointSettings::default(),
            )])),
        }),
        ..agent_container(plan, resolv_conf, agent_box, labels)
    }
}

fn hardening(host: &mut HostConfig) {
    host.cap_drop = Some(vec!["ALL".into()]);
    host.security_opt = Some(vec!["no-new-privileges".into()]);
    host.privileged = Some(false);
}

/// The bundle container. It starts on the internal network only; the
/// egress network is connected before it starts (API 1.41 takes one
/// network at create time).
/// `requests_dir` is the bottle's supervise queue on the host; a working
/// checkout is served from its mirror in `state_dir`, never mounted itself.
/// `host_services_dir` is the bottle's host-service sockets on the host,
/// mounted read-only (a socket is connected to, never written).
pub fn bundle_container(
    bundle: &BundleData,
    state_dir: &Path,
    log_dir: &str,
    requests_dir: &str,
    host_services_dir: Option<&str>,
    labels: HashMap<String, String>,
) -> ContainerCreateBody {
    let mut binds = vec![
        format!("{log_dir}:{BUNDLE_LOG_DIR}:rw"),
        format!("{requests_dir}:{BUNDLE_REQUESTS_DIR}:rw"),
    ];
    let mirrors = bottle_core::checkout::CheckoutPaths::of_state_dir(state_dir);
    if let Some(dir) = host_services_dir {
        binds.push(format!("{dir}:{BUNDLE_HOST_SERVICES_DIR}:ro"));
    }
    for repo in &bundle.git {
        if let Some(path) = &repo.local_path {
            let access = match repo.mode {
                bottle_core::manifest::GitMode::ReadWrite => "rw",
                bottle_core::manifest::GitMode::ReadOnly => "ro",
            };
            let source = if repo.checkout {
                mirrors.mirror(&repo.name)
            } else {
                path.clone()
            };
            binds.push(format!(
                "{}:{}:{access}",
                source.display(),
                git_path_in_bundle(repo)
            ));
        }
    }
    let mut host = HostConfig {
        network_mode: Some(bundle.network.clone()),
        binds: Some(binds),
        memory: Some(BUNDLE_MEMORY_BYTES),
        memory_swap: Some(BUNDLE_MEMORY_BYTES),
        pids_limit: Some(BUNDLE_PIDS),
        ..HostConfig::default()
    };
    hardening(&mut host);
    ContainerCreateBody {
        image: Some(bundle.image.clone()),
        user: Some(format!("{}:{}", bundle.user.0, bundle.user.1)),
        cmd: Some(vec![
            "run".into(),
            "--config".into(),
            BUNDLE_CONFIG_PATH.into(),
        ]),
        labels: Some(labels),
        host_config: Some(host),
        networking_config: Some(pinned_endpoint(&bundle.network, bundle.ip)),
        ..ContainerCreateBody::default()
    }
}

/// Where the agent container mounts its box directory (`agent_box` in the
/// state dir: the keep-alive program and the in-box agent), read-only. A
/// mount point cannot be renamed or removed and a read-only mount cannot
/// be written, without capabilities, so not even an agent that runs as
/// root (and owns `/`) can put a program of its own where the host starts
/// the in-box agent.
pub const AGENT_BOX_MOUNT: &str = "/.bottle";

/// The agent container: on the internal network only, every capability
/// dropped, no privilege gain, the plan's limits, and the keep-alive
/// program as its main process (commands run through exec). `agent_box`
/// is the host directory mounted read-only at [`AGENT_BOX_MOUNT`].
pub fn agent_container(
    plan: &DockerPlan,
    resolv_conf: &str,
    agent_box: &str,
    mut labels: HashMap<String, String>,
) -> ContainerCreateBody {
    labels.insert(
        crate::names::LABEL_AGENT_USER.to_string(),
        plan.backend_data.agent.user.clone(),
    );
    let DockerPlanData { bundle, agent } = &plan.backend_data;
    // No host device node enters a gVisor box (its kernel has no driver
    // for them; the CLI drops them with a warning before the plan).
    let passed: &[bottle_core::plan::PlannedDevice] = match plan.isolation {
        bottle_core::isolation::Isolation::Container => &plan.devices,
        bottle_core::isolation::Isolation::Gvisor => &[],
    };
    let devices = passed
        .iter()
        .map(|device| DeviceMapping {
            path_on_host: Some(device.host_path.clone()),
            path_in_container: Some(device.container_path.clone()),
            cgroup_permissions: Some("rwm".into()),
        })
        .collect::<Vec<_>>();
    // A gVisor box's limits are translated (bottle_core::isolation):
    // gVisor's own kernel and threads live in the same cgroups.
    let limits =
        bottle_core::isolation::engine_limits(plan.isolation, plan.memory_bytes, plan.pids);
    let memory = i64::try_from(limits.memory).unwrap_or(i64::MAX);
    let mut host = HostConfig {
        network_mode: Some(bundle.network.clone()),
        runtime: agent.runtime.clone(),
        memory: Some(memory),
        // Equal to memory: no swap on top of the limit.
        memory_swap: Some(memory),
        pids_limit: Some(limits.pids),
        ulimits: limits.nproc.map(|n| {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            vec![ResourcesUlimits {
                name: Some("nproc".into()),
                soft: Some(n),
                hard: Some(n),
            }]
        }),
        nano_cpus: plan.cpus.map(|c| (c * 1e9) as i64),
        init: Some(true),
        dns: Some(vec![agent.dns_upstream.to_string()]),
        dns_search: Some(Vec::new()),
        dns_options: Some(Vec::new()),
        binds: Some(vec![
            format!("{resolv_conf}:/etc/resolv.conf:ro"),
            format!("{agent_box}:{AGENT_BOX_MOUNT}:ro"),
        ]),
        sysctls: Some(HashMap::from([
            // Link-local IPv6 would reach the host's bridge interface.
            (
                "net.ipv6.conf.all.disable_ipv6".to_string(),
                "1".to_string(),
            ),
            (
                "net.ipv6.conf.default.disable_ipv6".to_string(),
                "1".to_string(),
            ),
        ])),
        devices: (!devices.is_empty()).then_some(devices),
        // The names of the bundle's relays (`host.bottle.internal`, each
        // pinned TCP destination), in the box's /etc/hosts: the agent has
        // no DNS.
        extra_hosts: {
            let names = bottle_core::agent::bundle_host_names(&plan.host_services, &plan.tcp);
            (!names.is_empty()).then(|| {
                names
                    .iter()
                    .map(|name| format!("{name}:{}", bundle.ip))
                    .collect()
            })
        },
        // The writable layer's cap (`limits.disk`), in bytes. Prepare has
        // refused the bottle where the driver cannot enforce it, and the
        // daemon refuses the create where it turns out not to.
        storage_opt: plan
            .disk_bytes
            .map(|bytes| HashMap::from([("size".to_string(), bytes.to_string())])),
        ..HostConfig::default()
    };
    hardening(&mut host);
    ContainerCreateBody {
        image: Some(agent.image_id.clone()),
        hostname: Some(AGENT_HOSTNAME.into()),
        user: Some(crate::names::KEEPALIVE_USER.into()),
        env: Some(agent.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        entrypoint: Some(vec![PAUSE_PATH.into()]),
        cmd: Some(Vec::new()),
        labels: Some(labels),
        host_config: Some(host),
        networking_config: Some(pinned_endpoint(&bundle.network, agent.ip)),
        ..ContainerCreateBody::default()
    }
}

/// Where a repository lives inside the bundle: its bind mount, or its
/// mirror.
pub fn git_path_in_bundle(repo: &crate::data::GitRef) -> String {
    let root = if repo.local_path.is_some() {
        BUNDLE_GIT_MOUNTS
    } else {
        BUNDLE_GIT_MIRRORS
    };
    format!("{root}/{}.git", safe_name(&repo.name))
}

/// A git upstream credential's file inside the bundle.
pub fn git_credential_file(index: usize, name: &str) -> String {
    format!("{BUNDLE_GIT_CREDENTIALS_DIR}/{index}-{}", safe_name(name))
}

fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The `index`th upstream CA file inside the bundle.
pub fn upstream_ca_file(index: usize) -> String {
    format!("{BUNDLE_UPSTREAM_CA_DIR}/{index}.pem")
}

/// The file name a credential's secret gets inside the bundle.
pub fn credential_file(index: usize, name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{BUNDLE_CREDENTIALS_DIR}/{index}-{safe}")
}

/// The bundle's config for this plan.
pub fn bundle_config<D>(plan: &Plan<D>, bundle: &BundleData) -> BundleConfig {
    BundleConfig {
        version: BUNDLE_CONFIG_VERSION,
        bottle: plan.bottle.clone(),
        agent: plan.agent.clone(),
        proxy_listen: format!("0.0.0.0:{PROXY_PORT}"),
        allow: plan.egress_allow.clone(),
        ports: plan.egress_ports.clone(),
        credentials: bundle
            .credentials
            .iter()
            .enumerate()
            .map(|(i, c)| BundleCredential {
                name: c.name.clone(),
                host: c.host.clone(),
                header: c.header.clone(),
                format: c.format.clone(),
                file: credential_file(i, &c.name),
            })
            .collect(),
        ca_cert: BUNDLE_CA_CERT.into(),
        ca_key: BUNDLE_CA_KEY.into(),
        audit_log: BUNDLE_AUDIT_LOG.into(),
        resolve: plan.egress_resolve.clone(),
        redact: plan.egress_redact.clone(),
        upstream_roots: (0..bundle.upstream_ca.len())
            .map(upstream_ca_file)
            .collect(),
        upstream_web_roots: bundle.upstream_web_roots,
        nameservers: Vec::new(),
        limits: BundleLimits {
            audit_log_max_bytes: plan.audit_log_max_bytes,
            ..BundleLimits::default()
        },
        git_gate_listen: (!bundle.git.is_empty()).then(|| format!("0.0.0.0:{GIT_GATE_PORT}")),
        git: bundle
            .git
            .iter()
            .enumerate()
            .map(|(i, repo)| BundleGitRepo {
                name: repo.name.clone(),
                path_in_bundle: git_path_in_bundle(repo),
                upstream: repo.upstream.clone(),
                mode: repo.mode,
                push: repo.push.clone(),
                allow_force: repo.allow_force,
                allow_delete: repo.allow_delete,
                credential_file: repo
                    .credential
                    .as_ref()
                    .map(|_| git_credential_file(i, &repo.name)),
            })
            .collect(),
        git_hook_program: None,
        // Always on: it costs nothing, and an agent that can ask is better
        // than one that is stuck.
        supervise_listen: Some(format!("0.0.0.0:{SUPERVISE_PORT}")),
        requests_dir: Some(BUNDLE_REQUESTS_DIR.into()),
        // On the agent-facing address only, never the egress network's.
        relays: bottle_core::bundle::relays(bundle.ip, &plan.host_services, &plan.tcp),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use bottle_core::BackendKind;

    use super::*;
    use crate::data::{AgentData, CredentialRef, STATE_LAYOUT_VERSION};

    pub(crate) fn sample_data() -> DockerPlanData {
        DockerPlanData {
            bundle: BundleData {
                version: STATE_LAYOUT_VERSION,
                network: "bot-bottle-demo".into(),
                subnet: "192.168.40.0/24".into(),
                gateway: Ipv4Addr::new(192, 168, 40, 1),
                ip: Ipv4Addr::new(192, 168, 40, 2),
                container: "bot-bottle-demo-bundle".into(),
                image: "bottle-bundle:0123456789ab".into(),
                credentials: vec![CredentialRef {
                    name: "api key/1".into(),
                    host: "api.example.com".into(),
                    header: "x-api-key".into(),
                    format: "{}".into(),
                    file: None,
                    env: Some("KEY".into()),
                }],
                git: vec![
                    crate::data::GitRef {
                        name: "local".into(),
                        local_path: Some("/home/op/repo.git".into()),
                        checkout: false,
                        upstream: None,
                        mode: bottle_core::manifest::GitMode::ReadWrite,
                        push: vec!["agent/*".into()],
                        allow_force: false,
                        allow_delete: false,
                        credential: None,
                    },
                    crate::data::GitRef {
                        name: "remote".into(),
                        local_path: None,
                        checkout: false,
                        upstream: Some("https://git.example.com/r.git".into()),
                        mode: bottle_core::manifest::GitMode::ReadOnly,
                        push: vec![],
                        allow_force: false,
                        allow_delete: false,
                        credential: Some("/home/op/token".into()),
                    },
                    crate::data::GitRef {
                        name: "work".into(),
                        local_path: Some("/home/op/work".into()),
                        checkout: true,
                        upstream: None,
                        mode: bottle_core::manifest::GitMode::ReadOnly,
                        push: vec![],
                        allow_force: false,
                        allow_delete: false,
                        credential: None,
                    },
                ],
                upstream_ca: vec!["/home/op/corp-ca.pem".into()],
                upstream_web_roots: true,
                detached: false,
                user: (1000, 1000),
            },
            agent: AgentData {
                ip: Ipv4Addr::new(192, 168, 40, 3),
                container: "bot-bottle-demo-agent".into(),
                image_id: "sha256:abc".into(),
                image_ref: "demo:latest".into(),
                user: "agent".into(),
                default_command: vec!["/bin/sh".into()],
                arch: "x86_64".into(),
                storage: "overlay2 on xfs".into(),
                dns_upstream: Ipv4Addr::new(192, 168, 40, 2),
                runtime: None,
                runtime_binary: None,
                env: vec![("EDITOR".into(), "vi".into())],
                prompt: None,
                skills: Vec::new(),
            },
        }
    }

    pub(crate) fn sample_plan() -> DockerPlan {
        Plan {
            version: bottle_core::plan::PLAN_VERSION,
            bottle: "bot-bottle-demo".into(),
            slug: "demo".into(),
            agent: "demo".into(),
            backend: BackendKind::Docker,
            isolation: Default::default(),
            image: "demo:latest".into(),
            command: vec![],
            egress_allow: vec!["api.example.com".into()],
            egress_ports: vec![443],
            egress_resolve: Default::default(),
            egress_redact: vec![],
            upstream_trust: Default::default(),
            upstream_ca: vec!["corp-ca.pem".into()],
            credentials: vec![],
            git: vec![],
            publish: vec![],
            host_services: vec![],
            tcp: vec![],
            devices: vec![bottle_core::plan::PlannedDevice {
                host_path: "/dev/fuse".into(),
                container_path: "/dev/fuse".into(),
                summary: "/dev/fuse".into(),
            }],
            devices_dropped: vec![],
            memory_bytes: 256 << 20,
            pids: 128,
            cpus: Some(1.5),
            disk_bytes: None,
            state_dir: "/state/demo".into(),
            audit_log_max_bytes: 64 << 20,
            backend_lines: vec![],
            backend_data: sample_data(),
        }
    }

    #[test]
    fn the_internal_network_has_no_host_address_and_no_nat() {
        let req = bottle_network(
            "bot-bottle-demo",
            "192.168.40.0/24",
            Ipv4Addr::new(192, 168, 40, 1),
            HostOnBridge::Withheld,
            HashMap::new(),
        );
        assert_eq!(req.internal, Some(true));
        let options = req.options.unwrap();
        assert_eq!(options[OPT_INHIBIT_IPV4], "true");
        assert_eq!(options[OPT_MASQUERADE], "false");
        let ipam = req.ipam.unwrap().config.unwrap();
        assert_eq!(ipam[0].subnet.as_deref(), Some("192.168.40.0/24"));
        assert_eq!(ipam[0].gateway.as_deref(), Some("192.168.40.1"));
    }

    #[test]
    fn the_vm_bundle_network_is_internal_and_gives_the_host_its_gateway() {
        let req = bottle_network(
            "bot-bottle-demo",
            "192.168.40.0/24",
            Ipv4Addr::new(192, 168, 40, 1),
            HostOnBridge::Gateway,
            HashMap::from([(
                LABEL_MANAGED.to_string(),
                crate::names::MANAGED_FOR_VM.to_string(),
            )]),
        );
        assert_eq!(req.internal, Some(true));
        let options = req.options.unwrap();
        assert!(!options.contains_key(OPT_INHIBIT_IPV4), "{options:?}");
        assert_eq!(options[OPT_MASQUERADE], "false");
        let ipam = req.ipam.unwrap().config.unwrap();
        assert_eq!(ipam[0].subnet.as_deref(), Some("192.168.40.0/24"));
        assert_eq!(ipam[0].gateway.as_deref(), Some("192.168.40.1"));
        assert_eq!(
            req.labels.unwrap()[LABEL_MANAGED],
            crate::names::MANAGED_FOR_VM
        );
    }

    #[test]
    fn bundles_cannot_talk_to_each_other_on_the_egress_network() {
        let req = egress_network();
        assert_eq!(req.internal, Some(false));
        assert_eq!(req.options.unwrap()[OPT_ENABLE_ICC], "false");
        assert_eq!(req.labels.unwrap()[LABEL_ROLE], "egress");
    }

    #[test]
    fn the_disk_cap_is_the_agent_containers_storage_size_in_bytes() {
        let mut plan = sample_plan();
        let body = agent_container(&plan, "/r", "/b", HashMap::new());
        assert_eq!(body.host_config.unwrap().storage_opt, None);
        plan.disk_bytes = Some(10 << 30);
        let body = agent_container(&plan, "/r", "/b", HashMap::new());
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json["HostConfig"]["StorageOpt"],
            serde_json::json!({ "size": "10737418240" })
        );
        // The cap is the agent's: the bundle, which the agent cannot write
        // to, gets none.
        let bundle = bundle_container(
            &plan.backend_data.bundle,
            Path::new("/s"),
            "/l",
            "/q",
            None,
            HashMap::new(),
        );
        assert_eq!(bundle.host_config.unwrap().storage_opt, None);
    }

    #[test]
    fn agent_container_shape() {
        let plan = sample_plan();
        let body = agent_container(
            &plan,
            "/state/demo/stage/resolv.conf",
            "/state/demo/box",
            HashMap::new(),
        );
        let host = body.host_config.clone().unwrap();
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_string()])
        );
        assert_eq!(host.memory, Some(256 << 20));
        assert_eq!(host.memory_swap, Some(256 << 20));
        assert_eq!(host.pids_limit, Some(128));
        assert_eq!(host.nano_cpus, Some(1_500_000_000));
        assert_eq!(host.network_mode.as_deref(), Some("bot-bottle-demo"));
        assert_eq!(host.dns, Some(vec!["192.168.40.2".to_string()]));
        assert_eq!(
            host.binds,
            Some(vec![
                "/state/demo/stage/resolv.conf:/etc/resolv.conf:ro".to_string(),
                "/state/demo/box:/.bottle:ro".to_string(),
            ])
        );
        // Both programs the host starts in the box live on that mount.
        for program in [crate::pause::PAUSE_PATH, bottle_core::sandbox::TOOLBOX_PATH] {
            assert_eq!(
                std::path::Path::new(program).parent(),
                Some(std::path::Path::new(AGENT_BOX_MOUNT))
            );
        }
        assert_eq!(host.init, Some(true));
        assert_eq!(host.cap_add, None);
        assert_eq!(host.privileged, Some(false));
        assert_eq!(
            host.devices.unwrap()[0].path_on_host.as_deref(),
            Some("/dev/fuse")
        );
        // The agent's commands run as `agent` (exec's user); the
        // container's own processes as another uid.
        assert_eq!(body.user.as_deref(), Some(crate::names::KEEPALIVE_USER));
        assert_eq!(
            body.labels.as_ref().unwrap()[crate::names::LABEL_AGENT_USER],
            "agent"
        );
        assert_eq!(body.entrypoint, Some(vec![PAUSE_PATH.to_string()]));
        let endpoints = body.networking_config.unwrap().endpoints_config.unwrap();
        assert_eq!(endpoints.len(), 1);
        assert_eq!(
            endpoints["bot-bottle-demo"]
                .ipam_config
                .as_ref()
                .unwrap()
                .ipv4_address
                .as_deref(),
            Some("192.168.40.3")
        );
    }

    #[test]
    fn a_standby_is_the_agents_container_on_the_network_at_no_fixed_address() {
        let plan = sample_plan();
        let make = |standby: bool| {
            let args = (
                &plan,
                "/state/demo/stage/resolv.conf",
                "/state/demo/box",
                HashMap::from([("bottle.role".to_string(), "agent".to_string())]),
            );
            if standby {
                standby_container(args.0, args.1, args.2, args.3)
            } else {
                agent_container(args.0, args.1, args.2, args.3)
            }
        };
        let (agent, standby) = (make(false), make(true));
        let endpoints = standby
            .networking_config
            .clone()
            .unwrap()
            .endpoints_config
            .unwrap();
        assert_eq!(endpoints.len(), 1);
        assert_eq!(endpoints["bot-bottle-demo"], EndpointSettings::default());
        assert_eq!(
            ContainerCreateBody {
                networking_config: None,
                ..standby
            },
            ContainerCreateBody {
                networking_config: None,
                ..agent.clone()
            },
            "everything else is the agent's"
        );
        // The reset connects it where the agent was.
        assert_eq!(
            Some(agent_endpoint(&plan)),
            agent
                .networking_config
                .unwrap()
                .endpoints_config
                .unwrap()
                .remove("bot-bottle-demo")
        );
    }

    #[test]
    fn a_gvisor_box_runs_under_runsc_with_translated_limits() {
        let mut plan = sample_plan();
        let runc = agent_container(&plan, "/r", "/b", HashMap::new())
            .host_config
            .unwrap();
        assert_eq!(runc.runtime, None, "the daemon's default runtime");
        assert_eq!(runc.ulimits, None);
        plan.isolation = bottle_core::isolation::Isolation::Gvisor;
        plan.backend_data.agent.runtime = Some("runsc".into());
        let body = agent_container(&plan, "/r", "/b", HashMap::new());
        let host = body.host_config.unwrap();
        assert_eq!(host.runtime.as_deref(), Some("runsc"));
        let headroom = bottle_core::isolation::GVISOR_MEMORY_HEADROOM as i64;
        assert_eq!(host.memory, Some((256 << 20) + headroom));
        assert_eq!(host.memory_swap, host.memory);
        assert_eq!(host.pids_limit, Some(256 + 12 * 128));
        let nproc = &host.ulimits.unwrap()[0];
        assert_eq!(
            (nproc.name.as_deref(), nproc.soft, nproc.hard),
            (Some("nproc"), Some(128), Some(128))
        );
        // No host device node enters a gVisor box.
        assert_eq!(host.devices, None);
        // Everything else is the container tier's.
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(host.network_mode.as_deref(), Some("bot-bottle-demo"));
        // The bundle stays on runc.
        let bundle = bundle_container(
            &plan.backend_data.bundle,
            Path::new("/s"),
            "/l",
            "/q",
            None,
            HashMap::new(),
        );
        assert_eq!(bundle.host_config.unwrap().runtime, None);
    }

    #[test]
    fn the_agent_container_carries_the_planned_environment() {
        let body = agent_container(&sample_plan(), "/r", "/b", HashMap::new());
        assert_eq!(body.env, Some(vec!["EDITOR=vi".to_string()]));
    }

    #[test]
    fn relays_listen_on_the_agent_facing_address_and_the_box_names_them() {
        let mut plan = sample_plan();
        plan.host_services =
            vec![bottle_core::manifest::HostService::parse("localhost:11434").unwrap()];
        plan.tcp =
            vec![bottle_core::manifest::TcpDestination::parse("git.example.com:22").unwrap()];
        let config = bundle_config(&plan, &plan.backend_data.bundle);
        let relays: Vec<(&str, &str, u16)> = config
            .relays
            .iter()
            .map(|r| (r.listen.as_str(), r.host.as_str(), r.port))
            .collect();
        assert_eq!(
            relays,
            [
                ("192.168.40.2:11434", "localhost", 11434),
                ("192.168.40.2:22", "git.example.com", 22)
            ]
        );
        assert_eq!(
            config.relays[0].via,
            bottle_core::bundle::RelayVia::HostService {
                socket: "/run/bottle/host-services/11434.sock".into()
            }
        );
        let agent = agent_container(&plan, "/r", "/b", HashMap::new());
        assert_eq!(
            agent.host_config.unwrap().extra_hosts,
            Some(vec![
                "host.bottle.internal:192.168.40.2".to_string(),
                "git.example.com:192.168.40.2".to_string()
            ])
        );
        let plain = agent_container(&sample_plan(), "/r", "/b", HashMap::new());
        assert_eq!(plain.host_config.unwrap().extra_hosts, None);
    }

    #[test]
    fn bundle_container_shape() {
        let data = sample_data();
        let body = bundle_container(
            &data.bundle,
            Path::new("/state/demo"),
            "/state/demo/logs",
            "/state/demo/requests",
            Some("/state/demo/host-services"),
            HashMap::new(),
        );
        let host = body.host_config.unwrap();
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_string()])
        );
        assert_eq!(
            host.binds,
            Some(vec![
                "/state/demo/logs:/var/log/bottle:rw".to_string(),
                "/state/demo/requests:/run/bottle/requests:rw".to_string(),
                "/state/demo/host-services:/run/bottle/host-services:ro".to_string(),
                "/home/op/repo.git:/run/bottle/git/local.git:rw".to_string(),
                "/state/demo/git/work.git:/run/bottle/git/work.git:ro".to_string(),
            ])
        );
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(
            body.cmd,
            Some(vec![
                "run".to_string(),
                "--config".into(),
                "/run/bottle/bundle.json".into()
            ])
        );
        let endpoints = body.networking_config.unwrap().endpoints_config.unwrap();
        assert_eq!(
            endpoints["bot-bottle-demo"]
                .ipam_config
                .as_ref()
                .unwrap()
                .ipv4_address
                .as_deref(),
            Some("192.168.40.2")
        );
    }

    #[test]
    fn bundle_config_keeps_egress_on_loopback_and_secrets_in_files() {
        let config = bundle_config(&sample_plan(), &sample_data().bundle);
        assert_eq!(config.proxy_listen, "0.0.0.0:8888");
        assert_eq!(config.allow, ["api.example.com"]);
        assert_eq!(config.agent, "demo");
        assert_eq!(
            config.credentials[0].file,
            "/run/bottle/credentials/0-api_key_1"
        );
        assert_eq!(config.ca_key, "/run/bottle/ca-key.pem");
        assert_eq!(config.git_gate_listen.as_deref(), Some("0.0.0.0:9418"));
        assert_eq!(config.supervise_listen.as_deref(), Some("0.0.0.0:9100"));
        assert_eq!(config.requests_dir.as_deref(), Some("/run/bottle/requests"));
        assert_eq!(config.git[0].path_in_bundle, "/run/bottle/git/local.git");
        assert_eq!(
            config.git[1].path_in_bundle,
            "/var/lib/bottle/git/remote.git"
        );
        assert_eq!(
            config.git[1].credential_file.as_deref(),
            Some("/run/bottle/git-credentials/1-remote")
        );
        assert_eq!(
            config.git[1].upstream.as_deref(),
            Some("https://git.example.com/r.git")
        );
        let json = serde_json::to_string(&config).unwrap();
        assert!(
            !json.contains("KEY\""),
            "the env var name is not the secret: {json}"
        );
    }

    #[test]
    fn bundle_config_names_the_upstream_cas_copied_into_the_bundle() {
        let mut bundle = sample_data().bundle;
        let config = bundle_config(&sample_plan(), &bundle);
        assert_eq!(config.upstream_roots, ["/run/bottle/upstream-ca/0.pem"]);
        assert!(config.upstream_web_roots);

        bundle
            .upstream_ca
            .push("/etc/ssl/certs/ca-certificates.crt".into());
        bundle.upstream_web_roots = false;
        let config = bundle_config(&sample_plan(), &bundle);
        assert_eq!(
            config.upstream_roots,
            [
                "/run/bottle/upstream-ca/0.pem",
                "/run/bottle/upstream-ca/1.pem"
            ]
        );
        assert!(!config.upstream_web_roots);
    }

    #[test]
    fn bundle_data_from_before_upstream_trust_keeps_the_web_roots() {
        let mut json = serde_json::to_value(sample_data().bundle).unwrap();
        let object = json.as_object_mut().unwrap();
        object.remove("upstream_ca");
        object.remove("upstream_web_roots");
        let old: BundleData = serde_json::from_value(json).unwrap();
        assert!(old.upstream_ca.is_empty());
        assert!(old.upstream_web_roots);
    }
}
