//! What an agent's text does to the operator's terminal: after the probe
//! planted terminal controls through supervise (`operator-hostile-text`),
//! the operator's commands that print agent text must print none raw.
//!
//! The control is that the planted text reached the operator's side raw
//! (in the bottle's state on the host) and that the commands list what was
//! planted: a clean output that never contained the request proves nothing.

use std::path::Path;
use std::time::Duration;

use bottle_probe::contract::{HOSTILE_EGRESS_HOST, HOSTILE_TEXT, TERMINAL_ACTIVE};

use super::Gate;
use crate::escape::report::{Expect, Observed, Row};

impl Gate {
    /// One row per operator command that prints agent text.
    pub(super) fn operator_output(&mut self, phase: &str, bottle: &str) -> anyhow::Result<()> {
        let planted = holds_raw(&self.cli.state_home, HOSTILE_TEXT[0], 64);
        let commands: [(&str, Vec<&str>); 3] = [
            ("operator-requests-table", vec!["requests", "--all", bottle]),
            (
                "operator-requests-json",
                vec!["requests", "--all", "--json", bottle],
            ),
            ("operator-logs", vec!["logs", bottle]),
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
            // the request, not the reason): their control is the planting.
            let listed = probe == "operator-logs" || printed.contains(HOSTILE_EGRESS_HOST);
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
