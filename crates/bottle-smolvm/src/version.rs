//! smolvm versions and what each one can do.
//!
//! Every version-dependent argv shape or behaviour is a method here, with the
//! release that changed it, so the wrapper never compares version numbers
//! itself.

use std::fmt;

use crate::error::SmolvmError;

/// A `smolvm X.Y.Z` release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SmolvmVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

/// The first release whose egress allowlist is enforced: from 1.1.3 any
/// policy is routed to the virtio-net gateway (smolvm PR #427;
/// `src/network/launch.rs` `plan_launch_network`), whose
/// `smolvm-network/src/egress.rs` checks every guest flow. Before it, TSI
/// "does not actually enforce" the list.
pub const MIN_ENFORCED: SmolvmVersion = SmolvmVersion::new(1, 1, 3);

impl SmolvmVersion {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        SmolvmVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parses what `smolvm --version` prints: `smolvm 1.9.3` (clap's
    /// `#[command(version)]`), tolerating a `v` prefix, a pre-release or
    /// build suffix (`1.10.0-rc.1`, `1.9.3+abc`) and trailing lines.
    pub fn parse(output: &str) -> Result<SmolvmVersion, SmolvmError> {
        let bad = || SmolvmError::BadVersion {
            output: output.to_string(),
        };
        let line = output.lines().next().ok_or_else(bad)?;
        let word = line
            .split_whitespace()
            .find(|w| {
                w.trim_start_matches('v')
                    .starts_with(|c: char| c.is_ascii_digit())
            })
            .ok_or_else(bad)?;
        let core = word
            .trim_start_matches('v')
            .split(['-', '+'])
            .next()
            .ok_or_else(bad)?;
        let mut parts = core.split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(SmolvmVersion::new(major, minor, patch))
    }

    /// Whether `machine create` / `machine delete` take the name as
    /// `--name NAME` (1.1.0 on, smolvm issue #370 "machine names are flags
    /// everywhere"; `src/cli/machine.rs` test `create_rejects_bare_positional_name`)
    /// rather than positionally (0.8.0 to 1.0.x: `machine create NAME`,
    /// `machine delete NAME`).
    pub fn name_is_a_flag(self) -> bool {
        self >= SmolvmVersion::new(1, 1, 0)
    }

    /// Whether this release enforces an egress allowlist at all.
    pub fn allowlist_enforced(self) -> bool {
        self >= MIN_ENFORCED
    }

    /// Whether `machine create --from` silently drops `--allow-cidr`
    /// (`run_from_smolmachine` set `allowed_cidrs: None` from 0.8.0; fixed by
    /// f8a6fa62, PR #892, released in 1.8.0). The state-DB patch covers it;
    /// the read-back check runs on every version regardless.
    pub fn from_drops_allow_cidr(self) -> bool {
        self < SmolvmVersion::new(1, 8, 0)
    }

    /// Whether `SMOLVM_DATA_DIR` relocates smolvm's state (Linux only: it
    /// becomes smolvm's `HOME`, `apply_system_data_root`).
    pub fn honours_data_dir(self) -> bool {
        self >= SmolvmVersion::new(1, 2, 5)
    }
}

impl fmt::Display for SmolvmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
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
    fn parses_what_clap_prints_and_tolerates_decoration() {
        let cases = [
            ("smolvm 1.9.3\n", (1, 9, 3)),
            ("smolvm 0.8.0", (0, 8, 0)),
            ("smolvm v1.10.0-rc.1\nbuilt by ci\n", (1, 10, 0)),
            ("smolvm 1.9.3+abc", (1, 9, 3)),
        ];
        for (text, (a, b, c)) in cases {
            assert_eq!(
                SmolvmVersion::parse(text).unwrap(),
                SmolvmVersion::new(a, b, c),
                "{text:?}"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_a_version() {
        for text in ["", "smolvm", "smolvm 1.9", "smolvm 1.9.x", "smolvm 1.2.3.4"] {
            assert!(SmolvmVersion::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn capability_boundaries() {
        let v = SmolvmVersion::new;
        assert!(!v(1, 0, 9).name_is_a_flag());
        assert!(v(1, 1, 0).name_is_a_flag());
        assert!(!v(1, 1, 2).allowlist_enforced());
        assert!(v(1, 1, 3).allowlist_enforced());
        assert!(v(1, 7, 7).from_drops_allow_cidr());
        assert!(!v(1, 8, 0).from_drops_allow_cidr());
        assert!(require_enforced(v(0, 8, 0)).is_err());
        assert!(require_enforced(v(1, 9, 3)).is_ok());
    }
}
