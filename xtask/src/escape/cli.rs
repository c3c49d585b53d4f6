//! The real `bottle` CLI, driven the way an operator drives it: the gate
//! tests what ships, not a library shortcut around it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::sys::{Output, Run, Sys, checked};
use super::teardown;

/// How to run `bottle`.
#[derive(Clone)]
pub(crate) struct BottleCli {
    /// The `bottle` binary.
    pub bin: PathBuf,
    /// The manifest every command gets.
    pub manifest: PathBuf,
    /// `XDG_STATE_HOME` for the run, so its state stays out of the
    /// operator's.
    pub state_home: PathBuf,
    /// The static bundle binary (`BOTTLE_BUNDLE_BIN`).
    pub bundle_bin: PathBuf,
    /// The static in-box agent (`BOTTLE_TOOLBOX_BIN`), so the gate's
    /// bottles carry what every bottle carries.
    pub toolbox_bin: PathBuf,
    /// The backend under test.
    pub backend: String,
    /// Runs it.
    pub sys: Arc<dyn Sys>,
}

impl BottleCli {
    /// The argv and environment of `bottle ARGS`.
    pub(crate) fn command<S: AsRef<str>>(&self, args: &[S], timeout: Duration) -> Run {
        let mut all = vec![
            "--backend".to_string(),
            self.backend.clone(),
            "--manifest".to_string(),
            self.manifest.display().to_string(),
        ];
        all.extend(args.iter().map(|a| a.as_ref().to_string()));
        Run::new(&self.bin.display().to_string(), &all)
            .timeout(timeout)
            .env("XDG_STATE_HOME", &self.state_home.display().to_string())
            .env("BOTTLE_BUNDLE_BIN", &self.bundle_bin.display().to_string())
            .env(
                "BOTTLE_TOOLBOX_BIN",
                &self.toolbox_bin.display().to_string(),
            )
    }

    fn checked<S: AsRef<str>>(&self, args: &[S], timeout: Duration) -> anyhow::Result<String> {
        let run = self.command(args, timeout);
        checked(self.sys.output(&run)?, &run)
    }

    /// `bottle start AGENT --yes --detach`; returns the bottle's name.
    pub(crate) fn start(&self, agent: &str) -> anyhow::Result<String> {
        let out = self.checked(
            &["start", agent, "--yes", "--detach"],
            Duration::from_secs(300),
        )?;
        let name = out
            .lines()
            .map(str::trim)
            .rfind(|l| l.starts_with("bot-bottle-"))
            .map(str::to_string);
        name.with_context(|| format!("`bottle start {agent}` printed no bottle name: {out:?}"))
    }

    /// `bottle pool fill AGENT 1 --yes`: one pooled bottle waits.
    pub(crate) fn fill_pool(&self, agent: &str) -> anyhow::Result<()> {
        self.checked(
            &["pool", "fill", agent, "1", "--yes"],
            Duration::from_secs(300),
        )
        .map(drop)
    }

    /// `bottle pool drain`: no pooled bottle waits.
    pub(crate) fn drain_pool(&self) -> anyhow::Result<()> {
        self.checked(&["pool", "drain"], Duration::from_secs(120))
            .map(drop)
    }

    /// The pool's state of bottle `name` (`ready`, `claimed`), from `bottle
    /// pool list --json`; `None` if it is no pool entry.
    pub(crate) fn pool_state(&self, name: &str) -> anyhow::Result<Option<String>> {
        let out = self.checked(&["pool", "list", "--json"], Duration::from_secs(60))?;
        let entries: Vec<Value> = serde_json::from_str(&out)
            .with_context(|| format!("`bottle pool list --json` printed {out:?}"))?;
        Ok(entries
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["state"].as_str())
            .map(str::to_string))
    }

    /// `bottle list --json`.
    pub(crate) fn list(&self) -> anyhow::Result<Vec<Value>> {
        let out = self.checked(&["list", "--json"], Duration::from_secs(60))?;
        let value: Value = serde_json::from_str(out.trim())
            .with_context(|| format!("`bottle list --json` printed {out:?}"))?;
        Ok(value.as_array().cloned().unwrap_or_default())
    }

    /// The bundle address `bottle list --json` reports for `name`.
    pub(crate) fn bundle_address(&self, name: &str) -> anyhow::Result<String> {
        let list = self.list()?;
        let entry = list
            .iter()
            .find(|b| b["name"].as_str() == Some(name))
            .with_context(|| format!("`bottle list --json` does not list {name}"))?;
        entry["bundle_address"]
            .as_str()
            .map(|a| a.split(':').next().unwrap_or(a).to_string())
            .with_context(|| format!("`bottle list --json` gives no bundle_address for {name}"))
    }

    /// `bottle exec NAME -- ARGV` (exit code kept, not checked).
    pub(crate) fn exec<S: AsRef<str>>(
        &self,
        name: &str,
        argv: &[S],
        timeout: Duration,
    ) -> anyhow::Result<Output> {
        let mut args = vec!["exec".to_string(), name.to_string(), "--".to_string()];
        args.extend(argv.iter().map(|a| a.as_ref().to_string()));
        self.sys.output(&self.command(&args, timeout))
    }

    /// `bottle cp HOST NAME:DIR`.
    pub(crate) fn cp(&self, host: &Path, name: &str, dir: &str) -> anyhow::Result<()> {
        self.checked(
            &["cp", &host.display().to_string(), &format!("{name}:{dir}")],
            Duration::from_secs(60),
        )?;
        Ok(())
    }

    /// `bottle reset NAME`.
    pub(crate) fn reset(&self, name: &str) -> anyhow::Result<Output> {
        self.sys
            .output(&self.command(&["reset", name], Duration::from_secs(120)))
    }

    /// `bottle stop --wait NAME`: finished before the gate goes on, so no
    /// finisher outlives the run (its temporary state root and, with the
    /// microVM double, smolvm's data dir go with it).
    pub(crate) fn stop(&self, name: &str) -> anyhow::Result<()> {
        let run = self.command(&["stop", "--wait", name], Duration::from_secs(120));
        let out = self.sys.output(&run)?;
        if !out.success() && !out.stderr.contains("no bottle named") {
            bail!("`{}` failed: {}", run.display(), out.stderr.trim());
        }
        Ok(())
    }
}

