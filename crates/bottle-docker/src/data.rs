//! What `prepare` resolves for a launch ([`DockerPlanData`], the typed
//! `Plan::backend_data`) and the files kept in the bottle's state dir.
//!
//! State dir layout (version [`STATE_LAYOUT_VERSION`]):
//!
//! ```text
//! <state_dir>/bottle.json      the bottle's record (bottle_core::life)
//! <state_dir>/plan.json        the confirmed plan (backend_data included)
//! <state_dir>/ca/ca.pem        the bottle CA certificate (0644)
//! <state_dir>/ca/ca-key.pem    its private key (0600)
//! <state_dir>/logs/            bind-mounted at /var/log/bottle in the bundle
//! <state_dir>/requests/        supervise's queue, bind-mounted at /run/bottle/requests
//! <state_dir>/stage/           generated files: bundle.json, resolv.conf
//! ```

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bottle_core::Plan;
use bottle_core::files::Flush;
use serde::{Deserialize, Serialize};

use crate::error::DockerError;
use bottle_core::isolation::Isolation;

/// Version of [`DockerPlanData`] and of the state dir layout.
pub const STATE_LAYOUT_VERSION: u32 = 1;

/// A credential as the backend needs it at launch: where the secret is
/// read from on the host (never the secret itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialRef {
    /// The credential's name.
    pub name: String,
    /// The host it is injected for.
    pub host: String,
    /// The header.
    pub header: String,
    /// The header value template (`{}` is the secret).
    pub format: String,
    /// A host file holding the secret (resolved, `~` expanded).
    pub file: Option<PathBuf>,
    /// An environment variable of the `bottle` process holding it.
    pub env: Option<String>,
}

/// A repository git-gate serves, as resolved at prepare time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRef {
    /// The name the agent sees.
    pub name: String,
    /// A host-side repository: a bare one, bind-mounted into the bundle,
    /// or a working checkout (`checkout`).
    pub local_path: Option<PathBuf>,
    /// `local_path` is a working checkout: the launch makes a bare mirror
    /// of it in the state dir (`bottle_core::checkout`), which is what the
    /// bundle mounts; the checkout itself never reaches the bundle.
    #[serde(default)]
    pub checkout: bool,
    /// A remote URL the gate mirrors.
    pub upstream: Option<String>,
    /// Whether the agent may push.
    pub mode: bottle_core::manifest::GitMode,
    /// Ref globs the agent may push to.
    pub push: Vec<String>,
    /// Non-fast-forward pushes allowed.
    pub allow_force: bool,
    /// Deletions allowed.
    pub allow_delete: bool,
    /// Host file holding the upstream's credential.
    pub credential: Option<PathBuf>,
}

/// The bundle of one bottle as resolved at prepare time: what runs it on
/// the Docker Engine, for a docker bottle and for a microVM's alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleData {
    /// [`STATE_LAYOUT_VERSION`].
    pub version: u32,
    /// The bottle's network.
    pub network: String,
    /// Its subnet, `a.b.c.d/len`.
    pub subnet: String,
    /// The subnet's gateway address (reserved by IPAM; the host holds it
    /// on the bridge only for a microVM's bundle).
    pub gateway: Ipv4Addr,
    /// The bundle's pinned address.
    pub ip: Ipv4Addr,
    /// The bundle container.
    pub container: String,
    /// The bundle image tag (`bottle-bundle:<hash>`).
    pub image: String,
    /// Credentials to hand to the bundle.
    pub credentials: Vec<CredentialRef>,
    /// Repositories behind git-gate.
    pub git: Vec<GitRef>,
    /// Host PEM files the bundle trusts for upstream TLS: the manifest's
    /// `egress.upstream_ca` (resolved, `~` expanded), then the host's
    /// system store when the trust includes it.
    #[serde(default)]
    pub upstream_ca: Vec<PathBuf>,
    /// Whether the bundle also trusts its compiled-in web roots.
    #[serde(default = "trust_web_roots")]
    pub upstream_web_roots: bool,
    /// Whether the bottle outlives the process that launches it.
    pub detached: bool,
    /// User and group the bundle runs as (the operator's, so it can write
    /// the log dir it is given).
    pub user: (u32, u32),
}

