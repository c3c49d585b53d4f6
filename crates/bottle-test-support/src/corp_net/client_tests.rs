//! The upstreams proven with the host's real clients (curl, git, npm, pip),
//! through the host's CONNECT proxy and the re-signing proxy, before any
//! bottle uses them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};

use super::*;

const NPM: &str = "npm.corp.test";
const PYPI: &str = "pypi.corp.test";
const GIT: &str = "git.corp.test";
const WS: &str = "ws.corp.test";
const ECHO_PATH: &str = "/echo";
/// How long one client command may take.
const CLIENT_TIME_LIMIT: Duration = Duration::from_secs(120);

struct Fixture {
    net: CorpNet,
    dir: tempfile::TempDir,
    ca: PathBuf,
    proxy: String,
    python: Vec<PythonFile>,
}

fn npm_packages() -> Vec<NpmPackage> {
    vec![
        NpmPackage::new(
            "bottle-pad",
            "1.0.0",
            "module.exports = (s) => '[' + s + ']';\n",
        ),
        NpmPackage::new(
            "@bottle-test/greet",
            "1.0.0",
            "const pad = require('bottle-pad');\nmodule.exports = (who) => pad('hello ' + who);\n",
        )
        .depends_on("bottle-pad", "^1.0.0"),
        NpmPackage::new(
            "bottle-hello",
            "1.0.0",
            "module.exports = () => require('@bottle-test/greet')('bottle');\n",
        )
        .depends_on("@bottle-test/greet", "^1.0.0"),
    ]
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::new()
        .page(GIT, "/hello.txt", "text/plain", "hello\n")
        .git_smart_http(GIT, &dir.path().join("git"))
        .websocket_echo(WS, ECHO_PATH);
    make_bare_repo(&dir.path().join("git"), "app", "the app\n").unwrap();
    let (site, _) = npm_registry(site, NPM, &dir.path().join("npm"), &npm_packages()).unwrap();
    let (site, python) = python_index(site, PYPI, &dir.path().join("pypi")).unwrap();
    let net = CorpNet::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), site).unwrap();
    let ca = dir.path().join("corp-ca.pem");
    std::fs::write(&ca, net.corp_ca.cert_pem()).unwrap();
    let proxy = format!("http://{}", net.connect_proxy_addr);
    Fixture {
        net,
        dir,
        ca,
        proxy,
        python,
    }
}

fn run(spec: CommandSpec) -> CommandOutput {
    SystemRunner
        .run(&spec.timeout(CLIENT_TIME_LIMIT))
        .expect("the client starts")
}

fn both(out: &CommandOutput) -> String {
    format!("{}{}", out.stdout_text(), out.stderr_text())
}

