//! Traffic a coding agent legitimately sends, for false positives: every
//! request here should pass a secret scanner.
//!
//! Two kinds:
//!
//! - generated ([`generated_traffic`]): package managers' request heads
//!   (npm, pip, yarn, cargo, git smart HTTP, docker), digests of every
//!   common format, server-issued cookies and ETags, trace and request
//!   ids, multipart uploads, API and model calls, lockfiles with real-
//!   shaped integrity fields, and the carriers of [`super::place`] holding
//!   a placeholder instead of a secret (so a scanner that flags a field
//!   name rather than a credential shows up here);
//! - file-backed ([`workspace_files`], [`registry_sources`]): real text
//!   (this repository's files, the sources of the crates its `Cargo.lock`
//!   names, from the local cargo registry) sent as a model call would send
//!   it, bounded in files and bytes.
//!
//! Files that hold fake credentials on purpose (scanner test fixtures) are
//! still scanned but marked ([`KNOWN_FIXTURES`]), so reports count them
//! apart instead of hiding them.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256, Sha512};

use super::{
    BASE62, BASE64URL, FORMATS, HEX_UPPER, Placement, Request, Rng, b64, form_encode, json_string,
    place,
};

/// One benign request.
#[derive(Debug, Clone)]
pub struct BenignCase {
    /// Where it comes from: `generator npm-tarball #3`, or a file's path.
    pub source: String,
    /// Why it is set apart from false positives: a file known to hold fake
    /// credentials on purpose.
    pub fixture: Option<&'static str>,
    /// The request.
    pub request: Request,
}

/// A benign generator: its name and how it makes request `index`.
type Generator = (&'static str, fn(&mut Rng, usize) -> io::Result<Request>);

/// Every generator [`generated_traffic`] runs.
const GENERATORS: &[Generator] = &[
    ("npm-packument", npm_packument),
    ("npm-tarball", npm_tarball),
    ("npm-audit", npm_audit),
    ("npm-publish", npm_publish),
    ("pip-simple", pip_simple),
    ("pip-download", pip_download),
    ("yarn", yarn),
    ("cargo-sparse-index", cargo_sparse),
    ("cargo-download", cargo_download),
    ("git-info-refs", git_info_refs),
    ("git-upload-pack", git_upload_pack),
    ("go-proxy", go_proxy),
    ("docker-manifest", docker_manifest),
    ("docker-blob-upload", docker_blob_upload),
    ("digest-headers", digest_upload),
    ("cookies", cookies),
    ("etags", etags),
    ("trace-and-request-ids", tracing),
    ("multipart-upload", multipart),
    ("model-call", model_call),
    ("model-call-image", model_image),
    ("github-rest", github_rest),
    ("github-graphql", github_graphql),
    ("sentry-envelope", sentry_envelope),
    ("sri-html", sri_html),
    ("netlify-deploy", netlify_deploy),
    ("ids-json", ids_json),
    ("package-lock", |r, _| {
        let text = package_lock(r);
        Ok(file_request(r, "package-lock.json", &text))
    }),
    ("yarn-lock", |r, _| {
        let text = yarn_lock(r);
        Ok(file_request(r, "yarn.lock", &text))
    }),
    ("go-sum", |r, _| {
        let text = go_sum(r);
        Ok(file_request(r, "go.sum", &text))
    }),
    ("python-locks", |r, i| {
        let (name, text) = if i % 2 == 0 {
            ("requirements.txt", requirements(r))
        } else {
            ("poetry.lock", poetry_lock(r))
        };
        Ok(file_request(r, name, &text))
    }),
];

/// Generated benign traffic: `per_generator` requests from every generator,
/// then the carriers of every format and placement holding a placeholder.
pub fn generated_traffic(seed: u64, per_generator: usize) -> io::Result<Vec<BenignCase>> {
    let mut out = Vec::new();
    for (name, generate) in GENERATORS {
        for index in 0..per_generator {
            let mut rng = Rng::new(seed, &format!("benign/{name}/{index}"));
            out.push(BenignCase {
                source: format!("generator {name} #{index}"),
                fixture: None,
                request: generate(&mut rng, index)?,
            });
        }
    }
    for format in FORMATS {
        for placement in Placement::ALL {
            let mut rng = Rng::new(
                seed,
                &format!("control/{}/{}", format.name, placement.name()),
            );
            // What READMEs and config templates put where the secret goes.
            let placeholder = format!("${{{}}}", format.field.to_ascii_uppercase());
            out.push(BenignCase {
                source: format!(
                    "generator carrier-control {} {}",
                    format.name,
                    placement.name()
                ),
                fixture: None,
                request: place(format, &placeholder, placement, 0, &mut rng)?,
            });
        }
    }
    Ok(out)
}

const NPM_PACKAGES: &[&str] = &[
    "lodash",
    "react",
    "react-dom",
    "typescript",
    "esbuild",
    "@types/node",
    "@babel/core",
    "vite",
    "eslint",
    "prettier",
    "@typescript-eslint/parser",
    "express",
    "zod",
    "chalk",
    "commander",
    "semver",
    "debug",
    "@anthropic-ai/sdk",
    "openai",
    "undici",
    "ws",
    "yaml",
    "glob",
    "minimatch",
    "tslib",
    "@esbuild/linux-x64",
    "@rollup/rollup-linux-x64-gnu",
    "postcss",
];

const PYPI_PACKAGES: &[&str] = &[
    "numpy",
    "requests",
    "urllib3",
    "certifi",
    "charset-normalizer",
    "idna",
    "pydantic",
    "pydantic-core",
    "fastapi",
    "starlette",
    "anyio",
    "httpx",
    "typing-extensions",
    "packaging",
    "setuptools",
    "cryptography",
    "pyyaml",
    "rich",
];

const CRATES: &[&str] = &[
    "serde",
    "serde_json",
    "tokio",
    "hyper",
    "regex",
    "syn",
    "quote",
    "proc-macro2",
    "rand",
    "clap",
    "anyhow",
    "thiserror",
    "bytes",
    "libc",
    "log",
    "tracing",
    "futures-util",
    "itoa",
    "memchr",
    "once_cell",
    "h2",
    "ryu",
];

const REPOS: &[&str] = &[
    "rust-lang/cargo",
    "torvalds/linux",
    "acme/app",
    "octocat/hello-world",
    "tokio-rs/tokio",
];

const IMAGES: &[&str] = &[
    "library/alpine",
    "library/debian",
    "library/rust",
    "library/node",
    "library/python",
    "acme/app",
];

fn semver(r: &mut Rng) -> String {
    format!("{}.{}.{}", r.below(12), r.below(40), r.below(25))
}

fn npm_agent(r: &mut Rng) -> String {
    format!(
        "npm/{} node/v{} linux x64 workspaces/false{}",
        r.pick(&["9.8.1", "10.2.4", "10.5.0", "10.8.2"]),
        r.pick(&["18.19.0", "20.11.1", "22.3.0"]),
        r.pick(&["", "", " ci/github-actions"])
    )
}

/// npm's request head, shared by its packument and tarball fetches.
fn npm_head(r: &mut Rng, path: String, req_type: &str, pkg_id: String) -> Request {
    let agent = npm_agent(r);
    Request::new("GET", "registry.npmjs.org", path)
        .header("user-agent", agent)
        .header(
            "npm-command",
            *r.pick(&["install", "ci", "view", "outdated", "update"]),
        )
        .header("npm-session", r.hex(16))
        .header("pacote-version", *r.pick(&["15.2.0", "17.0.6", "18.0.6"]))
        .header("pacote-req-type", req_type)
        .header("pacote-pkg-id", pkg_id)
        .header("npm-auth-type", "web")
        .header("accept-encoding", "gzip,deflate")
        .header("connection", "keep-alive")
}

fn npm_packument(r: &mut Rng, _: usize) -> io::Result<Request> {
    let pkg = *r.pick(NPM_PACKAGES);
    Ok(npm_head(
        r,
        format!("/{}", pkg.replace('/', "%2f")),
        "packument",
        format!("registry:{pkg}"),
    )
    .header(
        "accept",
        "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8, */*",
    ))
}

fn npm_tarball(r: &mut Rng, _: usize) -> io::Result<Request> {
    let pkg = *r.pick(NPM_PACKAGES);
    let version = semver(r);
    let base = pkg.rsplit('/').next().unwrap_or(pkg);
    Ok(npm_head(
        r,
        format!("/{pkg}/-/{base}-{version}.tgz"),
        "tarball",
        format!("registry:{pkg}@{version}"),
    )
    // The integrity the lockfile pins: SRI, sha512 of the tarball.
    .header("pacote-integrity", format!("sha512-{}", b64(&r.bytes(64))))
    .header("accept", "*/*"))
}

fn npm_audit(r: &mut Rng, _: usize) -> io::Result<Request> {
    let mut body = String::from("{");
    for i in 0..r.between(5, 40) {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            body,
            r#"{sep}"{}-{i}":["{}"]"#,
            r.pick(NPM_PACKAGES),
            semver(r)
        );
    }
    body.push('}');
    let agent = npm_agent(r);
    Request::new(
        "POST",
        "registry.npmjs.org",
        "/-/npm/v1/security/advisories/bulk",
    )
    .header("user-agent", agent)
    .header("npm-command", "audit")
    .header("npm-session", r.hex(16))
    .header("accept", "*/*")
    .gzip_body("application/json", body.as_bytes())
}

