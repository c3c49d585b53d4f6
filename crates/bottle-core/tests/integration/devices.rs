//! The device passthrough policy against fake `/dev` trees made with real
//! `mknod`, covering the design's cases D01–D07 and the alias rules.
//!
//! Creating device nodes needs CAP_MKNOD. Without it each test prints a skip
//! line, unless `BOTTLE_REQUIRE_MKNOD=1`, under which it fails instead.

#![expect(
    clippy::unwrap_used,
    reason = "fixture helpers shared by tests; a setup step that fails should panic"
)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use bottle_core::Coded;
use bottle_core::backend::BackendKind;
use bottle_core::devices::{
    AdminPolicy, BUILTIN_BLACKLIST, BlacklistSource, DeviceError, DeviceKind, DevicePolicy,
    LEFT_OUT_OF_DEFAULTS, ResolvedDevices, policy_file, unsupported_warning,
};
use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bottle_core::manifest::Agent;
use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

/// A temporary root with a `dev/` directory to populate.
struct FakeRoot {
    dir: tempfile::TempDir,
}

impl FakeRoot {
    /// `None` (after printing a skip line) when this process may not mknod.
    #[expect(clippy::print_stderr, reason = "a skipped test says why")]
    fn new(test: &str) -> Option<FakeRoot> {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("dev")).unwrap();
        let probe = dir.path().join("probe");
        match mknod(
            &probe,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(1, 3),
        ) {
            Ok(()) => {
                fs::remove_file(&probe).unwrap();
                let root = FakeRoot { dir };
                root.proc_devices(HOST_PROC_DEVICES);
                Some(root)
            }
            Err(Errno::EPERM) if std::env::var("BOTTLE_REQUIRE_MKNOD").as_deref() != Ok("1") => {
                eprintln!(
                    "skip {test}: mknod needs CAP_MKNOD (set BOTTLE_REQUIRE_MKNOD=1 to fail instead)"
                );
                None
            }
            Err(err) => panic!("mknod probe failed: {err}"),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the root's `/proc/devices`.
    fn proc_devices(&self, text: &str) -> &Self {
        fs::write(self.at("/proc/devices"), text).unwrap();
        self
    }

    fn at(&self, path: &str) -> PathBuf {
        let path = self.root().join(path.trim_start_matches('/'));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        path
    }

    fn node(&self, path: &str, kind: SFlag, major: u64, minor: u64) -> &Self {
        mknod(
            &self.at(path),
            kind,
            Mode::from_bits_truncate(0o660),
            makedev(major, minor),
        )
        .unwrap();
        self
    }

    fn chr(&self, path: &str, major: u64, minor: u64) -> &Self {
        self.node(path, SFlag::S_IFCHR, major, minor)
    }

    fn blk(&self, path: &str, major: u64, minor: u64) -> &Self {
        self.node(path, SFlag::S_IFBLK, major, minor)
    }

    fn link(&self, path: &str, target: &str) -> &Self {
        symlink(target, self.at(path)).unwrap();
        self
    }

    fn file(&self, path: &str) -> &Self {
        fs::write(self.at(path), b"not a device").unwrap();
        self
    }

    /// The NVIDIA nodes of a one-GPU host.
    fn nvidia(&self) -> &Self {
        self.chr("/dev/nvidia0", 195, 0)
            .chr("/dev/nvidiactl", 195, 255)
            .chr("/dev/nvidia-modeset", 195, 254)
            .chr("/dev/nvidia-uvm", 508, 0)
            .chr("/dev/nvidia-uvm-tools", 508, 1)
            .chr("/dev/nvidia-caps/nvidia-cap1", 511, 1)
            .chr("/dev/nvidia-caps/nvidia-cap2", 511, 2)
    }

    /// The nodes the built-in blacklist is about.
    fn dangerous(&self) -> &Self {
        self.chr("/dev/mem", 1, 1)
            .chr("/dev/kmem", 1, 2)
            .chr("/dev/port", 1, 4)
            .chr("/dev/pts/0", 136, 0)
            .chr("/dev/pts/1", 136, 1)
            .chr("/dev/pts/ptmx", 5, 2)
            .blk("/dev/sda", 8, 0)
            .blk("/dev/nvme0n1", 259, 0)
            .blk("/dev/loop0", 7, 0)
    }
}

/// The `/proc/devices` every fake root starts with: a virtual machine's, with
/// the SCSI disk majors, device-mapper and virtio-blk on dynamic majors, and
/// NVMe namespaces on the extended major.
const HOST_PROC_DEVICES: &str = "Character devices:
  1 mem
  4 tty
  5 /dev/tty
 13 input
136 pts
195 nvidia-frontend
508 nvidia-uvm
511 nvidia-caps

Block devices:
  7 loop
  8 sd
 65 sd
252 device-mapper
254 virtblk
259 blkext
";

const MANIFEST: &str = "/work/bottle.toml";

/// An agent as the manifest would give it.
fn agent(devices: Option<&[&str]>, blacklist: &[&str]) -> Agent {
    let mut text = String::from("image = \"agent:latest\"\n");
    if let Some(devices) = devices {
        text.push_str(&format!("devices = {devices:?}\n"));
    }
    text.push_str(&format!("devices_blacklist = {blacklist:?}\n"));
    toml::from_str(&text).unwrap()
}

fn policy(agent: &Agent, admin: &AdminPolicy) -> DevicePolicy {
    DevicePolicy::new(Path::new(MANIFEST), "claude", agent, admin).unwrap()
}

fn resolve(
    root: &FakeRoot,
    devices: Option<&[&str]>,
    blacklist: &[&str],
    admin: &AdminPolicy,
    kernel: Option<(u32, u32)>,
) -> ResolvedDevices {
    policy(&agent(devices, blacklist), admin)
        .resolve(root.root(), kernel)
        .unwrap()
}

fn passed(resolved: &ResolvedDevices) -> Vec<&str> {
    resolved
        .passed
        .iter()
        .map(|d| d.container_path.as_str())
        .collect()
}

fn dropped(resolved: &ResolvedDevices) -> Vec<(&str, &str)> {
    resolved
        .dropped
        .iter()
        .map(|d| (d.path.as_str(), d.reason.as_str()))
        .collect()
}

fn admin_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    fs::write(&path, text).unwrap();
    (dir, path)
}

