//! Byte-stream wrappers: an idle timeout, a "put these bytes back" prefix,
//! and a read buffer for the streams rustls reads.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Fails reads and writes with `TimedOut` once no byte has moved in either
/// direction for `timeout`, so a stalled peer cannot pin a connection (and
/// its slot under `max_connections`) forever.
#[derive(Debug)]
pub struct IdleIo<T> {
    inner: T,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<T> IdleIo<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn progress(&mut self) {
        let next = Instant::now() + self.timeout;
        // Resetting a timer costs a syscall-free clock read; only do it when
        // the deadline would move noticeably.
        if next.saturating_duration_since(self.deadline.deadline()) > Duration::from_millis(50) {
            self.deadline.as_mut().reset(next);
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle for too long",
            )),
            Poll::Pending => Ok(()),
        }
    }

    /// What the inner stream answered, seen by the idle timer: `moved` bytes
    /// push the deadline out; a pending call fails once it has passed.
    fn observe<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<R>>,
        moved: bool,
    ) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(Ok(r)) => {
                if moved {
                    self.progress();
                }
                Poll::Ready(Ok(r))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.check(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        this.observe(cx, poll, moved)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, data);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        this.observe(cx, poll, moved)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        this.observe(cx, poll, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Replays `prefix` before reading from `inner` (bytes read to sniff the
/// protocol are handed back to whoever parses the stream).
#[derive(Debug)]
pub struct Prefixed<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Prefixed<T> {
    /// Wraps `inner`.
    pub fn new(prefix: Bytes, inner: T) -> Self {
        Self { prefix, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

/// `AsyncWrite` for a wrapper that only changes how its stream is read:
/// every write, flush and shutdown goes straight to `inner`.
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<T: AsyncWrite + Unpin> AsyncWrite for $wrapper<T> {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                data: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}

write_through!(Prefixed);

/// How much [`ReadBuffered`] asks of the stream per read.
const READ_BUFFER: usize = 64 * 1024;

/// Reads `inner` up to 64 KiB at a time and hands the bytes out
/// in whatever pieces the reader asks for.
///
/// rustls asks its socket for 4 KiB per read, so a 16 KiB record costs
/// four or five system calls; under this buffer a bulk stream costs one per
/// 64 KiB. The buffer is dropped whenever it is empty and the stream has
/// nothing more, so an idle connection holds no memory for it.
#[derive(Debug)]
pub struct ReadBuffered<T> {
    inner: T,
    buf: BytesMut,
}

impl<T> ReadBuffered<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadBuffered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            if out.remaining() >= READ_BUFFER {
                // A reader that asks for as much as the buffer holds gains
                // nothing from a copy.
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            this.buf.reserve(READ_BUFFER);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.buf) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    this.buf = BytesMut::new();
                    return Poll::Pending;
                }
            }
        }
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

write_through!(ReadBuffered);

impl<T: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for ReadBuffered<T>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn read_buffered_hands_out_every_byte_in_order_in_small_reads() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (mut tx, rx) = tokio::io::duplex(8 * 1024);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            tx.write_all(&sent).await.unwrap();
        });
        let mut reader = ReadBuffered::new(rx);
        let mut got = Vec::new();
        let mut piece = [0u8; 4096];
        loop {
            let n = reader.read(&mut piece).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&piece[..n]);
        }
        writer.await.unwrap();
        assert_eq!(got, data);
    }

    #[tokio::test]
    async fn read_buffered_holds_no_buffer_while_the_stream_is_idle() {
        let (mut tx, rx) = tokio::io::duplex(8 * 1024);
        let mut reader = ReadBuffered::new(rx);
        tx.write_all(b"hello").await.unwrap();
        let mut piece = [0u8; 16];
        assert_eq!(reader.read(&mut piece).await.unwrap(), 5);
        assert!(
            reader.buf.capacity() > 0,
            "the read went through the buffer"
        );
        // Nothing more to read: one poll is pending and lets the buffer go.
        let pending = std::future::poll_fn(|cx| {
            let mut out = ReadBuf::new(&mut piece);
            Poll::Ready(Pin::new(&mut reader).poll_read(cx, &mut out).is_pending())
        })
        .await;
        assert!(pending);
        assert_eq!(reader.buf.capacity(), 0);
        drop(tx);
    }
}