/// `npm publish`: the version's manifest with its `dist` (the tarball's
/// hex SHA-1 `shasum` and SRI `integrity`) and the tarball itself, base64,
/// in `_attachments`. The registry token is the bundle's to inject.
fn npm_publish(r: &mut Rng, _: usize) -> io::Result<Request> {
    let name = package_name(r);
    let version = semver(r);
    let base = name.rsplit('/').next().unwrap_or(&name).to_string();
    let len = r.between(1024, 8192);
    let mut tarball = vec![0x1f, 0x8b, 0x08, 0x00];
    tarball.extend(r.bytes(len));
    let sha512 = Sha512::digest(&tarball);
    let body = format!(
        r#"{{"_id":"{name}","name":"{name}","description":"utilities","dist-tags":{{"latest":"{version}"}},"versions":{{"{version}":{{"name":"{name}","version":"{version}","main":"index.js","license":"MIT","_id":"{name}@{version}","_nodeVersion":"20.11.1","_npmVersion":"10.2.4","dist":{{"integrity":"sha512-{}","shasum":"{}","tarball":"https://registry.npmjs.org/{name}/-/{base}-{version}.tgz"}}}}}},"access":null,"_attachments":{{"{base}-{version}.tgz":{{"content_type":"application/octet-stream","data":"{}","length":{}}}}}}}"#,
        b64(&sha512),
        r.hex(40),
        b64(&tarball),
        tarball.len()
    );
    let agent = npm_agent(r);
    Ok(Request::new(
        "PUT",
        "registry.npmjs.org",
        format!("/{}", name.replace('/', "%2f")),
    )
    .header("user-agent", agent)
    .header("npm-command", "publish")
    .header("npm-session", r.hex(16))
    .header("npm-auth-type", "web")
    .body("application/json", body))
}

/// pip's user agent: its version, then a JSON object describing the
/// interpreter and the system (pip's `user_agent()`).
fn pip_agent(r: &mut Rng) -> String {
    let pip = *r.pick(&["23.0.1", "24.0", "24.2"]);
    let python = *r.pick(&["3.11.2", "3.12.4"]);
    format!(
        r#"pip/{pip} {{"ci":null,"cpu":"x86_64","distro":{{"id":"bookworm","libc":{{"lib":"glibc","version":"2.36"}},"name":"Debian GNU/Linux","version":"12"}},"implementation":{{"name":"CPython","version":"{python}"}},"installer":{{"name":"pip","version":"{pip}"}},"openssl_version":"OpenSSL 3.0.11 19 Sep 2023","python":"{python}","rustc_version":"1.75.0","setuptools_version":"66.1.1","system":{{"name":"Linux","release":"6.1.0-18-amd64"}}}}"#
    )
}

fn pip_simple(r: &mut Rng, _: usize) -> io::Result<Request> {
    let pkg = *r.pick(PYPI_PACKAGES);
    let agent = pip_agent(r);
    Ok(Request::new("GET", "pypi.org", format!("/simple/{pkg}/"))
        .header("user-agent", agent)
        .header(
            "accept",
            "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01",
        )
        .header("accept-encoding", "gzip, deflate")
        .header("cache-control", "max-age=0"))
}

