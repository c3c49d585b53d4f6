//! Which repository and which smart-HTTP endpoint a request asks for.

use http::{Method, Request, StatusCode};

use crate::gitgate::command::Service;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    InfoRefs(Service),
    Rpc(Service),
}

impl Endpoint {
    pub(super) fn method(self) -> &'static str {
        match self {
            Self::InfoRefs(_) => "advertise",
            Self::Rpc(Service::UploadPack) => "fetch",
            Self::Rpc(Service::ReceivePack) => "push",
        }
    }
}

/// Splits `/<repo>/<endpoint>`; errors are (status, message for git).
pub(super) fn route<'a>(
    method: &Method,
    path: &'a str,
    query: &str,
) -> Result<(&'a str, Endpoint), (StatusCode, String)> {
    let not_found = || {
        (
            StatusCode::NOT_FOUND,
            format!(
                "nothing at {path}; this is the bottle's git gate: it serves $GIT_GATE_URL/<name>.git over git's smart HTTP protocol only"
            ),
        )
    };
    let rest = path.strip_prefix('/').ok_or_else(not_found)?;
    let (segment, tail) = rest.split_once('/').ok_or_else(not_found)?;
    if segment.is_empty() {
        return Err(not_found());
    }
    let endpoint = match tail {
        "info/refs" => {
            let service = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("service="))
                .and_then(Service::parse)
                .ok_or_else(|| {
                    (
                        StatusCode::FORBIDDEN,
                        "only git's smart HTTP protocol is served; fix: use a git client newer than 1.6.6".to_string(),
                    )
                })?;
            Endpoint::InfoRefs(service)
        }
        "git-upload-pack" => Endpoint::Rpc(Service::UploadPack),
        "git-receive-pack" => Endpoint::Rpc(Service::ReceivePack),
        _ => return Err(not_found()),
    };
    let want = match endpoint {
        Endpoint::InfoRefs(_) => Method::GET,
        Endpoint::Rpc(_) => Method::POST,
    };
    if *method != want && !(want == Method::GET && *method == Method::HEAD) {
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} takes {want}, not {method}"),
        ));
    }
    Ok((segment, endpoint))
}

/// The client's `Git-Protocol` header, if it is plain `key=value:...`.
pub(super) fn git_protocol<B>(req: &Request<B>) -> Option<String> {
    let value = req.headers().get("git-protocol")?.to_str().ok()?;
    let ok = value.len() <= 256
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b':' | b'.' | b'_' | b'-'));
    ok.then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(
            route(&get, "/demo.git/info/refs", "service=git-upload-pack").unwrap(),
            ("demo.git", Endpoint::InfoRefs(Service::UploadPack))
        );
        assert_eq!(
            route(&post, "/demo/git-receive-pack", "").unwrap(),
            ("demo", Endpoint::Rpc(Service::ReceivePack))
        );
        assert_eq!(
            route(&get, "/demo.git/info/refs", "").unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            route(&get, "/demo.git/git-upload-pack", "").unwrap_err().0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        for p in [
            "/",
            "/demo.git",
            "//info/refs",
            "/demo.git/HEAD",
            "/a/b/info/refs",
        ] {
            assert_eq!(
                route(&get, p, "service=git-upload-pack").unwrap_err().0,
                StatusCode::NOT_FOUND,
                "{p}"
            );
        }
    }
}
