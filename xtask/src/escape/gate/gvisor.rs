//! What a gVisor run adds: the memory hog, alone, last, in a bottle of its
//! own. Past its memory limit the host kills a gVisor box whole (there is
//! no OOM killer inside gVisor that picks one process), so the probe's
//! own result line dies with it; the row is the host's record instead:
//! the agent container was killed by the OOM killer, and the bottle's
//! bundle (another container) still runs.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{BOTTLE_DIR, D, Gate, PROBE_TIMEOUT_MS, progress};
use crate::escape::probe;
use crate::escape::report::{Expect, Observed, Row};

/// The daemon's gVisor runtime the run's bottles use.
#[derive(Debug, Clone)]
pub(crate) struct Runtime {
    /// Its registered name ([`bottle_core::isolation::GVISOR_RUNTIME_ENV`]
    /// or `runsc`, as bottle looks it up).
    pub name: String,
    /// Its binary as registered.
    pub path: String,
}

impl Runtime {
    /// The runtime bottle will use, from the daemon's `GET /info`.
    pub(crate) fn of(info: &serde_json::Value) -> anyhow::Result<Runtime> {
        let name = bottle_core::isolation::gvisor_runtime_name(
            std::env::var(bottle_core::isolation::GVISOR_RUNTIME_ENV)
                .ok()
                .as_deref(),
        );
        let Some(path) = info["Runtimes"][&name]["path"].as_str() else {
            anyhow::bail!(
                "--isolation gvisor: the docker daemon has no `{name}` runtime\n  fix: register gVisor with the daemon as `bottle doctor` says (its gVisor check quotes the daemon.json bottle's CI writes)"
            );
        };
        Ok(Runtime {
            path: path.to_string(),
            name,
        })
    }
}

/// The probe that exhausts memory.
pub(crate) const MEMORY_PROBE: &str = "resource-memory";

const PHASE: &str = "gvisor: memory past the limit";

/// How long the hog's `bottle exec` is given: the hog stops itself after
/// 30 s (the probe's own deadline), so this is its bound with room to
/// spare. When the OOM killer ends the box, the daemon's exec never ends
/// under runsc 20221219 (`docker exec` alone hangs the same way); `bottle
/// exec` ends with the box instead (`BOT-D044`), and the row is read from
/// the Engine either way.
const HOG_RUN_BOUND: Duration = Duration::from_secs(90);

impl Gate {
    /// Starts bottle D, runs the memory hog in it, and reads the outcome
    /// from the Engine.
    pub(super) fn gvisor_memory_phase(&mut self) -> anyhow::Result<()> {
        progress("gvisor: the memory hog, alone, in bottle D");
        let mut started = self.launch_each(&[D])?.into_iter();
        let bottle = started.next().context("bottle D did not start")?;
        let peer = bottle.guard.name.clone();
        let targets = self.targets(&bottle, &bottle);
        let mut config = probe::bottle_config(
            &self.token,
            PROBE_TIMEOUT_MS,
            targets,
            vec![MEMORY_PROBE.to_string()],
        );
        self.for_the_tier(&mut config);
        let path = self.write_config(&config)?;
        progress("gvisor: bottle D started, copying the probe in");
        self.cli.cp(&self.probe_bin, &peer, BOTTLE_DIR)?;
        self.cli.cp(&path, &peer, BOTTLE_DIR)?;
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .context("config file name")?;
        let out = self.cli.exec(
            &peer,
            &[
                format!("{BOTTLE_DIR}/bottle-probe"),
                "--config".into(),
                format!("{BOTTLE_DIR}/{file}"),
            ],
            HOG_RUN_BOUND,
        )?;
        progress("gvisor: the hog's exec ended, reading the box's state");
        let (results, _) = probe::parse_output(&out.stdout);
        let said = results.iter().find(|r| r.probe == MEMORY_PROBE);
        // The box is killed at once or not at all; a bounded wait for the
        // Engine to record it.
        let agent = format!("{peer}-agent");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut inspect = self.engine.inspect_container(&agent)?;
        while inspect["State"]["Running"].as_bool() == Some(true) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            inspect = self.engine.inspect_container(&agent)?;
        }
        let bundle = self.engine.inspect_container(&format!("{peer}-bundle"))?;
        let state = &inspect["State"];
        let killed = state["Running"].as_bool() == Some(false)
            && (state["OOMKilled"].as_bool() == Some(true)
                || state["ExitCode"].as_i64() == Some(137));
        let bundle_runs = bundle["State"]["Running"].as_bool() == Some(true);
        let (observed, detail) = match said {
            Some(r) if r.outcome == bottle_probe::contract::Outcome::Reached => (
                Observed::Reached,
                format!("the hog reached its target: {}", r.observed),
            ),
            _ if killed && bundle_runs => (
                Observed::Blocked,
                format!(
                    "the host killed the whole box at its limit ({} bytes; OOMKilled {}, exit {}); its bundle still runs",
                    inspect["HostConfig"]["Memory"], state["OOMKilled"], state["ExitCode"]
                ),
            ),
            Some(r) if r.outcome == bottle_probe::contract::Outcome::Blocked && bundle_runs => {
                (Observed::Blocked, r.observed.clone())
            }
            _ => (
                Observed::Error,
                format!(
                    "the box {} (OOMKilled {}, exit {}), its bundle {}, the probe said {:?}",
                    if state["Running"].as_bool() == Some(true) {
                        "runs"
                    } else {
                        "stopped"
                    },
                    state["OOMKilled"],
                    state["ExitCode"],
                    if bundle_runs { "runs" } else { "stopped" },
                    said.map(|r| r.observed.as_str())
                ),
            ),
        };
        self.report.rows.push(Row::new(
            PHASE,
            MEMORY_PROBE,
            "resources",
            Expect::Blocked,
            observed,
            None,
            detail,
        ));
        progress("gvisor: stopping bottle D");
        drop(bottle);
        Ok(())
    }
}