fn pip_download(r: &mut Rng, _: usize) -> io::Result<Request> {
    let pkg = r.pick(PYPI_PACKAGES).replace('-', "_");
    let version = semver(r);
    let file = if r.below(2) == 0 {
        format!("{pkg}-{version}-py3-none-any.whl")
    } else {
        format!("{pkg}-{version}-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    };
    let path = format!("/packages/{}/{}/{}/{file}", r.hex(2), r.hex(2), r.hex(60));
    let agent = pip_agent(r);
    Ok(Request::new("GET", "files.pythonhosted.org", path)
        .header("user-agent", agent)
        .header("accept", "*/*")
        .header("accept-encoding", "identity"))
}

fn yarn(r: &mut Rng, _: usize) -> io::Result<Request> {
    let pkg = *r.pick(NPM_PACKAGES);
    let agent = format!(
        "yarn/{} npm/? node/v{} linux x64",
        r.pick(&["1.22.19", "1.22.22", "3.6.4", "4.1.1"]),
        r.pick(&["18.19.0", "20.11.1"])
    );
    Ok(Request::new(
        "GET",
        "registry.yarnpkg.com",
        format!("/{}", pkg.replace('/', "%2f")),
    )
    .header("user-agent", agent)
    .header(
        "accept",
        "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8, */*",
    )
    .header("accept-encoding", "gzip"))
}

const CARGO_AGENTS: &[&str] = &[
    "cargo/1.79.0 (ffa9cf99a 2024-06-03)",
    "cargo/1.85.0 (d73d2caf9 2024-12-31)",
    "cargo/1.88.0 (873a06493 2025-05-10)",
];

fn cargo_agent(r: &mut Rng) -> &'static str {
    CARGO_AGENTS[r.below(CARGO_AGENTS.len())]
}

fn cargo_sparse(r: &mut Rng, _: usize) -> io::Result<Request> {
    let name = *r.pick(CRATES);
    let path = match name.len() {
        1 => format!("/1/{name}"),
        2 => format!("/2/{name}"),
        3 => format!("/3/{}/{name}", &name[..1]),
        _ => format!("/{}/{}/{name}", &name[..2], &name[2..4]),
    };
    let mut req = Request::new("GET", "index.crates.io", path)
        .header("user-agent", cargo_agent(r))
        .header("accept", "text/plain")
        .header("cargo-protocol", "version=1");
    // A revalidation carries the ETag (or date) the last fetch returned.
    req = if r.below(2) == 0 {
        req.header("if-none-match", format!("\"{}\"", r.hex(32)))
    } else {
        req.header("if-modified-since", "Tue, 04 Jun 2024 10:11:12 GMT")
    };
    Ok(req)
}

fn cargo_download(r: &mut Rng, _: usize) -> io::Result<Request> {
    let name = *r.pick(CRATES);
    let version = semver(r);
    Ok(Request::new(
        "GET",
        "static.crates.io",
        format!("/crates/{name}/{name}-{version}.crate"),
    )
    .header("user-agent", cargo_agent(r))
    .header("accept", "*/*"))
}

const GIT_AGENTS: &[&str] = &["git/2.39.2", "git/2.43.0", "git/2.47.1"];

fn git_agent(r: &mut Rng) -> &'static str {
    GIT_AGENTS[r.below(GIT_AGENTS.len())]
}

fn git_info_refs(r: &mut Rng, _: usize) -> io::Result<Request> {
    let repo = *r.pick(REPOS);
    let service = *r.pick(&["git-upload-pack", "git-receive-pack"]);
    Ok(Request::new(
        "GET",
        "github.com",
        format!("/{repo}.git/info/refs?service={service}"),
    )
    .header("user-agent", git_agent(r))
    .header("accept", "*/*")
    .header("accept-encoding", "deflate, gzip, br, zstd")
    .header("accept-language", "C, *;q=0.9")
    .header("pragma", "no-cache")
    .header("git-protocol", "version=2"))
}

/// One pkt-line (`0000` framing of git's wire protocol).
fn pkt(out: &mut String, data: &str) {
    let _ = write!(out, "{:04x}{data}", data.len() + 4);
}

fn git_upload_pack(r: &mut Rng, index: usize) -> io::Result<Request> {
    let repo = *r.pick(REPOS);
    let agent = git_agent(r);
    let mut body = String::new();
    pkt(&mut body, "command=fetch");
    pkt(&mut body, &format!("agent={agent}"));
    pkt(&mut body, "object-format=sha1");
    body.push_str("0001");
    for cap in ["thin-pack", "no-progress", "include-tag", "ofs-delta"] {
        pkt(&mut body, &format!("{cap}\n"));
    }
    for _ in 0..r.between(1, 30) {
        let oid = r.hex(40);
        pkt(&mut body, &format!("want {oid}\n"));
    }
    for _ in 0..r.between(0, 60) {
        let oid = r.hex(40);
        pkt(&mut body, &format!("have {oid}\n"));
    }
    pkt(&mut body, "done\n");
    body.push_str("0000");
    let req = Request::new("POST", "github.com", format!("/{repo}.git/git-upload-pack"))
        .header("user-agent", agent)
        .header("accept", "application/x-git-upload-pack-result")
        .header("accept-language", "C, *;q=0.9")
        .header("git-protocol", "version=2");
    // git gzips a request body once it passes a size (http.c); half here.
    if index % 2 == 1 {
        req.gzip_body("application/x-git-upload-pack-request", body.as_bytes())
    } else {
        Ok(req.body("application/x-git-upload-pack-request", body))
    }
}

fn go_proxy(r: &mut Rng, _: usize) -> io::Result<Request> {
    let module = *r.pick(&[
        "github.com/!azure/azure-sdk-for-go/sdk/azcore",
        "golang.org/x/net",
        "github.com/stretchr/testify",
        "google.golang.org/grpc",
        "github.com/!burnt!sushi/toml",
    ]);
    let version = format!("v{}", semver(r));
    let (host, path) = match r.below(3) {
        0 => ("proxy.golang.org", format!("/{module}/@v/{version}.zip")),
        1 => ("proxy.golang.org", format!("/{module}/@v/{version}.mod")),
        _ => ("sum.golang.org", format!("/lookup/{module}@{version}")),
    };
    Ok(Request::new("GET", host, path)
        .header("user-agent", "Go-http-client/1.1")
        .header("accept-encoding", "gzip"))
}

fn docker_agent() -> &'static str {
    "docker/24.0.7 go/go1.21.5 git-commit/311b9ff kernel/6.1.0-18-amd64 os/linux arch/amd64 UpstreamClient(Docker-Client/24.0.7 \\(linux\\))"
}

