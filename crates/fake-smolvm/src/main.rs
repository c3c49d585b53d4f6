//! `fake-smolvm`: a stand-in for the `smolvm` CLI, for tests on hosts
//! without smolvm or KVM. It honours the real CLI contract of the version it
//! pretends to be and keeps its state where smolvm does, in a real SQLite
//! database of smolvm's schema, so the code under test cannot tell the
//! difference until it needs a real VM.
//!
//! What is real and what is not:
//! - `--version` prints `smolvm X.Y.Z` (`FAKE_SMOLVM_VERSION`, default 1.9.3);
//! - argv is parsed with clap, as smolvm does, and its shapes follow that
//!   version: `machine create NAME` and `machine delete NAME` before 1.1.0,
//!   `--name NAME` from 1.1.0; a wrong shape is clap's usage error (exit 2);
//! - the database is `dirs::data_local_dir()/smolvm/server/smolvm.db`
//!   (`$SMOLVM_DATA_DIR` as `HOME` on Linux from 1.2.5), WAL, with
//!   `vms(name TEXT PRIMARY KEY, data BLOB NOT NULL)` and
//!   `config(key TEXT PRIMARY KEY, value TEXT)`; records are `VmRecord` JSON
//!   with smolvm's field names;
//! - `machine create --from` drops `--allow-cidr` before 1.8.0
//!   (`allowed_cidrs: null`), as `run_from_smolmachine` did;
//! - `machine start` reads the record and writes what it "booted with"
//!   (`allowed_cidrs`, `dns_filter_hosts`, `network`) to
//!   `<data>/smolvm/fake/started/<name>.json` for the test to check;
//! - `machine exec` runs the command on the host, confined to a per-machine
//!   "guest root" (`<data>/smolvm/fake/guests/<name>`): the machine's user,
//!   mount and pid namespaces (the host's `/usr`, `/bin`, `/lib*` bound
//!   read-only, the guest's own `/proc`), then `chroot`. Absolute guest paths therefore land in the guest root and the
//!   host is never written. Output is buffered like smolvm's: stdout, then
//!   stderr, then the command's exit code; with `-i` or `-t` it streams both
//!   ways while the command runs, which gets the caller's own stdio (with
//!   `-t`, the caller's terminal). smolvm's own errors print `Error: …` and
//!   exit 1;
//! - `machine cp` copies into (or out of) the guest root;
//! - a machine has a data directory (`machine data-dir`) with its two
//!   sparse disks, and the guest's files live on `overlay.raw` while it is
//!   stopped: a disk restored from a copy restores them (`disk`); each
//!   `start` runs an init in namespaces of its own which every `exec` joins
//!   and `stop` kills, ending every guest process (`vm`);
//! - `pack create --image HOST:PORT/NAME:TAG -o OUT` fetches the manifest
//!   and every blob over real HTTP, checks their digests and sizes, and
//!   writes `OUT` and `OUT.smolmachine` (a JSON description, not a VM);
//! - there is no VM: nothing boots, no network policy is enforced.
//!
//! - run as root, the real smolvm drops each VM to its own uid keeping only
//!   the `kvm` group (`drop_privileges` in its `src/process.rs`), so a
//!   `/dev/kvm` the `kvm` group cannot read and write fails `machine start`
//!   with EACCES. The fake checks this only when `FAKE_SMOLVM_KVM_DEVICE`
//!   names the device to judge (it boots nothing, so by default it does not
//!   look at the host's `/dev/kvm`): run as root, a device neither
//!   world-read-write nor group-read-write for the `kvm` group of
//!   `/etc/group` fails the start with the real message shape
//!   (`Error: start vm: krun_start_enter returned: -13 (…)`, exit 1);
//! - a `machine start` that fails leaves the machine in state `created`, as
//!   the real one does, for the caller to delete.
//!
//! `FAKE_SMOLVM_MODE` (comma-separated) injects faults:
//! - `revert-db-writes`: a trigger undoes every later write to the machine's
//!   record, so a patch of the allowlist does not take;
//! - `no-row`: `machine create` succeeds without writing a record;
//! - `start-clears-cidrs`: `machine start` boots, then resets the record's
//!   `allowed_cidrs` to null;
//! - `keep-guest-processes`: `machine stop` leaves the guest's processes
//!   running and the next `start` keeps them (a process surviving a
//!   restart).
//!
//! Every invocation is appended to `<data>/smolvm/fake/calls.jsonl`.
//!
//! Modules: `db` (the state database), `machine` (the machine verbs),
//! `guest` (`machine exec` and `machine cp`), `pack` (`pack create` and
//! its registry client).

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "it stands in for the smolvm CLI, whose contract is what it prints"
)]

mod db;
mod disk;
mod guest;
mod machine;
mod pack;
mod vm;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use bottle_smolvm::version::{Capabilities as _, SmolvmVersion};
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use serde_json::json;

/// smolvm's command line, as far as bottle uses it.
#[derive(Parser)]
#[command(
    name = "smolvm",
    about = "fake-smolvm: a test double of the smolvm CLI"
)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Manage machines.
    #[command(subcommand, visible_alias = "vm")]
    Machine(MachineVerb),
    /// Package images.
    #[command(subcommand)]
    Pack(PackVerb),
    /// The fake's own: a guest command inside the VM (see `guest::exec`).
    #[command(name = "__vm-exec", hide = true)]
    VmExec(guest::GuestRunArgs),
    /// The fake's own: a running machine's init (see `vm`).
    #[command(name = "__vm-init", hide = true)]
    VmInit {
        /// The guest root.
        root: PathBuf,
    },
}

