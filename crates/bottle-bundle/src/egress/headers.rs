//! The headers that never cross to an upstream or back to the agent.

use http::header::{self, HeaderMap, HeaderName};

/// Hop-by-hop headers, never forwarded in either direction.
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// Removes hop-by-hop headers, including those named in `Connection`.
///
/// `TE: trailers` alone survives, as `te: trailers`: it is the one `TE`
/// that HTTP/2 allows, and gRPC servers refuse a request without it.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let accepts_trailers = headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(*n);
    }
    if accepts_trailers {
        headers.insert(header::TE, header::HeaderValue::from_static("trailers"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

    #[test]
    fn hop_by_hop_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("proxy-authorization", HeaderValue::from_static("basic x"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn te_trailers_alone_survives() {
        let mut h = HeaderMap::new();
        h.insert("te", HeaderValue::from_static("gzip, trailers"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get("te").unwrap(), "trailers");
        let mut h = HeaderMap::new();
        h.insert("te", HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty());
    }
}
