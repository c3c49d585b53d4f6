//! The Docker daemon checks over the daemon's unix socket: `GET /version`
//! (is it there, and new enough) and `GET /info` (can its storage cap an
//! agent's writable layer, `limits.disk`).
//!
//! This speaks a few lines of HTTP/1.1 itself rather than shelling out to
//! `docker` (which may be absent while the daemon runs) or pulling in an
//! async client for one request: a request with `Connection: close`, then
//! the whole response, bounded in size and time.

use std::io::{self, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::disk::LayerCap;
use bottle_core::requirements::{DOCKER_MIN_API, DockerApiVersion};
use serde::Deserialize;

use crate::check::{Check, Status};
use crate::error::PreflightError;
use crate::host::{Context, Platform, exists};

/// Stable id of the Docker check.
pub const ID: &str = "docker.daemon";
pub(crate) const TITLE: &str = "docker daemon";

/// Stable id of the storage check.
pub const DISK_QUOTA_ID: &str = "docker.disk_quota";
pub(crate) const DISK_QUOTA_TITLE: &str = "docker disk quota";

/// Where the daemon listens unless `DOCKER_HOST` says otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// The request sent to the daemon, in full.
pub const VERSION_REQUEST: &[u8] = b"GET /version HTTP/1.1\r\nHost: docker\r\nUser-Agent: bottle-preflight\r\nAccept: application/json\r\nConnection: close\r\n\r\n";

/// The storage check's request, in full.
pub const INFO_REQUEST: &[u8] = b"GET /info HTTP/1.1\r\nHost: docker\r\nUser-Agent: bottle-preflight\r\nAccept: application/json\r\nConnection: close\r\n\r\n";

/// A `/version` or `/info` answer is well under this; more means something
/// else is listening on the socket.
const RESPONSE_LIMIT: u64 = 1 << 20;

/// Where `DOCKER_HOST` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket, as a host path.
    Unix(PathBuf),
    /// Anything else (`tcp://`, `ssh://`): not probed.
    Other(String),
}

/// Resolves a `DOCKER_HOST` value; unset or empty means [`DEFAULT_SOCKET`].
pub fn endpoint(docker_host: Option<&str>) -> Endpoint {
    match docker_host.map(str::trim) {
        None | Some("") => Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET)),
        Some(value) => match value.strip_prefix("unix://") {
            Some(path) => Endpoint::Unix(PathBuf::from(path)),
            None => Endpoint::Other(value.to_owned()),
        },
    }
}

/// The fields of `GET /version` this check reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct VersionInfo {
    #[serde(rename = "Version")]
    version: String,
    #[serde(rename = "ApiVersion")]
    api_version: String,
}

/// The fields of `GET /info` the storage check reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
struct StorageInfo {
    #[serde(rename = "Driver", default)]
    driver: String,
    #[serde(rename = "DriverStatus", default)]
    driver_status: Option<Vec<Vec<String>>>,
    #[serde(rename = "DockerRootDir", default)]
    root_dir: String,
}

/// Why the daemon could not be asked.
#[derive(Debug)]
enum ProbeError {
    Missing,
    Refused,
    Denied,
    Timeout,
    Io(io::Error),
    Status(u16, String),
    Malformed(String),
    Json(serde_json::Error),
}

