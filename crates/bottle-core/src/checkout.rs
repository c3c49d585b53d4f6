//! Working checkouts behind git-gate: what a local `git[].url` is, the
//! bare mirror bottle serves in its place, and the sync that brings the
//! agent's accepted pushes back into the checkout as refs.
//!
//! A `git[].url` on the host is a bare repository (served as it is), a
//! working checkout (a directory with `.git`, or the `.git` directory of
//! one), or neither, which the manifest refuses ([`RepoKind::of_path`]).
//!
//! For a working checkout, the launch makes a bare mirror of its refs in
//! the bottle's state dir ([`create_mirror`]: a local clone that copies the
//! objects, runs no hook and takes nothing of the checkout's config) and
//! the bundle serves that mirror, read-write, under the same push rules as
//! any repository. The bundle never sees the checkout itself.
//!
//! The mirror is the bundle's to write, so the host treats it as a remote
//! it does not trust: after the launch it reads the mirror only through
//! `git ls-remote` and `git fetch` (git's upload-pack, the boundary git
//! keeps for a repository it does not trust) and never runs git inside it.
//! [`sync`] then, on the host, in the checkout:
//!
//! - takes only refs the manifest's push globs match (from the host's own
//!   record, [`SyncRecord`], written at launch: never from anything the
//!   bundle can write), and only those that changed in the mirror since the
//!   last sync (its baseline);
//! - fetches their objects with no ref updated (`--no-write-fetch-head`,
//!   `fetch.fsckObjects`), then moves each ref with `git update-ref`
//!   against the value it read (compare-and-swap), so a ref the operator
//!   moves meanwhile is never overwritten;
//! - never rewinds a ref without `allow_force`, never deletes one without
//!   `allow_delete`, never moves a ref the operator moved since the last
//!   sync unless the agent's value contains the operator's (fast-forward),
//!   and never touches a branch checked out in any worktree of the
//!   checkout;
//! - runs every git command with `core.hooksPath=/dev/null` (git 2.28 and
//!   later run a `reference-transaction` hook even for a fetch), automatic
//!   gc and maintenance off, and git's repository-selecting variables
//!   (`GIT_DIR`, ...) removed from its environment.
//!
//! Nothing touches the checkout's working tree, index, config or hooks.
//! Who calls [`sync`] and when is the CLI's decision (the process that holds
//! the bottle, `bottle stop`, `bottle sync`); concurrent syncs of one
//! bottle are serialised by a lock in its state dir.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::error::Coded;
use crate::exec::{CommandOutput, CommandRunner, CommandSpec};
use crate::manifest::push_glob::PushGlobs;

/// The kind of repository a `git[].url` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepoKind {
    /// A bare repository on the host, bind-mounted into the bundle.
    Bare,
    /// A working checkout on the host, served through a bare mirror in the
    /// bottle's state dir; accepted pushes come back to it as refs.
    Checkout,
    /// A remote URL the bundle's git-gate mirrors itself.
    Remote,
}

impl RepoKind {
    /// What `path` on the host is: a working checkout (it holds `.git`, a
    /// directory or a `gitdir:` file, or is the `.git` directory of one), a
    /// bare repository (`HEAD`, `objects/` and `refs/`, not said to be
    /// non-bare by its config), or neither (`None`). Reads files only.
    pub fn of_path(path: &Path) -> Option<RepoKind> {
        let dot_git = path.join(".git");
        if let Ok(meta) = std::fs::metadata(&dot_git) {
            if meta.is_dir() && dot_git.join("HEAD").is_file() {
                return Some(RepoKind::Checkout);
            }
            if meta.is_file() && starts_with(&dot_git, b"gitdir:") {
                return Some(RepoKind::Checkout);
            }
        }
        let git_dir = path.join("HEAD").is_file()
            && path.join("objects").is_dir()
            && path.join("refs").is_dir();
        if !git_dir {
            return None;
        }
        if path.file_name().is_some_and(|name| name == ".git") || config_says_not_bare(path) {
            Some(RepoKind::Checkout)
        } else {
            Some(RepoKind::Bare)
        }
    }

    /// The kind of the manifest's `url`: [`RepoKind::Remote`] for a remote
    /// URL, else [`RepoKind::of_path`].
    pub fn of_url(url: &str) -> Option<RepoKind> {
        if crate::manifest::is_remote_git_url(url) {
            Some(RepoKind::Remote)
        } else {
            RepoKind::of_path(Path::new(url.strip_prefix("file://").unwrap_or(url)))
        }
    }

