//! The harness's side of the probes that send a per-run fake key the
//! bundle must keep off the wire:
//!
//! - `proxy-secret-split`: the key in two chunks of a body with a pause
//!   between them; the scanner must hold back the first half until it has
//!   seen the second (`secret-split-on-the-wire`);
//! - `proxy-websocket-secret` and `-split`: the key in a WebSocket message,
//!   whole and across three frames (`websocket-secret-on-the-wire`);
//! - `proxy-redact-secret`: the key split across two chunks of a body to
//!   the host that redacts, where it must arrive masked
//!   (`redact-secret-on-the-wire`, and `control-redact-masked`: the lead
//!   followed by the mask was seen, so the request did arrive).
//!
//! Whatever the probes' answers, no canary may have received the key's
//! first byte after its per-run lead (looked for in the bytes as received,
//! with chunk framing taken out, and in a WebSocket's unmasked payloads).
//! Each row's control is the host sending that lead and half to the
//! internet canary's port 80 (over a WebSocket for the WebSocket row) and
//! finding it recorded.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bottle_probe::contract::{
    REDACTION_MARKER, RunSecret, SPLIT_SECRET_FIRST, run_secret, run_secret_lead,
    run_secret_wire_needle,
};

use super::Gate;
use crate::escape::canary::{self, Hit};
use crate::escape::evidence;
use crate::escape::report::Row;

/// The harness rows of every probing phase, by the key they look for:
/// the row, what it looks for, and its control's row.
const ROWS: &[(RunSecret, &str, &str, &str)] = &[
    (
        RunSecret::Split,
        "secret-split-on-the-wire",
        "a byte of the split key's first half",
        "control-secret-split-detector",
    ),
    (
        RunSecret::WebSocket,
        "websocket-secret-on-the-wire",
        "a byte of the WebSocket message's key",
        "control-websocket-secret-detector",
    ),
    (
        RunSecret::Redact,
        "redact-secret-on-the-wire",
        "a byte of the key sent to the redacting host",
        "control-redact-secret-detector",
    ),
];

impl Gate {
    /// The host's own sends of each key's lead and first half must be
    /// recorded at internet:80 (where the allowed hosts are pinned), or a
    /// clean row proves nothing.
    pub(super) fn split_detector_control(&mut self, phase: &str) -> anyhow::Result<()> {
        for &(kind, _, _, control) in ROWS {
            let half = &run_secret(kind, &self.token)[..SPLIT_SECRET_FIRST];
            let data = format!("note=control&{}{half}", run_secret_lead(kind, &self.token));
            let needle = run_secret_wire_needle(kind, &self.token);
            let ok = if kind == RunSecret::WebSocket {
                self.websocket_detector_sees(&data, &needle)
            } else {
                let request = format!(
                    "POST / HTTP/1.1\r\nHost: control\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{data}\r\n0\r\n\r\n",
                    data.len()
                );
                self.detector_sees(&request, &needle, &[80])
                    .iter()
                    .all(|(_, seen)| *seen)
            };
            self.split_detectors.insert(kind_name(kind), ok);
            self.report.rows.push(Row::control(
                phase,
                control,
                ok,
                format!("the key's lead and first half sent from the host were seen at internet:80: {ok}"),
            ));
        }
        Ok(())
    }

    /// Sends `data` as a WebSocket message to internet:80 from the host;
    /// whether the canary recorded `needle`.
    fn websocket_detector_sees(&self, data: &str, needle: &str) -> bool {
        let before = self.listeners.hits().len();
        let _ = send_websocket_message(SocketAddr::from((canary::INTERNET, 80)), data);
        let hits = self.listeners.hits();
        evidence::carriers(&hits[before..], needle).next().is_some()
    }

    /// Every key row for the canary hits of one probing phase.
    pub(super) fn split_evidence(&mut self, phase: &str, hits: &[Hit]) {
        for &(kind, row, what, _) in ROWS {
            let detector = self.split_detectors.get(kind_name(kind)).copied();
            self.report.rows.push(evidence::leak_row(
                phase,
                row,
                "proxy",
                hits,
                &run_secret_wire_needle(kind, &self.token),
                what,
                detector,
            ));
        }
    }

