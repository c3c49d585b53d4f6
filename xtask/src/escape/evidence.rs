//! The harness's own evidence, judged without trusting the probe: what the
//! canary listeners and the DNS recorder logged while a bottle was being
//! probed. A connection or query the allowlist does not explain is an
//! escape, whatever the probe in the bottle printed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use bottle_probe::contract::git_probe_ref;

use super::canary::{Hit, Proto};
use super::dns::Recorded;
use super::report::{Expect, Observed, Row};

/// An IPv4 network, `a.b.c.d/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    /// The network address.
    pub addr: Ipv4Addr,
    /// The prefix length.
    pub len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/len` (a bare address is a /32).
    pub(crate) fn parse(text: &str) -> Option<Cidr> {
        let (addr, len) = match text.trim().split_once('/') {
            Some((a, l)) => (a, l.parse().ok()?),
            None => (text.trim(), 32),
        };
        (len <= 32).then_some(())?;
        Some(Cidr {
            addr: addr.parse().ok()?,
            len,
        })
    }

    /// Whether `ip` is inside the network.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let IpAddr::V4(ip) = ip.to_canonical() else {
            return false;
        };
        let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// What a probing phase may legitimately cause at the canaries: the
/// bundles' proxied fetches of the allowlisted hosts, nothing else.
#[derive(Debug, Clone, Default)]
pub(crate) struct Allowance {
    /// The shared egress network (the bundles' source addresses).
    pub egress: Vec<Cidr>,
    /// Where the allowlisted hosts are pinned (the internet canary's HTTP
    /// and HTTPS ports).
    pub pinned: Vec<SocketAddr>,
    /// The allowlisted hosts (the Host header a proxied fetch carries).
    pub allowed_hosts: Vec<String>,
    /// The pinned TCP destinations (`egress.tcp`): a bundle's relay may
    /// reach them, whatever it carries (a relay does not parse).
    pub relayed: Vec<SocketAddr>,
    /// The host services the manifests name (`egress.host_services`): the
    /// host's own forwarder dials them from loopback for a bundle's relay.
    pub host_services: Vec<SocketAddr>,
}

/// Why one canary hit is not explained by `allowance` (`None`: it is).
pub(crate) fn unexplained_hit(hit: &Hit, allowance: &Allowance) -> Option<String> {
    let from_a_bundle = allowance.egress.iter().any(|c| c.contains(hit.peer.ip()));
    let pinned = hit.proto == Proto::Tcp && allowance.pinned.contains(&hit.local);
    let host_ok = match &hit.host {
        // A proxied plain-HTTP fetch names its host.
        Some(host) => allowance
            .allowed_hosts
            .iter()
            .any(|a| a.eq_ignore_ascii_case(host.split(':').next().unwrap_or(host))),
        // A CONNECT tunnel carries TLS (or nothing), not a Host header.
        None => hit.local.port() == 443,
    };
    if from_a_bundle && pinned && host_ok {
        return None;
    }
    let tcp_at = |list: &[SocketAddr]| hit.proto == Proto::Tcp && list.contains(&hit.local);
    if (from_a_bundle && tcp_at(&allowance.relayed)) || tcp_at(&allowance.host_services) {
        return None;
    }
    Some(format!(
        "canary {} ({} {}) reached from {}{}",
        hit.canary,
        match hit.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        },
        hit.local,
        hit.peer,
        hit.host
            .as_ref()
            .map(|h| format!(" with Host {h}"))
            .unwrap_or_default()
    ))
}

/// The row for every canary hit of a probing phase.
pub(crate) fn canary_row(phase: &str, hits: &[Hit], allowance: &Allowance) -> Row {
    let problems: Vec<String> = hits
        .iter()
        .filter_map(|h| unexplained_hit(h, allowance))
        .collect();
    let explained = hits.len() - problems.len();
    evidence_row(
        phase,
        "canary-listeners",
        "network",
        problems,
        format!("{explained} connections, all proxied fetches of allowed hosts"),
    )
}

/// The row for a secret that must never reach a canary in cleartext (the
/// bundle's credential, injected only on a TLS upstream leg).
/// `detector` is the host-side control: the same secret sent to the
/// canary from the host was seen there.
pub(crate) fn secret_row(
    phase: &str,
    probe: &str,
    hits: &[Hit],
    secret: &str,
    detector: Option<bool>,
) -> Row {
    leak_row(
        phase,
        probe,
        "credential",
        hits,
        secret,
        "the secret in cleartext",
        detector,
    )
}

/// The row for bytes (`needle`, described as `what`) that no canary may
/// have received: an escape if one did. `detector` is the host-side
/// control: the same bytes sent from the host were seen.
pub(crate) fn leak_row(
    phase: &str,
    probe: &str,
    category: &str,
    hits: &[Hit],
    needle: &str,
    what: &str,
    detector: Option<bool>,
) -> Row {
    let leaks: Vec<String> = carriers(hits, needle)
        .map(|h| format!("{} received {what} from {}", h.canary, h.peer))
        .collect();
    let observed = if leaks.is_empty() {
        Observed::Blocked
    } else {
        Observed::Reached
    };
    let detail = if leaks.is_empty() {
        format!("{} connections, none carried {what}", hits.len())
    } else {
        leaks.join("; ")
    };
    Row::new(
        phase,
        probe,
        category,
        Expect::Blocked,
        observed,
        detector,
        detail,
    )
}

/// The hits whose received bytes contain `needle` (none for an empty
/// one), as sent or with a chunked body's framing taken out: chunk sizes
/// between two frames must not hide what was sent.
pub(crate) fn carriers<'a>(hits: &'a [Hit], needle: &'a str) -> impl Iterator<Item = &'a Hit> {
    let holds = move |bytes: &[u8]| {
        !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
    };
    hits.iter()
        .filter(move |h| holds(&h.received) || holds(&dechunked(&h.received)))
}

/// A request's head followed by its body without chunk framing, when the
/// head says `Transfer-Encoding: chunked` (else empty). Lenient: a
/// truncated chunk keeps what arrived, and framing that does not parse
/// ends the body there.
pub(crate) fn dechunked(received: &[u8]) -> Vec<u8> {
    let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Vec::new();
    };
    let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
    let chunked = head.lines().skip(1).any(|l| {
        l.split_once(':')
            .is_some_and(|(k, v)| k.trim() == "transfer-encoding" && v.contains("chunked"))
    });
    if !chunked {
        return Vec::new();
    }
    let mut out = received[..end + 4].to_vec();
    let mut rest = &received[end + 4..];
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&rest[..eol]);
        let size = size.split(';').next().unwrap_or("").trim();
        let Ok(n) = usize::from_str_radix(size, 16) else {
            break;
        };
        rest = &rest[eol + 2..];
        if n == 0 {
            break;
        }
        let take = n.min(rest.len());
        out.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        if take < n || rest.len() < 2 {
            break;
        }
        rest = &rest[2..];
    }
    out
}

/// `git for-each-ref --format='%(refname) %(objectname)'` as a map.
pub(crate) fn parse_refs(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(' '))
        .map(|(name, oid)| (name.to_string(), oid.to_string()))
        .collect()
}

/// The host's side of the git probes: what the bottle's bare repository
/// holds after them (`refs`), against the `main` the harness seeded. The
/// plain push's ref must be there at `main` (the control of the other
/// rows, also returned); the signed push's ref must not, and `main` must
/// not have moved.
pub(crate) fn git_rows(
    phase: &str,
    refs: &BTreeMap<String, String>,
    seeded_main: &str,
    token: &str,
) -> (Vec<Row>, bool) {
    let control_ref = git_probe_ref("control", token);
    let signed_ref = git_probe_ref("signed", token);
    let control = refs.get(&control_ref).map(String::as_str) == Some(seeded_main);
    let main = refs.get("refs/heads/main").map(String::as_str);
    let rows = vec![
        Row::control(
            phase,
            "git-control-ref-on-host",
            control,
            format!(
                "{control_ref} in the host's bare repository: {:?} (main was {seeded_main})",
                refs.get(&control_ref)
            ),
        ),
        Row::new(
            phase,
            "git-signed-ref-on-host",
            "git",
            Expect::Blocked,
            Observed::reached_if(refs.contains_key(&signed_ref)),
            Some(control),
            format!(
                "{signed_ref} in the host's bare repository: {:?}",
                refs.get(&signed_ref)
            ),
        ),
        Row::new(
            phase,
            "git-main-on-host",
            "git",
            Expect::Blocked,
            Observed::reached_if(main != Some(seeded_main)),
            Some(control),
            format!("refs/heads/main is {main:?}, seeded at {seeded_main}"),
        ),
    ];
    (rows, control)
}

/// What the DNS recorder may legitimately see during a probing phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct DnsAllowance {
    /// Every bottle's internal network: nothing from there may reach the
    /// recorder.
    pub bottle_subnets: Vec<Cidr>,
    /// Names only a probe asks for: recorded from anywhere, they got out.
    pub canary_names: Vec<String>,
    /// Names the manifests pin: the bundle must not look them up.
    pub pinned_names: Vec<String>,
}

/// The DNS rows of a probing phase: escapes (queries from a bottle, or for
/// a name only the probe knows) and pinned names that were looked up anyway
/// (a wrong resolver path, not an escape: an error).
pub(crate) fn dns_rows(phase: &str, queries: &[Recorded], allowance: &DnsAllowance) -> Vec<Row> {
    let matches = |name: &str, list: &[String]| {
        list.iter()
            .any(|c| name == c || name.ends_with(&format!(".{c}")))
    };
    let mut escapes = Vec::new();
    let mut pinned = Vec::new();
    for q in queries {
        if allowance
            .bottle_subnets
            .iter()
            .any(|c| c.contains(q.source.ip()))
        {
            escapes.push(format!(
                "{} asked for {} from inside a bottle network",
                q.source, q.name
            ));
        } else if matches(&q.name, &allowance.canary_names) {
            escapes.push(format!(
                "the probe's own name {} reached the recorder (from {})",
                q.name, q.source
            ));
        } else if matches(&q.name, &allowance.pinned_names) {
            pinned.push(format!(
                "{} looked up {} though it is pinned",
                q.source, q.name
            ));
        }
    }
    let mut rows = vec![evidence_row(
        phase,
        "dns-recorder",
        "dns",
        escapes,
        format!(
            "{} queries, none from a bottle network or for a probe name",
            queries.len()
        ),
    )];
    let mut pin_row = Row::new(
        phase,
        "dns-pinned-not-queried",
        "dns",
        Expect::Blocked,
        Observed::Blocked,
        None,
        "no lookups of pinned names",
    );
    if !pinned.is_empty() {
        pin_row = Row::new(
            phase,
            "dns-pinned-not-queried",
            "dns",
            Expect::Blocked,
            Observed::Error,
            None,
            pinned.join("; "),
        );
    }
    rows.push(pin_row);
    rows
}

/// The DNS positive control of a phase that probed rebinding names: the
/// bundle's lookups of them reached the recorder, so the Engine really
/// forwards to it. Returns the row and whether the control passed.
pub(crate) fn upstream_control(
    phase: &str,
    queries: &[Recorded],
    rebind_hosts: &[String],
    bottle_subnets: &[Cidr],
) -> (Row, bool) {
    let seen: Vec<&Recorded> = queries
        .iter()
        .filter(|q| rebind_hosts.iter().any(|h| h == &q.name))
        .filter(|q| !bottle_subnets.iter().any(|c| c.contains(q.source.ip())))
        .collect();
    let ok = !seen.is_empty();
    let detail = match seen.first() {
        Some(q) => format!(
            "{} lookups of rebinding names reached the recorder (first: {} from {})",
            seen.len(),
            q.name,
            q.source
        ),
        None => "no lookup of a rebinding name reached the recorder: the Engine does not forward to it, so the rebinding probes prove nothing".to_string(),
    };
    (
        Row::control(phase, "control-engine-dns-upstream", ok, detail),
        ok,
    )
}

/// A row that passes when `problems` is empty and is an escape otherwise.
pub(crate) fn evidence_row(
    phase: &str,
    probe: &str,
    category: &str,
    problems: Vec<String>,
    ok: String,
) -> Row {
    if problems.is_empty() {
        Row::new(
            phase,
            probe,
            category,
            Expect::Blocked,
            Observed::Blocked,
            None,
            ok,
        )
    } else {
        Row::new(
            phase,
            probe,
            category,
            Expect::Blocked,
            Observed::Reached,
            None,
            problems.join("; "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::report::Verdict;

    fn hit(local: &str, peer: &str, proto: Proto, host: Option<&str>) -> Hit {
        Hit {
            canary: "c".into(),
            local: local.parse().unwrap(),
            peer: peer.parse().unwrap(),
            proto,
            host: host.map(str::to_string),
            received: Vec::new(),
        }
    }

    #[test]
    fn a_secret_seen_at_a_canary_is_an_escape_and_a_blind_detector_proves_nothing() {
        let mut leaked = hit("198.51.100.10:80", "172.20.0.2:4000", Proto::Tcp, None);
        leaked.received = b"GET / HTTP/1.1\r\nx-cred: s3cret\r\n\r\n".to_vec();
        let clean = hit("198.51.100.10:80", "172.20.0.2:4001", Proto::Tcp, None);
        let row = secret_row(
            "p",
            "credential",
            &[clean.clone(), leaked],
            "s3cret",
            Some(true),
        );
        assert_eq!(row.verdict, Verdict::Escape, "{row:?}");
        let row = secret_row(
            "p",
            "credential",
            std::slice::from_ref(&clean),
            "s3cret",
            Some(true),
        );
        assert_eq!(row.verdict, Verdict::Pass, "{row:?}");
        let row = secret_row("p", "credential", &[clean], "s3cret", Some(false));
        assert_eq!(row.verdict, Verdict::ControlFailed, "{row:?}");
    }

    #[test]
    fn chunk_framing_does_not_hide_a_secret() {
        let mut h = hit("198.51.100.10:80", "172.20.0.2:4000", Proto::Tcp, None);
        h.received =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nx=s3\r\n4;e=1\r\ncret\r\n0\r\n\r\n"
                .to_vec();
        assert_eq!(carriers(std::slice::from_ref(&h), "s3cret").count(), 1);
        // Truncated mid-chunk: what arrived still counts.
        h.received =
            b"POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n2\r\ns3\r\n10\r\ncr".to_vec();
        assert_eq!(carriers(std::slice::from_ref(&h), "s3cr").count(), 1);
        // Not chunked: the framing is the body's own bytes.
        h.received = b"POST / HTTP/1.1\r\ncontent-length: 9\r\n\r\ns3\r\n4\r\ncret".to_vec();
        assert_eq!(carriers(std::slice::from_ref(&h), "s3cret").count(), 0);
        assert_eq!(carriers(std::slice::from_ref(&h), "").count(), 0);
    }

    #[test]
    fn git_refs_on_the_host_judge_the_signed_pushes_by_the_plain_one() {
        let main = "1".repeat(40);
        let control = git_probe_ref("control", "tok");
        let verdicts = |text: &str| {
            let (rows, ok) = git_rows("p", &parse_refs(text), &main, "tok");
            let v: Vec<(String, Verdict)> =
                rows.into_iter().map(|r| (r.probe, r.verdict)).collect();
            (v, ok)
        };
        let held = format!("refs/heads/main {main}\n{control} {main}\n");
        assert_eq!(
            verdicts(&held),
            (
                vec![
                    ("git-control-ref-on-host".into(), Verdict::Pass),
                    ("git-signed-ref-on-host".into(), Verdict::Pass),
                    ("git-main-on-host".into(), Verdict::Pass),
                ],
                true
            )
        );
        let signed = git_probe_ref("signed", "tok");
        let leaked = format!(
            "refs/heads/main {}\n{control} {main}\n{signed} {main}\n",
            "2".repeat(40)
        );
        let (v, _) = verdicts(&leaked);
        assert_eq!(v[1].1, Verdict::Escape);
        assert_eq!(v[2].1, Verdict::Escape);
        // Without the control's ref, a clean repository proves nothing.
        let (v, ok) = verdicts(&format!("refs/heads/main {main}\n"));
        assert!(!ok);
        assert!(v.iter().all(|(_, v)| *v == Verdict::ControlFailed), "{v:?}");
    }

    fn allowance() -> Allowance {
        Allowance {
            egress: vec![Cidr::parse("172.18.0.0/16").unwrap()],
            pinned: vec![
                "198.51.100.10:80".parse().unwrap(),
                "198.51.100.10:443".parse().unwrap(),
            ],
            allowed_hosts: vec!["allowed-a.bottle.test".into()],
            relayed: vec!["198.51.100.20:7070".parse().unwrap()],
            host_services: vec!["127.0.0.1:5432".parse().unwrap()],
        }
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let c = Cidr::parse("10.1.2.0/24").unwrap();
        assert!(c.contains("10.1.2.200".parse().unwrap()));
        assert!(!c.contains("10.1.3.1".parse().unwrap()));
        assert!(!c.contains("2001:db8::1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("1.2.3.4".parse().unwrap())
        );
        assert_eq!(Cidr::parse("10.0.0.1").unwrap().len, 32);
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
        assert_eq!(Cidr::parse("nonsense/8"), None);
        assert_eq!(c.to_string(), "10.1.2.0/24");
    }

    #[test]
    fn only_proxied_fetches_of_allowed_hosts_are_explained() {
        let a = allowance();
        let proxied = hit(
            "198.51.100.10:80",
            "172.18.0.5:40000",
            Proto::Tcp,
            Some("allowed-a.bottle.test"),
        );
        assert_eq!(unexplained_hit(&proxied, &a), None);
        let tunnel = hit("198.51.100.10:443", "172.18.0.5:40000", Proto::Tcp, None);
        assert_eq!(unexplained_hit(&tunnel, &a), None);
        let bad = [
            // Another host through the proxy.
            hit(
                "198.51.100.10:80",
                "172.18.0.5:1",
                Proto::Tcp,
                Some("denied.bottle.test"),
            ),
            // Straight from a bottle network.
            hit(
                "198.51.100.10:80",
                "10.77.0.3:1",
                Proto::Tcp,
                Some("allowed-a.bottle.test"),
            ),
            // The bundle dialling metadata after a rebinding answer.
            hit(
                "169.254.169.254:80",
                "172.18.0.5:1",
                Proto::Tcp,
                Some("allowed-a.bottle.test"),
            ),
            // UDP never goes through the proxy.
            hit("198.51.100.10:443", "172.18.0.5:1", Proto::Udp, None),
            // A host address (NAT or a userland proxy in between).
            hit("127.0.0.1:4000", "127.0.0.1:1", Proto::Tcp, None),
        ];
        for h in bad {
            assert!(unexplained_hit(&h, &a).is_some(), "{h:?}");
        }
        let row = canary_row(
            "bottle A",
            &[
                proxied,
                hit("127.0.0.1:4000", "127.0.0.1:1", Proto::Tcp, None),
            ],
            &a,
        );
        assert_eq!(row.verdict, Verdict::Escape);
        assert!(row.detail.contains("127.0.0.1:4000"), "{}", row.detail);
        assert_eq!(canary_row("bottle A", &[], &a).verdict, Verdict::Pass);
    }

    #[test]
    fn relayed_connections_are_explained_only_where_the_manifest_names_them() {
        let a = allowance();
        // A bundle's relay to the pinned destination, whatever it carries.
        let relayed = hit("198.51.100.20:7070", "172.18.0.5:1", Proto::Tcp, None);
        assert_eq!(unexplained_hit(&relayed, &a), None);
        // The host's forwarder dials the named host service from loopback.
        let service = hit("127.0.0.1:5432", "127.0.0.1:2", Proto::Tcp, None);
        assert_eq!(unexplained_hit(&service, &a), None);
        let bad = [
            // The pinned destination straight from a bottle network.
            hit("198.51.100.20:7070", "10.77.0.3:1", Proto::Tcp, None),
            // Its other port, even from a bundle.
            hit("198.51.100.20:7071", "172.18.0.5:1", Proto::Tcp, None),
            // Another canary host.
            hit("198.51.100.21:7070", "172.18.0.5:1", Proto::Tcp, None),
            // A host service the manifest does not name.
            hit("127.0.0.1:5433", "127.0.0.1:2", Proto::Tcp, None),
            // UDP to the pinned address.
            hit("198.51.100.20:7070", "172.18.0.5:1", Proto::Udp, None),
        ];
        for h in bad {
            assert!(unexplained_hit(&h, &a).is_some(), "{h:?}");
        }
    }

    fn q(source: &str, name: &str) -> Recorded {
        Recorded {
            source: source.parse().unwrap(),
            name: name.into(),
            qtype: 1,
            transport: "udp",
        }
    }

    #[test]
    fn dns_escapes_and_pinned_lookups() {
        let a = DnsAllowance {
            bottle_subnets: vec![Cidr::parse("10.77.0.0/24").unwrap()],
            canary_names: vec!["exfil-abc.bottle.test".into()],
            pinned_names: vec!["allowed-a.bottle.test".into()],
        };
        let clean = dns_rows(
            "A",
            &[q("172.18.0.5:3000", "rebind-loopback.bottle.test")],
            &a,
        );
        assert!(
            clean.iter().all(|r| r.verdict == Verdict::Pass),
            "{clean:?}"
        );

        let from_bottle = dns_rows("A", &[q("10.77.0.3:53", "anything.example")], &a);
        assert_eq!(from_bottle[0].verdict, Verdict::Escape);
        // Forwarded by dockerd from the host's namespace: the source is not
        // a bottle, the name gives it away.
        let forwarded = dns_rows("A", &[q("192.0.2.1:5300", "x1.exfil-abc.bottle.test")], &a);
        assert_eq!(forwarded[0].verdict, Verdict::Escape);
        let pinned = dns_rows("A", &[q("172.18.0.5:3000", "allowed-a.bottle.test")], &a);
        assert_eq!(pinned[0].verdict, Verdict::Pass);
        assert_eq!(pinned[1].verdict, Verdict::Error);
    }

    #[test]
    fn the_upstream_control_needs_a_bundle_lookup() {
        let hosts = vec!["rebind-loopback.bottle.test".to_string()];
        let subnets = vec![Cidr::parse("10.77.0.0/24").unwrap()];
        let (row, ok) = upstream_control(
            "A",
            &[q("172.18.0.5:1", "rebind-loopback.bottle.test")],
            &hosts,
            &subnets,
        );
        assert!(ok);
        assert_eq!(row.verdict, Verdict::Pass);
        let (row, ok) = upstream_control(
            "A",
            &[q("10.77.0.3:1", "rebind-loopback.bottle.test")],
            &hosts,
            &subnets,
        );
        assert!(!ok);
        assert_eq!(row.verdict, Verdict::ControlFailed);
        assert!(!upstream_control("A", &[], &hosts, &subnets).1);
    }
}
