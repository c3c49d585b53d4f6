//! Tidy: checks over the repository's own text, run as ordinary tests by
//! `cargo test --workspace` (and so by `cargo xtask test`).
//!
//! Each check is a function from the text it reads to the problems it
//! finds, so a unit test can plant a violation and watch it fail; one
//! `#[test]` per check then runs it on this repository. A new check follows
//! the same shape: a pure function, a planted-violation test, a repository
//! test.
//!
//! "Production sources" below are the `.rs` files under `crates/` and
//! `xtask/` outside `tests/`, `benches/` and `examples/` directories, each
//! cut before its inline `#[cfg(test)] mod … {` (by convention the last item
//! of a file). This file is left out of them, since it names what the checks
//! look for; its planted violations are left out of the dependency check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// This file, relative to the repository root.
const TIDY_SELF: &str = "xtask/src/tidy.rs";

/// Where this file's planted violations start.
const PLANTED: &str = "\nmod planted {";

/// The repository root (xtask lives one level below it).
fn repo_root() -> PathBuf {
    crate::process::workspace_root()
}

/// Every `.rs` file under `dir` (relative to `root`), keyed by its path
/// relative to `root` with `/` separators, skipping `target/`.
fn rust_files(root: &Path, dir: &str) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut pending = vec![root.join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap();
                let key = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(key, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    files
}

/// Whether `path` (relative, `/`-separated) is a test, bench or example.
fn is_test_path(path: &str) -> bool {
    path.split('/')
        .any(|part| matches!(part, "tests" | "benches" | "examples"))
}

/// `text` up to its inline test module: the first `#[cfg(test)]` line
/// directly followed by `mod name {`. An out-of-line `mod name;` cuts
/// nothing: its file is read on its own.
fn without_test_module(text: &str) -> &str {
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                let next = next.trim();
                (next.starts_with("mod ") || next.starts_with("pub mod ")) && next.ends_with('{')
            })
        {
            return &text[..offset];
        }
        offset += line.len();
    }
    text
}

/// The production sources of the repository, test modules cut.
fn production_sources(root: &Path) -> BTreeMap<String, String> {
    let mut files = rust_files(root, "crates");
    files.extend(rust_files(root, "xtask"));
    files
        .into_iter()
        .filter(|(path, _)| !is_test_path(path) && path != TIDY_SELF)
        .map(|(path, text)| {
            let text = without_test_module(&text).to_string();
            (path, text)
        })
        .collect()
}

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path)).unwrap()
}

/// Fails the calling test with every problem, one per line.
fn assert_tidy(check: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "tidy: {check}:\n  {}",
        problems.join("\n  ")
    );
}

// ---------------------------------------------------------------------------
// docs/ERRORS.md lists every error code, once, and nothing else.

/// The `"BOT-X123"` string literals in `text`.
fn error_codes_in(text: &str) -> BTreeSet<String> {
    let mut codes = BTreeSet::new();
    for (i, _) in text.match_indices("\"BOT-") {
        let candidate = &text.as_bytes()[i + 1..];
        let well_formed = candidate.len() >= 9
            && candidate[4].is_ascii_uppercase()
            && candidate[5..8].iter().all(u8::is_ascii_digit)
            && candidate[8] == b'"';
        if well_formed {
            codes.insert(text[i + 1..i + 9].to_string());
        }
    }
    codes
}

/// Problems between the codes the sources produce and the rows of
/// docs/ERRORS.md (`| \`BOT-X123\` | meaning |`).
fn check_error_codes(sources: &BTreeMap<String, String>, errors_md: &str) -> Vec<String> {
    let produced: BTreeSet<String> = sources.values().flat_map(|t| error_codes_in(t)).collect();
    let mut problems = Vec::new();
    let mut documented = BTreeSet::new();
    for line in errors_md.lines() {
        if let Some(rest) = line.strip_prefix("| `") {
            let code: String = rest.chars().take_while(|c| *c != '`').collect();
            if code.starts_with("BOT-") && !documented.insert(code.clone()) {
                problems.push(format!("docs/ERRORS.md lists {code} twice"));
            }
        }
    }
    for code in produced.difference(&documented) {
        problems.push(format!(
            "{code} is produced by the sources but missing from docs/ERRORS.md: add a row saying what it means"
        ));
    }
    for code in documented.difference(&produced) {
        problems.push(format!(
            "docs/ERRORS.md lists {code}, which no source produces: delete its row (and never reuse the code)"
        ));
    }
    problems
}

