//! The real clients of an agent's day (issue 24): inside one bottle of the
//! Debian image (`cargo xtask agent-image`, tag in
//! `BOTTLE_TEST_DEBIAN_IMAGE`), the package managers and protocol clients
//! agents run — npm (install, install from its lockfile, ci), yarn 1, pip
//! (install and download, with and without `--require-hashes`, a wheel and
//! an sdist), git over smart HTTP (clone, fetch, push), curl over h2, node's
//! `fetch` and WebSockets from node and Python — against local upstreams
//! behind a TLS-re-signing "corporate network" on a test-made
//! 203.0.113.0/24 address. Every request must be allowed with no scanner
//! finding, read back from the bottle's audit log.
//!
//! `BOTTLE_RECORD_CLIENT_CORPUS=<dir>` writes every request the clients
//! made, as the upstream received it, into `<dir>` (one file each, the
//! format of `bottle_test_support::corp_net::write_corpus`): the corpus
//! bottle-bundle's scanner replay test reads.
//!
//! The same day runs again in a gVisor bottle of the same image
//! (`isolation = "gvisor"`, issue 29), which the operator then drives the
//! way an orchestrator does: `bottle cp` in, `bottle execute` a tool call,
//! a verified `bottle reset`. Without the daemon's `runsc` that test skips
//! with a printed line (a failure under `BOTTLE_REQUIRE_GVISOR=1`).
//!
//! Run by `cargo xtask test`, which builds the image. Run directly, it
//! skips with a printed line unless `BOTTLE_TEST_DEBIAN_IMAGE` and
//! `BOTTLE_BUNDLE_BIN` are set, and fails instead under
//! `BOTTLE_REQUIRE_DOCKER=1`.

use std::net::Ipv4Addr;
use std::path::Path;

use bottle_core::exec::{CommandOutput, CommandSpec};
use bottle_test_support::corp_net::{
    CorpNet, NPM_BULK_ADVISORIES, NpmPackage, PythonFile, SDIST_PROJECT, Site, Version,
    WHEEL_PROJECT, make_bare_repo, npm_registry, python_index, write_corpus,
};
use bottle_test_support::{DEBIAN_IMAGE_ENV, skip_docker_test, temp_state_root};

use crate::e2e::{Bottles, Corp, both, run, shell_quote};

const TEST: &str = "real_clients_work_through_a_bottle_with_no_finding";
const GVISOR_TEST: &str = "real_clients_work_through_a_gvisor_bottle_with_no_finding";
/// Where the corpus of recorded requests is written, when set.
const CORPUS_ENV: &str = "BOTTLE_RECORD_CLIENT_CORPUS";
/// The corporate proxy's address, on an interface this test makes (not
/// real_agent.rs's: both may run in one process, one after the other).
const CORP_PROXY: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 72);
const INTERFACE: &str = "bottleclients0";
const NPM: &str = "npm.clients.test";
const PYPI: &str = "pypi.clients.test";
const GIT: &str = "git.clients.test";
const FILES: &str = "files.clients.test";
const WS: &str = "ws.clients.test";
const HOSTS: [&str; 5] = [NPM, PYPI, GIT, FILES, WS];
/// Allowed too, and its secrets redacted (`on_secret = "redact"`), where
/// the model API of a real session would be.
const REDACT: &str = "redact.clients.test";
/// A real-shaped AWS key id, and AWS's documented example.
const AWS: &str = "AKIAZ7Q3HN2XK5WJ4T6M";
const AWS_EXAMPLE: &str = "AKIAIOSFODNN7EXAMPLE";
const ECHO_PATH: &str = "/echo";
const HELLO: &str = "hello from the h2 upstream\n";

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

/// What `require('bottle-hello')()` returns.
const NPM_GREETING: &str = "[hello bottle]";
/// What `bottle_greeting.greet()` returns (the sdist's `shout` applied).
const PYTHON_GREETING: &str = "HELLO FROM BOTTLE-GREETING!";

struct Upstreams {
    site: Site,
    python: Vec<PythonFile>,
}

