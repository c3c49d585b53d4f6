//! The smolvm versions bottle requires, each bound defined once with the
//! reason it is where it is: bottle-preflight reports against them
//! (`bottle doctor`) and the smolmachines backend refuses what falls below
//! them. bottle-core runs no smolvm; it only names the versions. (The
//! Docker Engine API the docker backend needs is its own to name.)

use std::fmt;

use serde::Serialize;

/// The first smolvm whose egress allowlist is enforced: from 1.1.3 any
/// policy is routed to the virtio-net gateway (smolvm PR #427;
/// `src/network/launch.rs` `plan_launch_network`), whose
/// `smolvm-network/src/egress.rs` checks every guest flow. Before it, TSI
/// "does not actually enforce" the list, so a bottle would have no network
/// boundary: older versions are refused, with no override.
pub const SMOLVM_MIN_SUPPORTED: SmolvmVersion = SmolvmVersion::new(1, 1, 3);

/// The first smolvm that keeps `--allow-cidr` when combined with
/// `machine create --from`: `run_from_smolmachine` set `allowed_cidrs: None`
/// from 0.8.0 until f8a6fa62 (PR #892, released in 1.8.0). Older versions
/// are supported because the backend writes the allowlist into smolvm's
/// state DB and reads it back before every start (on every version).
pub const SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM: SmolvmVersion = SmolvmVersion::new(1, 8, 0);

/// The first smolvm bottle has not been tested with: a new major release
/// may change the CLI or the state DB the backend relies on, so preflight
/// warns (it does not refuse).
pub const SMOLVM_FIRST_UNTESTED: SmolvmVersion = SmolvmVersion::new(2, 0, 0);

/// A `smolvm X.Y.Z` release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct SmolvmVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

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
    /// build suffix (`1.10.0-rc.1`, `1.9.3+abc`), words after it and
    /// trailing lines. Anything but three numbers is no version: smolvm
    /// always prints three, and the backend refuses what it cannot read.
    pub fn parse(output: &str) -> Option<SmolvmVersion> {
        let line = output.lines().next()?;
        let word = line.split_whitespace().find(|w| {
            w.trim_start_matches('v')
                .starts_with(|c: char| c.is_ascii_digit())
        })?;
        let core = word.trim_start_matches('v').split(['-', '+']).next()?;
        let mut parts = core.split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(SmolvmVersion::new(major, minor, patch))
    }

    /// Whether this release enforces an egress allowlist at all
    /// ([`SMOLVM_MIN_SUPPORTED`]).
    pub fn allowlist_enforced(self) -> bool {
        self >= SMOLVM_MIN_SUPPORTED
    }

    /// Whether `machine create --from` silently drops `--allow-cidr`
    /// ([`SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM`]).
    pub fn from_drops_allow_cidr(self) -> bool {
        self < SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM
    }
}

impl fmt::Display for SmolvmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
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
            ("smolvm v1.10.2-rc1", (1, 10, 2)),
            ("smolvm 1.9.3+abc", (1, 9, 3)),
            ("smolvm 1.8.0+abc (built 2025)", (1, 8, 0)),
        ];
        for (text, (a, b, c)) in cases {
            assert_eq!(
                SmolvmVersion::parse(text),
                Some(SmolvmVersion::new(a, b, c)),
                "{text:?}"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_a_version() {
        for text in [
            "",
            "smolvm",
            "smolvm version unknown",
            "smolvm 1.9",
            "smolvm 1.9.x",
            "smolvm 1.2.3.4",
            "1.2.3.4",
        ] {
            assert_eq!(SmolvmVersion::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn versions_order_numerically() {
        assert!(SmolvmVersion::new(1, 10, 0) > SmolvmVersion::new(1, 9, 9));
    }

    #[test]
    fn smolvm_boundaries() {
        let v = SmolvmVersion::new;
        assert!(!v(1, 1, 2).allowlist_enforced());
        assert!(v(1, 1, 3).allowlist_enforced());
        assert!(v(1, 7, 9).from_drops_allow_cidr());
        assert!(!v(1, 8, 0).from_drops_allow_cidr());
    }
}
