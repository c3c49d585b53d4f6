//! Ports, seen from the host: the relays' connections in A's audit log, A's
//! published port on the host's loopback and nowhere else, and A's routes
//! against B's (B publishes nothing).
//!
//! The relays' probes themselves run in every probing phase (the probe's
//! `ports` category: two in-bottle controls through the bundle, the
//! unnamed service, other ports, the pinned canary straight, another
//! canary host). A's full run ends with the audit flood, which rotates the
//! relay lines out of its log, so this phase runs the two controls again
//! and then reads `bottle logs --json`. A's probes (host loopback, the
//! gateway, the other bottle) ran while its forwarder held the published
//! port: a published port gave the box no way out.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bottle_probe::contract::{Outcome, ProbeResult, serve_reply};
use serde_json::Value;

use super::{BOTTLE_DIR, Bottle, Gate, PROBE_TIMEOUT_MS};
use crate::escape::canary;
use crate::escape::fixture;
use crate::escape::probe;
use crate::escape::report::{Expect, Observed, Row};
use crate::escape::route;
use crate::escape::sys::Output;

/// The relays' in-bottle controls, run again after the flood.
const RELAY_CONTROLS: &[&str] = &["host-service-control", "tcp-pinned-control"];

/// How long the box-side server answers (seconds).
const SERVE_FOR: u64 = 30;

/// How long the host waits for the published port to answer.
const PUBLISHED_WITHIN: Duration = Duration::from_secs(20);

/// How long the relays' lines may take to reach the log.
const LOGGED_WITHIN: Duration = Duration::from_secs(10);

impl Gate {
    /// The phase: the relays audited, the published port, the routes.
    pub(super) fn ports_phase(
        &mut self,
        phase: &str,
        a: &mut Bottle,
        b: &Bottle,
    ) -> anyhow::Result<()> {
        self.relay_audit(phase, a, b)?;
        self.published_port(phase, a);
        self.routes(phase, a, b);
        Ok(())
    }

    /// Runs the relays' controls in `a` again and finds each connection's
    /// `OPEN` and `CLOSE` lines in `bottle logs --json`.
    fn relay_audit(&mut self, phase: &str, a: &mut Bottle, b: &Bottle) -> anyhow::Result<()> {
        let targets = self.targets(a, b);
        let config = probe::bottle_config(
            &self.token,
            PROBE_TIMEOUT_MS,
            targets,
            RELAY_CONTROLS.iter().map(|s| s.to_string()).collect(),
        );
        let out = self.exec_probe(a, &config)?;
        let (rows, results) =
            probe::bottle_rows(phase, &out, &self.controls, &self.extra_controls, true);
        self.report.rows.extend(rows);
        let wanted = [
            (
                "audit-relay-host-service",
                "host-service-control",
                "host_service",
                self.ports.host_service,
            ),
            (
                "audit-relay-pinned-tcp",
                "tcp-pinned-control",
                "pinned_tcp",
                canary::PINNED_TCP_PORT,
            ),
        ];
        let mut logged = Vec::new();
        let mut log_error = None;
        bottle_test_support::eventually(LOGGED_WITHIN, || {
            match self.logs_json(&a.guard.name) {
                Ok(lines) => {
                    logged = lines;
                    log_error = None;
                }
                Err(e) => log_error = Some(e),
            }
            wanted
                .iter()
                .all(|(_, _, reason, port)| relay_lines(&logged, reason, *port) == (true, true))
        });
        for (row, control, reason, port) in wanted {
            self.report.rows.push(relay_row(
                phase,
                row,
                results.iter().find(|r| r.probe == control),
                log_error.as_deref(),
                &logged,
                reason,
                port,
            ));
        }
        Ok(())
    }

