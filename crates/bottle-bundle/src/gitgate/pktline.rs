//! Git's pkt-line framing: reading packets (the push request's grammar is
//! in [`super::push_request`]), answering a refused push the way `git
//! receive-pack` would, and reading the report-status a real receive-pack
//! sent back (for the audit line).

use super::push_request::PushRequest;
use super::push_rules::Refusal;

/// The flush packet.
pub const FLUSH: &[u8] = b"0000";
/// Largest pkt-line payload git accepts.
pub const MAX_PAYLOAD: usize = 65516;

/// Encodes one pkt-line.
pub fn pkt(payload: &[u8]) -> Vec<u8> {
    let mut out = format!("{:04x}", payload.len() + 4).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// One packet read from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    /// `0000`.
    Flush,
    /// `0001` (protocol v2 delimiter).
    Delim,
    /// `0002` (protocol v2 response end).
    ResponseEnd,
    /// A payload.
    Data(&'a [u8]),
}

/// What went wrong reading packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PktError {
    /// More bytes are needed.
    Incomplete,
    /// The bytes are not pkt-lines.
    Invalid(String),
}

/// Reads the packet at the start of `buf`; returns it and its length.
pub fn read_packet(buf: &[u8]) -> Result<(Packet<'_>, usize), PktError> {
    let Some(head) = buf.get(..4) else {
        return Err(PktError::Incomplete);
    };
    let text = std::str::from_utf8(head).map_err(|_| PktError::Invalid("bad length".into()))?;
    let len = usize::from_str_radix(text, 16)
        .map_err(|_| PktError::Invalid(format!("bad length {text:?}")))?;
    match len {
        0 => Ok((Packet::Flush, 4)),
        1 => Ok((Packet::Delim, 4)),
        2 => Ok((Packet::ResponseEnd, 4)),
        3 => Err(PktError::Invalid("length 3".into())),
        _ => match buf.get(4..len) {
            Some(data) => Ok((Packet::Data(data), len)),
            None => Err(PktError::Incomplete),
        },
    }
}

/// Wraps `data` into side-band packets on `band`.
fn sideband(out: &mut Vec<u8>, band: u8, data: &[u8], max: usize) {
    for chunk in data.chunks(max.max(1)) {
        let mut payload = Vec::with_capacity(chunk.len() + 1);
        payload.push(band);
        payload.extend_from_slice(chunk);
        out.extend(pkt(&payload));
    }
}

/// The response a receive-pack would send had it refused every update:
/// each message once on side-band 2 (git prints them as `remote: error:
/// ...`), then a report-status with `ng <ref> <reason>` for every update
/// (git prints `! [remote rejected] <ref> (<reason>)`).
pub fn refusal_response(req: &PushRequest, refusals: &[Refusal]) -> Vec<u8> {
    let mut report = pkt(b"unpack ok\n");
    for u in &req.updates {
        let short = refusals
            .iter()
            .find(|r| r.refname == u.refname)
            .map_or_else(
                || "bottle: another ref in this push was refused".to_string(),
                Refusal::short,
            );
        report.extend(pkt(format!("ng {} {short}\n", u.refname).as_bytes()));
    }
    report.extend_from_slice(FLUSH);
    let Some(max) = req.sideband() else {
        return report;
    };
    let mut out = Vec::new();
    let mut said: Vec<&str> = Vec::new();
    for r in refusals {
        if said.contains(&r.message.as_str()) {
            continue;
        }
        said.push(&r.message);
        let line = format!("error: bottle git-gate: {}\n", r.message);
        sideband(&mut out, 2, line.as_bytes(), max);
    }
    sideband(&mut out, 1, &report, max);
    out.extend_from_slice(FLUSH);
    out
}

/// git's error packet: the client stops and prints `remote error:
/// <message>`. For requests whose capabilities (side-band, report-status)
/// are unknown or absent, where a report cannot be shaped.
pub fn error_packet(message: &str) -> Vec<u8> {
    let mut text = format!("ERR bottle git-gate: {message}\n");
    // Keep to one packet, cutting on a character boundary.
    let mut cut = text.len().min(MAX_PAYLOAD - 1);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    pkt(text.as_bytes())
}

/// What a receive-pack reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// `unpack ok` (or the unpack error).
    pub unpack: Option<String>,
    /// Per ref: `None` when updated, `Some(reason)` when refused.
    pub refs: Vec<(String, Option<String>)>,
    /// Side-band 2 and 3 text (progress and errors), as received.
    pub messages: String,
}