    /// How the plan names it.
    pub fn describe(self) -> &'static str {
        match self {
            RepoKind::Bare => "bare repository",
            RepoKind::Checkout => "working checkout",
            RepoKind::Remote => "remote",
        }
    }
}

/// Whether the file at `path` starts with `prefix` (read no further).
fn starts_with(path: &Path, prefix: &[u8]) -> bool {
    use std::io::Read as _;
    let mut head = vec![0; prefix.len()];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut head))
        .is_ok_and(|()| head == prefix)
}

/// Whether the git dir's `config` sets `core.bare` to false (a working
/// checkout's `.git` under another name). Only what git would read as
/// false counts; anything unreadable does not.
fn config_says_not_bare(git_dir: &Path) -> bool {
    use std::io::Read as _;
    let mut text = String::new();
    let read = std::fs::File::open(git_dir.join("config"))
        .and_then(|file| file.take(64 * 1024).read_to_string(&mut text));
    if read.is_err() {
        return false;
    }
    let mut in_core = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_core = line
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
                .eq_ignore_ascii_case("core");
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if in_core && key.trim().eq_ignore_ascii_case("bare") {
            let value = value.trim().to_ascii_lowercase();
            return matches!(value.as_str(), "false" | "no" | "off" | "0");
        }
    }
    false
}

/// Version of [`SyncRecord`].
pub const SYNC_RECORD_VERSION: u32 = 1;

/// Where a bottle's checkout files live in its state dir: `git/`, holding
/// each mirror (`<name>.git`, bind-mounted into the bundle alone) and the
/// host's own files beside them, which the bundle never sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckoutPaths {
    /// `<state_dir>/git`.
    pub dir: PathBuf,
}

impl CheckoutPaths {
    /// The directory's name in a state dir.
    pub const DIR_NAME: &'static str = "git";

    /// The layout in the state dir `state_dir`.
    pub fn of_state_dir(state_dir: &Path) -> CheckoutPaths {
        CheckoutPaths {
            dir: state_dir.join(Self::DIR_NAME),
        }
    }

    /// The mirror of the repository `name` (a manifest name: no `/`).
    pub fn mirror(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.git"))
    }

    /// `sync.json`: the [`SyncRecord`].
    pub fn record(&self) -> PathBuf {
        self.dir.join("sync.json")
    }

    /// `sync.log`: what the background syncs did, one line per ref.
    pub fn log(&self) -> PathBuf {
        self.dir.join("sync.log")
    }

    fn lock(&self) -> PathBuf {
        self.dir.join("sync.lock")
    }
}

/// The host's record of a bottle's working checkouts: written at launch,
/// updated by each sync, never mounted into the bundle.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// [`SYNC_RECORD_VERSION`].
    pub v: u32,
    /// The bottle's name.
    pub bottle: String,
    /// Each working checkout the agent may push to.
    pub repos: Vec<SyncedRepo>,
}

/// One working checkout and its mirror.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncedRepo {
    /// The manifest's name for it.
    pub name: String,
    /// The working checkout on the host.
    pub checkout: PathBuf,
    /// Its mirror in the state dir.
    pub mirror: PathBuf,
    /// The manifest's push globs.
    pub push: Vec<String>,
    /// Whether a ref may be rewound.
    pub allow_force: bool,
    /// Whether a ref may be deleted.
    pub allow_delete: bool,
    /// Each ref of the mirror as the host last accepted it (at launch, the
    /// checkout's): a ref whose value differs in the mirror is a push.
    pub baseline: BTreeMap<String, String>,
}

/// What went wrong making a mirror or syncing one.
#[derive(Debug, Error)]
pub enum CheckoutError {
    /// The mirror of a working checkout could not be made.
    #[error("could not mirror the working checkout {checkout} for git-gate: {detail}")]
    Mirror {
        /// The checkout.
        checkout: PathBuf,
        /// What git or the filesystem said.
        detail: String,
    },
    /// The sync record cannot be read or written.
    #[error("the checkout sync record {path} cannot be used: {detail}")]
    Record {
        /// The record's path.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// Git failed while bringing a mirror's refs into its checkout.
    #[error("could not sync repository {name} into {checkout}: {detail}")]
    Sync {
        /// The repository's manifest name.
        name: String,
        /// The checkout.
        checkout: PathBuf,
        /// What git said.
        detail: String,
    },
}

impl Coded for CheckoutError {
    fn code(&self) -> &'static str {
        match self {
            CheckoutError::Mirror { .. } => "BOT-G001",
            CheckoutError::Record { .. } => "BOT-G002",
            CheckoutError::Sync { .. } => "BOT-G003",
        }
    }

