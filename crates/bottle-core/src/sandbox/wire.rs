//! The in-box agent's protocol: length-prefixed JSON frames over the
//! stdin/stdout of one long-lived process in the box (`bottle-toolbox`).
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of
//! JSON. The host sends one [`Request`], the agent answers with one
//! [`Response`] carrying the same `id` and the channel's next `seq`, one
//! call at a time. The same code reads and writes frames on both ends, so
//! they cannot disagree.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::sandbox::call::{Command, base64_bytes};

/// The protocol's version; the agent states it in its [`Reply::Hello`].
/// Version 2 numbers every response (`seq`).
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest frame either end accepts (a call's stdin, or a result's two
/// capped outputs in base64, fit well below it).
pub const MAX_FRAME: u32 = 64 << 20;

/// What the host asks the in-box agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the host, echoed in the response.
    pub id: u64,
    /// The operation.
    #[serde(flatten)]
    pub op: Op,
}

/// The operations the in-box agent offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    /// Answer with [`Reply::Hello`]: proves the channel works.
    Hello,
    /// Run a tool call.
    Exec {
        /// The program or built-in tool.
        command: Command,
        /// Extra environment.
        env: BTreeMap<String, String>,
        /// Working directory.
        cwd: Option<String>,
        /// Stdin bytes.
        #[serde(with = "base64_bytes")]
        stdin: Vec<u8>,
        /// Milliseconds until the call is killed.
        deadline_ms: u64,
    },
    /// Count the open descriptors of every process in the box except the
    /// agent itself ([`Reply::OpenFds`]).
    CountOpenFds,
}

/// The in-box agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The request's `id`.
    pub id: u64,
    /// The response's place on its channel: 1 for the first (the hello's),
    /// then one more for each. The host refuses any other, so a frame
    /// repeated, dropped or slipped in between two of the agent's is
    /// never taken for an answer.
    pub seq: u64,
    /// The answer.
    #[serde(flatten)]
    pub reply: Reply,
}

/// The answers, one kind per operation, plus [`Reply::Error`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "reply")]
pub enum Reply {
    /// The agent's protocol version and its pid in the box.
    Hello {
        /// [`PROTOCOL_VERSION`] of the agent.
        version: u32,
        /// The agent's process id.
        pid: u32,
    },
    /// A finished (or killed) call.
    Exec {
        /// Exit code; 128 + n for signal n.
        exit_code: i32,
        /// Stdout, capped.
        #[serde(with = "base64_bytes")]
        stdout: Vec<u8>,
        /// Stderr, capped.
        #[serde(with = "base64_bytes")]
        stderr: Vec<u8>,
        /// Whether an output was capped.
        truncated: bool,
        /// Whether the deadline killed it.
        timed_out: bool,
        /// Microseconds from spawn to exit.
        duration_us: u64,
    },
    /// Open descriptors of the box's processes, and how many processes
    /// could not be read (another user's).
    OpenFds {
        /// Descriptors counted.
        count: u64,
        /// Processes counted.
        processes: u64,
        /// Processes whose descriptors could not be read.
        unreadable: u64,
    },
    /// The operation could not be carried out (unknown tool, program not
    /// found, bad parameters).
    Error {
        /// Why, a lowercase fragment.
        message: String,
    },
}

/// Writes `message` as one frame and flushes.
pub fn write_frame<W: Write, T: Serialize>(writer: &mut W, message: &T) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|len| *len <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    // One write per frame: a stream that forwards each write (an exec's
    // stdin through the Engine) then carries a call in one piece.
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    writer.write_all(&frame)?;
    writer.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of stream (before a length).
pub fn read_frame<R: Read, T: for<'de> Deserialize<'de>>(reader: &mut R) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    let mut filled = 0;
    while filled < len.len() {
        match reader.read(&mut len[filled..])? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => filled += n,
        }
    }
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the limit of {MAX_FRAME}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    reader.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let request = Request {
            id: 7,
            op: Op::Exec {
                command: Command::Argv(vec!["cat".into()]),
                env: BTreeMap::from([("A".into(), "1".into())]),
                cwd: Some("/tmp".into()),
                stdin: vec![0, 255, 10],
                deadline_ms: 1500,
            },
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &request).unwrap();
        write_frame(
            &mut buf,
            &Request {
                id: 8,
                op: Op::CountOpenFds,
            },
        )
        .unwrap();
        let mut reader = buf.as_slice();
        assert_eq!(
            read_frame::<_, Request>(&mut reader).unwrap(),
            Some(request)
        );
        assert_eq!(
            read_frame::<_, Request>(&mut reader).unwrap().map(|r| r.op),
            Some(Op::CountOpenFds)
        );
        assert_eq!(read_frame::<_, Request>(&mut reader).unwrap(), None);
    }

    #[test]
    fn the_wire_shape_is_pinned() {
        let mut buf = Vec::new();
        write_frame(
            &mut buf,
            &Response {
                id: 3,
                seq: 2,
                reply: Reply::OpenFds {
                    count: 9,
                    processes: 2,
                    unreadable: 0,
                },
            },
        )
        .unwrap();
        expect_test::expect![[
            r#"{"id":3,"seq":2,"reply":"open_fds","count":9,"processes":2,"unreadable":0}"#
        ]]
        .assert_eq(std::str::from_utf8(&buf[4..]).unwrap());
        assert_eq!(&buf[..4], &(buf.len() as u32 - 4).to_be_bytes());
    }

    #[test]
    fn oversized_and_cut_frames_are_errors() {
        let mut huge = (MAX_FRAME + 1).to_be_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert_eq!(
            read_frame::<_, Response>(&mut huge.as_slice())
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidData
        );
        let cut = [0u8, 0];
        assert_eq!(
            read_frame::<_, Response>(&mut cut.as_slice())
                .unwrap_err()
                .kind(),
            io::ErrorKind::UnexpectedEof
        );
        let mut short = 10u32.to_be_bytes().to_vec();
        short.extend_from_slice(b"{}");
        assert_eq!(
            read_frame::<_, Response>(&mut short.as_slice())
                .unwrap_err()
                .kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
