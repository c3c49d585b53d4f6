//! WebSockets through the proxy: an HTTP/1.1 `Upgrade: websocket` to an
//! allowed host, in absolute form (`ws://`) or inside an intercepted
//! `CONNECT` (`wss://`), is sent on to the upstream; once it answers `101`,
//! both sides are relayed frame by frame (`relay`), the agent's messages
//! scanned like request bodies.
//!
//! Extensions are declined: the agent's `Sec-WebSocket-Extensions` offer is
//! not passed on, so `permessage-deflate` is never agreed and every payload
//! is scanned as sent; an upstream that agrees to one anyway is refused.
//! HTTP/2's extended `CONNECT` (RFC 8441) is not offered: the bundle's h2
//! server does not send `SETTINGS_ENABLE_CONNECT_PROTOCOL`, so clients open
//! an HTTP/1.1 connection for a WebSocket, as they do without it.

mod frame;
pub(crate) mod relay;

use http::header::{self, HeaderMap};
use http::{Method, Version};

/// The agent's offer of extensions, which is not passed on.
pub(crate) const SEC_WEBSOCKET_EXTENSIONS: &str = "sec-websocket-extensions";

/// Sets the hop-by-hop headers of a switch to WebSocket, which the
/// bundle strips from every message it relays and puts back on the
/// handshake's two legs.
pub(crate) fn set_upgrade_headers(headers: &mut HeaderMap) {
    headers.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("upgrade"),
    );
    headers.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
}

/// Whether a request asks to become a WebSocket (RFC 6455 §4.1): a GET
/// over HTTP/1.1 with `Upgrade: websocket` and `Connection: upgrade`.
pub(crate) fn is_upgrade(method: &Method, version: Version, headers: &HeaderMap) -> bool {
    let lists = |name: header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    method == Method::GET
        && version == Version::HTTP_11
        && lists(header::UPGRADE, "websocket")
        && lists(header::CONNECTION, "upgrade")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn only_a_websocket_upgrade_of_an_http1_get_counts() {
        let ws = headers(&[
            ("upgrade", "WebSocket"),
            ("connection", "keep-alive, Upgrade"),
        ]);
        assert!(is_upgrade(&Method::GET, Version::HTTP_11, &ws));
        assert!(!is_upgrade(&Method::POST, Version::HTTP_11, &ws));
        assert!(!is_upgrade(&Method::GET, Version::HTTP_2, &ws));
        let h2c = headers(&[("upgrade", "h2c"), ("connection", "Upgrade")]);
        assert!(!is_upgrade(&Method::GET, Version::HTTP_11, &h2c));
        let no_connection = headers(&[("upgrade", "websocket")]);
        assert!(!is_upgrade(&Method::GET, Version::HTTP_11, &no_connection));
    }
}
