//! The alias pool against a real state directory, in one process.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

use bottle_core::Coded;
use bottle_net::{AliasAllocator, AliasPool, Lease, LoopbackPlatform, NetError};

use crate::support::{RecordingRunner, exit};

fn addr(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

fn linux(root: &Path) -> (AliasAllocator, Arc<RecordingRunner>) {
    with_platform(root, LoopbackPlatform::Linux, RecordingRunner::succeeding())
}

fn with_platform(
    root: &Path,
    platform: LoopbackPlatform,
    runner: Arc<RecordingRunner>,
) -> (AliasAllocator, Arc<RecordingRunner>) {
    let allocator = AliasAllocator::new(
        root,
        AliasPool::default_for_platform(),
        platform,
        runner.clone(),
    );
    (allocator, runner)
}

fn small_pool(root: &Path, last: u8) -> AliasAllocator {
    AliasAllocator::new(
        root,
        AliasPool::new(addr(16)..=addr(last)).unwrap(),
        LoopbackPlatform::Linux,
        RecordingRunner::succeeding(),
    )
}

const ALIVE: &dyn Fn(&Lease) -> bool = &|_| true;

#[test]
fn allocation_is_idempotent_per_bottle() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, runner) = linux(dir.path());

    let first = pool.allocate("bot-bottle-a", ALIVE).unwrap();
    assert_eq!(first.address, addr(16));
    assert!(!first.reused);
    let again = pool.allocate("bot-bottle-a", ALIVE).unwrap();
    assert_eq!(again.address, addr(16));
    assert!(again.reused);
    let other = pool.allocate("bot-bottle-b", ALIVE).unwrap();
    assert_eq!(other.address, addr(17));

    let leases = pool.leases().unwrap();
    let held: Vec<_> = leases
        .iter()
        .map(|l| (l.address, l.bottle.as_str()))
        .collect();
    assert_eq!(
        held,
        [(addr(16), "bot-bottle-a"), (addr(17), "bot-bottle-b")]
    );
    // Linux needs no ifconfig.
    assert!(runner.calls().is_empty());
}

#[test]
fn lease_files_are_version_1_json() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    pool.allocate("bot-bottle-a", ALIVE).unwrap();

    let path = dir.path().join("net/leases/127.0.0.16.json");
    assert_eq!(pool.lease_path(addr(16)), path);
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let object = json.as_object().unwrap();
    let mut keys: Vec<_> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["bottle", "created", "pid", "version"]);
    assert_eq!(json["version"], 1);
    assert_eq!(json["bottle"], "bot-bottle-a");
    assert_eq!(json["pid"], std::process::id());
    assert!(json["created"].as_u64().unwrap() > 1_700_000_000);
}

#[test]
fn hand_written_version_1_lease_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    let leases = dir.path().join("net/leases");
    fs::create_dir_all(&leases).unwrap();
    fs::write(
        leases.join("127.0.0.16.json"),
        r#"{ "version": 1, "bottle": "bot-bottle-old", "pid": 77, "created": 1700000000 }"#,
    )
    .unwrap();

    assert_eq!(
        pool.leases().unwrap(),
        [Lease {
            address: addr(16),
            bottle: "bot-bottle-old".into(),
            pid: 77,
            created: 1_700_000_000,
        }]
    );
    let alias = pool.allocate("bot-bottle-new", ALIVE).unwrap();
    assert_eq!(alias.address, addr(17));
    assert_eq!(
        pool.allocate("bot-bottle-old", ALIVE).unwrap().address,
        addr(16)
    );
}

#[test]
fn stale_leases_are_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let pool = small_pool(dir.path(), 17);
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    pool.allocate("bot-bottle-b", ALIVE).unwrap();

    let asked = std::sync::Mutex::new(Vec::new());
    let alias = pool
        .allocate("bot-bottle-c", &|lease| {
            asked.lock().unwrap().push(lease.bottle.clone());
            lease.bottle != "bot-bottle-a"
        })
        .unwrap();
    assert_eq!(alias.address, addr(16));
    assert_eq!(*asked.lock().unwrap(), ["bot-bottle-a", "bot-bottle-b"]);
    let holders: Vec<_> = pool
        .leases()
        .unwrap()
        .into_iter()
        .map(|l| l.bottle)
        .collect();
    assert_eq!(holders, ["bot-bottle-c", "bot-bottle-b"]);
}

#[test]
fn reclaim_stale_reports_what_it_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    pool.allocate("bot-bottle-b", ALIVE).unwrap();

    let reclaimed = pool
        .reclaim_stale(&|lease| lease.bottle == "bot-bottle-b")
        .unwrap();
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(reclaimed[0].bottle, "bot-bottle-a");
    assert!(!pool.lease_path(addr(16)).exists());
    assert!(pool.lease_path(addr(17)).exists());
}