fn probe<T: serde::de::DeserializeOwned>(
    socket: &Path,
    timeout: Duration,
    request: &[u8],
) -> Result<T, ProbeError> {
    let classify = |err: io::Error| match err.kind() {
        io::ErrorKind::NotFound => ProbeError::Missing,
        io::ErrorKind::ConnectionRefused => ProbeError::Refused,
        io::ErrorKind::PermissionDenied => ProbeError::Denied,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ProbeError::Timeout,
        _ => ProbeError::Io(err),
    };
    let mut stream = UnixStream::connect(socket).map_err(classify)?;
    stream.set_read_timeout(Some(timeout)).map_err(classify)?;
    stream.set_write_timeout(Some(timeout)).map_err(classify)?;
    stream.write_all(request).map_err(classify)?;
    let mut raw = Vec::new();
    (&mut stream)
        .take(RESPONSE_LIMIT + 1)
        .read_to_end(&mut raw)
        .map_err(classify)?;
    if raw.len() as u64 > RESPONSE_LIMIT {
        return Err(ProbeError::Malformed(format!(
            "response larger than {RESPONSE_LIMIT} bytes"
        )));
    }
    let (status, body) = parse_response(&raw).map_err(ProbeError::Malformed)?;
    if status != 200 {
        return Err(ProbeError::Status(status, snippet(&body)));
    }
    serde_json::from_slice(&body).map_err(ProbeError::Json)
}

/// `GET` `request`'s JSON answer from the daemon at `socket`, or why it
/// could not be had, in one line.
pub(crate) fn probe_json<T: serde::de::DeserializeOwned>(
    socket: &Path,
    timeout: Duration,
    request: &[u8],
) -> Result<T, String> {
    probe(socket, timeout, request).map_err(|err| err.summary())
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Splits an HTTP/1.1 response into status code and (de-chunked) body.
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        if raw.is_empty() {
            return Err("the daemon closed the connection without answering".to_owned());
        }
        return Err("no end of headers in the response".to_owned());
    };
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let status = match (parts.next(), parts.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/1.") => code
            .parse::<u16>()
            .map_err(|_| format!("bad status line {status_line:?}"))?,
        _ => return Err(format!("not an HTTP response: {status_line:?}")),
    };
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad content-length {value:?}"))?,
            );
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else if let Some(length) = length {
        body.get(..length)
            .ok_or_else(|| format!("body shorter than its content-length {length}"))?
            .to_vec()
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size line")?;
        let size_line = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("truncated chunk")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or("truncated chunk")?;
    }
}

/// Checks that the Docker daemon answers on its unix socket and speaks API
/// [`DOCKER_MIN_API`] or newer.
pub fn check_docker(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    let socket = match endpoint(ctx.docker_host.as_deref()) {
        Endpoint::Other(value) => {
            return Ok(Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("DOCKER_HOST={value} is not a unix socket, so it was not probed"),
            )
            .with_remediation(
                "point DOCKER_HOST at the daemon's unix socket (unix:///var/run/docker.sock) to have it checked",
            ));
        }
        Endpoint::Unix(path) => ctx.root.join(path),
    };
    let at = socket.display();
    let unreachable = |reason: String| -> Result<Check, PreflightError> {
        Ok(Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("docker daemon not reachable: {reason}"),
        )
        .with_remediation(start_remediation(ctx)?))
    };
    let check = match probe::<VersionInfo>(&socket, ctx.docker_timeout, VERSION_REQUEST) {
        Ok(info) => match DockerApiVersion::parse(&info.api_version) {
            Some(api) if api >= DOCKER_MIN_API => Check::new(
                ID,
                TITLE,
                Status::Ok,
                format!(
                    "docker {} (api {}) at {at}",
                    info.version, info.api_version
                ),
            ),
            parsed => {
                let why = if parsed.is_some() {
                    format!("older than {DOCKER_MIN_API}")
                } else {
                    "not a version bottle understands".to_owned()
                };
                Check::new(
                    ID,
                    TITLE,
                    Status::Warn,
                    format!(
                        "docker {} at {at} speaks api {}, {why}",
                        info.version, info.api_version
                    ),
                )
                .with_remediation(format!(
                    "upgrade Docker Engine to 20.10 (api {DOCKER_MIN_API}) or newer"
                ))
            }
        },
        Err(ProbeError::Missing) => unreachable(format!("no socket at {at}"))?,
        Err(ProbeError::Refused) => unreachable(format!(
            "nothing accepts connections on {at} (the daemon is not running)"
        ))?,
        Err(ProbeError::Denied) => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("docker daemon not reachable: permission denied on {at}"),
        )
        .with_remediation(
            "add this user to the docker group: `sudo usermod -aG docker $USER`, then log out and back in",
        ),
        Err(ProbeError::Timeout) => unreachable(format!(
            "{at} did not answer within {:?}",
            ctx.docker_timeout
        ))?,
        Err(ProbeError::Io(err)) => unreachable(format!("{at}: {err}"))?,
        Err(ProbeError::Status(code, body)) => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("docker daemon at {at} answered GET /version with HTTP {code}: {body}"),
        )
        .with_remediation("check the daemon's log (`journalctl -u docker`) and restart it"),
        Err(ProbeError::Malformed(detail)) => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("{at} did not answer like a docker daemon: {detail}"),
        )
        .with_remediation(format!(
            "make sure {at} is the docker daemon's socket, or set DOCKER_HOST to the right one"
        )),
        Err(ProbeError::Json(err)) => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("docker daemon at {at} answered GET /version with unexpected json: {err}"),
        )
        .with_remediation(format!(
            "make sure {at} is the docker daemon's socket, or set DOCKER_HOST to the right one"
        )),
    };
    // Every backend needs the daemon: smolmachines runs the bottle's bundle
    // as a container too, so an unreachable daemon is never softened.
    Ok(check)
}

