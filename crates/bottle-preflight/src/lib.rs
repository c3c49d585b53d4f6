//! `bottle-preflight` owns host checks (platform, KVM, smolvm, Docker,
//! the daemon's gVisor runtime, kernel, the bundle binary, the in-box agent
//! binary) for `bottle doctor` and for each backend's `preflight()`. It only
//! observes; it never changes the host.
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
pub mod docker;
pub mod error;
pub mod gvisor;
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

/// Every check id, in the order [`run_all`] reports them.
pub const ALL_IDS: [&str; 14] = [
    platform::ID,
    kernel::ID,
    kvm::DEVICE_ID,
    kvm::ACCESS_ID,
    kvm::MODULE_ID,
    kvm::CPU_ID,
    kvm::GROUP_ID,
    kvm_guest::ID,
    smolvm::ID,
    docker::ID,
    docker::DISK_QUOTA_ID,
    gvisor::ID,
    bundle::ID,
    toolbox::ID,
];

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

/// Runs every check, in [`ALL_IDS`] order.
///
/// A check that hit unexpected I/O is reported as failed (or as a warning
/// when only the other backend needs it) with the error's code and fix in
/// its message.
pub fn run_all(ctx: &Context<'_>) -> Vec<Check> {
    let smolvm = ctx.backend == BackendKind::Smolmachines;
    let docker = ctx.backend == BackendKind::Docker;
    let daemon = settle(docker::ID, docker::TITLE, docker, docker::check_docker(ctx));
    // The storage is asked only of a daemon that answered: otherwise the
    // daemon check has already said why, and a second wait adds nothing.
    let disk_quota = if daemon.status == Status::Fail {
        Check::new(
            docker::DISK_QUOTA_ID,
            docker::DISK_QUOTA_TITLE,
            Status::Skip,
            "not checked: the docker daemon is not reachable".to_owned(),
        )
    } else {
        docker::check_disk_quota(ctx)
    };
    let gvisor = if daemon.status == Status::Fail {
        Check::new(
            gvisor::ID,
            gvisor::TITLE,
            Status::Skip,
            "not checked: the docker daemon is not reachable".to_owned(),
        )
    } else {
        gvisor::check_gvisor(ctx)
    };
    vec![
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
        daemon,
        disk_quota,
        gvisor,
        settle(bundle::ID, bundle::TITLE, true, bundle::check_bundle(ctx)),
        settle(
            toolbox::ID,
            toolbox::TITLE,
            false,
            toolbox::check_toolbox(ctx),
        ),
    ]
}

/// Turns a check that could not run into a result the report can show.
fn settle(
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
        let mut ids = ALL_IDS.to_vec();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), ALL_IDS.len());
    }
}
