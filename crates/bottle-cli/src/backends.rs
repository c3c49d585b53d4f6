//! Choosing and constructing a backend.
//!
//! The smolmachines backend runs `smolvm` from `PATH`, or the program
//! [`SMOLVM_ENV`] names; its bundle runs on the Docker Engine
//! (`bottle_docker::DockerBundleHost`), its agent images come from there
//! too (`bottle_docker::EngineImages`), and its host check is
//! bottle-preflight's platform and KVM checks. [`FAKE_NO_KVM_ENV`] is the
//! one, test-only, way to run without KVM: see [`vm_host_check`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bottle_core::backend::{BackendError, BackendErrorKind};
use bottle_core::{BackendKind, BottleBackend};

use crate::args::Global;
use crate::failure::{EXIT_USAGE, Failure};

/// The backend named by `--backend` / `BOT_BOTTLE_BACKEND`, default docker.
pub(crate) fn selected(global: &Global) -> Result<BackendKind, Failure> {
    match global.backend.as_deref() {
        None | Some("") => Ok(BackendKind::Docker),
        Some(name) => BackendKind::parse(name).ok_or_else(|| {
            Failure::new(
                "BOT-C001",
                EXIT_USAGE,
                format!("unknown backend {name:?} (from --backend or BOT_BOTTLE_BACKEND)"),
            )
            .with_fix(format!(
                "use one of: {}",
                BackendKind::ALL.map(BackendKind::as_str).join(", ")
            ))
        }),
    }
}

/// Whether the operator chose a backend explicitly.
pub(crate) fn explicit(global: &Global) -> bool {
    global.backend.as_deref().is_some_and(|b| !b.is_empty())
}

/// How a command wants its backend set up.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mode {
    /// `bottle start --detach`: the bottle outlives this process.
    pub detach: bool,
    /// `bottle start --timings`: where the launch records its steps.
    pub timeline: Option<bottle_core::timeline::Timeline>,
}

/// The smolmachines backend as the CLI composes it: bundles and agent
/// images from the Docker Engine.
pub(crate) type Smolmachines = bottle_smolvm::SmolvmBackend<bottle_docker::DockerBundleHost>;

/// One of the backends, each with its own typed plans (youki's
/// `AnyCgroupManager` pattern): `start` dispatches on it, every other
/// command sees a `dyn BottleBackend` through `Deref`.
pub(crate) enum AnyBackend {
    /// `--backend docker`.
    Docker(bottle_docker::DockerBackend),
    /// `--backend smolmachines`.
    Smolmachines(Smolmachines),
}

impl std::ops::Deref for AnyBackend {
    type Target = dyn BottleBackend;

    fn deref(&self) -> &Self::Target {
        match self {
            AnyBackend::Docker(backend) => backend,
            AnyBackend::Smolmachines(backend) => backend,
        }
    }
}

/// Constructs a backend.
pub(crate) fn open(
    kind: BackendKind,
    global: &Global,
    mode: Mode,
) -> Result<AnyBackend, BackendError> {
    let state_root = bottle_core::state::state_root(|key| std::env::var(key).ok())
        .map_err(|err| BackendError::from_coded(BackendErrorKind::Preflight, err))?;
    match kind {
        BackendKind::Docker => {
            let mut options = bottle_docker::DockerOptions::new(state_root);
            options.detach = mode.detach;
            options.timeline = mode.timeline;
            options.progress = progress(global);
            options.interrupt = crate::interrupt::launch();
            Ok(AnyBackend::Docker(bottle_docker::DockerBackend::new(
                options,
            )?))
        }
        BackendKind::Smolmachines => Ok(AnyBackend::Smolmachines(smolmachines(
            state_root, global, mode,
        )?)),
    }
}

/// Names the `smolvm` program to run (default: `smolvm` on `PATH`).
pub(crate) const SMOLVM_ENV: &str = "BOTTLE_SMOLVM";

