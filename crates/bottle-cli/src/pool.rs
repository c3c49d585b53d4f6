//! `bottle pool fill|list|drain`, and the refill a claiming `start` asks
//! for ([`bottle_core::pool`] holds the entries, a backend's
//! [`WarmPool`] their checks; the claim itself is `start`'s).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bottle_core::backend::BackendError;
use bottle_core::display::escape_for_terminal;
use bottle_core::exec::{CommandSpec, SystemRunner};
use bottle_core::pool::WarmPool;
use bottle_core::slug;
use bottle_core::{BackendKind, BottleSpec};

use crate::args::{Global, PoolCommand};
use crate::backends::{self, AnyBackend};
use crate::failure::{EXIT_DECLINED, EXIT_UNAVAILABLE, EXIT_USAGE, Failure};
use crate::interrupt::launch_interruptibly;
use crate::lookup::{load_manifest, state_root};
use crate::output::{self, note, out};
use crate::prompt::confirm;
use crate::spawn_self::spawn_self;

/// The hidden subcommand a claiming `start` runs to top the pool up.
pub(crate) const REFILL_SUBCOMMAND: &str = "__refill-pool";

/// The most entries one agent's pool holds: each is a running bottle.
const MAX_POOL: u32 = 64;

/// Runs `bottle pool <command>`.
pub(crate) fn run(global: &Global, command: &PoolCommand) -> Result<ExitCode, Failure> {
    match command {
        PoolCommand::Fill(args) => fill(global, &args.agent, args.count),
        PoolCommand::List => list(global),
        PoolCommand::Drain(args) => drain(global, args.agent.as_deref()),
    }
}

/// The backend, set up for bottles that outlive this process.
fn pool_backend(global: &Global) -> Result<AnyBackend, Failure> {
    let kind = backends::selected(global)?;
    let backend = backends::open(
        kind,
        global,
        backends::Mode {
            detach: true,
            timeline: None,
        },
    )?;
    backend.preflight()?;
    Ok(backend)
}

fn fill(global: &Global, agent: &str, count: Option<u32>) -> Result<ExitCode, Failure> {
    let manifest = load_manifest(global)?;
    let configured = manifest.agents.get(agent).and_then(|a| a.pool);
    let Some(count) = count.or(configured) else {
        return Err(Failure::new(
            "BOT-C061",
            EXIT_USAGE,
            format!("no pool size for agent {agent}"),
        )
        .with_fix(format!(
            "give one (`bottle pool fill {agent} 2`), or set `pool = 2` under [agents.{agent}] in the manifest"
        )));
    };
    if let Some(repo) = manifest.agents.get(agent).and_then(|a| {
        a.git.iter().find(|repo| {
            bottle_core::checkout::RepoKind::of_url(&repo.url)
                == Some(bottle_core::checkout::RepoKind::Checkout)
        })
    }) {
        return Err(Failure::new(
            "BOT-C064",
            EXIT_UNAVAILABLE,
            format!(
                "agent {agent} serves the working checkout {} (git {}), which a pooled bottle cannot: its mirror would be as old as the pool entry",
                repo.url, repo.name
            ),
        )
        .with_fix(format!(
            "start {agent} cold with `bottle start {agent}`, or serve a bare repository (`git clone --bare`) instead"
        )));
    }
    if count > MAX_POOL {
        return Err(Failure::new(
            "BOT-C062",
            EXIT_USAGE,
            format!("a pool of {count} bottles is over the limit of {MAX_POOL}"),
        )
        .with_fix(format!("ask for at most {MAX_POOL}")));
    }
    match &pool_backend(global)? {
        AnyBackend::Docker(backend) => fill_on(global, backend, &manifest, agent, count),
        AnyBackend::Smolmachines(backend) => fill_on(global, backend, &manifest, agent, count),
    }
}

