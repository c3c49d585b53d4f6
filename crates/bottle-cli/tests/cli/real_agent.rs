//! A real agent's day (issue 14): a Debian image made without a registry
//! (`cargo xtask agent-image`, tag in `BOTTLE_TEST_DEBIAN_IMAGE`), real
//! curl, python (urllib, pip), git and node inside bottles started through
//! the `bottle` CLI, against local upstreams behind a TLS-re-signing
//! "corporate network" on a test-made 203.0.113.0/24 address.
//!
//! Run by `cargo xtask test`, which builds the image. Run directly, it
//! skips with a printed line unless `BOTTLE_TEST_DEBIAN_IMAGE` and
//! `BOTTLE_BUNDLE_BIN` are set, and fails instead under
//! `BOTTLE_REQUIRE_DOCKER=1`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bottle_core::exec::CommandSpec;
use bottle_test_support::corp_net::{Site, Version};
use bottle_test_support::{DEBIAN_IMAGE_ENV, skip_docker_test, temp_state_root};

use crate::e2e::{Bottles, Corp, both, run, shell_quote};

const TEST: &str = "a_real_agents_day_behind_a_corporate_network";
/// The corporate proxy's address, on an interface this test makes.
const CORP_PROXY: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 71);
const FILES: &str = "files.corp.test";
const PYPI: &str = "pypi.corp.test";
const GIT: &str = "git.corp.test";
const NODE: &str = "node.corp.test";
/// Never allowed (so the manifest may not pin it either): the bundle
/// refuses it before any lookup.
const DENIED: &str = "denied.corp.test";
/// The wheel the index serves, by its path.
const WHEEL: &str = "packages/demo_pkg-1.0-py3-none-any.whl";
/// pip as an agent runs it on Debian (PEP 668: a user install needs the
/// override), failing at once instead of retrying.
const PIP: &str = "pip install --user --break-system-packages --retries 0";
const HELLO: &str = "hello from the corporate upstream\n";

/// A pure-Python wheel, `demo_pkg` 1.0, made with the host's python3.
fn make_wheel(dir: &Path) -> PathBuf {
    const SCRIPT: &str = r#"
import base64, hashlib, sys, zipfile
files = {
    "demo_pkg/__init__.py": "GREETING = 'hello from demo-pkg'\n",
    "demo_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
    "demo_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: bottle-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(text.encode())}")
record.append("demo_pkg-1.0.dist-info/RECORD,,")
files["demo_pkg-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(sys.argv[1], "w") as wheel:
    for name, text in files.items():
        wheel.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), text)
"#;
    let wheel = dir.join("demo_pkg-1.0-py3-none-any.whl");
    let out = run(CommandSpec::new("python3").args(["-c", SCRIPT]).arg(&wheel));
    assert!(out.success(), "making the wheel: {}", both(&out));
    wheel
}

/// A bare repository with one commit, ready for git's dumb HTTP.
fn make_git_repo(dir: &Path) -> PathBuf {
    let bare = dir.join("app.git");
    let work = dir.join("app");
    let git = |cwd: &Path, args: &[&str]| {
        let out = run(CommandSpec::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args.iter().copied())
            .cwd(cwd));
        assert!(out.success(), "git {args:?}: {}", both(&out));
    };
    git(dir, &["init", "-q", "--bare", "app.git"]);
    git(dir, &["init", "-q", "app"]);
    std::fs::write(work.join("README"), "the app\n").unwrap();
    git(&work, &["add", "README"]);
    git(&work, &["commit", "-qm", "first"]);
    git(&work, &["push", "-q", bare.to_str().unwrap(), "main"]);
    git(&bare, &["update-server-info"]);
    bare
}

fn site(dir: &Path) -> Site {
    let wheel = make_wheel(dir);
    let wheel_name = wheel.file_name().unwrap().to_str().unwrap().to_string();
    let repo = make_git_repo(dir);
    let index =
        format!("<html><body><a href=\"/packages/{wheel_name}\">{wheel_name}</a></body></html>\n");
    Site::new()
        .page(FILES, "/hello.txt", "text/plain", HELLO)
        .page(NODE, "/hello.txt", "text/plain", HELLO)
        .page(
            PYPI,
            "/simple/",
            "text/html",
            "<a href=\"/simple/demo-pkg/\">demo-pkg</a>\n",
        )
        .page(PYPI, "/simple/demo-pkg/", "text/html", index)
        .page(
            PYPI,
            &format!("/packages/{wheel_name}"),
            "application/octet-stream",
            std::fs::read(&wheel).unwrap(),
        )
        .page(
            DENIED,
            &format!("/{WHEEL}"),
            "application/octet-stream",
            std::fs::read(&wheel).unwrap(),
        )
        .directory(GIT, "/app.git", &repo)
        .unwrap()
}

