//! The files the bundle image needs so that the gate can run git: the host's
//! git binary, the helpers git executes from its exec path, their shared
//! libraries (found with `ldd`) including the dynamic loader, and the CA
//! bundle for `https` upstreams.
//!
//! What is deliberately left out: `/usr/share/git-core/templates` (mirrors
//! are created with `--template=`), the dashed `git-upload-pack` /
//! `git-receive-pack` links (the gate runs `git upload-pack` /
//! `git receive-pack`, builtins of the main binary), a shell (the hook is
//! the `bottle-bundle` binary, through its shebang), and locales.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bottle_core::exec::{CommandRunner, CommandSpec};

use crate::BundleFilesError;

/// Where the gate expects git inside the bundle.
pub const BUNDLE_GIT: &str = "/usr/bin/git";

/// The CA bundle `git-remote-https` (libcurl-gnutls) reads by default on
/// Debian and Ubuntu.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The helpers git executes from its exec path: `git` itself (for
/// `index-pack`, `pack-objects`, ... which git runs as `git <cmd>` with the
/// exec path first on `PATH`) and the HTTP transport (mirror mode).
const EXEC_PATH_HELPERS: [&str; 3] = ["git", "git-remote-http", "git-remote-https"];

fn runtime_err(detail: impl Into<String>) -> BundleFilesError {
    BundleFilesError::GitRuntime {
        detail: detail.into(),
    }
}

/// The shared libraries of one ELF file, from `ldd`'s output: each
/// `name => /path (addr)` and the loader's `/path (addr)` line. The vDSO
/// and statically linked files yield nothing.
pub fn parse_ldd(output: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("not a dynamic executable") || line.contains("statically linked") {
            continue;
        }
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(format!("library {} not found", name.trim()));
                }
                rest
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        } else if !line.starts_with("linux-vdso") && !line.starts_with("linux-gate") {
            return Err(format!("could not read ldd line {line:?}"));
        }
    }
    Ok(libs)
}

/// Finds the host's git (`/usr/bin/git`, else the first `git` on `PATH`).
fn host_git() -> Result<PathBuf, BundleFilesError> {
    let usr = Path::new(BUNDLE_GIT);
    if usr.is_file() {
        return Ok(usr.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("git"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            runtime_err("git is not installed on the host (no /usr/bin/git, none on PATH)")
        })
}

fn run(runner: &dyn CommandRunner, spec: &CommandSpec) -> Result<String, BundleFilesError> {
    let out = runner
        .run(spec)
        .map_err(|e| runtime_err(format!("could not run {}: {e}", spec.argv().join(" "))))?;
    if !out.success() {
        return Err(runtime_err(format!(
            "{} failed: {}",
            spec.argv().join(" "),
            out.stderr_text().trim()
        )));
    }
    Ok(out.stdout_text())
}

/// The files to copy into the bundle image: `(host path, path in image)`.
/// Host paths may be symlinks (copy what they point to). Sorted by image
/// path, no duplicates.
pub fn git_runtime_files(
    runner: &dyn CommandRunner,
) -> Result<Vec<(PathBuf, String)>, BundleFilesError> {
    let git = host_git()?;
    let exec_path = run(runner, &CommandSpec::new(&git).arg("--exec-path"))?;
    let exec_path = PathBuf::from(exec_path.trim());
    if !exec_path.is_absolute() {
        return Err(runtime_err(format!(
            "git --exec-path printed {:?}, not an absolute path",
            exec_path.display()
        )));
    }
    let mut files: Vec<(PathBuf, String)> = vec![(git.clone(), BUNDLE_GIT.to_string())];
    let mut elves = vec![git];
    for helper in EXEC_PATH_HELPERS {
        let host = exec_path.join(helper);
        if !host.exists() {
            if helper == "git" {
                // Some builds keep no copy in the exec path; git then finds
                // itself on PATH, which the gate sets to include /usr/bin.
                continue;
            }
            return Err(runtime_err(format!(
                "{} is missing: git's HTTP transport is not installed",
                host.display()
            )));
        }
        files.push((host.clone(), host.display().to_string()));
        elves.push(host);
    }
    let mut libs = BTreeSet::new();
    for elf in &elves {
        let text = run(runner, &CommandSpec::new("ldd").arg(elf))?;
        let found =
            parse_ldd(&text).map_err(|e| runtime_err(format!("ldd {}: {e}", elf.display())))?;
        libs.extend(found);
    }
    for lib in libs {
        let image = lib.display().to_string();
        files.push((lib, image));
    }
    if Path::new(CA_BUNDLE).is_file() {
        files.push((PathBuf::from(CA_BUNDLE), CA_BUNDLE.to_string()));
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    files.dedup_by(|a, b| a.1 == b.1);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f58)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f58)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f58)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(
            parse_ldd("\tnot a dynamic executable\n")
                .unwrap()
                .is_empty()
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
        let err = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(err.contains("libfoo"), "{err}");
    }
}
