//! Body wrappers: secret scanning on the way out, byte counting with an
//! audit line on completion, and masking of injected secrets on the way back.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use crate::audit::{AuditLog, AuditRecord, Decision};
use crate::scan::{Finding, Scanner, StreamScanner, redacted_reason};

/// Errors carried by bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type every daemon sends.
pub type BoxBody = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body from bytes.
pub fn full(data: impl Into<Bytes>) -> BoxBody {
    http_body_util::Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> BoxBody {
    full(Bytes::new())
}

/// Boxes any compatible body.
pub fn boxed<B>(body: B) -> BoxBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// `body` with its first frame already read. Egress dials the upstream
/// only once the scan has let the body's first bytes through, so a request
/// the scan refuses at its first bytes, or whose body is broken from the
/// start, never opens an upstream connection.
pub async fn first_frame_read(mut body: BoxBody) -> Result<BoxBody, BoxError> {
    if body.is_end_stream() {
        return Ok(body);
    }
    match body.frame().await {
        None => Ok(empty()),
        Some(Err(err)) => Err(err),
        Some(Ok(frame)) => Ok(boxed(Prepended {
            first: Some(frame),
            rest: body,
        })),
    }
}

/// A frame already read, then the rest of the body it came from.
struct Prepended {
    first: Option<Frame<Bytes>>,
    rest: BoxBody,
}

impl Body for Prepended {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        Pin::new(&mut this.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let first = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |data| data.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + first);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + first);
        }
        hint
    }
}

/// What the scans of one request found, for its refusal or its audit
/// line: the secret that blocked it, or the kinds of the secrets masked in
/// it on a host that redacts.
#[derive(Debug, Default)]
pub struct Findings {
    /// The secret the request was refused for.
    pub blocked: Option<Finding>,
    /// The kinds of the secrets redacted from it.
    pub redacted: BTreeSet<&'static str>,
}

/// Where the scans of one request record what they found.
pub type FindingSlot = Arc<Mutex<Findings>>;

/// The secret `slot` says the request was refused for.
pub fn blocked(slot: &FindingSlot) -> Option<Finding> {
    slot.lock().ok().and_then(|s| s.blocked)
}

/// The error a [`ScanBody`] ends with when it sees a secret.
#[derive(Debug, thiserror::Error)]
#[error("request body blocked: it carries a secret ({kind})")]
pub struct SecretBlocked {
    /// The kind of secret.
    pub kind: &'static str,
}

/// Scans a request body as it streams and forwards only what can no longer
/// be part of a secret (see [`StreamScanner`]). A blocking scan fails the
/// stream at a secret (aborting the upstream request) and records the
/// finding, so none of the secret's bytes have left; a redacting one
/// forwards the body with each secret masked and records its kind.
pub struct ScanBody<B> {
    inner: B,
    scanner: StreamScanner,
    header_scanner: Scanner,
    up: Arc<AtomicU64>,
    finding: FindingSlot,
    client_failed: Arc<AtomicBool>,
    /// The held-back tail, once the agent's body has ended.
    tail: Option<Bytes>,
    trailers: Option<Frame<Bytes>>,
    ended: bool,
}

impl<B> ScanBody<B> {
    /// Wraps `inner`, blocking at a secret, or masking it when
    /// `redacting`. `client_failed` is set when the agent's own body stream
    /// fails (malformed chunking, reset), so the caller can answer 400
    /// rather than blame the upstream.
    pub fn new(
        inner: B,
        scanner: &Scanner,
        redacting: bool,
        up: Arc<AtomicU64>,
        finding: FindingSlot,
        client_failed: Arc<AtomicBool>,
    ) -> Self {
        Self {
            inner,
            scanner: if redacting {
                scanner.redacting_stream()
            } else {
                scanner.stream()
            },
            header_scanner: scanner.clone(),
            up,
            finding,
            client_failed,
            tail: None,
            trailers: None,
            ended: false,
        }
    }

    fn block(&self, f: Finding) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Ok(mut slot) = self.finding.lock() {
            slot.blocked.get_or_insert(f);
        }
        Poll::Ready(Some(Err(Box::new(SecretBlocked { kind: f.kind }))))
    }

    fn record_redacted(&self, kinds: &BTreeSet<&'static str>) {
        if kinds.is_empty() {
            return;
        }
        if let Ok(mut slot) = self.finding.lock() {
            slot.redacted.extend(kinds);
        }
    }

    /// The trailers as they may leave: each value scanned like a header,
    /// masked where the body is redacted; or the finding that blocks them.
    fn checked_trailers(&self, mut frame: Frame<Bytes>) -> Result<Frame<Bytes>, Finding> {
        let redacting = self.scanner.is_redacting();
        let Some(trailers) = frame.trailers_mut() else {
            return Ok(frame);
        };
        for (name, value) in trailers.iter_mut() {
            if !redacting {
                match self
                    .header_scanner
                    .scan_header(name.as_str(), value.as_bytes())
                {
                    Some(f) => return Err(f),
                    None => continue,
                }
            }
            let (masked, kinds) = self
                .header_scanner
                .redact_header(name.as_str(), value.as_bytes())?;
            if !kinds.is_empty() {
                // Masking writes letters and `*` only: always a valid value.
                if let Ok(masked) = http::HeaderValue::from_bytes(&masked) {
                    *value = masked;
                }
                self.record_redacted(&kinds);
            }
        }
        Ok(frame)
    }

    /// The agent's body is done: release the held tail, then the trailers.
    fn end(&mut self, trailers: Option<Frame<Bytes>>) {
        self.ended = true;
        self.tail = Some(self.scanner.finish()).filter(|t| !t.is_empty());
        self.trailers = trailers;
    }
}