const NEW_KERNEL: Option<(u32, u32)> = Some((5, 10));
const OLD_KERNEL: Option<(u32, u32)> = Some((4, 19));

#[test]
fn d01_nvidia_defaults_pass_when_the_host_has_them() {
    let Some(root) = FakeRoot::new("d01") else {
        return;
    };
    root.nvidia().dangerous();
    let resolved = resolve(&root, None, &[], &AdminPolicy::builtin_only(), NEW_KERNEL);
    assert_eq!(
        passed(&resolved),
        [
            "/dev/nvidia-caps/nvidia-cap2",
            "/dev/nvidia-modeset",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia0",
            "/dev/nvidiactl",
        ]
    );
    // The MIG configuration capability is the one default node left out.
    assert_eq!(
        resolved
            .dropped
            .iter()
            .map(|d| d.path.as_str())
            .collect::<Vec<_>>(),
        ["/dev/nvidia-caps/nvidia-cap1"]
    );
    assert!(
        resolved.dropped[0].reason.contains("MIG configuration"),
        "{}",
        resolved.dropped[0].reason
    );
    assert!(resolved.warnings.is_empty(), "{:?}", resolved.warnings);
    let gpu = &resolved.passed[4];
    assert_eq!(gpu.host_path, root.root().join("dev/nvidia0"));
    assert_eq!((gpu.kind, gpu.major, gpu.minor), (DeviceKind::Char, 195, 0));
    assert_eq!(gpu.describe(root.root()), "/dev/nvidia0 (char 195:0)");
}

