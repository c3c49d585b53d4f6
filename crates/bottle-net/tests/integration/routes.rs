//! Host routes read from a fixture root, and subnets chosen around them.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;

use bottle_core::Coded;
use bottle_net::{HostRoutes, Ipv4Net, bottle_subnet, preferred_octet};

/// One route line as this machine's kernel prints it: each address is the
/// network-order bytes read as a native `u32`, in hex.
fn route_line(iface: &str, dest: [u8; 4], gateway: [u8; 4], flags: u32, mask: [u8; 4]) -> String {
    let hex = |octets: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(octets));
    format!(
        "{iface}\t{}\t{}\t{flags:04X}\t0\t0\t100\t{}\t0\t0\t0\n",
        hex(dest),
        hex(gateway),
        hex(mask)
    )
}

fn write_route_table(root: &Path) {
    let mut table = String::from(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n",
    );
    table += &route_line("eth0", [0, 0, 0, 0], [192, 168, 1, 1], 0x3, [0, 0, 0, 0]);
    table += &route_line("eth0", [192, 168, 1, 0], [0; 4], 0x1, [255, 255, 255, 0]);
    table += &route_line("wg0", [192, 168, 2, 0], [0; 4], 0x1, [255, 255, 254, 0]);
    fs::create_dir_all(root.join("proc/net")).unwrap();
    fs::write(root.join("proc/net/route"), table).unwrap();
}

fn slug_preferring(want: u8) -> String {
    (0..100_000)
        .map(|i| format!("agent-{i}"))
        .find(|s| preferred_octet(s) == want)
        .unwrap()
}

#[test]
fn reads_the_route_table_under_an_injected_root() {
    let root = tempfile::tempdir().unwrap();
    write_route_table(root.path());
    let routes = HostRoutes::read(root.path()).unwrap();
    let got: Vec<String> = routes
        .routes
        .iter()
        .map(|r| format!("{} {} via {}", r.iface, r.destination, r.gateway))
        .collect();
    assert_eq!(
        got,
        [
            "eth0 0.0.0.0/0 via 192.168.1.1",
            "eth0 192.168.1.0/24 via 0.0.0.0",
            "wg0 192.168.2.0/23 via 0.0.0.0",
        ]
    );
}

#[test]
fn bottle_subnets_steer_clear_of_the_host_lan() {
    let root = tempfile::tempdir().unwrap();
    write_route_table(root.path());
    let routes = HostRoutes::read(root.path()).unwrap();

    let slug = slug_preferring(1);
    let subnet = bottle_subnet(&slug, &|net| routes.overlaps(net)).unwrap();
    // .1 is the LAN, .2 and .3 are the VPN's /23.
    assert_eq!(subnet.network, "192.168.4.0/24".parse::<Ipv4Net>().unwrap());
    assert_eq!(subnet.bundle_ip, Ipv4Addr::new(192, 168, 4, 2));

    // A Docker network the backend knows about is avoided the same way.
    let docker: Ipv4Net = "192.168.4.0/24".parse().unwrap();
    let subnet =
        bottle_subnet(&slug, &|net| routes.overlaps(net) || net.overlaps(&docker)).unwrap();
    assert_eq!(subnet.network, "192.168.5.0/24".parse::<Ipv4Net>().unwrap());
}

#[test]
fn no_procfs_means_no_routes() {
    let root = tempfile::tempdir().unwrap();
    let routes = HostRoutes::read(root.path()).unwrap();
    assert!(routes.routes.is_empty());
}

#[test]
fn unreadable_route_table_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    // A directory where the file should be: reading it fails, not NotFound.
    fs::create_dir_all(root.path().join("proc/net/route")).unwrap();
    let err = HostRoutes::read(root.path()).unwrap_err();
    assert_eq!(err.code(), "BOT-N003");
    assert!(err.to_string().contains("proc/net/route"), "{err}");
}

#[test]
fn the_real_route_table_parses() {
    // Whatever this host's routes are, the kernel's own file must parse.
    HostRoutes::read(Path::new("/")).unwrap();
}