#[derive(Subcommand)]
enum MachineVerb {
    /// Create a machine from a packed image.
    Create(machine::CreateArgs),
    /// Start a machine.
    Start(machine::NameArgs),
    /// Stop a machine.
    Stop(machine::NameArgs),
    /// Delete a machine.
    #[command(visible_alias = "rm")]
    Delete(machine::DeleteArgs),
    /// List machines.
    #[command(visible_alias = "list")]
    Ls(machine::LsArgs),
    /// Run a command in a running machine.
    Exec(guest::ExecArgs),
    /// Copy a file or directory into or out of a running machine.
    Cp(guest::CpArgs),
    /// Print the machine's data directory (its disks).
    DataDir(machine::NameArgs),
}

#[derive(Subcommand)]
enum PackVerb {
    /// Pack an image from a registry into a `.smolmachine`.
    Create(pack::PackCreateArgs),
}

/// The command line `version` accepts: before 1.1.0 `machine create` and
/// `machine delete` took the machine name as a positional, from 1.1.0 as
/// `--name`.
fn command_line(version: SmolvmVersion) -> clap::Command {
    let cli = Cli::command().version(version.to_string());
    if version.name_is_a_flag() {
        return cli;
    }
    fn positional_name(verb: clap::Command) -> clap::Command {
        verb.mut_arg("name", |name| name.long(None).short(None))
    }
    cli.mut_subcommand("machine", |machine| {
        machine
            .mut_subcommand("create", positional_name)
            .mut_subcommand("delete", positional_name)
    })
}

/// Why an invocation failed, told apart as smolvm tells them.
enum Failure {
    /// clap's usage error (exit 2), or its `--help` / `--version` (exit 0).
    Usage(clap::Error),
    /// smolvm's own error: `Error: …`, exit 1.
    Error(String),
}

type Result<T> = std::result::Result<T, Failure>;

fn error(msg: impl Into<String>) -> Failure {
    Failure::Error(msg.into())
}

/// A usage error found after parsing, worded and exiting as clap's.
fn usage(kind: clap::error::ErrorKind, msg: impl std::fmt::Display) -> Failure {
    Failure::Usage(Cli::command().error(kind, msg))
}

/// Who the double pretends to be and where it keeps its state.
struct Fake {
    version: SmolvmVersion,
    modes: Vec<String>,
    db: PathBuf,
    fake_dir: PathBuf,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fake = match Fake::from_env() {
        Ok(fake) => fake,
        Err(failure) => return report(failure),
    };
    // The fake's own processes (`__vm-…`) are no smolvm calls.
    if !args.first().is_some_and(|verb| verb.starts_with("__")) {
        fake.log_call(&args);
    }
    let parsed = command_line(fake.version)
        .try_get_matches_from(std::iter::once("smolvm".to_string()).chain(args))
        .and_then(|matches| Cli::from_arg_matches(&matches));
    match parsed.map_err(Failure::Usage).and_then(|cli| fake.run(cli)) {
        Ok(code) => code,
        Err(failure) => report(failure),
    }
}

fn report(failure: Failure) -> ExitCode {
    match failure {
        Failure::Usage(err) => {
            let _ = err.print();
            ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2))
        }
        Failure::Error(msg) => {
            eprintln!("Error: {msg}");
            ExitCode::from(1)
        }
    }
}

impl Fake {
    fn from_env() -> Result<Fake> {
        let version_text = std::env::var("FAKE_SMOLVM_VERSION").unwrap_or_else(|_| "1.9.3".into());
        let version = SmolvmVersion::parse(&version_text)
            .ok_or_else(|| error(format!("FAKE_SMOLVM_VERSION={version_text:?} is not X.Y.Z")))?;
        let modes = std::env::var("FAKE_SMOLVM_MODE")
            .unwrap_or_default()
            .split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
        let data_local = db::data_local_dir(version)?;
        Ok(Fake {
            version,
            modes,
            db: data_local.join("smolvm/server/smolvm.db"),
            fake_dir: data_local.join("smolvm/fake"),
        })
    }

    fn mode(&self, mode: &str) -> bool {
        self.modes.iter().any(|m| m == mode)
    }

    fn log_call(&self, args: &[String]) {
        let _ = std::fs::create_dir_all(&self.fake_dir);
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.fake_dir.join("calls.jsonl"))
        {
            let _ = writeln!(
                file,
                "{}",
                json!({ "version": self.version.to_string(), "argv": args })
            );
        }
    }

    /// The directory standing in for the machine's root filesystem.
    fn guest_root(&self, name: &str) -> PathBuf {
        self.fake_dir.join("guests").join(name)
    }

    /// The state database, created on first use.
    fn open_db(&self) -> Result<db::StateDb> {
        db::StateDb::open(&self.db)
    }

    fn run(&self, cli: Cli) -> Result<ExitCode> {
        match cli.verb {
            Verb::Machine(verb) => match verb {
                MachineVerb::Create(args) => machine::create(self, args),
                MachineVerb::Start(args) => machine::start(self, args),
                MachineVerb::Stop(args) => machine::stop(self, args),
                MachineVerb::Delete(args) => machine::delete(self, args),
                MachineVerb::Ls(args) => machine::ls(self, args),
                MachineVerb::Exec(args) => guest::exec(self, args),
                MachineVerb::Cp(args) => guest::cp(self, args),
                MachineVerb::DataDir(args) => machine::data_dir(self, args),
            },
            Verb::VmInit { root } => vm::init(&root),
            Verb::VmExec(args) => guest::run(args),
            Verb::Pack(PackVerb::Create(args)) => pack::create(args),
        }
    }
}
