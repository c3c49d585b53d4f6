//! The probe's side of a run: the configs the gate writes for it (in a
//! bottle, and on the host as the positive control) and the rows its JSON
//! lines become. The types are the probe crate's own
//! ([`bottle_probe::contract`]), so the two cannot drift apart.

use std::collections::BTreeMap;

use bottle_probe::contract::{Outcome, ProbeConfig, ProbeResult, Targets};

use super::report::{Expect, Observed, Row};
use super::sys::Output;

/// In-bottle probes that must *reach* their target: the proxy's positive
/// control (the allowlisted host through the bundle) and git-gate's (a
/// plain push to an allowed branch lands). Every other in-bottle probe
/// must be blocked. Both go through the bundle, so after a fault they are
/// expected blocked too; the git probes are not re-run after faults at
/// all (their category is neither network nor proxy).
pub(crate) const IN_BOTTLE_CONTROLS: &[&str] = &[
    "proxy-allowed-control",
    "proxy-websocket-control",
    "git-push-plain-control",
    "host-service-control",
    "tcp-pinned-control",
];

/// Whether an in-bottle result is a positive control.
pub(crate) fn is_in_bottle_control(result: &ProbeResult) -> bool {
    IN_BOTTLE_CONTROLS.contains(&result.probe.as_str())
}

/// The lines of the probe's stdout: the results, and every line that was
/// not one (each fails the run).
pub(crate) fn parse_output(stdout: &str) -> (Vec<ProbeResult>, Vec<String>) {
    let mut results = Vec::new();
    let mut bad = Vec::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match serde_json::from_str::<ProbeResult>(line) {
            Ok(result) => results.push(result),
            Err(err) => bad.push(format!("{err}: {line}")),
        }
    }
    (results, bad)
}

fn observed(outcome: Outcome) -> Observed {
    match outcome {
        Outcome::Blocked => Observed::Blocked,
        Outcome::Reached => Observed::Reached,
        Outcome::Error => Observed::Error,
    }
}

fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 240 {
        let cut: String = flat.chars().take(240).collect();
        format!("{cut}...")
    } else {
        flat
    }
}

/// Rows for a probe run that did not produce usable output (`None`: it
/// did). A probe that exits non-zero after printing results is fine: the
/// results speak.
fn failed_run(
    phase: &str,
    what: &str,
    out: &Output,
    results: &[ProbeResult],
    bad: &[String],
) -> Vec<Row> {
    let mut rows = Vec::new();
    if results.is_empty() || out.timed_out {
        rows.push(Row::new(
            phase,
            what,
            "harness",
            Expect::Blocked,
            Observed::Error,
            None,
            one_line(&format!(
                "the probe produced {} results ({}; exit {:?}): {}",
                results.len(),
                if out.timed_out {
                    "timed out"
                } else {
                    "finished"
                },
                out.code,
                out.stderr
            )),
        ));
    }
    for line in bad {
        rows.push(Row::new(
            phase,
            what,
            "harness",
            Expect::Blocked,
            Observed::Error,
            None,
            one_line(&format!("not a result line: {line}")),
        ));
    }
    rows
}

/// The rows of the host-side control run, and each network probe's
/// control outcome by name (true: it reached its canary).
pub(crate) fn control_rows(phase: &str, out: &Output) -> (Vec<Row>, BTreeMap<String, bool>) {
    let (results, bad) = parse_output(&out.stdout);
    let mut rows = failed_run(phase, "probe-control-run", out, &results, &bad);
    // A failed control run fails the run (the rows above are errors); the
    // results it did print still count.
    let mut outcomes = BTreeMap::new();
    for r in &results {
        let reached = r.outcome == Outcome::Reached;
        outcomes.insert(r.probe.clone(), reached);
        rows.push(Row::new(
            phase,
            &r.probe,
            "control",
            Expect::Reached,
            observed(r.outcome),
            None,
            one_line(&r.observed),
        ));
    }
    (rows, outcomes)
}

/// Two controls for one probe: failed if either failed, passed if either
/// ran and none failed, `None` if neither exists.
pub(crate) fn combine(a: Option<&bool>, b: Option<&bool>) -> Option<bool> {
    match (a.copied(), b.copied()) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (None, None) => None,
        _ => Some(true),
    }
}