/// The host's git through the proxy, trusting the corporate CA, with no
/// user configuration.
fn git(f: &Fixture, cwd: &Path, args: &[&str]) -> CommandOutput {
    run(CommandSpec::new("git")
        .args(["-c", &format!("http.proxy={}", f.proxy)])
        .args(["-c", &format!("http.sslCAInfo={}", f.ca.display())])
        .args(["-c", "user.name=t", "-c", "user.email=t@t.invalid"])
        .args(args.iter().copied())
        .cwd(cwd)
        // A CA bundle in the environment wins over `http.sslCAInfo`.
        .env("GIT_SSL_CAINFO", &f.ca)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", f.dir.path()))
}

#[test]
fn git_clones_fetches_and_pushes_over_smart_http() {
    let f = fixture();
    let work = f.dir.path();
    let url = format!("https://{GIT}/app.git");
    let out = git(&f, work, &["clone", "-q", &url, "clone"]);
    assert!(out.success(), "clone: {}", both(&out));
    let clone = work.join("clone");
    assert_eq!(
        std::fs::read_to_string(clone.join("README")).unwrap(),
        "the app\n"
    );
    std::fs::write(clone.join("NEW"), "pushed\n").unwrap();
    for args in [
        &["add", "NEW"][..],
        &["commit", "-qm", "second"],
        &["push", "-q", "origin", "HEAD:refs/heads/agent/work"],
        &["fetch", "-q", "origin"],
    ] {
        let out = git(&f, &clone, args);
        assert!(out.success(), "git {args:?}: {}", both(&out));
    }
    let out = git(&f, &clone, &["rev-parse", "origin/agent/work"]);
    assert!(out.success(), "the pushed branch came back: {}", both(&out));

    let recorded = f.net.recorded_requests();
    let targets: Vec<String> = recorded
        .iter()
        .map(|r| format!("{} {} {}", r.method, r.target, r.status.as_u16()))
        .collect();
    for smart in [
        "GET /app.git/info/refs?service=git-upload-pack 200",
        "POST /app.git/git-upload-pack 200",
        "GET /app.git/info/refs?service=git-receive-pack 200",
        "POST /app.git/git-receive-pack 200",
    ] {
        assert!(
            targets.iter().any(|t| t == smart),
            "{smart} in {targets:#?}"
        );
    }
    let push = recorded
        .iter()
        .find(|r| r.path() == "/app.git/git-receive-pack")
        .unwrap();
    assert!(
        push.body.windows(4).any(|w| w == b"PACK"),
        "the push's body is recorded whole"
    );
}

#[test]
fn npm_installs_a_scoped_dependency_tree_and_audits_it() {
    let f = fixture();
    let project = f.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("package.json"),
        "{\"name\":\"p\",\"version\":\"1.0.0\"}",
    )
    .unwrap();
    let npm = |args: &[&str]| {
        run(CommandSpec::new("npm")
            .args(args.iter().copied())
            .args(["--registry", &format!("https://{NPM}/")])
            .args(["--https-proxy", &f.proxy, "--cafile"])
            .arg(&f.ca)
            .cwd(&project)
            .env("npm_config_cache", f.dir.path().join("npm-cache"))
            .env("npm_config_userconfig", f.dir.path().join("npmrc"))
            .env("npm_config_update_notifier", "false")
            .env("npm_config_fund", "false"))
    };
    let out = npm(&["install", "bottle-hello"]);
    assert!(out.success(), "npm install: {}", both(&out));
    let out = run(CommandSpec::new("node")
        .args(["-e", "console.log(require('bottle-hello')())"])
        .cwd(&project));
    assert_eq!(out.stdout_text(), "[hello bottle]\n", "{}", both(&out));
    let lock = std::fs::read_to_string(project.join("package-lock.json")).unwrap();
    assert!(
        lock.contains("sha512-"),
        "the lockfile has integrity: {lock}"
    );

    let recorded = f.net.recorded_requests();
    let paths: Vec<&str> = recorded.iter().map(RecordedRequest::path).collect();
    for path in [
        "/bottle-hello",
        "/@bottle-test%2fgreet",
        "/bottle-pad",
        "/bottle-hello/-/bottle-hello-1.0.0.tgz",
        "/@bottle-test/greet/-/greet-1.0.0.tgz",
        NPM_BULK_ADVISORIES,
    ] {
        assert!(paths.contains(&path), "{path} in {paths:#?}");
    }
    assert!(recorded.iter().all(|r| r.status == 200), "{recorded:#?}");
}