/// Parses a receive-pack response (as much of it as was kept).
pub fn parse_report(buf: &[u8], sideband: bool) -> Report {
    let mut report = Report::default();
    let mut inner = Vec::new();
    let mut pos = 0;
    let mut top = Vec::new();
    while let Ok((packet, len)) = read_packet(&buf[pos..]) {
        pos += len;
        let Packet::Data(data) = packet else {
            if !sideband {
                top.extend_from_slice(FLUSH);
            }
            continue;
        };
        if sideband {
            match data.split_first() {
                Some((1, rest)) => inner.extend_from_slice(rest),
                Some((2 | 3, rest)) => report.messages.push_str(&String::from_utf8_lossy(rest)),
                _ => {}
            }
        } else {
            top.extend(pkt(data));
        }
    }
    let lines = if sideband { inner } else { top };
    let mut pos = 0;
    while let Ok((packet, len)) = read_packet(&lines[pos..]) {
        pos += len;
        let Packet::Data(data) = packet else { continue };
        let text = String::from_utf8_lossy(data);
        let text = text.trim_end_matches('\n');
        if let Some(status) = text.strip_prefix("unpack ") {
            report.unpack = Some(status.to_string());
        } else if let Some(name) = text.strip_prefix("ok ") {
            report.refs.push((name.to_string(), None));
        } else if let Some(rest) = text.strip_prefix("ng ") {
            let (name, reason) = rest.split_once(' ').unwrap_or((rest, ""));
            report
                .refs
                .push((name.to_string(), Some(reason.to_string())));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::super::push_rules::{RefUpdate, RefusalKind};
    use super::*;

    fn zero() -> String {
        "0".repeat(40)
    }

    #[test]
    fn encodes_and_reads_packets() {
        assert_eq!(pkt(b"hi\n"), b"0007hi\n");
        let buf = b"0007hi\n0000";
        assert_eq!(read_packet(buf).unwrap(), (Packet::Data(b"hi\n"), 7));
        assert_eq!(read_packet(&buf[7..]).unwrap(), (Packet::Flush, 4));
        assert_eq!(read_packet(b"00"), Err(PktError::Incomplete));
        assert_eq!(read_packet(b"0009ab"), Err(PktError::Incomplete));
        assert!(matches!(read_packet(b"zzzz"), Err(PktError::Invalid(_))));
    }

    #[test]
    fn refusal_response_reads_back_as_a_report() {
        let a = "a".repeat(40);
        let line = |r: &str| format!("{} {a} {r}", zero());
        let cmds = PushRequest {
            updates: vec![
                RefUpdate::parse(&line("refs/heads/main")).unwrap(),
                RefUpdate::parse(&line("refs/heads/agent/x")).unwrap(),
            ],
            caps: vec!["report-status".into(), "side-band-64k".into()],
            ..PushRequest::default()
        };
        let refusal = Refusal {
            kind: RefusalKind::RefNotAllowed,
            refname: "refs/heads/main".into(),
            message: "not allowed; fix: push elsewhere".into(),
        };
        // The same message for two refs is said once.
        let twice = [
            refusal.clone(),
            Refusal {
                refname: "refs/heads/agent/x".into(),
                ..refusal.clone()
            },
        ];
        let out = refusal_response(&cmds, &twice);
        let said = parse_report(&out, true).messages;
        assert_eq!(said.matches("not allowed").count(), 1, "{said}");
        let out = refusal_response(&cmds, std::slice::from_ref(&refusal));
        let report = parse_report(&out, true);
        assert_eq!(report.unpack.as_deref(), Some("ok"));
        assert_eq!(
            report.refs,
            [
                (
                    "refs/heads/main".to_string(),
                    Some("bottle: ref not allowed".to_string())
                ),
                (
                    "refs/heads/agent/x".to_string(),
                    Some("bottle: another ref in this push was refused".to_string())
                ),
            ]
        );
        assert!(
            report
                .messages
                .contains("error: bottle git-gate: not allowed")
        );
        // Without side-band the report is sent bare.
        let bare = PushRequest {
            caps: vec!["report-status".into()],
            ..cmds
        };
        let out = refusal_response(&bare, &[refusal]);
        assert!(out.starts_with(b"000eunpack ok\n"));
        assert_eq!(parse_report(&out, false).refs.len(), 2);
    }

    #[test]
    fn error_packet_is_one_packet() {
        assert_eq!(error_packet("no"), b"001cERR bottle git-gate: no\n");
        let long = error_packet(&"\u{e9}".repeat(MAX_PAYLOAD));
        let (packet, len) = read_packet(&long).unwrap();
        assert_eq!(len, long.len());
        assert!(matches!(packet, Packet::Data(d) if d.starts_with(b"ERR ")));
    }
}
