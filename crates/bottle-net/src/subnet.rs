//! Per-bottle subnets: `192.168.X.0/24`, X derived from the bottle's slug.
//!
//! The same slug always asks for the same subnet first, so a bottle that is
//! restarted gets its old addresses back unless something else took them
//! meanwhile. Whether a candidate is taken is the caller's question to
//! answer (the docker backend knows the Docker networks; [`HostRoutes`]
//! knows the host's LAN), so this module does no I/O.
//!
//! [`HostRoutes`]: crate::HostRoutes

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::error::NetError;

/// The third octet never handed out. The design this replaces skipped it
/// (it sits next to Docker's default `172.17.0.0/16` in operators' minds and
/// in some corporate VPN layouts); keeping the skip keeps addresses stable
/// for anyone migrating.
pub const SKIPPED_OCTET: u8 = 17;

/// How many third octets can be handed out: 1..=254 without 17.
pub const SUBNET_CANDIDATES: usize = 253;

/// An IPv4 network: an address with its host bits cleared, and a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    network: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    /// The network containing `addr` with `prefix` leading bits; host bits
    /// of `addr` are cleared.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Result<Ipv4Net, NetError> {
        if prefix > 32 {
            return Err(NetError::InvalidNet {
                input: format!("{addr}/{prefix}"),
                reason: "the prefix length is greater than 32".into(),
            });
        }
        let network = Ipv4Addr::from(u32::from(addr) & mask_bits(prefix));
        Ok(Ipv4Net { network, prefix })
    }

    /// The `/32` holding only `addr`.
    pub fn host(addr: Ipv4Addr) -> Ipv4Net {
        Ipv4Net {
            network: addr,
            prefix: 32,
        }
    }

    /// The network for an address and a dotted netmask such as
    /// `255.255.255.0`; `None` if the mask has holes.
    pub fn with_netmask(addr: Ipv4Addr, mask: Ipv4Addr) -> Option<Ipv4Net> {
        let bits = u32::from(mask);
        let prefix = u8::try_from(bits.leading_ones()).ok()?;
        (mask_bits(prefix) == bits).then(|| Ipv4Net {
            network: Ipv4Addr::from(u32::from(addr) & bits),
            prefix,
        })
    }

    /// The network address (host bits zero).
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The prefix length, 0..=32.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// The netmask, e.g. `255.255.255.0` for a /24.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(mask_bits(self.prefix))
    }

    /// The highest address in the network.
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) | !mask_bits(self.prefix))
    }

    /// True if `addr` is in this network.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & mask_bits(self.prefix) == u32::from(self.network)
    }

    /// True if the two networks share at least one address.
    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        // Two prefixes overlap exactly when the shorter one contains the
        // other's network address.
        let shorter = self.prefix.min(other.prefix);
        let mask = mask_bits(shorter);
        u32::from(self.network) & mask == u32::from(other.network) & mask
    }

    /// The `n`-th address of the network (0 is the network address), or
    /// `None` if the network is smaller than that.
    pub fn nth(&self, n: u32) -> Option<Ipv4Addr> {
        let size_minus_one = !mask_bits(self.prefix);
        (n <= size_minus_one).then(|| Ipv4Addr::from(u32::from(self.network) + n))
    }
}

