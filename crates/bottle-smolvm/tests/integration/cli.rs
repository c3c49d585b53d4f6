//! The wrapper against the fake: argv shapes the fake accepts per version,
//! exit codes and streams kept apart, smolvm's failures told from the
//! guest's.

use bottle_smolvm::SmolvmError;
use bottle_smolvm::version::SmolvmVersion;

use crate::support::{World, sandbox_available};

fn artifact(world: &World) -> std::path::PathBuf {
    let path = world.dir.path().join("a.smolmachine");
    std::fs::write(
        &path,
        r#"{"format":"fake-smolmachine/1","image":"localhost:1/a:b"}"#,
    )
    .unwrap();
    path
}

#[test]
fn version_is_read_from_the_program() {
    let world = World::new();
    for v in ["0.8.0", "1.1.3", "1.9.3"] {
        let smolvm = world.smolvm(v, "");
        assert_eq!(smolvm.version().unwrap(), SmolvmVersion::parse(v).unwrap());
    }
}

#[test]
fn create_and_delete_shapes_match_each_version() {
    for v in ["0.8.0", "1.0.5", "1.1.0", "1.9.3"] {
        let world = World::new();
        let smolvm = world.smolvm(v, "");
        let from = artifact(&world);
        smolvm
            .create("bot-bottle-shape", &from, &["192.168.7.2/32".into()], None)
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        let names: Vec<String> = smolvm.list().unwrap().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["bot-bottle-shape"], "{v}");
        smolvm
            .delete("bot-bottle-shape")
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        assert!(smolvm.list().unwrap().is_empty(), "{v}");
    }
}

#[test]
fn from_drops_allow_cidr_before_1_8_and_keeps_it_after() {
    for (v, expected) in [
        ("1.7.7", serde_json::Value::Null),
        ("1.8.0", serde_json::json!(["192.168.7.2/32"])),
    ] {
        let world = World::new();
        let smolvm = world.smolvm(v, "");
        smolvm
            .create(
                "bot-bottle-drop",
                &artifact(&world),
                &["192.168.7.2/32".into()],
                None,
            )
            .unwrap();
        let record = bottle_smolvm::statedb::read(&world.db(), "bot-bottle-drop").unwrap();
        assert_eq!(record["allowed_cidrs"], expected, "{v}");
    }
}

#[test]
fn the_disk_cap_sizes_the_machines_storage_disk() {
    let world = World::new();
    let smolvm = world.smolvm("1.9.3", "");
    smolvm
        .create("bot-bottle-disk", &artifact(&world), &[], Some(10))
        .unwrap();
    let record = bottle_smolvm::statedb::read(&world.db(), "bot-bottle-disk").unwrap();
    assert_eq!(record["storage_gb"], 10);
    smolvm
        .create("bot-bottle-nodisk", &artifact(&world), &[], None)
        .unwrap();
    let record = bottle_smolvm::statedb::read(&world.db(), "bot-bottle-nodisk").unwrap();
    assert_eq!(record["storage_gb"], serde_json::Value::Null);
}

#[test]
fn smolvms_own_errors_are_failures_with_its_message() {
    let world = World::new();
    let smolvm = world.smolvm("1.9.3", "");
    let err = smolvm.start("bot-bottle-none").unwrap_err();
    match &err {
        SmolvmError::Failed { code, stderr, .. } => {
            assert_eq!(*code, Some(1));
            assert!(stderr.starts_with("Error:"), "{stderr}");
        }
        other => panic!("{other:?}"),
    }
    // exec on a machine that is not running: smolvm's exit 1, not a guest 1.
    smolvm
        .create("bot-bottle-idle", &artifact(&world), &[], None)
        .unwrap();
    let err = smolvm
        .exec("bot-bottle-idle", &["true".into()], &[])
        .unwrap_err();
    assert!(
        matches!(err, SmolvmError::Failed { code: Some(1), .. }),
        "{err:?}"
    );
}

#[test]
fn guest_exit_codes_and_streams_are_kept_apart() {
    let world = World::new();
    if !sandbox_available(&world) {
        return;
    }
    let smolvm = world.smolvm("1.9.3", "");
    smolvm
        .create("bot-bottle-io", &artifact(&world), &[], None)
        .unwrap();
    smolvm.start("bot-bottle-io").unwrap();
    let sh = |script: &str| vec!["sh".to_string(), "-c".to_string(), script.to_string()];

    let out = smolvm
        .exec(
            "bot-bottle-io",
            &sh("printf 'out\\n'; printf 'err\\n' >&2; exit 1"),
            &[],
        )
        .unwrap();
    assert_eq!(out.exit_code, 1, "a guest exit 1 is not smolvm's error");
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");

    // A guest that prints smolvm's error prefix is still the guest.
    let out = smolvm
        .exec(
            "bot-bottle-io",
            &sh("echo 'Error: not really' >&2; exit 1"),
            &[],
        )
        .unwrap();
    assert_eq!(out.exit_code, 1);
    assert_eq!(out.stderr, b"Error: not really\n");

    let out = smolvm
        .exec(
            "bot-bottle-io",
            &sh("printf \"$GREETING\""),
            &[("GREETING".into(), "hi there".into())],
        )
        .unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout, b"hi there");
    assert!(
        out.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = smolvm
        .exec("bot-bottle-io", &["/nonexistent/program".into()], &[])
        .unwrap();
    assert_eq!(out.exit_code, 127);

    // Arguments survive untouched, quotes and all.
    let out = smolvm
        .exec(
            "bot-bottle-io",
            &[
                "printf".into(),
                "%s|".into(),
                "a b".into(),
                "'q'".into(),
                "$HOME".into(),
            ],
            &[],
        )
        .unwrap();
    assert_eq!(out.stdout, b"a b|'q'|$HOME|");
    smolvm.delete("bot-bottle-io").unwrap();
}

#[test]
fn copy_in_lands_in_the_guest() {
    let world = World::new();
    let smolvm = world.smolvm("1.9.3", "");
    smolvm
        .create("bot-bottle-cp", &artifact(&world), &[], None)
        .unwrap();
    smolvm.start("bot-bottle-cp").unwrap();
    let file = world.dir.path().join("hello.txt");
    std::fs::write(&file, "hello").unwrap();
    smolvm
        .copy_in("bot-bottle-cp", &file, "/hello.txt")
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(world.guest("bot-bottle-cp").join("hello.txt")).unwrap(),
        "hello"
    );
    // The guest path cannot climb out of the guest.
    assert!(
        smolvm
            .copy_in("bot-bottle-cp", &file, "/../../escape.txt")
            .is_err()
    );
    assert!(!world.fake_dir().join("guests/escape.txt").exists());
}