fn docker_manifest(r: &mut Rng, _: usize) -> io::Result<Request> {
    let image = *r.pick(IMAGES);
    let digest = format!("sha256:{}", r.hex(64));
    let (method, path) = match r.below(3) {
        0 => ("GET", format!("/v2/{image}/manifests/{digest}")),
        1 => (
            "GET",
            format!(
                "/v2/{image}/manifests/{}",
                r.pick(&["latest", "bookworm-slim", "1.79", "3.12-alpine"])
            ),
        ),
        _ => ("HEAD", format!("/v2/{image}/blobs/{digest}")),
    };
    Ok(Request::new(method, "registry-1.docker.io", path)
        .header("user-agent", docker_agent())
        .header(
            "accept",
            "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        ))
}

/// A push's blob upload: the registry's `Location` carries `_state`, an
/// HMAC-signed upload state (distribution's `packUploadState`: URL-safe
/// base64 of the MAC then the JSON), which the client echoes back.
fn docker_blob_upload(r: &mut Rng, index: usize) -> io::Result<Request> {
    let image = *r.pick(IMAGES);
    let uuid = r.uuid();
    let state_json = format!(
        r#"{{"Name":"{image}","UUID":"{uuid}","Offset":{},"StartedAt":"2024-06-0{}T10:{:02}:{:02}.{}Z"}}"#,
        r.below(1 << 24),
        r.between(1, 9),
        r.below(60),
        r.below(60),
        r.number(9)
    );
    let mac = r.bytes(32);
    let mut state = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE,
        [mac.as_slice(), state_json.as_bytes()].concat(),
    );
    state = form_encode(&state);
    let len = r.between(512, 4096);
    let chunk = r.bytes(len);
    let req = if index.is_multiple_of(2) {
        Request::new(
            "PATCH",
            "registry.example.com",
            format!("/v2/{image}/blobs/uploads/{uuid}?_state={state}"),
        )
        .header("content-range", format!("0-{}", chunk.len() - 1))
        .body("application/octet-stream", chunk)
    } else {
        let digest = hex_lower(&Sha256::digest(&chunk));
        Request::new(
            "PUT",
            "registry.example.com",
            format!("/v2/{image}/blobs/uploads/{uuid}?_state={state}&digest=sha256%3A{digest}"),
        )
        .body("application/octet-stream", chunk)
    };
    Ok(req.header("user-agent", docker_agent()))
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// An upload with its digest in every format in use: RFC 3230 `Digest`,
/// RFC 9530 `Content-Digest` / `Repr-Digest` / `Want-Digest`, the hex
/// checksums artifact stores take, and `Content-MD5`.
fn digest_upload(r: &mut Rng, _: usize) -> io::Result<Request> {
    let len = r.between(1024, 8192);
    let content = r.bytes(len);
    let sha256 = Sha256::digest(&content);
    let sha512 = Sha512::digest(&content);
    let name = format!("{}-{}.tar.gz", r.pick(CRATES), semver(r));
    let mut req = Request::new(
        "PUT",
        "artifacts.example.com",
        format!("/api/artifacts/{name}"),
    )
    .header("user-agent", "curl/8.5.0")
    .header("accept", "*/*");
    req = match r.below(4) {
        0 => req.header("digest", format!("SHA-256={}", b64(&sha256))),
        1 => req.header("content-digest", format!("sha-256=:{}:", b64(&sha256))),
        2 => req
            .header("repr-digest", format!("sha-512=:{}:", b64(&sha512)))
            .header("want-digest", "sha-256=1, sha-512=0.5"),
        _ => req
            .header("x-checksum-sha1", r.hex(40))
            .header("x-checksum-sha256", hex_lower(&sha256))
            .header("content-md5", b64(&r.bytes(16))),
    };
    Ok(req.body("application/gzip", content))
}

/// Server-issued cookies, echoed back: session ids, signed sessions, bot
/// management tokens.
fn cookies(r: &mut Rng, _: usize) -> io::Result<Request> {
    let cookie = match r.below(5) {
        0 => format!(
            "_gh_sess={}; _octo=GH1.1.{}.{}; logged_in=no; preferred_color_mode=dark; tz=Europe%2FParis",
            form_encode(&b64(&r.bytes(150))),
            r.number(10),
            r.number(10)
        ),
        1 => format!(
            "connect.sid=s%3A{}.{}",
            r.string(BASE64URL, 32),
            form_encode(b64(&r.bytes(32)).trim_end_matches('='))
        ),
        2 => format!(
            "__cf_bm={}-{}-1.0.1.1-{}; _cfuvid={}-{}-0.0.1.1-604800000",
            r.string(BASE64URL, 43),
            r.number(10),
            r.string(BASE64URL, 86),
            r.string(BASE64URL, 43),
            r.number(13)
        ),
        3 => format!(
            "JSESSIONID={}; XSRF-TOKEN={}",
            r.string(HEX_UPPER, 32),
            r.uuid()
        ),
        _ => format!(
            "csrftoken={}; sessionid={}",
            r.string(BASE62, 32),
            r.string(b"abcdefghijklmnopqrstuvwxyz0123456789", 32)
        ),
    };
    let repo = *r.pick(REPOS);
    Ok(Request::new("GET", "github.com", format!("/{repo}/pulls"))
        .header(
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        )
        .header("accept", "text/html,application/xhtml+xml")
        .header("cookie", cookie))
}

/// Revalidations: entity tags the servers issued.
fn etags(r: &mut Rng, _: usize) -> io::Result<Request> {
    Ok(match r.below(4) {
        0 => Request::new(
            "GET",
            "api.github.com",
            format!("/repos/{}/commits?per_page=100", r.pick(REPOS)),
        )
        .header("accept", "application/vnd.github+json")
        .header("if-none-match", format!("W/\"{}\"", r.hex(64))),
        1 => Request::new(
            "GET",
            "cdn.jsdelivr.net",
            format!("/npm/{}@{}/dist/index.js", r.pick(NPM_PACKAGES), semver(r)),
        )
        // Express's weak ETag: length in hex, then base64 of a SHA-1.
        .header(
            "if-none-match",
            format!("W/\"{:x}-{}\"", r.below(1 << 20), &b64(&r.bytes(20))[..27]),
        ),
        2 => Request::new(
            "PUT",
            "acme.blob.core.windows.net",
            format!("/builds/{}.json", r.uuid()),
        )
        .header("if-match", format!("\"0x8DC{}\"", r.string(HEX_UPPER, 12)))
        .body("application/json", r#"{"status":"done"}"#),
        _ => Request::new(
            "GET",
            "acme-artifacts.s3.amazonaws.com",
            format!("/releases/{}.tar.gz", semver(r)),
        )
        .header(
            "if-none-match",
            format!("\"{}-{}\"", r.hex(32), r.between(2, 40)),
        ),
    }
    .header("user-agent", "curl/8.5.0"))
}

/// W3C trace context, vendors' trace headers, request and idempotency ids.
fn tracing(r: &mut Rng, _: usize) -> io::Result<Request> {
    let trace = r.hex(32);
    let span = r.hex(16);
    let mut req = Request::new("POST", "api.example.com", "/v1/jobs")
        .header("user-agent", "axios/1.6.7")
        .header("traceparent", format!("00-{trace}-{span}-01"))
        .header(
            "tracestate",
            format!("rojo={},congo=t61rcWkgMzE", r.hex(16)),
        )
        .header("x-request-id", r.uuid())
        .header("idempotency-key", r.uuid());
    req = match r.below(4) {
        0 => req.header(
            "x-amzn-trace-id",
            format!("Root=1-{}-{};Parent={span};Sampled=1", r.hex(8), r.hex(24)),
        ),
        1 => req
            .header("sentry-trace", format!("{trace}-{span}-1"))
            .header(
                "baggage",
                format!(
                    "sentry-environment=production,sentry-release=app%40{},sentry-public_key={},sentry-trace_id={trace},sentry-sample_rate=0.1",
                    semver(r),
                    r.hex(32)
                ),
            ),
        2 => req
            .header("x-b3-traceid", trace.clone())
            .header("x-b3-spanid", span)
            .header("x-b3-sampled", "1")
            .header("x-datadog-trace-id", r.number(19))
            .header("x-datadog-parent-id", r.number(19)),
        _ => req.header(
            "x-cloud-trace-context",
            format!("{trace}/{};o=1", r.number(19)),
        ),
    };
    Ok(req.body(
        "application/json",
        format!(r#"{{"job":"build","ref":"{}"}}"#, r.hex(40)),
    ))
}

/// A multipart upload with the boundary a real client draws.
fn multipart(r: &mut Rng, _: usize) -> io::Result<Request> {
    let boundary = match r.below(7) {
        0 => format!("----WebKitFormBoundary{}", r.string(BASE62, 16)),
        1 => format!("------------------------{}", r.hex(16)),
        // Python's requests/urllib3: 16 random bytes in hex.
        2 => r.hex(32),
        // Go's mime/multipart: 30 random bytes in hex.
        3 => r.hex(60),
        4 => format!("----geckoformboundary{}", r.hex(32)),
        5 => format!("--------------------------{}", r.number(24)),
        // reqwest: four u64 in hex.
        _ => format!("{}-{}-{}-{}", r.hex(16), r.hex(16), r.hex(16), r.hex(16)),
    };
    let mut csv = String::from("id,name,created_at,amount\n");
    for i in 0..r.between(5, 60) {
        let _ = writeln!(
            csv,
            "{i},{},2024-0{}-1{}T08:00:00Z,{}.{:02}",
            r.pick(&["alpha", "beta", "gamma", "delta"]),
            r.between(1, 9),
            r.below(10),
            r.below(10_000),
            r.below(100)
        );
    }
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"description\"\r\n\r\nnightly export\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"export.csv\"\r\nContent-Type: text/csv\r\n\r\n{csv}\r\n--{boundary}--\r\n"
    );
    Ok(Request::new("POST", "uploads.example.com", "/api/v1/files")
        .header("user-agent", "python-requests/2.31.0")
        .header("accept", "*/*")
        .body(&format!("multipart/form-data; boundary={boundary}"), body))
}

/// The request head a model SDK sends (Anthropic's TypeScript SDK, as
/// Claude Code uses it): no credential, the bundle injects it after the
/// scan.
fn model_head(r: &mut Rng) -> Request {
    Request::new("POST", "api.anthropic.com", "/v1/messages?beta=true")
        .header(
            "user-agent",
            format!("claude-cli/1.0.{} (external, cli)", r.between(20, 120)),
        )
        .header("accept", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
        )
        .header("x-app", "cli")
        .header("x-stainless-arch", "x64")
        .header("x-stainless-lang", "js")
        .header("x-stainless-os", "Linux")
        .header("x-stainless-package-version", "0.55.1")
        .header("x-stainless-retry-count", "0")
        .header("x-stainless-runtime", "node")
        .header("x-stainless-runtime-version", "v22.3.0")
        .header("x-stainless-timeout", "600")
}

fn tool_use_id(r: &mut Rng) -> String {
    format!("toolu_01{}", r.string(BASE62, 22))
}

/// A model call whose tool results are command output full of ids and
/// hashes.
fn model_call(r: &mut Rng, _: usize) -> io::Result<Request> {
    let mut log = String::new();
    for _ in 0..r.between(5, 40) {
        let _ = writeln!(
            log,
            "{} {}",
            r.hex(7),
            r.pick(&[
                "fix: bound the retry loop",
                "deps: bump serde to 1.0.197",
                "docs: explain the hold-back window",
                "test: cover the empty body",
                "Merge pull request #1234 from acme/feature",
            ])
        );
    }
    let id = tool_use_id(r);
    let body = format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":32000,"stream":true,"system":[{{"type":"text","text":"You are Claude Code."}}],"messages":[{{"role":"user","content":"what changed since the last release?"}},{{"role":"assistant","content":[{{"type":"tool_use","id":"{id}","name":"Bash","input":{{"command":"git log --oneline v1.2.0..HEAD"}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"{id}","content":{}}}]}}],"metadata":{{"user_id":"user_{}_account__session_{}"}}}}"#,
        json_string(&log),
        r.hex(64),
        r.uuid()
    );
    Ok(model_head(r).body("application/json", body))
}

/// A screenshot sent to a model: base64 PNG data.
fn model_image(r: &mut Rng, _: usize) -> io::Result<Request> {
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    let len = r.between(2048, 12288);
    png.extend(r.bytes(len));
    let body = format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":4096,"messages":[{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{}"}}}},{{"type":"text","text":"Why is the button misaligned?"}}]}}]}}"#,
        b64(&png)
    );
    Ok(model_head(r).body("application/json", body))
}

