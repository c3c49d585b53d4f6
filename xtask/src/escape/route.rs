//! Proof that every canary address is this machine's own, read from
//! `ip route get` and `ip -o addr show`.
//!
//! The gate points probes at canary addresses. If one of them were not
//! local (a typo, an interface that failed to come up, a kernel that
//! ignored the address), the probes and the positive controls would send
//! real packets to whatever the default route leads to. So before anything
//! is sent, each address must route as `local ... dev lo` and be listed on
//! the canary interface; otherwise the run aborts.

use std::net::IpAddr;

use super::evidence::Cidr;

/// What `ip route get ADDR` said about one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteGet {
    /// The route type when the line starts with one (`local`, `unreachable`,
    /// ...); `None` for a plain unicast route.
    pub kind: Option<String>,
    /// The destination the route is for.
    pub destination: String,
    /// The `dev` field.
    pub dev: Option<String>,
    /// The `via` field (a gateway).
    pub via: Option<String>,
}

/// Route types `ip` prints before the destination.
const ROUTE_TYPES: &[&str] = &[
    "local",
    "unicast",
    "broadcast",
    "multicast",
    "unreachable",
    "prohibit",
    "blackhole",
    "throw",
    "nat",
    "anycast",
];

/// Parses the first line of `ip route get` output.
pub(crate) fn parse_route_get(output: &str) -> Option<RouteGet> {
    let line = output.lines().find(|l| !l.trim().is_empty())?;
    let mut tokens = line.split_whitespace().peekable();
    let kind = match tokens.peek() {
        Some(t) if ROUTE_TYPES.contains(t) => tokens.next().map(str::to_string),
        _ => None,
    };
    let destination = tokens.next()?.to_string();
    let rest: Vec<&str> = tokens.collect();
    let field = |name: &str| {
        rest.windows(2)
            .find(|w| w[0] == name)
            .map(|w| w[1].to_string())
    };
    Some(RouteGet {
        kind,
        destination,
        dev: field("dev"),
        via: field("via"),
    })
}

/// Why an address is not provably local.
pub(crate) fn check_local(addr: IpAddr, route_get_output: &str) -> Result<(), String> {
    let Some(route) = parse_route_get(route_get_output) else {
        return Err(format!(
            "`ip route get {addr}` printed nothing parseable: {route_get_output:?}"
        ));
    };
    let same = route
        .destination
        .parse::<IpAddr>()
        .is_ok_and(|dest| dest == addr);
    if route.kind.as_deref() != Some("local")
        || !same
        || route.dev.as_deref() != Some("lo")
        || route.via.is_some()
    {
        return Err(format!(
            "{addr} does not route locally (`ip route get` says {:?}); refusing to send anything to it",
            route_get_output.lines().next().unwrap_or_default().trim()
        ));
    }
    Ok(())
}

/// Why an address is neither provably local nor straight on one of
/// `bridges` (bottle networks the run created, as subnet and bridge
/// device): a direct route (no `via`) through that very device to an
/// address inside its subnet.
pub(crate) fn check_local_or_bridge(
    addr: IpAddr,
    route_get_output: &str,
    bridges: &[(Cidr, String)],
) -> Result<(), String> {
    if check_local(addr, route_get_output).is_ok() {
        return Ok(());
    }
    let route = parse_route_get(route_get_output);
    let on_bridge = route.as_ref().is_some_and(|r| {
        r.kind.is_none()
            && r.via.is_none()
            && r.destination.parse::<IpAddr>().is_ok_and(|d| d == addr)
            && bridges
                .iter()
                .any(|(cidr, dev)| cidr.contains(addr) && r.dev.as_deref() == Some(dev.as_str()))
    });
    if on_bridge {
        return Ok(());
    }
    Err(format!(
        "{addr} is neither local nor on a bottle network of this run (`ip route get` says {:?}); refusing to send anything to it",
        route_get_output.lines().next().unwrap_or_default().trim()
    ))
}

