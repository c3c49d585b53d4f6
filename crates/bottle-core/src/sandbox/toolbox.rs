//! The host's end of the in-box agent: one channel per bottle, opened on
//! the first call and kept, over which every tool call runs.
//!
//! A backend opens the stream ([`ToolboxStream`]: the stdin and stdout of
//! `/.bottle/toolbox` started as the agent's user through the stream the
//! backend already has); everything after that is here, the same for every
//! backend: the hello, deadlines, the evidence hash, and the audit line.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::sandbox::audit::{self, SandboxRecord};
use crate::sandbox::call::{ToolCall, ToolResult, evidence_hash};
use crate::sandbox::error::SandboxError;
use crate::sandbox::shown;
use crate::sandbox::wire::{self, Op, PROTOCOL_VERSION, Reply, Request, Response};

/// Where the in-box agent lives inside every box, root-owned and
/// read-only to the agent.
pub const TOOLBOX_PATH: &str = "/.bottle/toolbox";

/// How long the in-box agent has to answer its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past a call's deadline the host waits for the agent's answer
/// (the agent kills the call at the deadline and then answers) before it
/// gives the channel up.
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// The in-box agent's stdin and stdout, as a backend opened them.
pub struct ToolboxStream {
    /// Frames to the agent.
    pub to_agent: Box<dyn Write + Send>,
    /// Frames from the agent.
    pub from_agent: Box<dyn Read + Send>,
}

/// Open descriptors of a box's processes, as the in-box agent counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFds {
    /// Descriptors counted.
    pub count: u64,
    /// Processes counted.
    pub processes: u64,
    /// Processes whose descriptors could not be read.
    pub unreadable: u64,
}

/// One bottle's channel to its in-box agent, opened on first use.
pub struct Toolbox {
    bottle: String,
    audit_log: Option<PathBuf>,
    channel: Mutex<Option<Channel>>,
}

struct Channel {
    to_agent: Box<dyn Write + Send>,
    replies: Receiver<std::io::Result<Response>>,
    next_id: u64,
}

impl Toolbox {
    /// A toolbox for `bottle` whose calls are recorded in `audit_log` (the
    /// bottle's `audit.jsonl`; `None` records nothing, for tests).
    pub fn new(bottle: impl Into<String>, audit_log: Option<PathBuf>) -> Toolbox {
        Toolbox {
            bottle: bottle.into(),
            audit_log,
            channel: Mutex::new(None),
        }
    }

    /// Runs `call` in the box; `open` starts the in-box agent when there is
    /// no channel yet. A call that ran records its evidence hash in the
    /// audit log, whatever its exit code.
    pub fn execute(
        &self,
        call: &ToolCall,
        open: impl FnOnce() -> Result<ToolboxStream, SandboxError>,
    ) -> Result<ToolResult, SandboxError> {
        let op = Op::Exec {
            command: call.command.clone(),
            env: call.env.clone(),
            cwd: call.cwd.clone(),
            stdin: call.stdin.clone(),
            deadline_ms: u64::try_from(call.deadline.as_millis()).unwrap_or(u64::MAX),
        };
        let summary = shown(&call.summary());
        let reply = self.request(op, call.deadline + DEADLINE_GRACE, open, &summary)?;
        let (exit_code, stdout, stderr, truncated, timed_out, duration_us) = match reply {
            Reply::Exec {
                exit_code,
                stdout,
                stderr,
                truncated,
                timed_out,
                duration_us,
            } => (exit_code, stdout, stderr, truncated, timed_out, duration_us),
            Reply::Error { message } => {
                return Err(SandboxError::Tool {
                    bottle: self.bottle.clone(),
                    call: summary,
                    why: shown(&message),
                });
            }
            other => return Err(self.unexpected(&summary, &other)),
        };
        let evidence = evidence_hash(call, exit_code, &stdout, &stderr, truncated);
        let duration = Duration::from_micros(duration_us);
        self.record(SandboxRecord::tool(
            &self.bottle,
            &summary,
            exit_code,
            timed_out,
            call.stdin.len(),
            stdout.len() + stderr.len(),
            duration,
            &evidence,
        ));
        if timed_out {
            return Err(SandboxError::ToolTimeout {
                bottle: self.bottle.clone(),
                call: summary,
                deadline: call.deadline,
            });
        }
        Ok(ToolResult {
            exit_code,
            stdout,
            stderr,
            truncated,
            duration,
            evidence_hash: evidence,
        })
    }

    /// Asks the in-box agent to count the box's open descriptors (the
    /// microVM's second reset source).
    pub fn count_open_fds(
        &self,
        open: impl FnOnce() -> Result<ToolboxStream, SandboxError>,
    ) -> Result<OpenFds, SandboxError> {
        let what = "count open descriptors";
        match self.request(Op::CountOpenFds, HELLO_TIMEOUT, open, what)? {
            Reply::OpenFds {
                count,
                processes,
                unreadable,
            } => Ok(OpenFds {
                count,
                processes,
                unreadable,
            }),
            other => Err(self.unexpected(what, &other)),
        }
    }

