//! Which address a microVM's bundle may have. The bundle itself runs on a
//! `bottle_core::bundle_host::BundleHost` (bottle-docker's, composed by the
//! CLI); this module decides whether the address it reports can be the
//! guest's whole allowlist.
//!
//! ## Where the guest reaches the bundle
//!
//! smolvm 1.1.3 and later route any egress policy to the virtio-net backend
//! (`src/network/launch.rs`, `plan_launch_network`). Under it:
//!
//! - the guest's `127.0.0.0/8` is the guest kernel's own loopback: a packet
//!   to `127.0.0.16` never leaves the VM, so a host loopback alias is not
//!   reachable by dialing it (smolvm's own note in `src/data/network.rs`
//!   `select_dns` says the same of TSI: "TSI leaves a loopback destination on
//!   the guest's own loopback");
//! - the only guest destinations rewritten to host loopback are the
//!   gateway's own addresses (`100.96.0.1`, rewritten to `127.0.0.1`:
//!   `TcpRelayTable::host_connect_addr`, `smolvm-network/src/tcp_relay.rs`)
//!   and the opt-in host sentinel `192.0.2.1` (also to `127.0.0.1`): both land
//!   on the host's shared `127.0.0.1`, never on a per-bottle alias;
//! - every other destination is dialed as-is from the host, after the
//!   policy check on the original address (`EgressPolicy::allows`,
//!   `smolvm-network/src/egress.rs`); private ranges are not floored in the
//!   local modes, only under the fleet `Strict` floor.
//!
//! So the bundle must be published on a per-bottle, host-routable,
//! non-loopback address: on Linux its pinned IP on the per-bottle Docker
//! bridge (`192.168.X.2`). The allowlist is that one `/32`.
//! [`validate_bundle_address`] refuses anything else.

use std::net::Ipv4Addr;

use crate::error::SmolvmError;

/// Refuses an address that cannot be a one-address allowlist under
/// smolvm's virtio-net gateway (see the module docs).
pub fn validate_bundle_address(address: Ipv4Addr) -> Result<(), SmolvmError> {
    let refuse = |reason: &str| {
        Err(SmolvmError::BundleAddress {
            address: address.to_string(),
            reason: reason.to_string(),
        })
    };
    let [a, b, c, _] = address.octets();
    if address.is_loopback() {
        return refuse(
            "a loopback address is the guest's own loopback under virtio-net, so the bundle would be unreachable",
        );
    }
    if address.is_unspecified() || address.is_broadcast() || address.is_multicast() {
        return refuse("it is not a unicast host address");
    }
    if address.is_link_local() {
        return refuse("link-local addresses are always denied by smolvm's egress floor");
    }
    if a == 100 && (64..=127).contains(&b) {
        return refuse(
            "100.64.0.0/10 holds smolvm's own gateway, which is rewritten to the host's 127.0.0.1",
        );
    }
    if (a, b, c) == (192, 0, 2) {
        return refuse(
            "192.0.2.0/24 holds smolvm's host sentinel, which is rewritten to the host's 127.0.0.1",
        );
    }
    if !address.is_private() {
        return refuse(
            "it is not a private (RFC 1918) address, so it is not the bottle's own bundle",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_private_host_address_can_be_the_allowlist() {
        assert!(validate_bundle_address(Ipv4Addr::new(192, 168, 7, 2)).is_ok());
        assert!(validate_bundle_address(Ipv4Addr::new(10, 1, 2, 3)).is_ok());
        for bad in [
            Ipv4Addr::new(127, 0, 0, 16),
            Ipv4Addr::new(127, 0, 0, 1),
            Ipv4Addr::new(0, 0, 0, 0),
            Ipv4Addr::new(169, 254, 169, 254),
            Ipv4Addr::new(100, 96, 0, 1),
            Ipv4Addr::new(192, 0, 2, 1),
            Ipv4Addr::new(8, 8, 8, 8),
            Ipv4Addr::new(255, 255, 255, 255),
        ] {
            assert!(validate_bundle_address(bad).is_err(), "{bad}");
        }
    }
}