fn mask_bits(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Ipv4Net {
    type Err = NetError;

    /// Parses `a.b.c.d/len`; host bits must be zero so that a typo such as
    /// `192.168.1.5/24` is not silently read as `192.168.1.0/24`.
    fn from_str(input: &str) -> Result<Ipv4Net, NetError> {
        let invalid = |reason: &str| NetError::InvalidNet {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        let (addr, prefix) = input
            .split_once('/')
            .ok_or_else(|| invalid("missing /prefix-length"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| invalid("the address is not dotted-quad IPv4"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| invalid("the prefix length is not a number"))?;
        let net = Ipv4Net::new(addr, prefix)?;
        if net.network != addr {
            return Err(invalid("host bits are set after the prefix"));
        }
        Ok(net)
    }
}

/// One bottle's private network and the fixed addresses on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BottleSubnet {
    /// The network, `192.168.X.0/24` when chosen by [`bottle_subnet`].
    pub network: Ipv4Net,
    /// `.1`: the bridge's own address.
    pub gateway: Ipv4Addr,
    /// `.2`: the sidecar bundle, pinned so the agent's config can be written
    /// before the bundle starts.
    pub bundle_ip: Ipv4Addr,
    /// `.3`: the agent.
    pub agent_ip: Ipv4Addr,
}

impl BottleSubnet {
    /// The fixed addresses on an existing network (e.g. one read back from
    /// Docker). The network needs at least `.1`-`.3` below its broadcast
    /// address, so the prefix must be /29 or shorter.
    pub fn from_network(network: Ipv4Net) -> Result<BottleSubnet, NetError> {
        let host = |n| network.nth(n).filter(|&a| a != network.broadcast());
        match (host(1), host(2), host(3)) {
            (Some(gateway), Some(bundle_ip), Some(agent_ip)) => Ok(BottleSubnet {
                network,
                gateway,
                bundle_ip,
                agent_ip,
            }),
            _ => Err(NetError::InvalidNet {
                input: network.to_string(),
                reason: "a bottle network needs room for a gateway, the bundle and the agent (/29 or larger)".into(),
            }),
        }
    }

    /// The `/24` whose network address is `index << 8`, with its fixed
    /// addresses.
    fn for_index(index: u32) -> BottleSubnet {
        let base = index << 8;
        BottleSubnet {
            network: Ipv4Net {
                network: Ipv4Addr::from(base),
                prefix: 24,
            },
            gateway: Ipv4Addr::from(base + 1),
            bundle_ip: Ipv4Addr::from(base + 2),
            agent_ip: Ipv4Addr::from(base + 3),
        }
    }
}

/// The third octet a slug asks for first: SHA-256 of the slug, read as one
/// big-endian 256-bit number, mod 254, plus 1. Always in `1..=254`, so
/// neither `192.168.0.0/24` (the most common home LAN) nor `.255` is asked
/// for. May be [`SKIPPED_OCTET`]; [`bottle_subnet`] then moves on.
pub fn preferred_octet(slug: &str) -> u8 {
    // digest mod 254 < 254, so + 1 fits in a u8.
    u8::try_from(digest_mod(slug, 254) + 1).unwrap_or(1)
}

/// SHA-256 of `slug`, read as one big-endian 256-bit number, mod `n`
/// (`n` > 0).
fn digest_mod(slug: &str, n: u32) -> u32 {
    let n = u64::from(n.max(1));
    let rem = Sha256::digest(slug.as_bytes())
        .iter()
        .fold(0u64, |acc, &byte| (acc * 256 + u64::from(byte)) % n);
    // rem < n <= u32::MAX.
    u32::try_from(rem).unwrap_or(0)
}

/// Chooses the bottle's subnet from the default pool, `192.168.0.0/16`:
/// see [`SubnetPool::choose`].
pub fn bottle_subnet(
    slug: &str,
    in_use: &dyn Fn(Ipv4Net) -> bool,
) -> Result<BottleSubnet, NetError> {
    SubnetPool::default().choose(slug, in_use)
}

/// Where bottle subnets come from: every `/24` of a range, except
/// `192.168.0.0/24` (the most common home LAN), `192.168.255.0/24` and
/// `192.168.17.0/24` ([`SKIPPED_OCTET`]) when the range holds them. The
/// default, `192.168.0.0/16`, gives [`SUBNET_CANDIDATES`]; an operator who
/// runs more bottles at once, or whose LAN sits there, names another range
/// (the docker backend reads it from `BOTTLE_SUBNET_POOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubnetPool {
    range: Ipv4Net,
}

/// The range [`SubnetPool::default`] hands out `/24`s from.
pub const DEFAULT_SUBNET_POOL: &str = "192.168.0.0/16";

impl Default for SubnetPool {
    fn default() -> SubnetPool {
        SubnetPool {
            range: Ipv4Net {
                network: Ipv4Addr::new(192, 168, 0, 0),
                prefix: 16,
            },
        }
    }
}

impl SubnetPool {
    /// A pool over `range`, which must be a `/24` or larger (a `/8` at
    /// most) and hold at least one usable `/24`.
    pub fn new(range: Ipv4Net) -> Result<SubnetPool, NetError> {
        let invalid = |reason: &str| NetError::InvalidNet {
            input: range.to_string(),
            reason: reason.to_string(),
        };
        if !(8..=24).contains(&range.prefix) {
            return Err(invalid(
                "a bottle subnet pool is a range of /24s: give a prefix length between 8 and 24",
            ));
        }
        let pool = SubnetPool { range };
        if pool.candidates().next().is_none() {
            return Err(invalid(
                "it holds no usable /24 (192.168.0.0/24, 192.168.17.0/24 and 192.168.255.0/24 are never handed out)",
            ));
        }
        Ok(pool)
    }

    /// The range the pool hands `/24`s out of.
    pub fn range(&self) -> Ipv4Net {
        self.range
    }

    /// How many `/24`s the pool can hand out, [`SKIPPED_OCTET`]'s aside.
    pub fn len(&self) -> usize {
        self.candidates().count()
    }

    /// Whether the pool has no `/24` to hand out ([`SubnetPool::new`]
    /// refuses such a pool).
    pub fn is_empty(&self) -> bool {
        self.candidates().next().is_none()
    }

    /// Chooses the bottle's subnet: the `/24` the slug's digest picks
    /// (for the default pool, [`preferred_octet`]), or the next one up,
    /// wrapping, that `in_use` says is free.
    ///
    /// `in_use` should answer true for a network that overlaps any existing
    /// Docker network or host route, e.g.
    /// `&|net| docker_has(net) || routes.overlaps(net)`.
    pub fn choose(
        &self,
        slug: &str,
        in_use: &dyn Fn(Ipv4Net) -> bool,
    ) -> Result<BottleSubnet, NetError> {
        let (first, count) = self.span();
        let start = digest_mod(slug, count);
        (0..count)
            .map(|i| first + (start + i) % count)
            .map(BottleSubnet::for_index)
            .filter(|subnet| !is_skipped(subnet.network))
            .find(|subnet| !in_use(subnet.network))
            .ok_or(NetError::SubnetsExhausted {
                candidates: self.len(),
                pool: self.range,
            })
    }

    /// The first `/24` (as an address >> 8) and how many follow it, the
    /// home LAN's `192.168.0.0/24` and `192.168.255.0/24` cut off the ends
    /// of the range (the only places an aligned range can hold them).
    fn span(&self) -> (u32, u32) {
        let mut first = u32::from(self.range.network) >> 8;
        let mut last = u32::from(self.range.broadcast()) >> 8;
        if first == u32::from(Ipv4Addr::new(192, 168, 0, 0)) >> 8 {
            first += 1;
        }
        if last == u32::from(Ipv4Addr::new(192, 168, 255, 0)) >> 8 {
            last = last.saturating_sub(1);
        }
        (first, (last + 1).saturating_sub(first))
    }

    fn candidates(&self) -> impl Iterator<Item = BottleSubnet> {
        let (first, count) = self.span();
        (first..first + count)
            .map(BottleSubnet::for_index)
            .filter(|subnet| !is_skipped(subnet.network))
    }
}

fn is_skipped(network: Ipv4Net) -> bool {
    network.network == Ipv4Addr::new(192, 168, SKIPPED_OCTET, 0)
}

impl FromStr for SubnetPool {
    type Err = NetError;

    fn from_str(input: &str) -> Result<SubnetPool, NetError> {
        SubnetPool::new(input.trim().parse()?)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    /// A slug whose preferred octet is `want`, found by search so the tests
    /// do not hard-code hash values.
    fn slug_preferring(want: u8) -> String {
        (0..100_000)
            .map(|i| format!("slug-{i}"))
            .find(|s| preferred_octet(s) == want)
            .unwrap()
    }

    #[test]
    fn the_same_slug_always_gets_the_same_subnet() {
        let a = bottle_subnet("claude", &|_| false).unwrap();
        let b = bottle_subnet("claude", &|_| false).unwrap();
        assert_eq!(a, b);
        let x = preferred_octet("claude");
        assert_eq!(a.network, net(&format!("192.168.{x}.0/24")));
        assert_eq!(a.gateway, Ipv4Addr::new(192, 168, x, 1));
        assert_eq!(a.bundle_ip, Ipv4Addr::new(192, 168, x, 2));
        assert_eq!(a.agent_ip, Ipv4Addr::new(192, 168, x, 3));
    }

    #[test]
    fn preferred_octet_is_the_whole_digest_mod_254_plus_one() {
        // Independent of the fold: the digest as a big number, reduced with
        // u128 arithmetic over two halves.
        let digest = Sha256::digest(b"claude");
        let hi = u128::from_be_bytes(digest[..16].try_into().unwrap());
        let lo = u128::from_be_bytes(digest[16..].try_into().unwrap());
        // (hi * 2^128 + lo) mod 254, with 2^128 mod 254 computed by squaring.
        let two64 = (u128::from(u64::MAX) + 1) % 254;
        let two128 = two64 * two64 % 254;
        let want = ((hi % 254) * two128 + lo % 254) % 254 + 1;
        assert_eq!(u128::from(preferred_octet("claude")), want);
    }

    #[test]
    fn octets_spread_over_the_whole_range() {
        let mut seen = [false; 256];
        for i in 0..20_000 {
            seen[usize::from(preferred_octet(&format!("b{i}")))] = true;
        }
        assert!(!seen[0] && !seen[255]);
        assert!(seen[1..=254].iter().all(|&s| s));
    }

    #[test]
    fn seventeen_is_skipped() {
        let slug = slug_preferring(17);
        let subnet = bottle_subnet(&slug, &|_| false).unwrap();
        assert_eq!(subnet.network, net("192.168.18.0/24"));
        let anything_but =
            bottle_subnet(&slug_preferring(16), &|n| n == net("192.168.16.0/24")).unwrap();
        assert_eq!(anything_but.network, net("192.168.18.0/24"));
    }

    #[test]
    fn probing_moves_forward_and_wraps() {
        let slug = slug_preferring(253);
        let taken = [net("192.168.253.0/24"), net("192.168.254.0/24")];
        let subnet = bottle_subnet(&slug, &|n| taken.contains(&n)).unwrap();
        assert_eq!(subnet.network, net("192.168.1.0/24"));
    }

    #[test]
    fn every_candidate_is_asked_once_then_exhaustion() {
        let asked = RefCell::new(Vec::new());
        let err = bottle_subnet("anything", &|n| {
            asked.borrow_mut().push(n.network().octets()[2]);
            true
        })
        .unwrap_err();
        assert!(matches!(
            err,
            NetError::SubnetsExhausted { candidates: 253, pool } if pool.to_string() == "192.168.0.0/16"
        ));
        assert!(bottle_core::Coded::fix(&err).is_some_and(|fix| fix.contains("bottle cleanup")));
        let mut asked = asked.into_inner();
        assert_eq!(asked[0], preferred_octet("anything"));
        asked.sort_unstable();
        let want: Vec<u8> = (1..=254).filter(|&o| o != 17).collect();
        assert_eq!(asked, want);
    }

    #[test]
    fn overlap_and_containment() {
        let lan = net("192.168.0.0/16");
        assert!(lan.overlaps(&net("192.168.40.0/24")));
        assert!(net("192.168.40.0/24").overlaps(&lan));
        assert!(!net("192.168.40.0/24").overlaps(&net("192.168.41.0/24")));
        assert!(net("0.0.0.0/0").overlaps(&net("10.0.0.0/8")));
        assert!(net("192.168.40.7/32").overlaps(&net("192.168.40.0/24")));
        assert!(lan.contains(Ipv4Addr::new(192, 168, 255, 255)));
        assert!(!lan.contains(Ipv4Addr::new(192, 169, 0, 0)));
        assert_eq!(
            net("10.1.0.0/16").broadcast(),
            Ipv4Addr::new(10, 1, 255, 255)
        );
        assert_eq!(net("10.1.0.0/16").netmask(), Ipv4Addr::new(255, 255, 0, 0));
        assert_eq!(net("0.0.0.0/0").netmask(), Ipv4Addr::UNSPECIFIED);
    }

    #[test]
    fn parsing_rejects_nonsense() {
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0/8",
            "10.0.0.1/8",
            "x/8",
            "10.0.0.0/",
        ] {
            let err = bad.parse::<Ipv4Net>().unwrap_err();
            assert!(matches!(err, NetError::InvalidNet { .. }), "{bad}");
        }
        assert_eq!(net("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert!(Ipv4Net::new(Ipv4Addr::LOCALHOST, 33).is_err());
        assert_eq!(
            Ipv4Net::new(Ipv4Addr::new(10, 9, 8, 7), 8).unwrap(),
            net("10.0.0.0/8")
        );
    }

    #[test]
    fn netmasks_must_be_contiguous() {
        let a = Ipv4Addr::new(192, 168, 5, 9);
        assert_eq!(
            Ipv4Net::with_netmask(a, Ipv4Addr::new(255, 255, 255, 0)),
            Some(net("192.168.5.0/24"))
        );
        assert_eq!(
            Ipv4Net::with_netmask(a, Ipv4Addr::new(255, 0, 255, 0)),
            None
        );
        assert_eq!(
            Ipv4Net::with_netmask(a, Ipv4Addr::BROADCAST),
            Some(net("192.168.5.9/32"))
        );
    }

    #[test]
    fn fixed_addresses_on_an_existing_network() {
        let subnet = BottleSubnet::from_network(net("10.5.0.0/29")).unwrap();
        assert_eq!(subnet.bundle_ip, Ipv4Addr::new(10, 5, 0, 2));
        assert_eq!(subnet.agent_ip, Ipv4Addr::new(10, 5, 0, 3));
        assert!(BottleSubnet::from_network(net("10.5.0.0/30")).is_err());
        assert_eq!(
            BottleSubnet::from_network(net("192.168.9.0/24")).unwrap(),
            BottleSubnet::for_index(u32::from(Ipv4Addr::new(192, 168, 9, 0)) >> 8)
        );
    }

    #[test]
    fn a_small_pool_says_it_is_full() {
        let pool: SubnetPool = "10.77.4.0/23".parse().unwrap();
        assert_eq!(pool.len(), 2);
        let first = pool.choose("a", &|_| false).unwrap();
        assert!(pool.range().contains(first.bundle_ip));
        let second = pool.choose("b", &|n| n == first.network).unwrap();
        assert_ne!(first.network, second.network);
        assert!(pool.range().contains(second.agent_ip));
        let err = pool
            .choose("c", &|n| n == first.network || n == second.network)
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("all 2 "), "{message}");
        assert!(message.contains("10.77.4.0/23"), "{message}");
        let fix = bottle_core::Coded::fix(&err).unwrap();
        assert!(fix.contains("BOTTLE_SUBNET_POOL"), "{fix}");
        assert!(fix.contains("bottle stop"), "{fix}");
    }

    #[test]
    fn the_default_pool_is_the_slug_octet_scheme() {
        let pool = SubnetPool::default();
        assert_eq!(pool.len(), SUBNET_CANDIDATES);
        assert_eq!(pool.range().to_string(), DEFAULT_SUBNET_POOL);
        for slug in ["claude", "a", "bench-7", &slug_preferring(17)] {
            let chosen = pool.choose(slug, &|_| false).unwrap();
            let octet = preferred_octet(slug);
            let want = if octet == SKIPPED_OCTET { 18 } else { octet };
            assert_eq!(chosen.network, net(&format!("192.168.{want}.0/24")));
        }
    }

    #[test]
    fn pools_that_hand_out_nothing_are_refused() {
        for bad in [
            "192.168.0.0/24",
            "192.168.17.0/24",
            "10.0.0.0/25",
            "10.0.0.0/7",
        ] {
            assert!(bad.parse::<SubnetPool>().is_err(), "{bad}");
        }
        assert_eq!("192.168.0.0/23".parse::<SubnetPool>().unwrap().len(), 1);
        assert_eq!("10.0.0.0/16".parse::<SubnetPool>().unwrap().len(), 256);
    }
}
