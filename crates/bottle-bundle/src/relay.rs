//! TCP relays: the manifest's host services (`egress.host_services`) and
//! pinned remote TCP destinations (`egress.tcp`), one listener each on the
//! agent-facing address at the destination's port.
//!
//! Each accepted connection goes to the relay's one destination and
//! nothing else: a host service through its unix socket, which the host
//! serves (the bundle has no route to the host: it reaches the host's
//! loopback only through that socket, and the host process behind it
//! dials only the service's port); a remote destination by its name,
//! resolved here (the config's `resolve` first, then DNS, refusing what
//! egress refuses: loopback, private, link-local, the bundle's own
//! addresses) and dialled at its port. The bytes are not scanned, not
//! parsed: a relay is a pipe, and the manifest and docs say so.
//!
//! Every connection is audited when it opens (or fails to) and when it
//! closes, with its bytes each way and its duration. A connection waits
//! for a slot (bounded, like the proxy's), and one that carries no byte
//! either way for the bundle's idle timeout is closed. A degraded audit
//! log refuses every connection, as it refuses every request.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bottle_core::bundle::{BundleConfig, BundleRelay, RelayVia};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;

use crate::BundleError;
use crate::audit::{AUDIT_VERSION, AuditLog, AuditRecord, Decision};
use crate::daemons::{Daemon, bind, listen_addr};
use crate::egress::GuardedResolver;

/// The daemon's name, in logs and audit lines.
pub const DAEMON: &str = "relay";
/// Connections one relay serves at once; more wait in the backlog.
const MAX_CONNECTIONS: usize = 256;
/// The audit reason of a host service's connection.
pub const HOST_SERVICE: &str = "host_service";
/// The audit reason of a pinned TCP destination's connection.
pub const PINNED_TCP: &str = "pinned_tcp";

/// One relay: its destination and how it is reached.
struct Relay {
    bottle: String,
    host: String,
    port: u16,
    via: Via,
    audit: AuditLog,
    slots: Arc<Semaphore>,
    idle: Duration,
    connect_timeout: Duration,
}

enum Via {
    HostService(PathBuf),
    Tcp(GuardedResolver),
}

/// The config's relays as supervised daemons, bound now so that a port
/// clash is reported at once.
pub fn daemons(config: &BundleConfig, audit: &AuditLog) -> Result<Vec<Daemon>, BundleError> {
    let mut daemons = Vec::new();
    let mut resolver = None;
    for relay in &config.relays {
        let via = match &relay.via {
            RelayVia::HostService { socket } => Via::HostService(PathBuf::from(socket)),
            RelayVia::Tcp => {
                let resolver = match &resolver {
                    Some(resolver) => resolver,
                    None => resolver.insert(GuardedResolver::new(config)?),
                };
                Via::Tcp(resolver.clone())
            }
        };
        daemons.push(daemon(config, relay, via, audit)?);
    }
    Ok(daemons)
}

fn daemon(
    config: &BundleConfig,
    relay: &BundleRelay,
    via: Via,
    audit: &AuditLog,
) -> Result<Daemon, BundleError> {
    let addr = listen_addr(DAEMON, &relay.listen)?;
    let listener = bind(DAEMON, addr)?;
    let addr = listener.local_addr().map_err(|source| BundleError::Bind {
        daemon: DAEMON,
        addr: addr.to_string(),
        source,
    })?;
    let relay = Arc::new(Relay {
        bottle: config.bottle.clone(),
        host: relay.host.clone(),
        port: relay.port,
        via,
        audit: audit.clone(),
        slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        idle: Duration::from_millis(config.limits.idle_timeout_ms),
        connect_timeout: Duration::from_millis(config.limits.connect_timeout_ms),
    });
    Ok(Daemon {
        name: DAEMON,
        addr,
        listener,
        serve: Arc::new(move |l| Box::pin(relay.clone().serve(l))),
    })
}

/// How a connection to the destination could not be made.
struct Unreachable {
    reason: &'static str,
    detail: String,
}

impl Relay {
    async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<(), BundleError> {
        loop {
            let (stream, _peer, permit) =
                crate::accept::next_connection(&listener, &self.slots, DAEMON).await?;
            let relay = self.clone();
            tokio::spawn(async move {
                relay.relay(stream).await;
                drop(permit);
            });
        }
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self.via {
            Via::HostService(_) => (HOST_SERVICE, "egress.host_services"),
            Via::Tcp(_) => (PINNED_TCP, "egress.tcp"),
        }
    }