#[test]
fn every_error_code_is_documented_once() {
    let root = repo_root();
    let sources = production_sources(&root);
    let produced: usize = sources.values().map(|t| error_codes_in(t).len()).sum();
    assert!(produced > 100, "found only {produced} error codes");
    assert_tidy(
        "error codes",
        &check_error_codes(&sources, &read(&root, "docs/ERRORS.md")),
    );
}

// ---------------------------------------------------------------------------
// ARCHITECTURE.md's "Spawn sites" list is exactly the files that spawn.

/// The paths in ARCHITECTURE.md's list under the `**Spawn sites**` line:
/// the `` - `path` `` items that follow it; `None` without that line.
fn listed_spawn_sites(architecture_md: &str) -> Option<BTreeSet<String>> {
    let mut lines = architecture_md.lines();
    lines.by_ref().find(|l| l.contains("**Spawn sites**"))?;
    let mut listed = BTreeSet::new();
    for line in lines {
        let line = line.trim();
        if let Some(item) = line.strip_prefix("- `") {
            listed.insert(item.chars().take_while(|c| *c != '`').collect());
        } else if (line.is_empty() && !listed.is_empty()) || line.starts_with('#') {
            break;
        }
        // Otherwise the text before the first item, or a wrapped item's
        // second line: the list goes on.
    }
    Some(listed)
}

/// Whether `text` calls `Command::new` (std's or tokio's) outside a comment.
fn spawns(text: &str) -> bool {
    text.lines()
        .any(|l| !l.trim_start().starts_with("//") && l.contains("Command::new("))
}

/// Problems between the production sources that spawn and the list.
fn check_spawn_sites(sources: &BTreeMap<String, String>, architecture_md: &str) -> Vec<String> {
    let Some(listed) = listed_spawn_sites(architecture_md) else {
        return vec!["ARCHITECTURE.md has no `**Spawn sites**` list".into()];
    };
    let spawning: BTreeSet<String> = sources
        .iter()
        .filter(|(_, text)| spawns(text))
        .map(|(path, _)| path.clone())
        .collect();
    let mut problems = Vec::new();
    for path in spawning.difference(&listed) {
        problems.push(format!(
            "{path} calls Command::new but is not in ARCHITECTURE.md's spawn sites: spawn through bottle_core::exec instead, or list it and say why"
        ));
    }
    for path in listed.difference(&spawning) {
        problems.push(format!(
            "ARCHITECTURE.md lists {path} as a spawn site, but it no longer calls Command::new: delete the line"
        ));
    }
    problems
}

#[test]
fn every_spawn_site_is_listed_in_architecture_md() {
    let root = repo_root();
    assert_tidy(
        "spawn sites",
        &check_spawn_sites(&production_sources(&root), &read(&root, "ARCHITECTURE.md")),
    );
}

// ---------------------------------------------------------------------------
// Every path ARCHITECTURE.md names exists.

/// Where a path ARCHITECTURE.md names from the repository root starts.
const ROOTED: [&str; 5] = ["crates/", "xtask/", "docs/", "examples/", ".ci/"];

/// Every file and directory under `root`, relative with `/` separators
/// (directories end in `/`), skipping `target/` and `.git/`.
fn repository_paths(root: &Path) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            if path.is_dir() {
                if !matches!(relative.as_str(), "target" | ".git") {
                    paths.insert(format!("{relative}/"));
                    pending.push(path);
                }
            } else {
                paths.insert(relative);
            }
        }
    }
    paths
}

