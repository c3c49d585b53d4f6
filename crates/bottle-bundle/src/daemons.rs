//! Starting the bundle and keeping its daemons up.
//!
//! Each daemon is a listener plus an accept loop. The supervisor runs every
//! loop as its own task; when one returns an error or panics, it is rebound
//! and restarted after an exponential backoff. A daemon that fails more than
//! `max_restarts` times within `restart_window_ms`, or whose port cannot be
//! bound again, ends the whole supervisor with an error: the binary then
//! exits non-zero, the bundle container stops, and the bottle fails closed
//! rather than running with a hole in its enforcement.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bottle_core::bundle::{BUNDLE_CONFIG_VERSION, BundleConfig};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{JoinHandle, JoinSet};

use crate::BundleError;
use crate::audit::AuditLog;
use crate::egress::Egress;
use crate::proxy::Proxy;

/// Reads and checks the config file.
pub fn load_config(path: &Path) -> Result<BundleConfig, BundleError> {
    let text = std::fs::read_to_string(path).map_err(|source| BundleError::ConfigRead {
        path: path.display().to_string(),
        source,
    })?;
    let config: BundleConfig =
        serde_json::from_str(&text).map_err(|e| BundleError::ConfigInvalid {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
    if config.version != BUNDLE_CONFIG_VERSION {
        return Err(BundleError::ConfigInvalid {
            path: path.display().to_string(),
            detail: format!(
                "version {} (this bundle reads version {BUNDLE_CONFIG_VERSION})",
                config.version
            ),
        });
    }
    Ok(config)
}

/// A daemon's accept loop, given its bound listener.
pub type ServeFn = Arc<
    dyn Fn(TcpListener) -> Pin<Box<dyn Future<Output = Result<(), BundleError>> + Send>>
        + Send
        + Sync,
>;

/// One supervised daemon.
pub struct Daemon {
    /// Name for logs and errors.
    pub name: &'static str,
    /// The bound address (rebinding reuses it, ephemeral ports included).
    pub addr: SocketAddr,
    /// The first listener, bound before the supervisor starts so that a
    /// port clash is reported at once.
    pub listener: TcpListener,
    /// The accept loop.
    pub serve: ServeFn,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// When to give up on a crashing daemon.
#[derive(Debug, Clone)]
pub struct RestartPolicy {
    /// Failures tolerated within `window`.
    pub max_restarts: u32,
    /// The window.
    pub window: Duration,
    /// First backoff; doubles per recent failure.
    pub base_backoff: Duration,
    /// Backoff cap.
    pub max_backoff: Duration,
}

impl RestartPolicy {
    /// From the config's limits.
    pub fn from_limits(l: &bottle_core::bundle::BundleLimits) -> Self {
        Self {
            max_restarts: l.max_restarts,
            window: Duration::from_millis(l.restart_window_ms),
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// Binds a listening socket with a deep accept backlog.
pub fn bind(name: &'static str, addr: SocketAddr) -> Result<TcpListener, BundleError> {
    let err = |source| BundleError::Bind {
        daemon: name,
        addr: addr.to_string(),
        source,
    };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(4096).map_err(err)
}

async fn run_daemon(d: Daemon, policy: RestartPolicy) -> Result<(), BundleError> {
    let mut failures: VecDeque<Instant> = VecDeque::new();
    let mut listener = Some(d.listener);
    loop {
        let l = match listener.take() {
            Some(l) => l,
            None => bind(d.name, d.addr)?,
        };
        let outcome = tokio::spawn((d.serve)(l)).await;
        let last = match outcome {
            Ok(Ok(())) => "the accept loop ended".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(join) if join.is_panic() => {
                let p = join.into_panic();
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                format!("panicked: {msg}")
            }
            Err(join) => format!("cancelled: {join}"),
        };
        let now = Instant::now();
        failures.push_back(now);
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            failures.pop_front();
        }
        let count = u32::try_from(failures.len()).unwrap_or(u32::MAX);
        if count > policy.max_restarts {
            return Err(BundleError::CrashLoop {
                daemon: d.name.to_string(),
                restarts: count,
                window_ms: u64::try_from(policy.window.as_millis()).unwrap_or(u64::MAX),
                last,
            });
        }
        let backoff = policy
            .base_backoff
            .saturating_mul(1 << count.saturating_sub(1).min(16))
            .min(policy.max_backoff);
        crate::log!(
            "{} stopped ({last}); restart {count} in {} ms",
            d.name,
            backoff.as_millis()
        );
        tokio::time::sleep(backoff).await;
    }
}

/// Runs the daemons until one cannot be kept up; returns that error.
pub async fn keep_up(daemons: Vec<Daemon>, policy: RestartPolicy) -> Result<(), BundleError> {
    let mut set = JoinSet::new();
    for d in daemons {
        set.spawn(run_daemon(d, policy.clone()));
    }
    match set.join_next().await {
        Some(Ok(result)) => result.and(Err(BundleError::Daemon {
            daemon: "supervisor".into(),
            detail: "a daemon loop ended".into(),
        })),
        Some(Err(join)) => Err(BundleError::Daemon {
            daemon: "supervisor".into(),
            detail: join.to_string(),
        }),
        None => Ok(()),
    }
}

/// A started bundle. Dropping it stops the supervisor.
#[derive(Debug)]
pub struct RunningBundle {
    /// Where the proxy listens.
    pub proxy_addr: SocketAddr,
    /// Where git-gate listens (`None`: not configured).
    pub git_gate_addr: Option<SocketAddr>,
    /// Where supervise listens (`None`: not configured).
    pub supervise_addr: Option<SocketAddr>,
    /// Where each TCP relay listens, in the config's order.
    pub relay_addrs: Vec<SocketAddr>,
    task: Option<JoinHandle<Result<(), BundleError>>>,
    /// Flushed on drop, so a clean shutdown writes pending counts.
    audit: AuditLog,
}

impl RunningBundle {
    /// Waits until the supervisor gives up (normally never).
    pub async fn wait(mut self) -> Result<(), BundleError> {
        match self.task.take() {
            Some(t) => t.await.unwrap_or_else(|e| {
                Err(BundleError::Daemon {
                    daemon: "supervisor".into(),
                    detail: e.to_string(),
                })
            }),
            None => Ok(()),
        }
    }

    /// Writes the counted lines of the audit log's open merging windows
    /// now, as a clean shutdown does (for tests that read the log right
    /// after their requests).
    pub fn flush_audit(&self) {
        self.audit.flush();
    }
}

impl Drop for RunningBundle {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.audit.flush();
    }
}

/// A daemon's listen address from the config, or the error naming it.
pub(crate) fn listen_addr(daemon: &'static str, raw: &str) -> Result<SocketAddr, BundleError> {
    raw.parse().map_err(|_| BundleError::ListenAddr {
        daemon,
        addr: raw.to_string(),
    })
}

/// Builds the daemons, binds their ports and starts the supervisor.
/// Fails (without starting anything) if the config, CA, credentials or a
/// port are not usable.
pub async fn start(config: BundleConfig) -> Result<RunningBundle, BundleError> {
    if config.version != BUNDLE_CONFIG_VERSION {
        return Err(BundleError::ConfigInvalid {
            path: "bundle config".into(),
            detail: format!(
                "version {} (this bundle reads version {BUNDLE_CONFIG_VERSION})",
                config.version
            ),
        });
    }
    let proxy_addr = listen_addr("proxy", &config.proxy_listen)?;
    let audit = AuditLog::open(
        Path::new(&config.audit_log),
        &config.bottle,
        config.limits.audit_log_max_bytes,
    )?;

    // Operator approvals (supervise) reach the proxy and egress through
    // this one shared list.
    let runtime_rules = crate::allowlist::RuntimeRules::default();
    // Egress has no listener: the proxy calls it in-process, so nothing
    // else in the bundle's network namespace can reach it.
    let mut egress = Egress::new(&config, audit.clone())?;
    egress.share_runtime_rules(runtime_rules.clone());
    let egress = Arc::new(egress);
    // Push approvals reach git-gate the same way.
    let push_rules = crate::gitgate::push_rules::RuntimePushRules::default();
    let git_gate = crate::gitgate::daemon(&config, &audit, &push_rules)?;
    let supervise_daemon = crate::supervise::daemon(&config, &audit, &runtime_rules, &push_rules)?;
    let mut proxy = Proxy::new(&config, audit.clone(), egress)?;
    proxy.share_runtime_rules(runtime_rules);
    let proxy = Arc::new(proxy);
    let proxy_listener = bind("proxy", proxy_addr)?;
    let proxy_addr = proxy_listener
        .local_addr()
        .map_err(|source| BundleError::Bind {
            daemon: "proxy",
            addr: proxy_addr.to_string(),
            source,
        })?;

    let mut daemons = vec![Daemon {
        name: "proxy",
        addr: proxy_addr,
        listener: proxy_listener,
        serve: Arc::new(move |l| Box::pin(proxy.clone().serve(l))),
    }];
    let git_gate_addr = git_gate.as_ref().map(|d| d.addr);
    daemons.extend(git_gate);
    let supervise_addr = supervise_daemon.as_ref().map(|d| d.addr);
    daemons.extend(supervise_daemon);
    let relays = crate::relay::daemons(&config, &audit)?;
    let relay_addrs = relays.iter().map(|d| d.addr).collect();
    daemons.extend(relays);
    let task = tokio::spawn(keep_up(daemons, RestartPolicy::from_limits(&config.limits)));
    Ok(RunningBundle {
        proxy_addr,
        git_gate_addr,
        supervise_addr,
        relay_addrs,
        task: Some(task),
        audit,
    })
}
