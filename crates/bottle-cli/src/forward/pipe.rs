//! One forwarded connection, copied both ways: the client's socket on one
//! side, the far side's two halves on the other (the in-box relay's
//! stdin and stdout, or the host service's connection). The end of each
//! direction is passed on as a half-close; the far side's end, or no byte
//! either way for the idle bound, ends the connection.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a blocked read wakes to check the idle bound.
const CHECK_EVERY: Duration = Duration::from_secs(15);

/// A connected socket the forwarders accept on.
pub(crate) trait Socket: Read + Write + Send + Sized + 'static {
    /// Another handle to the same socket.
    fn duplicate(&self) -> io::Result<Self>;
    /// `shutdown(2)`.
    fn close(&self, how: Shutdown) -> io::Result<()>;
    /// Read and write timeouts.
    fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()>;
}

impl Socket for TcpStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
    fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(read))?;
        self.set_write_timeout(Some(write))
    }
}

impl Socket for UnixStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
    fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(read))?;
        self.set_write_timeout(Some(write))
    }
}

/// A TCP connection's sending half: dropping it shuts the sending side
/// down, so the far end sees the client's end of input.
pub(crate) struct SendHalf(pub TcpStream);

impl Write for SendHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Drop for SendHalf {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

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

    fn idle_for(&self) -> Duration {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(now.saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Copies `client` to `to` and `from` to `client` until the far side ends,
/// either side fails, or nothing moves for `idle`; returns the bytes from
/// the client and to it. Dropping `to` tells the far side the client's
/// input ended.
pub(crate) fn splice<S: Socket>(
    client: S,
    to: Box<dyn Write + Send>,
    mut from: Box<dyn Read + Send>,
    idle: Duration,
) -> (u64, u64) {
    let activity = Arc::new(Activity {
        origin: Instant::now(),
        last: AtomicU64::new(0),
    });
    let check = idle.min(CHECK_EVERY);
    if client.set_timeouts(check, idle).is_err() {
        return (0, 0);
    }
    let Ok(mut reader) = client.duplicate() else {
        return (0, 0);
    };
    let up = {
        let activity = Arc::clone(&activity);
        std::thread::spawn(move || {
            let mut to = to;
            let mut buf = vec![0u8; 16 * 1024];
            let mut sent = 0u64;
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
                            break;
                        }
                        sent += n as u64;
                        activity.touch();
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) if is_timeout(&err) && activity.idle_for() < idle => {}
                    Err(_) => {
                        let _ = reader.close(Shutdown::Both);
                        break;
                    }
                }
            }
            // The far side sees the end of the client's input.
            drop(to);
            sent
        })
    };
    let mut client = client;
    let mut buf = vec![0u8; 16 * 1024];
    let mut received = 0u64;
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
                received += n as u64;
                activity.touch();
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if is_timeout(&err) && activity.idle_for() < idle => {}
            Err(_) => break,
        }
    }
    // The far side is done: so is the connection, whichever way the
    // client still meant to send.
    let _ = client.close(Shutdown::Both);
    let sent = up.join().unwrap_or(0);
    (sent, received)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A far side that echoes with a prefix once its input ends, over a
    /// real socket pair.
    #[test]
    fn both_ways_with_half_closes_and_counted() {
        let (client_near, mut client_far) = UnixStream::pair().unwrap();
        let (relay_near, relay_far) = UnixStream::pair().unwrap();
        let far = std::thread::spawn(move || {
            let mut relay_far = relay_far;
            let mut got = Vec::new();
            relay_far.read_to_end(&mut got).unwrap();
            relay_far.write_all(b"said: ").unwrap();
            relay_far.write_all(&got).unwrap();
        });
        let to: Box<dyn Write + Send> = Box::new(HalfUnix(relay_near.try_clone().unwrap()));
        let from: Box<dyn Read + Send> = Box::new(relay_near);
        let spliced =
            std::thread::spawn(move || splice(client_near, to, from, Duration::from_secs(10)));
        client_far.write_all(b"hello").unwrap();
        client_far.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        client_far.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"said: hello");
        far.join().unwrap();
        assert_eq!(spliced.join().unwrap(), (5, 11));
    }

    #[test]
    fn an_idle_connection_is_closed() {
        let (client_near, mut client_far) = UnixStream::pair().unwrap();
        let (relay_near, _relay_far) = UnixStream::pair().unwrap();
        relay_near
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let to: Box<dyn Write + Send> = Box::new(HalfUnix(relay_near.try_clone().unwrap()));
        let from: Box<dyn Read + Send> = Box::new(relay_near);
        let started = Instant::now();
        let moved = splice(client_near, to, from, Duration::from_millis(300));
        assert_eq!(moved, (0, 0));
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut rest = Vec::new();
        assert_eq!(client_far.read_to_end(&mut rest).unwrap(), 0);
    }

    struct HalfUnix(UnixStream);

    impl Write for HalfUnix {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Drop for HalfUnix {
        fn drop(&mut self) {
            let _ = self.0.shutdown(Shutdown::Write);
        }
    }
}