/// The paths a document names in backticks: each one rooted at the
/// repository ([`ROOTED`]), which must exist there, and each other `.rs`
/// file (a crate paragraph names its modules relative to the crate), which
/// must end some path of the repository.
fn check_named_paths(document: &str, paths: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for span in document.split('`').skip(1).step_by(2) {
        if span.is_empty() || span.contains(char::is_whitespace) || span.contains(['*', '<', '{']) {
            continue;
        }
        let rooted = ROOTED.iter().any(|root| span.starts_with(root));
        let found = if rooted {
            paths.contains(span) || paths.contains(&format!("{}/", span.trim_end_matches('/')))
        } else if span.ends_with(".rs") {
            let tail = format!("/{span}");
            paths
                .iter()
                .any(|path| path.ends_with(&tail) || path == span)
        } else {
            continue;
        };
        if !found {
            problems.push(format!(
                "ARCHITECTURE.md names `{span}`, which is not in the repository: correct the path or delete the mention"
            ));
        }
    }
    problems
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = repo_root();
    assert_tidy(
        "paths in ARCHITECTURE.md",
        &check_named_paths(&read(&root, "ARCHITECTURE.md"), &repository_paths(&root)),
    );
}

// ---------------------------------------------------------------------------
// No declared dependency goes unused.

/// Whether `text` names the crate `name` (as written in code, `_` for `-`)
/// as a path root, in a `use`, or in `extern crate`.
fn names_crate(text: &str, name: &str) -> bool {
    let path = format!("{name}::");
    let as_path_root = text.match_indices(&path).any(|(i, _)| {
        text[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'))
    });
    as_path_root
        || [
            format!("use {name};"),
            format!("use {name} as"),
            format!("extern crate {name}"),
        ]
        .iter()
        .any(|form| text.contains(form))
}

/// The dependency tables of a manifest: `(table, name)` for each entry of
/// `[dependencies]`, `[dev-dependencies]` and `[build-dependencies]`,
/// target-specific ones under their plain table's name.
fn declared_dependencies(manifest: &toml::Table) -> Vec<(&'static str, String)> {
    const TABLES: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];
    let mut scopes = vec![manifest];
    if let Some(targets) = manifest.get("target").and_then(toml::Value::as_table) {
        scopes.extend(targets.values().filter_map(toml::Value::as_table));
    }
    let mut declared = Vec::new();
    for scope in scopes {
        for table in TABLES {
            if let Some(deps) = scope.get(table).and_then(toml::Value::as_table) {
                declared.extend(deps.keys().map(|name| (table, name.clone())));
            }
        }
    }
    declared
}

/// Problems in one crate: each dependency must be named where it can be
/// used. `files` are the crate's `.rs` files relative to its directory
/// (`src/lib.rs`, `tests/cli/main.rs`, `build.rs`, ...).
fn check_crate_dependencies(
    crate_dir: &str,
    manifest: &str,
    files: &BTreeMap<String, String>,
) -> Vec<String> {
    let manifest: toml::Table = match toml::from_str(manifest) {
        Ok(table) => table,
        Err(err) => return vec![format!("{crate_dir}/Cargo.toml: {err}")],
    };
    let in_dirs = |dirs: &[&str], production_only: bool| -> Vec<&str> {
        files
            .iter()
            .filter(|(path, _)| dirs.iter().any(|d| path.starts_with(d)))
            .map(|(_, text)| {
                if production_only {
                    without_test_module(text)
                } else {
                    text.as_str()
                }
            })
            .collect()
    };
    let mut problems = Vec::new();
    for (table, name) in declared_dependencies(&manifest) {
        // A renamed dependency (`package = "…"`) is named in code by its key.
        let code_name = name.replace('-', "_");
        let (texts, places) = match table {
            "dependencies" => (in_dirs(&["src/"], true), "src/ outside tests"),
            "build-dependencies" => (in_dirs(&["build.rs"], false), "build.rs"),
            _ => (
                in_dirs(&["src/", "tests/", "benches/", "examples/"], false),
                "src/, tests/, benches/ or examples/",
            ),
        };
        if !texts.iter().any(|text| names_crate(text, &code_name)) {
            problems.push(format!(
                "{crate_dir}/Cargo.toml declares {name} in [{table}] but {places} never names `{code_name}`: remove it"
            ));
        }
    }
    problems
}

