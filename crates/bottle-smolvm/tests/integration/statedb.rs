//! Every branch of the fail-closed patch, on a real SQLite file in smolvm's
//! schema and WAL mode.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bottle_smolvm::SmolvmError;
use bottle_smolvm::statedb::{self, EgressPolicy, PatchOutcome};
use rusqlite::Connection;
use serde_json::{Value, json};

const MACHINE: &str = "bot-bottle-db";

fn policy() -> EgressPolicy {
    EgressPolicy::one_address(Ipv4Addr::new(192, 168, 7, 2))
}

/// A database as smolvm creates it (`src/db.rs`), with one machine record
/// carrying a field this code has never heard of.
fn smolvm_db(dir: &Path, record: Option<Value>) -> PathBuf {
    let path = dir.join("smolvm.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE IF NOT EXISTS vms (name TEXT PRIMARY KEY, data BLOB NOT NULL);
         CREATE TABLE IF NOT EXISTS config (key TEXT PRIMARY KEY, value TEXT);
         CREATE TABLE writes (n INTEGER);
         INSERT INTO writes VALUES (0);
         CREATE TRIGGER count_writes AFTER UPDATE ON vms BEGIN UPDATE writes SET n = n + 1; END;",
    )
    .unwrap();
    if let Some(record) = record {
        conn.execute(
            "INSERT INTO vms (name, data) VALUES (?1, ?2)",
            rusqlite::params![MACHINE, serde_json::to_vec(&record).unwrap()],
        )
        .unwrap();
    }
    path
}

fn record(allowed: Value, hosts: Value) -> Value {
    json!({
        "name": MACHINE,
        "created_at": 1766000000u64,
        "state": "created",
        "pid": null,
        "cpus": 2,
        "mem": 4096,
        "mounts": [["/src", "/app", false]],
        "ports": [[8080, 80]],
        "network": true,
        "env": [["A", "B"]],
        "allowed_cidrs": allowed,
        "dns_filter_hosts": hosts,
        "a_field_from_a_future_smolvm": {"nested": [1, 2, 3]},
    })
}

fn writes(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT n FROM writes", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_missing_database_is_refused_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server/smolvm.db");
    let err = statedb::enforce(&path, MACHINE, &policy()).unwrap_err();
    assert!(matches!(err, SmolvmError::StateDbMissing { .. }), "{err:?}");
    assert!(!path.exists());
    assert!(!dir.path().join("server").exists());
}

#[test]
fn a_missing_row_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(dir.path(), None);
    let err = statedb::enforce(&path, MACHINE, &policy()).unwrap_err();
    assert!(
        matches!(err, SmolvmError::StateRowMissing { .. }),
        "{err:?}"
    );
    assert_eq!(writes(&path), 0);
}

#[test]
fn an_equal_record_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(
        dir.path(),
        Some(record(json!(["192.168.7.2/32"]), json!([]))),
    );
    let before = statedb::read(&path, MACHINE).unwrap();
    assert_eq!(
        statedb::enforce(&path, MACHINE, &policy()).unwrap(),
        PatchOutcome::AlreadySet
    );
    assert_eq!(writes(&path), 0);
    assert_eq!(statedb::read(&path, MACHINE).unwrap(), before);
}

#[test]
fn a_dropped_allowlist_is_patched_and_every_other_field_kept() {
    let dir = tempfile::tempdir().unwrap();
    // What 0.8.0..1.7.x leave after `create --from --allow-cidr`.
    let original = record(Value::Null, Value::Null);
    let path = smolvm_db(dir.path(), Some(original.clone()));
    assert_eq!(
        statedb::enforce(&path, MACHINE, &policy()).unwrap(),
        PatchOutcome::Patched
    );
    assert_eq!(writes(&path), 1);
    let after = statedb::read(&path, MACHINE).unwrap();
    assert_eq!(after["allowed_cidrs"], json!(["192.168.7.2/32"]));
    assert_eq!(after["dns_filter_hosts"], json!([]));
    let mut expected = original;
    expected["allowed_cidrs"] = json!(["192.168.7.2/32"]);
    expected["dns_filter_hosts"] = json!([]);
    assert_eq!(after, expected, "only the two egress fields may change");
    // Idempotent: a second run finds it set.
    assert_eq!(
        statedb::enforce(&path, MACHINE, &policy()).unwrap(),
        PatchOutcome::AlreadySet
    );
}

#[test]
fn a_wider_allowlist_is_narrowed_to_the_one_address() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(
        dir.path(),
        Some(record(json!(["192.168.7.2/32", "1.1.1.1/32"]), Value::Null)),
    );
    statedb::enforce(&path, MACHINE, &policy()).unwrap();
    assert_eq!(
        statedb::read(&path, MACHINE).unwrap()["allowed_cidrs"],
        json!(["192.168.7.2/32"])
    );
}

#[test]
fn a_patch_that_does_not_take_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(dir.path(), Some(record(Value::Null, Value::Null)));
    // Something (a smolvm server, a trigger here) undoes the write.
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER revert AFTER UPDATE OF data ON vms
             BEGIN UPDATE vms SET data = OLD.data WHERE name = NEW.name; END;",
        )
        .unwrap();
    let err = statedb::enforce(&path, MACHINE, &policy()).unwrap_err();
    match &err {
        SmolvmError::AllowlistNotPersisted { wanted, found, .. } => {
            assert!(wanted.contains("192.168.7.2/32"), "{wanted}");
            assert!(found.contains("allowed_cidrs=null"), "{found}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.kind(),
        bottle_core::backend::BackendErrorKind::IsolationUnconfirmed
    );
}

#[test]
fn a_record_that_is_not_a_json_object_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(dir.path(), None);
    Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO vms (name, data) VALUES (?1, ?2)",
            rusqlite::params![MACHINE, b"[1,2]".to_vec()],
        )
        .unwrap();
    let err = statedb::enforce(&path, MACHINE, &policy()).unwrap_err();
    assert!(
        matches!(err, SmolvmError::StateRecordInvalid { .. }),
        "{err:?}"
    );
}

#[test]
fn verify_never_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(dir.path(), Some(record(Value::Null, Value::Null)));
    assert!(matches!(
        statedb::verify(&path, MACHINE, &policy()).unwrap_err(),
        SmolvmError::AllowlistNotPersisted { .. }
    ));
    assert_eq!(writes(&path), 0);
}

#[test]
fn a_writer_holding_the_database_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = smolvm_db(dir.path(), Some(record(Value::Null, Value::Null)));
    // Another connection (a smolvm server) holds the write lock while our
    // patch starts; the busy timeout makes the patch wait, not fail.
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE;").unwrap();
    let patch = {
        let path = path.clone();
        std::thread::spawn(move || statedb::enforce(&path, MACHINE, &policy()))
    };
    holder.execute_batch("COMMIT;").unwrap();
    assert_eq!(patch.join().unwrap().unwrap(), PatchOutcome::Patched);
}
