//! Can this host run real microVMs? The minimal checks the backend and the
//! escape gate need; `bottle-preflight` owns the full report with
//! remediation and is what the CLI wires in through
//! [`crate::backend::SmolvmBackend::with_host_check`].

use std::path::Path;
use std::sync::Arc;

use bottle_core::exec::CommandRunner;

use crate::cli::Smolvm;
use bottle_core::requirements::SMOLVM_MIN_SUPPORTED;

use crate::version::SmolvmVersion;

/// The KVM device.
pub const KVM: &str = "/dev/kvm";

/// `Ok` when `/dev/kvm` exists and this user can read and write it (Linux);
/// macOS needs no device. The error is the precise reason.
pub fn kvm_usable() -> Result<(), String> {
    if cfg!(target_os = "macos") {
        return Ok(());
    }
    kvm_usable_at(Path::new(KVM))
}

/// [`kvm_usable`] for a given device path.
pub fn kvm_usable_at(device: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt as _;
    let meta = match std::fs::metadata(device) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} does not exist: KVM is not available (load kvm_intel or kvm_amd, or enable nested virtualisation)",
                device.display()
            ));
        }
        Err(err) => return Err(format!("cannot inspect {}: {err}", device.display())),
    };
    if !meta.file_type().is_char_device() {
        return Err(format!("{} is not a character device", device.display()));
    }
    nix::unistd::access(
        device,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    )
    .map_err(|errno| {
        format!(
            "{} is not readable and writable by this user ({errno}): add the user to the kvm group and log in again",
            device.display()
        )
    })
}

/// `Ok(version)` when a real `smolvm` that enforces allowlists and a usable
/// KVM are present, so `cargo xtask sandbox-escape --backend smolmachines`
/// can run the real thing; otherwise the exact reason it cannot.
pub fn real_smolvm_available(runner: Arc<dyn CommandRunner>) -> Result<SmolvmVersion, String> {
    kvm_usable()?;
    let smolvm = Smolvm::new(runner);
    let version = smolvm
        .version()
        .map_err(|err| format!("smolvm is not usable: {}", err))?;
    if !version.allowlist_enforced() {
        return Err(format!(
            "smolvm {version} is installed, but only {SMOLVM_MIN_SUPPORTED} and later enforce the egress allowlist"
        ));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bottle_test_support::RecordingRunner;

    #[test]
    fn a_missing_device_says_so() {
        let err = kvm_usable_at(Path::new("/nonexistent/kvm")).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn a_regular_file_is_not_kvm() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kvm");
        std::fs::write(&file, b"").unwrap();
        let err = kvm_usable_at(&file).unwrap_err();
        assert!(err.contains("not a character device"), "{err}");
    }

    #[test]
    fn smolvm_missing_is_a_reason_not_a_panic() {
        // KVM may or may not exist here; either way the answer is a reason.
        let err = real_smolvm_available(Arc::new(RecordingRunner::failing_to_start(
            std::io::ErrorKind::NotFound,
        )))
        .unwrap_err();
        assert!(err.contains("kvm") || err.contains("smolvm"), "{err}");
    }
}