fn trust_web_roots() -> bool {
    true
}

/// The agent container of a docker bottle as resolved at prepare time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentData {
    /// The agent's pinned address.
    pub ip: Ipv4Addr,
    /// The agent container.
    pub container: String,
    /// The agent image's ID.
    pub image_id: String,
    /// The agent image as the manifest named it (or the tag built).
    pub image_ref: String,
    /// The user the image runs as; empty means root.
    pub user: String,
    /// The image's entrypoint + cmd, run when no command is given.
    pub default_command: Vec<String>,
    /// The daemon's architecture (for the keep-alive program).
    pub arch: String,
    /// The daemon's storage as `GET /info` names it (`overlay2 on xfs`),
    /// for what `limits.disk` meets there.
    #[serde(default)]
    pub storage: String,
    /// The DNS server the agent's embedded resolver forwards to: the
    /// bundle's own address, which answers no DNS.
    pub dns_upstream: Ipv4Addr,
    /// The Engine runtime the agent container runs under, by its
    /// registered name: `None` for the daemon's default (the container
    /// tier), the gVisor runtime's name for a gVisor box.
    #[serde(default)]
    pub runtime: Option<String>,
    /// For a gVisor box, the runtime's binary on the host, canonical: what
    /// the box's sandbox process must be running.
    #[serde(default)]
    pub runtime_binary: Option<PathBuf>,
    /// The agent's whole environment (`bottle_core::agent::agent_env`).
    pub env: Vec<(String, String)>,
    /// Prompt file on the host.
    pub prompt: Option<PathBuf>,
    /// Skills directories on the host.
    pub skills: Vec<PathBuf>,
}

/// Everything the docker backend resolved at prepare time: a bundle and
/// an agent container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerPlanData {
    /// The bundle.
    pub bundle: BundleData,
    /// The agent container.
    pub agent: AgentData,
}

/// A docker bottle's plan.
pub type DockerPlan = Plan<DockerPlanData>;

/// The paths inside one bottle's state dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePaths {
    /// The state dir itself.
    pub root: PathBuf,
}

impl StatePaths {
    /// The layout under `root`.
    pub fn new(root: impl Into<PathBuf>) -> StatePaths {
        StatePaths { root: root.into() }
    }
    /// `plan.json`.
    pub fn plan(&self) -> PathBuf {
        self.root.join("plan.json")
    }
    /// `ca/ca.pem`.
    pub fn ca_cert(&self) -> PathBuf {
        self.root.join("ca").join("ca.pem")
    }
    /// `ca/ca-key.pem`.
    pub fn ca_key(&self) -> PathBuf {
        self.root.join("ca").join("ca-key.pem")
    }
    /// `logs/`.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// `requests/`: supervise's queue, bind-mounted into the bundle.
    pub fn requests(&self) -> PathBuf {
        bottle_core::requests::requests_dir(&self.root)
    }
    /// `host-services/`: a unix socket per host service, served by the
    /// host and mounted read-only into the bundle.
    pub fn host_services(&self) -> PathBuf {
        bottle_core::bundle::host_services_dir(&self.root)
    }
    /// `stage/`.
    pub fn stage(&self) -> PathBuf {
        self.root.join("stage")
    }
    /// `box/`: the keep-alive program and the in-box agent, mounted
    /// read-only at `/.bottle` in the agent container.
    pub fn agent_box(&self) -> PathBuf {
        self.root.join("box")
    }
    /// `stage/resolv.conf`: the agent's resolver config, with no servers.
    pub fn agent_resolv_conf(&self) -> PathBuf {
        self.stage().join("resolv.conf")
    }
    /// `stage/bundle.json`: the bundle config, for the operator to read.
    pub fn bundle_config(&self) -> PathBuf {
        self.stage().join("bundle.json")
    }
}

