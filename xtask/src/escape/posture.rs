//! The agent's confinement, checked from the host side: the container's
//! configuration as the Engine reports it, and the kernel's view of every
//! process in it (`/proc/<pid>/status`, its cgroup limits). What the probe
//! reports from inside could be fooled by a compromised image; this cannot.

use std::path::Path;

use serde_json::Value;

use super::report::{Expect, Observed, Row};

/// What the spec says the agent must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// Memory limit in bytes.
    pub memory: i64,
    /// PID limit.
    pub pids: i64,
    /// The bottle's internal network (the only one the agent may be on).
    pub network: String,
    /// The Engine runtime the agent must run under (`Some("runsc")` for a
    /// gVisor box; `None`: the daemon's default, not checked).
    pub runtime: Option<String>,
}

/// The fields of `/proc/<pid>/status` the gate checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// `Name`.
    pub name: String,
    /// `CapEff`, `CapPrm`, `CapBnd`, `CapAmb` as hex strings.
    pub cap_eff: String,
    /// Permitted.
    pub cap_prm: String,
    /// Bounding set.
    pub cap_bnd: String,
    /// Ambient.
    pub cap_amb: String,
    /// `NoNewPrivs`.
    pub no_new_privs: String,
    /// `Seccomp` (0 off, 1 strict, 2 filter).
    pub seccomp: String,
}

/// Parses `/proc/<pid>/status`.
pub(crate) fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        match key {
            "Name" => s.name = value,
            "CapEff" => s.cap_eff = value,
            "CapPrm" => s.cap_prm = value,
            "CapBnd" => s.cap_bnd = value,
            "CapAmb" => s.cap_amb = value,
            "NoNewPrivs" => s.no_new_privs = value,
            "Seccomp" => s.seccomp = value,
            _ => {}
        }
    }
    s
}

/// Why a process's status breaks the spec (empty: it does not).
pub(crate) fn status_problems(s: &Status) -> Vec<String> {
    let zero = |v: &str| !v.is_empty() && v.chars().all(|c| c == '0');
    let mut problems = Vec::new();
    for (field, value) in [
        ("CapEff", &s.cap_eff),
        ("CapPrm", &s.cap_prm),
        ("CapBnd", &s.cap_bnd),
        ("CapAmb", &s.cap_amb),
    ] {
        if !zero(value) {
            problems.push(format!("{field}={value}"));
        }
    }
    if s.no_new_privs != "1" {
        problems.push(format!("NoNewPrivs={}", s.no_new_privs));
    }
    if s.seccomp != "2" {
        problems.push(format!("Seccomp={} (want 2, filter)", s.seccomp));
    }
    problems
}

/// The cgroup path of `controller` from `/proc/<pid>/cgroup` (v1 lines
/// `N:controller[,other]:/path`, or the v2 line `0::/path`).
pub(crate) fn cgroup_path(text: &str, controller: &str) -> Option<String> {
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == controller) {
            return Some(path.to_string());
        }
        if controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    v2
}

/// Reads a cgroup limit file for `pid` (v1 or v2 layout); `None` when it
/// cannot be found.
pub(crate) fn cgroup_limit(
    pid: u32,
    controller: &str,
    v1_file: &str,
    v2_file: &str,
) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroup_path(&text, controller)?;
    let path = path.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(path)
        .join(v1_file);
    let v2 = Path::new("/sys/fs/cgroup").join(path).join(v2_file);
    std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .ok()
        .map(|s| s.trim().to_string())
}

/// One posture row: `problems` empty means the attack surface is closed.
fn row(phase: &str, probe: &str, problems: Vec<String>, ok: &str) -> Row {
    let (observed, detail) = if problems.is_empty() {
        (Observed::Blocked, ok.to_string())
    } else {
        (Observed::Reached, problems.join("; "))
    };
    Row::new(
        phase,
        probe,
        "posture",
        Expect::Blocked,
        observed,
        None,
        detail,
    )
}

