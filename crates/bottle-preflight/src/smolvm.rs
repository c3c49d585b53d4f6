//! The smolvm check: the binary is on `PATH` and its version is in the range
//! bottle supports.
//!
//! The range is bottle-core's ([`bottle_core::requirements`], which says
//! why each bound is where it is): a hard floor, below which the allowlist
//! is not enforced (refused); a note below the release that keeps
//! `--allow-cidr` with `--from` (the state-DB patch covers it); and a
//! warning from the first untested release on.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use bottle_core::BackendKind;
use bottle_core::exec::CommandSpec;
use bottle_core::requirements::{
    SMOLVM_FIRST_UNTESTED, SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM, SMOLVM_MIN_SUPPORTED, SmolvmVersion,
};

use crate::check::{Check, Status};
use crate::host::Context;

/// Stable id of the smolvm check.
pub const ID: &str = "smolvm.version";
pub(crate) const TITLE: &str = "smolvm";

/// The program name looked up on `PATH`.
pub const PROGRAM: &str = "smolvm";

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
        Ok(out) => match SmolvmVersion::parse(&out.stdout_text()) {
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

fn judge(version: SmolvmVersion, at: &str) -> Check {
    let upgrade = format!(
        "upgrade smolvm to {SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM} or newer, below {SMOLVM_FIRST_UNTESTED} (`curl -sSL https://smolmachines.com/install.sh | sh`)"
    );
    if version < SMOLVM_MIN_SUPPORTED {
        Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!(
                "smolvm {version} at {at} is older than {SMOLVM_MIN_SUPPORTED}: before {SMOLVM_MIN_SUPPORTED} smolvm did not enforce the TSI allowlist (smolvm PR #427), so a bottle's egress would not be confined"
            ),
        )
        .with_remediation(upgrade)
    } else if version >= SMOLVM_FIRST_UNTESTED {
        Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!(
                "smolvm {version} at {at} is untested: bottle supports {SMOLVM_MIN_SUPPORTED} up to, not including, {SMOLVM_FIRST_UNTESTED}"
            ),
        )
        .with_remediation(format!(
            "if a bottle misbehaves, install a 1.x smolvm ({SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM} or newer)"
        ))
    } else if version.from_drops_allow_cidr() {
        Check::new(
            ID,
            TITLE,
            Status::Ok,
            format!(
                "smolvm {version} at {at}; below {SMOLVM_KEEPS_ALLOW_CIDR_WITH_FROM} smolvm drops `--allow-cidr` with `--from`, so the allowlist will be written into smolvm's state DB and verified before each start"
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
    fn version_argv() {
        assert_eq!(
            version_command(Path::new("/opt/smolvm/bin/smolvm")).argv(),
            ["/opt/smolvm/bin/smolvm", "--version"]
        );
    }

    #[test]
    fn judges_the_supported_range() {
        let status = |v| judge(v, "/bin/smolvm").status;
        assert_eq!(status(SmolvmVersion::new(0, 8, 0)), Status::Fail);
        assert_eq!(status(SmolvmVersion::new(1, 1, 2)), Status::Fail);
        assert_eq!(status(SmolvmVersion::new(1, 1, 3)), Status::Ok);
        assert_eq!(status(SmolvmVersion::new(1, 7, 9)), Status::Ok);
        assert_eq!(status(SmolvmVersion::new(1, 8, 0)), Status::Ok);
        assert_eq!(status(SmolvmVersion::new(1, 99, 99)), Status::Ok);
        assert_eq!(status(SmolvmVersion::new(2, 0, 0)), Status::Warn);
        assert!(
            judge(SmolvmVersion::new(1, 7, 0), "x")
                .message
                .contains("state DB")
        );
        assert!(
            !judge(SmolvmVersion::new(1, 8, 0), "x")
                .message
                .contains("state DB")
        );
        assert!(
            judge(SmolvmVersion::new(1, 0, 0), "x")
                .message
                .contains("PR #427")
        );
    }
}
