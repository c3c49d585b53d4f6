//! What one client may hold of the server: how long a request's head may
//! take, how long a connection may sit idle, and how many connections the
//! server holds at once. Only the server's own uid can connect, but a
//! client that stops half-way (a crashed orchestrator, a stuck thread)
//! must not pin the server's descriptors and tasks for ever.
//!
//! hyper's own `header_read_timeout` starts when the server begins waiting
//! for a request, so it would also close a keep-alive connection after
//! the head's (short) bound. The two bounds are kept apart here instead:
//! the connection's stream is wrapped ([`Watched`]) to see when bytes move,
//! the service marks when a request is being answered ([`Activity::begin`]),
//! and a watchdog ([`watch`]) ends a connection that passes either bound.
//! A request being answered (a long tool call) is neither.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// From a request's first byte to its complete head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may stay with no request being answered and no
/// byte moving either way (a keep-alive connection between requests, a
/// client that stopped reading its answer).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// From a request's complete head to its complete body (80 MiB over a
/// local socket takes well under a second).
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections held at once; the next waits in the socket's backlog until
/// one closes.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// The bounds [`watch`] enforces (the constants above, shorter in tests).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub head: Duration,
    pub idle: Duration,
}

/// The server's bounds.
pub(crate) const BOUNDS: Bounds = Bounds {
    head: HEAD_TIMEOUT,
    idle: IDLE_TIMEOUT,
};

/// What a connection is doing, as its stream and its service see it.
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests being answered (the service called, its answer not yet
    /// made).
    answering: AtomicUsize,
    times: Mutex<Times>,
}

#[derive(Debug)]
struct Times {
    /// The first byte of a request whose head is not complete yet.
    head_started: Option<Instant>,
    /// The last byte moved, or the last answer made.
    last: Instant,
}

impl Activity {
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            answering: AtomicUsize::new(0),
            times: Mutex::new(Times {
                head_started: None,
                last: Instant::now(),
            }),
        })
    }

    fn times(&self) -> MutexGuard<'_, Times> {
        match self.times.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Bytes arrived: the start of a head when no request is being answered
    /// and none had started.
    fn read(&self) {
        let answering = self.answering.load(Ordering::SeqCst) > 0;
        let mut times = self.times();
        let now = Instant::now();
        if !answering && times.head_started.is_none() {
            times.head_started = Some(now);
        }
        times.last = now;
    }

    fn wrote(&self) {
        self.times().last = Instant::now();
    }

    /// A request's head is complete and its answer begins; the answer ends
    /// when the returned guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> Answering {
        self.answering.fetch_add(1, Ordering::SeqCst);
        self.times().head_started = None;
        Answering(Arc::clone(self))
    }

    /// Why the connection has passed a bound at `now`, if it has.
    fn expired(&self, bounds: Bounds, now: Instant) -> Option<&'static str> {
        if self.answering.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let times = self.times();
        match times.head_started {
            Some(started) if now.duration_since(started) >= bounds.head => {
                Some("its request head took too long")
            }
            Some(_) => None,
            None if now.duration_since(times.last) >= bounds.idle => Some("it was idle"),
            None => None,
        }
    }
}

/// One request being answered; dropping it ends the answer.
#[derive(Debug)]
pub(crate) struct Answering(Arc<Activity>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::SeqCst);
        self.0.times().last = Instant::now();
    }
}

/// A connection's stream, noting in its [`Activity`] when bytes move.
#[derive(Debug)]
pub(crate) struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How often the watchdog looks: a bound is enforced within this much of
/// its time.
const TICK: Duration = Duration::from_millis(250);

/// Runs `connection` until it ends, or until it passes a bound of
/// `bounds`: then it is dropped, which closes the socket, and the reason is
/// returned.
pub(crate) async fn watch<F: Future>(
    connection: F,
    activity: Arc<Activity>,
    bounds: Bounds,
) -> Result<F::Output, &'static str> {
    let watchdog = async {
        loop {
            tokio::time::sleep(TICK).await;
            if let Some(why) = activity.expired(bounds, Instant::now()) {
                return why;
            }
        }
    };
    tokio::select! {
        out = connection => Ok(out),
        why = watchdog => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    const SHORT: Bounds = Bounds {
        head: Duration::from_millis(300),
        idle: Duration::from_millis(900),
    };

    #[test]
    fn the_bounds_are_what_the_docs_say() {
        assert_eq!(HEAD_TIMEOUT, Duration::from_secs(10));
        assert_eq!(IDLE_TIMEOUT, Duration::from_secs(60));
        assert_eq!(BODY_TIMEOUT, Duration::from_secs(60));
        assert_eq!(MAX_CONNECTIONS, 64);
    }

    #[test]
    fn a_started_head_expires_before_an_idle_connection_and_an_answer_never() {
        let activity = Activity::new();
        let t0 = Instant::now();
        assert_eq!(activity.expired(SHORT, t0), None);
        assert_eq!(
            activity.expired(SHORT, t0 + SHORT.idle),
            Some("it was idle")
        );
        activity.read();
        let t1 = Instant::now();
        assert_eq!(activity.expired(SHORT, t1), None);
        assert_eq!(
            activity.expired(SHORT, t1 + SHORT.head),
            Some("its request head took too long")
        );
        let answering = activity.begin();
        // Body bytes while answering are no new head, and a long answer is
        // not idle.
        activity.read();
        assert_eq!(activity.expired(SHORT, t1 + 10 * SHORT.idle), None);
        drop(answering);
        let t2 = Instant::now();
        assert_eq!(activity.expired(SHORT, t2 + SHORT.head), None);
        assert_eq!(
            activity.expired(SHORT, t2 + SHORT.idle),
            Some("it was idle")
        );
    }

    #[tokio::test]
    async fn a_half_sent_head_and_an_idle_connection_are_closed_and_a_busy_one_is_not() {
        // A stream that only ever waits: the connection never ends on its own.
        let run = |bounds: Bounds, send: &'static [u8], busy: bool| async move {
            let (mut client, server) = tokio::io::duplex(1024);
            let activity = Activity::new();
            let mut watched = Watched::new(server, Arc::clone(&activity));
            let answering = busy.then(|| activity.begin());
            client.write_all(send).await.unwrap();
            let connection = async move {
                let mut buf = [0u8; 64];
                loop {
                    if watched.read(&mut buf).await.unwrap() == 0 {
                        std::future::pending::<()>().await;
                    }
                }
            };
            let started = Instant::now();
            let outcome =
                tokio::time::timeout(Duration::from_secs(3), watch(connection, activity, bounds))
                    .await;
            drop(answering);
            (outcome, started.elapsed())
        };
        let (half, took) = run(SHORT, b"GET /v1/health HTTP/1.1\r\nHo", false).await;
        assert_eq!(half.unwrap().unwrap_err(), "its request head took too long");
        assert!(took < SHORT.idle, "{took:?}");
        let (idle, took) = run(SHORT, b"", false).await;
        assert_eq!(idle.unwrap().unwrap_err(), "it was idle");
        assert!(took >= SHORT.idle, "{took:?}");
        let (busy, _) = run(SHORT, b"", true).await;
        assert!(busy.is_err(), "a request being answered is never cut");
    }
}