/// The host's pip installs the wheel and downloads it with
/// `--require-hashes`. The sdist is fetched and its hash checked only: the
/// host's setuptools may lack `wheel`, without which no sdist's metadata
/// builds; the bottle's image has it, and the end-to-end test builds it.
#[test]
fn pip_installs_and_downloads_a_wheel_with_hashes_and_the_sdist_is_served() {
    let f = fixture();
    let pip = |args: &[&str]| {
        run(CommandSpec::new("python3")
            .args(["-m", "pip", "--disable-pip-version-check", "--no-cache-dir"])
            .args(args.iter().copied())
            .args(["--index-url", &format!("https://{PYPI}/simple/")])
            .args(["--proxy", &f.proxy, "--cert"])
            .arg(&f.ca)
            // requests prefers a CA bundle in the environment to `--cert`.
            .env("REQUESTS_CA_BUNDLE", &f.ca)
            .env("PIP_CERT", &f.ca)
            .env("PIP_CONFIG_FILE", "/dev/null"))
    };
    let target = f.dir.path().join("target");
    let target_arg = target.to_string_lossy().into_owned();
    let out = pip(&[
        "install",
        "--no-deps",
        "--target",
        &target_arg,
        WHEEL_PROJECT,
    ]);
    assert!(out.success(), "pip install: {}", both(&out));
    assert!(target.join("bottle_greeting/__init__.py").is_file());

    let wheel = f
        .python
        .iter()
        .find(|p| p.project == WHEEL_PROJECT)
        .unwrap();
    let requirements = f.dir.path().join("requirements.txt");
    std::fs::write(&requirements, wheel.requirement() + "\n").unwrap();
    let downloads = f.dir.path().join("downloads");
    let downloads_arg = downloads.to_string_lossy().into_owned();
    let requirements_arg = requirements.to_string_lossy().into_owned();
    let out = pip(&[
        "download",
        "--no-deps",
        "--require-hashes",
        "-d",
        &downloads_arg,
        "-r",
        &requirements_arg,
    ]);
    assert!(out.success(), "pip download: {}", both(&out));
    assert!(downloads.join(&wheel.filename).is_file());

    let sdist = f
        .python
        .iter()
        .find(|p| p.project == SDIST_PROJECT)
        .unwrap();
    let index = run(CommandSpec::new("curl")
        .args(["-sS", "--proxy", &f.proxy, "--cacert"])
        .arg(&f.ca)
        .arg(format!("https://{PYPI}/simple/{SDIST_PROJECT}/")));
    let link = format!("/packages/{}#sha256={}", sdist.filename, sdist.sha256);
    assert!(index.stdout_text().contains(&link), "{}", both(&index));
    let fetched = f.dir.path().join(&sdist.filename);
    let out = run(CommandSpec::new("curl")
        .args(["-sS", "--fail", "--proxy", &f.proxy, "--cacert"])
        .arg(&f.ca)
        .arg("-o")
        .arg(&fetched)
        .arg(format!("https://{PYPI}/packages/{}", sdist.filename)));
    assert!(out.success(), "{}", both(&out));
    let sum = run(CommandSpec::new("sha256sum").arg(&fetched));
    assert!(
        sum.stdout_text().starts_with(&sdist.sha256),
        "{}",
        both(&sum)
    );
}

#[test]
fn a_websocket_echoes_text_and_binary() {
    let f = fixture();
    f.net.websocket_echo_check(WS, ECHO_PATH).unwrap();
    let upgrade = f
        .net
        .recorded_requests()
        .into_iter()
        .find(|r| r.host == WS)
        .unwrap();
    assert_eq!(upgrade.status, 101);
    assert_eq!(upgrade.header("upgrade").as_deref(), Some("websocket"));
    assert_eq!(upgrade.header("sec-websocket-extensions"), None);
}

#[test]
fn every_request_is_recorded_whole_and_the_corpus_drops_repeats() {
    let f = fixture();
    let curl = || {
        run(CommandSpec::new("curl")
            .args(["-sS", "--max-time", "20", "--proxy", &f.proxy, "--cacert"])
            .arg(&f.ca)
            .args(["-H", "x-raw: a\tb  c", "--data-binary", "body\x01bytes"])
            .arg(format!("https://{GIT}/hello.txt?q=1")))
    };
    for _ in 0..2 {
        let out = curl();
        assert_eq!(out.stdout_text(), "hello\n", "{}", both(&out));
    }
    let recorded = f.net.recorded_requests();
    let first = &recorded[0];
    assert_eq!(first.method, Method::POST);
    assert_eq!(first.target, "/hello.txt?q=1");
    assert_eq!(first.header("x-raw").as_deref(), Some("a\tb  c"));
    assert_eq!(&first.body[..], b"body\x01bytes");

    let dir = f.dir.path().join("corpus");
    let files = write_corpus(&dir, &recorded).unwrap();
    assert_eq!(files.len(), 1, "the repeat is dropped: {files:?}");
    let written = std::fs::read(&files[0]).unwrap();
    assert!(written.starts_with(b"POST /hello.txt?q=1 HTTP/"));
    assert!(written.ends_with(b"\r\n\r\nbody\x01bytes"));
}
