//! The bad-manifest catalogue, run through the real binary: every file under
//! `tests/manifests/bad/` must produce exactly its `.stderr` and exit 2.

use std::fs;

use bottle_test_support::temp_state_root;

use crate::{bottle, repo_root};

#[test]
fn every_bad_manifest_gives_its_exact_error() {
    let dir = repo_root().join("tests/manifests/bad");
    let state = temp_state_root();
    let mut cases: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 20,
        "the catalogue must hold at least 20 bad manifests, found {}",
        cases.len()
    );
    let mut mismatches = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_str().unwrap();
        let expected = fs::read_to_string(case.with_extension("stderr"))
            .unwrap_or_else(|_| panic!("{name} has no .stderr file"));
        let output = bottle(state.path())
            .current_dir(&dir)
            .args(["check", "--manifest", name])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.code() != Some(2) || stderr != expected || !output.stdout.is_empty() {
            mismatches.push(format!(
                "{name}: exit {:?}\n--- expected\n{expected}--- got\n{stderr}",
                output.status.code()
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(
        fs::read_dir(state.path()).unwrap().next().is_none(),
        "a bad manifest must leave nothing behind"
    );
}

#[test]
fn every_good_manifest_checks_ok() {
    let dir = repo_root().join("tests/manifests/good");
    let state = temp_state_root();
    let mut count = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "toml") {
            continue;
        }
        count += 1;
        bottle(state.path())
            .current_dir(&dir)
            .args(["check", "--manifest"])
            .arg(path.file_name().unwrap())
            .assert()
            .success();
    }
    assert!(count > 0, "no good manifests found");
}
