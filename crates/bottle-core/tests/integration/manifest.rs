//! The manifest parser's public behaviour beyond the one-problem-per-file
//! catalogue: which problem wins when there are several, how paths resolve,
//! and positions in unusual text.

#![expect(
    clippy::unwrap_used,
    reason = "helpers shared by tests; a parse that succeeds should panic"
)]

use std::fs;
use std::path::Path;

use bottle_core::Coded as _;
use bottle_core::manifest::{self, codes};

fn err(text: &str) -> manifest::ManifestError {
    manifest::parse(Path::new("bottle.toml"), text).unwrap_err()
}

#[test]
fn the_first_problem_in_the_document_wins() {
    // Two semantic problems: the later agent (by name) comes first in the
    // file, so its problem is the one reported.
    let text = "[agents.zed]\nimage = \"\"\n\n[agents.alpha]\nimage = \"x\"\nlimits.pids = 1\n";
    let e = err(text);
    assert_eq!((e.code, e.position), (codes::EMPTY_IMAGE, Some((2, 9))));

    // Two serde problems in different agents: document order, not key order.
    let text = "[agents.zed]\nimage = 1\n\n[agents.alpha]\nimage = 2\n";
    let e = err(text);
    assert_eq!(
        (e.field.as_str(), e.position),
        ("agents.zed.image", Some((2, 9)))
    );

    // A shape problem before a type problem.
    let text = "[agents.a]\negress = [\"x.com\"]\nimage = 3\n";
    assert_eq!(err(text).field, "agents.a.egress");
}

#[test]
fn credential_hosts_are_checked_against_a_valid_allowlist_only() {
    // The allowlist entry is wrong; the error is about it, not about the
    // credential's host missing from it.
    let text = r#"
[agents.a]
image = "x"
egress.allow = ["https://api.example.com"]
credentials = [{ name = "k", source = { env = "K" }, host = "api.example.com", header = "x-k" }]
"#;
    assert_eq!(err(text).code, codes::HOST_URL);
    let ok = text.replace("https://", "");
    manifest::parse(Path::new("bottle.toml"), &ok).unwrap();
    let suffix = text.replace("https://api.", "*.");
    manifest::parse(Path::new("bottle.toml"), &suffix).unwrap();
}

#[test]
fn relative_paths_resolve_against_the_manifest_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("ctx")).unwrap();
    fs::create_dir(dir.path().join("skills")).unwrap();
    fs::write(dir.path().join("prompt.md"), "hi").unwrap();
    let text =
        "[agents.a]\nbuild.context = \"ctx\"\nprompt = \"prompt.md\"\nskills = [\"skills\"]\n";
    let path = dir.path().join("bottle.toml");
    fs::write(&path, text).unwrap();
    manifest::load(&path).unwrap();
    // The same text named relative to the working directory does not find
    // them, and the error shows the name as given.
    let e = manifest::parse(Path::new("elsewhere/bottle.toml"), text).unwrap_err();
    assert_eq!(e.code, codes::BUILD_CONTEXT);
    assert!(
        e.to_string().starts_with("elsewhere/bottle.toml:2:17: "),
        "{e}"
    );
    // Absolute paths are used as they are.
    let absolute = format!(
        "[agents.a]\nbuild.context = {:?}\n",
        dir.path().join("ctx").display()
    );
    manifest::parse(Path::new("bottle.toml"), &absolute).unwrap();
}

#[test]
fn wrong_kinds_of_paths() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("file"), "x").unwrap();
    let path = dir.path().join("bottle.toml");
    let check = |text: &str| manifest::parse(&path, text).unwrap_err();
    let e = check("[agents.a]\nbuild.context = \"file\"\n");
    assert_eq!(e.message, "build context \"file\" is not a directory");
    let e = check("[agents.a]\nimage = \"x\"\nprompt = \".\"\n");
    assert_eq!(e.message, "prompt file \".\" is not a file");
    let e = check("[agents.a]\nimage = \"x\"\nskills = [\"file\"]\n");
    assert_eq!(e.message, "skills directory \"file\" is not a directory");
}