/// Checks whether the daemon's storage can cap a container's writable
/// layer, so that `limits.disk` holds. It cannot on the common overlay2 over
/// ext4; that is a warning, not a failure: bottles without `limits.disk`
/// run, but an agent can then fill the disk that holds Docker's data.
pub fn check_disk_quota(ctx: &Context<'_>) -> Check {
    let not_checked = |why: String| {
        Check::new(
            DISK_QUOTA_ID,
            DISK_QUOTA_TITLE,
            Status::Skip,
            format!("not checked: {why}"),
        )
    };
    let (cap, root) = match storage(ctx) {
        Ok(found) => found,
        Err(why) => return not_checked(why),
    };
    let root = root.as_str();
    match cap {
        LayerCap::Enforced { storage } => Check::new(
            DISK_QUOTA_ID,
            DISK_QUOTA_TITLE,
            Status::Ok,
            format!("{storage} caps an agent's writable layer where limits.disk is set"),
        ),
        LayerCap::IfPquota { storage } => Check::new(
            DISK_QUOTA_ID,
            DISK_QUOTA_TITLE,
            Status::Ok,
            format!(
                "{storage} caps an agent's writable layer where limits.disk is set, if {root} is mounted with pquota (the daemon refuses such a bottle otherwise)"
            ),
        ),
        LayerCap::Unsupported { storage } => Check::new(
            DISK_QUOTA_ID,
            DISK_QUOTA_TITLE,
            Status::Warn,
            format!(
                "{storage} cannot limit a container's writable layer: an agent can fill the disk holding {root}, and a bottle that sets limits.disk is refused"
            ),
        )
        .with_remediation(format!(
            "to cap agents' disk use, put {root} on xfs mounted with pquota (or use the btrfs or zfs storage driver), then set limits.disk"
        )),
    }
}

/// What the daemon's storage can do with `limits.disk`, and Docker's data
/// root, from `GET /info`; `Err` says why the daemon could not be asked.
/// `bottle plan` reads it too, so the plan and the doctor agree.
pub fn storage(ctx: &Context<'_>) -> Result<(LayerCap, String), String> {
    let socket = match endpoint(ctx.docker_host.as_deref()) {
        Endpoint::Other(value) => {
            return Err(format!("DOCKER_HOST={value} is not a unix socket"));
        }
        Endpoint::Unix(path) => ctx.root.join(path),
    };
    let info = probe::<StorageInfo>(&socket, ctx.docker_timeout, INFO_REQUEST).map_err(|err| {
        format!(
            "the docker daemon did not answer GET /info ({})",
            err.summary()
        )
    })?;
    let status = info.driver_status.unwrap_or_default();
    let cap = LayerCap::of_docker(
        &info.driver,
        status.iter().filter_map(|pair| match pair.as_slice() {
            [label, value] => Some((label.as_str(), value.as_str())),
            _ => None,
        }),
    );
    let root = if info.root_dir.is_empty() {
        "/var/lib/docker".to_owned()
    } else {
        info.root_dir
    };
    Ok((cap, root))
}

