//! The verified reset of a docker bottle: the mechanics behind
//! [`bottle_core::sandbox::reset`] for an agent container on overlay2.
//!
//! - The golden snapshot is a `cp -a` of the container's upper layer
//!   (`GraphDriver.Data.UpperDir`) into `<state_dir>/golden/upper`, taken at
//!   launch after the first start (the daemon's `--init` writes
//!   `/sbin/docker-init` into the layer then, and nothing after). `cp -a`
//!   keeps what overlayfs needs: `trusted.overlay.*` xattrs, whiteouts
//!   (char devices 0/0), owners, modes, symlinks, fifos. No hardlinks: the
//!   box would write through them into the snapshot.
//! - A revert swaps in the standby box `standby.rs` prepared off the
//!   reset's path when one waits. Otherwise it restarts the box: it kills
//!   the container (SIGKILL through the Engine API, which answers once the
//!   daemon unmounted the layer), swaps a prepared copy of the snapshot
//!   (`<UpperDir>.next`, on the layer's own filesystem) in by two renames,
//!   starts the container again, and prepares the next copy. Either way
//!   the bundle, the networks, the CA and the audit log are not touched.
//! - The three sources: a walk of the upper layer hashing every entry's
//!   content and metadata (no timestamps), the descriptors open in the
//!   container's pid namespace read from the host's `/proc`, and the
//!   Engine's inspect of the container.
//! - A gVisor box: the box's processes live in gVisor's kernel, which the
//!   kill ends with the sandbox, and the sandbox shares the host's pid
//!   namespace, so the descriptor source counts what could outlive the
//!   revert instead: descriptors of host processes in the box's cgroup
//!   that do not run gVisor's binary (0 as launched;
//!   `gvisor::stray_descriptors`). The keep-alive cannot be seen
//!   from the host either: the revert checks the sandbox's process runs
//!   again instead.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::KillContainerOptionsBuilder;
use bottle_core::backend::BackendError;
use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bottle_core::sandbox::{ResetFiles, ResetSubstrate, RevertMethod};
use sha2::{Digest, Sha256};

use crate::client::Engine;
use crate::error::DockerError;
use crate::pause::PAUSE_PATH;

mod standby;

pub use standby::{OpenChannel, StandbyPrepared};

/// The only storage driver whose writable layer this module can copy.
const OVERLAY2: &str = "overlay2";

/// The xattr overlayfs sets per filesystem instance; a copy may carry a
/// different one without the box's contents differing.
const OVERLAY_UUID_XATTR: &[u8] = b"trusted.overlay.uuid";

/// How long the layer may stay mounted after the kill returned, and the
/// keep-alive take to come back after the start.
const SETTLE: Duration = Duration::from_secs(5);

/// A docker bottle as [`bottle_core::sandbox::reset`] drives it.
pub struct DockerResetSubstrate {
    engine: Engine,
    bottle: String,
    agent: String,
    bundle: String,
    files: ResetFiles,
    runner: Box<dyn CommandRunner>,
    /// For a gVisor box, the runtime's binary its sandbox must run.
    gvisor_binary: Option<PathBuf>,
    /// What this reset swapped in: the standby's ID and the in-box agent
    /// a handle started in it ahead (none after a restart).
    swapped_in: Mutex<Option<(String, Option<ChannelProcess>)>>,
}

/// The in-box agent a handle started in a standby before it waited, its
/// channel open ([`bottle_core::sandbox::Toolbox::open_ahead`]): bottle's
/// own process, the one whose descriptors (the channel's) the descriptor
/// source leaves out. Named by its host pid and start time, so another
/// process that gets the same pid later is counted.
pub type ChannelProcess = bottle_core::process::Owner;

/// The in-box agent `pid` as it runs now.
pub(crate) fn channel_process(pid: u32) -> Result<ChannelProcess, DockerError> {
    ChannelProcess::of(pid).ok_or_else(|| DockerError::ResetState {
        what: format!("the in-box agent (pid {pid}) ended as it started"),
    })
}