    /// The control of `redact-secret-on-the-wire` in a phase that ran the
    /// redaction probe: its request arrived, with the mask where the key
    /// was.
    pub(super) fn redaction_evidence(&mut self, phase: &str, hits_before: usize) {
        let hits = self.listeners.hits()[hits_before..].to_vec();
        let masked = format!(
            "{}{REDACTION_MARKER}",
            run_secret_lead(RunSecret::Redact, &self.token)
        );
        let ok = evidence::carriers(&hits, &masked).next().is_some();
        self.report.rows.push(Row::control(
            phase,
            "control-redact-masked",
            ok,
            format!("the redacting host's canary received the key's lead followed by {REDACTION_MARKER}: {ok}"),
        ));
    }
}

fn kind_name(kind: RunSecret) -> &'static str {
    match kind {
        RunSecret::Split => "split",
        RunSecret::WebSocket => "websocket",
        RunSecret::Redact => "redact",
    }
}

/// A WebSocket to `addr` from the host: the handshake, one masked text
/// message, a close.
fn send_websocket_message(addr: SocketAddr, data: &str) -> std::io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    stream.write_all(
        b"GET / HTTP/1.1\r\nHost: control\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: Ym90dGxlLWdhdGUta2V5\r\n\r\n",
    )?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let mask = [1u8, 2, 3, 4];
    let payload: Vec<u8> = data
        .bytes()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    let mut frame = vec![0x81];
    if payload.len() < 126 {
        frame.push(0x80 | payload.len() as u8);
    } else {
        frame.push(0x80 | 126);
        frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    frame.extend_from_slice(&mask);
    frame.extend_from_slice(&payload);
    frame.extend_from_slice(&[0x88, 0x80, 0, 0, 0, 0]);
    stream.write_all(&frame)?;
    let mut rest = Vec::new();
    let _ = stream.take(64 * 1024).read_to_end(&mut rest);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::canary::Proto;
    use crate::escape::report::Verdict;

    fn hit(received: &[u8]) -> Hit {
        Hit {
            canary: "internet:80".into(),
            local: "198.51.100.10:80".parse().unwrap(),
            peer: "172.20.0.2:4000".parse().unwrap(),
            proto: Proto::Tcp,
            host: Some("allowed-a.bottle.test".into()),
            received: received.to_vec(),
        }
    }

    fn row(hits: &[Hit], detector: Option<bool>) -> Row {
        evidence::leak_row(
            "p",
            "secret-split-on-the-wire",
            "proxy",
            hits,
            &run_secret_wire_needle(RunSecret::Split, "tok"),
            "a byte of the split key's first half",
            detector,
        )
    }

    #[test]
    fn the_first_half_at_a_canary_is_an_escape_and_a_blind_detector_proves_nothing() {
        let lead = run_secret_lead(RunSecret::Split, "tok");
        let head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        // A bundle that holds back: the filler went, the key did not (the
        // lead may, in part or whole).
        let frame = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
        let filler = format!("note=filler&{lead}");
        let held = hit(format!("{head}{}", frame(&filler)).as_bytes());
        // One byte of the key, in a frame of its own.
        let leaked = hit(format!("{head}{}{}", frame(&filler), frame("A")).as_bytes());
        let r = row(&[held.clone(), leaked], Some(true));
        assert_eq!(r.verdict, Verdict::Escape, "{r:?}");
        assert_eq!(r.category, "proxy");
        assert!(r.detail.contains("first half"), "{}", r.detail);
        let r = row(std::slice::from_ref(&held), Some(true));
        assert_eq!(r.verdict, Verdict::Pass, "{r:?}");
        let r = row(&[held], Some(false));
        assert_eq!(r.verdict, Verdict::ControlFailed, "{r:?}");
    }

    #[test]
    fn each_probe_has_its_own_key_and_lead() {
        let needles: Vec<String> = ROWS
            .iter()
            .map(|&(kind, _, _, _)| run_secret_wire_needle(kind, "tok"))
            .collect();
        for (i, a) in needles.iter().enumerate() {
            for b in &needles[i + 1..] {
                assert!(!a.starts_with(b.as_str()) && !b.starts_with(a.as_str()));
            }
        }
    }
}
