//! What "isolated as planned" means for a Docker bottle, checked against
//! what the Engine reports: one definition, used by a cold launch before
//! the agent runs and by a pool claim before a pooled bottle is handed
//! out. Each check returns what it found wrong, in words for the operator;
//! the caller turns that into its own error.

use bollard::models::{ContainerInspectResponse, EndpointSettings, NetworkInspect};
use std::collections::HashMap;
use std::net::Ipv4Addr;

use crate::config::{HostOnBridge, OPT_INHIBIT_IPV4};
use crate::names::EGRESS_NETWORK;

/// The bottle network is internal, of the planned subnet only, and gives
/// the host an address on its bridge exactly as `host` says (a microVM's
/// bundle is dialled from the host; a container bottle's is not).
pub(crate) fn check_bottle_network(
    name: &str,
    network: &NetworkInspect,
    planned_subnet: &str,
    host: HostOnBridge,
) -> Result<(), String> {
    if network.internal != Some(true) {
        return Err(format!("network {name} is not internal"));
    }
    let inhibit = network
        .options
        .as_ref()
        .and_then(|o| o.get(OPT_INHIBIT_IPV4))
        .map(String::as_str);
    match host {
        HostOnBridge::Withheld if inhibit != Some("true") => {
            return Err(format!(
                "network {name} gives the host an address on the bridge ({OPT_INHIBIT_IPV4} is not set)"
            ));
        }
        HostOnBridge::Gateway if inhibit == Some("true") => {
            return Err(format!(
                "network {name} gives the host no address on the bridge ({OPT_INHIBIT_IPV4} is set), so smolvm could not dial the bundle"
            ));
        }
        _ => {}
    }
    let subnets: Vec<&str> = network
        .ipam
        .as_ref()
        .and_then(|i| i.config.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.subnet.as_deref())
        .collect();
    if subnets != [planned_subnet] {
        return Err(format!(
            "network {name} has subnets {subnets:?}, planned {planned_subnet}"
        ));
    }
    Ok(())
}

/// The bundle sits at its pinned address on the bottle network and is on
/// the egress network: the agent's one way out is through it.
pub(crate) fn check_bundle(
    network: &str,
    bundle: &ContainerInspectResponse,
    pinned: Ipv4Addr,
) -> Result<(), String> {
    let endpoints = endpoints(bundle);
    let ip = endpoints
        .and_then(|e| e.get(network))
        .and_then(|e| e.ip_address.as_deref());
    if ip != Some(pinned.to_string().as_str()) {
        return Err(format!(
            "the bundle is at {} on {network}, not at the pinned {pinned}",
            ip.unwrap_or("no address")
        ));
    }
    if !endpoints.is_some_and(|e| e.contains_key(EGRESS_NETWORK)) {
        return Err(format!("the bundle is not on {EGRESS_NETWORK}"));
    }
    Ok(())
}

/// The agent runs at its pinned address on the bottle network and on no
/// other, with every capability dropped, no new privileges and not
/// privileged. (A gVisor box's runtime and sandbox process are
/// [`crate::gvisor::check_host_side`]'s.)
pub(crate) fn check_agent(
    network: &str,
    agent: &ContainerInspectResponse,
    pinned: Ipv4Addr,
) -> Result<(), String> {
    if agent.state.as_ref().and_then(|s| s.running) != Some(true) {
        return Err("the agent container is not running".into());
    }
    let endpoints = endpoints(agent);
    let names: Vec<&String> = endpoints.into_iter().flat_map(HashMap::keys).collect();
    if names != [network] {
        return Err(format!(
            "the agent is on networks {names:?}, not only {network}"
        ));
    }
    let ip = endpoints
        .and_then(|e| e.get(network))
        .and_then(|e| e.ip_address.as_deref());
    if ip != Some(pinned.to_string().as_str()) {
        return Err(format!(
            "the agent is at {}, not at the pinned {pinned}",
            ip.unwrap_or("no address")
        ));
    }
    let host = agent.host_config.as_ref();
    let cap_drop = host.and_then(|h| h.cap_drop.as_deref()).unwrap_or_default();
    if !cap_drop.iter().any(|c| c == "ALL") {
        return Err("the agent keeps capabilities".into());
    }
    let security_opt = host
        .and_then(|h| h.security_opt.as_deref())
        .unwrap_or_default();
    if !security_opt
        .iter()
        .any(|o| o.starts_with("no-new-privileges"))
    {
        return Err("the agent may gain privileges".into());
    }
    if host.and_then(|h| h.privileged) == Some(true) {
        return Err("the agent is privileged".into());
    }
    Ok(())
}

