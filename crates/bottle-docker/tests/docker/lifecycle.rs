//! start → exec → stop, list, attach, provisioning.

use bottle_core::{BottleBackend, BottleLauncher};

use crate::support::{self, name, resources_of, sh};

#[test]
fn start_exec_stop_leaves_nothing() {
    let Some(fx) = support::setup("start_exec_stop_leaves_nothing") else {
        return;
    };
    let name = name("life");
    let (guard, bottle) = fx.start(&name);
    assert_eq!(bottle.name(), format!("bot-bottle-{name}"));

    // Exit code and the two streams, kept apart.
    let out = sh(&*bottle, "echo to-out; echo to-err >&2; exit 7");
    assert_eq!(out.exit_code, 7);
    assert_eq!(out.stdout, b"to-out\n");
    assert_eq!(out.stderr, b"to-err\n");

    // The manifest's env and the backend's proxy variables are there.
    let env = String::from_utf8(sh(&*bottle, "env").stdout).unwrap();
    assert!(env.contains("BOTTLE_TEST=yes"), "{env}");
    assert!(env.contains("HTTPS_PROXY=http://192.168."), "{env}");
    assert!(env.contains("SSL_CERT_FILE=/etc/bottle/ca.pem"), "{env}");

    // Provisioning: the CA, the prompt and the skill, the latter two owned
    // by the image's user.
    let ls = sh(
        &*bottle,
        "head -1 /etc/bottle/ca.pem; stat -c '%U %n' /etc/bottle/prompt.md /etc/bottle/skills/review/SKILL.md",
    );
    assert_eq!(ls.exit_code, 0, "{}", String::from_utf8_lossy(&ls.stderr));
    assert_eq!(
        String::from_utf8(ls.stdout).unwrap(),
        "-----BEGIN CERTIFICATE-----\nagent /etc/bottle/prompt.md\nagent /etc/bottle/skills/review/SKILL.md\n"
    );

    // copy_in puts a host file where asked, owned by the agent's user.
    let host_file = fx.dir.path().join("notes.txt");
    std::fs::write(&host_file, "hello bottle\n").unwrap();
    let copy = bottle_core::copy::CopyIn::from_host(&host_file).unwrap();
    let home = bottle_core::copy::GuestPath::parse("/home/agent").unwrap();
    bottle.copy_in(&copy, &home).unwrap();
    let cat = sh(
        &*bottle,
        "cat /home/agent/notes.txt; stat -c %U /home/agent/notes.txt",
    );
    assert_eq!(cat.stdout, b"hello bottle\nagent\n");

    // The bundle's secrets are private to the bundle's user (the operator's).
    let bundle = format!("bot-bottle-{name}-bundle");
    let (key, mode, uid) = support::download(&fx.backend, &bundle, "/run/bottle/ca-key.pem");
    assert!(String::from_utf8(key).unwrap().contains("PRIVATE KEY"));
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(uid, u64::from(nix::unistd::getuid().as_raw()));
    let (_, dir_mode, _) = support::download(&fx.backend, &bundle, "/run/bottle");
    assert_eq!(dir_mode & 0o777, 0o700);
    // The agent never sees the key.
    let probe = sh(&*bottle, "cat /run/bottle/ca-key.pem");
    assert_ne!(probe.exit_code, 0);
    assert!(!String::from_utf8_lossy(&probe.stdout).contains("PRIVATE KEY"));

    // A decision for the audit log: a host the manifest does not allow.
    let denied = sh(
        &*bottle,
        "wget -q -O- http://denied.bottle.test/kept-after-stop 2>&1; true",
    );
    assert_eq!(denied.exit_code, 0);

    let state_dir = fx.state.path().join(&name);
    assert!(state_dir.join("plan.json").is_file());
    let record = bottle_core::life::StateDir::new(&state_dir).read().unwrap();
    let record = record.expect("the launch wrote its record").record;
    assert_eq!(record.phase, bottle_core::life::Phase::Running);
    assert_eq!(record.owner, bottle_core::process::Owner::current());

    assert!(!resources_of(&fx.backend, &name).is_empty());
    let report = fx.backend.stop(bottle.name()).unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    for want in [
        format!("container bot-bottle-{name}-agent"),
        format!("container bot-bottle-{name}-bundle"),
        format!("network bot-bottle-{name}"),
    ] {
        assert!(
            report.removed.contains(&want),
            "{want} not in {:?}",
            report.removed
        );
    }
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
    assert!(!state_dir.exists());
    // The audit log outlives the bottle, away from its CA key.
    let runs = bottle_core::audit_files::retained_runs(fx.state.path(), &name).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        report.kept,
        [format!("audit log {}", runs[0].dir.display())]
    );
    let lines = bottle_core::audit_files::AuditLines::new(&runs[0].log())
        .poll()
        .unwrap();
    assert!(
        lines
            .iter()
            .any(|l| String::from_utf8_lossy(l).contains("/kept-after-stop")),
        "{:?}",
        lines
            .iter()
            .map(|l| String::from_utf8_lossy(l))
            .collect::<Vec<_>>()
    );
    assert!(!runs[0].dir.join("ca").exists());
    // Stopping again removes nothing and is not an error.
    assert!(fx.backend.stop(bottle.name()).unwrap().removed.is_empty());
    drop(guard);
}