/// A file as a model call carries it: the result of a `Read` tool call.
pub fn file_request(r: &mut Rng, label: &str, text: &str) -> Request {
    let id = tool_use_id(r);
    let body = format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":32000,"stream":true,"messages":[{{"role":"user","content":"review {}"}},{{"role":"assistant","content":[{{"type":"tool_use","id":"{id}","name":"Read","input":{{"file_path":{}}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"{id}","content":{}}}]}}]}}"#,
        label.replace('"', ""),
        json_string(&format!("/work/{label}")),
        json_string(text)
    );
    model_head(r).body("application/json", body)
}

fn github_head(r: &mut Rng, method: &'static str, path: String) -> Request {
    Request::new(method, "api.github.com", path)
        .header("user-agent", format!("gh/{}", semver(r)))
        .header("accept", "application/vnd.github+json")
        .header("x-github-api-version", "2022-11-28")
}

fn github_rest(r: &mut Rng, _: usize) -> io::Result<Request> {
    let repo = *r.pick(REPOS);
    Ok(match r.below(3) {
        0 => {
            let body = format!(
                r#"{{"title":"Flaky test on {}","body":{},"labels":["bug","ci"]}}"#,
                r.hex(7),
                json_string(&format!(
                    "Seen on commit {} (run {}).\n\n```\nthread 'main' panicked at src/lib.rs:42:5\n```",
                    r.hex(40),
                    r.number(10)
                ))
            );
            github_head(r, "POST", format!("/repos/{repo}/issues")).body("application/json", body)
        }
        1 => {
            let body = format!(
                r#"{{"title":"deps: bump","head":"agent/bump-{}","base":"main","body":"Updates Cargo.lock.","draft":true}}"#,
                r.hex(8)
            );
            github_head(r, "POST", format!("/repos/{repo}/pulls")).body("application/json", body)
        }
        _ => {
            let path = format!("/repos/{repo}/commits/{}/status", r.hex(40));
            github_head(r, "GET", path)
        }
    })
}

fn github_graphql(r: &mut Rng, _: usize) -> io::Result<Request> {
    let repo = *r.pick(REPOS);
    let (owner, name) = repo.split_once('/').unwrap_or((repo, repo));
    let body = format!(
        r#"{{"query":"query($owner:String!,$name:String!,$after:String){{repository(owner:$owner,name:$name){{pullRequests(first:50,after:$after,states:OPEN){{nodes{{id number title headRefOid}}pageInfo{{endCursor hasNextPage}}}}}}}}","variables":{{"owner":"{owner}","name":"{name}","after":"Y3Vyc29yOnYyOpK5MjAyNC0wNi0wNFQxMDoxMTo{}"}}}}"#,
        r.string(BASE62, 6)
    );
    Ok(github_head(r, "POST", "/graphql".into()).body("application/json", body))
}

