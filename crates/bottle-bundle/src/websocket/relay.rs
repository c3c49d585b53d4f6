//! The frames of one WebSocket, relayed both ways once both sides have
//! switched protocols.
//!
//! What the agent sends is parsed, unmasked and scanned message by message
//! with the same hold-back as a request body (a secret split across the
//! frames of a message is caught before any byte of it leaves): the relay
//! forwards only what the scan released, as frames of its own, masked
//! afresh. A secret closes the socket (1008) on a host that blocks, or is
//! masked on one that redacts. What the upstream sends is relayed frame by
//! frame as it came. Frames the protocol forbids (1002), a message over the
//! bound (1009) and a socket idle in both directions (1001) end it too.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::Mutex;

use super::frame::{
    Head, MAX_CONTROL_PAYLOAD, Opcode, Violation, apply_mask, close_payload, read_head, write_head,
};
use crate::body::FindingSlot;
use crate::scan::{Finding, Scanner, StreamScanner};

/// How much of a payload is read (and scanned) at a time.
const CHUNK: u64 = 64 * 1024;

/// A writer both directions may write whole frames to.
type Shared<W> = Arc<Mutex<W>>;

/// How one direction of the socket ended.
#[derive(Debug)]
enum End {
    /// Its peer closed the stream.
    Eof,
    /// The relay closed the socket (it has written the close frames).
    Closed,
    /// The stream failed.
    Failed,
}

/// One WebSocket's relay: what scans the agent's messages and what it
/// counts and records.
pub(crate) struct Relay {
    /// The patterns.
    pub scanner: Scanner,
    /// Mask secrets instead of closing the socket.
    pub redacting: bool,
    /// Where a secret (or a redaction) is recorded for the audit line.
    pub findings: FindingSlot,
    /// Payload bytes the agent sent.
    pub up: Arc<AtomicU64>,
    /// Payload bytes relayed to the agent.
    pub down: Arc<AtomicU64>,
    /// The largest message the agent may send.
    pub max_message: u64,
    /// How long the socket may carry nothing either way.
    pub idle: Duration,
}

/// When a frame last moved, in milliseconds since the relay started.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

