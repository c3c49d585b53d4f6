//! What an agent's planted links and trees (`cp-plant`) do to the
//! operator's `bottle cp`: after a full probe phase the harness runs the
//! real `bottle cp` both ways against what the probe left in
//! `/tmp/bottle-cp-probe` and judges each copy.
//!
//! Into the box, through a link to `/etc/bottle`, to `/.bottle`, or to
//! `/etc` above the destination: blocked when the copy is refused and
//! nothing under `/etc/bottle` or `/.bottle` changed (read back as the
//! agent sees it); reached when the file the operator sent (holding the
//! run's token) is there. Their control: the same copies into a plain
//! directory of the box land.
//!
//! Out of the box, a tree with a link out of it (to a file and to a tree
//! on stdout), one with a fifo: blocked when the copy is refused and
//! nothing reached the host (the destination stays empty, stdout says
//! nothing); reached when the link or the fifo was made on the host. A
//! tree with a set-uid file: blocked when it lands without the bit. Their
//! control: a plain tree comes out with the run's token, to a directory
//! and on stdout.

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_probe::contract::{
    CP_DATA, CP_DIR, CP_OUT_FIFO, CP_OUT_LINK, CP_OUT_PLAIN, CP_OUT_SETUID, CP_PLAIN_IN,
    CP_SETUID_FILE,
};
use bottle_probe::contract::{Outcome, ProbeResult};

use super::Gate;
use crate::escape::report::{Expect, Observed, Row};
use crate::escape::sys::Output;

const CAT: &str = "copy";
const CP_TIMEOUT: Duration = Duration::from_secs(120);

/// What bottle owns in the box, as the agent sees it: each path, its
/// mode, owner, size and time, and each readable file's hash.
const OWNED_STATE: &str = "find /etc/bottle /.bottle 2>/dev/null | sort | while read -r f; do ls -ld \"$f\"; [ -f \"$f\" ] && [ -r \"$f\" ] && sha256sum \"$f\"; done";

/// A copy in through a planted link: the row's name, the host file sent,
/// the destination in the box, and the file bottle owns it must not reach.
const IN_THROUGH_LINKS: &[(&str, &str, &str, &str)] = &[
    (
        "cp-in-link-etc-bottle",
        "mcp.json",
        "to-etc-bottle",
        "/etc/bottle/mcp.json",
    ),
    (
        "cp-in-link-etc-bottle-file",
        "mcp.json",
        "to-etc-bottle/mcp.json",
        "/etc/bottle/mcp.json",
    ),
    (
        "cp-in-link-dot-bottle",
        "toolbox",
        "to-dot-bottle",
        "/.bottle/toolbox",
    ),
    (
        "cp-in-link-parent",
        "mcp.json",
        "to-etc/bottle",
        "/etc/bottle/mcp.json",
    ),
];

impl Gate {
    /// The `bottle cp` rows for `bottle` after a full probe phase.
    pub(super) fn copy_evidence(
        &mut self,
        phase: &str,
        bottle: &str,
        results: &[ProbeResult],
    ) -> anyhow::Result<()> {
        let planted = results
            .iter()
            .any(|r| r.probe == "cp-plant" && r.outcome == Outcome::Blocked);
        self.config_seq += 1;
        let host = self.work.join(format!("cp-{}", self.config_seq));
        std::fs::create_dir_all(&host)?;
        let sent = format!("cp-probe {}\n", self.token);
        for file in ["mcp.json", "toolbox"] {
            std::fs::write(host.join(file), &sent)?;
        }
        let rows = if planted {
            self.copy_rows(phase, bottle, &host)?
        } else {
            vec![Row::new(
                phase,
                "cp-planted",
                CAT,
                Expect::Blocked,
                Observed::Error,
                None,
                "`cp-plant` did not plant the links and trees: nothing to copy through",
            )]
        };
        self.report.rows.extend(rows);
        let _ = std::fs::remove_dir_all(&host);
        Ok(())
    }

    fn copy_rows(&self, phase: &str, bottle: &str, host: &Path) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        let at = |path: &str| format!("{bottle}:{CP_DIR}/{path}");