/// Problems in the root manifest: each `[workspace.dependencies]` entry must
/// be inherited (`workspace = true`) by some member manifest.
fn check_workspace_dependencies(root_manifest: &str, members: &[&str]) -> Vec<String> {
    let parse = |text: &str| toml::from_str::<toml::Table>(text).map_err(|e| e.to_string());
    let root = match parse(root_manifest) {
        Ok(table) => table,
        Err(err) => return vec![format!("Cargo.toml: {err}")],
    };
    let mut inherited = BTreeSet::new();
    for member in members {
        let manifest = match parse(member) {
            Ok(table) => table,
            Err(err) => return vec![format!("a member's Cargo.toml: {err}")],
        };
        let tables = [manifest.clone()].into_iter().chain(
            manifest
                .get("target")
                .and_then(toml::Value::as_table)
                .into_iter()
                .flat_map(|targets| targets.values().filter_map(toml::Value::as_table).cloned()),
        );
        for scope in tables {
            for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
                let Some(deps) = scope.get(table).and_then(toml::Value::as_table) else {
                    continue;
                };
                for (name, spec) in deps {
                    let from_workspace = spec
                        .get("workspace")
                        .and_then(toml::Value::as_bool)
                        .unwrap_or(false);
                    if from_workspace {
                        inherited.insert(name.clone());
                    }
                }
            }
        }
    }
    let declared = root
        .get("workspace")
        .and_then(|w| w.get("dependencies"))
        .and_then(toml::Value::as_table);
    declared
        .into_iter()
        .flat_map(|deps| deps.keys())
        .filter(|name| !inherited.contains(*name))
        .map(|name| {
            format!(
                "Cargo.toml declares {name} in [workspace.dependencies] but no member uses it: remove it"
            )
        })
        .collect()
}

/// The member directories of the workspace, relative to the root
/// (`members` entries, a trailing `/*` expanded).
fn workspace_members(root: &Path, root_manifest: &toml::Table) -> Vec<String> {
    let members = root_manifest["workspace"]["members"].as_array().unwrap();
    let mut dirs = Vec::new();
    for member in members {
        let member = member.as_str().unwrap();
        if let Some(parent) = member.strip_suffix("/*") {
            let mut children: Vec<String> = std::fs::read_dir(root.join(parent))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.join("Cargo.toml").is_file())
                .map(|p| format!("{parent}/{}", p.file_name().unwrap().to_string_lossy()))
                .collect();
            children.sort();
            dirs.extend(children);
        } else {
            dirs.push(member.to_string());
        }
    }
    dirs
}

#[test]
fn no_declared_dependency_is_unused() {
    let root = repo_root();
    let root_manifest = read(&root, "Cargo.toml");
    let members = workspace_members(&root, &toml::from_str(&root_manifest).unwrap());
    assert!(members.len() > 5, "found only {members:?}");
    let mut problems = Vec::new();
    let mut manifests = Vec::new();
    for member in &members {
        let manifest = read(&root, &format!("{member}/Cargo.toml"));
        let prefix = format!("{member}/");
        let files: BTreeMap<String, String> = rust_files(&root, member)
            .into_iter()
            .map(|(path, mut text)| {
                if path == TIDY_SELF {
                    text.truncate(text.find(PLANTED).unwrap());
                }
                (path[prefix.len()..].to_string(), text)
            })
            .collect();
        problems.extend(check_crate_dependencies(member, &manifest, &files));
        manifests.push(manifest);
    }
    let manifests: Vec<&str> = manifests.iter().map(String::as_str).collect();
    problems.extend(check_workspace_dependencies(&root_manifest, &manifests));
    assert_tidy("unused dependencies", &problems);
}

// ---------------------------------------------------------------------------
// Crates stay in their layers (ARCHITECTURE.md invariant 5).

/// What each crate must never depend on, in any dependency table, and why.
const FORBIDDEN_DEPENDENCIES: [(&str, &str, &str); 3] = [
    (
        "crates/bottle-docker",
        "bottle-smolvm",
        "backends meet only in bottle-core's traits",
    ),
    (
        "crates/bottle-smolvm",
        "bottle-docker",
        "backends meet only in bottle-core's traits",
    ),
    (
        "crates/bottle-cli",
        "bottle-bundle",
        "the CLI must not link the proxy stack; use bottle-bundle-files",
    ),
];