    /// `bottle logs --json NAME`, parsed line by line.
    fn logs_json(&self, name: &str) -> Result<Vec<Value>, String> {
        let out = self
            .sys
            .output(
                &self
                    .cli
                    .command(&["logs", "--json", name], Duration::from_secs(60)),
            )
            .map_err(|e| format!("{e:#}"))?;
        if !out.success() {
            return Err(format!(
                "`bottle logs --json` failed: {}",
                out.stderr.trim()
            ));
        }
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    }

    /// A's published port: a server in the box answers the host's
    /// `127.0.0.1:<port>` (the control), and nothing answers that port at
    /// any other address of this host, nor listens there (`ss`).
    fn published_port(&mut self, phase: &str, a: &Bottle) {
        let port = self.ports.publish;
        let token = self.token.clone();
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let others = self.host_addresses();
        let (served, control, reached, tried) = std::thread::scope(|s| {
            let (cli, name) = (self.cli.clone(), a.guard.name.clone());
            let token = token.clone();
            let server = s.spawn(move || {
                cli.exec(
                    &name,
                    &[
                        format!("{BOTTLE_DIR}/bottle-probe"),
                        "--child".into(),
                        "serve".into(),
                        fixture::PUBLISH_AGENT_PORT.to_string(),
                        token,
                        SERVE_FOR.to_string(),
                    ],
                    Duration::from_secs(SERVE_FOR + 60),
                )
            });
            let deadline = Instant::now() + PUBLISHED_WITHIN;
            let mut control = Err(String::from("not tried"));
            while Instant::now() < deadline {
                match super::controls::fetch_token(loopback) {
                    Ok(body) if body.contains(&serve_reply(&self.token)) => {
                        control = Ok(body);
                        break;
                    }
                    Ok(body) => control = Err(format!("answered without the token: {body:?}")),
                    Err(e) => control = Err(format!("{e:#}")),
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            // While the box's server answers: any other address of this
            // host, on the published port.
            let mut reached = Vec::new();
            let mut tried = Vec::new();
            for ip in &others {
                let addr = SocketAddr::new(*ip, port);
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(_) => reached.push(format!("{addr} accepted a connection")),
                    Err(e) => tried.push(format!("{addr}: {e}")),
                }
            }
            (server.join(), control, reached, tried)
        });
        let served = match served {
            Ok(Ok(out)) => format!("box server: {}", one_line(&out.stdout)),
            Ok(Err(e)) => format!("box server: {e:#}"),
            Err(_) => "box server: the thread panicked".into(),
        };
        let control_ok = control.is_ok();
        self.report.rows.push(Row::new(
            phase,
            "control-publish-loopback",
            "control",
            Expect::Reached,
            Observed::reached_if(control_ok),
            None,
            match &control {
                Ok(_) => {
                    format!("the host's {loopback} answered with the box server's token ({served})")
                }
                Err(e) => format!("the host's {loopback}: {e} ({served})"),
            },
        ));
        let listening = self.sys.run("ss", &["-Hltn"]);
        let (observed, detail) = match listening {
            Err(e) => (Observed::Error, format!("`ss -Hltn` failed: {e:#}")),
            Ok(text) => {
                let locals = listening_on(&text, port);
                let outside: Vec<&String> = locals.iter().filter(|l| !is_loopback(l)).collect();
                if !outside.is_empty() || !reached.is_empty() {
                    (
                        Observed::Reached,
                        format!(
                            "port {port} listens at {locals:?}; reached: {}",
                            reached.join("; ")
                        ),
                    )
                } else if locals.is_empty() {
                    (
                        Observed::Error,
                        format!("`ss` shows no listener on port {port}: nothing to judge"),
                    )
                } else {
                    (
                        Observed::Blocked,
                        format!(
                            "port {port} listens only at {locals:?}; refused at {}",
                            tried.join("; ")
                        ),
                    )
                }
            }
        };
        self.report.rows.push(Row::new(
            phase,
            "publish-loopback-only",
            "ports",
            Expect::Blocked,
            observed,
            Some(control_ok),
            detail,
        ));
    }

    /// This host's IPv4 addresses outside loopback, each checked to route
    /// locally (the row dials only this machine).
    fn host_addresses(&self) -> Vec<IpAddr> {
        let Ok(text) = self.sys.run("ip", &["-o", "-4", "addr", "show"]) else {
            return Vec::new();
        };
        route::parse_addr_show(&text)
            .into_iter()
            .filter(|ip| !ip.is_loopback())
            .filter(|ip| {
                self.sys
                    .run("ip", &["route", "get", &ip.to_string()])
                    .is_ok_and(|out| route::check_local(*ip, &out).is_ok())
            })
            .collect()
    }

    /// A's routing table has the shape of B's, which publishes nothing:
    /// the published port added no route.
    fn routes(&mut self, phase: &str, a: &Bottle, b: &Bottle) {
        let read = |bottle: &Bottle| -> Result<Vec<RouteShape>, String> {
            let out: Output = self
                .cli
                .exec(
                    &bottle.guard.name,
                    &["cat", "/proc/net/route"],
                    Duration::from_secs(30),
                )
                .map_err(|e| format!("{e:#}"))?;
            if !out.success() {
                return Err(format!("cat /proc/net/route: {}", out.stderr.trim()));
            }
            Ok(route_shapes(&out.stdout))
        };
        let (with, without) = (read(a), read(b));
        let control = without.as_ref().is_ok_and(|r| !r.is_empty());
        let (observed, detail) = match (&with, &without) {
            (Ok(with), Ok(without)) if with == without => (
                Observed::Blocked,
                format!("A (publishing) routes as B (not): {with:?}"),
            ),
            (Ok(with), Ok(without)) => (
                Observed::Reached,
                format!("A (publishing) routes {with:?}, B (not) {without:?}"),
            ),
            (Err(e), _) | (_, Err(e)) => (Observed::Error, e.clone()),
        };
        self.report.rows.push(Row::new(
            phase,
            "publish-no-route",
            "ports",
            Expect::Blocked,
            observed,
            Some(control),
            detail,
        ));
    }
}

/// Whether `logged` holds the relay's `OPEN` line and a `CLOSE` line that
/// carried bytes back, for `reason` on `port`.
fn relay_lines(logged: &[Value], reason: &str, port: u16) -> (bool, bool) {
    let of = |v: &&Value, method: &str| {
        v["daemon"] == "relay"
            && v["decision"] == "allow"
            && v["reason"] == reason
            && v["port"] == port
            && v["method"] == method
    };
    (
        logged.iter().any(|v| of(&v, "OPEN")),
        logged
            .iter()
            .any(|v| of(&v, "CLOSE") && v["bytes_down"].as_u64().is_some_and(|n| n > 0)),
    )
}

/// The row for one relay's audit lines; its control is the in-bottle
/// control that made the connection.
fn relay_row(
    phase: &str,
    row: &str,
    control: Option<&ProbeResult>,
    log_error: Option<&str>,
    logged: &[Value],
    reason: &str,
    port: u16,
) -> Row {
    let (observed, detail) = match (control, log_error) {
        (None, _) => (Observed::Error, "the relay's control did not run".into()),
        (Some(r), _) if r.outcome != Outcome::Reached => (
            Observed::Error,
            format!(
                "the relay's control did not reach: {}",
                one_line(&r.observed)
            ),
        ),
        (_, Some(e)) => (Observed::Error, e.to_string()),
        _ => match relay_lines(logged, reason, port) {
            (true, true) => (
                Observed::Reached,
                format!(
                    "`relay` OPEN and CLOSE lines ({reason}, port {port}) in `bottle logs --json`"
                ),
            ),
            (open, close) => (
                Observed::Blocked,
                format!(
                    "{} lines logged; OPEN {open}, CLOSE with bytes back {close} ({reason}, port {port})",
                    logged.len()
                ),
            ),
        },
    };
    Row::new(phase, row, "audit", Expect::Reached, observed, None, detail)
}

/// One route of `/proc/net/route`, addresses left out (two bottles have
/// different subnets): its interface, whether it is a default route,
/// whether it goes through a gateway, its mask.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RouteShape {
    iface: String,
    default: bool,
    via_gateway: bool,
    mask: String,
}