impl DockerResetSubstrate {
    /// The substrate of bottle `bottle`, whose agent and bundle containers
    /// are `agent` and `bundle`, whose state dir is `state_dir` and whose
    /// box runs under gVisor's `gvisor_binary` when it is `Some`.
    pub fn new(
        engine: Engine,
        bottle: &str,
        agent: &str,
        bundle: &str,
        state_dir: &Path,
        gvisor_binary: Option<PathBuf>,
    ) -> DockerResetSubstrate {
        DockerResetSubstrate {
            engine,
            bottle: bottle.to_string(),
            agent: agent.to_string(),
            bundle: bundle.to_string(),
            files: ResetFiles::new(state_dir),
            runner: Box::new(SystemRunner),
            gvisor_binary,
            swapped_in: Mutex::new(None),
        }
    }

    /// The standby this reset swapped in, by ID, when it did.
    pub fn swapped_in(&self) -> Option<String> {
        self.swapped_in_lock().as_ref().map(|(id, _)| id.clone())
    }

    fn swapped_in_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<(String, Option<ChannelProcess>)>> {
        self.swapped_in.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bottle's reset files (baseline, halt record, golden dir).
    pub fn files(&self) -> &ResetFiles {
        &self.files
    }

    /// Where the golden copy of the upper layer is kept.
    pub fn golden_upper(&self) -> PathBuf {
        self.files.golden_dir().join("upper")
    }

    fn inspect_of(&self, container: &str) -> Result<ContainerInspectResponse, DockerError> {
        self.engine
            .block_on(self.engine.docker.inspect_container(container, None))
            .map_err(DockerError::api(format!("inspect container {container}")))
    }

    /// The agent container's upper layer, or why there is none to copy.
    pub fn upper_dir(&self) -> Result<PathBuf, DockerError> {
        self.upper_dir_of(&self.agent)
    }

    /// `container`'s upper layer, or why there is none to copy.
    fn upper_dir_of(&self, container: &str) -> Result<PathBuf, DockerError> {
        let inspect = self.inspect_of(container)?;
        let unavailable = |why: String| DockerError::ResetUnavailable { why };
        let driver = inspect.graph_driver.unwrap_or_default();
        if driver.name != OVERLAY2 {
            return Err(unavailable(format!(
                "the daemon's storage driver is {:?}, and only {OVERLAY2}'s writable layer can be snapshotted",
                driver.name
            )));
        }
        let upper = driver
            .data
            .get("UpperDir")
            .filter(|dir| !dir.is_empty())
            .ok_or_else(|| {
                unavailable(format!(
                    "the daemon does not report the upper layer of {container}"
                ))
            })?;
        let upper = PathBuf::from(upper);
        if let Err(err) = std::fs::read_dir(&upper) {
            return Err(unavailable(format!(
                "cannot read the container's upper layer {}: {err} (reset needs bottle to run as root on the daemon's host)",
                upper.display()
            )));
        }
        Ok(upper)
    }

    /// `cp -a from to` through a temporary name, so `to` is either absent
    /// or a whole copy.
    fn copy_tree(&self, from: &Path, to: &Path) -> Result<(), DockerError> {
        let partial = sibling(to, ".partial");
        remove_tree(&partial)?;
        let spec = CommandSpec::new("cp")
            .arg("-a")
            .arg("--")
            .arg(from)
            .arg(&partial);
        let copied = self
            .runner
            .run(&spec)
            .map_err(DockerError::io("run `cp -a` onto", &partial))?;
        if !copied.success() {
            let _ = remove_tree(&partial);
            return Err(DockerError::ResetCopy {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
                detail: copied.stderr_text().trim().to_string(),
            });
        }
        remove_tree(to)?;
        std::fs::rename(&partial, to).map_err(DockerError::io("rename into place", to))
    }

    /// Makes `<upper>.next` a fresh copy of the golden snapshot.
    fn prepare_next(&self, upper: &Path) -> Result<(), DockerError> {
        self.copy_tree(&self.golden_upper(), &sibling(upper, ".next"))
    }

    /// SIGKILLs `container`; one that is not running is already stopped.
    fn kill(&self, container: &str) -> Result<(), DockerError> {
        self.engine.block_on(self.kill_async(container))
    }

    /// [`Self::kill`], on the runtime.
    async fn kill_async(&self, container: &str) -> Result<(), DockerError> {
        let options = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        match self
            .engine
            .docker
            .kill_container(container, Some(options))
            .await
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(err) => Err(DockerError::api(format!("kill container {container}"))(err)),
        }
    }