/// node 18 ignores proxy variables: a CONNECT tunnel by hand, then https
/// (`https` mode) or an h2-only session (`h2` mode) over TLS inside it.
const NODE_CLIENT: &str = r#"
const http = require('http'), https = require('https'), tls = require('tls'), http2 = require('http2');
const [mode, target] = process.argv.slice(1);
const url = new URL(target);
const proxy = new URL(process.env.HTTPS_PROXY || process.env.https_proxy);
const fail = (e) => { console.error('node client: ' + e); process.exit(1); };
const req = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: url.hostname + ':443' });
req.on('error', fail);
req.on('connect', (res, socket) => {
  if (res.statusCode !== 200) fail('CONNECT answered ' + res.statusCode);
  if (mode === 'https') {
    https.get({ host: url.hostname, path: url.pathname, createConnection: () => tls.connect({ socket, servername: url.hostname }) }, (res) => {
      let body = ''; res.on('data', (d) => body += d); res.on('end', () => { console.log('status ' + res.statusCode + ' ' + body.trim()); process.exit(0); });
    }).on('error', fail);
  } else {
    const tlsSocket = tls.connect({ socket, servername: url.hostname, ALPNProtocols: ['h2'] });
    tlsSocket.on('error', fail);
    tlsSocket.on('secureConnect', () => {
      if (tlsSocket.alpnProtocol !== 'h2') fail('ALPN chose ' + tlsSocket.alpnProtocol);
      const session = http2.connect(url.origin, { createConnection: () => tlsSocket });
      session.on('error', fail);
      const stream = session.request({ ':path': url.pathname });
      let status = 0, body = '';
      stream.on('response', (h) => status = h[':status']);
      stream.on('data', (d) => body += d);
      stream.on('end', () => { console.log('h2 status ' + status + ' ' + body.trim()); session.close(); });
    });
  }
});
req.end();
"#;