        // In: the control first, then each planted link.
        let mut landed = true;
        for file in ["mcp.json", "toolbox"] {
            let out = self.cp(&[&host.join(file).display().to_string(), &at(CP_PLAIN_IN)])?;
            landed &= out.success();
        }
        let check = self.in_box(
            bottle,
            &format!("cat {CP_DIR}/{CP_PLAIN_IN}/mcp.json {CP_DIR}/{CP_PLAIN_IN}/toolbox"),
        )?;
        let control_in = landed && check.stdout.matches(self.token.as_str()).count() == 2;
        rows.push(Row::control(
            phase,
            "control-cp-in",
            control_in,
            format!("the same copies into the plain {CP_DIR}/{CP_PLAIN_IN} landed: {control_in}"),
        ));
        let before = self.in_box(bottle, OWNED_STATE)?.stdout;
        for (probe, file, dest, victim) in IN_THROUGH_LINKS {
            let out = self.cp(&[&host.join(file).display().to_string(), &at(dest)])?;
            let read = self.in_box(bottle, &format!("cat {victim} 2>/dev/null"))?;
            let (observed, detail) = if read.stdout.contains(self.token.as_str()) {
                (
                    Observed::Reached,
                    format!("the operator's {file} was written to {victim}"),
                )
            } else if out.success() {
                (
                    Observed::Error,
                    format!("`bottle cp` to {CP_DIR}/{dest} succeeded; {victim} is untouched"),
                )
            } else {
                (
                    Observed::Blocked,
                    format!(
                        "refused (exit {:?}): {}",
                        out.code,
                        first_error(&out.stderr)
                    ),
                )
            };
            rows.push(Row::new(
                phase,
                probe,
                CAT,
                Expect::Blocked,
                observed,
                Some(control_in),
                detail,
            ));
        }
        let after = self.in_box(bottle, OWNED_STATE)?.stdout;
        let unchanged = !before.is_empty() && before == after;
        rows.push(Row::new(
            phase,
            "cp-in-owned-unchanged",
            CAT,
            Expect::Blocked,
            Observed::reached_if(!before.is_empty() && before != after),
            Some(control_in),
            if unchanged {
                "nothing under /etc/bottle or /.bottle changed".to_string()
            } else if before.is_empty() {
                "could not read /etc/bottle and /.bottle in the box".to_string()
            } else {
                format!("changed: {}", changed_lines(&before, &after))
            },
        ));

        // Out: the controls, to a directory and on stdout.
        let out_dir = |name: &str| -> anyhow::Result<PathBuf> {
            let dir = host.join(name);
            std::fs::create_dir_all(&dir)?;
            Ok(dir)
        };
        let plain = out_dir("control")?;
        let out = self.cp(&[&at(CP_OUT_PLAIN), &plain.display().to_string()])?;
        let data =
            std::fs::read_to_string(plain.join(CP_OUT_PLAIN).join(CP_DATA)).unwrap_or_default();
        let control_out = out.success() && data.contains(self.token.as_str());
        let streamed = self.cp(&[&at(CP_OUT_PLAIN), "-"])?;
        let control_stdout = streamed.success() && streamed.stdout.contains(self.token.as_str());
        rows.push(Row::control(
            phase,
            "control-cp-out",
            control_out && control_stdout,
            format!(
                "{CP_DIR}/{CP_OUT_PLAIN} came out with the run's token: to a directory {control_out}, on stdout {control_stdout}"
            ),
        ));
        let control_out = control_out && control_stdout;

        for (probe, tree) in [
            ("cp-out-link-out", CP_OUT_LINK),
            ("cp-out-fifo", CP_OUT_FIFO),
        ] {
            let dest = out_dir(probe)?;
            let out = self.cp(&[&at(tree), &dest.display().to_string()])?;
            let made = unsafe_entries(&dest);
            let left = std::fs::read_dir(&dest).map(|d| d.count()).unwrap_or(0);
            // gVisor keeps a fifo the box makes in its own kernel: the
            // host's side of the box's files, all `bottle cp` reads, never
            // has it, so the tree comes out without it.
            let fifo_unseen = self.gvisor.is_some()
                && probe == "cp-out-fifo"
                && out.success()
                && dest.join(CP_OUT_FIFO).is_dir()
                && std::fs::symlink_metadata(dest.join(CP_OUT_FIFO).join("pipe")).is_err();
            let (observed, detail) = if !made.is_empty() {
                (
                    Observed::Reached,
                    format!("written on the host: {}", made.join(", ")),
                )
            } else if fifo_unseen {
                (
                    Observed::Blocked,
                    "the box's fifo lives in gVisor's kernel, not in the files the host reads: the tree came out without it, nothing unsafe written".to_string(),
                )
            } else if out.success() || left > 0 {
                (
                    Observed::Error,
                    format!(
                        "`bottle cp` exited {:?} and left {left} entries, none unsafe",
                        out.code
                    ),
                )
            } else {
                (
                    Observed::Blocked,
                    format!(
                        "refused (exit {:?}), nothing written: {}",
                        out.code,
                        first_error(&out.stderr)
                    ),
                )
            };
            rows.push(Row::new(
                phase,
                probe,
                CAT,
                Expect::Blocked,
                observed,
                Some(control_out),
                detail,
            ));
        }
        let out = self.cp(&[&at(CP_OUT_LINK), "-"])?;
        let (observed, detail) = if out.stdout.contains("/etc/passwd") {
            (
                Observed::Reached,
                "the link to /etc/passwd reached stdout".to_string(),
            )
        } else if out.success() || !out.stdout.is_empty() {
            (
                Observed::Error,
                format!(
                    "`bottle cp … -` exited {:?} with {} bytes on stdout",
                    out.code,
                    out.stdout.len()
                ),
            )
        } else {
            (
                Observed::Blocked,
                format!(
                    "refused (exit {:?}), nothing on stdout: {}",
                    out.code,
                    first_error(&out.stderr)
                ),
            )
        };
        rows.push(Row::new(
            phase,
            "cp-out-link-out-stdout",
            CAT,
            Expect::Blocked,
            observed,
            Some(control_out),
            detail,
        ));