/// A Sentry envelope: its public DSN key (public by design) in the auth
/// header and the envelope header.
fn sentry_envelope(r: &mut Rng, _: usize) -> io::Result<Request> {
    let key = r.hex(32);
    let org = r.number(6);
    let project = r.number(7);
    let event = r.hex(32);
    let body = format!(
        "{{\"event_id\":\"{event}\",\"sent_at\":\"2024-06-04T10:11:12.123Z\",\"dsn\":\"https://{key}@o{org}.ingest.sentry.io/{project}\"}}\n{{\"type\":\"event\"}}\n{{\"event_id\":\"{event}\",\"level\":\"error\",\"platform\":\"node\",\"exception\":{{\"values\":[{{\"type\":\"TypeError\",\"value\":\"Cannot read properties of undefined\"}}]}},\"contexts\":{{\"trace\":{{\"trace_id\":\"{}\",\"span_id\":\"{}\"}}}}}}\n",
        r.hex(32),
        r.hex(16)
    );
    Ok(Request::new(
        "POST",
        &format!("o{org}.ingest.sentry.io"),
        format!("/api/{project}/envelope/"),
    )
    .header(
        "x-sentry-auth",
        format!(
            "Sentry sentry_version=7, sentry_client=sentry.javascript.node/7.100.0, sentry_key={key}"
        ),
    )
    .body("application/x-sentry-envelope", body))
}

/// A page with Subresource Integrity attributes, deployed.
fn sri_html(r: &mut Rng, _: usize) -> io::Result<Request> {
    let mut html = String::from("<!doctype html>\n<html><head>\n");
    for _ in 0..r.between(2, 8) {
        let (algo, len) = *r.pick(&[("sha256", 32), ("sha384", 48), ("sha512", 64)]);
        let _ = writeln!(
            html,
            "<script src=\"https://cdn.jsdelivr.net/npm/{}@{}/dist/index.min.js\" integrity=\"{algo}-{}\" crossorigin=\"anonymous\"></script>",
            r.pick(NPM_PACKAGES),
            semver(r),
            b64(&r.bytes(len))
        );
    }
    html.push_str("</head><body><div id=\"root\"></div></body></html>\n");
    Ok(Request::new(
        "PUT",
        "pages.example.com",
        "/api/sites/docs/files/index.html",
    )
    .header("user-agent", "node-fetch/1.0")
    .body("text/html; charset=utf-8", html))
}

/// Netlify's deploy API: every file by SHA-1, every function by SHA-256.
fn netlify_deploy(r: &mut Rng, _: usize) -> io::Result<Request> {
    let mut files = String::new();
    for i in 0..r.between(5, 50) {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            files,
            r#"{sep}"/assets/{}-{}.js":"{}""#,
            r.pick(&["index", "vendor", "chunk"]),
            r.string(BASE64URL, 8),
            r.hex(40)
        );
    }
    let body = format!(
        r#"{{"files":{{{files}}},"functions":{{"api":"{}"}},"async":true}}"#,
        r.hex(64)
    );
    Ok(Request::new(
        "POST",
        "api.netlify.com",
        format!("/api/v1/sites/{}/deploys", r.uuid()),
    )
    .header("user-agent", "netlify-cli/17.23.0 linux-x64 node-v20.11.1")
    .body("application/json", body))
}

/// An API call full of identifiers: UUIDs, ULIDs, ObjectIds, KSUIDs,
/// nanoids, Stripe-style object ids, snowflakes.
fn ids_json(r: &mut Rng, _: usize) -> io::Result<Request> {
    let body = format!(
        r#"{{"id":"{}","ulid":"01{}","mongo_id":"{}","ksuid":"{}","nanoid":"{}","customer":"cus_{}","invoice":"in_1{}","snowflake":"{}","commit":"{}","created_at":"2024-06-04T10:11:12Z"}}"#,
        r.uuid(),
        r.string(b"0123456789ABCDEFGHJKMNPQRSTVWXYZ", 24),
        r.hex(24),
        r.string(BASE62, 27),
        r.string(BASE64URL, 21),
        r.string(BASE62, 14),
        r.string(BASE62, 23),
        r.number(19),
        r.hex(40)
    );
    Ok(Request::new("POST", "api.example.com", "/v1/events")
        .header("user-agent", "python-httpx/0.27.0")
        .header("accept", "application/json")
        .header("x-request-id", r.uuid())
        .body("application/json", body))
}

/// A package name for generated lockfiles.
fn package_name(r: &mut Rng) -> String {
    const WORDS: &[&str] = &[
        "core", "util", "parse", "string", "array", "object", "stream", "path", "color", "http",
        "json", "yaml", "glob", "cache", "event", "proxy", "buffer", "queue", "lru", "async",
    ];
    match r.below(4) {
        0 => format!("@{}/{}", r.pick(WORDS), r.pick(WORDS)),
        1 => format!("is-{}", r.pick(WORDS)),
        _ => format!("{}-{}", r.pick(WORDS), r.pick(WORDS)),
    }
}

/// A `package-lock.json` (lockfileVersion 3) with SRI `integrity` fields.
pub fn package_lock(r: &mut Rng) -> String {
    let mut out = String::from(
        "{\n  \"name\": \"app\",\n  \"version\": \"1.0.0\",\n  \"lockfileVersion\": 3,\n  \"requires\": true,\n  \"packages\": {\n    \"\": {\n      \"name\": \"app\",\n      \"version\": \"1.0.0\"\n    }",
    );
    for _ in 0..r.between(20, 120) {
        let name = package_name(r);
        let version = semver(r);
        let base = name.rsplit('/').next().unwrap_or(&name).to_string();
        let integrity = if r.below(10) == 0 {
            format!("sha1-{}", b64(&r.bytes(20)))
        } else {
            format!("sha512-{}", b64(&r.bytes(64)))
        };
        let _ = write!(
            out,
            ",\n    \"node_modules/{name}\": {{\n      \"version\": \"{version}\",\n      \"resolved\": \"https://registry.npmjs.org/{name}/-/{base}-{version}.tgz\",\n      \"integrity\": \"{integrity}\",\n      \"dev\": true,\n      \"license\": \"MIT\"\n    }}"
        );
    }
    out.push_str("\n  }\n}\n");
    out
}

/// A classic `yarn.lock`: the tarball's SHA-1 in the URL fragment and the
/// SRI integrity.
pub fn yarn_lock(r: &mut Rng) -> String {
    let mut out = String::from(
        "# THIS IS AN AUTOGENERATED FILE. DO NOT EDIT THIS FILE DIRECTLY.\n# yarn lockfile v1\n\n",
    );
    for _ in 0..r.between(20, 120) {
        let name = package_name(r);
        let version = semver(r);
        let base = name.rsplit('/').next().unwrap_or(&name).to_string();
        let _ = write!(
            out,
            "\"{name}@^{version}\":\n  version \"{version}\"\n  resolved \"https://registry.yarnpkg.com/{name}/-/{base}-{version}.tgz#{}\"\n  integrity sha512-{}\n\n",
            r.hex(40),
            b64(&r.bytes(64))
        );
    }
    out
}