#[test]
fn positions_survive_crlf_bom_and_wide_characters() {
    let e = err("\u{feff}[agents.a]\r\nimage = \"x\"\r\nimgae = 3\r\n");
    assert_eq!(e.position, Some((3, 1)));
    let e = err("[agents.\"Über\"]\nimage = \"é\"\ncommand = [\"ü\", \"\"]\n");
    assert_eq!(e.position, Some((3, 17)));
    assert_eq!(e.field, "agents.\"Über\".command[1]");
}

#[test]
fn the_demo_manifest_loads() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/bottle.toml");
    let m = manifest::load(&demo).unwrap();
    assert!(!m.agents.is_empty());
}

#[test]
fn memory_limits_reach_the_plan_in_bytes() {
    let m = manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\nlimits.memory = \"1.5GiB\"\n",
    )
    .unwrap();
    assert_eq!(m.agents["a"].memory_bytes(), Some(3 << 29));
    assert_eq!(
        err("[agents.a]\nimage = \"x\"\nlimits.memory = \"63m\"\n").code,
        codes::MEMORY_SMALL
    );
    manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\nlimits.memory = \"64m\"\n",
    )
    .unwrap();
}

#[test]
fn disk_limits_reach_the_plan_in_bytes() {
    let m = manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\nlimits.disk = \"10g\"\n",
    )
    .unwrap();
    assert_eq!(m.agents["a"].disk_bytes(), Some(10 << 30));
    let spec =
        bottle_core::BottleSpec::new(&m, Path::new("bottle.toml"), "a", None, Path::new("/s"))
            .unwrap();
    let plan = bottle_core::Plan::from_spec(&spec, bottle_core::BackendKind::Docker, None);
    assert_eq!(plan.disk_bytes, Some(10 << 30));
    let small = err("[agents.a]\nimage = \"x\"\nlimits.disk = \"255m\"\n");
    assert_eq!(small.code, codes::DISK_SMALL);
    assert_eq!(small.field, "agents.a.limits.disk");
    assert_eq!(
        err("[agents.a]\nimage = \"x\"\nlimits.disk = \"lots\"\n").code,
        codes::DISK_SYNTAX
    );
    manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\nlimits.disk = \"256m\"\n",
    )
    .unwrap();
}

#[test]
fn audit_log_caps_reach_the_plan_in_bytes() {
    let m = manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\nlimits.audit_log = \"8m\"\n",
    )
    .unwrap();
    assert_eq!(m.agents["a"].audit_log_bytes(), Some(8 << 20));
    let e = err("[agents.a]\nimage = \"x\"\nlimits.audit_log = \"1023k\"\n");
    assert_eq!(
        (e.code, e.field.as_str()),
        (codes::AUDIT_LOG_SMALL, "agents.a.limits.audit_log")
    );
    assert_eq!(
        err("[agents.a]\nimage = \"x\"\nlimits.audit_log = \"big\"\n").code,
        codes::AUDIT_LOG_SYNTAX
    );
    manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\nlimits.audit_log = \"1m\"\n",
    )
    .unwrap();
}

#[test]
fn bundle_owned_variables_are_refused_in_any_case() {
    for name in [
        "HTTPS_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "GIT_CONFIG_COUNT",
        "GIT_CONFIG_KEY_0",
        "GIT_CONFIG_VALUE_3",
        "GIT_GATE_URL",
        "MCP_SUPERVISE_URL",
        "BOTTLE_MCP_CONFIG",
        "BOTTLE_PROMPT_FILE",
    ] {
        let text = format!("[agents.a]\nimage = \"x\"\nenv.{name} = \"v\"\n");
        assert_eq!(err(&text).code, codes::ENV_RESERVED, "{name}");
    }
    let e = err("[agents.a]\nimage = \"x\"\nenv.Https_Proxy = \"v\"\n");
    assert_eq!(e.code, codes::ENV_RESERVED);
}

#[test]
fn every_code_is_unique_and_well_formed() {
    let mut seen = std::collections::BTreeSet::new();
    for (code, summary) in codes::ALL {
        assert!(seen.insert(*code), "{code} twice");
        assert!(code.starts_with("BOT-M") && code.len() == 8, "{code}");
        assert!(!summary.is_empty());
    }
}

