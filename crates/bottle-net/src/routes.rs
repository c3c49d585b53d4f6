//! The host's IPv4 routes, read from `/proc/net/route`, so that a bottle's
//! subnet never shadows the operator's LAN or VPN.
//!
//! The root is injectable so tests read fixture files. On a host without
//! procfs (macOS) the table reads as empty: a missing file means "this
//! platform does not say", not an error.

use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::error::NetError;
use crate::subnet::Ipv4Net;

/// `RTF_UP` from `<linux/route.h>`: the route is usable.
const RTF_UP: u32 = 0x0001;

/// One row of the host's route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoute {
    /// The interface, e.g. `eth0`.
    pub iface: String,
    /// The destination network.
    pub destination: Ipv4Net,
    /// The next hop; `0.0.0.0` for an on-link route.
    pub gateway: Ipv4Addr,
}

/// The host's IPv4 routes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostRoutes {
    /// Every route that is up, in file order.
    pub routes: Vec<HostRoute>,
}

/// How the kernel printed the addresses: `/proc/net/route` shows each
/// network-order `u32` as a host-order hex number, so the text depends on
/// the machine's byte order.
#[derive(Debug, Clone, Copy)]
enum ByteOrder {
    Little,
    Big,
}

impl ByteOrder {
    const NATIVE: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };

    fn addr(self, value: u32) -> Ipv4Addr {
        Ipv4Addr::from(match self {
            ByteOrder::Little => value.to_le_bytes(),
            ByteOrder::Big => value.to_be_bytes(),
        })
    }
}

impl HostRoutes {
    /// Reads `<root>/proc/net/route`; pass `/` for the real host. A missing
    /// file gives an empty table.
    pub fn read(root: &Path) -> Result<HostRoutes, NetError> {
        let path = root.join("proc/net/route");
        match fs::read_to_string(&path) {
            Ok(text) => HostRoutes::parse(&text, &path),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(HostRoutes::default()),
            Err(source) => Err(NetError::RouteRead { path, source }),
        }
    }

    /// Parses the text of `/proc/net/route` as this machine's kernel writes
    /// it; `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<HostRoutes, NetError> {
        parse_with(text, path, ByteOrder::NATIVE)
    }

    /// True if `net` shares an address with any route other than a default
    /// route (a default route "overlaps" everything and says nothing about
    /// which addresses are local).
    pub fn overlaps(&self, net: Ipv4Net) -> bool {
        self.routes
            .iter()
            .any(|route| route.destination.prefix_len() > 0 && route.destination.overlaps(&net))
    }
}

fn parse_with(text: &str, path: &Path, order: ByteOrder) -> Result<HostRoutes, NetError> {
    let error = |line: usize, detail: String| NetError::RouteParse {
        path: PathBuf::from(path),
        line,
        detail,
    };
    let mut lines = text.lines().enumerate().map(|(i, line)| (i + 1, line));
    let header: Vec<&str> = match lines.next() {
        Some((_, header)) => header.split_whitespace().collect(),
        None => return Ok(HostRoutes::default()),
    };
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| error(1, format!("header has no {name} column")))
    };
    let (iface_col, dest_col, gw_col, flags_col, mask_col) = (
        column("Iface")?,
        column("Destination")?,
        column("Gateway")?,
        column("Flags")?,
        column("Mask")?,
    );

    let mut routes = Vec::new();
    for (number, line) in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        if fields.len() < header.len() {
            return Err(error(
                number,
                format!("expected {} columns, found {}", header.len(), fields.len()),
            ));
        }
        let hex = |col: usize, name: &str| {
            u32::from_str_radix(fields[col], 16)
                .map_err(|_| error(number, format!("{name} {:?} is not hex", fields[col])))
        };
        let flags = hex(flags_col, "Flags")?;
        if flags & RTF_UP == 0 {
            continue;
        }
        let destination = order.addr(hex(dest_col, "Destination")?);
        let gateway = order.addr(hex(gw_col, "Gateway")?);
        let mask = order.addr(hex(mask_col, "Mask")?);
        let destination = Ipv4Net::with_netmask(destination, mask)
            .ok_or_else(|| error(number, format!("Mask {mask} is not a contiguous netmask")))?;
        routes.push(HostRoute {
            iface: fields[iface_col].to_string(),
            destination,
            gateway,
        });
    }
    Ok(HostRoutes { routes })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from a little-endian Linux host with a home LAN, a docker0
    /// bridge, one bottle's bridge and a route that is down.
    const LITTLE_ENDIAN_TABLE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT                                                       