/// The rows of an in-bottle run. `controls` are the host-side outcomes by
/// probe name; a blocked probe whose control failed proves nothing.
/// `proxy_expected` says whether the proxy's positive control must reach
/// (false after the bundle was killed: then it must fail too).
pub(crate) fn bottle_rows(
    phase: &str,
    out: &Output,
    controls: &BTreeMap<String, bool>,
    extra_controls: &BTreeMap<String, bool>,
    proxy_expected: bool,
) -> (Vec<Row>, Vec<ProbeResult>) {
    let (results, bad) = parse_output(&out.stdout);
    let mut rows = failed_run(phase, "probe-run", out, &results, &bad);
    for r in &results {
        let expect = if is_in_bottle_control(r) && proxy_expected {
            Expect::Reached
        } else {
            Expect::Blocked
        };
        let control = combine(controls.get(&r.probe), extra_controls.get(&r.probe));
        let category = if is_in_bottle_control(r) && proxy_expected {
            "control".to_string()
        } else {
            r.category.clone()
        };
        rows.push(Row::new(
            phase,
            &r.probe,
            &category,
            expect,
            observed(r.outcome),
            control,
            one_line(&r.observed),
        ));
    }
    (rows, results)
}

/// The probe's name for the proxy probe of a rebinding host
/// (`rebind-loopback.bottle.test` -> `proxy-rebind-loopback`), as the
/// probe names it.
pub(crate) fn rebind_probe_name(host: &str) -> String {
    let label = host.split('.').next().unwrap_or(host);
    let label = label.strip_prefix("rebind-").unwrap_or(label);
    let clean: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("proxy-rebind-{clean}")
}

/// The config for a bottle: everything real, nothing else.
pub(crate) fn bottle_config(
    token: &str,
    timeout_ms: u64,
    targets: Targets,
    only: Vec<String>,
) -> ProbeConfig {
    ProbeConfig {
        token: token.to_string(),
        control: false,
        only,
        skip: Vec::new(),
        isolation: String::new(),
        timeout_ms,
        targets,
    }
}

/// The host-side control config: the same canaries, with every
/// bottle-only address (bundles, agents, gateways, the proxy, which the
/// host cannot or must not reach) left empty — the probe leaves a probe
/// with an empty target out of a control run — except the other bottle's
/// bundle, which points at `other_bundle_stand_in`, a canary listening on
/// the proxy port. So the control never sends anything off this machine.
pub(crate) fn control_config(
    token: &str,
    timeout_ms: u64,
    bottle: &Targets,
    other_bundle_stand_in: &str,
) -> ProbeConfig {
    let mut targets = bottle.clone();
    targets.gateway = String::new();
    targets.own_bundle = String::new();
    targets.other_bundle = other_bundle_stand_in.to_string();
    targets.other_agent = String::new();
    targets.proxy = String::new();
    targets.git_gate_url = String::new();
    ProbeConfig {
        token: token.to_string(),
        control: true,
        only: Vec::new(),
        skip: Vec::new(),
        isolation: String::new(),
        timeout_ms,
        targets,
    }
}

