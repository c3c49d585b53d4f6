//! The smolvm check: the binary is on `PATH` and its version is in the range
//! bottle supports.
//!
//! The range has a hard floor and two notes:
//! - below 1.1.3 smolvm did not actually enforce the TSI allowlist (smolvm
//!   PR #427), so a microVM's egress would not be confined: refused;
//! - below 1.8.0 `--allow-cidr` is dropped when combined with `--from`, so the
//!   smolmachines backend writes the allowlist into smolvm's state DB and
//!   verifies it before start: supported, with a note;
//! - 2.0.0 and later are untested: a warning.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

use bottle_core::BackendKind;
use bottle_core::exec::CommandSpec;
use serde::Serialize;

use crate::check::{Check, Status};
use crate::host::Context;

/// Stable id of the smolvm check.
pub const ID: &str = "smolvm.version";
pub(crate) const TITLE: &str = "smolvm";

/// The program name looked up on `PATH`.
pub const PROGRAM: &str = "smolvm";

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Version {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The oldest smolvm that enforces the TSI allowlist (smolvm PR #427).
pub const MIN_SUPPORTED: Version = Version::new(1, 1, 3);
/// The first smolvm that keeps `--allow-cidr` when combined with `--from`;
/// older ones need the state-DB patch.
pub const ALLOW_CIDR_WITH_FROM: Version = Version::new(1, 8, 0);
/// The first smolvm bottle has not been tested with.
pub const FIRST_UNTESTED: Version = Version::new(2, 0, 0);

/// Whether the smolmachines backend must write the allowlist into smolvm's
/// state DB because this version drops `--allow-cidr` with `--from`.
pub fn needs_state_db_patch(version: Version) -> bool {
    version < ALLOW_CIDR_WITH_FROM
}

/// Finds the first `x.y.z` (or `x.y`) in `smolvm --version` output, such as
/// `smolvm 1.9.3` or `smolvm v0.8.0-rc1`.
pub fn parse_version(output: &str) -> Option<Version> {
    output.split_whitespace().find_map(|word| {
        let word = word.strip_prefix('v').unwrap_or(word);
        // Drop pre-release and build suffixes: `1.9.3-rc1`, `1.9.3+abc`.
        let core = word.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(patch) => patch.parse().ok()?,
            None => 0,
        };
        parts
            .next()
            .is_none()
            .then_some(Version::new(major, minor, patch))
    })
}

/// The argv that asks a smolvm binary for its version.
pub fn version_command(binary: &Path) -> CommandSpec {
    CommandSpec::new(binary).arg("--version")
}

/// Looks `smolvm` up on `path` (a `PATH`-style list).
pub fn find_smolvm(path: Option<&OsStr>) -> Option<PathBuf> {
    let path = path?;
    which::which_in_global(PROGRAM, Some(path)).ok()?.next()
}

const INSTALL: &str =
    "install smolvm (`curl -sSL https://smolmachines.com/install.sh | sh`) and put it on PATH";

/// Checks that smolvm is installed and its version is supported.
pub fn check_smolvm(ctx: &Context<'_>) -> Check {
    let selected = ctx.backend == BackendKind::Smolmachines;
    let Some(binary) = find_smolvm(ctx.path.as_deref()) else {
        return if selected {
            Check::new(ID, TITLE, Status::Fail, format!("{PROGRAM} is not on PATH"))
                .with_remediation(INSTALL)
        } else {
            Check::new(
                ID,
                TITLE,
                Status::Skip,
                format!("{PROGRAM} is not on PATH; only the smolmachines backend needs it"),
            )
        };
    };
    let at = binary.display();
    let spec = version_command(&binary);
    let check = match ctx.runner.run(&spec) {
        Err(err) => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("could not run `{} --version`: {err}", at),
        )
        .with_remediation(format!("reinstall smolvm: {INSTALL}")),
        Ok(out) if !out.success() => Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!(
                "`{at} --version` exited with {}: {}",
                out.code
                    .map_or_else(|| "a signal".to_owned(), |code| format!("code {code}")),
                out.stderr_text().trim()
            ),
        )
        .with_remediation(format!("reinstall smolvm: {INSTALL}")),
        Ok(out) => match parse_version(&out.stdout_text()) {
            None => Check::new(
                ID,
                TITLE,
                Status::Fail,
                format!(
                    "could not find a version in `{at} --version` output {:?}",
                    out.stdout_text().trim()
                ),
            )
            .with_remediation(format!(
                "make sure {at} is smolvm from smolmachines; {INSTALL}"
            )),
            Some(version) => judge(version, &at.to_string()),
        },
    };
    check.soften(selected, "only the smolmachines backend needs it")
}

