//! Just enough of the Docker Engine API for the host-side checks: inspect,
//! top, kill, list.
//! HTTP/1.1 over the Unix socket with `Connection: close`, std only.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// The Engine's socket.
pub(crate) const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// A Docker Engine reached over its Unix socket.
#[derive(Debug, Clone)]
pub(crate) struct EngineSocket {
    socket: PathBuf,
}

/// One HTTP response.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// Status code.
    pub status: u16,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

impl EngineSocket {
    /// The Engine at `DOCKER_HOST` (`unix://` only) or the default socket.
    pub(crate) fn from_env() -> EngineSocket {
        let socket = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
            .unwrap_or_else(|| DEFAULT_SOCKET.to_string());
        EngineSocket {
            socket: PathBuf::from(socket),
        }
    }

    /// Sends one request and reads the whole response (bounded by
    /// `timeout` per read).
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> anyhow::Result<Response> {
        let mut stream = UnixStream::connect(&self.socket).with_context(|| {
            format!(
                "could not reach the Docker Engine at {}",
                self.socket.display()
            )
        })?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let payload = body.map(Value::to_string).unwrap_or_default();
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n");
        if body.is_some() {
            request.push_str("Content-Type: application/json\r\n");
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
        request.push_str(&payload);
        stream.write_all(request.as_bytes())?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .with_context(|| format!("reading the Engine's answer to {method} {path}"))?;
        parse_response(&raw)
            .with_context(|| format!("unparseable Engine answer to {method} {path}"))
    }

    /// GET returning JSON; a non-2xx status is an error.
    pub(crate) fn get(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.request("GET", path, None, Duration::from_secs(30))?;
        json_ok(&response, "GET", path)
    }

    /// POST (optional JSON body), 2xx required; returns the body as JSON
    /// (`Null` when empty).
    pub(crate) fn post(
        &self,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let response = self.request("POST", path, body, timeout)?;
        json_ok(&response, "POST", path)
    }

    /// Whether `/_ping` answers OK.
    pub(crate) fn ping(&self) -> bool {
        self.request("GET", "/_ping", None, Duration::from_secs(3))
            .is_ok_and(|r| r.status == 200)
    }

    /// `docker inspect` of a container.
    pub(crate) fn inspect_container(&self, name: &str) -> anyhow::Result<Value> {
        self.get(&format!("/containers/{}/json", encode(name)))
    }

    /// `docker network inspect`.
    pub(crate) fn inspect_network(&self, name: &str) -> anyhow::Result<Value> {
        self.get(&format!("/networks/{}", encode(name)))
    }

    /// Host PIDs of every process in a running container.
    pub(crate) fn container_pids(&self, name: &str) -> anyhow::Result<Vec<u32>> {
        let top = self.get(&format!(
            "/containers/{}/top?ps_args=-eo%20pid",
            encode(name)
        ))?;
        Ok(pids_from_top(&top))
    }

    /// `docker kill -s KILL`.
    pub(crate) fn kill(&self, name: &str) -> anyhow::Result<()> {
        self.post(
            &format!("/containers/{}/kill?signal=KILL", encode(name)),
            None,
            Duration::from_secs(30),
        )?;
        Ok(())
    }
}

fn json_ok(response: &Response, method: &str, path: &str) -> anyhow::Result<Value> {
    if !(200..300).contains(&response.status) {
        bail!(
            "the Engine answered {method} {path} with HTTP {}: {}",
            response.status,
            String::from_utf8_lossy(&response.body).trim()
        );
    }
    if response.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&response.body)
        .with_context(|| format!("the Engine's answer to {method} {path} is not JSON"))
}

/// Percent-encodes a path segment or query value.
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Splits an HTTP/1.1 response into status and (de-chunked) body.
pub(crate) fn parse_response(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let body = &raw[split + 4..];
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Some(Response { status, body })
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

/// The PID column of a `/top` answer.
pub(crate) fn pids_from_top(top: &Value) -> Vec<u32> {
    let Some(column) = top["Titles"]
        .as_array()
        .and_then(|t| t.iter().position(|t| t.as_str() == Some("PID")))
    else {
        return Vec::new();
    };
    top["Processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row.get(column)?.as_str()?.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_and_plain_responses_parse() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let r = parse_response(plain).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        let chunked = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n";
        let r = parse_response(chunked).unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.body, b"{\"a\": 1}");
        assert!(parse_response(b"garbage").is_none());
    }

    #[test]
    fn filters_are_percent_encoded() {
        assert_eq!(
            encode("{\"label\":[\"a=1\"]}"),
            "%7B%22label%22%3A%5B%22a%3D1%22%5D%7D"
        );
        assert_eq!(encode("bot-bottle-x_y.z"), "bot-bottle-x_y.z");
    }

    #[test]
    fn top_pids_come_from_the_pid_column() {
        let top = serde_json::json!({
            "Titles": ["UID", "PID", "CMD"],
            "Processes": [["1000", "4242", "sh"], ["1000", " 4243", "probe"], ["x"]]
        });
        assert_eq!(pids_from_top(&top), [4242, 4243]);
        assert!(pids_from_top(&serde_json::json!({})).is_empty());
    }
}