fn upstreams(dir: &Path) -> Upstreams {
    make_bare_repo(&dir.join("git"), "app", "the app\n").unwrap();
    let site = Site::new()
        .page(FILES, "/hello.txt", "text/plain", HELLO)
        .page(REDACT, "/v1/messages", "application/json", "{}\n")
        .git_smart_http(GIT, &dir.join("git"))
        .websocket_echo(WS, ECHO_PATH);
    let (site, _) = npm_registry(site, NPM, &dir.join("npm"), &npm_packages()).unwrap();
    let (site, python) = python_index(site, PYPI, &dir.join("pypi")).unwrap();
    Upstreams { site, python }
}

/// The host's git through the corporate network (its CONNECT front door),
/// trusting its CA.
fn host_git(net: &CorpNet, ca: &Path, cwd: &Path, args: &[&str]) -> CommandOutput {
    run(CommandSpec::new("git")
        .args([
            "-c",
            &format!("http.proxy=http://{}", net.connect_proxy_addr),
        ])
        .args(["-c", "user.name=t", "-c", "user.email=t@t.invalid"])
        .args(args.iter().copied())
        .cwd(cwd)
        .env("GIT_SSL_CAINFO", ca)
        .env("GIT_CONFIG_NOSYSTEM", "1"))
}

/// node's `fetch` through the proxy: node 18 ignores the proxy variables,
/// so undici's `ProxyAgent` is the dispatcher, as a node user would do.
const NODE_FETCH: &str = r#"
const { fetch, ProxyAgent } = require('undici');
const dispatcher = new ProxyAgent(process.env.HTTPS_PROXY || process.env.https_proxy);
fetch(process.argv[1], { dispatcher })
  .then(async (res) => { console.log('status ' + res.status + ' ' + (await res.text()).trim()); })
  .catch((e) => { console.error('node fetch: ' + e + ' ' + (e.cause || '')); process.exit(1); });
"#;

/// The `ws` package through a CONNECT tunnel made by hand (node 18 and
/// `ws` ignore the proxy variables): an https agent whose connection is
/// TLS over the tunnel. Sends a text and a binary message, expects both
/// back.
const NODE_WEBSOCKET: &str = r#"
const http = require('http'), https = require('https'), tls = require('tls');
const WebSocket = require('ws');
const url = new URL(process.argv[1]);
const proxy = new URL(process.env.HTTPS_PROXY || process.env.https_proxy);
const fail = (e) => { console.error('node ws: ' + e); process.exit(1); };
const connect = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: url.hostname + ':443' });
connect.on('error', fail);
connect.on('connect', (res, socket) => {
  if (res.statusCode !== 200) fail('CONNECT answered ' + res.statusCode);
  class Tunnel extends https.Agent {
    createConnection() { return tls.connect({ socket, servername: url.hostname, ALPNProtocols: ['http/1.1'] }); }
  }
  const ws = new WebSocket(url.href, { agent: new Tunnel(), perMessageDeflate: false });
  const sent = ['hello from node ws', Buffer.from([0, 1, 2, 254, 255])];
  const got = [];
  ws.on('error', fail);
  ws.on('unexpected-response', (req, res) => fail('upgrade answered ' + res.statusCode));
  ws.on('open', () => { ws.send(sent[0]); ws.send(sent[1]); });
  ws.on('message', (data, isBinary) => {
    got.push(isBinary ? 'binary:' + Buffer.from(data).toString('hex') : 'text:' + data.toString());
    if (got.length === 2) {
      const want = ['text:' + sent[0], 'binary:' + sent[1].toString('hex')];
      if (JSON.stringify(got) !== JSON.stringify(want)) fail('echoed ' + JSON.stringify(got));
      console.log('node ws echoed both');
      ws.close();
    }
  });
});
connect.end();
"#;

