//! `cargo xtask agent-image`: a real-distribution agent image (Debian
//! bookworm with curl, git, python3, pip, venv, node, npm and yarn, and the
//! WebSocket and proxy libraries agents use) made without any registry:
//! `debootstrap` a root filesystem, then `docker import` it.
//!
//! The tag carries a hash of the build's inputs (suite, mirror, packages
//! and this file), so an image that exists is never rebuilt. The root
//! filesystem's tarball is kept under [`CACHE_DIR`] by the same hash: a
//! fresh dockerd re-imports it without downloading anything.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use bottle_core::exec::CommandSpec;
use sha2::{Digest as _, Sha256};

use crate::process::{capture, command, describe_exit, watch};

/// The Debian release the image is made from.
const SUITE: &str = "bookworm";
/// Where debootstrap downloads the packages.
const MIRROR: &str = "http://deb.debian.org/debian";
/// What the end-to-end tests run inside a bottle; debootstrap adds their
/// dependencies. `python3-pip` brings setuptools and wheel with it (an
/// sdist builds offline with `--no-build-isolation`); `python3-venv` makes
/// the virtual environments agents install into; `python3-websockets` and
/// `python3-websocket` are Python's WebSocket clients.
const PACKAGES: &[&str] = &[
    "ca-certificates",
    "curl",
    "git",
    "python3",
    "python3-pip",
    "python3-venv",
    "python3-websockets",
    "python3-websocket",
    "nodejs",
];
/// Installed by apt in the debootstrapped root, not by debootstrap: their
/// dependencies go through virtual packages (`node-call-bind`, provided by
/// `node-deep-equal`, and dozens more), which debootstrap does not resolve.
/// The package managers agents run (`npm`, `yarnpkg`) and node's
/// WebSocket client (`node-ws`) and proxy-capable `fetch` (`node-undici`,
/// whose `ProxyAgent` node 18's `fetch` needs to use a proxy).
const APT_PACKAGES: &[&str] = &["npm", "yarnpkg", "node-ws", "node-undici"];
/// The image's repository; the tag is the inputs' hash.
const REPOSITORY: &str = "bottle-test/debian-agent";
/// Root filesystem tarballs, one per inputs' hash.
pub(crate) const CACHE_DIR: &str = "/var/cache/bottle-test";
/// The agent's user, as bottle's own demo image has it (uid 1000).
const AGENT_USER: &str = "agent";

/// Makes sure the image exists and prints its tag.
pub(crate) fn run() -> anyhow::Result<()> {
    println!("{}", ensure()?);
    Ok(())
}

/// Where tests and benches find the image's tag.
pub(crate) const TAG_ENV: &str = "BOTTLE_TEST_DEBIAN_IMAGE";

/// The image's tag, building (or re-importing) it when it is missing.
pub(crate) fn ensure() -> anyhow::Result<String> {
    let tag = format!("{REPOSITORY}:{}", inputs_hash());
    if image_exists(&tag)? {
        return Ok(tag);
    }
    let tarball = Path::new(CACHE_DIR).join(format!("debian-agent-{}.tar", inputs_hash()));
    if !tarball.is_file() {
        build_rootfs(&tarball)?;
    }
    import(&tarball, &tag)?;
    prune_stale(&tag, &tarball);
    Ok(tag)
}