    /// Drops the channel (after a reset ended the agent's process); the
    /// next call opens a new one.
    pub fn forget(&self) {
        if let Ok(mut channel) = self.channel.lock() {
            *channel = None;
        }
    }

    /// Appends `record` to the bottle's audit log, if it has one. A failed
    /// write is not the caller's failure: the bundle's health marker is
    /// what reports a log that cannot be written.
    pub fn record(&self, record: SandboxRecord) {
        if let Some(log) = &self.audit_log {
            let _ = audit::append(log, &record);
        }
    }

    fn request(
        &self,
        op: Op,
        wait: Duration,
        open: impl FnOnce() -> Result<ToolboxStream, SandboxError>,
        summary: &str,
    ) -> Result<Reply, SandboxError> {
        let mut slot = self.channel.lock().map_err(|_| SandboxError::Tool {
            bottle: self.bottle.clone(),
            call: summary.to_string(),
            why: "a previous call panicked while holding the channel".into(),
        })?;
        let channel = match &mut *slot {
            Some(channel) => channel,
            empty => empty.insert(self.open(open)?),
        };
        match channel.round_trip(op, wait) {
            Ok(reply) => Ok(reply),
            Err(why) => {
                // A broken or silent channel is not reused: the next call
                // starts a new agent.
                *slot = None;
                Err(SandboxError::Tool {
                    bottle: self.bottle.clone(),
                    call: summary.to_string(),
                    why,
                })
            }
        }
    }

    fn open(
        &self,
        open: impl FnOnce() -> Result<ToolboxStream, SandboxError>,
    ) -> Result<Channel, SandboxError> {
        let stream = open()?;
        let (sender, replies) = mpsc::channel();
        let mut from_agent = stream.from_agent;
        std::thread::Builder::new()
            .name("toolbox-reader".into())
            .spawn(move || {
                loop {
                    let frame = wire::read_frame::<_, Response>(&mut from_agent);
                    let done = !matches!(frame, Ok(Some(_)));
                    let message = match frame {
                        Ok(Some(response)) => Ok(response),
                        Ok(None) => Err(std::io::ErrorKind::UnexpectedEof.into()),
                        Err(err) => Err(err),
                    };
                    if sender.send(message).is_err() || done {
                        break;
                    }
                }
            })
            .map_err(|err| SandboxError::Boot {
                bottle: self.bottle.clone(),
                why: format!("cannot start the channel's reader thread: {err}"),
            })?;
        let mut channel = Channel {
            to_agent: stream.to_agent,
            replies,
            next_id: 0,
        };
        match channel.round_trip(Op::Hello, HELLO_TIMEOUT) {
            Ok(Reply::Hello { version, .. }) if version == PROTOCOL_VERSION => Ok(channel),
            Ok(Reply::Hello { version, .. }) => Err(SandboxError::Boot {
                bottle: self.bottle.clone(),
                why: format!(
                    "the in-box agent speaks protocol {version}, this bottle speaks {PROTOCOL_VERSION}"
                ),
            }),
            Ok(other) => Err(SandboxError::Boot {
                bottle: self.bottle.clone(),
                why: format!(
                    "the in-box agent answered hello with {}",
                    reply_kind(&other)
                ),
            }),
            Err(why) => Err(SandboxError::Boot {
                bottle: self.bottle.clone(),
                why,
            }),
        }
    }

    fn unexpected(&self, summary: &str, reply: &Reply) -> SandboxError {
        SandboxError::Tool {
            bottle: self.bottle.clone(),
            call: summary.to_string(),
            why: format!("the in-box agent answered with {}", reply_kind(reply)),
        }
    }
}

impl Channel {
    /// Sends `op` and waits up to `wait` for its answer. Answers to earlier
    /// requests (which timed out) are skipped by id.
    fn round_trip(&mut self, op: Op, wait: Duration) -> Result<Reply, String> {
        self.next_id += 1;
        let id = self.next_id;
        wire::write_frame(&mut self.to_agent, &Request { id, op })
            .map_err(|err| format!("cannot write to the in-box agent: {err}"))?;
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(Ok(response)) if response.id == id => return Ok(response.reply),
                Ok(Ok(_stale)) => continue,
                Ok(Err(err)) => {
                    return Err(format!("the in-box agent's channel broke: {err}"));
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the in-box agent did not answer within {} ms",
                        wait.as_millis()
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err("the in-box agent's channel is closed".into());
                }
            }
        }
    }
}

fn reply_kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Hello { .. } => "a hello",
        Reply::Exec { .. } => "an exec result",
        Reply::OpenFds { .. } => "a descriptor count",
        Reply::Error { .. } => "an error",
    }
}
