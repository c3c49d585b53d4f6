//! A machine's disks, as a reset restores them: `machine data-dir`, the
//! guest's files on `overlay.raw` while stopped (a restored disk restores
//! them), every boot changing the disks, and `stop` ending every guest
//! process unless `keep-guest-processes` keeps them.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};

use crate::artifact;

/// The double at 1.9.3 under `dir`, in fault `mode`.
fn fake_in(dir: &Path, mode: &str, args: &[&str]) -> CommandOutput {
    let spec = CommandSpec::new(env!("CARGO_BIN_EXE_fake-smolvm"))
        .args(args)
        .env("HOME", dir.join("home"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("SMOLVM_DATA_DIR", "")
        .env("FAKE_SMOLVM_VERSION", "1.9.3")
        .env("FAKE_SMOLVM_MODE", mode);
    SystemRunner.run(&spec).unwrap()
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = fake_in(dir, "", args);
    assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr_text());
    out.stdout_text()
}

fn sh(dir: &Path, script: &str) -> String {
    ok(
        dir,
        &["machine", "exec", "--name", "m", "--", "sh", "-c", script],
    )
}

/// Stops machine `m` however the test ends, so no guest process outlives it.
struct Stopped<'a>(&'a Path);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        let _ = fake_in(self.0, "", &["machine", "stop", "--name", "m"]);
    }
}

fn copy_sparse(from: &Path, to: &Path) {
    let out = SystemRunner
        .run(
            &CommandSpec::new("cp")
                .arg("--sparse=always")
                .arg(from)
                .arg(to),
        )
        .unwrap();
    assert!(out.success(), "{}", out.stderr_text());
}

fn header(disk: &Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt as _;
    let mut bytes = vec![0u8; 24];
    std::fs::File::open(disk)
        .unwrap()
        .read_exact_at(&mut bytes, 0)
        .unwrap();
    bytes
}

#[test]
fn a_restored_overlay_disk_restores_the_guests_files_and_stop_ends_its_processes() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let from = artifact(dir);
    let _stopped = Stopped(dir);
    ok(
        dir,
        &[
            "machine",
            "create",
            "--name",
            "m",
            "--from",
            from.to_str().unwrap(),
        ],
    );
    let data_dir = PathBuf::from(ok(dir, &["machine", "data-dir", "-n", "m"]).trim());
    assert!(
        data_dir.starts_with(dir.join("cache/smolvm/vms")),
        "{data_dir:?}"
    );
    assert_eq!(data_dir.file_name().unwrap().len(), 16);
    let overlay = data_dir.join("overlay.raw");
    let meta = std::fs::metadata(&overlay).unwrap();
    assert_eq!(meta.len(), 10 << 30);
    assert!(meta.blocks() * 512 < 16 << 20, "the disk is sparse");
    assert_eq!(
        std::fs::metadata(data_dir.join("storage.raw"))
            .unwrap()
            .len(),
        20 << 30
    );

    ok(dir, &["machine", "start", "--name", "m"]);
    sh(dir, "echo golden > /root/kept; echo doomed > /root/changed");
    ok(dir, &["machine", "stop", "--name", "m"]);
    let golden = dir.join("golden-overlay.raw");
    copy_sparse(&overlay, &golden);
    let stopped = header(&overlay);

    ok(dir, &["machine", "start", "--name", "m"]);
    assert_ne!(header(&overlay), stopped, "a boot writes the disk");
    assert_eq!(sh(dir, "cat /root/kept /root/changed"), "golden\ndoomed\n");
    sh(
        dir,
        "rm /root/kept; echo modified > /root/changed; echo new > /root/created",
    );
    sh(dir, "sleep 1000 </dev/null >/dev/null 2>&1 &");
    assert!(sh(dir, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").contains("sleep 1000"));
    ok(dir, &["machine", "stop", "--name", "m"]);
    copy_sparse(&golden, &overlay);
    ok(dir, &["machine", "start", "--name", "m"]);
    assert_eq!(
        sh(dir, "cat /root/kept /root/changed; ls /root"),
        "golden\ndoomed\nchanged\nkept\n"
    );
    assert!(!sh(dir, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").contains("sleep 1000"));

    // The test hook: a process that survives the restart.
    sh(dir, "sleep 1001 </dev/null >/dev/null 2>&1 &");
    let out = fake_in(
        dir,
        "keep-guest-processes",
        &["machine", "stop", "--name", "m"],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr_text());
    ok(dir, &["machine", "start", "--name", "m"]);
    assert!(sh(dir, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").contains("sleep 1001"));

    let unknown = fake_in(dir, "", &["machine", "data-dir", "-n", "nope"]);
    assert_eq!(unknown.code, Some(1));
    assert!(unknown.stderr_text().contains("machine 'nope' not found"));
    ok(dir, &["machine", "stop", "--name", "m"]);
    ok(dir, &["machine", "delete", "--name", "m", "-f"]);
    assert!(!data_dir.exists(), "delete removes the disks");
}
