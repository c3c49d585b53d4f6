//! `--backend smolmachines`: whether the real thing can run on this host.
//! The gate never passes silently: without a usable smolvm and `/dev/kvm`
//! it says exactly why and exits non-zero.
//!
//! One exception, for testing the gate itself: the CLI's own test switch
//! (`BOTTLE_SMOLVM` naming the `fake-smolvm` double *and*
//! `BOTTLE_TEST_FAKE_SMOLVM_NO_KVM=1`) runs the phases against the double,
//! whose `machine exec` runs on the host. Nothing is isolated then, so the
//! gate must report escapes: that run is its negative control.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec};

use super::sys::{Run, Sys};

/// Adapts the gate's [`Sys`] to the workspace's [`CommandRunner`], so the
/// smolvm probe spawns through xtask's one spawning point.
pub(crate) struct SysRunner(pub Arc<dyn Sys>);

impl CommandRunner for SysRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        let argv = spec.argv();
        let mut run = Run::new(&argv[0], &argv[1..]).timeout(Duration::from_secs(60));
        for (k, v) in &spec.env {
            run = run.env(&k.to_string_lossy(), &v.to_string_lossy());
        }
        let out = self
            .0
            .output(&run)
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("{e:#}")))?;
        Ok(CommandOutput {
            code: out.code,
            stdout: out.stdout.into_bytes(),
            stderr: out.stderr.into_bytes(),
        })
    }

    fn spawn_detached(&self, spec: &CommandSpec, _log: &std::path::Path) -> io::Result<u32> {
        // The smolvm probe runs commands to completion only.
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the escape gate does not detach {}", spec.argv().join(" ")),
        ))
    }

    fn spawn_piped(&self, spec: &CommandSpec) -> io::Result<bottle_core::exec::PipedChild> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the escape gate does not pipe {}", spec.argv().join(" ")),
        ))
    }
}

/// Names the `smolvm` program the CLI runs (as `bottle-cli` reads it).
pub(crate) const SMOLVM_ENV: &str = "BOTTLE_SMOLVM";
/// The CLI's test switch that skips the KVM check for the double.
pub(crate) const FAKE_NO_KVM_ENV: &str = "BOTTLE_TEST_FAKE_SMOLVM_NO_KVM";
/// The double's file name.
pub(crate) const FAKE_SMOLVM: &str = "fake-smolvm";

/// The smolvm a smolmachines run drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The program (`smolvm` on `PATH`, or `BOTTLE_SMOLVM`).
    pub program: PathBuf,
    /// The `fake-smolvm` double: nothing is isolated, escapes are expected.
    pub fake: bool,
}

/// Whether `BOTTLE_SMOLVM` (`program`) and the test switch (`no_kvm`)
/// select the double, as the CLI decides it.
pub(crate) fn fake_selected(program: Option<&OsStr>, no_kvm: Option<&OsStr>) -> Option<PathBuf> {
    let program = program.filter(|p| !p.is_empty()).map(PathBuf::from)?;
    let is_fake = program.file_name().is_some_and(|n| n == FAKE_SMOLVM);
    (is_fake && no_kvm.is_some_and(|v| v == "1")).then_some(program)
}

/// The smolvm to run the gate against, or exactly why none can be.
pub(crate) fn select(sys: Arc<dyn Sys>) -> Result<Target, String> {
    let program = std::env::var_os(SMOLVM_ENV);
    if let Some(fake) = fake_selected(
        program.as_deref(),
        std::env::var_os(FAKE_NO_KVM_ENV).as_deref(),
    ) {
        return Ok(Target {
            program: fake,
            fake: true,
        });
    }
    if let Some(program) = program.filter(|p| !p.is_empty())
        && Path::new(&program) != Path::new("smolvm")
    {
        // The availability check is of `smolvm` on PATH; a run whose CLI
        // drove another program would not test what was checked.
        return Err(format!(
            "{SMOLVM_ENV} is set to {} (not the {FAKE_SMOLVM} test double with {FAKE_NO_KVM_ENV}=1); the gate checks and drives `smolvm` on PATH only\n  fix: unset {SMOLVM_ENV}",
            Path::new(&program).display()
        ));
    }
    available(sys).map(|_| Target {
        program: PathBuf::from("smolvm"),
        fake: false,
    })
}

/// `Ok(version)` when smolvm and KVM are usable, else the reason.
pub(crate) fn available(sys: Arc<dyn Sys>) -> Result<String, String> {
    bottle_smolvm::real_smolvm_available(Arc::new(SysRunner(sys))).map(|v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::sys::RealSys;

    #[test]
    fn only_the_double_with_the_switch_is_selected() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert_eq!(
            fake_selected(os("/t/debug/fake-smolvm"), os("1")),
            Some(PathBuf::from("/t/debug/fake-smolvm"))
        );
        assert_eq!(fake_selected(os("/t/debug/fake-smolvm"), None), None);
        assert_eq!(fake_selected(os("/t/debug/fake-smolvm"), os("0")), None);
        assert_eq!(fake_selected(os("/usr/bin/smolvm"), os("1")), None);
        assert_eq!(fake_selected(os("/t/fake-smolvm-old"), os("1")), None);
        assert_eq!(fake_selected(None, os("1")), None);
        assert_eq!(fake_selected(os(""), os("1")), None);
    }

    #[test]
    fn the_runner_reports_exit_codes_and_output() {
        let runner = SysRunner(Arc::new(RealSys));
        let out = runner
            .run(
                &CommandSpec::new("sh")
                    .args(["-c", "echo $X; exit 4"])
                    .env("X", "hello"),
            )
            .unwrap();
        assert_eq!(out.code, Some(4));
        assert_eq!(out.stdout_text(), "hello\n");
        assert!(
            runner
                .run(&CommandSpec::new("/nonexistent/program"))
                .is_err()
        );
    }
}