    fn fix(&self) -> Option<String> {
        Some(match self {
            CheckoutError::Mirror { checkout, .. } => format!(
                "check that `git -C {} log -1` works for the user running bottle, and that git is installed",
                checkout.display()
            ),
            CheckoutError::Record { .. } => {
                "the bottle's state dir was changed by hand; stop the bottle and start it again"
                    .into()
            }
            CheckoutError::Sync { checkout, .. } => format!(
                "check `git -C {} status`; `bottle sync BOTTLE` tries again, and the agent's commits stay in the mirror until `bottle stop`",
                checkout.display()
            ),
        })
    }
}

/// How long one git command of a mirror or a sync may take.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(600);

/// Variables that make git use another repository, object store, index or
/// configuration than the command names (`git rev-parse --local-env-vars`,
/// and the environment's own config): never passed on.
const GIT_REPO_VARIABLES: [&str; 17] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_GLOBAL",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_NAMESPACE",
];

/// `git` run in `dir` (`-C`), the one shape every git command here has:
/// no hooks (`core.hooksPath=/dev/null`, which also covers
/// `reference-transaction` and `pre-auto-gc`), no automatic gc or
/// maintenance, local file transport allowed whatever the operator's
/// config says, git's repository-selecting variables removed, messages in
/// English, never a prompt, and a time bound.
pub fn git(dir: &Path) -> CommandSpec {
    let mut spec = CommandSpec::new("git")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
            "-c",
            "protocol.file.allow=always",
            "-C",
        ])
        .arg(dir)
        .env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        // The host runs upload-pack in a mirror the bundle can write: no
        // lazy fetch from a promisor remote its config might name
        // (CVE-2024-32004; honoured by git 2.39.4, 2.45.1 and later).
        .env("GIT_NO_LAZY_FETCH", "1")
        .timeout(GIT_TIMEOUT);
    for variable in GIT_REPO_VARIABLES {
        spec = spec.env_remove(variable);
    }
    spec
}

/// The clone that makes `mirror` from `checkout`: bare, objects copied
/// rather than hard-linked (the bundle may write the mirror; a hard link
/// would let it write the checkout's object files), no template (no sample
/// hooks), no checkout of files. Run from the mirror's parent, which
/// exists.
pub fn mirror_clone(checkout: &Path, mirror: &Path) -> CommandSpec {
    let parent = mirror.parent().unwrap_or(Path::new("/"));
    git(parent)
        .args([
            "clone",
            "--bare",
            "--no-hardlinks",
            "--quiet",
            "--template=",
        ])
        .arg("--")
        .arg(checkout)
        .arg(mirror)
}

/// Removes the clone's `origin` from the mirror's config: the bundle has
/// no use for the checkout's host path.
pub fn mirror_forget_origin(mirror: &Path) -> CommandSpec {
    git(mirror).args(["config", "--remove-section", "remote.origin"])
}

/// The refs the mirror offers, as the checkout's git reads them from it
/// (through upload-pack, with no ref of the checkout touched).
pub fn list_mirror_refs(checkout: &Path, mirror: &Path) -> CommandSpec {
    git(checkout)
        .args(["ls-remote", "--refs", "--"])
        .arg(mirror)
}

/// The checkout's own values of `refs`.
pub fn list_checkout_refs(checkout: &Path, refs: &[&str]) -> CommandSpec {
    git(checkout)
        .args(["for-each-ref", "--format=%(objectname) %(refname)", "--"])
        .args(refs)
}

/// Every worktree of the checkout, with the branch each has checked out.
pub fn list_worktrees(checkout: &Path) -> CommandSpec {
    git(checkout).args(["worktree", "list", "--porcelain"])
}

/// Fetches the objects of `refs` from the mirror into the checkout,
/// updating no ref and no `FETCH_HEAD`, checking every object it receives.
pub fn fetch_objects(checkout: &Path, mirror: &Path, refs: &[&str]) -> CommandSpec {
    git(checkout)
        .args([
            "-c",
            "fetch.fsckObjects=true",
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-recurse-submodules",
            "--no-prune",
            "--",
        ])
        .arg(mirror)
        .args(refs)
}

/// Exits 0 when `ancestor` is an ancestor of (or is) `descendant`, 1 when
/// it is not.
pub fn is_ancestor(checkout: &Path, ancestor: &str, descendant: &str) -> CommandSpec {
    git(checkout).args(["merge-base", "--is-ancestor", ancestor, descendant])
}

