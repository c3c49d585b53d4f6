//! The binary's interface: exit codes, one parseable line per probe,
//! unknown names, and the host-checkable state probes.

use bottle_probe::contract::Outcome;

use crate::fixture::{config, run_probe};

fn targets() -> bottle_probe::contract::Targets {
    // Addresses only; nothing here is dialled by the probes these tests
    // select, so they need no canaries (and no root).
    let mut t = crate::fixture::canaries_targets_without_listeners();
    t.rebind_hosts = vec![
        "rebind-metadata.bottle.test".into(),
        "rebind-private.bottle.test".into(),
    ];
    t
}

#[test]
fn usage_errors_and_unreadable_configs_exit_non_zero() {
    let exe = env!("CARGO_BIN_EXE_bottle-probe");
    let none = crate::fixture::command(exe).output().unwrap();
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("usage"));
    let missing = crate::fixture::command(exe)
        .args(["--config", "/nonexistent/probe.json"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("fix:"));
    assert!(missing.stdout.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"token\": 1}").unwrap();
    let parsed = crate::fixture::command(exe)
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(parsed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&parsed.stderr).contains("not valid"));
}

#[test]
fn the_catalogue_has_every_category_and_unique_names() {
    let cfg = config("t", targets(), false, &[]);
    let all = bottle_probe::probes::catalogue(&cfg);
    assert!(all.len() >= 30, "{}", all.len());
    let mut names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "probe names are unique");
    for cat in [
        "network",
        "dns",
        "proxy",
        "filesystem",
        "kernel",
        "privilege",
        "resources",
        "secrets",
        "copy",
        "ports",
    ] {
        assert!(all.iter().any(|p| p.category == cat), "no {cat} probe");
    }
    // Resources run last.
    let first_resource = all.iter().position(|p| p.category == "resources").unwrap();
    assert!(
        all[first_resource..]
            .iter()
            .all(|p| p.category == "resources")
    );
    assert!(names.contains(&"proxy-rebind-metadata") && names.contains(&"proxy-rebind-private"));
    assert!(names.contains(&"proxy-allowed-control"));
    for name in [
        "host-service-control",
        "host-service-other-port",
        "host-service-loopback-direct",
        "tcp-pinned-control",
        "tcp-pinned-direct",
        "tcp-pinned-other-port",
        "tcp-pinned-other-host",
    ] {
        assert!(names.contains(&name), "no {name}");
    }
    // The relays' controls go through a bundle: they never run on the host.
    for control in ["host-service-control", "tcp-pinned-control"] {
        assert!(all.iter().any(|p| p.name == control && !p.network));
    }
}

#[test]
fn an_unknown_name_in_only_is_an_error_line() {
    let cfg = config(
        "t",
        targets(),
        false,
        &["no-such-probe", "secret-env-credentials"],
    );
    let run = run_probe(&cfg, std::path::Path::new("/"), None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.results.len(), 2);
    assert_eq!(run.results[0].probe, "no-such-probe");
    assert_eq!(run.results[0].outcome, Outcome::Error);
    assert_eq!(run.results[1].probe, "secret-env-credentials");
}

#[test]
fn inherited_descriptors_are_seen_and_a_clean_exec_has_none() {
    let cfg = config(
        "t",
        targets(),
        false,
        &["fs-inherited-fds", "fs-working-directory"],
    );
    let dir = tempfile::tempdir().unwrap();
    let leak = dir.path().join("host-file");
    std::fs::write(&leak, "host data").unwrap();
    let run = run_probe(
        &cfg,
        dir.path(),
        Some(&format!("exec 7<'{}';", leak.display())),
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.results[0].outcome,
        Outcome::Reached,
        "{:?}",
        run.results[0]
    );
    assert!(
        run.results[0].observed.contains("7 -> "),
        "{:?}",
        run.results[0]
    );
    assert_eq!(
        run.results[1].outcome,
        Outcome::Blocked,
        "{:?}",
        run.results[1]
    );
    let clean = run_probe(&cfg, dir.path(), None);
    assert_eq!(
        clean.results[0].outcome,
        Outcome::Blocked,
        "{:?}",
        clean.results[0]
    );
}

#[test]
fn a_working_directory_removed_before_exec_is_reported() {
    let cfg = config("t", targets(), false, &["fs-working-directory"]);
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    std::fs::create_dir(&gone).unwrap();
    // The shell enters the directory, removes it, then execs the probe:
    // its working directory no longer has a path.
    let prefix = format!("cd '{}' && rmdir '{}' &&", gone.display(), gone.display());
    let run = run_probe(&cfg, dir.path(), Some(&prefix));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.results[0].outcome,
        Outcome::Reached,
        "{:?}",
        run.results[0]
    );
}

#[test]
fn the_privilege_probes_see_the_test_runners_privileges() {
    let cfg = config(
        "t",
        targets(),
        false,
        &["priv-capabilities", "priv-setuid-root"],
    );
    let run = run_probe(&cfg, std::path::Path::new("/"), None);
    let root = nix::unistd::geteuid().is_root();
    let want = if root {
        Outcome::Reached
    } else {
        Outcome::Blocked
    };
    assert_eq!(run.results[1].outcome, want, "{:?}", run.results[1]);
    if root {
        assert_eq!(
            run.results[0].outcome,
            Outcome::Reached,
            "{:?}",
            run.results[0]
        );
    }
}

#[test]
fn the_serve_child_answers_each_connection_with_the_token_then_ends() {
    use std::io::{BufRead as _, Read as _};
    let exe = env!("CARGO_BIN_EXE_bottle-probe");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let mut child = crate::fixture::command(exe)
        .args(["--child", "serve", &port.to_string(), "tok-serve", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("listening"), "{first}");
    for _ in 0..2 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        assert_eq!(got, bottle_probe::contract::serve_reply("tok-serve"));
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert_eq!(rest, ["served 2"]);
}
