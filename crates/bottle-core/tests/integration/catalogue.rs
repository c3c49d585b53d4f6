//! The bad-manifest catalogue (`tests/manifests/` at the repository root).
//!
//! Every `bad/<NN>-<what>.toml` must fail with exactly the text in the
//! `.stderr` file beside it: what `bottle check --manifest <NN>-<what>.toml`
//! prints when run from `tests/manifests/bad`. The manifest is loaded by its
//! real path (so relative references resolve next to it) and the error's
//! `file` is then set to the bare file name, which is what the CLI shows
//! when given that bare name. Every `good/*.toml` must load.
//!
//! `UPDATE_EXPECT=1 cargo test -p bottle-core --test integration catalogue` rewrites the
//! `.stderr` files; review the diff before keeping it.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "helpers shared by tests; a broken fixture should panic"
)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use bottle_core::Coded as _;
use bottle_core::manifest::{self, codes};

fn catalogue() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/manifests")
}

fn tomls(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// What the CLI prints for a bad manifest named by its bare file name.
fn rendered(path: &Path) -> (String, &'static str) {
    let mut err = manifest::load(path).expect_err("a bad manifest must not load");
    err.file = PathBuf::from(path.file_name().unwrap());
    let fix = err
        .fix()
        .map_or_else(String::new, |fix| format!("  fix: {fix}\n"));
    (format!("error[{}]: {err}\n{fix}", err.code), err.code)
}

#[test]
fn bad_manifests_fail_with_the_recorded_message() {
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let files = tomls(&catalogue().join("bad"));
    assert!(files.len() >= 24, "the catalogue has {} files", files.len());
    let mut mismatches = Vec::new();
    for file in &files {
        let (got, _) = rendered(file);
        let expected_path = file.with_extension("stderr");
        if update {
            fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let want = fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} has no .stderr file", file.display()));
        if got != want {
            mismatches.push(format!(
                "{}\n  want: {want:?}\n  got:  {got:?}",
                file.display()
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn every_stderr_file_has_its_manifest() {
    for entry in fs::read_dir(catalogue().join("bad")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "stderr") {
            assert!(
                path.with_extension("toml").is_file(),
                "{} has no .toml beside it",
                path.display()
            );
        }
    }
}

#[test]
fn each_bad_manifest_has_exactly_one_problem_it_is_named_for() {
    // The file name's number is unique, so one file cannot shadow another.
    let mut numbers = BTreeSet::new();
    for file in tomls(&catalogue().join("bad")) {
        let name = file.file_stem().unwrap().to_str().unwrap().to_string();
        let (number, what) = name.split_once('-').expect("<NN>-<what>.toml");
        assert!(
            (2..=3).contains(&number.len()) && number.bytes().all(|b| b.is_ascii_digit()),
            "{name}"
        );
        assert!(!what.is_empty(), "{name}");
        assert!(
            numbers.insert(number.to_string()),
            "number {number} used twice"
        );
    }
}

#[test]
fn every_code_but_read_is_in_the_catalogue() {
    let seen: BTreeSet<&str> = tomls(&catalogue().join("bad"))
        .iter()
        .map(|f| rendered(f).1)
        .collect();
    let missing: Vec<&str> = codes::ALL
        .iter()
        .map(|(code, _)| *code)
        .filter(|code| *code != codes::READ && !seen.contains(code))
        .collect();
    assert!(
        missing.is_empty(),
        "codes with no bad manifest: {missing:?}"
    );
}

#[test]
fn every_code_is_documented() {
    let doc =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/MANIFEST.md"))
            .unwrap();
    for (code, _) in codes::ALL {
        assert!(
            doc.contains(&format!("`{code}`")),
            "{code} is not in docs/MANIFEST.md"
        );
    }
}

#[test]
fn good_manifests_load() {
    let files = tomls(&catalogue().join("good"));
    assert!(files.len() >= 3);
    for file in files {
        if let Err(err) = manifest::load(&file) {
            panic!("error[{}]: {err}", err.code);
        }
    }
}

#[test]
fn the_full_manifest_uses_every_feature() {
    let m = manifest::load(&catalogue().join("good/full.toml")).unwrap();
    let claude = &m.agents["claude"];
    assert!(claude.image.is_some() && !claude.command.is_empty() && !claude.env.is_empty());
    assert!(claude.prompt.is_some() && !claude.skills.is_empty());
    assert!(claude.devices.is_some() && !claude.devices_blacklist.is_empty());
    assert!(claude.egress.ports.is_some() && claude.credentials.len() >= 2);
    assert!(!claude.egress.on_secret.is_empty());
    assert!(claude.publish.len() >= 2);
    assert!(!claude.egress.host_services.is_empty() && !claude.egress.tcp.is_empty());
    assert!(claude.credentials.iter().any(|c| c.format.is_some()));
    assert!(
        claude
            .git
            .iter()
            .any(|g| g.mode == manifest::GitMode::ReadWrite)
    );
    assert_eq!(claude.memory_bytes(), Some(8 << 30));
    assert_eq!(claude.disk_bytes(), Some(20 << 30));
    assert_eq!(claude.limits.pids, Some(2048));
    assert_eq!(claude.limits.cpus, Some(2.5));
    let built = m.agents.values().find_map(|a| a.build.as_ref()).unwrap();
    assert!(built.dockerfile.is_some() && !built.args.is_empty());
    assert_eq!(claude.isolation, manifest::Isolation::Container);
    assert_eq!(m.agents["builder"].isolation, manifest::Isolation::Gvisor);
}
