//! The positive controls from the host: the DNS recorder answers and
//! records, every canary listener is reachable, and the probe's network
//! probes reach from the host what they must not reach from a bottle.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use bottle_probe::contract::Targets;

use super::{A, Gate, PROBE_RUN_BOUND, PROBE_TIMEOUT_MS};
use crate::escape::canary::{self, Proto, Spec};
use crate::escape::dns;
use crate::escape::evidence;
use crate::escape::fixture;
use crate::escape::probe;
use crate::escape::report::Row;
use crate::escape::route;
use crate::escape::sys::Run;

impl Gate {
    /// The DNS recorder and the probe's network probes, from the host.
    pub(super) fn host_controls(&mut self) -> anyhow::Result<()> {
        let phase = "host control";
        let name = format!("control-{}.{}", self.token, dns::ZONE);
        let before = self.dns.queries().len();
        let answer = dns::query_udp(self.dns.addr(), &name);
        let recorded = self.dns.queries()[before..].iter().any(|q| q.name == name);
        let ok = recorded && matches!(answer, Ok((3, _)));
        self.report.rows.push(Row::control(
            phase,
            "control-dns-recorder",
            ok,
            format!("host query for {name}: answer {answer:?}, recorded {recorded}"),
        ));

        // Where the probe's bottle-only targets point on the host.
        let placeholder = Targets {
            internet_v4: canary::INTERNET.to_string(),
            internet_v6: canary::INTERNET_V6.to_string(),
            metadata: canary::METADATA.to_string(),
            private: canary::PRIVATE.to_string(),
            dns_server: canary::DNS.to_string(),
            host_loopback_port: self.port("host-loopback")?,
            host_any_port: self.port("host-any")?,
            gateway: String::new(),
            own_bundle: String::new(),
            other_bundle: String::new(),
            other_agent: String::new(),
            proxy: String::new(),
            allowed_host: fixture::allowed_host(A),
            denied_host: "denied.bottle.test".into(),
            credential_host: String::new(),
            redact_host: String::new(),
            supervise_url: String::new(),
            git_gate_url: String::new(),
            git_repo: String::new(),
            rebind_hosts: fixture::REBIND_HOSTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            canary_names: self.canary_names(),
            // On the host the services are at 127.0.0.1 and the pinned
            // canaries at their addresses: the blocked probes' controls.
            host_service_port: self.ports.host_service,
            host_service_unnamed_port: self.ports.unnamed_service,
            pinned_tcp_host: fixture::PINNED_TCP_HOST.into(),
            pinned_tcp_addr: canary::PINNED_TCP.to_string(),
            pinned_tcp_port: canary::PINNED_TCP_PORT,
            pinned_tcp_other_port: canary::PINNED_TCP_OTHER_PORT,
            other_tcp_host: fixture::OTHER_TCP_HOST.into(),
            other_tcp_addr: canary::OTHER_TCP.to_string(),
        };
        let config = probe::control_config(
            &self.token,
            PROBE_TIMEOUT_MS,
            &placeholder,
            &canary::INTERNET.to_string(),
        );
        // Nothing the control dials may leave this machine.
        for addr in probe::dialled_addresses(&config) {
            let ip: IpAddr = addr
                .parse()
                .with_context(|| format!("control target {addr:?}"))?;
            let out = self.sys.run("ip", &["route", "get", &addr])?;
            route::check_local(ip, &out).map_err(anyhow::Error::msg)?;
        }
        let path = self.write_config(&config)?;
        let hits_before = self.listeners.hits().len();
        let run = Run::new(
            &self.probe_bin.display().to_string(),
            &["--config".to_string(), path.display().to_string()],
        )
        .timeout(PROBE_RUN_BOUND);
        let out = self.sys.output(&run)?;
        // The probe dials the 0.0.0.0 listener only through a bottle's
        // gateway; from the host the harness reaches it at a canary address.
        let any = SocketAddr::from((canary::INTERNET, self.port("host-any")?));
        let any_seen = fetch_token(any).is_ok_and(|body| body.contains(&self.token));
        let (rows, outcomes) = probe::control_rows(phase, &out);
        self.report.rows.extend(rows);
        self.report.rows.push(Row::control(
            phase,
            "control-host-any",
            any_seen,
            format!(
                "harness GET http://{any}/: token {}",
                if any_seen { "seen" } else { "missing" }
            ),
        ));
        self.controls = outcomes;
        self.credential_detector_control(phase)?;
        self.split_detector_control(phase)?;
        // Every network listener must have been reached from the host: the
        // canaries are alive, independently of what the probe says.
        let hits = self.listeners.hits();
        let hits = &hits[hits_before..];
        for bound in &self.listeners.bound {
            let reached = hits.iter().any(|h| h.canary == bound.name);
            self.report.rows.push(Row::control(
                phase,
                &format!("control-listener-{}", bound.name),
                reached,
                format!(
                    "{} {} {}",
                    match bound.proto {
                        Proto::Tcp => "tcp",
                        Proto::Udp => "udp",
                    },
                    bound.addr,
                    if reached {
                        "reached from the host"
                    } else {
                        "never reached by the host-side probe"
                    }
                ),
            ));
        }
        Ok(())
    }

