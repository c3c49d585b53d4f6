//! What the gate checks and prepares before it serves: its limits, where
//! git and the hook program are, each repository (mounted, or a mirror
//! whose upstream and credential are usable), and the work dir with the
//! `pre-receive` hook.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use bottle_core::bundle::{BundleConfig, BundleGitRepo, BundleLimits};
use tokio::sync::{Mutex, Semaphore};

use super::GitGate;
use crate::BundleError;
use crate::audit::AuditLog;
use crate::gitgate::command::{Git, upstream_protocol_ok};
use crate::gitgate::hook;
use crate::gitgate::push_rules::{RepoPolicy, RuntimePushRules};
use crate::gitgate::runtime::BUNDLE_GIT;
use crate::gitgate::upstream;

/// Sizes and times the gate enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateLimits {
    /// Largest push (decoded request body), also git's
    /// `receive.maxInputSize`.
    pub max_push_bytes: u64,
    /// Largest upload-pack request (decoded; the fetch negotiation).
    pub max_request_bytes: u64,
    /// Largest command list at the start of a push.
    pub max_command_bytes: usize,
    /// Git processes serving requests at once; more requests wait.
    pub max_concurrent: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Time to send a request head (and keep-alive idle time).
    pub header_read_timeout: Duration,
    /// Time a connection may move no bytes mid-request.
    pub idle_timeout: Duration,
    /// Time an upstream fetch may take (mirror mode).
    pub upstream_timeout: Duration,
}

impl GateLimits {
    /// The bundle's connection limits plus the gate's own sizes.
    pub fn from_bundle(l: &BundleLimits) -> Self {
        Self {
            max_push_bytes: 2 << 30,
            max_request_bytes: 256 << 20,
            max_command_bytes: 4 << 20,
            max_concurrent: 8,
            max_connections: l.max_connections.clamp(1, 256),
            max_header_bytes: l.max_header_bytes,
            header_read_timeout: Duration::from_millis(l.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(l.idle_timeout_ms),
            upstream_timeout: Duration::from_secs(600),
        }
    }
}

/// Where git, the hook program and the gate's scratch files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRuntime {
    /// The git binary.
    pub git: PathBuf,
    /// The program the `pre-receive` hook runs (`<program> git-hook`): the
    /// `bottle-bundle` binary.
    pub hook_program: PathBuf,
    /// The gate's work dir (hooks, hook results, `HOME` for git).
    pub work_dir: PathBuf,
    /// Remove the work dir when the gate is dropped.
    pub remove_work_dir: bool,
}

static WORK_SEQ: AtomicU64 = AtomicU64::new(0);

