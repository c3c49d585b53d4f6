//! smolvm versions and what each one can do.
//!
//! The version type, its parser and the bounds bottle requires are
//! bottle-core's ([`bottle_core::requirements`]), shared with preflight.
//! The argv shapes and paths that changed between releases are
//! [`Capabilities`] here, with the release that changed them, so the
//! wrapper never compares version numbers itself.

pub use bottle_core::requirements::SmolvmVersion;

use crate::error::SmolvmError;

/// What a smolvm release's CLI looks like, where it changed.
pub trait Capabilities {
    /// Whether `machine create` / `machine delete` take the name as
    /// `--name NAME` (1.1.0 on, smolvm issue #370 "machine names are flags
    /// everywhere"; `src/cli/machine.rs` test `create_rejects_bare_positional_name`)
    /// rather than positionally (0.8.0 to 1.0.x: `machine create NAME`,
    /// `machine delete NAME`).
    fn name_is_a_flag(self) -> bool;

    /// Whether `SMOLVM_DATA_DIR` relocates smolvm's state (Linux only: it
    /// becomes smolvm's `HOME`, `apply_system_data_root`).
    fn honours_data_dir(self) -> bool;
}

impl Capabilities for SmolvmVersion {
    fn name_is_a_flag(self) -> bool {
        self >= SmolvmVersion::new(1, 1, 0)
    }

    fn honours_data_dir(self) -> bool {
        self >= SmolvmVersion::new(1, 2, 5)
    }
}

/// Refuses versions whose allowlist is not enforced. There is deliberately
/// no override: an unenforced allowlist is no sandbox.
pub fn require_enforced(version: SmolvmVersion) -> Result<(), SmolvmError> {
    if version.allowlist_enforced() {
        Ok(())
    } else {
        Err(SmolvmError::VersionUnenforced { version })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_boundaries() {
        let v = SmolvmVersion::new;
        assert!(!v(1, 0, 9).name_is_a_flag());
        assert!(v(1, 1, 0).name_is_a_flag());
        assert!(!v(1, 2, 4).honours_data_dir());
        assert!(v(1, 2, 5).honours_data_dir());
        assert!(require_enforced(v(0, 8, 0)).is_err());
        assert!(require_enforced(v(1, 1, 2)).is_err());
        assert!(require_enforced(v(1, 1, 3)).is_ok());
        assert!(require_enforced(v(1, 9, 3)).is_ok());
    }
}
