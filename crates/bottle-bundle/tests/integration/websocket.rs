//! WebSockets through the proxy, against an independent implementation
//! (tungstenite) on both ends: an echo upstream behind the bundle, a client
//! in front of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use bottle_bundle::Decision;

use crate::support::{ALLOWED, Env, Options, read_head};

/// A real-shaped AWS key id.
const AWS: &str = "AKIAZ7Q3HN2XK5WJ4T6M";

/// A handshake's headers, as the echo server received them.
type Headers = Vec<(String, String)>;

/// An echo server: every text or binary message comes back; what it
/// received (payloads and handshake headers) is kept.
#[derive(Clone, Default)]
struct Echo {
    payloads: Arc<Mutex<Vec<Vec<u8>>>>,
    handshakes: Arc<Mutex<Vec<Headers>>>,
}

impl Echo {
    async fn serve<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let handshakes = self.handshakes.clone();
        let record = move |req: &Request, resp: Response| {
            let headers = req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            handshakes.lock().unwrap().push(headers);
            Ok(resp)
        };
        let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, record).await else {
            return;
        };
        while let Some(Ok(msg)) = ws.next().await {
            match msg {
                Message::Text(_) | Message::Binary(_) => {
                    self.payloads
                        .lock()
                        .unwrap()
                        .push(msg.clone().into_data().to_vec());
                    if ws.send(msg).await.is_err() {
                        return;
                    }
                }
                Message::Close(_) => return,
                _ => {}
            }
        }
    }

    /// Serves plain (`tls` false) or TLS WebSockets on `listener`, with the
    /// leaf the bundle's upstreams present.
    fn serve_on(self, listener: TcpListener, env: &Env, tls: bool) {
        let mut leaf = (*env.upstream.leaf).clone();
        leaf.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(leaf));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (echo, acceptor) = (self.clone(), acceptor.clone());
                tokio::spawn(async move {
                    if tls {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            echo.serve(stream).await;
                        }
                    } else {
                        echo.serve(tcp).await;
                    }
                });
            }
        });
    }

    fn received(&self) -> String {
        let all = self.payloads.lock().unwrap().concat();
        String::from_utf8_lossy(&all).into_owned()
    }
}

/// A bundle allowing the echo's port, with `redact` hosts and a message
/// bound.
async fn env(port: u16, redact: bool, max_message: u64) -> Env {
    let mut opts = Options {
        extra_ports: vec![port],
        redact: if redact { vec![ALLOWED.into()] } else { vec![] },
        ..Options::default()
    };
    opts.limits.websocket_max_message_bytes = max_message;
    Env::start(opts).await
}

/// `wss://` through a CONNECT tunnel: the client's TLS ends at the bundle.
async fn wss(env: &Env, port: u16) -> WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>> {
    let authority = format!("{ALLOWED}:{port}");
    let tls = env.tls(&authority, ALLOWED).await.unwrap();
    let (ws, resp) = tokio_tungstenite::client_async(format!("wss://{authority}/echo"), tls)
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    ws
}

/// The first close frame's code, reading past anything else.
async fn close_code<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) -> Option<u16> {
    let read = async {
        while let Some(msg) = ws.next().await {
            match msg {
                Ok(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or(None)
}

/// An echo server and a bundle allowing its port (bound first, so the
/// bundle's policy can list it).
async fn echo_and_env(tls: bool, redact: bool, max_message: u64) -> (Echo, Env, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let env = env(port, redact, max_message).await;
    let echo = Echo::default();
    echo.clone().serve_on(listener, &env, tls);
    (echo, env, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_through_a_tunnel_echoes_text_and_binary_and_is_audited() {
    let (echo, env, port) = echo_and_env(true, false, 1 << 20).await;
    let mut ws = wss(&env, port).await;
    ws.send(Message::text("hello through the bundle"))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("hello through the bundle")
    );
    let binary: Vec<u8> = (0..=255).cycle().take(200_000).collect();
    ws.send(Message::binary(binary.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(binary));
    ws.close(None).await.unwrap();
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(10), || {
            env.audit().iter().any(|r| {
                r.decision == Decision::Allow
                    && r.reason == "websocket"
                    && r.status == 101
                    && r.bytes_up >= 200_000
                    && r.bytes_down >= 200_000
            })
        })
        .await,
        "{:?}",
        env.audit()
    );
    // The offer of compression never reached the upstream.
    for headers in echo.handshakes.lock().unwrap().iter() {
        assert!(
            !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("sec-websocket-extensions")),
            "{headers:?}"
        );
    }
}

/// `ws://` in absolute form through the plain proxy, handshake by hand (a
/// client library would CONNECT first), the frames then by tungstenite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_in_absolute_form_switches_and_declines_compression() {
    let (echo, env, port) = echo_and_env(false, false, 1 << 20).await;
    let mut tcp = TcpStream::connect(env.proxy()).await.unwrap();
    tcp.write_all(
        format!(
            "GET http://{ALLOWED}:{port}/echo HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\
             Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = String::from_utf8(read_head(&mut tcp).await).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "{head}"
    );
    let mut ws = WebSocketStream::from_raw_socket(tcp, Role::Client, None).await;
    ws.send(Message::text("plain")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("plain"));
    assert_eq!(echo.received(), "plain");
}

/// A secret in a message closes the socket with 1008 before any byte of
/// it reaches the upstream, also when it is split across the frames of a
/// fragmented message; the audit line says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_a_message_closes_the_socket_and_never_leaves() {
    let (echo, env, port) = echo_and_env(true, false, 1 << 20).await;
    let mut ws = wss(&env, port).await;
    ws.send(Message::text(format!("key={AWS}"))).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1008));

    // Split across three frames of one message, with pauses.
    let mut ws = wss(&env, port).await;
    let (a, rest) = AWS.split_at(6);
    let (b, c) = rest.split_at(7);
    let frames = [
        Frame::message(format!("lead {a}"), OpCode::Data(Data::Text), false),
        Frame::message(b.to_string(), OpCode::Data(Data::Continue), false),
        Frame::message(format!("{c} tail"), OpCode::Data(Data::Continue), true),
    ];
    for frame in frames {
        ws.send(Message::Frame(frame)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(close_code(&mut ws).await, Some(1008));
    let received = echo.received();
    assert!(!received.contains("AKIA"), "{received:?}");
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(10), || {
            env.audit()
                .iter()
                .filter(|r| {
                    r.decision == Decision::BlockedSecret
                        && r.reason == "secret:aws_access_key_id"
                        && r.status == 101
                })
                .count()
                == 2
        })
        .await,
        "{:?}",
        env.audit()
    );
    // The positive control: a clean message on a new socket echoes.
    let mut ws = wss(&env, port).await;
    ws.send(Message::text("clean")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("clean"));
}