/// Writes `contents` to `path` with `mode`, creating parents (0700):
/// written aside and renamed, so a reader never sees half a file. Not
/// flushed to disk: after a host crash the bottle is gone anyway and
/// `cleanup` removes its state dir by the records [`write_record`] keeps.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), DockerError> {
    write_aside(path, contents, mode, false)
}

/// [`write_file`], flushed to disk with its directory: for the plan, which
/// must survive a crash for `cleanup` to finish it.
pub fn write_record(path: &Path, contents: &[u8], mode: u32) -> Result<(), DockerError> {
    write_aside(path, contents, mode, true)
}

fn write_aside(path: &Path, contents: &[u8], mode: u32, durable: bool) -> Result<(), DockerError> {
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    let flush = if durable {
        Flush::FileAndDir
    } else {
        Flush::No
    };
    bottle_core::files::write_aside(path, contents, mode, flush)
        .map_err(|failure| DockerError::io(failure.action, failure.path)(failure.source))
}

/// Creates `dir` and its parents, the last one 0700.
pub fn create_private_dir(dir: &Path) -> Result<(), DockerError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(DockerError::io("create directory", dir))
}

/// Reads the plan stored in a state dir.
pub fn read_plan(paths: &StatePaths) -> Result<DockerPlan, DockerError> {
    let path = paths.plan();
    let text = std::fs::read_to_string(&path).map_err(DockerError::io("read", &path))?;
    serde_json::from_str(&text).map_err(|err| DockerError::PlanData {
        detail: format!("{}: {err}", path.display()),
    })
}

/// Writes the plan into its state dir.
pub fn write_plan(paths: &StatePaths, plan: &DockerPlan) -> Result<(), DockerError> {
    let json = serde_json::to_vec_pretty(plan).map_err(|err| DockerError::PlanData {
        detail: err.to_string(),
    })?;
    write_record(&paths.plan(), &json, 0o600)
}

/// Holds an exclusive lock on the file `path` (made if missing), waiting
/// for its holder; released when the returned file is closed.
pub(crate) fn lock_file(path: &Path) -> Result<std::fs::File, DockerError> {
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(DockerError::io("open", path))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|err| DockerError::io("lock", path)(err.into()))?;
    Ok(file)
}

/// The entries of a bottle's state dir that a bundle-only launch writes.
const BUNDLE_FILES: [&str; 6] = [
    "ca",
    "logs",
    "stage",
    "requests",
    "host-services",
    bottle_core::checkout::CheckoutPaths::DIR_NAME,
];

/// What removing a bottle's files did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// Whether anything was removed.
    pub removed: bool,
    /// Where the bottle's audit log was kept, when it had one
    /// (`bottle_core::audit_files::retain_audit_log`).
    pub kept_log: Option<PathBuf>,
}

/// Moves the audit log of the state dir `dir` to the retained logs before
/// the dir goes: it is the one record of what the agent did. When that
/// fails nothing is removed, so the log is not lost with the dir.
fn keep_audit_log(dir: &Path) -> Result<Option<PathBuf>, DockerError> {
    let stopped = bottle_core::time::now_rfc3339_millis();
    Ok(bottle_core::audit_files::retain_audit_log(dir, &stopped)?)
}

/// Removes what a bundle-only launch (a microVM's bundle) wrote into the
/// state dir `dir`, and `dir` itself if nothing else is left in it, after
/// keeping its audit log.
pub fn remove_bundle_files(dir: &Path) -> Result<Removal, DockerError> {
    let kept_log = keep_audit_log(dir)?;
    let mut removed = false;
    // Bottles launched before `bottle.json` also have its forerunners.
    let replaced = bottle_core::life::legacy::REPLACED_FILES;
    for name in BUNDLE_FILES.iter().chain(&replaced) {
        let path = dir.join(name);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(DockerError::io("inspect", &path)(err)),
        };
        let result = if meta.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => removed = true,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(DockerError::io("remove", &path)(err)),
        }
    }
    // Only an empty dir goes: the rest belongs to the smolmachines backend.
    let _ = std::fs::remove_dir(dir);
    Ok(Removal { removed, kept_log })
}