fn endpoints(container: &ContainerInspectResponse) -> Option<&HashMap<String, EndpointSettings>> {
    container.network_settings.as_ref()?.networks.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerState, HostConfig, Ipam, IpamConfig, NetworkSettings};

    const NET: &str = "bottle-x-net";
    const AGENT_IP: Ipv4Addr = Ipv4Addr::new(10, 242, 0, 3);
    const BUNDLE_IP: Ipv4Addr = Ipv4Addr::new(10, 242, 0, 2);

    fn network(internal: bool, inhibit: Option<&str>, subnet: &str) -> NetworkInspect {
        NetworkInspect {
            internal: Some(internal),
            options: inhibit
                .map(|v| HashMap::from([(OPT_INHIBIT_IPV4.to_string(), v.to_string())])),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container(networks: &[(&str, Ipv4Addr)], host: HostConfig) -> ContainerInspectResponse {
        ContainerInspectResponse {
            state: Some(ContainerState {
                running: Some(true),
                ..Default::default()
            }),
            network_settings: Some(NetworkSettings {
                networks: Some(
                    networks
                        .iter()
                        .map(|(name, ip)| {
                            let endpoint = EndpointSettings {
                                ip_address: Some(ip.to_string()),
                                ..Default::default()
                            };
                            (name.to_string(), endpoint)
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            host_config: Some(host),
            ..Default::default()
        }
    }

    fn confined() -> HostConfig {
        HostConfig {
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            ..Default::default()
        }
    }

    #[test]
    fn the_bottle_network_must_be_internal_inhibited_and_of_the_planned_subnet() {
        let subnet = "10.242.0.0/29";
        let good = network(true, Some("true"), subnet);
        assert_eq!(
            check_bottle_network(NET, &good, subnet, HostOnBridge::Withheld),
            Ok(())
        );
        let open = network(false, Some("true"), subnet);
        assert!(
            check_bottle_network(NET, &open, subnet, HostOnBridge::Withheld)
                .unwrap_err()
                .contains("not internal")
        );
        let host_address = network(true, None, subnet);
        assert!(
            check_bottle_network(NET, &host_address, subnet, HostOnBridge::Withheld)
                .unwrap_err()
                .contains("gives the host an address")
        );
        assert_eq!(
            check_bottle_network(NET, &host_address, subnet, HostOnBridge::Gateway),
            Ok(())
        );
        assert!(
            check_bottle_network(NET, &good, subnet, HostOnBridge::Gateway)
                .unwrap_err()
                .contains("could not dial")
        );
        let other = network(true, Some("true"), "10.242.0.8/29");
        assert!(
            check_bottle_network(NET, &other, subnet, HostOnBridge::Withheld)
                .unwrap_err()
                .contains("planned 10.242.0.0/29")
        );
    }

    #[test]
    fn the_bundle_must_be_pinned_and_on_the_egress_network() {
        let good = container(&[(NET, BUNDLE_IP), (EGRESS_NETWORK, BUNDLE_IP)], confined());
        assert_eq!(check_bundle(NET, &good, BUNDLE_IP), Ok(()));
        let moved = container(&[(NET, AGENT_IP), (EGRESS_NETWORK, BUNDLE_IP)], confined());
        assert!(
            check_bundle(NET, &moved, BUNDLE_IP)
                .unwrap_err()
                .contains("not at the pinned")
        );
        let no_egress = container(&[(NET, BUNDLE_IP)], confined());
        assert!(
            check_bundle(NET, &no_egress, BUNDLE_IP)
                .unwrap_err()
                .contains(EGRESS_NETWORK)
        );
    }

    #[test]
    fn the_agent_must_be_confined_to_the_bottle_network_without_privileges() {
        assert_eq!(
            check_agent(NET, &container(&[(NET, AGENT_IP)], confined()), AGENT_IP),
            Ok(())
        );
        let two_networks = container(&[(NET, AGENT_IP), (EGRESS_NETWORK, AGENT_IP)], confined());
        assert!(
            check_agent(NET, &two_networks, AGENT_IP)
                .unwrap_err()
                .contains("not only")
        );
        let moved = container(&[(NET, BUNDLE_IP)], confined());
        assert!(
            check_agent(NET, &moved, AGENT_IP)
                .unwrap_err()
                .contains("not at the pinned")
        );
        let caps = HostConfig {
            cap_drop: None,
            ..confined()
        };
        assert!(
            check_agent(NET, &container(&[(NET, AGENT_IP)], caps), AGENT_IP)
                .unwrap_err()
                .contains("capabilities")
        );
        let nnp = HostConfig {
            security_opt: None,
            ..confined()
        };
        assert!(
            check_agent(NET, &container(&[(NET, AGENT_IP)], nnp), AGENT_IP)
                .unwrap_err()
                .contains("gain privileges")
        );
        let privileged = HostConfig {
            privileged: Some(true),
            ..confined()
        };
        assert!(
            check_agent(NET, &container(&[(NET, AGENT_IP)], privileged), AGENT_IP)
                .unwrap_err()
                .contains("privileged")
        );
        let mut stopped = container(&[(NET, AGENT_IP)], confined());
        stopped.state = None;
        assert!(
            check_agent(NET, &stopped, AGENT_IP)
                .unwrap_err()
                .contains("not running")
        );
    }
}
