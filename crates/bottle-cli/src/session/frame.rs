//! The session socket's framing: one kind byte, a big-endian `u32` length,
//! then that many bytes. Clients send [`Frame::Data`] (keystrokes) and
//! [`Frame::Resize`]; the holder sends [`Frame::Data`] (the agent's output)
//! and, last, [`Frame::Exit`]. Detaching needs no frame: a client that
//! closes its connection has detached, however it went away.

use std::io::{self, Read, Write};

/// Larger frames are refused: no side ever writes more than a read buffer.
const MAX_PAYLOAD: u32 = 1 << 20;

const DATA: u8 = 1;
const RESIZE: u8 = 2;
const EXIT: u8 = 3;

/// One message on the session socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// Terminal bytes: input to the agent, or its output.
    Data(Vec<u8>),
    /// The client's terminal size.
    Resize { rows: u16, cols: u16 },
    /// The agent exited with this code; nothing follows.
    Exit(i32),
}

/// Writes one frame.
pub(crate) fn write(to: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let (kind, payload) = match frame {
        Frame::Data(bytes) => (DATA, bytes.clone()),
        Frame::Resize { rows, cols } => (RESIZE, [rows.to_be_bytes(), cols.to_be_bytes()].concat()),
        Frame::Exit(code) => (EXIT, code.to_be_bytes().to_vec()),
    };
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut message = Vec::with_capacity(5 + payload.len());
    message.push(kind);
    message.extend_from_slice(&len.to_be_bytes());
    message.extend_from_slice(&payload);
    to.write_all(&message)?;
    to.flush()
}

/// Reads one frame; `None` when the peer closed between frames.
pub(crate) fn read(from: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut header = [0u8; 5];
    match from.read_exact(&mut header[..1]) {
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    from.read_exact(&mut header[1..])?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    if len > MAX_PAYLOAD {
        return Err(invalid(format!("a frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len as usize];
    from.read_exact(&mut payload)?;
    match (header[0], payload.as_slice()) {
        (DATA, _) => Ok(Some(Frame::Data(payload))),
        (RESIZE, [r0, r1, c0, c1]) => Ok(Some(Frame::Resize {
            rows: u16::from_be_bytes([*r0, *r1]),
            cols: u16::from_be_bytes([*c0, *c1]),
        })),
        (EXIT, [a, b, c, d]) => Ok(Some(Frame::Exit(i32::from_be_bytes([*a, *b, *c, *d])))),
        (kind, _) => Err(invalid(format!("a frame of kind {kind} and {len} bytes"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_back_to_back() {
        let frames = [
            Frame::Data(b"hello\x1b[0m\x00".to_vec()),
            Frame::Data(Vec::new()),
            Frame::Resize {
                rows: 50,
                cols: 300,
            },
            Frame::Exit(-1),
            Frame::Exit(137),
        ];
        let mut wire = Vec::new();
        for frame in &frames {
            write(&mut wire, frame).unwrap();
        }
        let mut reader = wire.as_slice();
        for frame in &frames {
            assert_eq!(read(&mut reader).unwrap().as_ref(), Some(frame));
        }
        assert_eq!(read(&mut reader).unwrap(), None, "a clean end");
    }

    #[test]
    fn the_wire_format_is_kind_length_payload() {
        let mut wire = Vec::new();
        write(&mut wire, &Frame::Resize { rows: 24, cols: 80 }).unwrap();
        assert_eq!(wire, [2, 0, 0, 0, 4, 0, 24, 0, 80]);
    }

    #[test]
    fn malformed_frames_are_errors_not_guesses() {
        // Cut inside the header, inside the payload; an unknown kind; a
        // resize of the wrong size; a length past the bound.
        for wire in [
            &[1u8, 0, 0][..],
            &[1, 0, 0, 0, 5, b'a'],
            &[9, 0, 0, 0, 0],
            &[2, 0, 0, 0, 2, 0, 1],
            &[1, 0xff, 0xff, 0xff, 0xff],
        ] {
            assert!(read(&mut &wire[..]).is_err(), "{wire:?} was accepted");
        }
    }
}
