//! The in-box end of a published port: `/.bottle/toolbox connect PORT`,
//! started once per connection over the stream the backend already has
//! (an attached exec, `smolvm machine exec -i`), copies its stdin to a TCP
//! connection to `PORT` on the box's own loopback and the connection back
//! to its stdout. Nothing in the box listens for it and the box gains no
//! route: the host holds the listener and the backend's exec carries the
//! bytes.
//!
//! Before any byte of the connection, the relay writes one status line on
//! stdout: [`CONNECTED`] once it is connected, or [`NOT_CONNECTED`] and why
//! (nothing listens on the port), after which it exits. The host reads
//! that line first ([`read_status`]), so a port nobody listens on is said
//! at once instead of looking like a server that says nothing.

use std::io::Read;

use crate::sandbox::TOOLBOX_PATH;

/// The in-box agent's argument that makes it a relay.
pub const CONNECT: &str = "connect";
/// The relay's first line when it is connected.
pub const CONNECTED: &str = "bottle-relay connected";
/// The start of the relay's first line when it could not connect; the
/// rest of the line says why.
pub const NOT_CONNECTED: &str = "bottle-relay refused: ";
/// The longest status line read.
pub const STATUS_BOUND: usize = 512;

/// The argv that relays a connection to `port` on the box's loopback.
pub fn relay_argv(port: u16) -> Vec<String> {
    vec![TOOLBOX_PATH.into(), CONNECT.into(), port.to_string()]
}

/// What the relay's status line said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayStatus {
    /// Connected: the connection's bytes follow.
    Connected,
    /// It could not connect, and said why.
    Refused(String),
    /// The stream ended, or said something else, before a status line:
    /// the relay did not run (no in-box agent, an old one). What came is
    /// kept, for the log.
    NoRelay(String),
}

/// Reads the relay's status line from `from_box`, a byte at a time so that
/// nothing after it is consumed.
pub fn read_status(from_box: &mut dyn Read) -> std::io::Result<RelayStatus> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < STATUS_BOUND {
        match from_box.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => {
                let text = String::from_utf8_lossy(&line).into_owned();
                if text == CONNECTED {
                    return Ok(RelayStatus::Connected);
                }
                if let Some(why) = text.strip_prefix(NOT_CONNECTED) {
                    return Ok(RelayStatus::Refused(why.to_string()));
                }
                return Ok(RelayStatus::NoRelay(text));
            }
            Ok(_) => line.push(byte[0]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(RelayStatus::NoRelay(
        String::from_utf8_lossy(&line).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_is_read_and_nothing_after_it() {
        let mut stream: &[u8] = b"bottle-relay connected\nHTTP/1.1 200 OK\r\n";
        assert_eq!(read_status(&mut stream).unwrap(), RelayStatus::Connected);
        assert_eq!(stream, b"HTTP/1.1 200 OK\r\n");

        let mut stream: &[u8] = b"bottle-relay refused: nothing listens on port 8000\n";
        assert_eq!(
            read_status(&mut stream).unwrap(),
            RelayStatus::Refused("nothing listens on port 8000".into())
        );

        let mut stream: &[u8] = b"";
        assert_eq!(
            read_status(&mut stream).unwrap(),
            RelayStatus::NoRelay(String::new())
        );
        let long = vec![b'x'; STATUS_BOUND * 2];
        let mut stream: &[u8] = &long;
        assert!(matches!(
            read_status(&mut stream).unwrap(),
            RelayStatus::NoRelay(text) if text.len() == STATUS_BOUND
        ));
    }

    #[test]
    fn the_relay_is_the_in_box_agent() {
        assert_eq!(relay_argv(8000), [TOOLBOX_PATH, "connect", "8000"]);
    }
}
