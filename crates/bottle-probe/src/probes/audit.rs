//! Filling the operator's disk through the audit log, and flushing the
//! agent's own history out of it: every proxy decision, denied ones
//! included, is a line in a log on the host. The probe floods the bottle's
//! proxy, bounded in count and time, over a few keep-alive connections, in
//! three runs:
//!
//! 1. allowed requests to the allowed host, each with a method of its own
//!    and a ~4 KiB path: lines no merging can save, enough to carry the
//!    log past its whole stream, so rotation drops the generation holding
//!    what the agent did before (the earlier probes' secret findings, the
//!    credential injection, the harness's tool call);
//! 2. denied requests with distinct ~4 KiB paths alternating between the
//!    denied host and varying denied names (which must be merged);
//! 3. after a pause longer than the bundle's merging window, a run of
//!    identical denied ones (which must be counted).
//!
//! The verdict here is only that the proxy kept refusing the denied ones;
//! whether the log stayed bounded, merged and counted, kept what came
//! before and stayed writable is read on the host by the harness
//! afterwards (`audit-*` rows).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Attempt, Ctx, Probe, contains, errno_name};
use crate::contract::{AUDIT_FLOOD_DENY_PREFIX, AUDIT_FLOOD_ROTATE_PREFIX, AUDIT_FLOOD_SAME_PATH};
use crate::net;

const CAT: &str = "audit";

/// Allowed requests at most.
pub(crate) const ROTATE_MAX: usize = 8000;
/// Distinct denied requests at most.
pub(crate) const DISTINCT_MAX: usize = 6000;
/// Identical requests at most.
pub(crate) const IDENTICAL_MAX: usize = 2000;
/// How long the allowed run may take.
const ROTATE_TIME: Duration = Duration::from_secs(30);
/// How long the distinct flood may take.
const DISTINCT_TIME: Duration = Duration::from_secs(15);
/// How long the identical run may take.
const IDENTICAL_TIME: Duration = Duration::from_secs(5);
/// The pause between the denied runs: longer than the bundle's merging
/// window (a second), so that each run's merged lines name its own paths
/// and the harness can judge the runs apart.
const BETWEEN_RUNS: Duration = Duration::from_millis(1500);
/// Keep-alive connections the allowed and distinct runs use at once.
const CONNECTIONS: usize = 4;
/// Bytes of each distinct path (the bundle keeps 1 KiB of it).
const PATH_LEN: usize = 4096;
/// Fewer allowed requests answered than this cannot carry a log at the
/// gate's 1 MiB cap past its four generations (a line of a kept 1 KiB path
/// is about 1.3 KiB).
pub(crate) const MIN_ROTATE: u64 = 4000;
/// Fewer distinct requests answered than this is no flood: 1,000 lines of
/// over 1 KiB each, unmerged, would already pass the gate's 1 MiB cap.
pub(crate) const MIN_DISTINCT: u64 = 1000;
/// Fewer identical requests answered than this gives coalescing nothing to
/// do.
pub(crate) const MIN_IDENTICAL: u64 = 100;

pub(super) fn probes() -> Vec<Probe> {
    vec![Probe::new(
        "audit-flood",
        CAT,
        false,
        format!(
            "through the proxy, at most {ROTATE_MAX} allowed requests to the allowed host, each with a method of its own and a {PATH_LEN}-byte path, within {}s; then at most {DISTINCT_MAX} denied requests with distinct {PATH_LEN}-byte paths (the denied host and varying denied names) over {CONNECTIONS} keep-alive connections within {}s; then at most {IDENTICAL_MAX} identical ones within {}s: blocked when every denied one is refused; reached if any is forwarded (2xx or the token); error when too few were answered to flood (the harness then checks the log on the host)",
            ROTATE_TIME.as_secs(),
            DISTINCT_TIME.as_secs(),
            IDENTICAL_TIME.as_secs()
        ),
        flood,
    )]
}

/// What came back from a run of requests.
#[derive(Debug, Default)]
struct Tally {
    answered: u64,
    statuses: BTreeMap<u16, u64>,
    /// A 2xx, or a reply carrying the token.
    forwarded: Option<String>,
    /// The last connection or read failure.
    failure: Option<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.answered += other.answered;
        for (s, n) in other.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.forwarded = self.forwarded.take().or(other.forwarded);
        self.failure = self.failure.take().or(other.failure);
    }

    fn statuses(&self) -> String {
        let v: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{n}x{s}"))
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(" ")
        }
    }

    /// Requests answered with a 2xx.
    fn succeeded(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|(s, _)| (200..300).contains(*s))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Runs `make(i)` for `i` below `max` over [`CONNECTIONS`] connections