#[test]
fn upstream_ca_files_resolve_next_to_the_manifest_and_reach_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("corp-ca.pem"),
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("key.pem"),
        "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let path = dir.path().join("bottle.toml");
    let load = |egress: &str| {
        fs::write(
            &path,
            format!("[agents.a]\nimage = \"x\"\negress.allow = [\"pypi.org\"]\n{egress}"),
        )
        .unwrap();
        manifest::load(&path)
    };

    let m =
        load("egress.upstream_ca = [\"corp-ca.pem\"]\negress.upstream_trust = \"web\"\n").unwrap();
    let spec = bottle_core::BottleSpec::new(&m, &path, "a", None, Path::new("/s")).unwrap();
    let plan = bottle_core::Plan::from_spec(&spec, bottle_core::BackendKind::Docker, None);
    // Made absolute at load, against the manifest's directory.
    let absolute = dir.path().canonicalize().unwrap().join("corp-ca.pem");
    assert_eq!(plan.upstream_ca, [absolute.to_string_lossy()]);
    assert!(
        plan.render().contains(&format!(
            "upstream TLS web roots + 1 extra CA ({})",
            absolute.display()
        )),
        "{}",
        plan.render()
    );

    let e = load("egress.upstream_ca = [\"key.pem\"]\n").unwrap_err();
    assert_eq!(
        (e.code, e.field.as_str()),
        (codes::UPSTREAM_CA_PEM, "agents.a.egress.upstream_ca[0]")
    );
    assert!(e.message.contains("holds no PEM certificate"), "{e}");
    let e = load("egress.upstream_ca = [\"corp-ca.pem\", \"gone.pem\"]\n").unwrap_err();
    assert_eq!(
        (e.code, e.field.as_str()),
        (codes::UPSTREAM_CA_FILE, "agents.a.egress.upstream_ca[1]")
    );
    assert!(e.message.contains("\"gone.pem\" does not exist"), "{e}");
    assert!(
        e.fix.contains("relative to the manifest's directory"),
        "{e}"
    );
    let e = load("egress.upstream_ca = [\".\"]\n").unwrap_err();
    assert!(e.message.contains("is not a file"), "{e}");
    let e = load("egress.upstream_ca = [\"~root/ca.pem\"]\n").unwrap_err();
    assert_eq!(e.code, codes::UPSTREAM_CA_FILE);
    let e = load("egress.upstream_trust = \"System\"\n").unwrap_err();
    assert_eq!(
        (e.code, e.field.as_str()),
        (codes::INVALID_VALUE, "agents.a.egress.upstream_trust")
    );
}

/// Loads `dir/sub/bottle.toml` named relative to `dir`, as `bottle
/// --manifest sub/bottle.toml` run in `dir` does.
fn load_from(dir: &Path, relative: &str) -> Result<manifest::Manifest, manifest::ManifestError> {
    // A path relative to the test's working directory, because changing the
    // process's directory would race the other tests.
    let cwd = std::env::current_dir().unwrap();
    let relative_dir = pathdiff(dir, &cwd);
    manifest::load(&relative_dir.join(relative))
}

/// `to` as a path relative to `from` (both absolute).
fn pathdiff(to: &Path, from: &Path) -> std::path::PathBuf {
    let ups = from.components().count() - 1;
    let mut path: std::path::PathBuf = std::iter::repeat_n("..", ups).collect();
    path.push(to.strip_prefix("/").unwrap());
    path
}