#[test]
fn release_deletes_the_lease_and_keeps_the_lock_file() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    pool.allocate("bot-bottle-b", ALIVE).unwrap();

    assert_eq!(pool.release("bot-bottle-a").unwrap(), Some(addr(16)));
    assert!(pool.lock_path().is_file());
    assert_eq!(pool.lock_path(), dir.path().join("net/aliases.lock"));
    assert!(!pool.lease_path(addr(16)).exists());
    let names: Vec<_> = fs::read_dir(pool.lease_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["127.0.0.17.json"]);

    // Releasing twice is not an error, and the address is free again.
    assert_eq!(pool.release("bot-bottle-a").unwrap(), None);
    assert_eq!(
        pool.allocate("bot-bottle-c", ALIVE).unwrap().address,
        addr(16)
    );
}

#[test]
fn exhaustion_names_the_holders_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let pool = small_pool(dir.path(), 18);
    for bottle in ["bot-bottle-z", "bot-bottle-a", "bot-bottle-m"] {
        pool.allocate(bottle, ALIVE).unwrap();
    }
    let err = pool.allocate("bot-bottle-late", ALIVE).unwrap_err();
    assert_eq!(err.code(), "BOT-N011");
    assert_eq!(
        err.to_string(),
        "pool exhausted: all 3 loopback aliases (127.0.0.16-127.0.0.18) are held by bottles: \
         bot-bottle-a, bot-bottle-m, bot-bottle-z\n  fix: stop one with `bottle stop NAME`, \
         or run `bottle cleanup` to reclaim the aliases of bottles that are gone"
    );
    assert!(
        !pool
            .leases()
            .unwrap()
            .iter()
            .any(|l| l.bottle == "bot-bottle-late")
    );
}

#[test]
fn corrupted_lease_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    let path = pool.lease_path(addr(16));
    fs::write(&path, "{\"version\": 1, \"bottle\": \"bot-bot").unwrap();

    for err in [
        pool.allocate("bot-bottle-b", ALIVE).unwrap_err(),
        pool.leases().unwrap_err(),
        pool.release("bot-bottle-a").unwrap_err(),
    ] {
        assert!(matches!(err, NetError::LeaseCorrupt { .. }), "{err}");
        assert_eq!(err.code(), "BOT-N009");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(
            message
                .contains("fix: check with `bottle list` that no running bottle uses 127.0.0.16"),
            "{message}"
        );
        assert!(
            message.contains(&format!("rm {}", path.display())),
            "{message}"
        );
    }
    // Following the fix works.
    fs::remove_file(&path).unwrap();
    assert_eq!(
        pool.allocate("bot-bottle-b", ALIVE).unwrap().address,
        addr(16)
    );
}

#[test]
fn newer_lease_versions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    fs::create_dir_all(pool.lease_dir()).unwrap();
    fs::write(
        pool.lease_path(addr(20)),
        r#"{"version": 2, "bottle": "bot-bottle-x", "owner": {"pid": 1}}"#,
    )
    .unwrap();
    let err = pool.allocate("bot-bottle-a", ALIVE).unwrap_err();
    assert_eq!(err.code(), "BOT-N010");
    assert!(err.to_string().contains("format version 2"), "{err}");
}

#[test]
fn files_that_are_not_leases_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    fs::create_dir_all(pool.lease_dir()).unwrap();
    fs::write(pool.lease_dir().join("127.0.0.16.json.tmp"), "{").unwrap();
    fs::write(pool.lease_dir().join(".DS_Store"), "x").unwrap();
    fs::write(pool.lease_dir().join("notes.json"), "{").unwrap();
    assert_eq!(
        pool.allocate("bot-bottle-a", ALIVE).unwrap().address,
        addr(16)
    );
    assert_eq!(pool.leases().unwrap().len(), 1);
}

#[test]
fn listing_a_fresh_state_root_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    assert!(pool.leases().unwrap().is_empty());
    assert!(!dir.path().join("net").exists());
    assert_eq!(pool.release("bot-bottle-a").unwrap(), None);
}

#[test]
fn invalid_bottle_names_are_refused_before_touching_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = linux(dir.path());
    let err = pool.allocate("", ALIVE).unwrap_err();
    assert_eq!(err.code(), "BOT-N006");
    assert!(!dir.path().join("net").exists());
}

#[test]
fn macos_brings_aliases_up_and_down_with_ifconfig() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, runner) = with_platform(
        dir.path(),
        LoopbackPlatform::MacOs { sudo: true },
        RecordingRunner::succeeding(),
    );
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    pool.release("bot-bottle-a").unwrap();
    assert_eq!(
        runner.calls(),
        [
            vec![
                "sudo",
                "-n",
                "/sbin/ifconfig",
                "lo0",
                "alias",
                "127.0.0.16",
                "up"
            ],
            vec![
                "sudo",
                "-n",
                "/sbin/ifconfig",
                "lo0",
                "alias",
                "127.0.0.16",
                "up"
            ],
            vec![
                "sudo",
                "-n",
                "/sbin/ifconfig",
                "lo0",
                "-alias",
                "127.0.0.16"
            ],
        ]
    );
}