/// Every IP address a config makes the probe dial (for the route check).
pub(crate) fn dialled_addresses(config: &ProbeConfig) -> Vec<String> {
    let t = &config.targets;
    let mut out = vec![
        t.internet_v4.clone(),
        t.internet_v6.clone(),
        t.metadata.clone(),
        t.private.clone(),
        t.dns_server.clone(),
        t.gateway.clone(),
        t.own_bundle.clone(),
        t.other_bundle.clone(),
        t.other_agent.clone(),
        t.pinned_tcp_addr.clone(),
        t.other_tcp_addr.clone(),
    ];
    out.retain(|a| !a.is_empty());
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::report::Verdict;

    fn line(probe: &str, outcome: &str) -> String {
        format!(
            r#"{{"probe":"{probe}","category":"network","expected":"refused","outcome":"{outcome}","observed":"seen  it\n twice","network":true}}"#
        )
    }

    fn out(stdout: String) -> Output {
        Output {
            code: Some(0),
            stdout,
            stderr: String::new(),
            timed_out: false,
        }
    }

    #[test]
    fn output_lines_parse_and_garbage_is_kept() {
        let text = format!(
            "{}\n\n{}\nnot json\n",
            line("a", "blocked"),
            line("b", "reached")
        );
        let (results, bad) = parse_output(&text);
        assert_eq!(results.len(), 2);
        assert_eq!(results[1].outcome, Outcome::Reached);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].ends_with("not json"), "{bad:?}");
    }

    #[test]
    fn controls_must_reach() {
        let (rows, outcomes) = control_rows(
            "host",
            &out(format!(
                "{}\n{}",
                line("a", "reached"),
                line("b", "blocked")
            )),
        );
        assert_eq!(rows[0].verdict, Verdict::Pass);
        assert_eq!(rows[0].detail, "seen it twice");
        assert_eq!(rows[1].verdict, Verdict::ControlFailed);
        assert_eq!(
            outcomes,
            BTreeMap::from([("a".into(), true), ("b".into(), false)])
        );
        let (rows, _) = control_rows("host", &out(String::new()));
        assert_eq!(
            rows[0].verdict,
            Verdict::Error,
            "an empty control run is not a pass"
        );
    }

    #[test]
    fn bottle_rows_use_the_controls() {
        let controls = BTreeMap::from([("a".to_string(), true), ("b".to_string(), false)]);
        let text = [
            line("a", "blocked"),
            line("b", "blocked"),
            line("c", "reached"),
            line("d", "error"),
            line("proxy-allowed-control", "reached"),
            line("git-push-plain-control", "blocked"),
        ]
        .join("\n");
        let (rows, results) =
            bottle_rows("A", &out(text.clone()), &controls, &BTreeMap::new(), true);
        assert_eq!(results.len(), 6);
        let verdicts: Vec<Verdict> = rows.iter().map(|r| r.verdict).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Pass,
                Verdict::ControlFailed,
                Verdict::Escape,
                Verdict::Error,
                Verdict::Pass,
                Verdict::ControlFailed
            ]
        );
        assert_eq!(rows[5].category, "control");
        // With the bundle gone the proxy must fail as well.
        let (rows, _) = bottle_rows("A", &out(text), &controls, &BTreeMap::new(), false);
        assert_eq!(rows[4].verdict, Verdict::Escape);
    }

    #[test]
    fn controls_combine_to_the_weakest() {
        assert_eq!(combine(None, None), None);
        assert_eq!(combine(Some(&true), None), Some(true));
        assert_eq!(combine(None, Some(&true)), Some(true));
        assert_eq!(combine(Some(&true), Some(&false)), Some(false));
        assert_eq!(combine(Some(&false), None), Some(false));
    }

    #[test]
    fn rebind_probe_names_match_the_probe() {
        assert_eq!(
            rebind_probe_name("rebind-loopback.bottle.test"),
            "proxy-rebind-loopback"
        );
        assert_eq!(
            rebind_probe_name("rebind-bundle-a.bottle.test"),
            "proxy-rebind-bundle-a"
        );
    }

    #[test]
    fn a_crashed_probe_is_an_error() {
        let mut crashed = out(String::new());
        crashed.code = Some(139);
        crashed.stderr = "segfault".into();
        let (rows, _) = bottle_rows("A", &crashed, &BTreeMap::new(), &BTreeMap::new(), true);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].verdict, Verdict::Error);
        assert!(rows[0].detail.contains("segfault"), "{}", rows[0].detail);
    }

    fn targets() -> Targets {
        Targets {
            internet_v4: "198.51.100.10".into(),
            internet_v6: "2001:db8::10".into(),
            metadata: "169.254.169.254".into(),
            private: "10.213.77.10".into(),
            dns_server: "203.0.113.53".into(),
            host_loopback_port: 1,
            host_any_port: 2,
            gateway: "10.77.0.1".into(),
            own_bundle: "10.77.0.2".into(),
            other_bundle: "10.77.1.2".into(),
            other_agent: "10.77.1.3".into(),
            proxy: "http://10.77.0.2:8888".into(),
            allowed_host: "allowed-a.bottle.test".into(),
            denied_host: "denied.bottle.test".into(),
            credential_host: String::new(),
            redact_host: String::new(),
            supervise_url: String::new(),
            git_gate_url: String::new(),
            git_repo: String::new(),
            rebind_hosts: vec![],
            canary_names: vec![],
            host_service_port: 3,
            host_service_unnamed_port: 4,
            pinned_tcp_host: "pinned-tcp.bottle.test".into(),
            pinned_tcp_addr: "198.51.100.20".into(),
            pinned_tcp_port: 7070,
            pinned_tcp_other_port: 7071,
            other_tcp_host: "other-tcp.bottle.test".into(),
            other_tcp_addr: "198.51.100.21".into(),
        }
    }

    #[test]
    fn the_control_never_aims_at_bottle_addresses() {
        let config = control_config("t", 500, &targets(), "198.51.100.10");
        assert!(config.control);
        assert_eq!(
            dialled_addresses(&config),
            [
                "10.213.77.10",
                "169.254.169.254",
                "198.51.100.10",
                "198.51.100.20",
                "198.51.100.21",
                "2001:db8::10",
                "203.0.113.53"
            ]
        );
        assert_eq!(config.targets.proxy, "");
        let bottle = bottle_config("t", 500, targets(), vec![]);
        assert!(!bottle.control);
        assert!(dialled_addresses(&bottle).contains(&"10.77.1.3".to_string()));
    }
}