/// Test-only: `1` skips the KVM check, but only while [`SMOLVM_ENV`] names
/// the `fake-smolvm` test double (which boots nothing); it is ignored, with
/// a warning, for any other program, and announced on stderr every time.
pub(crate) const FAKE_NO_KVM_ENV: &str = "BOTTLE_TEST_FAKE_SMOLVM_NO_KVM";

/// The file name of the test double (`crates/fake-smolvm`).
const FAKE_SMOLVM: &str = "fake-smolvm";

fn smolmachines(
    state_root: PathBuf,
    global: &Global,
    mode: Mode,
) -> Result<Smolmachines, BackendError> {
    let program = std::env::var_os(SMOLVM_ENV)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| bottle_preflight::smolvm::PROGRAM.into());
    let smolvm = bottle_smolvm::Smolvm::with_program(
        program.clone(),
        Arc::new(bottle_core::exec::SystemRunner),
    );
    let mut options = bottle_docker::DockerOptions::new(&state_root);
    options.detach = mode.detach;
    options.timeline = mode.timeline.clone();
    options.progress = progress(global);
    // The VM's bundle launch stops on the same ^C as the VM's.
    options.interrupt = crate::interrupt::launch();
    // Without HOME or XDG_CACHE_HOME the packed images stay beside the
    // bottles' state rather than nowhere.
    let cache = bottle_smolvm::pack::default_cache_dir(|key| std::env::var(key).ok())
        .unwrap_or_else(|| state_root.join(".smolmachines-cache"));
    let images = bottle_docker::EngineImages::new(options.clone())?;
    let bundles = bottle_docker::DockerBundleHost::new(options)?;
    let fake_without_kvm = std::env::var(FAKE_NO_KVM_ENV).is_ok_and(|v| v == "1");
    let host_check = vm_host_check(Path::new(&program), fake_without_kvm, global.quiet);
    Ok(bottle_smolvm::SmolvmBackend::new(
        smolvm,
        Arc::new(images),
        bottle_smolvm::pack::SmolmachineCache::new(cache),
        Arc::new(bundles),
        state_root,
    )
    .with_host_check(host_check)
    .with_interrupt(crate::interrupt::launch())
    .with_timeline(mode.timeline))
}

/// The host check run before anything else:
/// [`bottle_preflight::require_microvm_host`], failing with the
/// remediation. Skipped only when the test switch is on *and* `program` is
/// the test double; never silently.
fn vm_host_check(
    program: &Path,
    fake_without_kvm: bool,
    quiet: bool,
) -> Arc<bottle_smolvm::backend::HostCheck> {
    let is_fake = program.file_name().is_some_and(|n| n == FAKE_SMOLVM);
    if fake_without_kvm && is_fake {
        // Announced even with --quiet: nothing here is isolated.
        crate::output::note(
            false,
            &format!(
                "warning: {FAKE_NO_KVM_ENV}=1 and {SMOLVM_ENV} is the test double {}: the KVM check is skipped (nothing here is isolated)",
                program.display()
            ),
        );
        return Arc::new(|| Ok(()));
    }
    if fake_without_kvm {
        crate::output::note(
            quiet,
            &format!(
                "warning: {FAKE_NO_KVM_ENV} is ignored: {SMOLVM_ENV} does not name the {FAKE_SMOLVM} test double, so KVM is checked"
            ),
        );
    }
    Arc::new(|| {
        let runner = bottle_core::exec::SystemRunner;
        let ctx = bottle_preflight::Context::from_host(&runner, BackendKind::Smolmachines);
        Ok(bottle_preflight::require_microvm_host(&ctx)?)
    })
}

/// Build output and provisioning notes go to stderr when it is a terminal
/// and the operator did not ask for quiet.
fn progress(global: &Global) -> Option<bottle_docker::Progress> {
    use std::io::IsTerminal as _;
    if global.quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    Some(std::sync::Arc::new(|line: &str| {
        crate::output::err_bytes(format!("{line}\n").as_bytes());
    }))
}
