//! What the checks read the host through: a filesystem root, the process
//! identity, environment values and a command runner, all injectable so each
//! branch can be tested against a temp dir and a fake runner.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bottle_core::BackendKind;
use bottle_core::exec::CommandRunner;

/// The filesystem root host paths are resolved under: `/` on a real host, a
/// temp dir in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// A root at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        HostRoot(path.into())
    }

    /// The real host's root, `/`.
    pub fn host() -> Self {
        HostRoot(PathBuf::from("/"))
    }

    /// The root directory itself.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Resolves an absolute host path (`/dev/kvm`) under this root.
    pub fn join(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let host_path = host_path.as_ref();
        self.0
            .join(host_path.strip_prefix("/").unwrap_or(host_path))
    }
}

impl Default for HostRoot {
    fn default() -> Self {
        HostRoot::host()
    }
}

/// Who the checks are run for: the uid and groups used to explain a denied
/// `/dev/kvm` (the access test itself always uses the real process identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Real user id.
    pub uid: u32,
    /// Real primary group id.
    pub gid: u32,
    /// Supplementary groups this process holds, i.e. those granted at login.
    pub groups: Vec<u32>,
}

impl Identity {
    /// The identity of this process.
    pub fn current() -> Self {
        Identity {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            // Only used to word a hint; an unreadable group list just makes
            // the hint say "log in again" where it could have been sharper.
            groups: nix::unistd::getgroups()
                .map(|gids| gids.into_iter().map(|gid| gid.as_raw()).collect())
                .unwrap_or_default(),
        }
    }
}

/// The operating systems bottle knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Linux: KVM for smolvm, a local Docker daemon.
    Linux,
    /// macOS: Hypervisor.framework for smolvm, Docker Desktop.
    MacOs,
    /// Anything else: unsupported.
    Other,
}

impl Platform {
    /// Classifies a `std::env::consts::OS` value.
    pub fn from_os(os: &str) -> Self {
        match os {
            "linux" => Platform::Linux,
            "macos" => Platform::MacOs,
            _ => Platform::Other,
        }
    }
}

/// The default time the Docker probe waits for the daemon.
pub const DOCKER_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything a check may read. Build it with [`Context::from_host`] and
/// override fields in tests.
pub struct Context<'a> {
    /// Where host paths are resolved.
    pub root: HostRoot,
    /// Runs `smolvm --version`.
    pub runner: &'a dyn CommandRunner,
    /// The backend the operator selected; requirements of the other backend
    /// are reported as warnings or skipped, never as failures.
    pub backend: BackendKind,
    /// `std::env::consts::OS` (`linux`, `macos`, ...).
    pub os: String,
    /// `std::env::consts::ARCH` (`x86_64`, `aarch64`, ...).
    pub arch: String,
    /// The `PATH` that `smolvm` is looked up on.
    pub path: Option<OsString>,
    /// The `DOCKER_HOST` value, if set.
    pub docker_host: Option<String>,
    /// Whose group memberships explain a denied `/dev/kvm`.
    pub identity: Identity,
    /// How long the Docker probe waits for each read or write.
    pub docker_timeout: Duration,
    /// The `BOTTLE_BUNDLE_BIN` value, if set.
    pub bundle_bin: Option<OsString>,
    /// The `BOTTLE_TOOLBOX_BIN` value, if set.
    pub toolbox_bin: Option<OsString>,
    /// The running `bottle`, whose directory the bundle is looked up from.
    pub exe: Option<PathBuf>,
    /// The name the daemon's gVisor runtime is registered under
    /// (`BOTTLE_GVISOR_RUNTIME`; `None`: `runsc`).
    pub gvisor_runtime: Option<String>,
}

impl<'a> Context<'a> {
    /// A context for the real host: root `/`, this process's environment and
    /// identity.
    pub fn from_host(runner: &'a dyn CommandRunner, backend: BackendKind) -> Self {
        Context {
            root: HostRoot::host(),
            runner,
            backend,
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
            path: std::env::var_os("PATH"),
            docker_host: std::env::var("DOCKER_HOST").ok(),
            identity: Identity::current(),
            docker_timeout: DOCKER_TIMEOUT,
            bundle_bin: std::env::var_os(bottle_core::bundle_binary::BUNDLE_BIN_ENV),
            toolbox_bin: std::env::var_os(bottle_core::bundle_binary::TOOLBOX_BIN_ENV),
            exe: std::env::current_exe().ok(),
            gvisor_runtime: std::env::var(bottle_core::isolation::GVISOR_RUNTIME_ENV).ok(),
        }
    }

    /// A context that reads nothing of this process: a Linux x86_64 host
    /// under `root`, no `PATH`, no `DOCKER_HOST` (the default socket under
    /// `root`), a user 1000 in group 1000, and no binaries named. What a
    /// test of a check starts from, overriding the fields it is about.
    pub fn fixed(root: HostRoot, runner: &'a dyn CommandRunner, backend: BackendKind) -> Self {
        Context {
            root,
            runner,
            backend,
            os: "linux".into(),
            arch: "x86_64".into(),
            path: None,
            docker_host: None,
            identity: Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![1000],
            },
            docker_timeout: DOCKER_TIMEOUT,
            bundle_bin: None,
            toolbox_bin: None,
            exe: None,
            gvisor_runtime: None,
        }
    }

    /// The platform named by [`Context::os`].
    pub fn platform(&self) -> Platform {
        Platform::from_os(&self.os)
    }
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("root", &self.root)
            .field("backend", &self.backend)
            .field("os", &self.os)
            .field("arch", &self.arch)
            .field("path", &self.path)
            .field("docker_host", &self.docker_host)
            .field("identity", &self.identity)
            .field("docker_timeout", &self.docker_timeout)
            .field("bundle_bin", &self.bundle_bin)
            .field("toolbox_bin", &self.toolbox_bin)
            .field("exe", &self.exe)
            .field("gvisor_runtime", &self.gvisor_runtime)
            .finish_non_exhaustive()
    }
}

/// Reads a host file under `root`; `Ok(None)` when it does not exist.
pub(crate) fn read_optional(
    root: &HostRoot,
    host_path: &str,
) -> Result<Option<String>, crate::error::PreflightError> {
    let path = root.join(host_path);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(crate::error::PreflightError::Read { path, source }),
    }
}

/// Whether a host path exists under `root`.
pub fn exists(root: &HostRoot, host_path: &str) -> Result<bool, crate::error::PreflightError> {
    let path = root.join(host_path);
    path.try_exists()
        .map_err(|source| crate::error::PreflightError::Inspect { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_resolves_absolute_paths_under_the_root() {
        let root = HostRoot::new("/tmp/fake");
        assert_eq!(root.join("/dev/kvm"), PathBuf::from("/tmp/fake/dev/kvm"));
        assert_eq!(root.join("etc/group"), PathBuf::from("/tmp/fake/etc/group"));
        assert_eq!(HostRoot::host().join("/dev/kvm"), PathBuf::from("/dev/kvm"));
    }

    #[test]
    fn platforms() {
        assert_eq!(Platform::from_os("linux"), Platform::Linux);
        assert_eq!(Platform::from_os("macos"), Platform::MacOs);
        assert_eq!(Platform::from_os("freebsd"), Platform::Other);
    }
}
