//! Command-line arguments.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Run an untrusted AI coding agent in a bottle whose only way out is an
/// egress-allowlisting sidecar.
#[derive(Debug, Parser)]
#[command(name = "bottle", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command accepts.
#[derive(Debug, Clone, Args)]
pub(crate) struct Global {
    /// The backend: docker (default) or smolmachines.
    #[arg(long, global = true, env = "BOT_BOTTLE_BACKEND", value_name = "NAME")]
    pub backend: Option<String>,
    /// The manifest file.
    #[arg(
        long,
        global = true,
        env = "BOTTLE_MANIFEST",
        default_value = "bottle.toml",
        value_name = "FILE"
    )]
    pub manifest: PathBuf,
    /// Answer yes to the confirmation prompt.
    #[arg(long, short = 'y', global = true)]
    pub yes: bool,
    /// Machine-readable output (JSON) where the command lists things, and
    /// the audit log's own JSON lines for `logs`.
    #[arg(long, global = true)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Prepare, confirm and launch a bottle, then attach to the agent.
    Start(StartArgs),
    /// Show what `start` would do, without doing it.
    Plan(PlanArgs),
    /// Check a manifest and report the first problem.
    Check,
    /// List running bottles.
    #[command(visible_alias = "list-bottles", alias = "ls")]
    List,
    /// Stop a bottle and remove everything it owns.
    Stop(StopArgs),
    /// Bring the agent's accepted pushes into the working checkouts now
    /// (the bottle's holder does it within seconds, and `stop` at the end).
    Sync(BottleArg),
    /// Remove what this install's crashed launches left behind (and, with
    /// --logs-older-than, old audit logs), after listing it and asking.
    Cleanup(CleanupArgs),
    /// Join the agent of a bottle started with --detach.
    Attach(AttachArgs),
    /// Run a command in a bottle.
    Exec(ExecArgs),
    /// Run one tool call through a bottle's in-box agent.
    Execute(ExecuteArgs),
    /// Copy files into a bottle or out of one (never through a link in
    /// it, never anything unsafe onto the host).
    Cp(CpArgs),
    /// Make an image of a bottle's filesystem, with its image's own
    /// configuration and nothing of bottle's, to start the next bottle from
    /// (docker backend).
    Commit(CommitArgs),
    /// Open an agent's port on this host's 127.0.0.1 (or list the open
    /// ones, or close one).
    Port(PortArgs),
    /// Return a bottle's agent to its golden snapshot and verify it from
    /// three sources (filesystem, open descriptors, engine); a divergence
    /// halts the bottle and exits 5. A detached agent starts again in a new
    /// session.
    Reset(ResetArgs),
    /// Show a bottle's audit log.
    #[command(visible_alias = "audit")]
    Logs(LogsArgs),
    /// List what agents asked the operator for (supervise).
    Requests(RequestsArgs),
    /// Approve a request (an egress host opens at once).
    Approve(DecideArgs),
    /// Deny a request.
    Deny(DecideArgs),
    /// Check this host for every backend.
    Doctor,
    /// Serve the sandbox interface (boot, execute, reset, shutdown, list)
    /// as JSON over HTTP on an owner-only unix socket.
    Serve(ServeArgs),
    /// Keep bottles of an agent prepared, so `start` claims one instead
    /// of launching (docker backend).
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Print shell completions.
    Completions(CompletionsArgs),
    /// Holds a detached bottle's agent session (run by `start --detach`).
    #[command(name = "__session-host", hide = true)]
    SessionHost(SessionHostArgs),
    /// Finishes a stop `bottle stop` began (run by `stop`, detached).
    #[command(name = "__finish-stop", hide = true)]
    FinishStop(FinishStopArgs),
    /// Tops up an agent's pool to its manifest size (run by a `start`
    /// that claimed a pooled bottle, detached).
    #[command(name = "__refill-pool", hide = true)]
    RefillPool(RefillPoolArgs),
    /// Prepares a bottle's next reset: a docker box's standby (run by
    /// `start` and `reset`, detached).
    #[command(name = "__prepare-reset", hide = true)]
    PrepareReset(PrepareResetArgs),
    /// Holds one published port or host service of a bottle (run by
    /// `start` and `port`, detached).
    #[command(name = "__forward", hide = true)]
    Forward(ForwardArgs),
}