#[test]
fn list_and_attach_see_two_bottles() {
    let Some(fx) = support::setup("list_and_attach_see_two_bottles") else {
        return;
    };
    let (a_name, b_name) = (name("list-a"), name("list-b"));
    let (_a_guard, a) = fx.start(&a_name);
    let (_b_guard, b) = fx.start(&b_name);
    let listed = fx.backend.list_active().unwrap();
    for bottle in [&a, &b] {
        let info = listed
            .iter()
            .find(|i| i.name == bottle.name())
            .unwrap_or_else(|| panic!("{} not listed in {listed:?}", bottle.name()));
        assert_eq!(info.state, "running");
        assert_eq!(info.agent, "demo");
        assert!(
            info.bundle_address
                .as_deref()
                .unwrap()
                .starts_with("192.168.")
        );
        assert!(info.created.as_deref().unwrap().ends_with('Z'));
    }
    let a_ip = listed
        .iter()
        .find(|i| i.name == a.name())
        .unwrap()
        .bundle_address
        .clone();
    let b_ip = listed
        .iter()
        .find(|i| i.name == b.name())
        .unwrap()
        .bundle_address
        .clone();
    assert_ne!(a_ip, b_ip, "two bottles share a subnet");

    // attach finds a running bottle by either form of its name, and runs
    // the image's default command when given none.
    let attached = fx.backend.attach(&b_name).unwrap();
    assert_eq!(attached.name(), b.name());
    assert_eq!(sh(&*attached, "echo via-attach").stdout, b"via-attach\n");
    let err = fx
        .backend
        .attach("bot-bottle-no-such-bottle")
        .err()
        .unwrap();
    assert_eq!(err.code, "BOT-D031");

    // A second start of the same bottle is refused without touching it.
    let spec = fx.spec(&a_name);
    let err = fx.backend.prepare(&spec).unwrap_err();
    assert_eq!(err.code, "BOT-D030");
    assert_eq!(sh(&*a, "echo still-here").stdout, b"still-here\n");
}

#[test]
fn the_agents_own_server_is_exempt_from_the_proxy_by_name_and_address() {
    let Some(fx) = support::setup("the_agents_own_server_is_exempt_from_the_proxy") else {
        return;
    };
    let name = name("own");
    let (_guard, bottle) = fx.start(&name);
    // Every proxy variable the docs name is really in the agent's env.
    let env = String::from_utf8(sh(&*bottle, "env").stdout).unwrap();
    for variable in ["ALL_PROXY=http://192.168.", "all_proxy=http://192.168."] {
        assert!(env.contains(variable), "{variable} missing from {env}");
    }
    assert!(env.contains("NODE_USE_ENV_PROXY=1"), "{env}");
    // A dev server in the box, reached by the box's hostname and its own
    // address, each of which NO_PROXY names, so a client that honours it
    // goes straight to the server (busybox wget ignores NO_PROXY: `-Y off`
    // is what such a client does). IPv6 is off in a docker bottle, so
    // `[::1]` has no server to reach here.
    let script = r#"
        mkdir -p /tmp/www && echo served-by-agent > /tmp/www/index.html
        httpd -p 8080 -h /tmp/www || exit 90
        own=$(ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
        for host in "$(hostname)" "$own" 127.0.0.1; do
            case ",$NO_PROXY," in *",$host,"*) ;; *) echo "NO_PROXY lacks $host"; exit 91;; esac
            case ",$no_proxy," in *",$host,"*) ;; *) echo "no_proxy lacks $host"; exit 92;; esac
            i=0
            until wget -q -Y off -O- "http://$host:8080/"; do
                i=$((i+1)); [ $i -lt 50 ] || exit 93; sleep 0.1
            done
        done
    "#;
    let out = sh(&*bottle, script);
    assert_eq!(
        (
            out.exit_code,
            String::from_utf8_lossy(&out.stdout).into_owned()
        ),
        (0, "served-by-agent\n".repeat(3)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