/// Checks the agent container's inspect document against `spec`.
pub(crate) fn check_inspect(phase: &str, inspect: &Value, spec: &Spec) -> Vec<Row> {
    let host = &inspect["HostConfig"];
    let mut rows = Vec::new();

    let mut caps = Vec::new();
    let drop: Vec<&str> = host["CapDrop"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !drop.iter().any(|c| c.eq_ignore_ascii_case("ALL")) {
        caps.push(format!("CapDrop is {drop:?}, not ALL"));
    }
    if let Some(add) = host["CapAdd"].as_array().filter(|a| !a.is_empty()) {
        caps.push(format!("CapAdd is {add:?}"));
    }
    if host["Privileged"].as_bool() == Some(true) {
        caps.push("Privileged".into());
    }
    rows.push(row(
        phase,
        "host-caps-config",
        caps,
        "CapDrop ALL, no CapAdd, not privileged",
    ));

    let security: Vec<&str> = host["SecurityOpt"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut sec = Vec::new();
    if !security
        .iter()
        .any(|o| *o == "no-new-privileges" || *o == "no-new-privileges:true")
    {
        sec.push(format!("SecurityOpt {security:?} lacks no-new-privileges"));
    }
    if security
        .iter()
        .any(|o| o.starts_with("seccomp=unconfined") || o.starts_with("seccomp:unconfined"))
    {
        sec.push("seccomp unconfined".into());
    }
    if security
        .iter()
        .any(|o| o.contains("apparmor=unconfined") || o.contains("apparmor:unconfined"))
    {
        sec.push("apparmor unconfined".into());
    }
    rows.push(row(
        phase,
        "host-security-opt",
        sec,
        "no-new-privileges, default seccomp",
    ));

    if let Some(runtime) = &spec.runtime {
        let found = host["Runtime"].as_str().unwrap_or("");
        let problems = if found == runtime {
            Vec::new()
        } else {
            vec![format!("Runtime {found:?}, want {runtime:?}")]
        };
        rows.push(row(
            phase,
            "host-runtime",
            problems,
            &format!("the Engine runs the agent under {runtime}"),
        ));
    }

    let mut limits = Vec::new();
    if host["Memory"].as_i64() != Some(spec.memory) {
        limits.push(format!("Memory {} != {}", host["Memory"], spec.memory));
    }
    if host["MemorySwap"].as_i64() != Some(spec.memory) {
        limits.push(format!(
            "MemorySwap {} != {} (swap on top of the limit)",
            host["MemorySwap"], spec.memory
        ));
    }
    if host["PidsLimit"].as_i64() != Some(spec.pids) {
        limits.push(format!("PidsLimit {} != {}", host["PidsLimit"], spec.pids));
    }
    rows.push(row(
        phase,
        "host-limits-config",
        limits,
        &format!("memory {} bytes, pids {}", spec.memory, spec.pids),
    ));

    let mut ns = Vec::new();
    for (key, bad) in [
        ("PidMode", "host"),
        ("IpcMode", "host"),
        ("UTSMode", "host"),
        ("UsernsMode", "host"),
    ] {
        if host[key].as_str() == Some(bad) {
            ns.push(format!("{key}={bad}"));
        }
    }
    if host["NetworkMode"].as_str() != Some(spec.network.as_str()) {
        ns.push(format!(
            "NetworkMode {} (want {})",
            host["NetworkMode"], spec.network
        ));
    }
    let networks: Vec<&String> = inspect["NetworkSettings"]["Networks"]
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    if networks.len() != 1 || networks[0] != &spec.network {
        ns.push(format!(
            "attached to {networks:?}, want only {}",
            spec.network
        ));
    }
    if host["Devices"].as_array().is_some_and(|d| !d.is_empty()) {
        ns.push(format!("devices {}", host["Devices"]));
    }
    rows.push(row(
        phase,
        "host-namespaces",
        ns,
        "own pid/ipc/uts namespaces, only the bottle network, no devices",
    ));

    let mut mounts = Vec::new();
    for mount in inspect["Mounts"].as_array().into_iter().flatten() {
        let kind = mount["Type"].as_str().unwrap_or("");
        let dest = mount["Destination"].as_str().unwrap_or("");
        let rw = mount["RW"].as_bool().unwrap_or(true);
        // The two binds the backend makes, read-only: the agent's empty
        // resolv.conf, and the box directory of its state dir holding the
        // keep-alive and the in-box agent.
        let source = mount["Source"].as_str().unwrap_or("");
        let allowed = kind == "bind"
            && !rw
            && (dest == "/etc/resolv.conf" || (dest == "/.bottle" && source.ends_with("/box")));
        if !allowed && (kind == "bind" || rw) {
            mounts.push(format!(
                "{kind} {} -> {dest}{}",
                mount["Source"].as_str().unwrap_or("?"),
                if rw { " (rw)" } else { "" }
            ));
        }
    }
    let sock = inspect["HostConfig"]["Binds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|b| b.contains("docker.sock"))
        .count();
    if sock > 0 {
        mounts.push("the Docker socket is mounted".into());
    }
    rows.push(row(
        phase,
        "host-mounts",
        mounts,
        "no host mounts besides a read-only resolv.conf and box (/.bottle)",
    ));
    rows
}

/// Checks a microVM bottle's bundle container (smolmachines): hardened
/// like every container bottle runs (no capabilities, no-new-privileges,
/// seccomp on, no host namespaces or devices, no Docker socket), and on
/// exactly its bottle's bridge `network` and the shared egress network.
pub(crate) fn check_bundle_inspect(phase: &str, inspect: &Value, network: &str) -> Vec<Row> {
    let host = &inspect["HostConfig"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    let mut caps = Vec::new();
    let drop = strings(&host["CapDrop"]);
    if !drop.iter().any(|c| c.eq_ignore_ascii_case("ALL")) {
        caps.push(format!("CapDrop is {drop:?}, not ALL"));
    }
    let add = strings(&host["CapAdd"]);
    if !add.is_empty() {
        caps.push(format!("CapAdd is {add:?}"));
    }
    if host["Privileged"].as_bool() == Some(true) {
        caps.push("Privileged".into());
    }
    let security = strings(&host["SecurityOpt"]);
    if !security
        .iter()
        .any(|o| o == "no-new-privileges" || o == "no-new-privileges:true")
    {
        caps.push(format!("SecurityOpt {security:?} lacks no-new-privileges"));
    }
    if security.iter().any(|o| o.contains("unconfined")) {
        caps.push(format!("SecurityOpt {security:?} is unconfined"));
    }
    let mut ns = Vec::new();
    for key in ["PidMode", "IpcMode", "UTSMode", "UsernsMode", "NetworkMode"] {
        if host[key].as_str() == Some("host") {
            ns.push(format!("{key}=host"));
        }
    }
    if host["Devices"].as_array().is_some_and(|d| !d.is_empty()) {
        ns.push(format!("devices {}", host["Devices"]));
    }
    let mut networks: Vec<&str> = inspect["NetworkSettings"]["Networks"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    networks.sort_unstable();
    let mut want = vec![network, "bot-bottle-egress"];
    want.sort_unstable();
    if networks != want {
        ns.push(format!("attached to {networks:?}, want {want:?}"));
    }
    let sockets: Vec<String> = strings(&host["Binds"])
        .into_iter()
        .chain(
            inspect["Mounts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["Source"].as_str().map(str::to_string)),
        )
        .filter(|b| b.contains("docker.sock"))
        .collect();
    if !sockets.is_empty() {
        ns.push(format!("the Docker socket is mounted: {sockets:?}"));
    }
    vec![
        row(
            phase,
            "bundle-hardening",
            caps,
            "bundle: CapDrop ALL, no CapAdd, not privileged, no-new-privileges, seccomp on",
        ),
        row(
            phase,
            "bundle-namespaces",
            ns,
            "bundle: own namespaces, no devices, no Docker socket, only its bridge and egress",
        ),
    ]
}

/// Checks every process of the agent (host PIDs) in the kernel's view.
pub(crate) fn check_processes(phase: &str, pids: &[u32], spec: &Spec) -> Vec<Row> {
    let mut proc_problems = Vec::new();
    let mut limit_problems = Vec::new();
    if pids.is_empty() {
        return vec![Row::new(
            phase,
            "host-proc-status",
            "posture",
            Expect::Blocked,
            Observed::Error,
            None,
            "the Engine listed no processes for the agent",
        )];
    }
    let mut seen = 0;
    for &pid in pids {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            // Exited between `top` and now.
            continue;
        };
        seen += 1;
        let status = parse_status(&text);
        for problem in status_problems(&status) {
            proc_problems.push(format!("pid {pid} ({}): {problem}", status.name));
        }
        limit_problems.extend(cgroup_limit_problems(pid, spec));
    }
    let observed_none = seen == 0;
    let mut rows = vec![
        row(
            phase,
            "host-proc-status",
            proc_problems,
            &format!("{seen} processes: CapEff/CapPrm/CapBnd/CapAmb 0, NoNewPrivs 1, Seccomp 2"),
        ),
        row(
            phase,
            "host-cgroup-limits",
            limit_problems,
            &format!(
                "{seen} processes: pids.max {}, memory {}",
                spec.pids, spec.memory
            ),
        ),
    ];
    if observed_none {
        for r in &mut rows {
            *r = Row::new(
                phase,
                &r.probe,
                "posture",
                Expect::Blocked,
                Observed::Error,
                None,
                "no agent process could be read",
            );
        }
    }
    rows
}

/// How the cgroup limits of host process `pid` differ from `spec`'s.
fn cgroup_limit_problems(pid: u32, spec: &Spec) -> Vec<String> {
    let mut problems = Vec::new();
    match cgroup_limit(pid, "pids", "pids.max", "pids.max") {
        Some(v) if v == spec.pids.to_string() => {}
        other => problems.push(format!("pid {pid}: pids.max {other:?}, want {}", spec.pids)),
    }
    match cgroup_limit(pid, "memory", "memory.limit_in_bytes", "memory.max") {
        Some(v) if v == spec.memory.to_string() => {}
        other => problems.push(format!(
            "pid {pid}: memory limit {other:?}, want {}",
            spec.memory
        )),
    }
    problems
}

/// gVisor's host processes may hold these capabilities and no other: the
/// gofer serves the box's files (chown, dac_override, dac_read_search,
/// fowner, fsetid, sys_chroot); the Sentry and its stubs hold
/// sys_ptrace, which the ptrace platform traces the box's threads with.
const GVISOR_GOFER_CAPS: u64 = 0x4001f;
const GVISOR_SENTRY_CAPS: u64 = 1 << 19;

/// The host processes of a gVisor box: every process in the pids cgroup
/// of its sandbox (`sandbox_pid`, the Engine's `State.Pid`).
pub(crate) fn gvisor_processes(sandbox_pid: u32) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(format!("/proc/{sandbox_pid}/cgroup"))
        .map_err(|err| format!("cannot read the sandbox's cgroup: {err}"))?;
    let path = cgroup_path(&text, "pids").ok_or("the sandbox has no pids cgroup")?;
    let path = path.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/pids")
        .join(path)
        .join("cgroup.procs");
    let v2 = Path::new("/sys/fs/cgroup").join(path).join("cgroup.procs");
    let procs = std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .map_err(|err| format!("cannot read the box's cgroup.procs: {err}"))?;
    Ok(procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

/// Checks a gVisor box's host processes (`pids`, from
/// [`gvisor_processes`]) in the kernel's view: each runs gVisor's own
/// binary (`runtime_path`), never a program of the agent; each has
/// NoNewPrivs 1 and a seccomp filter; none holds a capability beyond
/// gVisor's own (the gofer's file capabilities, the Sentry's sys_ptrace);
/// and each sits under the box's translated limits.
pub(crate) fn check_gvisor_processes(
    phase: &str,
    pids: &[u32],
    spec: &Spec,
    runtime_path: &str,
) -> Vec<Row> {
    let mut proc_problems = Vec::new();
    let mut limit_problems = Vec::new();
    let mut seen = 0;
    let runtime = std::fs::canonicalize(runtime_path).unwrap_or_else(|_| runtime_path.into());
    for &pid in pids {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        seen += 1;
        let status = parse_status(&text);
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let gofer = cmdline.starts_with(b"runsc-gofer");
        if exe != runtime {
            proc_problems.push(format!(
                "pid {pid} runs {}, not gVisor's {}",
                exe.display(),
                runtime.display()
            ));
        }
        if status.no_new_privs != "1" {
            proc_problems.push(format!("pid {pid}: NoNewPrivs={}", status.no_new_privs));
        }
        if status.seccomp != "2" {
            proc_problems.push(format!("pid {pid}: Seccomp={} (want 2)", status.seccomp));
        }
        let allowed = if gofer {
            GVISOR_GOFER_CAPS
        } else {
            GVISOR_SENTRY_CAPS
        };
        for (field, value) in [
            ("CapEff", &status.cap_eff),
            ("CapPrm", &status.cap_prm),
            ("CapBnd", &status.cap_bnd),
            ("CapAmb", &status.cap_amb),
        ] {
            match u64::from_str_radix(value, 16) {
                Ok(caps) if caps & !allowed == 0 => {}
                _ => proc_problems.push(format!(
                    "pid {pid} ({}): {field}={value}, beyond gVisor's own {allowed:#x}",
                    if gofer { "gofer" } else { "sentry" }
                )),
            }
        }
        limit_problems.extend(cgroup_limit_problems(pid, spec));
    }
    if seen == 0 {
        return ["host-proc-status", "host-cgroup-limits"]
            .iter()
            .map(|probe| {
                Row::new(
                    phase,
                    probe,
                    "posture",
                    Expect::Blocked,
                    Observed::Error,
                    None,
                    "no host process of the gVisor box could be read",
                )
            })
            .collect();
    }
    vec![
        row(
            phase,
            "host-proc-status",
            proc_problems,
            &format!(
                "{seen} host processes of the gVisor box: each runs {}, NoNewPrivs 1, Seccomp 2, capabilities only gVisor's (gofer {GVISOR_GOFER_CAPS:#x}, sentry {GVISOR_SENTRY_CAPS:#x}); none runs the agent's programs",
                runtime.display()
            ),
        ),
        row(
            phase,
            "host-cgroup-limits",
            limit_problems,
            &format!(
                "{seen} host processes: pids.max {}, memory {} (translated for gVisor)",
                spec.pids, spec.memory
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::escape::report::Verdict;

    const CONFINED: &str = "Name:\tpause\nUid:\t1000\t1000\t1000\t1000\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";

    #[test]
    fn a_confined_process_has_no_problems() {
        let s = parse_status(CONFINED);
        assert_eq!(s.name, "pause");
        assert!(status_problems(&s).is_empty());
    }

    #[test]
    fn capabilities_privilege_gain_and_seccomp_are_caught() {
        let text = CONFINED
            .replace("CapEff:\t0000000000000000", "CapEff:\t00000000a80425fb")
            .replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")
            .replace("Seccomp:\t2", "Seccomp:\t0");
        let problems = status_problems(&parse_status(&text));
        assert_eq!(
            problems,
            [
                "CapEff=00000000a80425fb",
                "NoNewPrivs=0",
                "Seccomp=0 (want 2, filter)"
            ]
        );
        // Fields missing entirely (an odd kernel) are problems, not passes.
        assert_eq!(status_problems(&parse_status("")).len(), 6);
    }

    #[test]
    fn cgroup_paths_v1_and_v2() {
        let v1 = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n";
        assert_eq!(cgroup_path(v1, "pids").as_deref(), Some("/docker/abc"));
        assert_eq!(cgroup_path(v1, "memory").as_deref(), Some("/docker/abc"));
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            cgroup_path(v2, "pids").as_deref(),
            Some("/system.slice/docker-abc.scope")
        );
        assert_eq!(cgroup_path("", "pids"), None);
    }

    fn spec() -> Spec {
        Spec {
            memory: 256 << 20,
            pids: 128,
            network: "bot-bottle-a".into(),
            runtime: None,
        }
    }

    #[test]
    fn a_gvisor_box_must_run_under_its_runtime() {
        let mut spec = spec();
        spec.runtime = Some("runsc".into());
        let mut inspect = good_inspect();
        inspect["HostConfig"]["Runtime"] = json!("runsc");
        let rows = check_inspect("p", &inspect, &spec);
        let runtime = rows.iter().find(|r| r.probe == "host-runtime").unwrap();
        assert_eq!(runtime.verdict, Verdict::Pass, "{runtime:?}");
        inspect["HostConfig"]["Runtime"] = json!("runc");
        let rows = check_inspect("p", &inspect, &spec);
        let runtime = rows.iter().find(|r| r.probe == "host-runtime").unwrap();
        assert_eq!(runtime.verdict, Verdict::Escape, "{runtime:?}");
        // The container tier has no such row.
        assert!(
            check_inspect("p", &good_inspect(), &self::spec())
                .iter()
                .all(|r| r.probe != "host-runtime")
        );
    }

    #[test]
    fn gvisor_processes_that_are_not_gvisors_are_caught() {
        // This test process is no gVisor sandbox: it runs cargo's test
        // binary, so the check names it.
        let rows = check_gvisor_processes("p", &[std::process::id()], &spec(), "/usr/bin/runsc");
        let status = rows.iter().find(|r| r.probe == "host-proc-status").unwrap();
        assert_eq!(status.verdict, Verdict::Escape, "{status:?}");
        assert!(status.detail.contains("not gVisor's"), "{}", status.detail);
        let none = check_gvisor_processes("p", &[], &spec(), "/usr/bin/runsc");
        assert!(none.iter().all(|r| r.verdict == Verdict::Error));
    }

    fn good_inspect() -> Value {
        json!({
            "HostConfig": {
                "CapDrop": ["ALL"], "CapAdd": null, "Privileged": false,
                "SecurityOpt": ["no-new-privileges"],
                "Memory": 268435456, "MemorySwap": 268435456, "PidsLimit": 128,
                "NetworkMode": "bot-bottle-a", "PidMode": "", "IpcMode": "private",
                "Devices": [], "Binds": ["/state/a/stage/resolv.conf:/etc/resolv.conf:ro", "/state/a/box:/.bottle:ro"]
            },
            "NetworkSettings": { "Networks": { "bot-bottle-a": {} } },
            "Mounts": [
                { "Type": "bind", "Source": "/state/a/stage/resolv.conf", "Destination": "/etc/resolv.conf", "RW": false },
                { "Type": "bind", "Source": "/state/a/box", "Destination": "/.bottle", "RW": false }
            ]
        })
    }

    #[test]
    fn a_confined_container_passes_every_posture_row() {
        let rows = check_inspect("posture A", &good_inspect(), &spec());
        assert_eq!(rows.len(), 5);
        for r in rows {
            assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        }
    }

    #[test]
    fn each_weakening_is_an_escape() {
        type Weaken = Box<dyn Fn(&mut Value)>;
        let weakenings: Vec<(&str, Weaken)> = vec![
            (
                "host-caps-config",
                Box::new(|v| v["HostConfig"]["CapAdd"] = json!(["NET_ADMIN"])),
            ),
            (
                "host-caps-config",
                Box::new(|v| v["HostConfig"]["Privileged"] = json!(true)),
            ),
            (
                "host-security-opt",
                Box::new(|v| v["HostConfig"]["SecurityOpt"] = json!([])),
            ),
            (
                "host-security-opt",
                Box::new(|v| {
                    v["HostConfig"]["SecurityOpt"] =
                        json!(["no-new-privileges", "seccomp=unconfined"])
                }),
            ),
            (
                "host-limits-config",
                Box::new(|v| v["HostConfig"]["PidsLimit"] = json!(0)),
            ),
            (
                "host-limits-config",
                Box::new(|v| v["HostConfig"]["MemorySwap"] = json!(-1)),
            ),
            (
                "host-namespaces",
                Box::new(|v| v["HostConfig"]["PidMode"] = json!("host")),
            ),
            (
                "host-namespaces",
                Box::new(|v| v["NetworkSettings"]["Networks"]["bridge"] = json!({})),
            ),
            (
                "host-mounts",
                Box::new(|v| v["Mounts"][0]["RW"] = json!(true)),
            ),
            (
                "host-mounts",
                Box::new(
                    |v| v["Mounts"] = json!([{ "Type": "bind", "Source": "/", "Destination": "/host", "RW": false }]),
                ),
            ),
            (
                "host-mounts",
                Box::new(|v| v["Mounts"][1]["RW"] = json!(true)),
            ),
            (
                "host-mounts",
                Box::new(|v| v["Mounts"][1]["Source"] = json!("/")),
            ),
        ];
        for (probe, weaken) in weakenings {
            let mut inspect = good_inspect();
            weaken(&mut inspect);
            let rows = check_inspect("posture A", &inspect, &spec());
            let row = rows.iter().find(|r| r.probe == probe).unwrap();
            assert_eq!(row.verdict, Verdict::Escape, "{probe}: {inspect}");
        }
    }

    fn good_bundle() -> Value {
        json!({
            "HostConfig": {
                "CapDrop": ["ALL"], "CapAdd": null, "Privileged": false,
                "SecurityOpt": ["no-new-privileges"], "NetworkMode": "bot-bottle-a",
                "Devices": [], "Binds": ["/state/a/logs:/var/log/bottle:rw"]
            },
            "NetworkSettings": { "Networks": { "bot-bottle-a": {}, "bot-bottle-egress": {} } },
            "Mounts": [{ "Type": "bind", "Source": "/state/a/logs", "Destination": "/var/log/bottle", "RW": true }]
        })
    }

    #[test]
    fn a_hardened_bundle_passes_and_each_weakening_is_an_escape() {
        for r in check_bundle_inspect("posture A", &good_bundle(), "bot-bottle-a") {
            assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        }
        type Weaken = Box<dyn Fn(&mut Value)>;
        let weakenings: Vec<(&str, Weaken)> = vec![
            (
                "bundle-hardening",
                Box::new(|v| v["HostConfig"]["CapAdd"] = json!(["NET_ADMIN"])),
            ),
            (
                "bundle-hardening",
                Box::new(|v| v["HostConfig"]["SecurityOpt"] = json!([])),
            ),
            (
                "bundle-namespaces",
                Box::new(|v| v["HostConfig"]["PidMode"] = json!("host")),
            ),
            (
                "bundle-namespaces",
                Box::new(|v| v["NetworkSettings"]["Networks"]["bridge"] = json!({})),
            ),
            (
                "bundle-namespaces",
                Box::new(|v| {
                    v["HostConfig"]["Binds"] = json!(["/var/run/docker.sock:/var/run/docker.sock"])
                }),
            ),
        ];
        for (probe, weaken) in weakenings {
            let mut inspect = good_bundle();
            weaken(&mut inspect);
            let rows = check_bundle_inspect("posture A", &inspect, "bot-bottle-a");
            let row = rows.iter().find(|r| r.probe == probe).unwrap();
            assert_eq!(row.verdict, Verdict::Escape, "{probe}: {inspect}");
        }
    }

    #[test]
    fn no_processes_is_an_error_not_a_pass() {
        let rows = check_processes("posture A", &[], &spec());
        assert_eq!(rows[0].verdict, Verdict::Error);
    }
}