wlp2s0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0                                                                               
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0                                                                                
br-3f2a9c\t002AA8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0                                                                              
wlp2s0\t0001A8C0\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0                                                                               
tun0\t0000000A\t00000000\t0000\t0\t0\t0\t000000FF\t0\t0\t0                                                                                   
";

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_kernel_format() {
        let routes =
            parse_with(LITTLE_ENDIAN_TABLE, Path::new("route"), ByteOrder::Little).unwrap();
        let got: Vec<(String, String, Ipv4Addr)> = routes
            .routes
            .iter()
            .map(|r| (r.iface.clone(), r.destination.to_string(), r.gateway))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "wlp2s0".into(),
                    "0.0.0.0/0".into(),
                    Ipv4Addr::new(192, 168, 1, 1)
                ),
                (
                    "docker0".into(),
                    "172.17.0.0/16".into(),
                    Ipv4Addr::UNSPECIFIED
                ),
                (
                    "br-3f2a9c".into(),
                    "192.168.42.0/24".into(),
                    Ipv4Addr::UNSPECIFIED
                ),
                (
                    "wlp2s0".into(),
                    "192.168.1.0/24".into(),
                    Ipv4Addr::UNSPECIFIED
                ),
            ]
        );
    }

    #[test]
    fn big_endian_hosts_print_addresses_the_other_way_round() {
        let text = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                    eth0\tC0A80100\t00000000\t0001\t0\t0\t0\tFFFFFF00\t0\t0\t0\n";
        let routes = parse_with(text, Path::new("route"), ByteOrder::Big).unwrap();
        assert_eq!(routes.routes[0].destination, net("192.168.1.0/24"));
    }

    #[test]
    fn overlap_ignores_the_default_route() {
        let routes =
            parse_with(LITTLE_ENDIAN_TABLE, Path::new("route"), ByteOrder::Little).unwrap();
        assert!(routes.overlaps(net("192.168.1.0/24")));
        assert!(routes.overlaps(net("192.168.42.0/24")));
        assert!(routes.overlaps(net("172.17.5.0/24")));
        assert!(!routes.overlaps(net("192.168.2.0/24")));
        // tun0's route is down, so 10/8 is free.
        assert!(!routes.overlaps(net("10.1.0.0/24")));
    }

    #[test]
    fn bad_lines_are_reported_with_their_number() {
        let text = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                    eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                    eth0\tnothex\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let err = parse_with(text, Path::new("/x/route"), ByteOrder::Little).unwrap_err();
        assert!(matches!(err, NetError::RouteParse { line: 3, .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("/x/route:3: Destination \"nothex\"")
        );

        let short = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\neth0\t0\n";
        let err = parse_with(short, Path::new("r"), ByteOrder::Little).unwrap_err();
        assert!(
            err.to_string().contains("expected 11 columns, found 2"),
            "{err}"
        );

        let holes = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                     eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FF00FF\t0\t0\t0\n";
        let err = parse_with(holes, Path::new("r"), ByteOrder::Little).unwrap_err();
        assert!(
            err.to_string().contains("not a contiguous netmask"),
            "{err}"
        );

        let err = parse_with("Iface\tGateway\n", Path::new("r"), ByteOrder::Little).unwrap_err();
        assert!(err.to_string().contains("no Destination column"), "{err}");
    }

    #[test]
    fn empty_file_is_an_empty_table() {
        let routes = parse_with("", Path::new("r"), ByteOrder::Little).unwrap();
        assert!(routes.routes.is_empty());
    }
}