/// One transaction of ref updates, each checked against the value the
/// sync read (`git update-ref --stdin`), with a reflog message naming the
/// bottle.
pub fn update_refs(checkout: &Path, bottle: &str, updates: &[RefUpdate]) -> CommandSpec {
    let mut stdin = String::new();
    for update in updates {
        stdin.push_str(&update.command_line());
    }
    // `--no-deref`: a symbolic ref of the operator's under the push rules
    // is replaced itself, never followed to the branch it names.
    git(checkout)
        .args(["update-ref", "--no-deref", "-m"])
        .arg(format!("bottle {bottle}: the agent's push"))
        .arg("--stdin")
        .stdin(stdin)
}

/// One ref update of a sync, compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    /// The full ref name.
    pub refname: String,
    /// The value to write; `None` deletes.
    pub new: Option<String>,
    /// The value the checkout must still have; `None`: it must not exist.
    pub old: Option<String>,
}

impl RefUpdate {
    /// Its line for `git update-ref --stdin`.
    fn command_line(&self) -> String {
        match (&self.new, &self.old) {
            (Some(new), Some(old)) => format!("update {} {new} {old}\n", self.refname),
            (Some(new), None) => format!("create {} {new}\n", self.refname),
            (None, Some(old)) => format!("delete {} {old}\n", self.refname),
            (None, None) => String::new(),
        }
    }
}

/// Makes the bare mirror `mirror` of the working checkout `checkout`
/// (its parent must exist; `mirror` must not) and returns its refs, the
/// first baseline. Run before the bundle has the mirror.
pub fn create_mirror(
    runner: &dyn CommandRunner,
    checkout: &Path,
    mirror: &Path,
) -> Result<BTreeMap<String, String>, CheckoutError> {
    let failed = |detail: String| CheckoutError::Mirror {
        checkout: checkout.to_path_buf(),
        detail,
    };
    run_git(runner, &mirror_clone(checkout, mirror)).map_err(failed)?;
    run_git(runner, &mirror_forget_origin(mirror)).map_err(failed)?;
    let refs = run_git(runner, &list_mirror_refs(checkout, mirror)).map_err(failed)?;
    parse_ref_list(&refs.stdout_text()).map_err(failed)
}

/// Runs a git command; its failure is its stderr's last lines.
fn run_git(runner: &dyn CommandRunner, spec: &CommandSpec) -> Result<CommandOutput, String> {
    let out = runner
        .run(spec)
        .map_err(|err| format!("could not run git: {err}"))?;
    if out.success() {
        Ok(out)
    } else {
        Err(git_failure(spec, &out))
    }
}

/// `git <verb> exited with N: <stderr's tail>`.
fn git_failure(spec: &CommandSpec, out: &CommandOutput) -> String {
    // After `-C <dir>` and any `-c <setting>`: the verb.
    let args: Vec<String> = spec
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut rest = args.iter().skip_while(|a| *a != "-C").skip(2);
    let mut verb = String::new();
    while let Some(arg) = rest.next() {
        if arg == "-c" {
            rest.next();
        } else {
            verb.clone_from(arg);
            break;
        }
    }
    let stderr = out.stderr_text();
    let tail: Vec<&str> = stderr.trim().lines().rev().take(3).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    let code = out
        .code
        .map_or_else(|| "a signal".to_string(), |c| c.to_string());
    format!("git {verb} exited with {code}: {}", tail.join("; "))
}

/// Whether `text` is a full object name (SHA-1 or SHA-256, lowercase hex).
fn is_oid(text: &str) -> bool {
    (text.len() == 40 || text.len() == 64)
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `name` is a ref name this sync will pass to git: under
/// `refs/`, with nothing `git check-ref-format` refuses. The mirror's refs
/// come from a repository the bundle writes, so each is checked.
pub fn is_safe_refname(name: &str) -> bool {
    name.starts_with("refs/")
        && name.len() <= 1024
        && !name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c))
        && !name.contains("..")
        && !name.contains("@{")
        && !name.contains("//")
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.ends_with(".lock")
        && name
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.') && !part.ends_with(".lock"))
}

/// Parses `<oid> SP-or-TAB <refname>` lines (`ls-remote`, `for-each-ref`).
fn parse_ref_list(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut refs = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (oid, name) = line
            .split_once(['\t', ' '])
            .ok_or_else(|| format!("git listed {line:?}, which is not `<oid> <ref>`"))?;
        if !is_oid(oid) {
            return Err(format!("git listed {line:?}, whose object name is not one"));
        }
        refs.insert(name.to_string(), oid.to_string());
    }
    Ok(refs)
}