fn route_shapes(table: &str) -> Vec<RouteShape> {
    let mut shapes: Vec<RouteShape> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(RouteShape {
                iface: f.first()?.to_string(),
                default: *f.get(1)? == "00000000",
                via_gateway: *f.get(2)? != "00000000",
                mask: f.get(7)?.to_string(),
            })
        })
        .collect();
    shapes.sort();
    shapes
}

/// The local addresses `ss -Hltn` lists for `port`.
fn listening_on(ss: &str, port: u16) -> Vec<String> {
    let suffix = format!(":{port}");
    ss.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|local| local.ends_with(&suffix))
        .map(str::to_string)
        .collect()
}

/// Whether an `ss` local address (`127.0.0.1:80`, `[::1]:80`,
/// `127.0.0.1%lo:80`) is on loopback.
fn is_loopback(local: &str) -> bool {
    local.starts_with("127.") || local.starts_with("[::1]")
}

fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_found_by_port_and_judged_by_address() {
        let ss = "LISTEN 0 128 127.0.0.1:41234 0.0.0.0:*\nLISTEN 0 4096 0.0.0.0:22 0.0.0.0:*\nLISTEN 0 128 [::]:41234 [::]:*\nLISTEN 0 5 127.0.0.1:141234 0.0.0.0:*\n";
        let locals = listening_on(ss, 41234);
        assert_eq!(locals, ["127.0.0.1:41234", "[::]:41234"]);
        assert!(is_loopback(&locals[0]));
        assert!(!is_loopback(&locals[1]));
        assert!(is_loopback("[::1]:41234"));
        assert!(!is_loopback("172.17.0.1:41234"));
    }

    #[test]
    fn routes_compare_by_shape_not_address() {
        let head =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
        let a = format!("{head}eth0\t0010A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n");
        let b = format!("{head}eth0\t0011A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n");
        assert_eq!(route_shapes(&a), route_shapes(&b));
        let with_default =
            format!("{a}eth0\t00000000\t0110A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n");
        assert_ne!(route_shapes(&with_default), route_shapes(&b));
        assert_eq!(route_shapes(head), []);
    }

    #[test]
    fn a_relay_needs_its_open_and_a_close_that_carried_bytes() {
        let line = |method: &str, port: u16, down: u64| {
            serde_json::json!({"daemon": "relay", "decision": "allow", "reason": "pinned_tcp",
                "port": port, "method": method, "bytes_down": down})
        };
        let logged = [line("OPEN", 7070, 0), line("CLOSE", 7070, 40)];
        assert_eq!(relay_lines(&logged, "pinned_tcp", 7070), (true, true));
        assert_eq!(relay_lines(&logged, "host_service", 7070), (false, false));
        assert_eq!(relay_lines(&logged[..1], "pinned_tcp", 7070), (true, false));
        let empty = [line("OPEN", 7070, 0), line("CLOSE", 7070, 0)];
        assert_eq!(relay_lines(&empty, "pinned_tcp", 7070), (true, false));
        let reached = ProbeResult {
            probe: "tcp-pinned-control".into(),
            category: "ports".into(),
            expected: String::new(),
            outcome: Outcome::Reached,
            observed: String::new(),
            network: false,
        };
        let row = relay_row("p", "r", Some(&reached), None, &logged, "pinned_tcp", 7070);
        assert_eq!(row.verdict, crate::escape::report::Verdict::Pass);
        let row = relay_row("p", "r", Some(&reached), None, &[], "pinned_tcp", 7070);
        assert_eq!(row.verdict, crate::escape::report::Verdict::ControlFailed);
        let row = relay_row("p", "r", None, None, &logged, "pinned_tcp", 7070);
        assert_ne!(row.verdict, crate::escape::report::Verdict::Pass);
    }
}