impl<B> Body for ScanBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                if let Some(tail) = this.tail.take() {
                    return Poll::Ready(Some(Ok(Frame::data(tail))));
                }
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.up.fetch_add(data.len() as u64, Ordering::Relaxed);
                        let fed = this.scanner.feed(&data);
                        this.record_redacted(this.scanner.redacted());
                        match fed {
                            Err(f) => return this.block(f),
                            Ok(ready) if !ready.is_empty() => {
                                return Poll::Ready(Some(Ok(Frame::data(ready))));
                            }
                            // All of it is held back: read on.
                            Ok(_) => {}
                        }
                    }
                    Err(frame) => match this.checked_trailers(frame) {
                        Ok(frame) => this.end(Some(frame)),
                        Err(f) => return this.block(f),
                    },
                },
                Poll::Ready(Some(Err(e))) => {
                    this.client_failed.store(true, Ordering::Relaxed);
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => this.end(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.ended {
            self.tail.is_none() && self.trailers.is_none()
        } else {
            self.inner.is_end_stream() && self.scanner.held() == 0
        }
    }

    fn size_hint(&self) -> SizeHint {
        // What is left is what the agent has still to send plus what is
        // held back.
        let pending = if self.ended {
            self.tail.as_ref().map_or(0, Bytes::len)
        } else {
            self.scanner.held()
        } as u64;
        let inner = if self.ended {
            SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        };
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + pending);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + pending);
        }
        hint
    }
}

/// Writes one audit line when dropped: at the end of the response body, or
/// when the client goes away mid-stream.
pub struct AuditGuard {
    log: AuditLog,
    /// Taken on drop: the line is written once.
    record: Option<AuditRecord>,
    start: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    finding: FindingSlot,
}

impl AuditGuard {
    /// The count of bytes sent back to the agent, for a body other than a
    /// [`MeteredBody`] (a WebSocket's frames) to add to.
    pub fn down(&self) -> Arc<AtomicU64> {
        self.down.clone()
    }

    /// Prepares the line; byte counts and duration are filled in on drop.
    pub fn new(
        log: AuditLog,
        record: AuditRecord,
        start: Instant,
        up: Arc<AtomicU64>,
        finding: FindingSlot,
    ) -> Self {
        Self {
            log,
            record: Some(record),
            start,
            up,
            down: Arc::new(AtomicU64::new(0)),
            finding,
        }
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        let Some(mut rec) = self.record.take() else {
            return;
        };
        rec.bytes_up = self.up.load(Ordering::Relaxed);
        rec.bytes_down = self.down.load(Ordering::Relaxed);
        rec.duration_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        rec.time = bottle_core::time::now_rfc3339_millis();
        if let Ok(found) = self.finding.lock() {
            if let Some(f) = found.blocked {
                rec.decision = Decision::BlockedSecret;
                rec.reason = f.reason();
            } else if !found.redacted.is_empty() && rec.decision == Decision::Allow {
                // A redacted line keeps what else it says in its status
                // and counts; its reason names the kinds masked.
                rec.decision = Decision::Redacted;
                rec.reason = redacted_reason(&found.redacted);
            }
        }
        self.log.write(rec);
    }
}

/// Counts response bytes and holds the [`AuditGuard`] until the body ends.
pub struct MeteredBody<B> {
    inner: B,
    guard: Option<AuditGuard>,
}