/// `bottle port`.
#[derive(Debug, Args)]
pub(crate) struct PortArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// `PORT` (the agent's port on the same host port) or
    /// `PORT:HOST_PORT` (`HOST_PORT` 0: any free one, printed). Without
    /// it, the bottle's open ports are listed.
    #[arg(value_name = "PORT[:HOST_PORT]", conflicts_with = "close")]
    pub port: Option<String>,
    /// Close the port published on this host port.
    #[arg(long, value_name = "HOST_PORT")]
    pub close: Option<u16>,
}

/// `bottle __forward`.
#[derive(Debug, Args)]
pub(crate) struct ForwardArgs {
    /// The bottle it forwards for.
    pub bottle: String,
    /// A published port, `PORT:HOST_PORT`.
    #[arg(long)]
    pub publish: Option<String>,
    /// A host service, `HOST:PORT` on the host's loopback.
    #[arg(long)]
    pub host_service: Option<String>,
}

/// `bottle start`.
#[derive(Debug, Args)]
pub(crate) struct StartArgs {
    /// The agent (a key under `[agents]` in the manifest).
    pub agent: String,
    /// Name the bottle (default: the agent's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Leave the bottle running in the background instead of attaching.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// After the launch, print each step's wall time and Engine round
    /// trips to stderr.
    #[arg(long)]
    pub timings: bool,
}

/// `bottle plan`.
#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// The agent (a key under `[agents]` in the manifest).
    pub agent: String,
    /// Name the bottle (default: the agent's name).
    #[arg(long)]
    pub name: Option<String>,
}

/// A command that takes one bottle.
#[derive(Debug, Args)]
pub(crate) struct BottleArg {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
}

/// `bottle stop`.
#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// Return only once everything is removed (bundle, network, state
    /// dir), not as soon as the agent's box is gone: for a script that
    /// removes the state root or reuses its disk next.
    #[arg(long)]
    pub wait: bool,
}

/// `bottle reset`.
#[derive(Debug, Args)]
pub(crate) struct ResetArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// Leave a detached agent stopped after the reset instead of starting
    /// its command again in a new session.
    #[arg(long)]
    pub keep_stopped: bool,
}

/// `bottle exec`.
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// Attach a terminal (interactive).
    #[arg(long, short = 't')]
    pub tty: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// `bottle attach`.
#[derive(Debug, Args)]
pub(crate) struct AttachArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// The keys that detach, leaving the agent running (e.g. `ctrl-a,d`).
    #[arg(long, value_name = "KEYS", default_value = crate::detach_keys::DEFAULT_DETACH_KEYS)]
    pub detach_keys: crate::detach_keys::DetachKeys,
}

/// `bottle __session-host`.
#[derive(Debug, Args)]
pub(crate) struct SessionHostArgs {
    /// The bottle whose agent it runs.
    pub bottle: String,
    /// The agent's command (empty: the image's).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `bottle __finish-stop`.
#[derive(Debug, Args)]
pub(crate) struct FinishStopArgs {
    /// The bottle whose stop it finishes.
    pub bottle: String,
}

/// `bottle __prepare-reset`.
#[derive(Debug, Args)]
pub(crate) struct PrepareResetArgs {
    /// The bottle whose next reset it prepares.
    pub bottle: String,
}

/// `bottle __refill-pool`.
#[derive(Debug, Args)]
pub(crate) struct RefillPoolArgs {
    /// The agent whose pool it fills.
    pub agent: String,
}

/// `bottle cp`.
#[derive(Debug, Args)]
pub(crate) struct CpArgs {
    /// What to copy: a host file or directory (`DIR/.`: what is in it;
    /// `-`: a tar archive on stdin), or `BOTTLE:PATH`.
    #[arg(value_parser = clap::value_parser!(std::ffi::OsString))]
    pub source: std::ffi::OsString,
    /// Where to: `BOTTLE:PATH`, or a host path (`-`: a tar archive on
    /// stdout).
    #[arg(value_parser = clap::value_parser!(std::ffi::OsString))]
    pub destination: std::ffi::OsString,
    /// The largest archive read out of a bottle, or from stdin: binary
    /// units, e.g. 1G, 500m.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = crate::arg_values::parse_max_size)]
    pub max_size: u64,
}

/// `bottle commit`.
#[derive(Debug, Args)]
pub(crate) struct CommitArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// The image to make, `name:tag` (`latest` when no tag is given).
    pub image: String,
}

