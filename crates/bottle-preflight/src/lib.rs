//! `bottle-preflight` owns the host checks' shape ([`Check`], [`Context`],
//! [`Report`]) and the checks no backend crate owns (platform, KVM,
//! smolvm, kernel, the bundle binary, the in-box agent binary) for
//! `bottle doctor` and the smolmachines backend's host requirement. A
//! backend crate brings its own checks as [`HostChecks`] (the docker
//! backend: the daemon, its storage, its gVisor runtime), and
//! [`run_all`] places them among these. It only observes; it never
//! changes the host.
//!
//! Every check returns a [`Check`] (stable id, status, message, remediation).
//! A missing `/dev/kvm` or an unreachable daemon is a failed check, not an
//! error: availability is the answer the check exists to give. Only I/O
//! nobody expected becomes a [`PreflightError`], and [`run_all`] folds even
//! those into the report so `bottle doctor` always shows every check.
//!
//! Checks read the host through a [`Context`]: a [`HostRoot`] that host paths
//! are resolved under (`/`, or a temp dir in tests), a
//! [`CommandRunner`](bottle_core::exec::CommandRunner) for `smolvm --version`,
//! and the environment values (`PATH`, `DOCKER_HOST`, identity) that matter.
//! Requirements of the backend that is not selected never fail: they warn or
//! skip.

pub mod bundle;
pub mod check;
pub mod error;
pub mod host;
pub mod kernel;
pub mod kvm;
pub mod kvm_guest;
pub mod platform;
pub mod report;
pub mod smolvm;
pub mod toolbox;

use bottle_core::{BackendKind, Coded as _};

pub use check::{Check, Status, Summary, is_fatal};
pub use error::{PreflightError, require};
pub use host::{Context, HostRoot, Identity, Platform};
pub use kernel::kernel_version;
pub use report::Report;

/// The ids of this crate's checks [`run_all`] reports before the
/// backends' [`HostChecks`], in order.
const LEADING_IDS: [&str; 9] = [
    platform::ID,
    kernel::ID,
    kvm::DEVICE_ID,
    kvm::ACCESS_ID,
    kvm::MODULE_ID,
    kvm::CPU_ID,
    kvm::GROUP_ID,
    kvm_guest::ID,
    smolvm::ID,
];

/// The ids of this crate's checks [`run_all`] reports after the
/// backends', in order.
const TRAILING_IDS: [&str; 2] = [bundle::ID, toolbox::ID];

/// What a microVM bottle needs of this host, checked before anything is
/// created: the platform, and KVM that can run a guest (the device, this
/// user's access, the module, a CPU with hardware virtualisation, a device
/// the `kvm` group may open, a test guest that runs). Fails with every
/// failed check and its remediation.
pub fn require_microvm_host(ctx: &Context<'_>) -> Result<(), PreflightError> {
    let checks = [
        platform::check_platform(ctx),
        kvm::check_device(ctx)?,
        kvm::check_access(ctx)?,
        kvm::check_module(ctx)?,
        kvm::check_cpu(ctx)?,
        kvm::check_group(ctx)?,
        kvm_guest::check_guest(ctx),
    ];
    require(&checks)
}

/// Checks a backend crate owns and runs itself (the docker backend's
/// daemon, storage and gVisor runtime), placed by [`run_all`].
pub trait HostChecks {
    /// Their ids, in the order [`HostChecks::run`] returns them.
    fn ids(&self) -> &'static [&'static str];
    /// Runs them against `ctx`; a check that could not run is a result
    /// too ([`settle`]).
    fn run(&self, ctx: &Context<'_>) -> Vec<Check>;
}

/// Every id [`run_all`] reports with `backends`, in its order.
pub fn all_ids(backends: &[&dyn HostChecks]) -> Vec<&'static str> {
    let mut ids = LEADING_IDS.to_vec();
    for backend in backends {
        ids.extend_from_slice(backend.ids());
    }
    ids.extend_from_slice(&TRAILING_IDS);
    ids
}

/// Runs every check: this crate's, with each of `backends`' after the
/// smolvm check, in [`all_ids`] order.
///
/// A check that hit unexpected I/O is reported as failed (or as a warning
/// when only the other backend needs it) with the error's code and fix in
/// its message.
pub fn run_all(ctx: &Context<'_>, backends: &[&dyn HostChecks]) -> Vec<Check> {
    let smolvm = ctx.backend == BackendKind::Smolmachines;
    let mut checks = vec![
        platform::check_platform(ctx),
        settle(kernel::ID, kernel::TITLE, false, kernel::check_kernel(ctx)),
        settle(
            kvm::DEVICE_ID,
            kvm::DEVICE_TITLE,
            smolvm,
            kvm::check_device(ctx),
        ),
        settle(
            kvm::ACCESS_ID,
            kvm::ACCESS_TITLE,
            smolvm,
            kvm::check_access(ctx),
        ),
        settle(
            kvm::MODULE_ID,
            kvm::MODULE_TITLE,
            smolvm,
            kvm::check_module(ctx),
        ),
        settle(kvm::CPU_ID, kvm::CPU_TITLE, smolvm, kvm::check_cpu(ctx)),
        settle(
            kvm::GROUP_ID,
            kvm::GROUP_TITLE,
            smolvm,
            kvm::check_group(ctx),
        ),
        kvm_guest::check_guest(ctx),
        smolvm::check_smolvm(ctx),
    ];
    for backend in backends {
        checks.extend(backend.run(ctx));
    }
    checks.push(settle(
        bundle::ID,
        bundle::TITLE,
        true,
        bundle::check_bundle(ctx),
    ));
    checks.push(settle(
        toolbox::ID,
        toolbox::TITLE,
        false,
        toolbox::check_toolbox(ctx),
    ));
    checks
}

/// Turns a check that could not run into a result the report can show:
/// failed when `needed` (the selected backend needs it), else a warning.
pub fn settle(
    id: &'static str,
    title: &'static str,
    needed: bool,
    result: Result<Check, PreflightError>,
) -> Check {
    result.unwrap_or_else(|err| {
        let status = if needed { Status::Fail } else { Status::Warn };
        let check = Check::new(
            id,
            title,
            status,
            format!("check could not run: error[{}]: {err}", err.code()),
        );
        match err.fix() {
            Some(fix) => check.with_remediation(fix),
            None => check,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_keeps_code_and_relevance() {
        let err = || PreflightError::Read {
            path: "/proc/modules".into(),
            source: std::io::Error::other("boom"),
        };
        let check = settle("kvm.module", "kvm module", true, Err(err()));
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            check.message,
            "check could not run: error[BOT-P001]: could not read /proc/modules: boom"
        );
        assert_eq!(
            check.remediation.as_deref(),
            Some("check that this user can read it")
        );
        assert_eq!(settle("x", "x", false, Err(err())).status, Status::Warn);
    }

    #[test]
    fn ids_are_unique() {
        let mut ids = all_ids(&[]);
        let count = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), count);
    }
}
