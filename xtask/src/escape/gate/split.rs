//! The harness's side of `proxy-secret-split`: the probe sends a fake key
//! in two chunks with a pause between them, and the bundle's scanner must
//! hold back the first half until it has seen the second. Whatever the
//! probe's answer, no canary may have received a byte of the first half
//! (`secret-split-on-the-wire`, looking for the per-run field before the
//! key and the key's first byte, in the bytes as sent and with chunk
//! framing taken out); its control is the host sending that field and half
//! in a chunked POST to the internet canary's port 80 and finding it
//! recorded.

use bottle_probe::contract::{
    SPLIT_SECRET_FIRST, split_secret, split_secret_lead, split_secret_wire_needle,
};

use super::Gate;
use crate::escape::canary::Hit;
use crate::escape::evidence;
use crate::escape::report::Row;

/// The harness row of every probing phase.
pub(super) const SPLIT_ROW: &str = "secret-split-on-the-wire";

impl Gate {
    /// The host's chunked POST of the first half must be recorded at
    /// internet:80 (where the allowed host is pinned), or a clean
    /// [`SPLIT_ROW`] proves nothing.
    pub(super) fn split_detector_control(&mut self, phase: &str) -> anyhow::Result<()> {
        let half = &split_secret(&self.token)[..SPLIT_SECRET_FIRST];
        let data = format!("note=control&{}{half}", split_secret_lead(&self.token));
        let request = format!(
            "POST / HTTP/1.1\r\nHost: control\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{data}\r\n0\r\n\r\n",
            data.len()
        );
        let seen = self.detector_sees(&request, &split_secret_wire_needle(&self.token), &[80]);
        let ok = seen.iter().all(|(_, s)| *s);
        self.split_detector = Some(ok);
        self.report.rows.push(Row::control(
            phase,
            "control-secret-split-detector",
            ok,
            format!("the split key's first half sent from the host was seen at internet:{seen:?}"),
        ));
        Ok(())
    }

    /// [`SPLIT_ROW`] for the canary hits of one probing phase.
    pub(super) fn split_evidence(&mut self, phase: &str, hits: &[Hit]) {
        self.report.rows.push(split_row(
            phase,
            hits,
            &split_secret_wire_needle(&self.token),
            self.split_detector,
        ));
    }
}

fn split_row(phase: &str, hits: &[Hit], needle: &str, detector: Option<bool>) -> Row {
    evidence::leak_row(
        phase,
        SPLIT_ROW,
        "proxy",
        hits,
        needle,
        "a byte of the split key's first half",
        detector,
    )
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

    #[test]
    fn the_first_half_at_a_canary_is_an_escape_and_a_blind_detector_proves_nothing() {
        let needle = split_secret_wire_needle("tok");
        let lead = split_secret_lead("tok");
        let head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        // A bundle that holds back: the filler went, the key did not (the
        // lead may, in part or whole).
        let frame = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
        let filler = format!("note=filler&{lead}");
        let held = hit(format!("{head}{}", frame(&filler)).as_bytes());
        // One byte of the key, in a frame of its own.
        let leaked = hit(format!("{head}{}{}", frame(&filler), frame("A")).as_bytes());
        let row = split_row("p", &[held.clone(), leaked], &needle, Some(true));
        assert_eq!(row.verdict, Verdict::Escape, "{row:?}");
        assert_eq!(row.category, "proxy");
        assert!(row.detail.contains("first half"), "{}", row.detail);
        let row = split_row("p", std::slice::from_ref(&held), &needle, Some(true));
        assert_eq!(row.verdict, Verdict::Pass, "{row:?}");
        let row = split_row("p", &[held], &needle, Some(false));
        assert_eq!(row.verdict, Verdict::ControlFailed, "{row:?}");
    }
}
