//! Command-line arguments.

use std::path::PathBuf;

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
#[derive(Debug, Args)]
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
    Stop(BottleArg),
    /// Remove what crashed launches left behind.
    Cleanup,
    /// Run a command in a bottle.
    Exec(ExecArgs),
    /// Copy a host file or directory into a bottle.
    Cp(CpArgs),
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
    /// Print shell completions.
    Completions(CompletionsArgs),
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

/// `bottle cp`.
#[derive(Debug, Args)]
pub(crate) struct CpArgs {
    /// The host file or directory.
    pub source: std::path::PathBuf,
    /// `BOTTLE:DIR`, the directory inside the bottle to copy into.
    pub destination: String,
}

/// `bottle logs`.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The bottle (`bot-bottle-<slug>` or just `<slug>`).
    pub bottle: String,
    /// Keep printing new lines as they arrive.
    #[arg(long, short = 'f')]
    pub follow: bool,
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

/// `bottle completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}