/// Removes a state dir after keeping its audit log; a missing one is not
/// an error.
pub fn remove_state_dir(root: &Path) -> Result<Removal, DockerError> {
    let kept_log = keep_audit_log(root)?;
    let removed = match std::fs::remove_dir_all(root) {
        Ok(()) => true,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => false,
        Err(err) => return Err(DockerError::io("remove", root)(err)),
    };
    Ok(Removal { removed, kept_log })
}

/// The gVisor binary a bottle's box must run under: `None` for the
/// container tier; for a gVisor plan, the one it recorded (a plan without
/// one is refused, never treated as a container).
pub(crate) fn gvisor_binary_of(plan: &DockerPlan) -> Result<Option<PathBuf>, DockerError> {
    match plan.isolation {
        Isolation::Container => Ok(None),
        Isolation::Gvisor => match &plan.backend_data.agent.runtime_binary {
            Some(binary) => Ok(Some(binary.clone())),
            None => Err(DockerError::NotUnderGvisor {
                what: "the bottle's plan records no gVisor binary".into(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_with_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path().join("x"));
        write_file(&paths.ca_key(), b"secret", 0o600).unwrap();
        let mode = std::fs::metadata(paths.ca_key())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(paths.root.join("ca"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_eq!(std::fs::read(paths.ca_key()).unwrap(), b"secret");
    }

    #[test]
    fn only_the_bundle_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("demo");
        let paths = StatePaths::new(&root);
        write_file(&paths.ca_key(), b"k", 0o600).unwrap();
        write_file(&paths.bundle_config(), b"{}", 0o600).unwrap();
        create_private_dir(&paths.logs()).unwrap();
        std::fs::write(paths.logs().join("audit.jsonl"), b"{}\n").unwrap();
        std::fs::write(root.join("owner.json"), b"{}").unwrap();
        std::fs::write(root.join("smolvm.json"), b"{}").unwrap();
        let removal = remove_bundle_files(&root).unwrap();
        assert!(removal.removed);
        let left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["smolvm.json"]);
        // A microVM's audit log is kept like a docker bottle's.
        let run = removal.kept_log.expect("the audit log is kept");
        assert_eq!(std::fs::read(run.join("audit.jsonl")).unwrap(), b"{}\n");
        std::fs::remove_file(root.join("smolvm.json")).unwrap();
        let again = remove_bundle_files(&root).unwrap();
        assert!(!again.removed);
        assert_eq!(again.kept_log, None);
        assert!(!root.exists(), "an empty state dir goes too");
    }

    #[test]
    fn removing_a_state_dir_keeps_its_audit_log_beside_it_without_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path().join("demo"));
        write_file(&paths.ca_key(), b"KEY", 0o600).unwrap();
        create_private_dir(&paths.logs()).unwrap();
        std::fs::write(paths.logs().join("audit.jsonl"), b"live\n").unwrap();
        std::fs::write(paths.logs().join("audit.jsonl.1"), b"older\n").unwrap();
        let removal = remove_state_dir(&paths.root).unwrap();
        assert!(removal.removed);
        assert!(!paths.root.exists());
        let run = removal.kept_log.expect("the audit log is kept");
        assert!(
            run.starts_with(dir.path().join("retained_logs/demo")),
            "{}",
            run.display()
        );
        let mut kept: Vec<String> = std::fs::read_dir(&run)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        assert_eq!(kept, ["audit.jsonl", "audit.jsonl.1"]);
    }

    #[test]
    fn removing_a_state_dir_twice_removes_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path().join("x"));
        create_private_dir(&paths.root).unwrap();
        assert!(remove_state_dir(&paths.root).unwrap().removed);
        assert!(!remove_state_dir(&paths.root).unwrap().removed);
    }
}