#[test]
fn d01_the_defaults_leave_out_mig_configuration_under_any_name_but_a_manifest_may_ask() {
    let Some(root) = FakeRoot::new("d01-mig") else {
        return;
    };
    // Two other names `/dev/nvidia*` matches: a link to the capability and
    // a node of its number.
    root.nvidia()
        .link("/dev/nvidia-mig-link", "nvidia-caps/nvidia-cap1")
        .chr("/dev/nvidia-mig-config", 511, 1);
    let resolved = resolve(&root, None, &[], &AdminPolicy::builtin_only(), NEW_KERNEL);
    let left_out: Vec<&str> = resolved.dropped.iter().map(|d| d.path.as_str()).collect();
    for name in [
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-mig-link",
        "/dev/nvidia-mig-config",
    ] {
        assert!(left_out.contains(&name), "{name} passed: {left_out:?}");
        assert!(!passed(&resolved).contains(&name));
    }
    assert!(passed(&resolved).contains(&"/dev/nvidia-caps/nvidia-cap2"));
    assert!(passed(&resolved).contains(&"/dev/nvidia0"));
    // The operator who lists it gets it: it is left out of the defaults,
    // not blacklisted.
    let asked = resolve(
        &root,
        Some(&["/dev/nvidia-caps/nvidia-cap1"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(passed(&asked), ["/dev/nvidia-caps/nvidia-cap1"]);
    assert!(asked.dropped.is_empty(), "{:?}", asked.dropped);
}

#[test]
fn d01_nvidia_defaults_on_a_host_without_gpus_are_empty_and_quiet() {
    let Some(root) = FakeRoot::new("d01-none") else {
        return;
    };
    root.dangerous().chr("/dev/null", 1, 3);
    let resolved = resolve(&root, None, &[], &AdminPolicy::builtin_only(), NEW_KERNEL);
    assert_eq!(resolved, ResolvedDevices::default());
}

#[test]
fn d02_a_directory_request_exposes_the_nodes_in_it() {
    let Some(root) = FakeRoot::new("d02") else {
        return;
    };
    root.chr("/dev/snd/controlC0", 116, 0)
        .chr("/dev/snd/pcmC0D0p", 116, 16)
        .link("/dev/snd/by-path/pci-0000:00:1f.3", "../controlC0");
    let resolved = resolve(
        &root,
        Some(&["/dev/snd"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(
        passed(&resolved),
        [
            "/dev/snd/by-path/pci-0000:00:1f.3",
            "/dev/snd/controlC0",
            "/dev/snd/pcmC0D0p"
        ]
    );
    let alias = &resolved.passed[0];
    assert_eq!(alias.host_path, root.root().join("dev/snd/controlC0"));
    assert_eq!(
        alias.describe(root.root()),
        "/dev/snd/by-path/pci-0000:00:1f.3 -> /dev/snd/controlC0 (char 116:0)"
    );
    assert!(resolved.warnings.is_empty());
}

#[test]
fn d03_an_empty_list_clears_the_defaults() {
    let Some(root) = FakeRoot::new("d03") else {
        return;
    };
    root.nvidia();
    let resolved = resolve(
        &root,
        Some(&[]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(resolved, ResolvedDevices::default());
}

#[test]
fn d04_pts_is_refused_on_an_old_kernel() {
    let Some(root) = FakeRoot::new("d04") else {
        return;
    };
    root.dangerous();
    for request in ["/dev/pts", "/dev/pts/*"] {
        let resolved = resolve(
            &root,
            Some(&[request]),
            &[],
            &AdminPolicy::builtin_only(),
            OLD_KERNEL,
        );
        assert!(
            resolved.passed.is_empty(),
            "{request}: {:?}",
            resolved.passed
        );
        let paths: Vec<&str> = dropped(&resolved).iter().map(|(p, _)| *p).collect();
        assert_eq!(
            paths,
            ["/dev/pts/0", "/dev/pts/1", "/dev/pts/ptmx"],
            "{request}"
        );
        for (path, reason) in dropped(&resolved) {
            assert_eq!(
                reason,
                "blacklisted by /dev/pts (built-in); an explicit request is kept only on kernel >= 5.4, this is 4.19",
                "{path}"
            );
        }
        assert_eq!(resolved.warnings.len(), 3, "one line per refused node");
        assert!(resolved.warnings[0].starts_with("device /dev/pts/0 is blacklisted, skipping: "));
    }
    // An unknown kernel is treated as old.
    let resolved = resolve(
        &root,
        Some(&["/dev/pts"]),
        &[],
        &AdminPolicy::builtin_only(),
        None,
    );
    assert!(resolved.passed.is_empty());
    assert!(resolved.dropped[0].reason.ends_with("this is unknown"));
}

#[test]
fn d05_globs_and_paths_matching_nothing_are_dropped_silently() {
    let Some(root) = FakeRoot::new("d05") else {
        return;
    };
    root.chr("/dev/null", 1, 3);
    let resolved = resolve(
        &root,
        Some(&[
            "/dev/nvidia*",
            "/dev/snd",
            "/dev/dri/renderD*",
            "/dev/nothing?",
        ]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(resolved, ResolvedDevices::default());
}

#[test]
fn d06_explicit_pts_on_a_new_kernel_is_kept_with_one_warning() {
    let Some(root) = FakeRoot::new("d06") else {
        return;
    };
    root.dangerous();
    let resolved = resolve(
        &root,
        Some(&["/dev/pts"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(
        passed(&resolved),
        ["/dev/pts/0", "/dev/pts/1", "/dev/pts/ptmx"]
    );
    assert!(resolved.dropped.is_empty());
    assert_eq!(resolved.warnings.len(), 1, "{:?}", resolved.warnings);
    let warning = &resolved.warnings[0];
    assert!(
        warning.starts_with(
            "device /dev/pts passed because the manifest asks for it (kernel 5.10 >= 5.4)"
        ),
        "{warning}"
    );
    assert!(warning.contains("/etc/bottle/policy.toml"), "{warning}");

    // Only the literal request counts: a glob that happens to reach
    // /dev/pts does not relax anything.
    let resolved = resolve(
        &root,
        Some(&["/dev/pt*"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert!(resolved.passed.is_empty(), "{:?}", resolved.passed);
    assert_eq!(resolved.dropped.len(), 3);

    // Nor do the defaults.
    let resolved = resolve(&root, None, &[], &AdminPolicy::builtin_only(), NEW_KERNEL);
    assert!(resolved.passed.is_empty());

    // An admin entry for /dev/pts refuses it whatever the kernel.
    let (_dir, file) = admin_file("devices_blacklist = [\"/dev/pts\"]\n");
    let admin = AdminPolicy::load(&file).unwrap();
    let resolved = resolve(&root, Some(&["/dev/pts"]), &[], &admin, NEW_KERNEL);
    assert!(resolved.passed.is_empty());
    let expected = format!("blacklisted by /dev/pts (admin policy {})", file.display());
    assert!(
        resolved.dropped.iter().all(|d| d.reason == expected),
        "{:?}",
        resolved.dropped
    );

    // So does the manifest's own blacklist.
    let resolved = resolve(
        &root,
        Some(&["/dev/pts/*"]),
        &["/dev/pts"],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert!(resolved.passed.is_empty());
    assert!(
        resolved
            .dropped
            .iter()
            .all(|d| d.reason == "blacklisted by /dev/pts (manifest devices_blacklist)")
    );
}

#[test]
fn d07_backends_without_passthrough_say_so_once() {
    let Some(root) = FakeRoot::new("d07") else {
        return;
    };
    root.nvidia();
    let resolved = resolve(
        &root,
        Some(&[
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        ]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(
        unsupported_warning(BackendKind::Smolmachines, &resolved).as_deref(),
        Some(
            "the smolmachines backend does not support device passthrough: starting without 4 device nodes (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm and 1 more); use --backend docker to pass them, or set devices = [] to silence this"
        )
    );
    assert_eq!(
        unsupported_warning(BackendKind::Smolmachines, &ResolvedDevices::default()),
        None
    );
}

#[test]
fn the_manifest_blacklist_adds_entries() {
    let Some(root) = FakeRoot::new("user-blacklist") else {
        return;
    };
    root.nvidia();
    let resolved = resolve(
        &root,
        None,
        &["/dev/nvidia-uvm*"],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert!(
        !passed(&resolved)
            .iter()
            .any(|p| p.starts_with("/dev/nvidia-uvm"))
    );
    assert_eq!(
        dropped(&resolved),
        [
            ("/dev/nvidia-caps/nvidia-cap1", LEFT_OUT_OF_DEFAULTS[0].1),
            (
                "/dev/nvidia-uvm",
                "blacklisted by /dev/nvidia-uvm* (manifest devices_blacklist)"
            ),
            (
                "/dev/nvidia-uvm-tools",
                "blacklisted by /dev/nvidia-uvm* (manifest devices_blacklist)"
            ),
        ]
    );
    assert_eq!(resolved.warnings.len(), 2);
}

#[test]
fn the_merged_blacklist_keeps_every_builtin_and_admin_entry() {
    let (_dir, file) =
        admin_file("# site policy\ndevices_blacklist = [\"/dev/nvidia-modeset\", \"/dev//fb*\"]\n");
    let admin = AdminPolicy::load(&file).unwrap();
    assert_eq!(admin.devices_blacklist, ["/dev/nvidia-modeset", "/dev/fb*"]);
    // The manifest has no way to remove an entry: whatever it lists is
    // appended after the built-in and admin entries.
    let policy = policy(&agent(None, &["/dev/snd"]), &admin);
    let merged: Vec<(&str, &BlacklistSource)> = policy
        .blacklist()
        .iter()
        .map(|e| (e.pattern.as_str(), &e.source))
        .collect();
    let builtin = BUILTIN_BLACKLIST.len();
    assert_eq!(merged.len(), builtin + 3);
    for (entry, pattern) in merged.iter().zip(BUILTIN_BLACKLIST) {
        assert_eq!(*entry, (*pattern, &BlacklistSource::BuiltIn));
    }
    let admin_source = BlacklistSource::Admin(file.clone());
    assert_eq!(
        merged[builtin..],
        [
            ("/dev/nvidia-modeset", &admin_source),
            ("/dev/fb*", &admin_source),
            ("/dev/snd", &BlacklistSource::Manifest),
        ]
    );

    let Some(root) = FakeRoot::new("admin-blacklist") else {
        return;
    };
    root.nvidia();
    let resolved = policy.resolve(root.root(), NEW_KERNEL).unwrap();
    assert!(!passed(&resolved).contains(&"/dev/nvidia-modeset"));
    assert_eq!(
        dropped(&resolved),
        [
            ("/dev/nvidia-caps/nvidia-cap1", LEFT_OUT_OF_DEFAULTS[0].1),
            (
                "/dev/nvidia-modeset",
                format!(
                    "blacklisted by /dev/nvidia-modeset (admin policy {})",
                    file.display()
                )
                .as_str()
            )
        ]
    );
}

#[test]
fn a_symlink_to_a_blacklisted_node_is_refused() {
    let Some(root) = FakeRoot::new("symlink-alias") else {
        return;
    };
    root.dangerous()
        .link("/dev/foo", "mem")
        .link("/dev/bar", "/dev/mem")
        .link("/dev/baz", "../../../../dev/./foo")
        .link("/dev/gpu/by-name/disk", "/dev/sda");
    let resolved = resolve(
        &root,
        Some(&["/dev/foo", "/dev/bar", "/dev/baz", "/dev/gpu"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert!(resolved.passed.is_empty(), "{:?}", resolved.passed);
    assert_eq!(
        dropped(&resolved),
        [
            (
                "/dev/foo",
                "resolves to /dev/mem, blacklisted by /dev/mem (built-in)"
            ),
            (
                "/dev/bar",
                "resolves to /dev/mem, blacklisted by /dev/mem (built-in)"
            ),
            (
                "/dev/baz",
                "resolves to /dev/mem, blacklisted by /dev/mem (built-in)"
            ),
            (
                "/dev/gpu/by-name/disk",
                "resolves to /dev/sda, blacklisted by /dev/sd* (built-in)"
            ),
        ]
    );
    assert_eq!(resolved.warnings.len(), 4);
    assert_eq!(
        resolved.warnings[0],
        "device /dev/foo is blacklisted, skipping: resolves to /dev/mem, blacklisted by /dev/mem (built-in)"
    );
}

#[test]
fn a_node_with_a_blacklisted_device_number_is_refused() {
    let Some(root) = FakeRoot::new("mknod-alias") else {
        return;
    };
    root.dangerous()
        .chr("/dev/mymem", 1, 1)
        .blk("/dev/scratch", 259, 0)
        .blk("/dev/ok-block", 1, 1)
        .chr("/dev/console-ish", 136, 7);
    let resolved = resolve(
        &root,
        Some(&[
            "/dev/mymem",
            "/dev/scratch",
            "/dev/ok-block",
            "/dev/console-ish",
        ]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    // Block 1:1 is a RAM disk, not /dev/mem: kind is part of the identity.
    assert_eq!(passed(&resolved), ["/dev/ok-block"]);
    assert_eq!(
        dropped(&resolved),
        [
            (
                "/dev/mymem",
                "same device (char 1:1) as /dev/mem, blacklisted by /dev/mem (built-in)"
            ),
            (
                "/dev/scratch",
                "same device (block 259:0) as /dev/nvme0n1, blacklisted by /dev/nvme* (built-in)"
            ),
            (
                "/dev/console-ish",
                "same device (char 136:7) as /dev/pts, blacklisted by /dev/pts (built-in)"
            ),
        ]
    );
}

#[test]
fn well_known_device_numbers_are_refused_even_without_the_original_node() {
    let Some(root) = FakeRoot::new("fixed-numbers") else {
        return;
    };
    root.chr("/dev/mymem", 1, 1)
        .chr("/dev/myport", 1, 4)
        .blk("/dev/mydisk", 8, 1);
    let resolved = resolve(
        &root,
        Some(&["/dev/my*"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert!(resolved.passed.is_empty());
    assert_eq!(
        dropped(&resolved),
        [
            (
                "/dev/mydisk",
                "same device (block 8:1) as /dev/sd*, blacklisted by /dev/sd* (built-in)"
            ),
            (
                "/dev/mymem",
                "same device (char 1:1) as /dev/mem, blacklisted by /dev/mem (built-in)"
            ),
            (
                "/dev/myport",
                "same device (char 1:4) as /dev/port, blacklisted by /dev/port (built-in)"
            ),
        ]
    );
}

#[test]
fn block_nodes_on_a_blacklisted_disk_driver_are_refused_whatever_their_number() {
    let Some(root) = FakeRoot::new("disk-drivers") else {
        return;
    };
    // No /dev node carries any of these numbers: only the driver that owns
    // the major, in /proc/devices, says they are disks.
    root.blk("/dev/innocent", 8, 200)
        .blk("/dev/namespace", 259, 77)
        .blk("/dev/volume", 252, 3)
        .blk("/dev/virtual", 254, 16)
        .blk("/dev/unowned", 240, 1)
        .chr("/dev/gpu", 195, 0);
    let resolved = resolve(
        &root,
        Some(&[
            "/dev/innocent",
            "/dev/namespace",
            "/dev/volume",
            "/dev/virtual",
            "/dev/unowned",
            "/dev/gpu",
        ]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(passed(&resolved), ["/dev/unowned", "/dev/gpu"]);
    let reasons = dropped(&resolved);
    assert_eq!(reasons[0].0, "/dev/innocent");
    assert_eq!(
        reasons[1..],
        [
            (
                "/dev/namespace",
                "block major 259 belongs to the blkext driver (/proc/devices), blacklisted by /dev/nvme* (built-in)"
            ),
            (
                "/dev/volume",
                "block major 252 belongs to the device-mapper driver (/proc/devices), blacklisted by /dev/dm-* (built-in)"
            ),
            (
                "/dev/virtual",
                "block major 254 belongs to the virtblk driver (/proc/devices), blacklisted by /dev/vd* (built-in)"
            ),
        ]
    );
    assert_eq!(resolved.warnings.len(), 4, "{:?}", resolved.warnings);
}

#[test]
fn block_nodes_are_refused_when_proc_devices_cannot_be_read() {
    let Some(root) = FakeRoot::new("no-proc-devices") else {
        return;
    };
    root.blk("/dev/unowned", 240, 1).chr("/dev/gpu", 195, 0);
    let request: &[&str] = &["/dev/unowned", "/dev/gpu"];
    for (case, proc_devices) in [
        (
            "without a block section",
            Some("Character devices:\n195 nvidia\n"),
        ),
        ("garbled", Some("Block devices:\n  8 sd\nnot a line\n")),
        ("missing", None),
    ] {
        match proc_devices {
            Some(text) => {
                root.proc_devices(text);
            }
            None => fs::remove_file(root.root().join("proc/devices")).unwrap(),
        }
        let resolved = resolve(
            &root,
            Some(request),
            &[],
            &AdminPolicy::builtin_only(),
            NEW_KERNEL,
        );
        assert_eq!(passed(&resolved), ["/dev/gpu"], "{case}");
        let reasons = dropped(&resolved);
        assert_eq!(reasons.len(), 1, "{case}: {reasons:?}");
        assert_eq!(reasons[0].0, "/dev/unowned", "{case}");
        assert!(
            reasons[0].1.starts_with(
                "cannot tell which driver owns block major 240, so no block device is passed: "
            ),
            "{case}: {}",
            reasons[0].1
        );
        assert_eq!(
            resolved.warnings.len(),
            1,
            "{case}: {:?}",
            resolved.warnings
        );
    }
}

#[test]
fn things_that_are_not_device_nodes_are_dropped_with_a_reason() {
    let Some(root) = FakeRoot::new("not-a-device") else {
        return;
    };
    root.file("/dev/notes")
        .file("/etc/shadow")
        .link("/dev/shadow", "/etc/shadow")
        .link("/dev/dangling", "nowhere")
        .link("/dev/loopy", "loopy")
        .link("/dev/cycle", "cycle")
        .chr("/dev/null", 1, 3);
    fs::create_dir_all(root.root().join("dev/emptydir")).unwrap();
    let resolved = resolve(
        &root,
        Some(&[
            "/dev/notes",
            "/dev/shadow",
            "/dev/dangling",
            "/dev/loopy",
            "/dev/emptydir",
            "/dev/null",
        ]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    assert_eq!(passed(&resolved), ["/dev/null"]);
    let reasons = dropped(&resolved);
    assert_eq!(
        reasons[0],
        ("/dev/notes", "not a device node (regular file)")
    );
    assert_eq!(
        reasons[1],
        ("/dev/shadow", "resolves to /etc/shadow, outside /dev")
    );
    assert_eq!(reasons[2].0, "/dev/dangling");
    assert!(
        reasons[2].1.starts_with("cannot be resolved: "),
        "{}",
        reasons[2].1
    );
    assert_eq!(
        reasons[3],
        ("/dev/loopy", "blacklisted by /dev/loop* (built-in)")
    );
    assert_eq!(reasons.len(), 4, "an empty directory has no nodes to drop");
    assert!(
        resolved.warnings.len() == 1,
        "only the blacklist hit warns: {:?}",
        resolved.warnings
    );
}

#[test]
fn a_missing_admin_file_means_builtins_only() {
    let dir = tempfile::tempdir().unwrap();
    let admin = AdminPolicy::load(&dir.path().join("absent.toml")).unwrap();
    assert_eq!(admin, AdminPolicy::builtin_only());
    let policy = policy(&agent(Some(&["/dev/mem"]), &[]), &admin);
    assert_eq!(policy.blacklist().len(), BUILTIN_BLACKLIST.len());

    let Some(root) = FakeRoot::new("missing-admin") else {
        return;
    };
    root.dangerous();
    let resolved = policy.resolve(root.root(), NEW_KERNEL).unwrap();
    assert_eq!(
        dropped(&resolved),
        [("/dev/mem", "blacklisted by /dev/mem (built-in)")]
    );
}

#[test]
fn an_invalid_admin_file_is_an_error_naming_the_file_and_field() {
    let cases = [
        (
            "devices_blacklist = \"/dev/sd*\"\n",
            "BOT-V002",
            ":1:21: devices_blacklist: invalid type",
        ),
        (
            "devices_blacklst = []\n",
            "BOT-V002",
            ":1:1: devices_blacklst: unknown field `devices_blacklst`",
        ),
        ("devices_blacklist = [\n", "BOT-V002", ""),
        (
            "devices_blacklist = [\"/dev/fb*\", \"/etc/passwd\"]\n",
            "BOT-V003",
            ": devices_blacklist[1] (line 1): \"/etc/passwd\" is not under /dev/",
        ),
        (
            "devices_blacklist = [\"/dev/../etc\"]\n",
            "BOT-V003",
            "contains a . or .. component",
        ),
    ];
    for (text, code, fragment) in cases {
        let (_dir, file) = admin_file(text);
        let err = AdminPolicy::load(&file).unwrap_err();
        assert_eq!(err.code(), code, "{text}: {err}");
        let message = err.to_string();
        assert!(
            message.starts_with(&file.display().to_string()),
            "{message}"
        );
        assert!(message.contains(fragment), "{text}: {message}");
        assert!(!message.contains("fix:"), "{message}");
        assert!(err.fix().is_some_and(|fix| !fix.is_empty()), "{message}");
    }
}

#[test]
fn an_unreadable_admin_file_is_an_error() {
    // A directory where the file should be: readable by no one, root
    // included.
    let dir = tempfile::tempdir().unwrap();
    let err = AdminPolicy::load(dir.path()).unwrap_err();
    assert_eq!(err.code(), "BOT-V001");
    assert!(matches!(err, DeviceError::PolicyUnreadable { .. }));
    assert!(err.to_string().starts_with(&format!(
        "{}: cannot read the admin device policy",
        dir.path().display()
    )));
}

#[test]
fn bad_device_entries_are_errors() {
    let admin = AdminPolicy::builtin_only();
    let cases: [(&[&str], &[&str], &str, &str); 5] = [
        (
            &["/dev/*"],
            &[],
            "BOT-V005",
            "agents.claude.devices[0]: \"/dev/*\" would expose all of /dev",
        ),
        (
            &["/dev/nvidia0", "/dev/**"],
            &[],
            "BOT-V005",
            "agents.claude.devices[1]",
        ),
        (
            &["/dev/../etc/shadow"],
            &[],
            "BOT-V004",
            "contains a . or .. component",
        ),
        (&["/dev/[nvidia"], &[], "BOT-V004", "is not a valid glob"),
        (
            &[],
            &["/sys/class"],
            "BOT-V003",
            "agents.claude.devices_blacklist[0]: \"/sys/class\" is not under /dev/",
        ),
    ];
    for (devices, blacklist, code, fragment) in cases {
        let err = DevicePolicy::new(
            Path::new(MANIFEST),
            "claude",
            &agent(Some(devices), blacklist),
            &admin,
        )
        .unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        let message = err.to_string();
        assert!(message.starts_with(MANIFEST), "{message}");
        assert!(message.contains(fragment), "{message}");
    }
}

/// Set in the unprivileged child of the test below: the root to resolve.
const CHILD_ROOT_ENV: &str = "BOTTLE_DEVICES_TEST_UNPRIVILEGED_ROOT";

#[test]
fn an_unreadable_blacklist_fails_closed_only_when_something_would_pass() {
    if let Ok(root) = std::env::var(CHILD_ROOT_ENV) {
        // The child runs as nobody, so the root-owned 0700 /dev/input, which
        // the built-in blacklist covers, cannot be listed: an alias of a node
        // in it could go unnoticed.
        let admin = AdminPolicy::builtin_only();
        let err = policy(&agent(Some(&["/dev/nvidia0"]), &[]), &admin)
            .resolve(Path::new(&root), NEW_KERNEL)
            .unwrap_err();
        assert_eq!(err.code(), "BOT-V006", "{err}");
        assert!(
            err.to_string().starts_with(&format!(
                "{root}/dev/input: cannot check the device blacklist"
            )),
            "{err}"
        );
        // With nothing to pass there is nothing to protect.
        let resolved = policy(&agent(Some(&["/dev/absent"]), &[]), &admin)
            .resolve(Path::new(&root), NEW_KERNEL)
            .unwrap();
        assert_eq!(resolved, ResolvedDevices::default());
        println!("unprivileged child checked");
        return;
    }
    let Some(root) = FakeRoot::new("unreadable-blacklist") else {
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skip unreadable-blacklist: needs root to run a child as nobody");
        return;
    }
    root.nvidia().chr("/dev/input/event0", 13, 64);
    let mode = |path: &Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
    };
    mode(root.root(), 0o755);
    mode(&root.root().join("dev"), 0o755);
    mode(&root.root().join("dev/input"), 0o700);

    // The path inside the integration-test binary (`tests/integration/main.rs`).
    let test = "devices::an_unreadable_blacklist_fails_closed_only_when_something_would_pass";
    let spec = CommandSpec::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ROOT_ENV, root.root());
    let output = match SystemRunner.run(&spec) {
        Ok(output) => output,
        Err(err)
            if err.kind() == std::io::ErrorKind::NotFound
                && std::env::var("BOTTLE_REQUIRE_MKNOD").as_deref() != Ok("1") =>
        {
            eprintln!("skip unreadable-blacklist: setpriv (util-linux) is not installed");
            return;
        }
        Err(err) => panic!("cannot run setpriv: {err}"),
    };
    assert!(
        output.success() && output.stdout_text().contains("unprivileged child checked"),
        "child failed:\n{}\n{}",
        output.stdout_text(),
        output.stderr_text()
    );
}

#[test]
fn duplicates_across_requests_are_passed_once() {
    let Some(root) = FakeRoot::new("duplicates") else {
        return;
    };
    root.nvidia();
    let resolved = resolve(
        &root,
        Some(&["/dev/nvidia0", "/dev/nvidia*", "/dev/nvidia0"]),
        &[],
        &AdminPolicy::builtin_only(),
        NEW_KERNEL,
    );
    let paths = passed(&resolved);
    assert_eq!(paths.iter().filter(|p| **p == "/dev/nvidia0").count(), 1);
    assert_eq!(paths[0], "/dev/nvidia0", "request order is kept");
}

#[test]
fn the_policy_file_comes_from_the_environment_or_the_default() {
    assert_eq!(policy_file(|_| None), Path::new("/etc/bottle/policy.toml"));
    assert_eq!(
        policy_file(|key| (key == "BOTTLE_POLICY_FILE").then(String::new)),
        Path::new("/etc/bottle/policy.toml"),
        "an empty value is unset"
    );
    assert_eq!(
        policy_file(|key| (key == "BOTTLE_POLICY_FILE").then(|| "/srv/policy.toml".to_string())),
        Path::new("/srv/policy.toml")
    );
}