/// Fills `agent`'s pool on `backend` to `count` waiting entries.
fn fill_on<B: WarmPool>(
    global: &Global,
    backend: &B,
    manifest: &bottle_core::Manifest,
    agent: &str,
    count: u32,
) -> Result<ExitCode, Failure> {
    let root = state_root()?;
    // Counted and filled under the agent's lock, so two fills at once (an
    // operator's and a start's refill) do not both make the missing ones.
    let _filling = fill_lock(&root, agent);
    let waiting = bottle_core::pool::list(&root)
        .into_iter()
        .filter(|e| e.backend == backend.kind() && e.agent == agent && e.state == "ready")
        .count();
    let missing = (count as usize).saturating_sub(waiting);
    if missing == 0 {
        out(&format!("pool {agent}: {waiting} ready\n"));
        return Ok(ExitCode::SUCCESS);
    }
    for made in 0..missing {
        let name = bottle_core::pool::entry_name(agent).map_err(BackendError::from)?;
        let spec = BottleSpec::new(manifest, &global.manifest, agent, Some(&name), &root)?;
        let resolved = crate::devices::resolve(&spec)?;
        let mut plan = backend.prepare(&spec)?;
        resolved.fill_plan(&mut plan, Path::new("/"));
        if made == 0 {
            for warning in &resolved.warnings {
                note(global.quiet, &format!("warning: {warning}"));
            }
            if !global.quiet || !global.yes {
                output::err(&format!(
                    "{} (and {} more like it)\n{}",
                    plan.bottle,
                    missing - 1,
                    plan.render()
                ));
            }
            if !global.yes && !confirm(&format!("fill the pool of {agent} with {missing}?"))? {
                note(global.quiet, "not filled");
                return Ok(ExitCode::from(EXIT_DECLINED));
            }
        }
        let fingerprint = backend.pool_fingerprint(&spec, &plan.devices)?;
        let bottle = launch_interruptibly(backend, &plan)?;
        for warning in bottle.launch_warnings() {
            note(global.quiet, &format!("warning: {warning}"));
        }
        drop(bottle);
        if let Err(err) = backend.mark_pooled(&plan, &fingerprint) {
            let _ = bottle_core::BottleBackend::stop(backend, &plan.bottle);
            return Err(err.into());
        }
        out(&format!("{}\n", plan.bottle));
    }
    note(
        global.quiet,
        &format!("pool {agent}: {count} ready; `bottle start {agent}` claims one"),
    );
    Ok(ExitCode::SUCCESS)
}

fn list(global: &Global) -> Result<ExitCode, Failure> {
    let entries = bottle_core::pool::list(&state_root()?);
    if global.json {
        output::json(&entries)?;
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        note(global.quiet, "no pooled bottles");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = entries
        .into_iter()
        .map(|e| vec![e.name, e.agent, e.backend.to_string(), e.state, e.filled])
        .collect();
    out(&output::table(
        &["NAME", "AGENT", "BACKEND", "STATE", "FILLED"],
        &rows,
    ));
    Ok(ExitCode::SUCCESS)
}

fn drain(global: &Global, agent: Option<&str>) -> Result<ExitCode, Failure> {
    let report = match &pool_backend(global)? {
        AnyBackend::Docker(backend) => backend.drain_pool(agent)?,
        AnyBackend::Smolmachines(backend) => backend.drain_pool(agent)?,
    };
    for line in &report.removed {
        note(global.quiet, &format!("removed {line}"));
    }
    for line in &report.failed {
        note(false, &format!("could not remove {line}"));
    }
    if !report.failed.is_empty() {
        return Err(Failure::new(
            "BOT-C063",
            crate::failure::EXIT_BACKEND,
            "the pool was drained but some of its resources remain",
        )
        .with_fix("run `bottle cleanup`, then check `bottle list`"));
    }
    out(&format!(
        "drained: removed {} resource(s)\n",
        report.removed.len()
    ));
    Ok(ExitCode::SUCCESS)
}

/// Starts `bottle __refill-pool` for the agent, detached, with the same
/// manifest; its output goes to the agent's refill log in the state root.
/// A refill that cannot start is a warning: the claimed bottle runs.
pub(crate) fn spawn_refill(global: &Global, spec: &BottleSpec, backend: BackendKind) {
    if let Err(why) = try_spawn_refill(global, &spec.agent_name, backend) {
        note(
            global.quiet,
            &format!(
                "warning: the pool of {agent} is not refilled ({why}); `bottle pool fill {agent}` fills it",
                agent = spec.agent_name,
                why = escape_for_terminal(&why),
            ),
        );
    }
}

fn try_spawn_refill(global: &Global, agent: &str, backend: BackendKind) -> Result<(), String> {
    let root = bottle_core::state::state_root(|key| std::env::var(key).ok())
        .map_err(|err| err.to_string())?;
    let manifest = std::fs::canonicalize(&global.manifest)
        .map_err(|err| format!("{}: {err}", global.manifest.display()))?;
    let log = refill_log(&root, agent);
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    }
    spawn_self(
        &SystemRunner,
        |exe| refill_spec(exe, &manifest, agent, backend),
        &log,
    )
    .map(drop)
}

