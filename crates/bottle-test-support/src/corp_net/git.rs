//! Git's smart HTTP for the upstream: a bare repository the test makes, and
//! each request run through `git http-backend` as a CGI, so clone, fetch and
//! push speak the real protocol (v2 when the client asks for it).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Response, StatusCode};

/// How long one `git http-backend` request may take.
const CGI_TIME_LIMIT: Duration = Duration::from_secs(60);
/// How long one git command making the fixture may take.
const GIT_TIME_LIMIT: Duration = Duration::from_secs(60);

fn git(cwd: &Path, args: &[&str]) -> io::Result<CommandOutput> {
    let out = SystemRunner.run(
        &CommandSpec::new("git")
            .args([
                "-c",
                "user.name=bottle test",
                "-c",
                "user.email=test@bottle.invalid",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args.iter().copied())
            .cwd(cwd)
            .timeout(GIT_TIME_LIMIT),
    )?;
    if !out.success() {
        return Err(io::Error::other(format!(
            "git {}: {}{}",
            args.join(" "),
            out.stdout_text(),
            out.stderr_text()
        )));
    }
    Ok(out)
}

/// Makes `{project_root}/{name}.git`, a bare repository with one commit on
/// `main` (a README saying `readme`) that takes pushes over HTTP, and
/// returns its path.
pub fn make_bare_repo(project_root: &Path, name: &str, readme: &str) -> io::Result<PathBuf> {
    std::fs::create_dir_all(project_root)?;
    let bare_name = format!("{name}.git");
    let bare = project_root.join(&bare_name);
    let work = tempfile::tempdir()?;
    git(project_root, &["init", "-q", "--bare", &bare_name])?;
    git(&bare, &["config", "http.receivepack", "true"])?;
    git(work.path(), &["init", "-q", "."])?;
    std::fs::write(work.path().join("README"), readme)?;
    git(work.path(), &["add", "README"])?;
    git(work.path(), &["commit", "-qm", "first"])?;
    let bare_arg = bare.to_string_lossy().into_owned();
    git(work.path(), &["push", "-q", &bare_arg, "main"])?;
    Ok(bare)
}

/// Runs one request through `git http-backend` over the repositories under
/// `project_root` and turns its CGI answer into a response.
pub(super) fn http_backend(
    project_root: &Path,
    parts: &Parts,
    body: &Bytes,
) -> Response<Full<Bytes>> {
    match run_cgi(project_root, parts, body) {
        Ok(response) => response,
        Err(e) => {
            let mut response = Response::new(Full::new(Bytes::from(format!(
                "git http-backend failed: {e}\n"
            ))));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

fn run_cgi(project_root: &Path, parts: &Parts, body: &Bytes) -> io::Result<Response<Full<Bytes>>> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    // The CGI variables http-backend reads (see git-http-backend(1)).
    let spec = CommandSpec::new("git")
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", project_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("HTTP_GIT_PROTOCOL", header("git-protocol"))
        .stdin(body.to_vec())
        .timeout(CGI_TIME_LIMIT);
    let out = SystemRunner.run(&spec)?;
    if !out.success() && out.stdout.is_empty() {
        return Err(io::Error::other(out.stderr_text()));
    }
    parse_cgi(&out.stdout)
}

/// A CGI answer: header lines, a blank line, the body; `Status:` sets the
/// status (200 without it).
fn parse_cgi(output: &[u8]) -> io::Result<Response<Full<Bytes>>> {
    let (head, body) = split_head(output)
        .ok_or_else(|| io::Error::other("git http-backend wrote no header block"))?;
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body)));
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split(' ').next().unwrap_or("500");
            *response.status_mut() = code
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    Ok(response)
}

/// The header block and the body: split at the first blank line, whether
/// its lines end in CRLF (http-backend's) or LF.
fn split_head(output: &[u8]) -> Option<(&[u8], &[u8])> {
    [&b"\r\n\r\n"[..], &b"\n\n"[..]]
        .into_iter()
        .filter_map(|separator| {
            let at = output
                .windows(separator.len())
                .position(|w| w == separator)?;
            Some((at, separator.len()))
        })
        .min()
        .map(|(at, len)| (&output[..at], &output[at + len..]))
}