    async fn relay(&self, mut agent: TcpStream) {
        let start = Instant::now();
        if self.audit.is_degraded() {
            // Nothing goes through unaudited.
            let _ = agent.shutdown().await;
            return;
        }
        let (reason, rule) = self.kind();
        let record = |decision, method: &str, reason: String| AuditRecord {
            v: AUDIT_VERSION,
            time: bottle_core::time::now_rfc3339_millis(),
            bottle: self.bottle.clone(),
            daemon: DAEMON.into(),
            decision,
            host: self.host.clone(),
            port: self.port,
            method: method.into(),
            path: String::new(),
            status: 0,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            reason,
            rule: rule.into(),
            count: 1,
            hosts: Vec::new(),
            truncated: false,
        };
        let dialled = match &self.via {
            Via::HostService(socket) => {
                match tokio::time::timeout(self.connect_timeout, UnixStream::connect(socket)).await
                {
                    Ok(Ok(stream)) => Ok(Upstream::Unix(stream)),
                    Ok(Err(err)) => Err(Unreachable {
                        reason: "host_service_unavailable",
                        detail: format!("the host does not serve it ({err})"),
                    }),
                    Err(_) => Err(Unreachable {
                        reason: "host_service_unavailable",
                        detail: "the host did not answer in time".into(),
                    }),
                }
            }
            Via::Tcp(resolver) => self.dial(resolver).await.map(Upstream::Tcp),
        };
        let upstream = match dialled {
            Ok(upstream) => upstream,
            Err(unreachable) => {
                crate::log!(
                    "{DAEMON} {}:{}: {}",
                    self.host,
                    self.port,
                    unreachable.detail
                );
                let mut line = record(Decision::Error, "OPEN", unreachable.reason.into());
                line.duration_ms = millis(start.elapsed());
                self.audit.write(line);
                let _ = agent.shutdown().await;
                return;
            }
        };
        self.audit
            .write(record(Decision::Allow, "OPEN", reason.into()));
        let (up, down) = match upstream {
            Upstream::Unix(stream) => pipe(agent, stream, self.idle).await,
            Upstream::Tcp(stream) => pipe(agent, stream, self.idle).await,
        };
        let mut line = record(Decision::Allow, "CLOSE", reason.into());
        line.bytes_up = up;
        line.bytes_down = down;
        line.duration_ms = millis(start.elapsed());
        self.audit.write(line);
    }

    /// Resolves the destination and dials its addresses in turn.
    async fn dial(&self, resolver: &GuardedResolver) -> Result<TcpStream, Unreachable> {
        let resolved =
            tokio::time::timeout(self.connect_timeout, resolver.resolve_host(&self.host))
                .await
                .unwrap_or_else(|_| Err("no DNS answer in time".into()));
        let addrs = resolved.map_err(|err| Unreachable {
            reason: "dial_refused",
            detail: format!("{}: {err}", self.host),
        })?;
        let mut last = String::from("no address");
        for addr in addrs {
            let addr = SocketAddr::new(addr.ip(), self.port);
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(err)) => last = format!("{addr}: {err}"),
                Err(_) => last = format!("{addr}: no answer in time"),
            }
        }
        Err(Unreachable {
            reason: "upstream_unreachable",
            detail: last,
        })
    }
}

enum Upstream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

fn millis(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// Copies both ways until both sides have ended (each end passed on as a
/// half-close), one side fails, or no byte moves for `idle`; returns the
/// bytes sent from `agent` and to it.
async fn pipe<A, B>(agent: A, upstream: B, idle: Duration) -> (u64, u64)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut agent_in, mut agent_out) = tokio::io::split(agent);
    let (mut up_in, mut up_out) = tokio::io::split(upstream);
    let (mut sent, mut received) = (0u64, 0u64);
    let (mut agent_open, mut up_open) = (true, true);
    let mut from_agent = vec![0u8; 16 * 1024];
    let mut from_up = vec![0u8; 16 * 1024];
    while agent_open || up_open {
        tokio::select! {
            read = agent_in.read(&mut from_agent), if agent_open => match read {
                Ok(0) => {
                    agent_open = false;
                    let _ = up_out.shutdown().await;
                }
                Ok(n) => {
                    if up_out.write_all(&from_agent[..n]).await.is_err() {
                        break;
                    }
                    sent += n as u64;
                }
                Err(_) => break,
            },
            read = up_in.read(&mut from_up), if up_open => match read {
                Ok(0) => {
                    up_open = false;
                    let _ = agent_out.shutdown().await;
                }
                Ok(n) => {
                    if agent_out.write_all(&from_up[..n]).await.is_err() {
                        break;
                    }
                    received += n as u64;
                }
                Err(_) => break,
            },
            () = tokio::time::sleep(idle) => break,
        }
    }
    (sent, received)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pipe_carries_both_ways_and_passes_on_half_closes() {
        let (agent_near, mut agent_far) = tokio::io::duplex(64);
        let (up_near, mut up_far) = tokio::io::duplex(64);
        let piped = tokio::spawn(pipe(agent_near, up_near, Duration::from_secs(5)));
        agent_far.write_all(b"ping").await.unwrap();
        agent_far.shutdown().await.unwrap();
        let mut got = Vec::new();
        up_far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping");
        up_far.write_all(b"pong!").await.unwrap();
        up_far.shutdown().await.unwrap();
        let mut back = Vec::new();
        agent_far.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"pong!");
        assert_eq!(piped.await.unwrap(), (4, 5));
    }

    #[tokio::test]
    async fn an_idle_pipe_is_closed() {
        let (agent_near, _agent_far) = tokio::io::duplex(64);
        let (up_near, _up_far) = tokio::io::duplex(64);
        let started = Instant::now();
        let moved = pipe(agent_near, up_near, Duration::from_millis(100)).await;
        assert_eq!(moved, (0, 0));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