/// The refiller's invocation: this `bottle`, on the claiming start's
/// backend, with the manifest by its absolute path (it runs from `/`).
fn refill_spec(
    bottle_exe: &Path,
    manifest: &Path,
    agent: &str,
    backend: BackendKind,
) -> CommandSpec {
    CommandSpec::new(bottle_exe)
        .arg("--backend")
        .arg(backend.as_str())
        .arg("--manifest")
        .arg(manifest)
        .args(["--yes", "--quiet", REFILL_SUBCOMMAND, agent])
        .cwd("/")
}

/// `bottle __refill-pool AGENT`: leaves the operator's session, then fills
/// the agent's pool to the size its manifest gives.
pub(crate) fn refill(global: &Global, agent: &str) -> Result<ExitCode, Failure> {
    // First, so the operator's terminal closing cannot signal us; then let
    // go of whatever `start` inherited.
    let _ = rustix::process::setsid();
    let _ = crate::session::host::close_inherited_fds();
    fill(global, agent, None)
}

/// Where an agent's refills write what they did and why one failed.
pub(crate) fn refill_log(root: &Path, agent: &str) -> PathBuf {
    root.join(".cache")
        .join(format!("pool-refill-{}.log", file_stem(agent)))
}

/// An agent's name as a file name: its slug (agent names are the
/// operator's, but a file name must not climb out of the directory).
fn file_stem(agent: &str) -> String {
    slug::slugify(agent).unwrap_or_else(|_| "agent".into())
}

/// The agent's fill lock; best effort (a lock file that cannot be opened,
/// another user's, leaves the fill unlocked).
fn fill_lock(root: &Path, agent: &str) -> Option<nix::fcntl::Flock<std::fs::File>> {
    let dir = root.join(".cache");
    std::fs::create_dir_all(&dir).ok()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("pool-fill-{}.lock", file_stem(agent))))
        .ok()?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser as _;

    #[test]
    fn the_refiller_is_this_bottle_filling_the_agents_pool_from_the_same_manifest() {
        let spec = refill_spec(
            Path::new("/usr/bin/bottle"),
            Path::new("/home/op/bottle.toml"),
            "claude",
            BackendKind::Smolmachines,
        );
        let argv = spec.argv();
        assert_eq!(
            argv,
            [
                "/usr/bin/bottle",
                "--backend",
                "smolmachines",
                "--manifest",
                "/home/op/bottle.toml",
                "--yes",
                "--quiet",
                REFILL_SUBCOMMAND,
                "claude"
            ]
        );
        assert_eq!(spec.cwd.as_deref(), Some(Path::new("/")));
        let cli = Cli::try_parse_from(&argv).unwrap();
        assert!(cli.global.yes && cli.global.quiet);
        assert_eq!(cli.global.manifest, Path::new("/home/op/bottle.toml"));
        let Command::RefillPool(args) = cli.command else {
            panic!("{REFILL_SUBCOMMAND} parsed as another command");
        };
        assert_eq!(args.agent, "claude");
    }

    #[test]
    fn each_agent_has_its_own_refill_log_named_safely() {
        let root = Path::new("/state");
        let log = refill_log(root, "../../etc/x");
        assert_eq!(log.parent(), Some(root.join(".cache").as_path()));
        assert_ne!(refill_log(root, "a"), refill_log(root, "b"));
    }
}