impl ProbeError {
    /// One line for a check that could not ask the daemon.
    fn summary(&self) -> String {
        match self {
            ProbeError::Missing => "no socket".to_owned(),
            ProbeError::Refused => "connection refused".to_owned(),
            ProbeError::Denied => "permission denied".to_owned(),
            ProbeError::Timeout => "timed out".to_owned(),
            ProbeError::Io(err) => err.to_string(),
            ProbeError::Status(code, body) => format!("HTTP {code}: {body}"),
            ProbeError::Malformed(detail) => detail.clone(),
            ProbeError::Json(err) => format!("unexpected json: {err}"),
        }
    }
}

fn start_remediation(ctx: &Context<'_>) -> Result<String, PreflightError> {
    Ok(match ctx.platform() {
        Platform::MacOs => {
            "start Docker Desktop (or colima), or set DOCKER_HOST=unix://$HOME/.docker/run/docker.sock".to_owned()
        }
        _ if exists(&ctx.root, "/etc/NIXOS")? => "add to /etc/nixos/configuration.nix:\n  virtualisation.docker.enable = true;\n  users.users.<name>.extraGroups = [ \"docker\" ];\nthen run `sudo nixos-rebuild switch` and log out and back in".to_owned(),
        _ => "start the docker daemon: `sudo apt-get install docker.io && sudo systemctl start docker` (or run `dockerd &`); add this user to the docker group (`sudo usermod -aG docker $USER`, then log in again); if the daemon listens elsewhere, set DOCKER_HOST=unix:///path/to/docker.sock".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_shape() {
        let text = std::str::from_utf8(VERSION_REQUEST).unwrap();
        let lines: Vec<&str> = text.split("\r\n").collect();
        assert_eq!(lines[0], "GET /version HTTP/1.1");
        assert!(lines.contains(&"Host: docker"));
        assert!(lines.contains(&"Connection: close"));
        assert!(text.ends_with("\r\n\r\n"));
    }

    #[test]
    fn endpoints() {
        assert_eq!(endpoint(None), Endpoint::Unix(DEFAULT_SOCKET.into()));
        assert_eq!(endpoint(Some("")), Endpoint::Unix(DEFAULT_SOCKET.into()));
        assert_eq!(
            endpoint(Some("unix:///run/user/1000/docker.sock")),
            Endpoint::Unix("/run/user/1000/docker.sock".into())
        );
        assert_eq!(
            endpoint(Some("tcp://127.0.0.1:2375")),
            Endpoint::Other("tcp://127.0.0.1:2375".into())
        );
    }

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nApi-Version: 1.41\r\n\r\n{}extra";
        assert_eq!(parse_response(raw).unwrap(), (200, b"{}".to_vec()));
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap(), (200, b"{\"a\":1}".to_vec()));
        let raw = b"HTTP/1.0 500 Internal Server Error\r\n\r\noops";
        assert_eq!(parse_response(raw).unwrap(), (500, b"oops".to_vec()));
    }

    #[test]
    fn rejects_what_is_not_http() {
        assert!(
            parse_response(b"")
                .unwrap_err()
                .contains("without answering")
        );
        assert!(
            parse_response(b"SSH-2.0-OpenSSH\r\n\r\n")
                .unwrap_err()
                .contains("not an HTTP")
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
        assert!(parse_response(b"HTTP/1.1 200 OK").is_err());
    }
}