/// What one sync did with one ref.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefOutcome {
    /// The repository's manifest name.
    pub repo: String,
    /// The full ref name.
    pub refname: String,
    /// The agent's value in the mirror; `None`: it deleted the ref.
    pub value: Option<String>,
    /// What happened.
    pub outcome: Outcome,
}

/// How a ref the agent changed fared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "why")]
pub enum Outcome {
    /// The checkout's ref now has the agent's value (or is deleted).
    Landed,
    /// Not brought over, for this reason; the checkout's ref is unchanged.
    Kept(String),
}

impl RefOutcome {
    /// One line for the operator: `app refs/heads/agent/x -> 1a2b3c4d: landed`.
    pub fn line(&self) -> String {
        let value = self
            .value
            .as_deref()
            .map_or_else(|| "(deleted)".to_string(), |v| v.chars().take(12).collect());
        match &self.outcome {
            Outcome::Landed => format!("git {}: {} -> {value}: landed", self.repo, self.refname),
            Outcome::Kept(why) => format!(
                "git {}: {} -> {value}: not brought over: {why}",
                self.repo, self.refname
            ),
        }
    }
}

/// What [`sync`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// Every ref the agent changed since the last sync, and its outcome.
    pub refs: Vec<RefOutcome>,
    /// Repositories that could not be synced at all (their refs stay as
    /// they were; the next sync tries again).
    pub failed: Vec<String>,
}

impl SyncReport {
    /// Whether the sync saw nothing to do.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty() && self.failed.is_empty()
    }
}

/// Writes `record` into its state dir (aside, then renamed).
pub fn write_record(paths: &CheckoutPaths, record: &SyncRecord) -> Result<(), CheckoutError> {
    let path = paths.record();
    let failed = |detail: String| CheckoutError::Record {
        path: path.clone(),
        detail,
    };
    let json = serde_json::to_vec_pretty(record).map_err(|e| failed(e.to_string()))?;
    crate::files::write_aside(&path, &json, 0o600, crate::files::Flush::No).map_err(|failure| {
        failed(format!(
            "could not {} it: {}",
            failure.action, failure.source
        ))
    })
}

/// Reads the record of the state dir; `None` when the bottle has none (no
/// working checkout).
pub fn read_record(paths: &CheckoutPaths) -> Result<Option<SyncRecord>, CheckoutError> {
    let path = paths.record();
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(CheckoutError::Record {
                path,
                detail: err.to_string(),
            });
        }
    };
    let record: SyncRecord =
        serde_json::from_slice(&text).map_err(|err| CheckoutError::Record {
            path: path.clone(),
            detail: err.to_string(),
        })?;
    if record.v != SYNC_RECORD_VERSION {
        return Err(CheckoutError::Record {
            path,
            detail: format!(
                "version {} (this bottle reads {SYNC_RECORD_VERSION})",
                record.v
            ),
        });
    }
    Ok(Some(record))
}

/// Brings every ref the agent changed in the mirrors of the bottle whose
/// state dir is `state_dir` into their checkouts, as the module says, and
/// records the new baselines. A bottle with no working checkout syncs
/// nothing. Holds the bottle's sync lock throughout.
pub fn sync(runner: &dyn CommandRunner, state_dir: &Path) -> Result<SyncReport, CheckoutError> {
    let paths = CheckoutPaths::of_state_dir(state_dir);
    if !paths.record().exists() {
        return Ok(SyncReport::default());
    }
    let _lock = lock(&paths)?;
    let Some(mut record) = read_record(&paths)? else {
        return Ok(SyncReport::default());
    };
    let mut report = SyncReport::default();
    let mut changed = false;
    let bottle = record.bottle.clone();
    for repo in &mut record.repos {
        if !repo.mirror.join("HEAD").exists() {
            // The mirror is gone with its bottle: nothing left to bring.
            continue;
        }
        match sync_repo(runner, &bottle, repo, &mut report.refs) {
            Ok(moved) => changed |= moved,
            Err(err) => report.failed.push(err.to_string()),
        }
    }
    if changed {
        write_record(&paths, &record)?;
    }
    Ok(report)
}