/// A started bottle; stopped when dropped (and on Ctrl-C).
pub(crate) struct BottleGuard {
    /// `bot-bottle-<slug>`.
    pub name: String,
    teardown_id: u64,
}

impl BottleGuard {
    /// Starts `agent` and guards the bottle. A start that fails half-way is
    /// the backend's to unwind; the name is stopped anyway in case it did
    /// not.
    pub(crate) fn start(cli: &BottleCli, agent: &str) -> anyhow::Result<BottleGuard> {
        let expected = format!("bot-bottle-{agent}");
        let stopper = cli.clone();
        let stop_name = expected.clone();
        let teardown_id = teardown::register("stop a bottle", move || {
            if let Err(err) = stopper.stop(&stop_name) {
                eprintln!("sandbox-escape: {err:#}");
            }
        });
        let guard = BottleGuard {
            name: expected.clone(),
            teardown_id,
        };
        let name = cli.start(agent)?;
        if name != expected {
            bail!("`bottle start {agent}` named the bottle {name}, expected {expected}");
        }
        Ok(guard)
    }
}

impl BottleGuard {
    /// Fills a pool of one bottle of `agent`, then starts `agent`, which
    /// claims it (or starts cold if the claim refused it: the caller
    /// checks [`BottleCli::pool_state`]), and guards the bottle.
    pub(crate) fn claim_pooled(cli: &BottleCli, agent: &str) -> anyhow::Result<BottleGuard> {
        let drainer = cli.clone();
        let drain_id = teardown::register("drain the pool", move || {
            if let Err(err) = drainer.drain_pool() {
                eprintln!("sandbox-escape: {err:#}");
            }
        });
        cli.fill_pool(agent)?;
        let started = cli.start(agent);
        teardown::run(drain_id);
        let name = started?;
        let stopper = cli.clone();
        let stop_name = name.clone();
        let teardown_id = teardown::register("stop a bottle", move || {
            if let Err(err) = stopper.stop(&stop_name) {
                eprintln!("sandbox-escape: {err:#}");
            }
        });
        Ok(BottleGuard { name, teardown_id })
    }
}

impl Drop for BottleGuard {
    fn drop(&mut self) {
        teardown::run(self.teardown_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::sys::RealSys;

    #[test]
    fn every_command_names_backend_manifest_and_state() {
        let cli = BottleCli {
            bin: "/t/bottle".into(),
            manifest: "/m/bottle.toml".into(),
            state_home: "/s".into(),
            bundle_bin: "/b/bottle-bundle".into(),
            toolbox_bin: "/b/bottle-toolbox".into(),
            backend: "docker".into(),
            sys: Arc::new(RealSys),
        };
        let run = cli.command(
            &["exec", "bot-bottle-a", "--", "/tmp/bottle-probe"],
            Duration::from_secs(5),
        );
        assert_eq!(
            run.display(),
            "/t/bottle --backend docker --manifest /m/bottle.toml exec bot-bottle-a -- /tmp/bottle-probe"
        );
        assert!(run.env.contains(&("XDG_STATE_HOME".into(), "/s".into())));
        assert!(
            run.env
                .contains(&("BOTTLE_BUNDLE_BIN".into(), "/b/bottle-bundle".into()))
        );
        assert!(
            run.env
                .contains(&("BOTTLE_TOOLBOX_BIN".into(), "/b/bottle-toolbox".into()))
        );
    }
}