        let dest = out_dir("cp-out-setuid")?;
        let out = self.cp(&[&at(CP_OUT_SETUID), &dest.display().to_string()])?;
        let tool = dest.join(CP_OUT_SETUID).join(CP_SETUID_FILE);
        let (observed, detail) = match std::fs::metadata(&tool) {
            Ok(meta) if meta.mode() & 0o6000 != 0 => (
                Observed::Reached,
                format!(
                    "{} landed with mode {:o}",
                    tool.display(),
                    meta.mode() & 0o7777
                ),
            ),
            Ok(meta) => (
                Observed::Blocked,
                format!("landed with mode {:o}: no set-id bit", meta.mode() & 0o7777),
            ),
            Err(_) => (
                Observed::Error,
                format!(
                    "`bottle cp` exited {:?} and the file did not land: {}",
                    out.code,
                    first_error(&out.stderr)
                ),
            ),
        };
        rows.push(Row::new(
            phase,
            "cp-out-setuid",
            CAT,
            Expect::Blocked,
            observed,
            Some(control_out),
            detail,
        ));
        Ok(rows)
    }

    /// `bottle cp ARGS`, exit code kept.
    fn cp(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut all = vec!["cp"];
        all.extend_from_slice(args);
        self.sys.output(&self.cli.command(&all, CP_TIMEOUT))
    }

    /// A shell script in the box, as the agent.
    fn in_box(&self, bottle: &str, script: &str) -> anyhow::Result<Output> {
        self.cli
            .exec(bottle, &["sh", "-c", script], Duration::from_secs(60))
    }
}

/// The first `error[…]` line `bottle` printed.
fn first_error(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.starts_with("error["))
        .unwrap_or_else(|| stderr.lines().next().unwrap_or(""))
        .chars()
        .take(200)
        .collect()
}

/// Lines of `after` not in `before`, and the other way round, shortened.
fn changed_lines(before: &str, after: &str) -> String {
    let gone = before.lines().filter(|l| !after.contains(l));
    let new = after.lines().filter(|l| !before.contains(l));
    gone.map(|l| format!("-{l}"))
        .chain(new.map(|l| format!("+{l}")))
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(300)
        .collect()
}

/// Everything under `dir` that a copy out must never make: a link whose
/// target is absolute or climbs, a fifo, socket or device, a set-id file.
fn unsafe_entries(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            let target = std::fs::read_link(&path).unwrap_or_default();
            if target.is_absolute() || target.starts_with("..") {
                found.push(format!("{} -> {}", path.display(), target.display()));
            }
        } else if kind.is_fifo()
            || kind.is_socket()
            || kind.is_char_device()
            || kind.is_block_device()
        {
            found.push(format!("{} (special file)", path.display()));
        } else if meta.mode() & 0o6000 != 0 {
            found.push(format!("{} (set-id)", path.display()));
        } else if kind.is_dir() {
            found.extend(unsafe_entries(&path));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_entries_are_links_out_special_files_and_set_id_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("t/sub")).unwrap();
        std::fs::write(root.join("t/sub/ok"), "x").unwrap();
        std::os::unix::fs::symlink("ok", root.join("t/sub/in")).unwrap();
        assert!(unsafe_entries(root).is_empty());
        std::os::unix::fs::symlink("/etc/passwd", root.join("t/sub/abs")).unwrap();
        std::os::unix::fs::symlink("../../../x", root.join("t/up")).unwrap();
        nix::unistd::mkfifo(
            &root.join("t/pipe"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let mut found = unsafe_entries(root);
        found.sort();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found.iter().any(|f| f.ends_with("abs -> /etc/passwd")));
    }

    #[test]
    fn changes_are_shown_both_ways() {
        assert_eq!(changed_lines("a\nb\n", "a\nc\n"), "-b +c");
        assert_eq!(
            first_error("warn\nerror[BOT-F003]: no\n"),
            "error[BOT-F003]: no"
        );
    }
}
