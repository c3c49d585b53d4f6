//! What an agent's text does to the operator's terminal: after the probe
//! planted terminal controls through supervise (`operator-hostile-text`),
//! the operator's commands that print agent text must print none raw.
//!
//! The control is that the planted text reached the operator's side raw
//! (in the bottle's state on the host) and that the commands list what was
//! planted: a clean output that never contained the request proves nothing.
//! `bottle logs` is read in both its forms, the readable lines it prints by
//! default and `--json`, each checked to be the form asked for.

use std::path::Path;
use std::time::Duration;

use bottle_probe::contract::{HOSTILE_EGRESS_HOST, HOSTILE_TEXT, TERMINAL_ACTIVE};

use super::Gate;
use crate::escape::report::{Expect, Observed, Row};

impl Gate {
    /// One row per operator command that prints agent text.
    pub(super) fn operator_output(&mut self, phase: &str, bottle: &str) -> anyhow::Result<()> {
        let planted = holds_raw(&self.cli.state_home, HOSTILE_TEXT[0], 64);
        let commands: [(&str, Vec<&str>); 4] = [
            ("operator-requests-table", vec!["requests", "--all", bottle]),
            (
                "operator-requests-json",
                vec!["requests", "--all", "--json", bottle],
            ),
            ("operator-logs", vec!["logs", bottle]),
            ("operator-logs-json", vec!["logs", "--json", bottle]),
        ];
        for (probe, args) in commands {
            let out = self
                .sys
                .output(&self.cli.command(&args, Duration::from_secs(60)))?;
            let printed = format!("{}{}", out.stdout, out.stderr);
            let raw: Vec<String> = TERMINAL_ACTIVE
                .iter()
                .filter(|c| printed.contains(**c))
                .map(|c| format!("U+{:04X}", u32::from(*c)))
                .collect();
            // The logs carry no planted text of their own (supervise audits
            // the request, not the reason): their control is the planting,
            // and that the audit lines came out in the form asked for.
            let listed = match probe {
                "operator-logs" => logs_form(&out.stdout) == Some(LogsForm::Readable),
                "operator-logs-json" => logs_form(&out.stdout) == Some(LogsForm::Json),
                _ => printed.contains(HOSTILE_EGRESS_HOST),
            };
            let (observed, detail) = if !out.success() {
                (
                    Observed::Error,
                    format!("`bottle {}` failed: {}", args.join(" "), out.stderr.trim()),
                )
            } else if raw.is_empty() {
                (
                    Observed::Blocked,
                    format!(
                        "`bottle {}`: no terminal control came out raw",
                        args.join(" ")
                    ),
                )
            } else {
                (
                    Observed::Reached,
                    format!("`bottle {}` printed raw {}", args.join(" "), raw.join(" ")),
                )
            };
            self.report.rows.push(Row::new(
                phase,
                probe,
                "operator",
                Expect::Blocked,
                observed,
                Some(planted && listed),
                detail,
            ));
        }
        Ok(())
    }
}

/// The form `bottle logs` printed its lines in.
#[derive(Debug, PartialEq, Eq)]
enum LogsForm {
    /// One line of text per decision (the default).
    Readable,
    /// The audit log's JSON lines (`--json`).
    Json,
}

/// The form of `stdout` when it has lines and all are of one form.
fn logs_form(stdout: &str) -> Option<LogsForm> {
    let is_record = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line).is_ok_and(|value| value.is_object())
    };
    let lines: Vec<&str> = stdout.lines().collect();
    if lines.is_empty() {
        None
    } else if lines.iter().all(|line| is_record(line)) {
        Some(LogsForm::Json)
    } else if lines.iter().any(|line| is_record(line)) {
        None
    } else {
        Some(LogsForm::Readable)
    }
}

/// Whether some file under `dir` (at most `depth` levels down, each at
/// most 1 MiB) holds `needle` as raw UTF-8.
fn holds_raw(dir: &Path, needle: &str, depth: usize) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() && depth > 0 => holds_raw(&path, needle, depth - 1),
            Ok(t) if t.is_file() => {
                entry.metadata().is_ok_and(|m| m.len() <= 1 << 20)
                    && std::fs::read(&path).is_ok_and(|bytes| {
                        bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
                    })
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_output_is_told_by_its_form() {
        let json = r#"{"decision":"deny","host":"a.test"}"#;
        let text = "2025-01-02 05:04:05  deny  CONNECT a.test:443  403  host_not_allowed";
        assert_eq!(
            logs_form(&format!("{json}\n{json}\n")),
            Some(LogsForm::Json)
        );
        assert_eq!(logs_form(&format!("{text}\n")), Some(LogsForm::Readable));
        assert_eq!(logs_form(&format!("{text}\n{json}\n")), None);
        assert_eq!(logs_form(""), None);
    }

    #[test]
    fn planted_text_is_found_raw_and_only_raw() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/r.json"), "\\u009b2J escaped").unwrap();
        assert!(!holds_raw(dir.path(), HOSTILE_TEXT[0], 4));
        std::fs::write(dir.path().join("a/b/s.json"), HOSTILE_TEXT[0]).unwrap();
        assert!(holds_raw(dir.path(), HOSTILE_TEXT[0], 4));
        assert!(!holds_raw(dir.path(), HOSTILE_TEXT[0], 1));
    }
}