/// The bottle's sync lock (flock on `sync.lock`), waited for.
fn lock(paths: &CheckoutPaths) -> Result<nix::fcntl::Flock<std::fs::File>, CheckoutError> {
    let path = paths.lock();
    let failed = |detail: String| CheckoutError::Record {
        path: path.clone(),
        detail,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| failed(e.to_string()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| failed(errno.to_string()))
}

/// One ref the agent changed, as the sync found it.
struct Change {
    refname: String,
    /// In the mirror; `None`: deleted there.
    new: Option<String>,
    /// The baseline; `None`: the ref did not exist.
    base: Option<String>,
}

/// Syncs one repository; returns whether its baseline moved.
fn sync_repo(
    runner: &dyn CommandRunner,
    bottle: &str,
    repo: &mut SyncedRepo,
    outcomes: &mut Vec<RefOutcome>,
) -> Result<bool, CheckoutError> {
    let failed = |detail: String| CheckoutError::Sync {
        name: repo.name.clone(),
        checkout: repo.checkout.clone(),
        detail,
    };
    let globs = PushGlobs::new(&repo.push).map_err(&failed)?;
    let listed =
        run_git(runner, &list_mirror_refs(&repo.checkout, &repo.mirror)).map_err(&failed)?;
    let offered = parse_ref_list(&listed.stdout_text()).map_err(&failed)?;
    let names: BTreeSet<&String> = offered.keys().chain(repo.baseline.keys()).collect();
    let mut moved = false;
    let mut changes = Vec::new();
    let mut new_baseline = repo.baseline.clone();
    let mut outcome = |refname: &str, new: Option<&String>, outcome: Outcome| {
        outcomes.push(RefOutcome {
            repo: repo.name.clone(),
            refname: refname.to_string(),
            value: new.cloned(),
            outcome,
        });
    };
    for name in names {
        let new = offered.get(name);
        let base = repo.baseline.get(name);
        if new == base {
            continue;
        }
        let refused = if !is_safe_refname(name) {
            Some("not a ref name git accepts".to_string())
        } else if globs.matching(name).is_none() {
            Some(format!(
                "outside the push rules ({})",
                if repo.push.is_empty() {
                    "none".to_string()
                } else {
                    repo.push.join(", ")
                }
            ))
        } else if new.is_none() && !repo.allow_delete {
            Some("a deletion, and allow_delete is off".to_string())
        } else {
            None
        };
        if let Some(why) = refused {
            // Reported once: the baseline follows the mirror for a ref
            // that can never be brought over.
            outcome(name, new, Outcome::Kept(why));
            match new {
                Some(value) => new_baseline.insert(name.clone(), value.clone()),
                None => new_baseline.remove(name),
            };
            moved = true;
            continue;
        }
        changes.push(Change {
            refname: name.clone(),
            new: new.cloned(),
            base: base.cloned(),
        });
    }
    if changes.is_empty() {
        if moved {
            repo.baseline = new_baseline;
        }
        return Ok(moved);
    }

    let wanted: Vec<&str> = changes.iter().map(|c| c.refname.as_str()).collect();
    let listed = run_git(runner, &list_checkout_refs(&repo.checkout, &wanted)).map_err(&failed)?;
    let current = parse_ref_list(&listed.stdout_text()).map_err(&failed)?;
    let worktrees = run_git(runner, &list_worktrees(&repo.checkout)).map_err(&failed)?;
    let checked_out: BTreeSet<String> = worktrees
        .stdout_text()
        .lines()
        .filter_map(|l| l.strip_prefix("branch "))
        .map(str::to_string)
        .collect();
    let fetched: Vec<&str> = changes
        .iter()
        .filter(|c| c.new.is_some() && current.get(&c.refname) != c.new.as_ref())
        .map(|c| c.refname.as_str())
        .collect();
    if !fetched.is_empty() {
        run_git(
            runner,
            &fetch_objects(&repo.checkout, &repo.mirror, &fetched),
        )
        .map_err(&failed)?;
    }

    let mut updates = Vec::new();
    for change in &changes {
        let cur = current.get(&change.refname);
        let decision = decide(runner, repo, change, cur, &checked_out);
        match decision {
            Decision::AlreadyThere => {
                match &change.new {
                    Some(value) => new_baseline.insert(change.refname.clone(), value.clone()),
                    None => new_baseline.remove(&change.refname),
                };
                moved = true;
            }
            Decision::Keep(why) => {
                outcome(&change.refname, change.new.as_ref(), Outcome::Kept(why))
            }
            Decision::Write => updates.push(RefUpdate {
                refname: change.refname.clone(),
                new: change.new.clone(),
                old: cur.cloned(),
            }),
        }
    }
    // One transaction; when it fails (a ref the operator moved since it was
    // read, a name that clashes with a branch of the checkout), each update
    // alone, so one cannot hold back the others.
    let batch = if updates.is_empty() {
        Vec::new()
    } else {
        match run_git(runner, &update_refs(&repo.checkout, bottle, &updates)) {
            Ok(_) => updates.iter().map(|u| (u, Ok(()))).collect(),
            Err(_) if updates.len() > 1 => updates
                .iter()
                .map(|u| {
                    let one = std::slice::from_ref(u);
                    (
                        u,
                        run_git(runner, &update_refs(&repo.checkout, bottle, one)).map(drop),
                    )
                })
                .collect(),
            Err(err) => vec![(&updates[0], Err(err))],
        }
    };
    for (update, result) in batch {
        match result {
            Ok(()) => {
                match &update.new {
                    Some(value) => new_baseline.insert(update.refname.clone(), value.clone()),
                    None => new_baseline.remove(&update.refname),
                };
                moved = true;
                outcome(&update.refname, update.new.as_ref(), Outcome::Landed);
            }
            Err(err) => outcome(
                &update.refname,
                update.new.as_ref(),
                Outcome::Kept(format!("the checkout refused it: {err}")),
            ),
        }
    }
    if moved {
        repo.baseline = new_baseline;
    }
    Ok(moved)
}

/// What to do with one changed ref.
enum Decision {
    /// The checkout already has the agent's value.
    AlreadyThere,
    /// Write the agent's value (compare-and-swap with the checkout's).
    Write,
    /// Leave the checkout's ref as it is, for this reason.
    Keep(String),
}

/// The rules of the module's list, for one ref the push globs allow.
fn decide(
    runner: &dyn CommandRunner,
    repo: &SyncedRepo,
    change: &Change,
    cur: Option<&String>,
    checked_out: &BTreeSet<String>,
) -> Decision {
    if cur == change.new.as_ref() {
        return Decision::AlreadyThere;
    }
    if checked_out.contains(&change.refname) {
        return Decision::Keep(
            "it is checked out in the checkout; merge the agent's commit yourself".into(),
        );
    }
    let operator_moved = cur != change.base.as_ref();
    let Some(new) = &change.new else {
        // A deletion (allowed): only of the value the host last accepted.
        return if operator_moved {
            Decision::Keep("the operator moved it since the last sync".into())
        } else {
            Decision::Write
        };
    };
    let Some(cur) = cur else {
        // Not in the checkout (never was, or the operator deleted it):
        // nothing of the operator's is lost by creating it.
        return Decision::Write;
    };
    let fast_forward = match runner.run(&is_ancestor(&repo.checkout, cur, new)) {
        Ok(out) if out.code == Some(0) => true,
        Ok(out) if out.code == Some(1) => false,
        Ok(out) => {
            return Decision::Keep(git_failure(&is_ancestor(&repo.checkout, cur, new), &out));
        }
        Err(err) => return Decision::Keep(format!("could not run git: {err}")),
    };
    match (fast_forward, operator_moved) {
        (true, _) => Decision::Write,
        (false, false) if repo.allow_force => Decision::Write,
        (false, false) => Decision::Keep("not a fast-forward, and allow_force is off".into()),
        (false, true) => Decision::Keep(
            "the operator moved it since the last sync and the agent's commit does not contain the operator's"
                .into(),
        ),
    }
}

/// A cheap fingerprint of the mirror's refs (sizes, times and inodes of
/// `packed-refs`, `HEAD` and everything under `refs/`), read without
/// running git, so a watcher runs [`sync`] only when a push may have
/// landed. Symlinks are not followed; at most 10 000 entries are looked at.
pub fn mirror_fingerprint(mirror: &Path) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    use std::os::unix::fs::MetadataExt as _;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut stack = vec![mirror.join("refs")];
    let mut seen = 0usize;
    for top in ["packed-refs", "HEAD"] {
        if let Ok(meta) = std::fs::symlink_metadata(mirror.join(top)) {
            (top, meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).hash(&mut hasher);
        }
    }
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 10_000 {
                return hasher.finish();
            }
            let Ok(meta) = entry.metadata() else { continue };
            let path = entry.path();
            (
                path.as_os_str(),
                meta.len(),
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ino(),
            )
                .hash(&mut hasher);
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_told_apart_by_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let make = |path: &Path, files: &[&str], dirs: &[&str]| {
            std::fs::create_dir_all(path).unwrap();
            for d in dirs {
                std::fs::create_dir_all(path.join(d)).unwrap();
            }
            for f in files {
                std::fs::write(path.join(f), b"ref: refs/heads/main\n").unwrap();
            }
        };
        let bare = root.join("app.git");
        make(&bare, &["HEAD"], &["objects", "refs"]);
        assert_eq!(RepoKind::of_path(&bare), Some(RepoKind::Bare));

        let checkout = root.join("work");
        make(&checkout.join(".git"), &["HEAD"], &["objects", "refs"]);
        assert_eq!(RepoKind::of_path(&checkout), Some(RepoKind::Checkout));
        // Its .git directory, named directly, is the checkout's too.
        assert_eq!(
            RepoKind::of_path(&checkout.join(".git")),
            Some(RepoKind::Checkout)
        );

        let worktree = root.join("linked");
        std::fs::create_dir_all(&worktree).unwrap();
        std::fs::write(
            worktree.join(".git"),
            "gitdir: /elsewhere/.git/worktrees/x\n",
        )
        .unwrap();
        assert_eq!(RepoKind::of_path(&worktree), Some(RepoKind::Checkout));

        let not_bare = root.join("odd");
        make(&not_bare, &["HEAD"], &["objects", "refs"]);
        std::fs::write(
            not_bare.join("config"),
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n",
        )
        .unwrap();
        assert_eq!(RepoKind::of_path(&not_bare), Some(RepoKind::Checkout));

        let plain = root.join("plain");
        make(&plain, &["README"], &["src"]);
        assert_eq!(RepoKind::of_path(&plain), None);
        std::fs::write(plain.join(".git"), "not a gitdir file").unwrap();
        assert_eq!(RepoKind::of_path(&plain), None);
        assert_eq!(RepoKind::of_path(&root.join("missing")), None);

        assert_eq!(
            RepoKind::of_url("https://git.example.com/a.git"),
            Some(RepoKind::Remote)
        );
        assert_eq!(
            RepoKind::of_url(&format!("file://{}", bare.display())),
            Some(RepoKind::Bare)
        );
    }

    #[test]
    fn ref_names_from_the_mirror_are_checked() {
        for good in ["refs/heads/agent/x", "refs/tags/v1.0", "refs/heads/a-b_c"] {
            assert!(is_safe_refname(good), "{good}");
        }
        for bad in [
            "HEAD",
            "refs/heads/a b",
            "refs/heads/a..b",
            "refs/heads/.hidden",
            "refs/heads/x.lock",
            "refs/heads/x/",
            "refs/heads//x",
            "refs/heads/x\n",
            "refs/heads/-x:y",
            "refs/heads/@{1}",
        ] {
            assert!(!is_safe_refname(bad), "{bad:?}");
        }
    }

    #[test]
    fn ref_lists_parse_and_refuse_what_is_not_one() {
        let oid = "a".repeat(40);
        let refs = parse_ref_list(&format!(
            "{oid}\trefs/heads/main\n{oid} refs/heads/agent/x\n"
        ))
        .unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs["refs/heads/agent/x"], oid);
        assert!(parse_ref_list("nonsense").is_err());
        assert!(parse_ref_list("XYZ\trefs/heads/main").is_err());
    }

    #[test]
    fn update_lines_compare_and_swap() {
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        let line = |new: Option<&String>, old: Option<&String>| {
            RefUpdate {
                refname: "refs/heads/agent/x".into(),
                new: new.cloned(),
                old: old.cloned(),
            }
            .command_line()
        };
        assert_eq!(
            line(Some(&b), Some(&a)),
            format!("update refs/heads/agent/x {b} {a}\n")
        );
        assert_eq!(
            line(Some(&b), None),
            format!("create refs/heads/agent/x {b}\n")
        );
        assert_eq!(
            line(None, Some(&a)),
            format!("delete refs/heads/agent/x {a}\n")
        );
    }

    #[test]
    fn the_mirror_fingerprint_moves_with_its_refs() {
        let dir = tempfile::tempdir().unwrap();
        let mirror = dir.path();
        std::fs::create_dir_all(mirror.join("refs/heads")).unwrap();
        let before = mirror_fingerprint(mirror);
        assert_eq!(before, mirror_fingerprint(mirror));
        std::fs::create_dir_all(mirror.join("refs/heads/agent")).unwrap();
        std::fs::write(mirror.join("refs/heads/agent/x"), "a\n").unwrap();
        assert_ne!(before, mirror_fingerprint(mirror));
    }
}
