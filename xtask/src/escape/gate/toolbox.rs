//! The in-box agent's channel under attack (issue 25): the toolbox probes
//! run as a tool call, `bottle execute`, so the in-box agent they attack
//! is the one carrying their own result back; the harness then checks
//! that the result it got is the probe's real output.

use anyhow::Context as _;
use bottle_core::sandbox::ToolResult;
use bottle_probe::contract::Targets;

use super::{BOTTLE_DIR, Bottle, Gate, PROBE_RUN_BOUND, PROBE_TIMEOUT_MS};
use crate::escape::probe;
use crate::escape::report::{Expect, Observed, Row};
use crate::escape::sys::Output;

/// The probes that attack the in-box agent (`bottle-probe`'s `toolbox`
/// category); outside a tool call they skip.
pub(super) const TOOLBOX_PROBES: &[&str] =
    &["toolbox-forge-fd", "toolbox-plant-frames", "toolbox-ptrace"];

impl Gate {
    /// Runs the toolbox probes in `bottle` through `bottle execute` and
    /// checks the result that came back.
    pub(super) fn toolbox_phase(
        &mut self,
        phase: &str,
        bottle: &Bottle,
        targets: Targets,
    ) -> anyhow::Result<()> {
        let only = TOOLBOX_PROBES.iter().map(ToString::to_string).collect();
        let mut config = probe::bottle_config(&self.token, PROBE_TIMEOUT_MS, targets, only);
        self.for_the_tier(&mut config);
        let path = self.write_config(&config)?;
        self.cli.cp(&path, &bottle.guard.name, BOTTLE_DIR)?;
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .context("config file name")?;
        let deadline = format!("{}s", PROBE_RUN_BOUND.as_secs() / 2);
        let run = self.cli.command(
            &[
                "execute",
                &bottle.guard.name,
                "--json",
                "--deadline",
                &deadline,
                "--",
                &format!("{BOTTLE_DIR}/bottle-probe"),
                "--config",
                &format!("{BOTTLE_DIR}/{file}"),
            ],
            PROBE_RUN_BOUND,
        );
        let out = self.sys.output(&run)?;
        let (row, probe_out) = result_row(phase, &out);
        self.report.rows.push(row);
        let (rows, results) = probe::bottle_rows(
            phase,
            &probe_out,
            &self.controls,
            &self.extra_controls,
            false,
        );
        self.report.rows.extend(rows);
        let killed = self.cli.command(
            &[
                "execute",
                &bottle.guard.name,
                "--json",
                "--",
                "sh",
                "-c",
                "kill -KILL $PPID; sleep 2; echo after-the-kill",
            ],
            PROBE_RUN_BOUND,
        );
        let out = self.sys.output(&killed)?;
        self.report.rows.push(kill_row(phase, &out));
        // Run as a tool call, no toolbox probe may have found nothing to
        // attack: a skip here would hide that the phase tested nothing.
        for name in TOOLBOX_PROBES {
            let found = results.iter().find(|r| r.probe == *name);
            if found.is_none_or(|r| r.observed.starts_with("skipped")) {
                self.report.rows.push(Row::new(
                    phase,
                    name,
                    "harness",
                    Expect::Blocked,
                    Observed::Error,
                    None,
                    format!("{name} did not attack an in-box agent: {found:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// The row for a call that ends its own in-box agent
/// (`toolbox-kill-fails-closed`). The agent may signal the in-box agent,
/// its own user's process, and that is not what this row checks: it
/// checks that the call then has no result, only the channel's error
/// (`BOT-X004`), so a signal can fail a call but never answer one.
fn kill_row(phase: &str, out: &Output) -> Row {
    let result = serde_json::from_str::<ToolResult>(&out.stdout);
    let (observed, detail) = match result {
        Ok(result) => (
            Observed::Reached,
            format!(
                "a result came back from a channel whose agent was killed: exit {}, {:?}",
                result.exit_code,
                String::from_utf8_lossy(&result.stdout)
            ),
        ),
        Err(_) if out.stderr.contains("BOT-X004") => (
            Observed::Blocked,
            format!(
                "the in-box agent was killed (same uid, not prevented); the call had no result: {}",
                out.stderr.trim()
            ),
        ),
        Err(_) => (
            Observed::Error,
            format!(
                "neither a result nor BOT-X004 (exit {:?}): {}",
                out.code,
                out.stderr.trim()
            ),
        ),
    };
    Row::new(
        phase,
        "toolbox-kill-fails-closed",
        "toolbox",
        Expect::Blocked,
        observed,
        None,
        detail,
    )
}

/// The row for the call's own result (`toolbox-result-real`: blocked when
/// `bottle execute` answered with the probe's real output: its JSON lines,
/// and nothing the probe did not print), and that output as the probe's.
fn result_row(phase: &str, out: &Output) -> (Row, Output) {
    let parsed = serde_json::from_str::<ToolResult>(&out.stdout);
    let (observed, detail, probe_out) = match parsed {
        Ok(result) => {
            let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
            let lines_are_results = stdout.lines().all(|line| {
                serde_json::from_str::<bottle_probe::contract::ProbeResult>(line).is_ok()
            });
            let observed = if lines_are_results && !stdout.is_empty() {
                Observed::Blocked
            } else {
                Observed::Reached
            };
            let detail = format!(
                "exit {}, {} lines of probe output, evidence {}",
                result.exit_code,
                stdout.lines().count(),
                result.evidence_hash
            );
            let probe_out = Output {
                code: Some(result.exit_code),
                stdout,
                stderr,
                timed_out: false,
            };
            (observed, detail, probe_out)
        }
        Err(err) => (
            Observed::Error,
            format!(
                "`bottle execute` gave no result ({err}; exit {:?}): {}",
                out.code,
                out.stderr.trim()
            ),
            Output {
                code: out.code,
                stdout: String::new(),
                stderr: out.stderr.clone(),
                timed_out: out.timed_out,
            },
        ),
    };
    let row = Row::new(
        phase,
        "toolbox-result-real",
        "toolbox",
        Expect::Blocked,
        observed,
        None,
        detail,
    );
    (row, probe_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(stdout: &str) -> Output {
        Output {
            code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
            timed_out: false,
        }
    }

    #[test]
    fn only_the_probes_own_lines_make_a_real_result() {
        let line = r#"{"probe":"toolbox-ptrace","category":"toolbox","expected":"","outcome":"blocked","observed":"EPERM","network":false}"#;
        let result = |stdout: &str| {
            serde_json::to_string(&ToolResult {
                exit_code: 0,
                stdout: stdout.as_bytes().to_vec(),
                stderr: Vec::new(),
                truncated: false,
                duration: std::time::Duration::from_millis(1),
                evidence_hash: "sha256:00".into(),
            })
            .unwrap()
        };
        let (row, probe_out) = result_row("p", &out(&result(&format!("{line}\n"))));
        assert_eq!(row.observed, Observed::Blocked);
        assert_eq!(probe_out.stdout, format!("{line}\n"));
        let (row, _) = result_row("p", &out(&result("FORGED by the agent\n")));
        assert_eq!(row.observed, Observed::Reached);
        let (row, _) = result_row("p", &out("error[BOT-X007]: ..."));
        assert_eq!(row.observed, Observed::Error);
    }

    #[test]
    fn a_killed_agent_must_leave_the_call_without_a_result() {
        let failed = |stderr: &str| Output {
            code: Some(1),
            stdout: String::new(),
            stderr: stderr.into(),
            timed_out: false,
        };
        let broke = failed("error[BOT-X004]: the in-box agent's channel broke");
        assert_eq!(kill_row("p", &broke).observed, Observed::Blocked);
        assert_eq!(
            kill_row("p", &failed("error[BOT-D031]: no such bottle")).observed,
            Observed::Error
        );
        let answered = serde_json::to_string(&ToolResult {
            exit_code: 0,
            stdout: b"after-the-kill\n".to_vec(),
            stderr: Vec::new(),
            truncated: false,
            duration: std::time::Duration::from_millis(1),
            evidence_hash: "sha256:00".into(),
        })
        .unwrap();
        assert_eq!(kill_row("p", &out(&answered)).observed, Observed::Reached);
    }
}
