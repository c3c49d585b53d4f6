//! `fake-smolvm` is a test double of the `smolvm` CLI (the binary of this
//! package; its module docs say what it emulates and how). This library
//! only finds that binary for tests in other packages, to which cargo
//! gives no `CARGO_BIN_EXE_fake-smolvm`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use serde_json::Value;

/// Names a built double and skips the build.
pub const ENV_OVERRIDE: &str = "BOTTLE_FAKE_SMOLVM";

/// The double's executable: [`ENV_OVERRIDE`] if set, else built (once per
/// process) with `cargo build -p fake-smolvm` into the invoking build's
/// target dir. `Err` says why it could not be built.
pub fn executable() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| match std::env::var_os(ENV_OVERRIDE) {
            Some(path) => Ok(PathBuf::from(path)),
            None => build(),
        })
        .clone()
}

fn build() -> Result<PathBuf, String> {
    // This package sits at <workspace>/crates/fake-smolvm.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut spec = CommandSpec::new(cargo).args([
        "build",
        "--quiet",
        "-p",
        "fake-smolvm",
        "--bin",
        "fake-smolvm",
        "--message-format=json",
    ]);
    spec.cwd = Some(workspace);
    let out = SystemRunner
        .run(&spec)
        .map_err(|e| format!("could not run cargo to build fake-smolvm: {e}"))?;
    if !out.success() {
        return Err(format!(
            "building fake-smolvm failed: {}",
            out.stderr_text()
        ));
    }
    out.stdout_text()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact")
        .filter(|msg| msg["target"]["name"] == "fake-smolvm")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo reported no fake-smolvm executable".to_string())
}
