//! `cargo xtask install [--prefix DIR]`: builds `bottle` and its static
//! bundle and installs them where `bottle` finds its bundle without any
//! variable (bottle-core's `bundle_binary` lookup):
//!
//! ```text
//! PREFIX/bin/bottle
//! PREFIX/lib/bottle/bottle-bundle
//! ```
//!
//! The prefix defaults to `/usr/local` for root and `~/.local` otherwise.
//! Run from a clone, it also completes the example's build context (see
//! [`demo::complete_example_context`]), so `bottle start demo` in
//! `examples/` works as written.
//! Both binaries are built statically, in two cargo runs so each keeps its
//! own dependency features and `cargo xtask dist`'s bundle is reused as is.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};

use crate::process::workspace_root;
use crate::{demo, dist};

/// Where `bottle` goes under the prefix.
pub(crate) const BOTTLE_PATH: &str = "bin/bottle";
/// Where the bundle goes under the prefix: `<bottle's dir>/../lib/bottle`.
pub(crate) const BUNDLE_PATH: &str = "lib/bottle/bottle-bundle";
/// Where the in-box agent goes, beside the bundle.
pub(crate) const TOOLBOX_PATH: &str = "lib/bottle/bottle-toolbox";

const USAGE: &str = "usage: cargo xtask install [--prefix DIR]";

/// Builds both binaries and installs them under the prefix.
pub(crate) fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let prefix = match args {
        [] => default_prefix()?,
        [flag, dir] if flag == "--prefix" => PathBuf::from(dir),
        [flag] if flag.starts_with("--prefix=") => PathBuf::from(&flag["--prefix=".len()..]),
        _ => {
            eprintln!("{USAGE}");
            return Ok(ExitCode::from(2));
        }
    };
    // `dist::run`'s own build (the same packages, so the same features):
    // a bundle `cargo xtask dist` or `test` built is reused, not rebuilt.
    let statics = dist::run()?;
    let bottle = dist::build(&["bottle-cli"])?.join("bottle");
    let installed = install_into(&prefix, &bottle, &statics.bundle, &statics.toolbox)?;
    for path in [&installed.bottle, &installed.bundle, &installed.toolbox] {
        println!("installed {}", path.display());
    }
    let bin = installed
        .bottle
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir == bin));
    if !on_path {
        println!("{} is not on PATH: add it to run `bottle`", bin.display());
    }
    // The example's image needs the host's busybox in its build context;
    // without it bottle is still installed, so this only warns.
    let context = workspace_root().join(demo::EXAMPLE_CONTEXT);
    match demo::complete_example_context(&context, Path::new(demo::HOST_BUSYBOX)) {
        Ok(copied) => println!(
            "copied {} for examples/bottle.toml's image",
            copied.display()
        ),
        Err(err) => println!("warning: examples/bottle.toml will not start: {err:#}"),
    }
    println!("next: `bottle doctor` checks this host and names the bundle it found");
    Ok(ExitCode::SUCCESS)
}

/// `/usr/local` for root, else `~/.local` (where a user's own programs go
/// without privileges).
fn default_prefix() -> anyhow::Result<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/usr/local"));
    }
    match std::env::var_os("HOME") {
        Some(home) if !home.is_empty() => Ok(Path::new(&home).join(".local")),
        _ => bail!("HOME is not set: give the prefix with `--prefix DIR`"),
    }
}

/// Where [`install_into`] put the binaries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Installed {
    pub bottle: PathBuf,
    pub bundle: PathBuf,
    pub toolbox: PathBuf,
}

/// Copies the built binaries into the prefix's layout, executable. Each is
/// written beside its destination and renamed over it, so a `bottle` that
/// is running while it is replaced keeps its old file.
pub(crate) fn install_into(
    prefix: &Path,
    bottle: &Path,
    bundle: &Path,
    toolbox: &Path,
) -> anyhow::Result<Installed> {
    let installed = Installed {
        bottle: prefix.join(BOTTLE_PATH),
        bundle: prefix.join(BUNDLE_PATH),
        toolbox: prefix.join(TOOLBOX_PATH),
    };
    place(bottle, &installed.bottle)?;
    place(bundle, &installed.bundle)?;
    place(toolbox, &installed.toolbox)?;
    Ok(installed)
}

fn place(from: &Path, to: &Path) -> anyhow::Result<()> {
    let dir = to
        .parent()
        .with_context(|| format!("{} has no parent directory", to.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    let name = to
        .file_name()
        .with_context(|| format!("{} has no file name", to.display()))?;
    let staged = dir.join(format!(".{}.installing", name.to_string_lossy()));
    std::fs::copy(from, &staged)
        .with_context(|| format!("could not copy {} to {}", from.display(), staged.display()))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("could not make {} executable", staged.display()))?;
    std::fs::rename(&staged, to)
        .with_context(|| format!("could not move {} to {}", staged.display(), to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binaries_land_where_bottle_looks_for_its_bundle() {
        let built = tempfile::tempdir().unwrap();
        let bottle = built.path().join("bottle");
        let bundle = built.path().join("bottle-bundle");
        let toolbox = built.path().join("bottle-toolbox");
        std::fs::write(&bottle, b"bottle").unwrap();
        std::fs::write(&bundle, b"bundle").unwrap();
        std::fs::write(&toolbox, b"toolbox").unwrap();
        let prefix = tempfile::tempdir().unwrap();
        let installed = install_into(prefix.path(), &bottle, &bundle, &toolbox).unwrap();

        assert_eq!(installed.bottle, prefix.path().join("bin/bottle"));
        assert_eq!(std::fs::read(&installed.bundle).unwrap(), b"bundle");
        for path in [&installed.bottle, &installed.bundle, &installed.toolbox] {
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755, "{}", path.display());
        }
        // The first place bottle-core looks, after BOTTLE_BUNDLE_BIN.
        let first =
            bottle_core::bundle_binary::bundle_binary_candidates(None, Some(&installed.bottle))
                .remove(0);
        assert_eq!(
            std::fs::canonicalize(first).unwrap(),
            std::fs::canonicalize(&installed.bundle).unwrap()
        );
        let first =
            bottle_core::bundle_binary::toolbox_binary_candidates(None, Some(&installed.bottle))
                .remove(0);
        assert_eq!(
            std::fs::canonicalize(first).unwrap(),
            std::fs::canonicalize(&installed.toolbox).unwrap()
        );
    }

    #[test]
    fn installing_again_replaces_the_binaries_and_leaves_nothing_staged() {
        let built = tempfile::tempdir().unwrap();
        let bottle = built.path().join("bottle");
        let bundle = built.path().join("bottle-bundle");
        std::fs::write(&bottle, b"old").unwrap();
        std::fs::write(&bundle, b"old").unwrap();
        let prefix = tempfile::tempdir().unwrap();
        install_into(prefix.path(), &bottle, &bundle, &bundle).unwrap();
        std::fs::write(&bottle, b"new").unwrap();
        let installed = install_into(prefix.path(), &bottle, &bundle, &bundle).unwrap();

        assert_eq!(std::fs::read(&installed.bottle).unwrap(), b"new");
        let names: Vec<String> = std::fs::read_dir(prefix.path().join("bin"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["bottle"]);
    }
}