/// A `go.sum`: `h1:` hashes (base64 SHA-256 of the module tree).
pub fn go_sum(r: &mut Rng) -> String {
    let mut out = String::new();
    for _ in 0..r.between(20, 120) {
        let module = format!(
            "{}/{}/{}",
            r.pick(&[
                "github.com",
                "golang.org/x",
                "google.golang.org",
                "go.uber.org"
            ]),
            r.pick(&["acme", "grpc", "zap", "net", "sys", "text"]),
            package_name(r).replace('@', "")
        );
        let version = format!("v{}", semver(r));
        let _ = writeln!(out, "{module} {version} h1:{}", b64(&r.bytes(32)));
        let _ = writeln!(out, "{module} {version}/go.mod h1:{}", b64(&r.bytes(32)));
    }
    out
}

/// A pip `requirements.txt` with `--hash` pins.
pub fn requirements(r: &mut Rng) -> String {
    let mut out = String::from("# This file is autogenerated by pip-compile with Python 3.12\n");
    for _ in 0..r.between(5, 40) {
        let _ = writeln!(
            out,
            "{}=={} \\\n    --hash=sha256:{} \\\n    --hash=sha256:{}",
            r.pick(PYPI_PACKAGES),
            semver(r),
            r.hex(64),
            r.hex(64)
        );
    }
    out
}

/// A `poetry.lock` with its file hashes and content hash.
pub fn poetry_lock(r: &mut Rng) -> String {
    let mut out = String::new();
    for _ in 0..r.between(5, 40) {
        let name = *r.pick(PYPI_PACKAGES);
        let version = semver(r);
        let _ = write!(
            out,
            "[[package]]\nname = \"{name}\"\nversion = \"{version}\"\noptional = false\npython-versions = \">=3.8\"\nfiles = [\n    {{file = \"{}-{version}-py3-none-any.whl\", hash = \"sha256:{}\"}},\n    {{file = \"{name}-{version}.tar.gz\", hash = \"sha256:{}\"}},\n]\n\n",
            name.replace('-', "_"),
            r.hex(64),
            r.hex(64)
        );
    }
    let _ = write!(
        out,
        "[metadata]\nlock-version = \"2.0\"\npython-versions = \"^3.12\"\ncontent-hash = \"{}\"\n",
        r.hex(64)
    );
    out
}

/// Files that hold credential-shaped test data on purpose, by path suffix
/// (`*` in a registry crate's directory name stands for its version), and
/// why. They are scanned like every other file, but a report lists what is
/// found in them apart from the false positives.
pub const KNOWN_FIXTURES: &[(&str, &str)] = &[
    (
        "crates/bottle-test-support/src/secret_corpus/formats.rs",
        "this corpus's generator: the prefix of every credential format it makes",
    ),
    (
        "crates/bottle-bundle/src/scan/tests.rs",
        "the scanner's unit tests: a sample of every kind it detects",
    ),
    (
        "crates/bottle-bundle/src/scan/tokens.rs",
        "its tests wrap a sample GitHub token in base64 to be found",
    ),
    (
        "crates/bottle-bundle/tests/integration/websocket.rs",
        "the WebSocket relay's tests send a sample AWS key to be stopped and masked",
    ),
    (
        "crates/bottle-bundle/src/encoding.rs",
        "its tests hide AWS's documented example key in every coding",
    ),
    (
        "crates/bottle-bundle/src/body.rs",
        "its tests stream AWS's documented example key, split in two",
    ),
    (
        "crates/bottle-bundle/tests/integration/secrets.rs",
        "the proxy's secret-blocking tests: sample tokens in every position",
    ),
    (
        "crates/bottle-bundle/tests/integration/h2.rs",
        "an HTTP/2 test sends a sample GitHub token to be blocked",
    ),
    (
        "crates/bottle-probe/src/probes/secrets.rs",
        "the escape probe's exfiltration attempts carry a sample GitHub token",
    ),
    (
        "crates/bottle-probe/src/probes/proxy.rs",
        "the escape probe's fake AWS key and GitHub token",
    ),
    (
        "crates/bottle-probe/src/contract.rs",
        "builds the probe's fake AWS key (AKIA + 16) at run time",
    ),
    (
        "pem-*/README.md",
        "the pem crate's documentation example: a sample 512-bit RSA private key",
    ),
    (
        "pem-*/src/lib.rs",
        "the pem crate's doc examples and tests: a sample RSA private key",
    ),
    (
        "pem-*/benches/pem_benchmark.rs",
        "the pem crate's benchmark input: a sample RSA private key",
    ),
    (
        "rcgen-*/src/certificate.rs",
        "rcgen's tests sign with a sample CA private key (PKCS#8)",
    ),
];

/// Why `label` is a known fixture, if it is one.
fn fixture_reason(label: &str) -> Option<&'static str> {
    KNOWN_FIXTURES
        .iter()
        .find(|(pattern, _)| matches_fixture(label, pattern))
        .map(|(_, why)| *why)
}

/// `label` ends with `pattern`; a `*` in it matches a version (digits and
/// dots) right after a `/`-started crate name.
fn matches_fixture(label: &str, pattern: &str) -> bool {
    let Some((krate, rest)) = pattern.split_once('*') else {
        return label.ends_with(pattern);
    };
    let Some(before) = label.strip_suffix(rest) else {
        return false;
    };
    let needle = format!("/{krate}");
    before.rfind(&needle).is_some_and(|at| {
        let version = &before[at + needle.len()..];
        !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    })
}

/// How much of a file tree is read.
#[derive(Debug, Clone, Copy)]
pub struct FileBound {
    /// Files taken from one crate (registry sources) at most.
    pub files_per_crate: usize,
    /// Bytes taken from one file at most (the rest is cut off).
    pub max_file_bytes: usize,
    /// Bytes read in all at most.
    pub max_total_bytes: usize,
}

/// File-backed benign requests and what was left out.
#[derive(Debug, Default)]
pub struct FileCorpus {
    /// One request per file.
    pub cases: Vec<BenignCase>,
    /// Files or crates not read, and why.
    pub skipped: Vec<String>,
    /// Bytes of text read.
    pub bytes: usize,
}

impl FileCorpus {
    fn add(&mut self, seed: u64, label: String, text: &str) {
        let mut rng = Rng::new(seed, &format!("file/{label}"));
        self.bytes += text.len();
        self.cases.push(BenignCase {
            fixture: fixture_reason(&label),
            request: file_request(&mut rng, &label, text),
            source: label,
        });
    }