#[test]
fn every_host_path_is_absolute_after_load() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    for d in ["ctx", "skills", "git/app.git/objects", "git/app.git/refs"] {
        fs::create_dir_all(sub.join(d)).unwrap();
    }
    // What makes git/app.git a bare repository to the manifest's check.
    fs::write(sub.join("git/app.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(sub.join("prompt.md"), "hi").unwrap();
    let text = r#"
[agents.a]
build = { context = "ctx", dockerfile = "Dockerfile" }
prompt = "prompt.md"
skills = ["skills"]
egress.allow = ["api.example.com"]
credentials = [{ name = "k", source = { file = "keys/k" }, host = "api.example.com", header = "x-api-key" }]

[[agents.a.git]]
name = "app"
url = "git/app.git"
credential = "keys/git"

[[agents.a.git]]
name = "remote"
url = "https://example.com/r.git"
"#;
    fs::write(sub.join("bottle.toml"), text).unwrap();
    let loaded = load_from(dir.path(), "sub/bottle.toml").unwrap();
    let sub = std::fs::canonicalize(&sub).unwrap();
    let agent = &loaded.agents["a"];
    let build = agent.build.as_ref().unwrap();
    assert_eq!(Path::new(&build.context), sub.join("ctx"));
    assert_eq!(build.dockerfile.as_deref(), Some("Dockerfile"));
    assert_eq!(
        Path::new(agent.prompt.as_deref().unwrap()),
        sub.join("prompt.md")
    );
    assert_eq!(Path::new(&agent.skills[0]), sub.join("skills"));
    assert_eq!(Path::new(&agent.git[0].url), sub.join("git/app.git"));
    assert_eq!(
        Path::new(agent.git[0].credential.as_deref().unwrap()),
        sub.join("keys/git")
    );
    assert_eq!(agent.git[1].url, "https://example.com/r.git");
    assert_eq!(
        agent.credentials[0].source,
        manifest::CredentialSource::File(sub.join("keys/k").to_string_lossy().into_owned())
    );
}

#[test]
fn web_and_system_trust_reads_in_the_plan() {
    // The manifest's value is used as written; the host default
    // (BOTTLE_UPSTREAM_TRUST) is unit tested in `upstream_trust`, since
    // tests share one environment.
    let m = manifest::parse(
        Path::new("bottle.toml"),
        "[agents.a]\nimage = \"x\"\negress.upstream_trust = \"web+system\"\n",
    )
    .unwrap();
    let spec =
        bottle_core::BottleSpec::new(&m, Path::new("bottle.toml"), "a", None, Path::new("/s"))
            .unwrap();
    let plan = bottle_core::Plan::from_spec(&spec, bottle_core::BackendKind::Docker, None);
    assert!(
        plan.render()
            .contains("upstream TLS web roots + host system store\n"),
        "{}",
        plan.render()
    );
}

#[test]
fn a_missing_git_repository_names_the_file_field_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let text = "[agents.claude]\nimage = \"x\"\n\n[[agents.claude.git]]\nname = \"app\"\nurl = \"git/app.git\"\n";
    fs::write(dir.path().join("sub/bottle.toml"), text).unwrap();
    let err = load_from(dir.path(), "sub/bottle.toml").unwrap_err();
    assert_eq!(err.code, codes::GIT_PATH);
    assert!(err.file.ends_with("sub/bottle.toml"), "{err}");
    assert_eq!(err.field, "agents.claude.git[0].url");
    assert_eq!(err.position, Some((6, 7)));
    assert_eq!(err.message, "git repository \"git/app.git\" does not exist");
    let fix = err.fix().unwrap();
    assert!(
        fix.starts_with("point url at an existing working checkout or bare repository"),
        "{fix}"
    );
}

#[test]
fn a_directory_that_is_no_repository_is_refused_and_a_checkout_loads() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("work/src")).unwrap();
    let text =
        "[agents.claude]\nimage = \"x\"\n\n[[agents.claude.git]]\nname = \"app\"\nurl = \"work\"\n";
    fs::write(dir.path().join("bottle.toml"), text).unwrap();
    let err = load_from(dir.path(), "bottle.toml").unwrap_err();
    assert_eq!(err.code, codes::GIT_NOT_A_REPOSITORY);
    assert_eq!(err.field, "agents.claude.git[0].url");
    assert_eq!(
        err.message,
        "git repository \"work\" is neither a working checkout (no .git in it) nor a bare repository"
    );
    // With a .git of its own it is a working checkout, and loads.
    for d in ["work/.git/objects", "work/.git/refs"] {
        fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    fs::write(dir.path().join("work/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    load_from(dir.path(), "bottle.toml").unwrap();
}
