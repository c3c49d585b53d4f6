//! `bottle-toolbox connect PORT`: the in-box end of a published port
//! (`bottle_core::port_relay`).
//!
//! It connects to `PORT` on the box's loopback (`127.0.0.1`, then `::1`
//! for a server that listens only there), says so on its first stdout line
//! ([`CONNECTED`], or [`NOT_CONNECTED`] and why, then exits), and copies
//! stdin to the connection and the connection to stdout. The end of stdin
//! (the host's client closed) shuts down the connection's sending side and
//! the relay goes on until the server closes; the server closing ends it,
//! and so does no byte either way for [`IDLE`] (the host's forwarder has
//! the same bound), so no relay outlives a connection nobody uses.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bottle_core::port_relay::{CONNECTED, NOT_CONNECTED};

/// How long a connect to the box's own loopback may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
/// A connection that carries no byte either way for this long ends.
const IDLE: Duration = Duration::from_secs(600);
/// How often a read from the server wakes to check [`IDLE`].
const CHECK_EVERY: Duration = Duration::from_secs(15);

/// When a byte last moved either way, in milliseconds since `origin`.
struct Activity {
    origin: Instant,
    last: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    fn idle(&self) -> bool {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(now.saturating_sub(self.last.load(Ordering::Relaxed))) >= IDLE
    }
}

/// Relays one connection to `port`; its exit code says whether it
/// connected.
pub(crate) fn connect(port: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else {
        let _ = writeln!(stdout, "{NOT_CONNECTED}{port:?} is not a port");
        let _ = stdout.flush();
        return ExitCode::from(2);
    };
    let stream = match dial(port) {
        Ok(stream) => stream,
        Err(err) => {
            let _ = writeln!(
                stdout,
                "{NOT_CONNECTED}nothing in the box accepts connections on port {port} ({err})"
            );
            let _ = stdout.flush();
            return ExitCode::FAILURE;
        }
    };
    if writeln!(stdout, "{CONNECTED}")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    let _ = stream.set_nodelay(true);
    let Ok(mut to_server) = stream.try_clone() else {
        return ExitCode::FAILURE;
    };
    let activity = Arc::new(Activity {
        origin: Instant::now(),
        last: AtomicU64::new(0),
    });
    // stdin → server, on its own thread: its end shuts down our sending
    // side, and the server's answer still comes back.
    {
        let activity = Arc::clone(&activity);
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let _ = copy(&mut stdin, &mut to_server, &activity);
            let _ = to_server.shutdown(Shutdown::Write);
        });
    }
    let mut from_server = stream;
    if from_server.set_read_timeout(Some(CHECK_EVERY)).is_err() {
        return ExitCode::FAILURE;
    }
    let _ = copy(&mut from_server, &mut stdout, &activity);
    // The server closed, stdout is gone, or nothing moved for IDLE: the
    // connection is over.
    ExitCode::SUCCESS
}

/// Connects to `port` on IPv4 loopback, then IPv6 loopback; the error is
/// the first one's.
fn dial(port: u16) -> std::io::Result<TcpStream> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&v4, CONNECT_WITHIN)
        .or_else(|first| TcpStream::connect_timeout(&v6, CONNECT_WITHIN).map_err(|_| first))
}

/// Copies until the reader ends, or times out once the connection has
/// been idle for [`IDLE`], flushing each chunk so no byte waits in a
/// buffer while the other side waits for it.
fn copy(from: &mut dyn Read, to: &mut dyn Write, activity: &Activity) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err)
                if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
                    && !activity.idle() =>
            {
                continue;
            }
            Err(err) => return Err(err),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
        activity.touch();
    }
}