impl GitRuntime {
    /// Inside the bundle: `/usr/bin/git`, `hook_program` (default: this
    /// executable) as the hook program, and a fresh work dir under the
    /// temp dir (`/tmp`).
    pub fn for_bundle(hook_program: Option<&str>) -> Result<Self, BundleError> {
        // A configured program is checked by `GitGate::new` like any other.
        let configured = hook_program.map(PathBuf::from);
        let hook_program = configured
            .or_else(|| std::env::current_exe().ok().filter(|p| p.is_absolute()))
            // No /proc (a bare chroot): argv[0] when it is absolute.
            .or_else(|| {
                std::env::args_os()
                    .next()
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
            })
            .ok_or_else(|| BundleError::GitRuntime {
                detail: "cannot tell where the bottle-bundle binary is (no /proc/self/exe, argv[0] is relative)".into(),
            })?;
        let work_dir = std::env::temp_dir().join(format!(
            "bottle-git-gate-{}-{}",
            std::process::id(),
            WORK_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        Ok(Self {
            git: PathBuf::from(BUNDLE_GIT),
            hook_program,
            work_dir,
            remove_work_dir: true,
        })
    }
}

/// One repository the gate serves.
#[derive(Debug)]
pub(super) struct GateRepo {
    pub(super) config: BundleGitRepo,
    pub(super) policy: RepoPolicy,
    pub(super) path: PathBuf,
    /// Serialises upstream fetches and pushes into a mirror.
    pub(super) lock: Arc<Mutex<()>>,
}

/// Whether a repository name is one the gate can serve.
fn is_repo_name(name: &str) -> bool {
    name.len() <= 100
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn repo_err(repo: &str, detail: impl Into<String>) -> BundleError {
    BundleError::GitRepo {
        repo: repo.to_string(),
        detail: detail.into(),
    }
}

fn runtime_err(detail: impl Into<String>) -> BundleError {
    BundleError::GitRuntime {
        detail: detail.into(),
    }
}

fn check_repo(repo: &BundleGitRepo) -> Result<(), BundleError> {
    let name = &repo.name;
    if !is_repo_name(name) {
        return Err(repo_err(
            name,
            "the name must be letters, digits, \".\", \"_\" and \"-\", starting with a letter or digit",
        ));
    }
    let path = Path::new(&repo.path_in_bundle);
    if !path.is_absolute() {
        return Err(repo_err(
            name,
            format!("path_in_bundle {:?} is not absolute", repo.path_in_bundle),
        ));
    }
    match &repo.upstream {
        None => {
            if !path.join("HEAD").is_file() || !path.join("objects").is_dir() {
                return Err(repo_err(
                    name,
                    format!("no bare repository at {}", path.display()),
                ));
            }
        }
        Some(url) => {
            if !upstream_protocol_ok(url) {
                return Err(repo_err(
                    name,
                    format!("upstream {url:?} is not an https://, http:// or file:// URL"),
                ));
            }
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    repo_err(
                        name,
                        format!(
                            "cannot create the mirror's directory {}: {e}",
                            parent.display()
                        ),
                    )
                })?;
            }
            if let Some(file) = &repo.credential_file {
                upstream::read_auth_header(Path::new(file)).map_err(|detail| {
                    BundleError::Credential {
                        name: format!("git:{name}"),
                        path: file.clone(),
                        detail,
                    }
                })?;
            }
        }
    }
    if repo.upstream.is_none() && repo.credential_file.is_some() {
        return Err(repo_err(
            name,
            "credential_file is set but there is no upstream to send it to",
        ));
    }
    Ok(())
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    f.write_all(data)
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

impl GitGate {
    /// Checks the repositories, git and the hook program, and sets up the
    /// work dir. Fails (fail closed: the bundle does not start) when a
    /// host repository is not mounted, a credential cannot be read, or
    /// git is missing.
    pub fn new(
        config: &BundleConfig,
        audit: AuditLog,
        runtime: GitRuntime,
        limits: GateLimits,
    ) -> Result<Self, BundleError> {
        let mut repos = BTreeMap::new();
        for repo in &config.git {
            check_repo(repo)?;
            let policy = RepoPolicy::new(repo)?;
            let entry = Arc::new(GateRepo {
                config: repo.clone(),
                policy,
                path: PathBuf::from(&repo.path_in_bundle),
                lock: Arc::new(Mutex::new(())),
            });
            if repos.insert(repo.name.clone(), entry).is_some() {
                return Err(repo_err(&repo.name, "the name is used twice"));
            }
        }
        if !runtime.git.is_file() {
            return Err(runtime_err(format!(
                "git is not at {}; the bundle image must carry the files git_runtime_files() lists",
                runtime.git.display()
            )));
        }
        let program = runtime.hook_program.display().to_string();
        if !runtime.hook_program.is_absolute()
            || !runtime.hook_program.is_file()
            || program.len() > 120
            || program.chars().any(char::is_whitespace)
        {
            return Err(runtime_err(format!(
                "the hook program {program:?} must be an existing file at an absolute path of at most 120 characters without spaces (it goes into a #! line)"
            )));
        }
        let hooks_dir = runtime.work_dir.join("hooks");
        let results_dir = runtime.work_dir.join("results");
        let setup = || -> std::io::Result<()> {
            create_private_dir(&hooks_dir)?;
            create_private_dir(&results_dir)?;
            write_file(
                &hooks_dir.join("pre-receive"),
                hook::script(&runtime.hook_program).as_bytes(),
                0o755,
            )
        };
        setup().map_err(|e| {
            runtime_err(format!(
                "cannot set up the work dir {}: {e}",
                runtime.work_dir.display()
            ))
        })?;
        Ok(Self {
            bottle: config.bottle.clone(),
            repos,
            push_rules: RuntimePushRules::default(),
            audit,
            git: Git {
                program: runtime.git,
                home: runtime.work_dir.clone(),
                hooks_dir,
            },
            work_dir: runtime.work_dir,
            remove_work_dir: runtime.remove_work_dir,
            results_dir,
            slots: Arc::new(Semaphore::new(limits.max_concurrent.max(1))),
            limits,
            port: AtomicU16::new(0),
            seq: AtomicU64::new(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names() {
        assert!(is_repo_name("demo"));
        assert!(is_repo_name("my-repo.v2_x"));
        assert!(!is_repo_name(".hidden"));
        assert!(!is_repo_name("a/b"));
        assert!(!is_repo_name(""));
        assert!(!is_repo_name(".."));
    }
}