/// How long another inputs' tarball is kept: several worktrees of this
/// repository on one machine build images from different inputs, and one
/// build must not take away the image another is testing with.
const KEEP_OTHER_BUILDS: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// Removes the tarballs of other inputs older than [`KEEP_OTHER_BUILDS`],
/// and the tags whose tarball is gone: the disk is shared and nothing uses
/// them once the inputs changed. Best effort: an image still in use by a
/// container stays.
fn prune_stale(current_tag: &str, current_tarball: &Path) {
    let mut kept = Vec::new();
    if let Ok(entries) = std::fs::read_dir(CACHE_DIR) {
        for path in entries.flatten().map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let Some(hash) = name
                .strip_prefix("debian-agent-")
                .and_then(|n| n.strip_suffix(".tar"))
            else {
                continue;
            };
            let age = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok());
            let fresh = age.is_some_and(|age| age < KEEP_OTHER_BUILDS);
            if path == current_tarball || fresh {
                kept.push(format!("{REPOSITORY}:{hash}"));
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let listed = capture(&command("docker").args([
        "image",
        "ls",
        "--format",
        "{{.Repository}}:{{.Tag}}",
        REPOSITORY,
    ]));
    for tag in listed
        .map(|out| out.stdout_text())
        .unwrap_or_default()
        .lines()
    {
        if tag != current_tag && !kept.iter().any(|k| k == tag) {
            let _ = capture(&command("docker").args(["image", "rm", tag]));
        }
    }
}

/// A hash over everything the image is made from.
fn inputs_hash() -> String {
    let mut hasher = Sha256::new();
    for part in [
        SUITE,
        MIRROR,
        &PACKAGES.join(","),
        &APT_PACKAGES.join(","),
        include_str!("agent_image.rs"),
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn image_exists(tag: &str) -> anyhow::Result<bool> {
    let out = capture(&command("docker").args(["image", "inspect", "--format", "{{.Id}}", tag]))?;
    Ok(out.success())
}

/// Runs `spec` showing its progress on a terminal, quietly otherwise; a
/// failure shows what the quiet run captured.
fn step(what: &str, spec: CommandSpec) -> anyhow::Result<()> {
    let out = if std::io::stderr().is_terminal() {
        eprintln!("agent-image: {what}");
        watch(spec)?
    } else {
        capture(&spec)?
    };
    if !out.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            describe_exit(&out),
            out.stdout_text(),
            out.stderr_text()
        );
    }
    Ok(())
}

/// debootstraps a root filesystem, adds the agent's user and writes it as
/// `tarball` (through a temporary name, so a cut-short run leaves none).
fn build_rootfs(tarball: &Path) -> anyhow::Result<()> {
    let cache = tarball.parent().unwrap_or(Path::new(CACHE_DIR));
    std::fs::create_dir_all(cache)
        .with_context(|| format!("could not create {}", cache.display()))?;
    let work = tempfile::Builder::new()
        .prefix("debian-agent-")
        .tempdir_in(cache)
        .with_context(|| format!("could not make a work directory in {}", cache.display()))?;
    let root = work.path().join("root");
    let include = format!("--include={}", PACKAGES.join(","));
    step(
        &format!("debootstrap {SUITE} from {MIRROR}"),
        command("debootstrap")
            .args(["--variant=minbase", &include, SUITE])
            .arg(&root)
            .arg(MIRROR),
    )?;
    step(
        "adding the agent's user",
        command("chroot").arg(&root).args([
            "useradd",
            "--create-home",
            "--uid",
            "1000",
            "--shell",
            "/bin/bash",
            AGENT_USER,
        ]),
    )?;
    step(
        "updating apt's package lists",
        command("chroot")
            .arg(&root)
            .args(["apt-get", "update", "-q"]),
    )?;
    step(
        &format!("installing {}", APT_PACKAGES.join(", ")),
        command("chroot")
            .arg(&root)
            .args(["apt-get", "install", "-y", "-q", "--no-install-recommends"])
            .args(APT_PACKAGES.iter().copied())
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    // The package lists and downloaded .debs are half the size and of no
    // use to an agent that cannot reach Debian's mirror.
    for dir in [
        "var/cache/apt/archives",
        "var/cache/apt",
        "var/lib/apt/lists",
    ] {
        remove_files_under(&root.join(dir))?;
    }
    // Nor are the packages' documentation and manual pages, a tenth of the
    // image once npm's dependencies are in.
    for dir in ["usr/share/doc", "usr/share/man", "usr/share/info"] {
        let dir = root.join(dir);
        if dir.is_dir() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("could not remove {}", dir.display()))?;
        }
    }
    let partial: PathBuf = work.path().join("rootfs.tar");
    step(
        "writing the root filesystem tarball",
        command("tar")
            .args(["--numeric-owner", "-C"])
            .arg(&root)
            .args(["-cf"])
            .arg(&partial)
            .arg("."),
    )?;
    std::fs::rename(&partial, tarball)
        .with_context(|| format!("could not move the tarball to {}", tarball.display()))?;
    Ok(())
}

/// Removes the regular files directly under `dir` (not its subdirectories,
/// which apt expects to exist).
fn remove_files_under(dir: &Path) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_file() {
            std::fs::remove_file(&path)
                .with_context(|| format!("could not remove {}", path.display()))?;
        }
    }
    Ok(())
}

fn import(tarball: &Path, tag: &str) -> anyhow::Result<()> {
    let changes = [
        format!("USER {AGENT_USER}"),
        format!("WORKDIR /home/{AGENT_USER}"),
        format!("ENV HOME=/home/{AGENT_USER}"),
        "ENV PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
        "ENV LANG=C.UTF-8".to_string(),
        r#"CMD ["/bin/bash"]"#.to_string(),
    ];
    let mut spec = command("docker").arg("import");
    for change in &changes {
        spec = spec.args(["--change", change]);
    }
    step(&format!("importing {tag}"), spec.arg(tarball).arg(tag))
}