impl<B> MeteredBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, guard: AuditGuard) -> Self {
        Self {
            inner,
            guard: Some(guard),
        }
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.inner).poll_frame(cx);
        match &res {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(g)) = (frame.data_ref(), &this.guard) {
                    g.down.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            Poll::Ready(None) => {
                // Log as soon as the body is done rather than when hyper
                // gets round to dropping it.
                this.guard.take();
            }
            _ => {}
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Masks every occurrence of the given secrets with `*` of the same length,
/// streaming, holding back just enough bytes to see a secret split across
/// chunks. Same length keeps `Content-Length` valid.
pub struct ScrubBody<B> {
    inner: B,
    re: Arc<regex::bytes::Regex>,
    keep: usize,
    pending: BytesMut,
    trailers: Option<Frame<Bytes>>,
    done: bool,
}

impl<B> ScrubBody<B> {
    /// Wraps `inner`; `max_len` is the longest secret.
    pub fn new(inner: B, re: Arc<regex::bytes::Regex>, max_len: usize) -> Self {
        Self {
            inner,
            re,
            keep: max_len.saturating_sub(1),
            pending: BytesMut::new(),
            trailers: None,
            done: false,
        }
    }
}

/// Masks matches of `re` in place.
pub fn mask_in_place(re: &regex::bytes::Regex, buf: &mut [u8]) -> bool {
    let spans: Vec<(usize, usize)> = re.find_iter(buf).map(|m| (m.start(), m.end())).collect();
    for (s, e) in &spans {
        buf[*s..*e].fill(b'*');
    }
    !spans.is_empty()
}

impl<B> Body for ScrubBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                if !this.pending.is_empty() {
                    let rest = this.pending.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.pending.extend_from_slice(&data);
                        mask_in_place(&this.re, &mut this.pending);
                        if this.pending.len() > this.keep {
                            let out = this.pending.split_to(this.pending.len() - this.keep);
                            return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                        }
                    }
                    Err(frame) => {
                        this.trailers = Some(frame);
                        this.done = true;
                    }
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.pending.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A body that yields the given chunks, one per poll.
    pub(crate) struct Chunks(pub std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test]
    async fn scrub_masks_secrets_across_chunks() {
        let secret = "s3cr3t-value-123";
        let re = Arc::new(regex::bytes::Regex::new(&regex::escape(secret)).unwrap());
        let text = format!("a{secret}b{secret}");
        for split in 0..text.len() {
            let chunks = Chunks(
                [
                    Bytes::copy_from_slice(&text.as_bytes()[..split]),
                    Bytes::copy_from_slice(&text.as_bytes()[split..]),
                ]
                .into(),
            );
            let body = ScrubBody::new(chunks, re.clone(), secret.len());
            let out = body.collect().await.unwrap().to_bytes();
            assert_eq!(out.len(), text.len());
            let out = String::from_utf8(out.to_vec()).unwrap();
            assert!(!out.contains(secret), "{out}");
            assert!(out.starts_with('a'));
        }
    }

    #[tokio::test]
    async fn scan_body_fails_the_stream_on_a_split_secret_before_releasing_it() {
        let scanner = crate::scan::Scanner::new().unwrap();
        let up = Arc::new(AtomicU64::new(0));
        let slot: FindingSlot = Arc::default();
        let filler = "z".repeat(1000);
        let (first, second) = (format!("{filler} data=xx AKIAZ7Q3"), "HN2XK5WJ4T6M yy");
        let sent = (first.len() + second.len()) as u64;
        let chunks = Chunks([Bytes::from(first), Bytes::from_static(second.as_bytes())].into());
        let mut body = ScanBody::new(
            chunks,
            &scanner,
            false,
            up.clone(),
            slot.clone(),
            Arc::default(),
        );
        let mut released = Vec::new();
        let err = loop {
            match body.frame().await {
                Some(Ok(frame)) => released.extend_from_slice(frame.data_ref().unwrap()),
                Some(Err(e)) => break e,
                None => panic!("the body ended without a finding"),
            }
        };
        assert!(err.is::<SecretBlocked>(), "{err}");
        assert_eq!(blocked(&slot).map(|f| f.kind), Some("aws_access_key_id"));
        assert_eq!(up.load(Ordering::Relaxed), sent);
        let released = String::from_utf8(released).unwrap();
        assert!(!released.contains('A'), "{released}");
        assert!(released.starts_with("zzz"), "the filler did stream");
    }

    #[tokio::test]
    async fn scan_body_passes_a_clean_body_whole() {
        let scanner = crate::scan::Scanner::new().unwrap();
        let text: Vec<u8> = b"hello clean world ".repeat(100);
        for redacting in [false, true] {
            let chunks = Chunks(text.chunks(37).map(Bytes::copy_from_slice).collect());
            let body = ScanBody::new(
                chunks,
                &scanner,
                redacting,
                Arc::default(),
                Arc::default(),
                Arc::default(),
            );
            let out = body.collect().await.unwrap().to_bytes();
            assert_eq!(out.as_ref(), text.as_slice());
        }
    }

    #[tokio::test]
    async fn a_redacting_scan_body_masks_a_split_secret_and_records_its_kind() {
        let scanner = crate::scan::Scanner::new().unwrap();
        let slot: FindingSlot = Arc::default();
        let filler = "z".repeat(1000);
        let text = format!("{filler} data=xx AKIAZ7Q3HN2XK5WJ4T6M yy");
        let at = text.find("AKIA").unwrap();
        let chunks = Chunks(
            [
                Bytes::copy_from_slice(&text.as_bytes()[..at + 8]),
                Bytes::copy_from_slice(&text.as_bytes()[at + 8..]),
            ]
            .into(),
        );
        let body = ScanBody::new(
            chunks,
            &scanner,
            true,
            Arc::default(),
            slot.clone(),
            Arc::default(),
        );
        let out = body.collect().await.unwrap().to_bytes();
        let expected = format!("{filler} data=xx REDACTED************ yy");
        assert_eq!(String::from_utf8_lossy(&out), expected);
        let found = slot.lock().unwrap();
        assert_eq!(found.blocked, None);
        assert_eq!(
            found.redacted.iter().copied().collect::<Vec<_>>(),
            ["aws_access_key_id"]
        );
    }
}