fn judge(version: Version, at: &str) -> Check {
    let upgrade = format!(
        "upgrade smolvm to {ALLOW_CIDR_WITH_FROM} or newer, below {FIRST_UNTESTED} (`curl -sSL https://smolmachines.com/install.sh | sh`)"
    );
    if version < MIN_SUPPORTED {
        Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!(
                "smolvm {version} at {at} is older than {MIN_SUPPORTED}: before {MIN_SUPPORTED} smolvm did not enforce the TSI allowlist (smolvm PR #427), so a bottle's egress would not be confined"
            ),
        )
        .with_remediation(upgrade)
    } else if version >= FIRST_UNTESTED {
        Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!(
                "smolvm {version} at {at} is untested: bottle supports {MIN_SUPPORTED} up to, not including, {FIRST_UNTESTED}"
            ),
        )
        .with_remediation(format!(
            "if a bottle misbehaves, install a 1.x smolvm ({ALLOW_CIDR_WITH_FROM} or newer)"
        ))
    } else if needs_state_db_patch(version) {
        Check::new(
            ID,
            TITLE,
            Status::Ok,
            format!(
                "smolvm {version} at {at}; below {ALLOW_CIDR_WITH_FROM} smolvm drops `--allow-cidr` with `--from`, so the allowlist will be written into smolvm's state DB and verified before each start"
            ),
        )
    } else {
        Check::new(ID, TITLE, Status::Ok, format!("smolvm {version} at {at}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_version_output() {
        assert_eq!(parse_version("smolvm 1.9.3\n"), Some(Version::new(1, 9, 3)));
        assert_eq!(parse_version("smolvm 0.8.0"), Some(Version::new(0, 8, 0)));
        assert_eq!(
            parse_version("smolvm v1.10.2-rc1"),
            Some(Version::new(1, 10, 2))
        );
        assert_eq!(parse_version("smolvm 2.0"), Some(Version::new(2, 0, 0)));
        assert_eq!(
            parse_version("smolvm 1.8.0+abc (built 2025)"),
            Some(Version::new(1, 8, 0))
        );
        assert_eq!(parse_version("smolvm"), None);
        assert_eq!(parse_version("smolvm version unknown"), None);
        assert_eq!(parse_version("1.2.3.4"), None);
    }

    #[test]
    fn versions_order_numerically() {
        assert!(Version::new(1, 10, 0) > Version::new(1, 9, 9));
        assert!(Version::new(1, 1, 2) < MIN_SUPPORTED);
        assert!(needs_state_db_patch(Version::new(1, 7, 9)));
        assert!(!needs_state_db_patch(Version::new(1, 8, 0)));
    }

    #[test]
    fn version_argv() {
        assert_eq!(
            version_command(Path::new("/opt/smolvm/bin/smolvm")).argv(),
            ["/opt/smolvm/bin/smolvm", "--version"]
        );
    }

    #[test]
    fn judges_the_supported_range() {
        let status = |v| judge(v, "/bin/smolvm").status;
        assert_eq!(status(Version::new(0, 8, 0)), Status::Fail);
        assert_eq!(status(Version::new(1, 1, 2)), Status::Fail);
        assert_eq!(status(Version::new(1, 1, 3)), Status::Ok);
        assert_eq!(status(Version::new(1, 7, 9)), Status::Ok);
        assert_eq!(status(Version::new(1, 8, 0)), Status::Ok);
        assert_eq!(status(Version::new(1, 99, 99)), Status::Ok);
        assert_eq!(status(Version::new(2, 0, 0)), Status::Warn);
        assert!(
            judge(Version::new(1, 7, 0), "x")
                .message
                .contains("state DB")
        );
        assert!(
            !judge(Version::new(1, 8, 0), "x")
                .message
                .contains("state DB")
        );
        assert!(
            judge(Version::new(1, 0, 0), "x")
                .message
                .contains("PR #427")
        );
    }
}
