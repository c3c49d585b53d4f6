//! `--backend smolmachines`: whether the real thing can run on this host.
//! The gate never passes silently: without a usable smolvm and `/dev/kvm`
//! it says exactly why and exits non-zero.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec};

use super::sys::{Run, Sys};

/// Adapts the gate's [`Sys`] to the workspace's [`CommandRunner`], so the
/// smolvm probe spawns through xtask's one spawning point.
pub struct SysRunner(pub Arc<dyn Sys>);

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
}

/// `Ok(version)` when smolvm and KVM are usable, else the reason.
pub fn available(sys: Arc<dyn Sys>) -> Result<String, String> {
    bottle_smolvm::real_smolvm_available(Arc::new(SysRunner(sys))).map(|v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::sys::RealSys;

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
