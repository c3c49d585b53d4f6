//! The host's end of the in-box agent: one channel per bottle, opened on
//! the first call and kept, over which every tool call runs.
//!
//! A backend opens the stream ([`ToolboxStream`]: the stdin and stdout of
//! `/.bottle/toolbox` started as the agent's user through the stream the
//! backend already has); everything after that is here, the same for every
//! backend: the hello, deadlines, the evidence hash, and the audit line.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher as _;
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

/// Where the in-box agent lives inside every box, root-owned.
pub const TOOLBOX_PATH: &str = "/.bottle/toolbox";

/// The in-box agent's argument that makes it start a program under
/// bottle's system-call filter instead of serving: `TOOLBOX_PATH filtered
/// -- ARGV…`. For boxes whose runtime does not apply the container's
/// seccomp profile to the processes the Engine execs (gVisor 20221219
/// applies it to the container's first process only), so the agent's
/// processes are refused what the container tier refuses them.
pub const FILTERED: &str = "filtered";

/// `argv` started through the in-box agent under bottle's system-call
/// filter ([`FILTERED`]).
pub fn filtered_argv(argv: &[String]) -> Vec<String> {
    let mut out = vec![
        TOOLBOX_PATH.to_string(),
        FILTERED.to_string(),
        "--".to_string(),
    ];
    out.extend_from_slice(argv);
    out
}

/// The in-box agent's file mode: execute-only, for everyone. A program its
/// user cannot read is never dumpable (the kernel decides at `execve`), so
/// the agent's processes cannot open its descriptors (the channel) even in
/// the instant before it says so itself; and nobody in the box needs to
/// read it.
pub const TOOLBOX_MODE: u32 = 0o111;

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

/// A channel opened and greeted ahead of its first call, for
/// [`Toolbox::adopt`]: into a standby box before it waits, so the first
/// call after the reset that swaps it in starts no agent.
pub struct OpenedChannel(Channel);

impl std::fmt::Debug for OpenedChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenedChannel")
    }
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
    /// Keys the request ids: each is a keyed hash of the request's count,
    /// so a frame planted for a later request cannot name it.
    ids: RandomState,
    sent: u64,
    /// The sequence number the agent's next frame must carry.
    next_seq: u64,
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

    /// The bottle whose in-box agent this is.
    pub fn bottle(&self) -> &str {
        &self.bottle
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

    /// Opens a channel by `open` and greets the agent, without making it
    /// this bottle's channel yet.
    pub fn open_ahead(
        &self,
        open: impl FnOnce() -> Result<ToolboxStream, SandboxError>,
    ) -> Result<OpenedChannel, SandboxError> {
        self.open(open, "open the channel ahead").map(OpenedChannel)
    }

    /// Makes `opened` this bottle's channel in place of any other. What
    /// the agent wrote to it while it waited is a violation at its first
    /// call, as on any channel between two calls.
    pub fn adopt(&self, opened: OpenedChannel) {
        let mut slot = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        *slot = Some(opened.0);
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
            empty => empty.insert(self.open(open, summary)?),
        };
        match channel.round_trip(op, wait) {
            Ok(reply) => Ok(reply),
            Err(failure) => {
                // A broken, silent or tampered channel is not reused: the
                // next call starts a new agent.
                *slot = None;
                Err(self.failed(summary, failure))
            }
        }
    }

    /// The error of a call whose channel failed; a violation is audited,
    /// since it is the one sign that something wrote to the channel.
    fn failed(&self, summary: &str, failure: Failure) -> SandboxError {
        match failure {
            Failure::Broken(why) => SandboxError::Tool {
                bottle: self.bottle.clone(),
                call: summary.to_string(),
                why,
            },
            Failure::Violation(why) => {
                self.record(SandboxRecord::channel_violation(&self.bottle, summary));
                SandboxError::Channel {
                    bottle: self.bottle.clone(),
                    call: summary.to_string(),
                    why,
                }
            }
        }
    }

    fn open(
        &self,
        open: impl FnOnce() -> Result<ToolboxStream, SandboxError>,
        summary: &str,
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
        let mut channel = Channel::new(stream.to_agent, replies);
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
            Err(Failure::Broken(why)) => Err(SandboxError::Boot {
                bottle: self.bottle.clone(),
                why,
            }),
            Err(violation) => Err(self.failed(summary, violation)),
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

/// Why a round trip gave no answer.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The channel broke, closed or went silent.
    Broken(String),
    /// The channel carried a frame the host did not ask for.
    Violation(String),
}