/// The `ws` package as above, sending one message that carries the key in
/// argv[2]: prints the close code the socket ends with.
const NODE_WEBSOCKET_SECRET: &str = r#"
const http = require('http'), https = require('https'), tls = require('tls');
const WebSocket = require('ws');
const url = new URL(process.argv[1]);
const proxy = new URL(process.env.HTTPS_PROXY || process.env.https_proxy);
const fail = (e) => { console.error('node ws: ' + e); process.exit(1); };
const connect = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: url.hostname + ':443' });
connect.on('error', fail);
connect.on('connect', (res, socket) => {
  class Tunnel extends https.Agent {
    createConnection() { return tls.connect({ socket, servername: url.hostname, ALPNProtocols: ['http/1.1'] }); }
  }
  const ws = new WebSocket(url.href, { agent: new Tunnel(), perMessageDeflate: false });
  ws.on('error', fail);
  ws.on('open', () => ws.send('key=' + process.argv[2]));
  ws.on('message', (data) => console.log('echoed ' + data.toString()));
  ws.on('close', (code) => { console.log('closed ' + code); process.exit(0); });
});
connect.end();
"#;

/// `websockets` 10.4 over a CONNECT tunnel opened by hand (it does not do
/// proxies), handed over as `sock=`.
const PYTHON_WEBSOCKETS: &str = r#"
import asyncio, os, socket, sys, urllib.parse
import websockets
url = urllib.parse.urlsplit(sys.argv[1])
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY") or os.environ["https_proxy"])
raw = socket.create_connection((proxy.hostname, proxy.port), timeout=30)
raw.sendall(f"CONNECT {url.hostname}:443 HTTP/1.1\r\nHost: {url.hostname}:443\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head and len(head) < 16384:
    chunk = raw.recv(1)
    if not chunk:
        break
    head += chunk
if b" 200" not in head.split(b"\r\n")[0]:
    sys.exit(f"CONNECT answered {head!r}")
raw.settimeout(None)
async def main():
    async with websockets.connect(sys.argv[1], sock=raw, server_hostname=url.hostname, compression=None) as ws:
        for message in ["hello from python websockets", bytes([0, 1, 2, 254, 255])]:
            await ws.send(message)
            echoed = await asyncio.wait_for(ws.recv(), 30)
            if echoed != message:
                sys.exit(f"sent {message!r}, echoed {echoed!r}")
    print("python websockets echoed both")
asyncio.run(main())
"#;

/// `websocket-client` through the proxy by its own `http_proxy_host`.
const PYTHON_WEBSOCKET_CLIENT: &str = r#"
import os, ssl, sys, urllib.parse
import websocket
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY") or os.environ["https_proxy"])
ws = websocket.create_connection(sys.argv[1], timeout=30, http_proxy_host=proxy.hostname,
    http_proxy_port=proxy.port, proxy_type="http",
    sslopt={"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": os.environ["SSL_CERT_FILE"]})
ws.send("hello from websocket-client")
text = ws.recv()
ws.send_binary(bytes([0, 1, 2, 254, 255]))
binary = ws.recv()
ws.close()
if text != "hello from websocket-client" or binary != bytes([0, 1, 2, 254, 255]):
    sys.exit(f"echoed {text!r} and {binary!r}")
print("websocket-client echoed both")
"#;

#[test]
fn real_clients_work_through_a_bottle_with_no_finding() {
    a_clients_day(TEST, "container");
}

#[test]
fn real_clients_work_through_a_gvisor_bottle_with_no_finding() {
    if let Err(why) = bottle_test_support::daemon_has_runtime("runsc") {
        if why.starts_with("cannot") {
            skip_docker_test(GVISOR_TEST, why);
        } else {
            bottle_test_support::skip_gvisor_test(GVISOR_TEST, why);
        }
        return;
    }
    a_clients_day(GVISOR_TEST, "gvisor");
}

/// The real clients' day in one bottle of tier `isolation`; a gVisor one
/// is then driven as an orchestrator drives it.
#[expect(
    clippy::print_stderr,
    reason = "the test's timings and the corpus it wrote go to the test output"
)]
fn a_clients_day(test: &str, isolation: &str) {
    let _serial = crate::one_launch_at_a_time();
    let Ok(image) = std::env::var(DEBIAN_IMAGE_ENV) else {
        skip_docker_test(
            test,
            format!(
                "{DEBIAN_IMAGE_ENV} is not set (run `cargo xtask agent-image` and set it to the tag it prints, or run `cargo xtask test`)"
            ),
        );
        return;
    };
    if std::env::var_os("BOTTLE_BUNDLE_BIN").is_none() {
        skip_docker_test(
            test,
            "BOTTLE_BUNDLE_BIN is not set (run `cargo xtask dist`)",
        );
        return;
    }
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let Upstreams { site, python } = upstreams(dir.path());
    let Some(corp) = Corp::start(test, INTERFACE, CORP_PROXY, site, dir.path()) else {
        return;
    };
    let (net, corp_ca) = (&corp.net, &corp.ca);

    // Positive controls: every upstream answers through the corporate proxy.
    corp.assert_upstreams_answer(
        &[
            format!("https://{NPM}/bottle-hello"),
            format!("https://{NPM}/@bottle-test%2fgreet"),
            format!("https://{NPM}/bottle-hello/-/bottle-hello-1.0.0.tgz"),
            format!("https://{PYPI}/simple/{WHEEL_PROJECT}/"),
            format!("https://{PYPI}/simple/{SDIST_PROJECT}/"),
            format!("https://{GIT}/app.git/info/refs?service=git-upload-pack"),
            format!("https://{FILES}/hello.txt"),
        ],
        &format!("https://{FILES}/hello.txt"),
    );
    let audit = corp.curl(
        &format!("https://{NPM}{NPM_BULK_ADVISORIES}"),
        &["--data-binary", "{}"],
    );
    assert!(audit.stdout_text().starts_with("200 "), "{}", both(&audit));
    let out = host_git(
        net,
        corp_ca,
        dir.path(),
        &[
            "clone",
            "-q",
            &format!("https://{GIT}/app.git"),
            "host-clone",
        ],
    );
    assert!(out.success(), "the host clones: {}", both(&out));
    net.websocket_echo_check(WS, ECHO_PATH)
        .expect("the WebSocket echo answers the host");
    let controls = net.recorded_requests().len();

    let resolve: Vec<String> = HOSTS
        .iter()
        .chain([&REDACT])
        .map(|h| format!("\"{h}\" = \"{CORP_PROXY}\""))
        .collect();
    let allow: Vec<String> = HOSTS
        .iter()
        .chain([&REDACT])
        .map(|h| format!("\"{h}\""))
        .collect();
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        format!(
            "[agents.clients]\nimage = \"{image}\"\ncommand = [\"/bin/bash\"]\nisolation = \"{isolation}\"\n\n[agents.clients.egress]\n\
             allow = [{}]\nports = [443]\nresolve = {{ {} }}\nupstream_ca = [\"{}\"]\n\
             on_secret = {{ \"{REDACT}\" = \"redact\" }}\n",
            allow.join(", "),
            resolve.join(", "),
            corp_ca.display()
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

    let name = bottles.start("clients");
    let launched = started.elapsed();

    // npm: install with no lockfile, again from the lockfile it wrote with
    // an empty cache (so every tarball is fetched again), then `npm ci`.
    // Plain commands, audit included: npm's own defaults.
    let npmrc = format!("registry=https://{NPM}/\nfund=false\nupdate-notifier=false\n");
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "mkdir -p ~/npm-app && cd ~/npm-app && printf %s {} > .npmrc && \
             echo '{{\"name\":\"npm-app\",\"version\":\"1.0.0\"}}' > package.json && \
             npm install bottle-hello && node -e \"console.log(require('bottle-hello')())\"",
            shell_quote(&npmrc)
        ),
    );
    check(
        "npm install with no lockfile",
        ok && out.contains(NPM_GREETING),
        &out,
    );
    let (ok, out) = bottles.exec(
        &name,
        "cd ~/npm-app && grep -q sha512- package-lock.json && rm -rf node_modules && \
         npm install --cache /tmp/npm-cache-lockfile && node -e \"console.log(require('bottle-hello')())\"",
    );
    check(
        "npm install from its lockfile",
        ok && out.contains(NPM_GREETING),
        &out,
    );
    let (ok, out) = bottles.exec(
        &name,
        "cd ~/npm-app && npm ci --cache /tmp/npm-cache-ci && node -e \"console.log(require('bottle-hello')())\"",
    );
    check("npm ci", ok && out.contains(NPM_GREETING), &out);

    // yarn 1 reads the registry from .npmrc and, with no configuration of
    // its own, the proxy from the bottle's HTTPS_PROXY.
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "mkdir -p ~/yarn-app && cd ~/yarn-app && printf %s {} > .npmrc && \
             echo '{{\"name\":\"yarn-app\",\"version\":\"1.0.0\",\"dependencies\":{{\"bottle-hello\":\"^1.0.0\"}}}}' > package.json && \
             yarnpkg install --non-interactive --no-progress --network-timeout 60000 && \
             grep -q 'integrity sha512-' yarn.lock && node -e \"console.log(require('bottle-hello')())\"",
            shell_quote(&npmrc)
        ),
    );
    check("yarn install", ok && out.contains(NPM_GREETING), &out);

    // pip, in a venv that sees Debian's setuptools and wheel, so the sdist
    // builds offline (`--no-build-isolation`: the index has no setuptools).
    let requirements: Vec<String> = python.iter().map(PythonFile::requirement).collect();
    let pip = format!(
        "--no-cache-dir --retries 0 --disable-pip-version-check --no-build-isolation --index-url https://{PYPI}/simple/"
    );
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "python3 -m venv --system-site-packages ~/venv && ~/venv/bin/pip install {pip} {WHEEL_PROJECT} && \
             ~/venv/bin/python -c 'import bottle_greeting; print(bottle_greeting.greet())'"
        ),
    );
    check(
        "pip install (a wheel and the sdist it requires)",
        ok && out.contains(PYTHON_GREETING),
        &out,
    );
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "printf '%s\\n' {} > ~/requirements.txt && python3 -m venv --system-site-packages ~/venv-hashed && \
             ~/venv-hashed/bin/pip install {pip} --require-hashes -r ~/requirements.txt && \
             ~/venv-hashed/bin/python -c 'import bottle_greeting; print(bottle_greeting.greet())'",
            requirements
                .iter()
                .map(|r| shell_quote(r))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    check(
        "pip install --require-hashes",
        ok && out.contains(PYTHON_GREETING),
        &out,
    );
    let files: Vec<&str> = python.iter().map(|p| p.filename.as_str()).collect();
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            // The shell lists, not GNU ls: gVisor 20221219 refuses its statx.
            "~/venv/bin/pip download {pip} -d ~/dl-plain {WHEEL_PROJECT} && echo ~/dl-plain/* && \
             ~/venv/bin/pip download {pip} --require-hashes -r ~/requirements.txt -d ~/dl-hashed && echo ~/dl-hashed/*"
        ),
    );
    check(
        "pip download, with and without --require-hashes",
        ok && files.iter().all(|f| out.matches(f).count() >= 2),
        &out,
    );

    // git over smart HTTP: clone, commit, push a branch, fetch it back.
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "git config --global user.name agent && git config --global user.email agent@bottle.invalid && \
             git clone -q https://{GIT}/app.git ~/app && cd ~/app && echo change > CHANGE && git add CHANGE && \
             git commit -qm change && git push -q origin HEAD:refs/heads/agent/work && \
             git fetch -q origin && git rev-parse --verify -q origin/agent/work >/dev/null && cat README"
        ),
    );
    check(
        "git clone, push and fetch over smart HTTP",
        ok && out.contains("the app"),
        &out,
    );

    // curl over h2 and node's fetch.
    let before = net.recorded_requests().len();
    let (ok, out) = bottles.exec(
        &name,
        &format!("curl -sS --http2 -w ' %{{http_version}}' https://{FILES}/hello.txt"),
    );
    check(
        "curl --http2 reports HTTP/2",
        ok && out == format!("{HELLO} 2"),
        &out,
    );
    let upstream_h2 = net.recorded_requests()[before..]
        .iter()
        .any(|r| r.host == FILES && r.version == Version::HTTP_2);
    check("the upstream saw HTTP/2", upstream_h2, "");
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "node -e {} https://{FILES}/hello.txt",
            shell_quote(NODE_FETCH)
        ),
    );
    check(
        "node fetch through undici's ProxyAgent",
        ok && out.contains(&format!("status 200 {}", HELLO.trim())),
        &out,
    );

    // WebSockets: node's ws, Python's websockets and websocket-client.
    let ws_url = format!("wss://{WS}{ECHO_PATH}");
    let (ok, out) = bottles.exec(
        &name,
        &format!("node -e {} {ws_url}", shell_quote(NODE_WEBSOCKET)),
    );
    check(
        "node ws echo",
        ok && out.contains("node ws echoed both"),
        &out,
    );
    let (ok, out) = bottles.exec(
        &name,
        &format!("python3 -c {} {ws_url}", shell_quote(PYTHON_WEBSOCKETS)),
    );
    check(
        "python websockets echo",
        ok && out.contains("python websockets echoed both"),
        &out,
    );
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "python3 -c {} {ws_url}",
            shell_quote(PYTHON_WEBSOCKET_CLIENT)
        ),
    );
    check(
        "python websocket-client echo",
        ok && out.contains("websocket-client echoed both"),
        &out,
    );

    // The audit log: every decision about these hosts is an allow.
    let lines = bottles.audit(&name);
    let ours = |line: &&serde_json::Value| {
        line["host"]
            .as_str()
            .is_some_and(|host| HOSTS.contains(&host))
    };
    let refused: Vec<String> = lines
        .iter()
        .filter(ours)
        .filter(|line| line["decision"] != "allow")
        .map(|line| {
            format!(
                "{} {} {}:{}{} status {} reason {} (x{})",
                line["decision"],
                line["method"],
                line["host"],
                line["port"],
                line["path"],
                line["status"],
                line["reason"],
                line["count"]
            )
        })
        .collect();
    let blocked_secret: Vec<&String> = refused
        .iter()
        .filter(|l| l.starts_with("\"blocked_secret\""))
        .collect();
    check(
        "the audit log has lines about the test hosts",
        lines.iter().any(|l| ours(&l)),
        &format!("{lines:#?}"),
    );
    check(
        "every audit line about the test hosts is an allow",
        refused.is_empty(),
        &format!(
            "blocked_secret lines:\n{}\nall refusals:\n{}",
            blocked_secret
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            refused.join("\n")
        ),
    );

    // Allowed, but answered with an error: what a refused check's cause
    // may be (a WebSocket upgrade the proxy forwarded as a plain GET).
    let answered_errors: Vec<String> = lines
        .iter()
        .filter(ours)
        .filter(|line| line["decision"] == "allow" && line["status"].as_u64() >= Some(400))
        .map(|line| {
            format!(
                "{} {}{} status {} reason {}",
                line["method"], line["host"], line["path"], line["status"], line["reason"]
            )
        })
        .collect();

    let clients_sent = net.recorded_requests().len();

    // Secrets, after the clean run: a model API's host that redacts gets
    // curl's body with both keys masked; a host that blocks refuses a
    // real-shaped key; a WebSocket message carrying one is closed (1008).
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "curl -sS -o /dev/null -w '%{{http_code}}' --data-binary 'history: {AWS_EXAMPLE} then {AWS} end' https://{REDACT}/v1/messages"
        ),
    );
    let redacted = net
        .recorded_requests()
        .into_iter()
        .filter(|r| r.host == REDACT)
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect::<Vec<_>>();
    let masked = format!("REDACTED{}", "*".repeat(AWS.len() - 8));
    check(
        "curl's body reaches the redacting host with both keys masked",
        ok && redacted == [format!("history: {masked} then {masked} end")],
        &format!("{out}\n{redacted:?}"),
    );
    let (_, out) = bottles.exec(
        &name,
        &format!(
            "curl -sS -o /dev/null -w '%{{http_code}}' --data-binary 'key={AWS}' https://{FILES}/upload"
        ),
    );
    check(
        "a host that blocks refuses the real key",
        out == "403",
        &out,
    );
    let (ok, out) = bottles.exec(
        &name,
        &format!(
            "node -e {} {ws_url} {AWS}",
            shell_quote(NODE_WEBSOCKET_SECRET)
        ),
    );
    check(
        "a WebSocket message carrying the key is closed with 1008",
        ok && out.contains("closed 1008") && !out.contains(AWS),
        &out,
    );
    let leaked = net
        .recorded_requests()
        .iter()
        .any(|r| String::from_utf8_lossy(&r.body).contains(AWS));
    check("no upstream received the real key", !leaked, "");

    if isolation == "gvisor" {
        orchestrated(&bottles, &name, dir.path(), &mut check);
    }

    // The corpus: what the clients in the bottle sent, as the upstream got
    // it (from the container tier's run).
    if let Some(corpus) = std::env::var_os(CORPUS_ENV).filter(|_| isolation == "container") {
        let recorded = net.recorded_requests();
        let written = write_corpus(Path::new(&corpus), &recorded[controls..clients_sent]).unwrap();
        eprintln!(
            "{test}: wrote {} requests ({} recorded) to {}",
            written.len(),
            clients_sent - controls,
            Path::new(&corpus).display()
        );
    }
    eprintln!(
        "{test}: launched in {:.1}s, done in {:.1}s",
        launched.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}\n--- allowed requests about the test hosts answered with an error:\n{}",
        failures.len(),
        failures.join("\n"),
        answered_errors.join("\n")
    );
}