/// Problems with crate `dir` (manifest text `manifest`) depending on what
/// [`FORBIDDEN_DEPENDENCIES`] rules out for it.
fn check_layering(dir: &str, manifest: &str) -> Vec<String> {
    let manifest: toml::Table = match toml::from_str(manifest) {
        Ok(table) => table,
        Err(err) => return vec![format!("{dir}/Cargo.toml: {err}")],
    };
    let declared = declared_dependencies(&manifest);
    FORBIDDEN_DEPENDENCIES
        .iter()
        .filter(|(crate_dir, _, _)| *crate_dir == dir)
        .filter_map(|(_, forbidden, why)| {
            declared
                .iter()
                .find(|(_, name)| name == forbidden)
                .map(|(table, _)| {
                    format!("{dir}/Cargo.toml depends on {forbidden} in [{table}]: {why}")
                })
        })
        .collect()
}

#[test]
fn crates_stay_in_their_layers() {
    let root = repo_root();
    let problems: Vec<String> = FORBIDDEN_DEPENDENCIES
        .iter()
        .map(|(dir, _, _)| *dir)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .flat_map(|dir| check_layering(dir, &read(&root, &format!("{dir}/Cargo.toml"))))
        .collect();
    assert_tidy("layering", &problems);
}

// ---------------------------------------------------------------------------
// No module of these crates imports one that imports it back: a crate whose
// modules form a circle can only be understood, or split, as a whole.

/// The crates held to [`import_circles`] being empty.
const CRATES_WITHOUT_IMPORT_CIRCLES: &[&str] = &["crates/bottle-cli", "crates/bottle-docker"];

/// For each top-level module of the crate at `crate_dir` (`launch` for
/// `src/launch/agent.rs`), the crate's other top-level modules it names as
/// `crate::NAME`, comment lines skipped.
fn module_imports(
    sources: &BTreeMap<String, String>,
    crate_dir: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let src = format!("{crate_dir}/src/");
    let top = |path: &str| -> Option<String> {
        let rest = path.strip_prefix(&src)?;
        let first = rest.split('/').next()?.trim_end_matches(".rs");
        Some(first.to_string())
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in sources {
        let Some(module) = top(path) else { continue };
        let named = graph.entry(module.clone()).or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    named.insert(name);
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for named in graph.values_mut() {
        named.retain(|name| modules.contains(name));
    }
    graph
}

/// Every set of two or more modules that all reach one another through
/// `graph`'s imports, each sorted.
fn import_circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut pending = vec![from.to_string()];
        while let Some(module) = pending.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    pending.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|module| (module, reach(module))).collect();
    let mut circles: BTreeSet<Vec<String>> = BTreeSet::new();
    for (module, from_it) in &reached {
        let circle: Vec<String> = from_it
            .iter()
            .filter(|other| {
                reached
                    .get(other)
                    .is_some_and(|back| back.contains(*module))
            })
            .cloned()
            .collect();
        if circle.len() > 1 {
            circles.insert(circle);
        }
    }
    circles.into_iter().collect()
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let sources = production_sources(&repo_root());
    let problems: Vec<String> = CRATES_WITHOUT_IMPORT_CIRCLES
        .iter()
        .flat_map(|dir| {
            import_circles(&module_imports(&sources, dir))
                .into_iter()
                .map(move |circle| format!("{dir}: {} import one another", circle.join(", ")))
        })
        .collect();
    assert_tidy("import circles", &problems);
}

// ---------------------------------------------------------------------------
// Each check fails on a planted violation.

mod planted {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn an_import_circle_is_found_and_a_chain_is_not() {
        let sources = files(&[
            ("crates/z/src/lib.rs", "pub mod a; pub mod b; pub mod c;"),
            (
                "crates/z/src/a.rs",
                "use crate::b::B;\n// crate::c in a comment",
            ),
            ("crates/z/src/b/mod.rs", "use crate::c;"),
            ("crates/z/src/b/inner.rs", "fn f() { crate::a::g() }"),
            ("crates/z/src/c.rs", "use crate::lib_only;"),
        ]);
        let graph = module_imports(&sources, "crates/z");
        assert_eq!(
            import_circles(&graph),
            [vec!["a".to_string(), "b".to_string()]]
        );
        let chain = files(&[
            ("crates/z/src/a.rs", "use crate::b::B;"),
            ("crates/z/src/b.rs", "use crate::c;"),
            ("crates/z/src/c.rs", ""),
        ]);
        assert!(import_circles(&module_imports(&chain, "crates/z")).is_empty());
    }