impl Channel {
    fn new(
        to_agent: Box<dyn Write + Send>,
        replies: Receiver<std::io::Result<Response>>,
    ) -> Channel {
        Channel {
            to_agent,
            replies,
            ids: RandomState::new(),
            sent: 0,
            next_seq: 1,
        }
    }

    /// Sends `op` and waits up to `wait` for its answer: the one frame
    /// carrying this request's id (unpredictable, so nothing can be
    /// written for it before it is sent) and the channel's next sequence
    /// number.
    /// Anything else the channel carries (a frame while no request was
    /// out, a frame for another id or out of sequence, a frame right after
    /// the answer) is a violation: the host never asked for it, so no
    /// answer is taken from a channel that carried it.
    fn round_trip(&mut self, op: Op, wait: Duration) -> Result<Reply, Failure> {
        self.idle_check()?;
        self.sent += 1;
        let id = self.ids.hash_one(self.sent);
        wire::write_frame(&mut self.to_agent, &Request { id, op })
            .map_err(|err| Failure::Broken(format!("cannot write to the in-box agent: {err}")))?;
        let until = Instant::now() + wait;
        let left = until.saturating_duration_since(Instant::now());
        let response = match self.replies.recv_timeout(left) {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => return Err(read_failure(&err)),
            Err(RecvTimeoutError::Timeout) => {
                return Err(Failure::Broken(format!(
                    "the in-box agent did not answer within {} ms",
                    wait.as_millis()
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Failure::Broken(
                    "the in-box agent's channel is closed".into(),
                ));
            }
        };
        if response.id != id {
            return Err(Failure::Violation(format!(
                "carried an answer to request {} while request {id} was waiting",
                response.id
            )));
        }
        if response.seq != self.next_seq {
            return Err(Failure::Violation(format!(
                "carried frame number {} where number {} was due",
                response.seq, self.next_seq
            )));
        }
        self.next_seq += 1;
        // Bytes that came with the answer are as unasked for as bytes that
        // came before it.
        if let Ok(Ok(extra)) = self.replies.try_recv() {
            return Err(Failure::Violation(format!(
                "carried another frame (request {}, number {}) after the answer",
                extra.id, extra.seq
            )));
        }
        Ok(response.reply)
    }

    /// Between two requests nothing may arrive: a frame here was written
    /// before the host asked anything.
    fn idle_check(&mut self) -> Result<(), Failure> {
        match self.replies.try_recv() {
            Ok(Ok(frame)) => Err(Failure::Violation(format!(
                "carried a frame (request {}, number {}) before a call was sent",
                frame.id, frame.seq
            ))),
            Ok(Err(err)) => Err(read_failure(&err)),
            Err(mpsc::TryRecvError::Disconnected) => Err(Failure::Broken(
                "the in-box agent's channel is closed".into(),
            )),
            Err(mpsc::TryRecvError::Empty) => Ok(()),
        }
    }
}

/// A read that failed: bytes that are no frame (bad JSON, a length over
/// the limit) are a violation, since the agent only ever writes frames;
/// an end or an I/O error is a broken channel.
fn read_failure(err: &std::io::Error) -> Failure {
    if err.kind() == std::io::ErrorKind::InvalidData {
        Failure::Violation(format!("carried bytes that are not a frame ({err})"))
    } else {
        Failure::Broken(format!("the in-box agent's channel broke: {err}"))
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

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Write as _};
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::Coded as _;

    /// What the fake agent writes for one request: the frames (id, seq)
    /// of its answer, in order, and raw bytes after them.
    type Script = Box<dyn FnMut(u64, u64) -> Vec<u8> + Send>;

    fn frame(id: u64, seq: u64, reply: Reply) -> Vec<u8> {
        let mut bytes = Vec::new();
        wire::write_frame(&mut bytes, &Response { id, seq, reply }).unwrap();
        bytes
    }

    fn hello(id: u64, seq: u64) -> Vec<u8> {
        frame(
            id,
            seq,
            Reply::Hello {
                version: PROTOCOL_VERSION,
                pid: 7,
            },
        )
    }

    fn exec(id: u64, seq: u64, stdout: &[u8], exit_code: i32) -> Vec<u8> {
        frame(
            id,
            seq,
            Reply::Exec {
                exit_code,
                stdout: stdout.to_vec(),
                stderr: Vec::new(),
                truncated: false,
                timed_out: false,
                duration_us: 1,
            },
        )
    }

    /// An in-box agent on the other end of a socket pair: answers hello
    /// honestly and every other request as `script` says, with the id of
    /// the request and the sequence number an honest agent would use.
    /// Returns the stream and the agent's end, for planting bytes.
    fn fake_agent(mut script: Script) -> (ToolboxStream, UnixStream) {
        let (host, agent) = UnixStream::pair().unwrap();
        let planter = agent.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(agent.try_clone().unwrap());
            let mut writer = agent;
            let mut seq = 0;
            while let Ok(Some(request)) = wire::read_frame::<_, Request>(&mut reader) {
                seq += 1;
                let bytes = match request.op {
                    Op::Hello => hello(request.id, seq),
                    _ => script(request.id, seq),
                };
                if writer.write_all(&bytes).is_err() {
                    break;
                }
            }
        });
        let stream = ToolboxStream {
            to_agent: Box::new(host.try_clone().unwrap()),
            from_agent: Box::new(host),
        };
        (stream, planter)
    }

