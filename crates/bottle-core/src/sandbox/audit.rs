//! The sandbox interface's lines in a bottle's audit log, and the other
//! lines the host writes there (a published port's connections).
//!
//! The host appends them to the same `audit.jsonl` the bundle writes (with
//! `O_APPEND`, one `write` per line, so lines never interleave), in the
//! bundle's record shape with `daemon = "sandbox"`, so `bottle logs` shows
//! tool calls and resets among the bottle's traffic. They are
//! security-relevant ([`crate::audit_files::is_security_relevant`]): when
//! the bundle's rotation drops their generation it keeps them, so a flood
//! of the agent's traffic cannot erase a tool call's evidence. The bundle
//! counts them in the live file's size and rotates it when they fill it.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

/// The audit record version these lines are written with (the bundle's
/// `AUDIT_VERSION`: the shape is unchanged since 2).
const RECORD_VERSION: u32 = 3;

/// One audit line of the sandbox interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxRecord {
    v: u32,
    time: String,
    bottle: String,
    daemon: &'static str,
    decision: &'static str,
    host: String,
    port: u16,
    /// `EXEC` for a tool call, `RESET` for a reset.
    method: &'static str,
    /// The call's summary (already made safe), or the reset's outcome.
    path: String,
    status: u16,
    bytes_up: u64,
    bytes_down: u64,
    duration_ms: u64,
    /// `exit_<code>`, `timeout`, `verified`, `diverged:<sources>`, ...
    reason: String,
    rule: String,
    count: u64,
    /// A tool call's evidence hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<String>,
}

impl SandboxRecord {
    /// The line of one finished tool call.
    #[allow(clippy::too_many_arguments)]
    pub fn tool(
        bottle: &str,
        summary: &str,
        exit_code: i32,
        timed_out: bool,
        bytes_in: usize,
        bytes_out: usize,
        duration: Duration,
        evidence: &str,
    ) -> SandboxRecord {
        SandboxRecord {
            decision: "allow",
            method: "EXEC",
            path: summary.to_string(),
            bytes_up: bytes_in as u64,
            bytes_down: bytes_out as u64,
            duration_ms: millis(duration),
            reason: if timed_out {
                "timeout".into()
            } else {
                format!("exit_{exit_code}")
            },
            evidence: Some(evidence.to_string()),
            ..SandboxRecord::base(bottle)
        }
    }

    /// The line of a call the host refused an answer for, because the
    /// in-box agent's channel carried a frame it did not ask for
    /// (`channel_violation`, denied, no evidence: there is no result).
    pub fn channel_violation(bottle: &str, summary: &str) -> SandboxRecord {
        SandboxRecord {
            decision: "deny",
            method: "EXEC",
            path: summary.to_string(),
            reason: "channel_violation".into(),
            ..SandboxRecord::base(bottle)
        }
    }

    /// The line of one reset: `verified`, or what diverged (the bottle is
    /// then halted).
    pub fn reset(bottle: &str, outcome: &str, halted: bool, duration: Duration) -> SandboxRecord {
        SandboxRecord {
            decision: if halted { "deny" } else { "allow" },
            method: "RESET",
            path: if halted {
                "halted".into()
            } else {
                "golden".into()
            },
            duration_ms: millis(duration),
            reason: outcome.to_string(),
            ..SandboxRecord::base(bottle)
        }
    }

    /// The line of one connection to a published port, written by its
    /// forwarder on the host (`daemon = "port"`): `OPEN` when the box's
    /// port answered, `CLOSE` with the bytes each way when it ended,
    /// `refused` (denied) when nothing in the box listened. `host_port`
    /// is the host's loopback port, `path` the box's port.
    pub fn published_port(
        bottle: &str,
        method: &'static str,
        host_port: u16,
        port: u16,
        reason: &str,
        bytes: (u64, u64),
        duration: Duration,
    ) -> SandboxRecord {
        SandboxRecord {
            daemon: "port",
            decision: if reason == "published_port" {
                "allow"
            } else {
                "deny"
            },
            host: "127.0.0.1".into(),
            port: host_port,
            method,
            path: format!("box:{port}"),
            bytes_up: bytes.0,
            bytes_down: bytes.1,
            duration_ms: millis(duration),
            reason: reason.to_string(),
            rule: "publish".into(),
            ..SandboxRecord::base(bottle)
        }
    }

    fn base(bottle: &str) -> SandboxRecord {
        SandboxRecord {
            v: RECORD_VERSION,
            time: crate::time::now_rfc3339_millis(),
            bottle: bottle.to_string(),
            daemon: "sandbox",
            decision: "allow",
            host: String::new(),
            port: 0,
            method: "",
            path: String::new(),
            status: 0,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            reason: String::new(),
            rule: String::new(),
            count: 1,
            evidence: None,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Appends `record` to the log at `log` as one line.
pub fn append(log: &Path, record: &SandboxRecord) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?
        .write_all(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_lines_carry_the_evidence_and_read_as_audit_records() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        let record = SandboxRecord::tool(
            "bot-bottle-x",
            "echo hi",
            0,
            false,
            0,
            3,
            Duration::from_millis(2),
            "sha256:ab",
        );
        append(&log, &record).unwrap();
        append(
            &log,
            &SandboxRecord::reset(
                "bot-bottle-x",
                "verified",
                false,
                Duration::from_millis(200),
            ),
        )
        .unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["daemon"], "sandbox");
        assert_eq!(lines[0]["evidence"], "sha256:ab");
        assert_eq!(lines[0]["reason"], "exit_0");
        assert_eq!(lines[1]["method"], "RESET");
        assert!(lines[1].get("evidence").is_none());
    }
}