    /// `container`'s init process and its pid namespace.
    fn init_namespace_of(&self, container: &str) -> Result<(u32, PathBuf), DockerError> {
        let state = self.inspect_of(container)?.state.unwrap_or_default();
        let pid = state
            .pid
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid > 0 && state.running == Some(true))
            .ok_or_else(|| DockerError::ResetState {
                what: format!("{container} is not running"),
            })?;
        let link = PathBuf::from(format!("/proc/{pid}/ns/pid"));
        let namespace =
            std::fs::read_link(&link).map_err(DockerError::io("read the link", &link))?;
        Ok((pid, namespace))
    }

    /// Waits until the keep-alive runs in `container` (the start returns
    /// once its init runs; init starts the keep-alive after); in a gVisor
    /// box, whose keep-alive the host cannot see, checks once that the
    /// sandbox runs.
    fn wait_for_keep_alive(&self, container: &str) -> Result<(), DockerError> {
        if let Some(binary) = &self.gvisor_binary {
            // The keep-alive runs in gVisor's kernel, out of the host's
            // sight: the box is back once its sandbox runs.
            let inspect = self.inspect_of(container)?;
            return crate::gvisor::check_sandbox_process(&inspect, Path::new("/proc"), binary)
                .map(drop)
                .map_err(|what| DockerError::ResetState { what });
        }
        let (_, namespace) = self.init_namespace_of(container)?;
        let deadline = Instant::now() + SETTLE;
        loop {
            let keep_alive = processes_in(&namespace).into_iter().any(|pid| {
                std::fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|exe| exe == Path::new(PAUSE_PATH))
            });
            if keep_alive {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DockerError::ResetState {
                    what: format!(
                        "the keep-alive of {container} did not come back within {} s",
                        SETTLE.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn revert_inner(&self) -> Result<RevertMethod, DockerError> {
        // Two resets of one bottle at once would swap each other's copies.
        let _one_at_a_time = self.lock()?;
        if let Some(swapped_in) = self.swap_in_standby()? {
            *self.swapped_in_lock() = Some(swapped_in);
            return Ok(RevertMethod::Standby);
        }
        let upper = self.upper_dir()?;
        // A box swapped in from a standby has no copy prepared beside its
        // layer until the next standby's preparation makes one.
        if !sibling(&upper, ".next").is_dir() {
            self.prepare_next(&upper)?;
        }
        self.kill(&self.agent)?;
        wait_unmounted(&upper)?;
        swap_layer(&upper)?;
        self.engine
            .block_on(self.engine.docker.start_container(&self.agent, None))
            .map_err(DockerError::api(format!("start {}", self.agent)))?;
        self.wait_for_keep_alive(&self.agent)?;
        // Before returning, so a later reset never finds a stale or
        // partial copy (a partial one never carries the `.next` name).
        self.prepare_next(&upper)?;
        Ok(RevertMethod::Restart)
    }

    /// Holds the bottle's reset lock (released when the file is closed).
    fn lock(&self) -> Result<std::fs::File, DockerError> {
        crate::data::lock_file(&self.files.golden_dir().join("reset.lock"))
    }

    fn snapshot_inner(&self) -> Result<(), DockerError> {
        let upper = self.upper_dir()?;
        self.copy_tree(&upper, &self.golden_upper())?;
        self.prepare_next(&upper)
    }

    /// The descriptors open in `container`'s processes but `channel`'s.
    fn open_fds_of(
        &self,
        container: &str,
        channel: Option<ChannelProcess>,
    ) -> Result<u64, DockerError> {
        let (pid, namespace) = self.init_namespace_of(container)?;
        if let Some(binary) = &self.gvisor_binary {
            return crate::gvisor::stray_descriptors(Path::new("/proc"), pid, binary)
                .map_err(|what| DockerError::ResetState { what });
        }
        // A process may end between listing and counting: it then holds
        // nothing.
        Ok(processes_in(&namespace)
            .into_iter()
            .filter(|pid| !channel.is_some_and(|channel| channel.is(*pid)))
            .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
            .map(|fds| fds.count() as u64)
            .sum())
    }

    fn engine_of(&self, container: &str) -> Result<BTreeMap<String, String>, DockerError> {
        Ok(engine_facts(&self.inspect_of(container)?))
    }
}

impl ResetSubstrate for DockerResetSubstrate {
    fn bottle(&self) -> &str {
        &self.bottle
    }

    fn snapshot(&self) -> Result<(), BackendError> {
        Ok(self.snapshot_inner()?)
    }

    fn revert(&self) -> Result<RevertMethod, BackendError> {
        Ok(self.revert_inner()?)
    }

    /// The live layer's hash, which must also be the hash of the copy the
    /// next reset will swap in: that copy was made from the golden
    /// snapshot after this revert, so a snapshot changed behind bottle's
    /// back shows here, at this reset, not only at the next one.
    fn read_fs_hash(&self) -> Result<String, BackendError> {
        let upper = self.upper_dir()?;
        let live = tree_hash(&upper)?;
        let next = sibling(&upper, ".next");
        if next.is_dir() {
            let prepared = tree_hash(&next)?;
            if prepared != live {
                return Ok(format!(
                    "{live}, but the golden snapshot now copies as {prepared}"
                ));
            }
        }
        Ok(live)
    }

    fn read_open_fds(&self) -> Result<u64, BackendError> {
        let channel = self.swapped_in_lock().as_ref().and_then(|(_, c)| *c);
        Ok(self.open_fds_of(&self.agent, channel)?)
    }

    fn read_engine(&self) -> Result<BTreeMap<String, String>, BackendError> {
        Ok(self.engine_of(&self.agent)?)
    }

    fn halt(&self) -> Result<(), BackendError> {
        let agent = self.kill(&self.agent);
        let bundle = self.kill(&self.bundle);
        agent?;
        Ok(bundle?)
    }
}

/// `path` with `suffix` appended to its last component.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Puts the prepared copy `<upper>.next` in place of the unmounted layer
/// `upper` by two renames, and removes the layer it replaced.
fn swap_layer(upper: &Path) -> Result<(), DockerError> {
    let next = sibling(upper, ".next");
    let old = sibling(upper, ".old");
    remove_tree(&old)?;
    std::fs::rename(upper, &old).map_err(DockerError::io("move aside", upper))?;
    std::fs::rename(&next, upper).map_err(DockerError::io("move into place", &next))?;
    remove_tree(&old)
}

fn remove_tree(path: &Path) -> Result<(), DockerError> {
    match std::fs::remove_dir_all(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(DockerError::io("remove", path)(err))
        }
        _ => Ok(()),
    }
}

/// Waits (bounded) until no mount in `/proc/mounts` uses `upper`.
fn wait_unmounted(upper: &Path) -> Result<(), DockerError> {
    let needle = format!("upperdir={}", upper.display());
    let deadline = Instant::now() + SETTLE;
    loop {
        let mounts = std::fs::read_to_string("/proc/mounts")
            .map_err(DockerError::io("read", "/proc/mounts"))?;
        let mounted = mounts
            .lines()
            .any(|line| line.split([',', ' ']).any(|option| option == needle));
        if !mounted {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(DockerError::ResetMounted {
                upper: upper.to_path_buf(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every process whose pid namespace is `namespace` (as `/proc/<p>/ns/pid`
/// reads): the container's init, its children and every `docker exec`.
fn processes_in(namespace: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns == namespace)
        })
        .collect()
}

/// `sha256:<hex>` over every entry under `root`, sorted by path: its
/// relative path, type, mode, owner, size, device number, symlink target,
/// content hash and xattrs (but `trusted.overlay.uuid`). No timestamps: a
/// copy differs from its original in those alone.
pub fn tree_hash(root: &Path) -> Result<String, DockerError> {
    let mut hasher = Sha256::new();
    hash_dir(root, Path::new(""), &mut hasher)?;
    Ok(format!("sha256:{}", hex(&hasher.finalize())))
}

fn hash_dir(root: &Path, relative: &Path, hasher: &mut Sha256) -> Result<(), DockerError> {
    let dir = root.join(relative);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map_err(DockerError::io("list", &dir))?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(DockerError::io("list", &dir))?;
    names.sort();
    for name in names {
        let relative = relative.join(&name);
        let path = root.join(&relative);
        let meta = std::fs::symlink_metadata(&path).map_err(DockerError::io("stat", &path))?;
        let kind = meta.file_type();
        let mut record = format!(
            "{}\0{}\0{:o}\0{}\0{}\0",
            relative.display(),
            type_name(&kind),
            meta.mode(),
            meta.uid(),
            meta.gid()
        );
        if kind.is_file() {
            record.push_str(&format!("{}\0{}\0", meta.len(), file_hash(&path)?));
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&path).map_err(DockerError::io("read", &path))?;
            record.push_str(&format!("{}\0", target.display()));
        } else if kind.is_char_device() || kind.is_block_device() {
            record.push_str(&format!("{}\0", meta.rdev()));
        }
        for (name, value) in xattrs(&path)? {
            record.push_str(&format!(
                "{}={}\0",
                String::from_utf8_lossy(&name),
                hex(&value)
            ));
        }
        record.push('\n');
        hasher.update(record.as_bytes());
        if kind.is_dir() {
            hash_dir(root, &relative, hasher)?;
        }
    }
    Ok(())
}

fn type_name(kind: &std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "dir"
    } else if kind.is_file() {
        "file"
    } else if kind.is_symlink() {
        "symlink"
    } else if kind.is_char_device() {
        "char"
    } else if kind.is_block_device() {
        "block"
    } else if kind.is_fifo() {
        "fifo"
    } else if kind.is_socket() {
        "socket"
    } else {
        "other"
    }
}

fn file_hash(path: &Path) -> Result<String, DockerError> {
    let mut file = std::fs::File::open(path).map_err(DockerError::io("open", path))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(DockerError::io("read", path))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hex(&hasher.finalize()))
}

/// An xattr's name and value.
type Xattr = (Vec<u8>, Vec<u8>);

/// The entry's xattrs (not followed through a symlink), sorted by name,
/// but `trusted.overlay.uuid`.
fn xattrs(path: &Path) -> Result<Vec<Xattr>, DockerError> {
    let failed = |err: rustix::io::Errno| DockerError::io("read the xattrs of", path)(err.into());
    let size = rustix::fs::llistxattr_query(path).map_err(failed)?;
    let mut list = vec![0u8; size];
    let size = rustix::fs::llistxattr(path, &mut list[..]).map_err(failed)?;
    list.truncate(size);
    let mut pairs = Vec::new();
    for name in list.split(|byte| *byte == 0).filter(|n| !n.is_empty()) {
        if name == OVERLAY_UUID_XATTR {
            continue;
        }
        let size = rustix::fs::lgetxattr_query(path, name).map_err(failed)?;
        let mut value = vec![0u8; size];
        let size = rustix::fs::lgetxattr(path, name, &mut value[..]).map_err(failed)?;
        value.truncate(size);
        pairs.push((name.to_vec(), value));
    }
    pairs.sort();
    Ok(pairs)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the upper layer the Engine names for the container is the one
/// the daemon created for it: `own` when the daemon's layer store maps the
/// container's ID to that layer, otherwise what it maps to. A reset swaps
/// in a standby, a box of its own with a layer of its own, so the layer's
/// path is not a fact a reset keeps; that the box runs on its own layer,
/// whose contents the filesystem source hashes, is.
fn layer_fact(inspect: &ContainerInspectResponse) -> String {
    let upper = inspect
        .graph_driver
        .as_ref()
        .and_then(|d| d.data.get("UpperDir").cloned())
        .unwrap_or_default();
    let upper = Path::new(&upper);
    // `<root>/overlay2/<mount-id>/diff`, and the daemon's record of the
    // container's layer at `<root>/image/overlay2/layerdb/mounts/<id>/mount-id`.
    let (Some(mount), Some(root)) = (
        upper.parent().and_then(Path::file_name),
        upper.ancestors().nth(3),
    ) else {
        return format!("not an overlay2 layer: {}", upper.display());
    };
    let id = inspect.id.clone().unwrap_or_default();
    let record = root
        .join("image/overlay2/layerdb/mounts")
        .join(&id)
        .join("mount-id");
    match std::fs::read_to_string(&record) {
        Ok(recorded) if recorded.trim() == mount.to_string_lossy() => "own".into(),
        Ok(recorded) => format!("{} (the daemon's is {})", upper.display(), recorded.trim()),
        Err(err) => format!("unreadable: {}: {err}", record.display()),
    }
}

/// The Engine's view of the agent container that a reset must leave as it
/// was: running, image, its own layer, networks, limits, privileges,
/// mounts, user.
pub(crate) fn engine_facts(inspect: &ContainerInspectResponse) -> BTreeMap<String, String> {
    let state = inspect.state.clone().unwrap_or_default();
    let host = inspect.host_config.clone().unwrap_or_default();
    let number = |n: Option<i64>| n.map_or_else(|| "none".to_string(), |n| n.to_string());
    let flag = |b: Option<bool>| b.unwrap_or(false).to_string();
    let list = |items: Option<Vec<String>>| {
        let mut items = items.unwrap_or_default();
        items.sort();
        items.join(",")
    };
    let mut networks: Vec<String> = inspect
        .network_settings
        .as_ref()
        .and_then(|n| n.networks.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|(name, endpoint)| {
            let ip = endpoint
                .ipam_config
                .and_then(|c| c.ipv4_address)
                .unwrap_or_default();
            format!("{name}={ip}")
        })
        .collect();
    networks.sort();
    let devices = host
        .devices
        .unwrap_or_default()
        .into_iter()
        .map(|d| {
            format!(
                "{}:{}:{}",
                d.path_on_host.unwrap_or_default(),
                d.path_in_container.unwrap_or_default(),
                d.cgroup_permissions.unwrap_or_default()
            )
        })
        .collect();
    BTreeMap::from([
        ("running".into(), flag(state.running)),
        (
            "status".into(),
            state.status.map(|s| s.to_string()).unwrap_or_default(),
        ),
        ("image".into(), inspect.image.clone().unwrap_or_default()),
        ("layer".into(), layer_fact(inspect)),
        ("networks".into(), networks.join(" ")),
        ("memory".into(), number(host.memory)),
        ("memory_swap".into(), number(host.memory_swap)),
        ("pids_limit".into(), number(host.pids_limit)),
        ("nano_cpus".into(), number(host.nano_cpus)),
        ("cap_drop".into(), list(host.cap_drop)),
        ("cap_add".into(), list(host.cap_add)),
        ("privileged".into(), flag(host.privileged)),
        ("readonly_rootfs".into(), flag(host.readonly_rootfs)),
        ("security_opt".into(), list(host.security_opt)),
        ("devices".into(), list(Some(devices))),
        ("binds".into(), list(host.binds)),
        ("network_mode".into(), host.network_mode.unwrap_or_default()),
        ("runtime".into(), host.runtime.unwrap_or_default()),
        ("ulimits".into(), {
            let mut ulimits: Vec<String> = host
                .ulimits
                .unwrap_or_default()
                .into_iter()
                .map(|u| {
                    format!(
                        "{}={}:{}",
                        u.name.unwrap_or_default(),
                        number(u.soft),
                        number(u.hard)
                    )
                })
                .collect();
            ulimits.sort();
            ulimits.join(",")
        }),
        (
            "user".into(),
            inspect
                .config
                .as_ref()
                .and_then(|c| c.user.clone())
                .unwrap_or_default(),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/motd"), "hello").unwrap();
        std::os::unix::fs::symlink("motd", dir.path().join("etc/link")).unwrap();
        dir
    }

    #[test]
    fn the_tree_hash_sees_content_names_modes_and_targets_but_not_times() {
        let dir = tree();
        let root = dir.path();
        let golden = tree_hash(root).unwrap();
        assert!(golden.starts_with("sha256:"));

        let touched = std::fs::File::options()
            .write(true)
            .open(root.join("etc/motd"))
            .unwrap();
        touched
            .set_modified(std::time::SystemTime::UNIX_EPOCH)
            .unwrap();
        assert_eq!(tree_hash(root).unwrap(), golden, "a timestamp is not state");

        std::fs::write(root.join("etc/motd"), "hellO").unwrap();
        assert_ne!(tree_hash(root).unwrap(), golden, "content");
        std::fs::write(root.join("etc/motd"), "hello").unwrap();
        assert_eq!(tree_hash(root).unwrap(), golden);

        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            root.join("etc/motd"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        assert_ne!(tree_hash(root).unwrap(), golden, "mode");
        std::fs::set_permissions(
            root.join("etc/motd"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();

        std::fs::remove_file(root.join("etc/link")).unwrap();
        std::os::unix::fs::symlink("passwd", root.join("etc/link")).unwrap();
        assert_ne!(tree_hash(root).unwrap(), golden, "symlink target");
        std::fs::remove_file(root.join("etc/link")).unwrap();
        std::os::unix::fs::symlink("motd", root.join("etc/link")).unwrap();

        std::fs::write(root.join("etc/.hidden"), "").unwrap();
        assert_ne!(tree_hash(root).unwrap(), golden, "a new empty file");
    }

    #[test]
    fn the_tree_hash_sees_xattrs_but_not_the_overlay_uuid() {
        let dir = tree();
        let root = dir.path();
        let motd = root.join("etc/motd");
        let golden = tree_hash(root).unwrap();
        let set =
            |name: &str| rustix::fs::lsetxattr(&motd, name, b"1", rustix::fs::XattrFlags::empty());
        // Only root may set trusted.* (the tests of the docker backend run
        // as root, like reset itself); user.* any owner may set on ext4.
        if nix::unistd::geteuid().is_root() {
            set("trusted.overlay.uuid").unwrap();
            assert_eq!(tree_hash(root).unwrap(), golden);
            set("trusted.overlay.opaque").unwrap();
            assert_ne!(tree_hash(root).unwrap(), golden);
            rustix::fs::lremovexattr(&motd, "trusted.overlay.opaque").unwrap();
        }
        set("user.planted").unwrap();
        assert_ne!(tree_hash(root).unwrap(), golden);
    }

    #[test]
    fn a_sibling_keeps_the_directory() {
        assert_eq!(
            sibling(Path::new("/var/lib/docker/overlay2/abc/diff"), ".next"),
            Path::new("/var/lib/docker/overlay2/abc/diff.next")
        );
    }

    #[test]
    fn the_engine_facts_name_every_network_with_its_configured_address() {
        let inspect: ContainerInspectResponse = serde_json::from_value(serde_json::json!({
            "Image": "sha256:abc",
            "State": {"Running": true, "Status": "running"},
            "HostConfig": {"Memory": 0, "CapDrop": ["ALL"], "NetworkMode": "bot-bottle-x"},
            "NetworkSettings": {"Networks": {
                "bot-bottle-x": {"IPAMConfig": {"IPv4Address": "192.168.7.3"}},
                "bridge": {}
            }}
        }))
        .unwrap();
        let facts = engine_facts(&inspect);
        assert_eq!(facts["networks"], "bot-bottle-x=192.168.7.3 bridge=");
        assert_eq!(facts["running"], "true");
        assert_eq!(facts["cap_drop"], "ALL");
        assert_eq!(facts["memory"], "0");
        assert_eq!(facts["pids_limit"], "none");
    }
}