    fn honest() -> Script {
        Box::new(|id, seq| exec(id, seq, b"real-output\n", 3))
    }

    /// Runs `sh -c true` on `toolbox`, opening `stream` if it has no
    /// channel; counts the opens.
    fn call(
        toolbox: &Toolbox,
        stream: &Mutex<Option<ToolboxStream>>,
        opens: &Mutex<u32>,
    ) -> Result<ToolResult, SandboxError> {
        toolbox.execute(&ToolCall::argv(["true"]), || {
            *opens.lock().unwrap() += 1;
            stream
                .lock()
                .unwrap()
                .take()
                .ok_or_else(|| SandboxError::Boot {
                    bottle: "b".into(),
                    why: "no stream left".into(),
                })
        })
    }

    fn assert_violation(result: Result<ToolResult, SandboxError>, what: &str) {
        let err = result.expect_err("a tampered channel gave a result");
        assert_eq!(err.code(), "BOT-X007", "{err}");
        assert!(matches!(err, SandboxError::Channel { .. }), "{err:?}");
        assert!(err.to_string().contains(what), "{err}");
    }

    #[test]
    fn an_honest_channel_answers_in_sequence() {
        let (stream, _planter) = fake_agent(honest());
        let toolbox = Toolbox::new("b", None);
        let (stream, opens) = (Mutex::new(Some(stream)), Mutex::new(0));
        for _ in 0..3 {
            let result = call(&toolbox, &stream, &opens).unwrap();
            assert_eq!(
                (result.exit_code, &result.stdout[..]),
                (3, &b"real-output\n"[..])
            );
        }
        assert_eq!(*opens.lock().unwrap(), 1);
    }

    #[test]
    fn a_frame_for_another_request_is_refused_and_the_channel_closed() {
        // A forged answer ahead of the real one, numbered as the real one
        // would be, but for another request.
        let (stream, _planter) = fake_agent(Box::new(|id, seq| {
            let mut bytes = exec(id.wrapping_add(1), seq, b"FORGED by the agent\n", 0);
            bytes.extend(exec(id, seq + 1, b"real-output\n", 3));
            bytes
        }));
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        let toolbox = Toolbox::new("b", Some(log.clone()));
        let (slot, opens) = (Mutex::new(Some(stream)), Mutex::new(0));
        assert_violation(call(&toolbox, &slot, &opens), "was waiting");
        // The violation is audited, with no evidence: there is no result.
        let line: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
        assert_eq!(line["reason"], "channel_violation");
        assert_eq!(line["decision"], "deny");
        assert!(line.get("evidence").is_none());
        // The next call opens a fresh channel.
        let (fresh, _planter) = fake_agent(honest());
        *slot.lock().unwrap() = Some(fresh);
        let result = call(&toolbox, &slot, &opens).unwrap();
        assert_eq!(result.stdout, b"real-output\n");
        assert_eq!(*opens.lock().unwrap(), 2);
    }