/// On a host that redacts, the secret is masked in the message, which goes
/// on (and comes back masked); split across frames too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacting_host_gets_the_message_with_the_secret_masked() {
    let (echo, env, port) = echo_and_env(true, true, 1 << 20).await;
    let mut ws = wss(&env, port).await;
    let (a, b) = AWS.split_at(9);
    ws.send(Message::Frame(Frame::message(
        format!("history: {a}"),
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    ws.send(Message::Frame(Frame::message(
        format!("{b} end"),
        OpCode::Data(Data::Continue),
        true,
    )))
    .await
    .unwrap();
    let masked = format!("history: REDACTED{} end", "*".repeat(AWS.len() - 8));
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text(masked.clone())
    );
    assert_eq!(echo.received(), masked);
    ws.close(None).await.unwrap();
    assert!(
        bottle_test_support::eventually_async(Duration::from_secs(10), || {
            env.audit()
                .iter()
                .any(|r| r.decision == Decision::Redacted && r.reason == "secret:aws_access_key_id")
        })
        .await,
        "{:?}",
        env.audit()
    );
}

/// A message over the bound closes with 1009; frames the protocol forbids
/// (a compressed frame nobody agreed to, an unmasked client frame) with
/// 1002. None of it reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_frames_close_the_socket() {
    let (echo, env, port) = echo_and_env(true, false, 1024).await;
    let mut ws = wss(&env, port).await;
    ws.send(Message::binary(vec![7u8; 2048])).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1009));

    // Raw frames on a fresh socket: the handshake by tungstenite, then
    // bytes written straight to the stream.
    for (frame, why) in [
        (
            vec![0xC1, 0x85, 1, 2, 3, 4, 0, 0, 0, 0, 0],
            "RSV1 (compressed)",
        ),
        (vec![0x81, 0x05, b'h', b'e', b'l', b'l', b'o'], "unmasked"),
    ] {
        let ws = wss(&env, port).await;
        let mut stream = ws.into_inner();
        stream.write_all(&frame).await.unwrap();
        stream.flush().await.unwrap();
        let mut ws = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
        assert_eq!(close_code(&mut ws).await, Some(1002), "{why}");
    }
    assert_eq!(echo.received(), "", "nothing was echoed");
}

/// A socket that carries nothing either way is closed once the idle bound
/// passes (1001, or the connection itself when the agent side's idle bound
/// ends it first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_is_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut opts = Options {
        extra_ports: vec![port],
        ..Options::default()
    };
    opts.limits.idle_timeout_ms = 1_000;
    let env = Env::start(opts).await;
    Echo::default().serve_on(listener, &env, true);
    let mut ws = wss(&env, port).await;
    ws.send(Message::text("once")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("once"));
    // Bounded far above the idle bound: a socket still open then was never
    // closed for being idle.
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    })
    .await;
    match end {
        Ok(None | Some(1001)) => {}
        other => panic!("the idle socket was not closed as idle: {other:?}"),
    }
}

/// A host that is not allowed gets no upgrade: the same 403 as any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_a_denied_host_is_refused() {
    let env = Env::start(Options::default()).await;
    let resp = env
        .raw(
            b"GET http://denied.test/echo HTTP/1.1\r\nHost: denied.test\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
    assert_eq!(resp.status, 403, "{}", resp.text());
}
