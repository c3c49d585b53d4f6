//! Many real processes allocating from one pool at the same moment.
//!
//! The parent re-runs this test binary, filtered to
//! [`allocate_in_this_process`], once per bottle; the environment tells
//! that test it is a child. The children wait on a file barrier so that
//! they all call `allocate` together, then print their result on one line.

use std::collections::BTreeSet;
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bottle_core::Coded;
use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bottle_net::{AliasAllocator, AliasPool, LoopbackPlatform};
use serde_json::json;

const STATE_VAR: &str = "BOTTLE_NET_TEST_CHILD_STATE";
const BOTTLE_VAR: &str = "BOTTLE_NET_TEST_CHILD_BOTTLE";
const BARRIER_VAR: &str = "BOTTLE_NET_TEST_CHILD_BARRIER";
const RESULT_MARKER: &str = "BOTTLE_NET_CHILD_RESULT ";
const CHILD_TEST: &str = "concurrency::allocate_in_this_process";

/// Upper bound on any wait in this file, so a broken child cannot hang CI.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

fn allocator(root: &Path) -> AliasAllocator {
    AliasAllocator::new(
        root,
        AliasPool::default_for_platform(),
        LoopbackPlatform::Linux,
        Arc::new(SystemRunner),
    )
}

/// As a child (environment set): waits for the barrier, allocates, prints
/// the outcome for the parent. Run directly: one allocation in a fresh
/// state root gets the pool's first address.
#[test]
fn allocate_in_this_process() {
    let (Ok(state), Ok(bottle), Ok(barrier)) = (
        std::env::var(STATE_VAR),
        std::env::var(BOTTLE_VAR),
        std::env::var(BARRIER_VAR),
    ) else {
        let dir = tempfile::tempdir().unwrap();
        let alias = allocator(dir.path())
            .allocate("bot-bottle-solo", &|_| true)
            .unwrap();
        assert_eq!(alias.address, Ipv4Addr::new(127, 0, 0, 16));
        return;
    };

    let barrier = Path::new(&barrier);
    fs::write(barrier.join(format!("ready-{bottle}")), b"").unwrap();
    let deadline = Instant::now() + WAIT_LIMIT;
    while !barrier.join("go").exists() {
        assert!(
            Instant::now() < deadline,
            "the parent never opened the barrier"
        );
        thread::sleep(Duration::from_millis(2));
    }

    let result = match allocator(Path::new(&state)).allocate(&bottle, &|_| true) {
        Ok(alias) => json!({ "ok": alias.address.to_string() }),
        Err(err) => json!({ "code": err.code(), "message": err.to_string() }),
    };
    println!("{RESULT_MARKER}{result}");
}

fn child_spec(state: &Path, barrier: &Path, bottle: &str) -> CommandSpec {
    let exe = std::env::current_exe().unwrap();
    CommandSpec::new(exe)
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(STATE_VAR, state)
        .env(BOTTLE_VAR, bottle)
        .env(BARRIER_VAR, barrier)
}

/// The child's result line; libtest prints the test's name on the same
/// line first.
fn parse_result(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .find_map(|line| line.split_once(RESULT_MARKER).map(|(_, result)| result))
        .unwrap_or_else(|| panic!("child printed no result:\n{stdout}"));
    serde_json::from_str(line).unwrap()
}

#[test]
fn seventeen_processes_at_once_share_sixteen_aliases() {
    let state = tempfile::tempdir().unwrap();
    let barrier = tempfile::tempdir().unwrap();
    let bottles: Vec<String> = (1..=17).map(|i| format!("bot-bottle-p{i:02}")).collect();

    let outputs = thread::scope(|scope| {
        let handles: Vec<_> = bottles
            .iter()
            .map(|bottle| {
                let spec = child_spec(state.path(), barrier.path(), bottle);
                scope.spawn(move || SystemRunner.run(&spec))
            })
            .collect();

        // Open the barrier once every child is waiting at it (or, if one
        // never arrives, at the time limit so the rest do not hang).
        let deadline = Instant::now() + WAIT_LIMIT;
        let ready = loop {
            let ready = fs::read_dir(barrier.path()).unwrap().count();
            if ready == bottles.len() || Instant::now() >= deadline {
                break ready;
            }
            thread::sleep(Duration::from_millis(5));
        };
        fs::write(barrier.path().join("go"), b"").unwrap();
        assert_eq!(ready, bottles.len(), "not every child reached the barrier");

        handles
            .into_iter()
            .map(|handle| handle.join().unwrap().unwrap())
            .collect::<Vec<_>>()
    });

    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for (bottle, output) in bottles.iter().zip(&outputs) {
        assert!(
            output.success(),
            "child {bottle} failed:\n{}\n{}",
            output.stdout_text(),
            output.stderr_text()
        );
        let result = parse_result(&output.stdout_text());
        match result["ok"].as_str() {
            Some(address) => winners.push((bottle.clone(), address.parse::<Ipv4Addr>().unwrap())),
            None => losers.push((bottle.clone(), result)),
        }
    }

    // Sixteen distinct aliases covering the whole pool.
    assert_eq!(
        winners.len(),
        16,
        "winners: {winners:?}, losers: {losers:?}"
    );
    let addresses: BTreeSet<Ipv4Addr> = winners.iter().map(|(_, a)| *a).collect();
    let pool: BTreeSet<Ipv4Addr> = AliasPool::default_for_platform().addresses().collect();
    assert_eq!(addresses, pool);

    // The seventeenth was told the pool is exhausted, by whom, and what to do.
    let [(loser, result)] = losers.as_slice() else {
        panic!("expected exactly one loser: {losers:?}");
    };
    assert_eq!(result["code"], "BOT-N011");
    let mut holders: Vec<&str> = winners.iter().map(|(b, _)| b.as_str()).collect();
    holders.sort_unstable();
    let want = format!(
        "pool exhausted: all 16 loopback aliases (127.0.0.16-127.0.0.31) are held by bottles: {}\n  \
         fix: stop one with `bottle stop NAME`, or run `bottle cleanup` to reclaim the aliases of bottles that are gone",
        holders.join(", ")
    );
    assert_eq!(result["message"], want.as_str());
    assert!(!holders.contains(&loser.as_str()));

    // The lease files on disk say the same.
    let leases = allocator(state.path()).leases().unwrap();
    let mut on_disk: Vec<(String, Ipv4Addr)> =
        leases.into_iter().map(|l| (l.bottle, l.address)).collect();
    on_disk.sort();
    winners.sort();
    assert_eq!(on_disk, winners);
}