/// until `time` has passed.
fn parallel(
    c: &Ctx,
    addr: SocketAddr,
    max: usize,
    time: Duration,
    make: &(dyn Fn(usize) -> Vec<u8> + Sync),
) -> Tally {
    let next = AtomicUsize::new(0);
    let total = Mutex::new(Tally::default());
    let deadline = Instant::now() + time;
    std::thread::scope(|s| {
        for _ in 0..CONNECTIONS {
            s.spawn(|| {
                let t = hammer(c, addr, &next, max, deadline, make);
                total
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .merge(t);
            });
        }
    });
    total
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn flood(c: &Ctx) -> Attempt {
    let addr = match net::proxy_addr(&c.config.targets.proxy) {
        Ok(a) => a,
        Err(e) => return Attempt::error(e),
    };
    let padding = "a".repeat(PATH_LEN);
    let padded = |prefix: &str, i: usize| {
        let path = format!("{prefix}{i}/");
        let pad = &padding[..PATH_LEN.saturating_sub(path.len())];
        format!("{path}{pad}")
    };
    let allowed = c.config.targets.allowed_host.clone();
    let rotate = |i: usize| {
        request_with(
            &format!("FLOOD{i}"),
            &allowed,
            &padded(AUDIT_FLOOD_ROTATE_PREFIX, i),
        )
    };
    let rotated = parallel(c, addr, ROTATE_MAX, ROTATE_TIME, &rotate);
    let denied = c.config.targets.denied_host.clone();
    let distinct = |i: usize| {
        let host = if i.is_multiple_of(2) {
            denied.clone()
        } else {
            format!("f{i}.{denied}")
        };
        request(&host, &padded(AUDIT_FLOOD_DENY_PREFIX, i))
    };
    let distinct = parallel(c, addr, DISTINCT_MAX, DISTINCT_TIME, &distinct);
    std::thread::sleep(BETWEEN_RUNS);
    let same_host = format!("audit-same.{denied}");
    let same = request(&same_host, AUDIT_FLOOD_SAME_PATH);
    let identical = hammer(
        c,
        addr,
        &AtomicUsize::new(0),
        IDENTICAL_MAX,
        Instant::now() + IDENTICAL_TIME,
        &|_| same.clone(),
    );
    let what = format!(
        "allowed: {} answered ({}); distinct: {} answered ({}); identical: {} answered ({})",
        rotated.answered,
        rotated.statuses(),
        distinct.answered,
        distinct.statuses(),
        identical.answered,
        identical.statuses()
    );
    judge(&rotated, &distinct, &identical, &what)
}

fn judge(rotated: &Tally, distinct: &Tally, identical: &Tally, what: &str) -> Attempt {
    if let Some(f) = distinct.forwarded.as_ref().or(identical.forwarded.as_ref()) {
        return Attempt::reached(format!("a denied request was forwarded: {f}; {what}"));
    }
    if rotated.succeeded() < MIN_ROTATE
        || distinct.answered < MIN_DISTINCT
        || identical.answered < MIN_IDENTICAL
    {
        let failure = rotated
            .failure
            .as_ref()
            .or(distinct.failure.as_ref())
            .or(identical.failure.as_ref())
            .map(|f| format!("; last failure: {f}"))
            .unwrap_or_default();
        return Attempt::error(format!(
            "could not flood (need {MIN_ROTATE} allowed answered 2xx, {MIN_DISTINCT} distinct and {MIN_IDENTICAL} identical answers): {what}{failure}"
        ));
    }
    Attempt::blocked(format!("every denied request refused: {what}"))
}

/// An absolute-form GET that keeps the connection open.
fn request(host: &str, path: &str) -> Vec<u8> {
    request_with("GET", host, path)
}

/// An absolute-form request with `method` that keeps the connection open.
fn request_with(method: &str, host: &str, path: &str) -> Vec<u8> {
    format!(
        "{method} http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bottle-probe\r\n\r\n"
    )
    .into_bytes()
}

/// Sends requests `make(i)` for indices taken from `next` (below `max`)
/// until `deadline`, one at a time on a keep-alive connection, opening a
/// new one when the proxy closes it.
fn hammer(
    c: &Ctx,
    addr: SocketAddr,
    next: &AtomicUsize,
    max: usize,
    deadline: Instant,
    make: &(dyn Fn(usize) -> Vec<u8> + Sync),
) -> Tally {
    let mut tally = Tally::default();
    let mut conn: Option<net::Conn> = None;
    let mut failures = 0;
    while Instant::now() < deadline && failures < 20 {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= max {
            break;
        }
        let mut s = match conn.take() {
            Some(s) => s,
            None => match net::connect(addr, c.timeout) {
                Ok(s) => s,
                Err(e) => {
                    tally.failure = Some(format!("proxy {addr}: {}", errno_name(&e)));
                    failures += 1;
                    continue;
                }
            },
        };
        let reply = s
            .write_all(&make(i))
            .map_err(|e| errno_name(&e))
            .and_then(|()| read_response(&mut s, Instant::now() + c.timeout));
        match reply {
            Ok(r) => {
                tally.answered += 1;
                *tally.statuses.entry(r.status).or_default() += 1;
                if (200..300).contains(&r.status) || contains(&r.bytes, &c.config.token) {
                    tally
                        .forwarded
                        .get_or_insert_with(|| super::snippet(&r.bytes));
                }
                if r.keep_alive {
                    conn = Some(s);
                }
            }
            Err(e) => {
                tally.failure = Some(e);
                failures += 1;
            }
        }
    }
    tally
}

/// One response read off a keep-alive connection.
#[derive(Debug)]
struct Response {
    status: u16,
    /// The head and body as read.
    bytes: Vec<u8>,
    /// Whether the connection may carry the next request.
    keep_alive: bool,
}

/// Reads one response: the head, then `Content-Length` bytes of body, or
/// everything until close when it has none.
fn read_response(s: &mut net::Conn, deadline: Instant) -> Result<Response, String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if got.len() > net::READ_CAP || Instant::now() >= deadline {
            return Err(format!(
                "no complete response head: {}",
                super::snippet(&got)
            ));
        }
        match s.read(&mut buf) {
            Ok(0) if got.is_empty() => return Err("the proxy closed the connection".into()),
            Ok(0) => return Err(format!("cut-off head: {}", super::snippet(&got))),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Err(errno_name(&e)),
        }
    };
    let status = net::status(&got).ok_or_else(|| format!("not HTTP: {}", super::snippet(&got)))?;
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let close = header("connection").is_some_and(|v| v.contains("close"));
    match header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(len) if len <= net::READ_CAP => {
            while got.len() < head_end + len {
                if Instant::now() >= deadline {
                    return Err("the body did not arrive in time".into());
                }
                match s.read(&mut buf) {
                    Ok(0) => return Err("the body is cut off".into()),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => return Err(errno_name(&e)),
                }
            }
            Ok(Response {
                status,
                bytes: got,
                keep_alive: !close,
            })
        }
        _ => {
            got.extend(net::read_until_close(s, deadline));
            Ok(Response {
                status,
                bytes: got,
                keep_alive: false,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(answered: u64, status: u16) -> Tally {
        Tally {
            answered,
            statuses: BTreeMap::from([(status, answered)]),
            ..Tally::default()
        }
    }

    #[test]
    fn refusals_in_number_are_blocked() {
        let a = judge(&tally(5000, 200), &tally(5000, 403), &tally(500, 403), "w");
        assert_eq!(a.outcome, crate::contract::Outcome::Blocked, "{a:?}");
    }

    #[test]
    fn one_forwarded_denied_request_is_reached() {
        let mut d = tally(5000, 403);
        d.forwarded = Some("HTTP/1.1 200 OK".into());
        let a = judge(&tally(5000, 200), &d, &tally(500, 403), "w");
        assert_eq!(a.outcome, crate::contract::Outcome::Reached, "{a:?}");
    }

    #[test]
    fn too_few_answers_are_an_error() {
        let a = judge(&tally(5000, 200), &tally(10, 403), &tally(500, 403), "w");
        assert_eq!(a.outcome, crate::contract::Outcome::Error, "{a:?}");
        let a = judge(&tally(5000, 200), &tally(5000, 403), &tally(3, 403), "w");
        assert_eq!(a.outcome, crate::contract::Outcome::Error, "{a:?}");
        // Allowed requests refused cannot fill the log.
        let a = judge(&tally(5000, 403), &tally(5000, 403), &tally(500, 403), "w");
        assert_eq!(a.outcome, crate::contract::Outcome::Error, "{a:?}");
    }

    #[test]
    fn requests_keep_the_connection_open() {
        let r = String::from_utf8(request("d.test", "/p")).unwrap();
        assert!(r.starts_with("GET http://d.test/p HTTP/1.1\r\n"), "{r}");
        assert!(!r.to_ascii_lowercase().contains("connection: close"));
        let r = String::from_utf8(request_with("FLOOD7", "a.test", "/p")).unwrap();
        assert!(r.starts_with("FLOOD7 http://a.test/p HTTP/1.1\r\n"), "{r}");
    }
}