/// `bottle logs`.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// Keep printing new lines as they arrive.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// A stopped run's log: the newest run whose name (its stop time,
    /// e.g. `2025-01-02T03:04:05.678Z`) starts with RUN, e.g. `2025-01-02`.
    #[arg(long, value_name = "RUN", conflicts_with = "runs")]
    pub run: Option<String>,
    /// List the bottle's stopped runs whose logs are kept, oldest first.
    #[arg(long)]
    pub runs: bool,
}

/// `bottle cleanup`.
#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// Also remove the audit logs of bottles stopped longer ago than this
    /// (`30d`, `12h`, `90m`, `45s`, `2w`); without it they are all kept.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub logs_older_than: Option<std::time::Duration>,
}

/// An age: a whole number and a unit, `s`, `m`, `h`, `d` or `w`.
fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 30d, 12h, 90m, 45s or 2w"))?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(format!("unknown unit {unit:?}: use s, m, h, d or w")),
    };
    number
        .checked_mul(seconds)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long ago"))
}

/// `bottle requests`.
#[derive(Debug, Args)]
pub(crate) struct RequestsArgs {
    /// Only this bottle's requests (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: Option<String>,
    /// Also show the requests already answered.
    #[arg(long)]
    pub all: bool,
}

/// `bottle approve` / `bottle deny`.
#[derive(Debug, Args)]
pub(crate) struct DecideArgs {
    /// The request's id, as `bottle requests` shows it (like `claude-3`).
    pub id: String,
    /// Why (shown to the agent).
    #[arg(long)]
    pub reason: Option<String>,
}

/// `bottle serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The unix socket to serve on (default: `serve.sock` in the state
    /// directory).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// One line per request on stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// `bottle pool`.
#[derive(Debug, Subcommand)]
pub(crate) enum PoolCommand {
    /// Launch bottles of an agent until N wait ready (default: the
    /// agent's `pool` in the manifest).
    Fill(PoolFillArgs),
    /// List the pool's entries, waiting or claimed.
    #[command(alias = "ls")]
    List,
    /// Remove the waiting entries of an agent (of every agent without
    /// one).
    Drain(PoolDrainArgs),
}

/// `bottle pool fill`.
#[derive(Debug, Args)]
pub(crate) struct PoolFillArgs {
    /// The agent (a key under `[agents]` in the manifest).
    pub agent: String,
    /// How many bottles to keep ready.
    pub count: Option<u32>,
}

/// `bottle pool drain`.
#[derive(Debug, Args)]
pub(crate) struct PoolDrainArgs {
    /// The agent whose entries to remove.
    pub agent: Option<String>,
}

/// `bottle completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `bottle execute`.
#[derive(Debug, Args)]
pub(crate) struct ExecuteArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// How long the call may run before it is killed (`500ms`, `60s`,
    /// `5m`, `1h`).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::arg_values::parse_deadline)]
    pub deadline: Duration,
    /// The working directory inside the box (default: the agent's home).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// A variable added to the agent's environment for this call
    /// (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Bytes for the call's stdin: a host file, or `-` for this process's
    /// stdin (default: none).
    #[arg(long, value_name = "PATH|-")]
    pub stdin_file: Option<PathBuf>,
    /// A built-in tool of the in-box agent instead of a program
    /// (`read_file`, `write_file`, `list_dir`).
    #[arg(long, value_name = "TOOL", conflicts_with = "argv")]
    pub tool: Option<String>,
    /// The tool's parameters, a JSON object.
    #[arg(long, value_name = "JSON", requires = "tool", default_value = "{}")]
    pub params: String,
    /// The program and its arguments (run without a shell).
    #[arg(last = true, required_unless_present = "tool")]
    pub argv: Vec<String>,
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ages_are_a_number_and_a_unit() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(2 * 604_800)));
        for bad in ["30", "d", "-1d", "1.5h", "3y", "", "99999999999999999999w"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
