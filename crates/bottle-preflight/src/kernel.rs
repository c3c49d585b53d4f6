//! The kernel check, and the kernel version the device policy's `/dev/pts`
//! (TIOCSTI) rule asks for.

use std::io;

use crate::check::{Check, Status};
use crate::error::PreflightError;
use crate::host::{Context, HostRoot, Platform};

/// Stable id of the kernel check.
pub const ID: &str = "kernel.version";
pub(crate) const TITLE: &str = "kernel";

/// Where Linux publishes the running kernel's release string.
pub const OSRELEASE: &str = "/proc/sys/kernel/osrelease";

/// The kernel from which the device policy keeps an explicit `/dev/pts`
/// request (TIOCSTI rule) instead of refusing it.
pub const PTS_RULE_KERNEL: (u32, u32) = bottle_core::devices::PTS_MIN_KERNEL;

/// Parses `major.minor` from a release string like `6.8.0-45-generic`.
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The running kernel's `(major, minor)` read from `<root>/proc/sys/kernel/osrelease`.
///
/// `Ok(None)` when the file does not exist (not Linux, `/proc` not mounted);
/// an error when it exists but cannot be read or parsed.
pub fn kernel_version(root: &HostRoot) -> Result<Option<(u32, u32)>, PreflightError> {
    Ok(kernel_release(root)?.map(|(_, version)| version))
}

/// The release string as written, and its `(major, minor)`.
type Release = (String, (u32, u32));

fn kernel_release(root: &HostRoot) -> Result<Option<Release>, PreflightError> {
    let path = root.join(OSRELEASE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(PreflightError::Read { path, source }),
    };
    let release = text.trim().to_owned();
    match parse_kernel_release(&release) {
        Some(version) => Ok(Some((release, version))),
        None => Err(PreflightError::KernelRelease {
            path,
            content: release,
        }),
    }
}

/// Reports the kernel release and whether it meets [`PTS_RULE_KERNEL`].
pub fn check_kernel(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    if ctx.platform() != Platform::Linux {
        return Ok(Check::new(
            ID,
            TITLE,
            Status::Skip,
            format!("the kernel is only checked on linux, this is {}", ctx.os),
        ));
    }
    let (min_major, min_minor) = PTS_RULE_KERNEL;
    Ok(match kernel_release(&ctx.root)? {
        None => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("no {OSRELEASE}, so the kernel version is unknown"),
        )
        .with_remediation("mount /proc (`mount -t proc proc /proc`)"),
        Some((release, version)) if version >= PTS_RULE_KERNEL => Check::new(
            ID,
            TITLE,
            Status::Ok,
            format!(
                "linux {release} (>= {min_major}.{min_minor}, as the /dev/pts TIOCSTI rule of the device policy needs)"
            ),
        ),
        Some((release, _)) => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!(
                "linux {release} is older than {min_major}.{min_minor}, which the /dev/pts TIOCSTI rule of the device policy needs"
            ),
        )
        .with_remediation(format!(
            "the device policy refuses an explicit /dev/pts request on this kernel; upgrade to linux {min_major}.{min_minor} or newer if a bottle needs it"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_release_strings() {
        assert_eq!(parse_kernel_release("6.8.0-45-generic\n"), Some((6, 8)));
        assert_eq!(parse_kernel_release("5.4.0-228-generic"), Some((5, 4)));
        assert_eq!(parse_kernel_release("6.18.44-fc-v509"), Some((6, 18)));
        assert_eq!(parse_kernel_release("6.1"), Some((6, 1)));
        assert_eq!(parse_kernel_release("4.19.0+"), Some((4, 19)));
        assert_eq!(parse_kernel_release("6"), None);
        assert_eq!(parse_kernel_release("linux"), None);
        assert_eq!(parse_kernel_release(""), None);
    }
}