    /// The canaries a credential could reach in cleartext (80, and 443
    /// spoken in plain HTTP) must see the secret when the host sends it:
    /// otherwise a clean `credential-on-the-wire` row proves nothing.
    fn credential_detector_control(&mut self, phase: &str) -> anyhow::Result<()> {
        let secret = super::credential_secret(&self.token);
        let request = format!(
            "GET / HTTP/1.1\r\nHost: control\r\n{}: {secret}\r\nConnection: close\r\n\r\n",
            fixture::CREDENTIAL_HEADER
        );
        let seen = self.detector_sees(&request, &secret, &[80, 443]);
        let ok = seen.iter().all(|(_, s)| *s);
        for probe in CREDENTIAL_PROBES {
            self.extra_controls.insert(probe.to_string(), ok);
        }
        self.credential_detector = Some(ok);
        self.report.rows.push(Row::control(
            phase,
            "control-credential-detector",
            ok,
            format!("the secret sent from the host was seen at internet:80/443: {seen:?}"),
        ));
        Ok(())
    }

    /// Sends `request` from the host to the internet canary on each of
    /// `ports`: whether each recorded `needle` (the detector behind a row
    /// that looks for it in what the canaries received).
    pub(super) fn detector_sees(
        &self,
        request: &str,
        needle: &str,
        ports: &[u16],
    ) -> Vec<(u16, bool)> {
        ports
            .iter()
            .map(|&port| {
                let before = self.listeners.hits().len();
                let _ = exchange(SocketAddr::from((canary::INTERNET, port)), request);
                let hits = self.listeners.hits();
                let seen = evidence::carriers(&hits[before..], needle).next().is_some();
                (port, seen)
            })
            .collect()
    }

    pub(super) fn port(&self, name: &str) -> anyhow::Result<u16> {
        self.listeners
            .get(name)
            .map(|b| b.addr.port())
            .with_context(|| format!("no canary listener {name}"))
    }

    pub(super) fn canary_names(&self) -> Vec<String> {
        vec![format!("exfil-{}.{}", self.token, dns::ZONE)]
    }
}

/// The canary listeners of a run: `host_service` and `unnamed_service`
/// are the host loopback services the manifest names and does not name.
pub(super) fn listener_specs(host_service: u16, unnamed_service: u16) -> Vec<Spec> {
    let tcp = |name: &str, bind: SocketAddr| Spec {
        name: name.into(),
        bind,
        proto: Proto::Tcp,
    };
    vec![
        tcp("internet:80", SocketAddr::from((canary::INTERNET, 80))),
        tcp("internet:443", SocketAddr::from((canary::INTERNET, 443))),
        tcp("internet:8443", SocketAddr::from((canary::INTERNET, 8443))),
        Spec {
            name: "internet-udp:5353".into(),
            bind: SocketAddr::from((canary::INTERNET, 5353)),
            proto: Proto::Udp,
        },
        tcp(
            "internet-v6:80",
            SocketAddr::from((canary::INTERNET_V6, 80)),
        ),
        tcp("metadata:80", SocketAddr::from((canary::METADATA, 80))),
        tcp("private:80", SocketAddr::from((canary::PRIVATE, 80))),
        tcp(
            "other-bundle-stand-in",
            SocketAddr::from((canary::INTERNET, bottle_core::bundle::PROXY_PORT)),
        ),
        tcp(
            "host-loopback",
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        ),
        tcp(
            "host-any",
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)),
        ),
        tcp(
            HOST_SERVICE,
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, host_service)),
        ),
        tcp(
            "host-service-unnamed",
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, unnamed_service)),
        ),
        tcp(
            "pinned-tcp",
            SocketAddr::from((canary::PINNED_TCP, canary::PINNED_TCP_PORT)),
        ),
        tcp(
            "pinned-tcp-other-port",
            SocketAddr::from((canary::PINNED_TCP, canary::PINNED_TCP_OTHER_PORT)),
        ),
        tcp(
            "other-tcp",
            SocketAddr::from((canary::OTHER_TCP, canary::PINNED_TCP_PORT)),
        ),
    ]
}

/// The canary listener of the host service the manifest names.
pub(super) const HOST_SERVICE: &str = "host-service";

/// The in-bottle probes that put the credential's host in cleartext.
const CREDENTIAL_PROBES: &[&str] = &[
    "proxy-credential-cleartext",
    "proxy-credential-tunnel-plain",
];

/// A plain HTTP GET of `/` from `addr`: the whole response.
pub(super) fn fetch_token(addr: SocketAddr) -> anyhow::Result<String> {
    exchange(addr, "GET / HTTP/1.0\r\nHost: control\r\n\r\n")
}

/// Sends `request` to `addr` and reads the answer (bounded).
fn exchange(addr: SocketAddr, request: &str) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    stream.write_all(request.as_bytes())?;
    let mut body = String::new();
    stream.take(64 * 1024).read_to_string(&mut body)?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_cover_every_canary_address_and_fit_the_interface() {
        let specs = listener_specs(15432, 15433);
        for addr in canary::addresses() {
            if addr == IpAddr::V4(canary::DNS) || addr == IpAddr::V4(canary::METADATA_STANDIN) {
                continue;
            }
            assert!(
                specs.iter().any(|s| s.bind.ip() == addr),
                "{addr} has no listener"
            );
        }
        assert!(canary::IFACE.len() <= 15);
    }
}
