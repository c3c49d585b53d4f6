//! Shared fixtures: a fake host root. The recording command runner is
//! bottle-test-support's.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use bottle_core::BackendKind;
use bottle_core::exec::CommandRunner;
use bottle_preflight::{Check, Context, HostRoot};

/// A temp dir standing in for `/`.
pub(crate) struct FakeHost {
    pub dir: tempfile::TempDir,
}

impl FakeHost {
    pub(crate) fn new() -> Self {
        FakeHost {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn root(&self) -> HostRoot {
        HostRoot::new(self.dir.path())
    }

    /// The real path of a host path under this root.
    pub(crate) fn path(&self, host_path: &str) -> PathBuf {
        self.root().join(host_path)
    }

    /// Writes a file (creating parents) and returns its real path.
    pub(crate) fn write(&self, host_path: &str, contents: &str) -> PathBuf {
        let path = self.path(host_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
        path
    }

    pub(crate) fn mkdir(&self, host_path: &str) -> PathBuf {
        let path = self.path(host_path);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    pub(crate) fn chmod(&self, host_path: &str, mode: u32) {
        std::fs::set_permissions(self.path(host_path), std::fs::Permissions::from_mode(mode))
            .unwrap();
    }

    /// A context for a Linux x86_64 host under this root, with no `PATH` and
    /// the default Docker socket.
    pub(crate) fn ctx<'a>(
        &self,
        runner: &'a dyn CommandRunner,
        backend: BackendKind,
    ) -> Context<'a> {
        Context::fixed(self.root(), runner, backend)
    }
}

/// The check with `id`.
pub(crate) fn find<'a>(checks: &'a [Check], id: &str) -> &'a Check {
    checks
        .iter()
        .find(|check| check.id == id)
        .unwrap_or_else(|| panic!("no check {id} in {checks:#?}"))
}

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