impl Relay {
    /// Relays until either side ends the socket, the relay closes it, or
    /// it is idle for too long.
    pub(crate) async fn run<A, U>(self, agent: A, upstream: U)
    where
        A: AsyncRead + AsyncWrite + Send + 'static,
        U: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (agent_r, agent_w) = tokio::io::split(agent);
        let (up_r, up_w) = tokio::io::split(upstream);
        let agent_w: Shared<WriteHalf<A>> = Arc::new(Mutex::new(agent_w));
        let up_w: Shared<WriteHalf<U>> = Arc::new(Mutex::new(up_w));
        let activity = Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        });
        let idle = self.idle;
        let this = Arc::new(self);
        let mut from_agent = tokio::spawn(this.clone().from_agent(
            agent_r,
            up_w.clone(),
            agent_w.clone(),
            activity.clone(),
        ));
        let mut from_upstream = tokio::spawn(this.clone().from_upstream(
            up_r,
            agent_w.clone(),
            up_w.clone(),
            activity.clone(),
        ));
        let (mut agent_done, mut upstream_done) = (false, false);
        while !(agent_done && upstream_done) {
            let check = idle.min(Duration::from_secs(1));
            tokio::select! {
                end = &mut from_agent, if !agent_done => {
                    agent_done = true;
                    if matches!(end, Ok(End::Eof)) {
                        // The agent is done sending: so is the relay.
                        let _ = up_w.lock().await.shutdown().await;
                        continue;
                    }
                    break;
                }
                end = &mut from_upstream, if !upstream_done => {
                    upstream_done = true;
                    if matches!(end, Ok(End::Eof)) {
                        let _ = agent_w.lock().await.shutdown().await;
                        continue;
                    }
                    break;
                }
                () = tokio::time::sleep(check) => {
                    if activity.idle_for() >= idle {
                        let payload = close_payload(1001, "bottle: the WebSocket was idle too long");
                        let _ = send(&agent_w, Opcode::Close, &payload, None).await;
                        let _ = send(&up_w, Opcode::Close, &payload, Some(this.mask_key())).await;
                        break;
                    }
                }
            }
        }
        from_agent.abort();
        from_upstream.abort();
        let _ = agent_w.lock().await.shutdown().await;
        let _ = up_w.lock().await.shutdown().await;
    }

    /// A fresh masking key for a frame the relay sends upstream.
    fn mask_key(&self) -> [u8; 4] {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(self.up.load(Ordering::Relaxed));
        let bits = h.finish();
        [
            bits as u8,
            (bits >> 8) as u8,
            (bits >> 16) as u8,
            (bits >> 24) as u8,
        ]
    }

    /// Ends the socket for a violation on the agent's side: the agent is
    /// told why, the upstream only that the socket closes.
    async fn refuse<AW, UW>(
        &self,
        agent_w: &Shared<AW>,
        up_w: &Shared<UW>,
        code: u16,
        reason: &str,
    ) -> End
    where
        AW: AsyncWrite + Unpin,
        UW: AsyncWrite + Unpin,
    {
        let _ = send(agent_w, Opcode::Close, &close_payload(code, reason), None).await;
        let _ = send(
            up_w,
            Opcode::Close,
            &close_payload(code, ""),
            Some(self.mask_key()),
        )
        .await;
        End::Closed
    }

    fn record(&self, stream: &StreamScanner) {
        if stream.redacted().is_empty() {
            return;
        }
        if let Ok(mut found) = self.findings.lock() {
            found.redacted.extend(stream.redacted());
        }
    }

    async fn secret<AW, UW>(&self, agent_w: &Shared<AW>, up_w: &Shared<UW>, f: Finding) -> End
    where
        AW: AsyncWrite + Unpin,
        UW: AsyncWrite + Unpin,
    {
        if let Ok(mut found) = self.findings.lock() {
            found.blocked.get_or_insert(f);
        }
        let reason = format!(
            "bottle: a message carried what looks like a credential ({})",
            f.reason()
        );
        self.refuse(agent_w, up_w, 1008, &reason).await
    }

    /// The agent's frames: parsed, unmasked, scanned, sent on re-framed.
    async fn from_agent<A, UW, AW>(
        self: Arc<Self>,
        mut r: ReadHalf<A>,
        up_w: Shared<UW>,
        agent_w: Shared<AW>,
        activity: Arc<Activity>,
    ) -> End
    where
        A: AsyncRead,
        UW: AsyncWrite + Unpin,
        AW: AsyncWrite + Unpin,
    {
        // The message in progress: its scan, its opcode until a frame of
        // it went out, its length so far.
        let mut message: Option<(StreamScanner, Option<Opcode>, u64)> = None;
        loop {
            let head = match read_head(&mut r).await {
                Ok(None) => return End::Eof,
                Ok(Some(Ok(head))) => head,
                Ok(Some(Err(v))) => {
                    return self.refuse(&agent_w, &up_w, v.code(), &v.to_string()).await;
                }
                Err(_) => return End::Failed,
            };
            activity.touch();
            let Some(mask) = head.mask else {
                let v = Violation::Protocol("a client frame without a mask");
                return self.refuse(&agent_w, &up_w, v.code(), &v.to_string()).await;
            };
            self.up.fetch_add(head.len, Ordering::Relaxed);
            if head.opcode.is_control() {
                let mut payload = vec![0; head.len.min(MAX_CONTROL_PAYLOAD) as usize];
                if r.read_exact(&mut payload).await.is_err() {
                    return End::Failed;
                }
                apply_mask(&mut payload, mask, 0);
                // A ping or a close reason is text the agent chose too.
                let mut stream = self.stream();
                let mut out = match stream.feed(&payload) {
                    Ok(out) => out.to_vec(),
                    Err(f) => return self.secret(&agent_w, &up_w, f).await,
                };
                out.extend_from_slice(&stream.finish());
                self.record(&stream);
                if send(&up_w, head.opcode, &out, Some(self.mask_key()))
                    .await
                    .is_err()
                {
                    return End::Failed;
                }
                continue;
            }
            let (stream, first, so_far) = match (&mut message, head.opcode) {
                (None, Opcode::Text | Opcode::Binary) => {
                    message.insert((self.stream(), Some(head.opcode), 0))
                }
                (Some(m), Opcode::Continuation) => m,
                _ => {
                    let v = Violation::Protocol("a data frame out of its message's order");
                    return self.refuse(&agent_w, &up_w, v.code(), &v.to_string()).await;
                }
            };
            *so_far += head.len;
            if *so_far > self.max_message {
                let v = Violation::TooBig(self.max_message);
                return self.refuse(&agent_w, &up_w, v.code(), &v.to_string()).await;
            }
            let mut read = 0;
            while read < head.len {
                let n = (head.len - read).min(CHUNK);
                let mut chunk = vec![0; n as usize];
                if r.read_exact(&mut chunk).await.is_err() {
                    return End::Failed;
                }
                apply_mask(&mut chunk, mask, read);
                read += n;
                activity.touch();
                let ready = match stream.feed(&chunk) {
                    Ok(ready) => ready,
                    Err(f) => return self.secret(&agent_w, &up_w, f).await,
                };
                self.record(stream);
                if !ready.is_empty() {
                    let opcode = first.take().unwrap_or(Opcode::Continuation);
                    if send_data(&up_w, opcode, false, &ready, self.mask_key())
                        .await
                        .is_err()
                    {
                        return End::Failed;
                    }
                }
            }
            if head.fin {
                let tail = stream.finish();
                let opcode = first.take().unwrap_or(Opcode::Continuation);
                message = None;
                if send_data(&up_w, opcode, true, &tail, self.mask_key())
                    .await
                    .is_err()
                {
                    return End::Failed;
                }
            }
        }
    }

    /// The upstream's frames, relayed as they came, one whole frame at a
    /// time so that a close the relay sends lands between two.
    async fn from_upstream<U, AW, UW>(
        self: Arc<Self>,
        mut r: ReadHalf<U>,
        agent_w: Shared<AW>,
        up_w: Shared<UW>,
        activity: Arc<Activity>,
    ) -> End
    where
        U: AsyncRead,
        AW: AsyncWrite + Unpin,
        UW: AsyncWrite + Unpin,
    {
        loop {
            let head = match read_head(&mut r).await {
                Ok(None) => return End::Eof,
                Ok(Some(Ok(head))) => head,
                Ok(Some(Err(v))) => {
                    let _ = send(
                        &up_w,
                        Opcode::Close,
                        &close_payload(v.code(), ""),
                        Some(self.mask_key()),
                    )
                    .await;
                    let reason = format!("bottle: the upstream broke the WebSocket protocol ({v})");
                    let _ =
                        send(&agent_w, Opcode::Close, &close_payload(1011, &reason), None).await;
                    return End::Closed;
                }
                Err(_) => return End::Failed,
            };
            activity.touch();
            let mut w = agent_w.lock().await;
            if w.write_all(&write_head(&head)).await.is_err() {
                return End::Failed;
            }
            let mut left = head.len;
            let mut buf = vec![0; head.len.min(CHUNK) as usize];
            while left > 0 {
                let n = left.min(CHUNK) as usize;
                if r.read_exact(&mut buf[..n]).await.is_err()
                    || w.write_all(&buf[..n]).await.is_err()
                {
                    return End::Failed;
                }
                left -= n as u64;
                activity.touch();
            }
            if w.flush().await.is_err() {
                return End::Failed;
            }
            self.down.fetch_add(head.len, Ordering::Relaxed);
        }
    }

    fn stream(&self) -> StreamScanner {
        if self.redacting {
            self.scanner.redacting_stream()
        } else {
            self.scanner.stream()
        }
    }
}

/// Writes one whole frame; `mask` masks it (frames to the upstream).
async fn send<W: AsyncWrite + Unpin>(
    w: &Shared<W>,
    opcode: Opcode,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) -> io::Result<()> {
    let head = Head {
        fin: true,
        opcode,
        mask,
        len: payload.len() as u64,
    };
    write_frame(w, &head, payload).await
}

/// Writes one data frame of a message to the upstream, masked with `key`.
async fn send_data<W: AsyncWrite + Unpin>(
    w: &Shared<W>,
    opcode: Opcode,
    fin: bool,
    payload: &[u8],
    key: [u8; 4],
) -> io::Result<()> {
    let head = Head {
        fin,
        opcode,
        mask: Some(key),
        len: payload.len() as u64,
    };
    write_frame(w, &head, payload).await
}

async fn write_frame<W: AsyncWrite + Unpin>(
    w: &Shared<W>,
    head: &Head,
    payload: &[u8],
) -> io::Result<()> {
    let mut frame = write_head(head);
    let at = frame.len();
    frame.extend_from_slice(payload);
    if let Some(key) = head.mask {
        apply_mask(&mut frame[at..], key, 0);
    }
    let mut w = w.lock().await;
    w.write_all(&frame).await?;
    w.flush().await
}
