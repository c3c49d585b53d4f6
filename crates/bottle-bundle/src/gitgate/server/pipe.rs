//! The streaming between a request, a git process and the response: the
//! request body (gunzipped, capped) goes to git's stdin, git's stdout
//! becomes the response body, and what happened is reported once git exits.

use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header;
use http::{Request, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, mpsc};

use crate::body::{BoxBody, BoxError, boxed};
use crate::gitgate::command::{Invocation, Service};

/// Response bytes of a receive-pack kept to read its report-status.
const TEE_MAX: usize = 1 << 20;
/// Stderr bytes kept from a git process.
const STDERR_MAX: usize = 64 * 1024;
/// Compressed bytes decoded at a time (bounds what one step can inflate).
const INFLATE_STEP: usize = 4096;
/// Decoded bytes handed on at a time.
const INFLATE_OUT: usize = 256 * 1024;

/// A request body, gunzipped when the client says so, capped in size.
pub(super) struct BodyInput {
    body: Incoming,
    gzip: Option<flate2::write::GzDecoder<Vec<u8>>>,
    pending: Bytes,
    ended: bool,
    limit: u64,
    pub(super) seen: u64,
    sniff: Vec<u8>,
}

type HttpError = (StatusCode, String);

impl BodyInput {
    pub(super) fn new(
        req: Request<Incoming>,
        service: Service,
        limit: u64,
    ) -> Result<Self, HttpError> {
        let want = format!("application/x-{}-request", service.name());
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !ct.eq_ignore_ascii_case(&want) {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("expected Content-Type {want}, got {ct:?}"),
            ));
        }
        let encoding = req
            .headers()
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("identity")
            .trim()
            .to_ascii_lowercase();
        let gzip = match encoding.as_str() {
            "identity" | "" => None,
            "gzip" | "x-gzip" => Some(flate2::write::GzDecoder::new(Vec::new())),
            other => {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("Content-Encoding {other:?} is not supported (gzip is)"),
                ));
            }
        };
        Ok(Self {
            body: req.into_body(),
            gzip,
            pending: Bytes::new(),
            ended: false,
            limit,
            seen: 0,
            sniff: Vec::new(),
        })
    }

    fn count(&mut self, chunk: &[u8]) -> Result<(), String> {
        self.seen += chunk.len() as u64;
        if self.sniff.len() < 64 {
            let take = (64 - self.sniff.len()).min(chunk.len());
            self.sniff.extend_from_slice(&chunk[..take]);
        }
        if self.seen > self.limit {
            return Err(format!(
                "the request body is over the gate's limit of {} bytes",
                self.limit
            ));
        }
        Ok(())
    }

    /// The next decoded chunk; `Ok(None)` at the end.
    pub(super) async fn next(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            if let Some(dec) = &mut self.gzip {
                while !self.pending.is_empty() && dec.get_ref().len() < INFLATE_OUT {
                    let step = self.pending.split_to(self.pending.len().min(INFLATE_STEP));
                    dec.write_all(&step)
                        .map_err(|e| format!("the gzip request body is invalid: {e}"))?;
                }
                let out = std::mem::take(dec.get_mut());
                if !out.is_empty() {
                    self.count(&out)?;
                    return Ok(Some(Bytes::from(out)));
                }
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.frame().await {
                None => {
                    self.ended = true;
                    if let Some(dec) = &mut self.gzip {
                        dec.try_finish()
                            .map_err(|e| format!("the gzip request body is invalid: {e}"))?;
                        let out = std::mem::take(dec.get_mut());
                        if !out.is_empty() {
                            self.count(&out)?;
                            return Ok(Some(Bytes::from(out)));
                        }
                    }
                    return Ok(None);
                }
                Some(Err(e)) => return Err(format!("reading the request body failed: {e}")),
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    if self.gzip.is_some() {
                        self.pending = data;
                        continue;
                    }
                    self.count(&data)?;
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// The response body: chunks of git's stdout.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// How a piped git process ended.
#[derive(Debug, Default)]
pub(super) struct PipeDone {
    pub(super) code: Option<i32>,
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    /// The first [`TEE_MAX`] bytes of stdout.
    pub(super) tee: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) input_error: Option<String>,
    /// The first decoded request bytes.
    pub(super) sniff: Vec<u8>,
}

pub(super) type Guards = (OwnedSemaphorePermit, Option<OwnedMutexGuard<()>>);

/// Runs `inv` with `head` and then `input` on its stdin and its stdout as
/// the returned body; `done` runs (before the body ends) once the process
/// has exited. `kill_on_gone`: kill it when the client goes away (a fetch);
/// otherwise let it finish (a push must not stop half-way).
pub(super) fn pipe(
    inv: &Invocation,
    head: Vec<u8>,
    mut input: BodyInput,
    kill_on_gone: bool,
    guards: Guards,
    done: impl FnOnce(PipeDone) + Send + 'static,
) -> std::io::Result<BoxBody> {
    let mut child = inv.spawn_piped()?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("the child's pipes are missing"));
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _guards = guards;
        let feed = async {
            let mut fed = head.len() as u64;
            let mut error = None;
            if stdin.write_all(&head).await.is_ok() {
                loop {
                    match input.next().await {
                        Ok(Some(chunk)) => {
                            fed += chunk.len() as u64;
                            if stdin.write_all(&chunk).await.is_err() {
                                // The process stopped reading: it has
                                // answered (or failed) already.
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            error = Some(e);
                            break;
                        }
                    }
                }
            }
            // Closing stdin: a cut-off request makes git fail cleanly.
            drop(stdin);
            (fed, error, std::mem::take(&mut input.sniff))
        };
        let sender = &tx;
        let pump = async {
            let mut tee = Vec::new();
            let mut out = 0u64;
            let mut client = true;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if tee.len() < TEE_MAX {
                    let take = (TEE_MAX - tee.len()).min(n);
                    tee.extend_from_slice(&buf[..take]);
                }
                if client {
                    if sender.send(Bytes::copy_from_slice(&buf[..n])).await.is_ok() {
                        out += n as u64;
                    } else {
                        client = false;
                        if kill_on_gone {
                            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                                // Not yet reaped, so the pid is still ours.
                                let _ = nix::sys::signal::kill(
                                    nix::unistd::Pid::from_raw(pid),
                                    nix::sys::signal::Signal::SIGKILL,
                                );
                            }
                            break;
                        }
                    }
                }
            }
            (out, tee)
        };
        let errs = async {
            let mut kept = Vec::new();
            let mut buf = vec![0u8; 8192];
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let take = STDERR_MAX.saturating_sub(kept.len()).min(n);
                        kept.extend_from_slice(&buf[..take]);
                    }
                }
            }
            kept
        };
        let ((bytes_in, input_error, sniff), (bytes_out, tee), stderr) =
            tokio::join!(feed, pump, errs);
        let code = child.wait().await.ok().and_then(|s| s.code());
        done(PipeDone {
            code,
            bytes_in,
            bytes_out,
            tee,
            stderr,
            input_error,
            sniff,
        });
        // The body ends only now, after the audit line is written.
        drop(tx);
    });
    Ok(boxed(ChannelBody(rx)))
}