/// What an orchestrator does with a bottle through the CLI: `bottle cp` a
/// file in, run a tool call through `bottle execute`, and return the box
/// to its golden snapshot with a verified `bottle reset`, after which the
/// bundle still serves it.
fn orchestrated(
    bottles: &Bottles,
    name: &str,
    dir: &Path,
    check: &mut dyn FnMut(&str, bool, &str),
) {
    let file = dir.join("handed-in.txt");
    std::fs::write(&file, "handed in by the operator\n").unwrap();
    let (code, out) = bottles.cli(&["cp", file.to_str().unwrap(), &format!("{name}:/tmp")]);
    check("bottle cp copies in", code == Some(0), &out);
    let (ok, out) = bottles.exec(name, "cat /tmp/handed-in.txt");
    check(
        "the box sees the copied file",
        ok && out == "handed in by the operator\n",
        &out,
    );
    if std::env::var_os("BOTTLE_TOOLBOX_BIN").is_some() {
        let (code, out) = bottles.cli(&[
            "execute",
            name,
            "--",
            "sh",
            "-c",
            "echo tool > ~/from-a-tool && cat ~/from-a-tool",
        ]);
        check(
            "bottle execute runs a tool call",
            code == Some(0) && out == "tool\n",
            &out,
        );
    }
    let (code, out) = bottles.cli(&["reset", name]);
    check(
        "bottle reset verifies from three sources",
        code == Some(0) && out.contains("reset verified"),
        &out,
    );
    let (_, out) = bottles.exec(
        name,
        "for f in ~/from-a-tool ~/npm-app ~/venv ~/app /tmp/handed-in.txt; do [ -e $f ] && echo left $f; done; echo checked",
    );
    check("the reset reverted the box", out == "checked\n", &out);
    let (ok, out) = bottles.exec(
        name,
        &format!("curl -sS -o /dev/null -w '%{{http_code}}' https://{FILES}/hello.txt"),
    );
    check(
        "after the reset the bundle still serves the box",
        ok && out == "200",
        &out,
    );
}