    /// Reads `path` (cut to `bound.max_file_bytes`) as `label`; false once
    /// the total bound is reached.
    fn read(&mut self, seed: u64, path: &Path, label: String, bound: &FileBound) -> bool {
        if self.bytes >= bound.max_total_bytes {
            return false;
        }
        match fs::read(path) {
            Ok(mut bytes) => {
                bytes.truncate(bound.max_file_bytes);
                // A cut may split a character: keep the valid prefix.
                let text = match std::str::from_utf8(&bytes) {
                    Ok(text) => text,
                    Err(e) if e.valid_up_to() + 4 > bytes.len() => {
                        std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default()
                    }
                    Err(_) => {
                        self.skipped.push(format!("{label}: not UTF-8 text"));
                        return true;
                    }
                };
                self.add(seed, label, text);
            }
            Err(e) => self.skipped.push(format!("{label}: {e}")),
        }
        true
    }
}

/// Extensions of the text files read.
const TEXT_EXTENSIONS: &[&str] = &[
    "rs", "toml", "md", "lock", "sh", "json", "yml", "yaml", "txt", "c", "h", "py", "js",
];

/// Every file under `dir` (depth and count bounded), sorted, hidden
/// entries and `target/` left out.
fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> io::Result<()> {
    const MAX_DEPTH: usize = 12;
    const MAX_FILES: usize = 20_000;
    if depth > MAX_DEPTH || out.len() >= MAX_FILES {
        return Ok(());
    }
    let mut entries: Vec<_> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            walk(&path, depth + 1, out)?;
        } else if TEXT_EXTENSIONS
            .iter()
            .any(|ext| path.extension().is_some_and(|e| e == *ext))
        {
            out.push(path);
        }
        if out.len() >= MAX_FILES {
            break;
        }
    }
    Ok(())
}

/// This repository's own text files (sources, manifests, docs, the
/// lockfile), each sent in a model call, in path order up to `bound`.
pub fn workspace_files(seed: u64, root: &Path, bound: &FileBound) -> FileCorpus {
    let mut corpus = FileCorpus::default();
    let mut files = Vec::new();
    if let Err(e) = walk(root, 0, &mut files) {
        corpus
            .skipped
            .push(format!("{}: not walked ({e})", root.display()));
    }
    for path in files {
        let label = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        if !corpus.read(seed, &path, label, bound) {
            corpus
                .skipped
                .push("workspace: the byte bound was reached; later files not read".into());
            break;
        }
    }
    corpus
}

/// `(name, version)` of every registry package in a `Cargo.lock`.
pub fn locked_registry_packages(lockfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (mut name, mut version) = (None, None);
    for line in lockfile.lines() {
        if line == "[[package]]" {
            (name, version) = (None, None);
        } else if let Some(v) = line.strip_prefix("name = ") {
            name = Some(v.trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("version = ") {
            version = Some(v.trim_matches('"').to_string());
        } else if line.starts_with("source = \"registry+")
            && let (Some(n), Some(v)) = (&name, &version)
        {
            out.push((n.clone(), v.clone()));
        }
    }
    out
}

/// Where cargo unpacks registry sources: `$CARGO_HOME/registry/src/*/`.
fn registry_roots() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(home) = home else {
        return Vec::new();
    };
    let mut roots: Vec<PathBuf> = fs::read_dir(home.join("registry").join("src"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    roots.sort();
    roots
}

/// The sources of every registry crate `lockfile` names, from the local
/// cargo registry: per crate its top-level files, then `src/`, then the
/// rest, up to `bound`.
pub fn registry_sources(seed: u64, lockfile: &Path, bound: &FileBound) -> FileCorpus {
    let mut corpus = FileCorpus::default();
    let lock = match fs::read_to_string(lockfile) {
        Ok(lock) => lock,
        Err(e) => {
            corpus
                .skipped
                .push(format!("{}: not read ({e})", lockfile.display()));
            return corpus;
        }
    };
    let roots = registry_roots();
    let packages = locked_registry_packages(&lock);
    // Cargo downloads only what this platform builds: the others (Windows,
    // wasm, redox crates) are named once, together.
    let mut absent = Vec::new();
    for (i, (name, version)) in packages.iter().enumerate() {
        let dir_name = format!("{name}-{version}");
        let Some(dir) = roots
            .iter()
            .map(|root| root.join(&dir_name))
            .find(|d| d.is_dir())
        else {
            absent.push(dir_name);
            continue;
        };
        let mut files = Vec::new();
        if let Err(e) = walk(&dir, 0, &mut files) {
            corpus.skipped.push(format!("{dir_name}: not walked ({e})"));
            continue;
        }
        // Top-level files, then the crate's own sources, then tests,
        // examples and benches.
        let rank = |p: &PathBuf| {
            let rel = p.strip_prefix(&dir).unwrap_or(p);
            match rel.components().count() {
                1 => 0,
                _ if rel.starts_with("src") => 1,
                _ => 2,
            }
        };
        files.sort_by_key(|p| (rank(p), p.clone()));
        for path in files.into_iter().take(bound.files_per_crate) {
            let rel = path.strip_prefix(&dir).unwrap_or(&path);
            let label = format!("~/.cargo/registry/src/{dir_name}/{}", rel.display());
            if !corpus.read(seed, &path, label, bound) {
                corpus.skipped.push(format!(
                    "registry: the byte bound was reached after {i} of {} crates",
                    packages.len()
                ));
                break;
            }
        }
        if corpus.bytes >= bound.max_total_bytes {
            break;
        }
    }
    if !absent.is_empty() {
        corpus.skipped.push(format!(
            "{} of {} locked crates are not in the local registry (not built on this platform): {}",
            absent.len(),
            packages.len(),
            absent.join(", ")
        ));
    }
    corpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_traffic_replays_and_covers_every_generator() {
        let a = generated_traffic(3, 2).unwrap();
        let b = generated_traffic(3, 2).unwrap();
        assert_eq!(a.len(), GENERATORS.len() * 2 + FORMATS.len() * 6);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.request, y.request, "{}", x.source);
        }
        let npm = a
            .iter()
            .find(|c| c.source.starts_with("generator npm-tarball"))
            .unwrap();
        let integrity = npm.request.header_value("pacote-integrity").unwrap();
        assert!(integrity.starts_with("sha512-") && integrity.len() == 7 + 88);
    }

    #[test]
    fn the_lockfile_parser_takes_registry_packages_only() {
        let lock = "[[package]]\nname = \"a\"\nversion = \"1.0.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\n\n[[package]]\nname = \"local\"\nversion = \"0.1.0\"\n";
        assert_eq!(
            locked_registry_packages(lock),
            vec![("a".to_string(), "1.0.0".to_string())]
        );
    }

    #[test]
    fn fixtures_are_found_by_suffix() {
        assert!(fixture_reason("crates/bottle-bundle/src/scan/tests.rs").is_some());
        assert!(fixture_reason("crates/bottle-bundle/src/proxy.rs").is_none());
        assert!(fixture_reason("~/.cargo/registry/src/pem-4.0.0/src/lib.rs").is_some());
        assert!(fixture_reason("~/.cargo/registry/src/pem-rfc7468-0.7.0/src/lib.rs").is_none());
        assert!(fixture_reason("~/.cargo/registry/src/rustls-pem-1.0/src/lib.rs").is_none());
    }
}
