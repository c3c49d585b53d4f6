//! `docs/ERRORS.md` lists every error code the sources can produce, and
//! no code twice.

use std::collections::BTreeSet;
use std::path::Path;

/// Every `"BOT-XNNN"` literal in the non-test Rust sources under `dir`.
fn codes_in(dir: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" && name != "target" {
                codes_in(&path, found);
            }
            continue;
        }
        if !name.ends_with(".rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, _) in text.match_indices("\"BOT-") {
            let code: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let line_start = text[..i].rfind('\n').map_or(0, |n| n + 1);
            // Assertions in unit tests mention codes; they define none.
            if !text[line_start..i].contains("assert") {
                found.insert(code);
            }
        }
    }
}

#[test]
fn every_error_code_is_documented_once() {
    let root = crate::repo_root();
    let mut sources = BTreeSet::new();
    codes_in(&root.join("crates"), &mut sources);
    codes_in(&root.join("xtask/src"), &mut sources);
    assert!(sources.len() > 100, "found only {sources:?}");

    let doc = std::fs::read_to_string(root.join("docs/ERRORS.md")).unwrap();
    let mut documented = Vec::new();
    for line in doc.lines() {
        if let Some(rest) = line.strip_prefix("| `BOT-") {
            let code: String = rest.chars().take_while(|c| *c != '`').collect();
            documented.push(format!("BOT-{code}"));
        }
    }
    let unique: BTreeSet<String> = documented.iter().cloned().collect();
    assert_eq!(unique.len(), documented.len(), "a code is listed twice");
    let missing: Vec<&String> = sources.difference(&unique).collect();
    assert!(
        missing.is_empty(),
        "docs/ERRORS.md lacks {missing:?}: add a row for each (what it means)"
    );
    let stale: Vec<&String> = unique.difference(&sources).collect();
    assert!(
        stale.is_empty(),
        "docs/ERRORS.md lists codes no source produces: {stale:?}"
    );
}