    #[test]
    fn a_replayed_or_skipped_sequence_number_is_refused() {
        // The right id, but the hello's number again (a replay).
        let (stream, _planter) = fake_agent(Box::new(|id, _seq| exec(id, 1, b"replayed\n", 0)));
        let toolbox = Toolbox::new("b", None);
        let (slot, opens) = (Mutex::new(Some(stream)), Mutex::new(0));
        assert_violation(
            call(&toolbox, &slot, &opens),
            "number 1 where number 2 was due",
        );
        // The right id, one number ahead (a frame dropped in between).
        let (stream, _planter) = fake_agent(Box::new(|id, seq| exec(id, seq + 1, b"skip\n", 0)));
        *slot.lock().unwrap() = Some(stream);
        assert_violation(
            call(&toolbox, &slot, &opens),
            "number 3 where number 2 was due",
        );
    }

    #[test]
    fn frames_planted_before_a_call_are_refused_not_taken_as_its_answer() {
        let (stream, mut planter) = fake_agent(honest());
        let toolbox = Toolbox::new("b", None);
        let (slot, opens) = (Mutex::new(Some(stream)), Mutex::new(0));
        call(&toolbox, &slot, &opens).unwrap();
        // While the channel is idle, answers to the next two calls,
        // numbered as the honest agent will number them (their ids cannot
        // be known before the host sends them).
        let mut planted = exec(3, 3, b"FORGED by the agent\n", 0);
        planted.extend(exec(4, 4, b"FORGED by the agent\n", 0));
        planter.write_all(&planted).unwrap();
        // Whether the host read the planted frames before the call (a
        // frame while idle) or as its answer (followed by the agent's own,
        // out of sequence), the call has no result.
        let err = call(&toolbox, &slot, &opens).unwrap_err();
        assert_eq!(err.code(), "BOT-X007", "{err}");
    }

    #[test]
    fn bytes_that_are_not_a_frame_are_refused() {
        let (stream, mut planter) = fake_agent(honest());
        let toolbox = Toolbox::new("b", None);
        let (slot, opens) = (Mutex::new(Some(stream)), Mutex::new(0));
        call(&toolbox, &slot, &opens).unwrap();
        let mut junk = 9u32.to_be_bytes().to_vec();
        junk.extend_from_slice(b"not json!");
        planter.write_all(&junk).unwrap();
        assert_violation(call(&toolbox, &slot, &opens), "not a frame");
    }

    #[test]
    fn a_frame_before_hello_is_refused() {
        let (stream, mut planter) = fake_agent(honest());
        planter.write_all(&exec(2, 2, b"FORGED\n", 0)).unwrap();
        let toolbox = Toolbox::new("b", None);
        let (slot, opens) = (Mutex::new(Some(stream)), Mutex::new(0));
        let err = call(&toolbox, &slot, &opens).unwrap_err();
        assert_eq!(err.code(), "BOT-X007", "{err}");
    }

    #[test]
    fn a_channel_opened_ahead_serves_once_adopted_and_only_as_it_was_greeted() {
        let (old, _old_planter) = fake_agent(honest());
        let toolbox = Toolbox::new("b", None);
        let (slot, opens) = (Mutex::new(Some(old)), Mutex::new(0));
        call(&toolbox, &slot, &opens).unwrap();
        // Opened and greeted ahead; the bottle's channel is still the old one.
        let (ahead, _planter) = fake_agent(honest());
        let opened = toolbox.open_ahead(|| Ok(ahead)).unwrap();
        call(&toolbox, &slot, &opens).unwrap();
        // Adopted: the next calls open nothing.
        toolbox.forget();
        toolbox.adopt(opened);
        for _ in 0..2 {
            assert_eq!(call(&toolbox, &slot, &opens).unwrap().exit_code, 3);
        }
        assert_eq!(*opens.lock().unwrap(), 1);

        // A frame written while the opened channel waited is refused at
        // its first call.
        let (ahead, mut planter) = fake_agent(honest());
        let opened = toolbox.open_ahead(|| Ok(ahead)).unwrap();
        planter.write_all(&exec(3, 2, b"FORGED\n", 0)).unwrap();
        toolbox.adopt(opened);
        let err = call(&toolbox, &slot, &opens).unwrap_err();
        assert_eq!(err.code(), "BOT-X007", "{err}");
    }
}