/// The addresses `ip -o addr show dev IFACE` lists (prefix lengths
/// dropped).
pub(crate) fn parse_addr_show(output: &str) -> Vec<IpAddr> {
    output
        .lines()
        .filter_map(|line| {
            let tokens: Vec<&str> = line.split_whitespace().collect();
            let at = tokens.iter().position(|t| *t == "inet" || *t == "inet6")?;
            let cidr = tokens.get(at + 1)?;
            cidr.split('/').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_ipv4_route_is_accepted() {
        let out = "local 198.51.100.77 dev lo src 198.51.100.77 uid 0 \n    cache <local> \n";
        let route = parse_route_get(out).unwrap();
        assert_eq!(route.kind.as_deref(), Some("local"));
        assert_eq!(route.destination, "198.51.100.77");
        assert_eq!(route.dev.as_deref(), Some("lo"));
        assert_eq!(route.via, None);
        check_local("198.51.100.77".parse().unwrap(), out).unwrap();
    }

    #[test]
    fn a_local_ipv6_route_is_accepted() {
        let out = "local 2001:db8::77 from :: dev lo table local proto kernel src 2001:db8::77 metric 0 pref medium\n";
        check_local("2001:db8::77".parse().unwrap(), out).unwrap();
    }

    #[test]
    fn a_route_via_a_gateway_is_refused() {
        let out = "198.51.100.99 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \n    cache \n";
        let route = parse_route_get(out).unwrap();
        assert_eq!(route.kind, None);
        assert_eq!(route.via.as_deref(), Some("192.0.2.1"));
        let err = check_local("198.51.100.99".parse().unwrap(), out).unwrap_err();
        assert!(err.contains("does not route locally"), "{err}");
        let out6 = "2001:db8::99 from :: via fd00::1 dev eth0 src fd00::2 metric 1024 pref medium";
        assert!(check_local("2001:db8::99".parse().unwrap(), out6).is_err());
    }

    #[test]
    fn a_directly_connected_lan_address_is_refused() {
        let out = "192.0.2.10 dev eth0 src 192.0.2.2 uid 0 \n    cache \n";
        assert!(check_local("192.0.2.10".parse().unwrap(), out).is_err());
    }

    #[test]
    fn a_local_route_for_another_address_or_device_is_refused() {
        let other = "local 198.51.100.78 dev lo src 198.51.100.78 uid 0";
        assert!(check_local("198.51.100.77".parse().unwrap(), other).is_err());
        let not_lo = "local 198.51.100.77 dev eth0 src 198.51.100.77";
        assert!(check_local("198.51.100.77".parse().unwrap(), not_lo).is_err());
    }

    #[test]
    fn only_local_or_a_runs_own_bridge_passes_the_host_dial_check() {
        let bridges = [(
            Cidr::parse("192.168.77.0/24").unwrap(),
            "br-0123abcd".to_string(),
        )];
        let local = "local 192.168.77.1 dev lo table local src 192.168.77.1 uid 0";
        check_local_or_bridge("192.168.77.1".parse().unwrap(), local, &bridges).unwrap();
        let bridge = "192.168.77.2 dev br-0123abcd src 192.168.77.1 uid 0 \n    cache";
        check_local_or_bridge("192.168.77.2".parse().unwrap(), bridge, &bridges).unwrap();
        // The same direct route, but not a network of this run.
        assert!(check_local_or_bridge("192.168.77.2".parse().unwrap(), bridge, &[]).is_err());
        // The run's subnet, but another device (a LAN of the same range).
        let eth = "192.168.77.2 dev eth0 src 192.168.77.9 uid 0";
        assert!(check_local_or_bridge("192.168.77.2".parse().unwrap(), eth, &bridges).is_err());
        // A LAN address, or anything behind a gateway, never passes.
        let lan = "192.168.77.2 via 10.0.0.1 dev eth0 src 10.0.0.2";
        assert!(check_local_or_bridge("192.168.77.2".parse().unwrap(), lan, &bridges).is_err());
        let unreachable = "unreachable 192.168.77.2";
        assert!(
            check_local_or_bridge("192.168.77.2".parse().unwrap(), unreachable, &bridges).is_err()
        );
    }

    #[test]
    fn unreachable_and_empty_output_are_refused() {
        assert!(check_local("198.51.100.1".parse().unwrap(), "unreachable 198.51.100.1").is_err());
        let err = check_local("198.51.100.1".parse().unwrap(), "").unwrap_err();
        assert!(err.contains("nothing parseable"), "{err}");
    }

    #[test]
    fn addr_show_lists_v4_and_v6() {
        let out = "351: btlcanary0    inet 198.51.100.10/32 scope global btlcanary0\\       valid_lft forever preferred_lft forever\n\
                   351: btlcanary0    inet 203.0.113.53/32 scope global btlcanary0\\       valid_lft forever preferred_lft forever\n\
                   351: btlcanary0    inet6 2001:db8::10/128 scope global nodad \\       valid_lft forever preferred_lft forever\n\
                   351: btlcanary0    inet6 fe80::4c38:9bff:fee6:f7f5/64 scope link \\       valid_lft forever preferred_lft forever\n";
        let addrs = parse_addr_show(out);
        let want: Vec<IpAddr> = [
            "198.51.100.10",
            "203.0.113.53",
            "2001:db8::10",
            "fe80::4c38:9bff:fee6:f7f5",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(addrs, want);
        assert!(parse_addr_show("").is_empty());
    }
}