#[test]
fn a_real_agents_day_behind_a_corporate_network() {
    let _serial = crate::one_launch_at_a_time();
    let Ok(image) = std::env::var(DEBIAN_IMAGE_ENV) else {
        skip_docker_test(
            TEST,
            format!(
                "{DEBIAN_IMAGE_ENV} is not set (run `cargo xtask agent-image` and set it to the tag it prints, or run `cargo xtask test`)"
            ),
        );
        return;
    };
    if std::env::var_os("BOTTLE_BUNDLE_BIN").is_none() {
        skip_docker_test(
            TEST,
            "BOTTLE_BUNDLE_BIN is not set (run `cargo xtask dist`)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let site = site(dir.path());
    let Some(corp) = Corp::start(TEST, "bottlecorp0", CORP_PROXY, site, dir.path()) else {
        return;
    };
    let (net, corp_ca) = (&corp.net, &corp.ca);

    // Positive controls: every upstream answers through the corporate proxy.
    corp.assert_upstreams_answer(
        &[
            format!("https://{FILES}/hello.txt"),
            format!("https://{NODE}/hello.txt"),
            format!("https://{PYPI}/simple/demo-pkg/"),
            format!("https://{PYPI}/packages/demo_pkg-1.0-py3-none-any.whl"),
            format!("https://{GIT}/app.git/info/refs"),
            format!("https://{GIT}/app.git/HEAD"),
        ],
        &format!("https://{FILES}/hello.txt"),
    );

    let hosts = [FILES, PYPI, GIT, NODE];
    let resolve: Vec<String> = hosts
        .iter()
        .map(|h| format!("\"{h}\" = \"{CORP_PROXY}\""))
        .collect();
    let allow: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    let egress = |extra: &str| {
        format!(
            "allow = [{}]\nports = [443]\nresolve = {{ {} }}\n{extra}",
            allow.join(", "),
            resolve.join(", ")
        )
    };
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        format!(
            "[agents.trusting]\nimage = \"{image}\"\ncommand = [\"/bin/bash\"]\n\n[agents.trusting.egress]\n{}\n\
             [agents.plain]\nimage = \"{image}\"\ncommand = [\"/bin/bash\"]\n\n[agents.plain.egress]\n{}",
            egress(&format!("upstream_ca = [\"{}\"]\n", corp_ca.display())),
            egress(""),
        ),
    )
    .unwrap();
    let state = temp_state_root();
    let mut bottles = Bottles {
        state: state.path().to_path_buf(),
        manifest,
        names: Vec::new(),
    };
    let mut failures = Vec::new();
    let mut check = |what: &str, ok: bool, output: &str| {
        if !ok {
            failures.push(format!("--- {what}:\n{output}"));
        }
    };

    // The bottle that trusts the corporate CA: every client works.
    let trusting = bottles.start("trusting");
    let (ok, out) = bottles.exec(&trusting, &format!("curl -sS https://{FILES}/hello.txt"));
    check("curl gets the file", ok && out == HELLO, &out);
    let (ok, out) = bottles.exec(&trusting, &format!("python3 -c 'import urllib.request; print(urllib.request.urlopen(\"https://{FILES}/hello.txt\").read().decode(), end=\"\")'"));
    check("urllib gets the file", ok && out == HELLO, &out);
    let (ok, out) = bottles.exec(&trusting, &format!("{PIP} --index-url https://{PYPI}/simple demo-pkg && python3 -c 'import demo_pkg; print(demo_pkg.GREETING)'"));
    check(
        "pip installs and imports",
        ok && out.contains("hello from demo-pkg"),
        &out,
    );
    let (ok, out) = bottles.exec(
        &trusting,
        &format!("git clone -q https://{GIT}/app.git && cat app/README"),
    );
    check("git clones", ok && out.contains("the app"), &out);
    let (ok, out) = bottles.exec(
        &trusting,
        &format!(
            "node -e {} https https://{NODE}/hello.txt",
            shell_quote(NODE_CLIENT)
        ),
    );
    check(
        "node fetches over https",
        ok && out.contains(&format!("status 200 {}", HELLO.trim())),
        &out,
    );
    let before = net.upstream_requests().len();
    let (ok, out) = bottles.exec(
        &trusting,
        &format!("curl -sS --http2 -w ' %{{http_version}}' https://{FILES}/hello.txt"),
    );
    check(
        "curl --http2 reports HTTP/2",
        ok && out.ends_with(" 2"),
        &out,
    );
    let upstream_h2 = net.upstream_requests()[before..]
        .iter()
        .any(|r| r.host == FILES && r.version == Version::HTTP_2);
    check(
        "the upstream saw HTTP/2",
        upstream_h2,
        &format!("{:?}", net.upstream_requests()),
    );
    let (ok, out) = bottles.exec(
        &trusting,
        &format!(
            "node -e {} h2 https://{NODE}/hello.txt",
            shell_quote(NODE_CLIENT)
        ),
    );
    check(
        "an h2-only client gets its response",
        ok && out.contains(&format!("h2 status 200 {}", HELLO.trim())),
        &out,
    );

    // The agent's own dev server, reached by the box's hostname and its own
    // address with the proxy variables set: NO_PROXY sends curl there
    // directly, not to the proxy's 403.
    let (ok, out) = bottles.exec(
        &trusting,
        "cd /tmp && echo own-server > own.txt && \
         (python3 -m http.server 8123 --bind 0.0.0.0 >/dev/null 2>&1 &) && \
         for i in $(seq 100); do curl -fsS --noproxy '*' http://127.0.0.1:8123/own.txt >/dev/null 2>&1 && break; sleep 0.1; done && \
         curl -sS http://$(hostname):8123/own.txt && \
         curl -sS http://$(hostname -I | cut -d' ' -f1):8123/own.txt && \
         curl -sS http://localhost:8123/own.txt",
    );
    check(
        "the agent's own server is reached by hostname, own address and localhost",
        ok && out == "own-server\nown-server\nown-server\n",
        &out,
    );

    // A denied host: the 403 text reaches curl's and pip's own output.
    // HTTP/1.1: an h2 status line has no reason phrase.
    let (_, out) = bottles.exec(
        &trusting,
        &format!("curl -sS -i --http1.1 https://{DENIED}/hello.txt"),
    );
    check(
        "curl shows the 403 text",
        out.contains(" 403 Blocked by bottle")
            && out.contains(DENIED)
            && out.contains("trusting")
            && out.contains("request_egress"),
        &out,
    );
    // pip logs an index page's failure at debug level only; fetching a
    // file, it prints the status and reason phrase.
    let (_, out) = bottles.exec(&trusting, &format!("{PIP} https://{DENIED}/{WHEEL}"));
    check(
        "pip shows the 403 reason",
        out.contains("403") && out.contains("Blocked by bottle"),
        &out,
    );

    // Without upstream_ca: a clear failure naming the unknown issuer and the fix.
    let plain = bottles.start("plain");
    let (ok, out) = bottles.exec(&plain, &format!("curl -sS https://{FILES}/hello.txt"));
    check(
        "curl's 502 names the unknown issuer and the fix",
        !out.contains(HELLO)
            && (out.contains("UnknownIssuer") || out.contains("unknown CA"))
            && out.contains("upstream_ca"),
        &format!("exit ok={ok}\n{out}"),
    );
    // From an index pip says only "No matching distribution found" (it
    // logs the page's failure at debug level); fetching a file it prints
    // the status and reason phrase, never the body: the cause is in the
    // phrase.
    let (_, out) = bottles.exec(&plain, &format!("{PIP} https://{PYPI}/{WHEEL}"));
    check(
        "pip fetching a file shows the 502 and its cause",
        out.contains("HTTP error 502 while getting") && out.contains("unknown CA"),
        &out,
    );

    assert!(
        !net.proxy_server_names().iter().any(|n| n == DENIED),
        "the denied host was contacted"
    );
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
