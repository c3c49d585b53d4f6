//! A body scanned as it streams: which bytes may be forwarded.

use std::collections::BTreeSet;

use bytes::{Bytes, BytesMut};

use super::rules::Tail;
use super::{Finding, Scanner, mask};

/// Scans a body chunk by chunk and says which bytes may be forwarded: all
/// but the last [`Scanner::window`] bytes seen, which could still begin a
/// secret that the next chunk completes.
///
/// Blocking, it fails at the first secret. Redacting, it masks each secret
/// in the bytes it holds before releasing them; a secret whose token runs
/// into the next chunk goes on being masked there, byte by byte, until the
/// token ends.
#[derive(Debug, Clone)]
pub struct StreamScanner {
    scanner: Scanner,
    redacting: bool,
    held: BytesMut,
    /// The tail of a secret masked up to the end of the last chunk.
    open: Option<Tail>,
    redacted: BTreeSet<&'static str>,
}

impl StreamScanner {
    pub(super) fn new(scanner: Scanner, redacting: bool) -> Self {
        let held = BytesMut::with_capacity(scanner.window());
        Self {
            scanner,
            redacting,
            held,
            open: None,
            redacted: BTreeSet::new(),
        }
    }

    /// Feeds the next chunk. Returns the bytes that are now safe to forward
    /// (possibly none), or, blocking, the finding as soon as one is seen,
    /// in which case nothing of the secret has been returned before.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Bytes, Finding> {
        // Held bytes plus the chunk: every match that ends in this chunk
        // starts at most `window` bytes before it, so it lies wholly in here.
        let mut seen = BytesMut::with_capacity(self.held.len() + chunk.len());
        seen.extend_from_slice(&self.held);
        let fresh = seen.len();
        seen.extend_from_slice(chunk);
        if self.redacting {
            if let Some(tail) = self.open {
                let going_on = seen[fresh..]
                    .iter()
                    .take_while(|&&b| tail.continues(b))
                    .count();
                mask(&mut seen[fresh..fresh + going_on], false);
                if fresh + going_on < seen.len() {
                    self.open = None;
                }
            }
            let done = self.scanner.redact(&mut seen);
            self.redacted.extend(done.kinds);
            self.open = done.open.or(self.open);
        } else if let Some(f) = self.scanner.scan(&seen) {
            return Err(f);
        }
        let keep = self.scanner.window().min(seen.len());
        let ready = seen.split_to(seen.len() - keep).freeze();
        self.held.clear();
        self.held.extend_from_slice(&seen);
        Ok(ready)
    }

    /// The end of the body: the held bytes, already scanned (and masked)
    /// with everything before them, may now go.
    pub fn finish(&mut self) -> Bytes {
        self.open = None;
        self.held.split().freeze()
    }

    /// Whether it masks secrets rather than failing at them.
    pub fn is_redacting(&self) -> bool {
        self.redacting
    }

    /// How many bytes are held back right now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The kinds of the secrets masked so far.
    pub fn redacted(&self) -> &BTreeSet<&'static str> {
        &self.redacted
    }
}
