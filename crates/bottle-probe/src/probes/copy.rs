//! What an agent leaves for the operator's `bottle cp`: links where the
//! operator copies in (to what bottle owns in the box, and above it), and
//! trees the operator copies out holding a link out of them, a fifo and a
//! set-uid file. Planting them is not an escape by itself; the harness
//! then runs the real `bottle cp` both ways and judges what it did (and
//! leaves them for that, rather than undoing them).

use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use super::{Attempt, Ctx, Probe, errno_name};
use crate::contract::{
    CP_DATA, CP_DIR, CP_LINKS, CP_OUT_FIFO, CP_OUT_LINK, CP_OUT_PLAIN, CP_OUT_SETUID, CP_PLAIN_IN,
    CP_SETUID_FILE,
};

const CAT: &str = "copy";

pub(super) fn probes() -> Vec<Probe> {
    vec![Probe::new(
        "cp-plant",
        CAT,
        false,
        "plant, under /tmp/bottle-cp-probe, links to /etc/bottle, /.bottle and /etc where the operator copies in, and trees with a link out, a fifo and a set-uid file the operator copies out: blocked when planted (the harness then runs the real `bottle cp` both ways and judges it); error when they could not be planted",
        plant,
    )]
}

fn plant(c: &Ctx) -> Attempt {
    match plant_in(Path::new(CP_DIR), &c.config.token) {
        Ok(()) => Attempt::blocked(format!(
            "planted {} links and 4 trees in {CP_DIR}",
            CP_LINKS.len()
        )),
        Err(e) => Attempt::error(format!("could not plant in {CP_DIR}: {}", errno_name(&e))),
    }
}

fn plant_in(dir: &Path, token: &str) -> io::Result<()> {
    // A probe run again in the same bottle plants afresh.
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(dir.join(CP_PLAIN_IN))?;
    for (name, target) in CP_LINKS {
        std::os::unix::fs::symlink(target, dir.join(name))?;
    }
    for tree in [CP_OUT_PLAIN, CP_OUT_LINK, CP_OUT_FIFO, CP_OUT_SETUID] {
        std::fs::create_dir(dir.join(tree))?;
        std::fs::write(dir.join(tree).join(CP_DATA), format!("{token}\n"))?;
    }
    let link = dir.join(CP_OUT_LINK);
    std::os::unix::fs::symlink("/etc/passwd", link.join("abs"))?;
    std::os::unix::fs::symlink("../../../../../../../../etc/passwd", link.join("up"))?;
    nix::unistd::mkfifo(
        &dir.join(CP_OUT_FIFO).join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .map_err(io::Error::from)?;
    let tool = dir.join(CP_OUT_SETUID).join(CP_SETUID_FILE);
    std::fs::write(&tool, "#!/bin/sh\n")?;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o4755))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

    use super::*;

    #[test]
    fn plants_the_links_and_trees_the_harness_copies_and_plants_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cp");
        for _ in 0..2 {
            plant_in(&root, "tok").unwrap();
        }
        assert_eq!(
            std::fs::read_link(root.join("to-etc-bottle")).unwrap(),
            Path::new("/etc/bottle")
        );
        assert_eq!(
            std::fs::read_to_string(root.join(CP_OUT_PLAIN).join(CP_DATA)).unwrap(),
            "tok\n"
        );
        let pipe = std::fs::symlink_metadata(root.join(CP_OUT_FIFO).join("pipe")).unwrap();
        assert!(pipe.file_type().is_fifo());
        let tool = std::fs::metadata(root.join(CP_OUT_SETUID).join(CP_SETUID_FILE)).unwrap();
        assert_eq!(tool.mode() & 0o7777, 0o4755);
    }
}