    const ERRORS_MD: &str = "| code | what it means |\n| --- | --- |\n| `BOT-Z001` | one |\n";

    #[test]
    fn error_codes_agree() {
        let sources = files(&[("crates/z/src/error.rs", r#"Z::One => "BOT-Z001","#)]);
        assert_eq!(check_error_codes(&sources, ERRORS_MD), Vec::<String>::new());
    }

    #[test]
    fn a_produced_code_missing_from_the_doc_fails() {
        let sources = files(&[(
            "crates/z/src/error.rs",
            r#"Z::One => "BOT-Z001", Z::Two => "BOT-Z002","#,
        )]);
        let problems = check_error_codes(&sources, ERRORS_MD);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("BOT-Z002 is produced"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_documented_code_no_source_produces_fails() {
        let sources = files(&[("crates/z/src/error.rs", "")]);
        let problems = check_error_codes(&sources, ERRORS_MD);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("lists BOT-Z001, which no source"));
    }

    #[test]
    fn a_code_listed_twice_fails() {
        let sources = files(&[("crates/z/src/error.rs", r#""BOT-Z001""#)]);
        let doc = format!("{ERRORS_MD}| `BOT-Z001` | again |\n");
        let problems = check_error_codes(&sources, &doc);
        assert_eq!(problems, ["docs/ERRORS.md lists BOT-Z001 twice"]);
    }

    #[test]
    fn only_whole_code_literals_count() {
        let text = r#"starts_with("BOT-N") "BOT-N0012" "BOT-n001" "BOT-N001""#;
        assert_eq!(
            error_codes_in(text),
            BTreeSet::from(["BOT-N001".to_string()])
        );
    }

    #[test]
    fn the_test_module_is_cut_and_other_cfg_test_items_are_kept() {
        let kept = "#[cfg(test)]\nmod tidy;\nfn a() {}\n#[cfg(test)]\nfn b() {}\n";
        let text = format!("{kept}#[cfg(test)]\nmod tests {{\n    fn c() {{}}\n}}\n");
        assert_eq!(without_test_module(&text), kept);
    }

    const ARCHITECTURE_MD: &str = "5. One place spawns.\n\n   **Spawn sites** (checked by tidy):\n   - `crates/z/src/exec.rs`\n\n## Errors\n- `not/a/site.rs`\n";

    #[test]
    fn named_paths_are_found_rooted_or_as_a_tail() {
        let paths: BTreeSet<String> = [
            "crates/",
            "crates/a/",
            "crates/a/src/",
            "crates/a/src/lib.rs",
            "crates/a/src/launch/agent.rs",
        ]
        .map(String::from)
        .into();
        let document = "`crates/a` and `crates/a/src/lib.rs`, `launch/agent.rs`, \
                        `lib.rs`, `box/`, `bottle-*`, `a b.rs`";
        assert_eq!(check_named_paths(document, &paths), Vec::<String>::new());
        let stale = check_named_paths("`crates/b/src/x.rs` and `gone.rs`", &paths);
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert!(stale[0].contains("`crates/b/src/x.rs`") && stale[1].contains("`gone.rs`"));
    }

    #[test]
    fn spawn_sites_agree() {
        let sources = files(&[
            ("crates/z/src/exec.rs", "let c = Command::new(p);"),
            ("crates/z/src/lib.rs", "// not Command::new(here)"),
        ]);
        assert_eq!(
            check_spawn_sites(&sources, ARCHITECTURE_MD),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_wrapped_item_does_not_end_the_list() {
        let md = "   **Spawn sites**:\n   - `a.rs` (a reason that\n     wraps)\n   - `b.rs`\n\n- `not/a/site.rs`\n";
        let listed = listed_spawn_sites(md).unwrap();
        assert_eq!(
            listed.into_iter().collect::<Vec<_>>(),
            ["a.rs".to_string(), "b.rs".to_string()]
        );
    }

    #[test]
    fn an_unlisted_spawn_site_fails() {
        let sources = files(&[
            ("crates/z/src/exec.rs", "let c = Command::new(p);"),
            ("crates/z/src/sneaky.rs", "tokio::process::Command::new(p)"),
        ]);
        let problems = check_spawn_sites(&sources, ARCHITECTURE_MD);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("crates/z/src/sneaky.rs calls"));
    }

    #[test]
    fn a_listed_file_that_no_longer_spawns_fails() {
        let sources = files(&[("crates/z/src/exec.rs", "fn run() {}")]);
        let problems = check_spawn_sites(&sources, ARCHITECTURE_MD);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("lists crates/z/src/exec.rs"));
    }

    #[test]
    fn a_missing_spawn_site_list_fails() {
        let problems = check_spawn_sites(&BTreeMap::new(), "# Architecture\n");
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    const MANIFEST: &str = r#"
[package]
name = "z"

[dependencies]
serde_json.workspace = true
http-body = { workspace = true }
renamed = { package = "real-name", version = "1" }

[target.'cfg(target_os = "macos")'.dependencies]
nix.workspace = true

[dev-dependencies]
tempfile.workspace = true
"#;

    fn crate_files(lib: &str, test: &str) -> BTreeMap<String, String> {
        files(&[("src/lib.rs", lib), ("tests/it.rs", test)])
    }

    const USES_ALL: &str = "use serde_json::json;\nfn f(b: http_body::Frame) {}\nuse renamed as r;\nnix::unistd::getuid();\n";

    #[test]
    fn used_dependencies_pass() {
        let files = crate_files(USES_ALL, "let d = tempfile::tempdir();");
        assert_eq!(
            check_crate_dependencies("crates/z", MANIFEST, &files),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_unused_dependency_fails() {
        let lib = USES_ALL.replace("nix::unistd::getuid();", "my_nix::f(); crate::nix::g();");
        let files = crate_files(&lib, "let d = tempfile::tempdir();");
        let problems = check_crate_dependencies("crates/z", MANIFEST, &files);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("declares nix in [dependencies]"));
    }

    #[test]
    fn a_dependency_used_only_by_tests_fails() {
        let lib = format!("{USES_ALL}#[cfg(test)]\nmod tests {{\n    use renamed;\n}}\n")
            .replace("use renamed as r;\n", "");
        let files = crate_files(&lib, "let d = tempfile::tempdir();");
        let problems = check_crate_dependencies("crates/z", MANIFEST, &files);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("declares renamed in [dependencies]"));
    }

    #[test]
    fn an_unused_dev_dependency_fails() {
        let files = crate_files(USES_ALL, "");
        let problems = check_crate_dependencies("crates/z", MANIFEST, &files);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("declares tempfile in [dev-dependencies]"));
    }

    #[test]
    fn an_unused_workspace_dependency_fails() {
        let root = "[workspace]\nmembers = [\"z\"]\n\n[workspace.dependencies]\nserde_json = \"1\"\nhttp-body = \"1\"\nnix = \"0.31\"\ntempfile = \"3\"\nprocfs = \"0.18\"\n";
        let problems = check_workspace_dependencies(root, &[MANIFEST]);
        assert_eq!(
            problems,
            [
                "Cargo.toml declares procfs in [workspace.dependencies] but no member uses it: remove it"
            ]
        );
    }

    #[test]
    fn a_backend_depending_on_another_fails() {
        let manifest = "[package]\nname = \"bottle-docker\"\n\n[dev-dependencies]\nbottle-smolvm.workspace = true\n";
        assert_eq!(
            check_layering("crates/bottle-docker", manifest),
            [
                "crates/bottle-docker/Cargo.toml depends on bottle-smolvm in [dev-dependencies]: backends meet only in bottle-core's traits"
            ]
        );
        assert!(
            check_layering(
                "crates/bottle-docker",
                "[dependencies]\nbottle-core.workspace = true\n"
            )
            .is_empty()
        );
    }
}