#[test]
fn macos_reclaiming_a_stale_lease_takes_its_alias_down() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, runner) = with_platform(
        dir.path(),
        LoopbackPlatform::MacOs { sudo: false },
        RecordingRunner::succeeding(),
    );
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    pool.allocate("bot-bottle-b", &|_| false).unwrap();
    assert_eq!(
        runner.calls(),
        [
            vec!["/sbin/ifconfig", "lo0", "alias", "127.0.0.16", "up"],
            vec!["/sbin/ifconfig", "lo0", "-alias", "127.0.0.16"],
            vec!["/sbin/ifconfig", "lo0", "alias", "127.0.0.16", "up"],
        ]
    );
}

#[test]
fn failed_ifconfig_releases_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let runner = RecordingRunner::with(|_| Ok(exit(1, "sudo: a password is required\n")));
    let (pool, _) = with_platform(dir.path(), LoopbackPlatform::MacOs { sudo: true }, runner);

    let err = pool.allocate("bot-bottle-a", ALIVE).unwrap_err();
    assert_eq!(err.code(), "BOT-N012");
    let message = err.to_string();
    assert!(
        message.starts_with(
            "could not add loopback alias 127.0.0.16 (sudo -n /sbin/ifconfig lo0 alias 127.0.0.16 up): \
             exited with code 1: sudo: a password is required; its lease was released"
        ),
        "{message}"
    );
    assert!(
        message.contains("fix: sudo needs a password: run `sudo -v` first"),
        "{message}"
    );
    assert!(pool.leases().unwrap().is_empty());
    assert!(!pool.lease_path(addr(16)).exists());
}

#[test]
fn failed_ifconfig_on_reuse_releases_the_lease_too() {
    let dir = tempfile::tempdir().unwrap();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let fail = fail.clone();
        RecordingRunner::with(move |_| {
            Ok(if fail.load(std::sync::atomic::Ordering::SeqCst) {
                exit(1, "ifconfig: ioctl (SIOCAIFADDR): Operation not permitted")
            } else {
                exit(0, "")
            })
        })
    };
    let (pool, _) = with_platform(dir.path(), LoopbackPlatform::MacOs { sudo: false }, runner);
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = pool.allocate("bot-bottle-a", ALIVE).unwrap_err();
    assert!(matches!(err, NetError::AliasAdd { .. }), "{err}");
    assert!(pool.leases().unwrap().is_empty());
}

#[test]
fn unrunnable_ifconfig_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let runner = RecordingRunner::with(|_| Err(std::io::ErrorKind::NotFound.into()));
    let (pool, _) = with_platform(dir.path(), LoopbackPlatform::MacOs { sudo: false }, runner);
    let err = pool.allocate("bot-bottle-a", ALIVE).unwrap_err();
    assert!(err.to_string().contains("could not be run"), "{err}");
    assert!(
        err.to_string()
            .contains("fix: check that /sbin/ifconfig exists"),
        "{err}"
    );
    assert!(pool.leases().unwrap().is_empty());
}

#[test]
fn failed_removal_keeps_the_lease_for_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let runner = RecordingRunner::with(|spec| {
        Ok(if spec.argv().iter().any(|a| a == "-alias") {
            exit(1, "ifconfig: ioctl (SIOCDIFADDR): Operation not permitted")
        } else {
            exit(0, "")
        })
    });
    let (pool, _) = with_platform(dir.path(), LoopbackPlatform::MacOs { sudo: false }, runner);
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    let err = pool.release("bot-bottle-a").unwrap_err();
    assert_eq!(err.code(), "BOT-N013");
    assert!(err.to_string().contains("its lease is kept"), "{err}");
    assert!(
        err.to_string()
            .contains("sudo /sbin/ifconfig lo0 -alias 127.0.0.16"),
        "{err}"
    );
    assert_eq!(pool.leases().unwrap().len(), 1);
}

#[test]
fn removing_an_alias_that_is_already_gone_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let runner = RecordingRunner::with(|spec| {
        Ok(if spec.argv().iter().any(|a| a == "-alias") {
            exit(
                1,
                "ifconfig: ioctl (SIOCDIFADDR): Can't assign requested address\n",
            )
        } else {
            exit(0, "")
        })
    });
    let (pool, _) = with_platform(dir.path(), LoopbackPlatform::MacOs { sudo: false }, runner);
    pool.allocate("bot-bottle-a", ALIVE).unwrap();
    assert_eq!(pool.release("bot-bottle-a").unwrap(), Some(addr(16)));
    assert!(pool.leases().unwrap().is_empty());
}
