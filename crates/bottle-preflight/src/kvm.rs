//! The KVM checks the smolmachines backend needs on Linux: the `/dev/kvm`
//! device, this user's access to it, the vendor kernel module, a CPU that
//! exposes hardware virtualisation, and a device the `kvm` group may open.
//!
//! Remediation is specific to what was found: the CPU vendor (from
//! `/proc/cpuinfo`), the `kvm` group and the user's membership (from
//! `/etc/group` and `/etc/passwd`), the device's owner and mode, and whether
//! the host is NixOS (where the fix is configuration, not commands).

use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

use bottle_core::BackendKind;
use nix::errno::Errno;
use nix::unistd::AccessFlags;

use crate::check::{Check, Status};
use crate::error::PreflightError;
use crate::host::{Context, HostRoot, Identity, Platform, exists, read_optional};

/// Stable id of the device check.
pub const DEVICE_ID: &str = "kvm.device";
/// Stable id of the access check.
pub const ACCESS_ID: &str = "kvm.access";
/// Stable id of the kernel module check.
pub const MODULE_ID: &str = "kvm.module";
/// Stable id of the hardware virtualisation check.
pub const CPU_ID: &str = "kvm.cpu";
/// Stable id of the `kvm` group check.
pub const GROUP_ID: &str = "kvm.group";

/// The KVM device node.
pub const DEVICE: &str = "/dev/kvm";
/// The vendor modules that provide KVM on x86.
pub const VENDOR_MODULES: [&str; 2] = ["kvm_intel", "kvm_amd"];

pub(crate) const DEVICE_TITLE: &str = "kvm device";
pub(crate) const ACCESS_TITLE: &str = "kvm access";
pub(crate) const MODULE_TITLE: &str = "kvm module";
pub(crate) const CPU_TITLE: &str = "kvm cpu";
pub(crate) const GROUP_TITLE: &str = "kvm group";
const ONLY_SMOLVM: &str = "only the smolmachines backend needs kvm";
const UDEV_RULE: &str = r#"KERNEL=="kvm", GROUP="kvm", MODE="0660""#;

/// Checks that `/dev/kvm` exists and is a character device.
pub fn check_device(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    if let Some(skip) = skip_off_linux(ctx, DEVICE_ID, DEVICE_TITLE) {
        return Ok(skip);
    }
    let path = ctx.root.join(DEVICE);
    let check = match std::fs::metadata(&path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Check::new(
            DEVICE_ID,
            DEVICE_TITLE,
            Status::Fail,
            format!("no {DEVICE}: kvm is not available on this host"),
        )
        .with_remediation(module_remediation(&ctx.root)?),
        Err(source) => return Err(PreflightError::Inspect { path, source }),
        Ok(meta) if meta.file_type().is_char_device() => {
            let rdev = meta.rdev();
            Check::new(
                DEVICE_ID,
                DEVICE_TITLE,
                Status::Ok,
                format!(
                    "{DEVICE} is a character device ({}:{})",
                    nix::sys::stat::major(rdev),
                    nix::sys::stat::minor(rdev)
                ),
            )
        }
        Ok(meta) => Check::new(
            DEVICE_ID,
            DEVICE_TITLE,
            Status::Fail,
            format!(
                "{DEVICE} exists but is a {}, not a character device",
                file_kind(&meta.file_type())
            ),
        )
        .with_remediation(format!(
            "{DEVICE} should be the kvm character device (10:232): remove what is there and reload the kvm module, or reboot"
        )),
    };
    Ok(check.soften(ctx.backend == BackendKind::Smolmachines, ONLY_SMOLVM))
}

/// Checks that this process may read and write `/dev/kvm`, and explains how
/// to get access (group membership, re-login, udev rule, NixOS config) when
/// it may not.
pub fn check_access(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    if let Some(skip) = skip_off_linux(ctx, ACCESS_ID, ACCESS_TITLE) {
        return Ok(skip);
    }
    let path = ctx.root.join(DEVICE);
    let check = match nix::unistd::access(&path, AccessFlags::R_OK | AccessFlags::W_OK) {
        Ok(()) => Check::new(
            ACCESS_ID,
            ACCESS_TITLE,
            Status::Ok,
            format!("this user can read and write {DEVICE}"),
        ),
        Err(Errno::ENOENT) => {
            return Ok(Check::new(
                ACCESS_ID,
                ACCESS_TITLE,
                Status::Skip,
                format!("no {DEVICE} to open (see {DEVICE_ID})"),
            ));
        }
        Err(Errno::EACCES | Errno::EPERM) => {
            let users = read_users(&ctx.root)?;
            let user = users.passwd_by_uid(ctx.identity.uid);
            let who = match user {
                Some(user) => format!("user {} (uid {})", user.name, ctx.identity.uid),
                None => format!("uid {}", ctx.identity.uid),
            };
            let device = std::fs::metadata(&path)
                .map(|meta| DeviceOwner {
                    gid: meta.gid(),
                    mode: meta.mode() & 0o7777,
                })
                .map_err(|source| PreflightError::Inspect {
                    path: path.clone(),
                    source,
                })?;
            let nixos = exists(&ctx.root, "/etc/NIXOS")?;
            Check::new(
                ACCESS_ID,
                ACCESS_TITLE,
                Status::Fail,
                format!("{who} cannot read and write {DEVICE}"),
            )
            .with_remediation(access_remediation(&users, &ctx.identity, device, nixos))
        }
        Err(errno) => {
            return Err(PreflightError::Inspect {
                path,
                source: io::Error::from(errno),
            });
        }
    };
    Ok(check.soften(ctx.backend == BackendKind::Smolmachines, ONLY_SMOLVM))
}

/// Checks that a KVM vendor module (`kvm_intel`, `kvm_amd`) is loaded.
pub fn check_module(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    if let Some(skip) = skip_off_linux(ctx, MODULE_ID, MODULE_TITLE) {
        return Ok(skip);
    }
    let root = &ctx.root;
    let listed = read_optional(root, "/proc/modules")?
        .map(|text| parse_proc_modules(&text))
        .unwrap_or_default();
    let check = if let Some(module) = VENDOR_MODULES
        .into_iter()
        .find(|vendor| listed.iter().any(|name| name == vendor))
    {
        Check::new(
            MODULE_ID,
            MODULE_TITLE,
            Status::Ok,
            format!("{module} is loaded"),
        )
    } else if let Some(module) = first_existing(root, VENDOR_MODULES.map(sys_module))? {
        // Listed under /sys/module but not in /proc/modules: built in.
        Check::new(
            MODULE_ID,
            MODULE_TITLE,
            Status::Ok,
            format!("{} is built into the kernel", module_name(&module)),
        )
    } else if exists(root, DEVICE)? {
        let others = other_kvm_providers(root, &listed)?;
        let by = if others.is_empty() {
            "kvm is built into the kernel".to_owned()
        } else {
            format!("kvm is provided by {}", others.join(", "))
        };
        Check::new(
            MODULE_ID,
            MODULE_TITLE,
            Status::Ok,
            format!("neither kvm_intel nor kvm_amd is loaded, but {DEVICE} exists: {by}"),
        )
    } else {
        Check::new(
            MODULE_ID,
            MODULE_TITLE,
            Status::Fail,
            "neither kvm_intel nor kvm_amd is loaded".to_owned(),
        )
        .with_remediation(module_remediation(root)?)
    };
    Ok(check.soften(ctx.backend == BackendKind::Smolmachines, ONLY_SMOLVM))
}

/// Checks that the CPU exposes hardware virtualisation (`vmx` or `svm` in
/// `/proc/cpuinfo`) where `/dev/kvm` exists.
///
/// Without it `/dev/kvm` is emulated or nested in software (page-table
/// based nested KVM): it opens and small guests run, but libkrun guests die
/// with `KVM_EXIT_INTERNAL_ERROR` seconds into boot. This check, not the
/// guest smoke test, is the verdict.
pub fn check_cpu(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    if let Some(skip) = skip_off_linux(ctx, CPU_ID, CPU_TITLE) {
        return Ok(skip);
    }
    if !exists(&ctx.root, DEVICE)? {
        return Ok(Check::new(
            CPU_ID,
            CPU_TITLE,
            Status::Skip,
            format!("no {DEVICE} (see {DEVICE_ID})"),
        ));
    }
    let cpu = read_optional(&ctx.root, "/proc/cpuinfo")?
        .map(|text| parse_cpuinfo(&text))
        .unwrap_or_default();
    let check = match cpu.virtualisation {
        Some(true) => Check::new(
            CPU_ID,
            CPU_TITLE,
            Status::Ok,
            "the cpu exposes hardware virtualisation (vmx or svm)".to_owned(),
        ),
        Some(false) => Check::new(
            CPU_ID,
            CPU_TITLE,
            Status::Fail,
            format!(
                "{DEVICE} exists but the cpu has no vmx or svm flag: kvm here is emulated or nested without hardware virtualisation, and microVM guests cannot run on it"
            ),
        )
        .with_remediation(
            "run microVM bottles on a host whose CPU exposes VT-x or AMD-V (on a VM, enable nested virtualisation on its host so the guest sees vmx or svm), or use the docker backend (`--backend docker`)",
        ),
        None => Check::new(
            CPU_ID,
            CPU_TITLE,
            Status::Skip,
            "no x86 cpu flags in /proc/cpuinfo to check".to_owned(),
        ),
    };
    Ok(check.soften(ctx.backend == BackendKind::Smolmachines, ONLY_SMOLVM))
}

/// Checks that `/dev/kvm` belongs to the `kvm` group with group read-write,
/// when bottle runs as root.
///
/// smolvm run as root drops each VM to its own uid keeping only the `kvm`
/// group (`drop_privileges` in smolvm's `src/process.rs`), so a root-only
/// device fails every `machine start` with EACCES although root can open
/// it. Run as another user, smolvm keeps that user's access, which
/// `kvm.access` checks.
pub fn check_group(ctx: &Context<'_>) -> Result<Check, PreflightError> {
    if let Some(skip) = skip_off_linux(ctx, GROUP_ID, GROUP_TITLE) {
        return Ok(skip);
    }
    if ctx.identity.uid != 0 {
        return Ok(Check::new(
            GROUP_ID,
            GROUP_TITLE,
            Status::Skip,
            format!("smolvm run as this user keeps its own access to {DEVICE} (see {ACCESS_ID})"),
        ));
    }
    let path = ctx.root.join(DEVICE);
    let meta = match std::fs::metadata(&path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Ok(Check::new(
                GROUP_ID,
                GROUP_TITLE,
                Status::Skip,
                format!("no {DEVICE} (see {DEVICE_ID})"),
            ));
        }
        Err(source) => return Err(PreflightError::Inspect { path, source }),
    };
    let users = read_users(&ctx.root)?;
    let device = DeviceOwner {
        gid: meta.gid(),
        mode: meta.mode() & 0o7777,
    };
    let kvm = users.group_by_name("kvm");
    let check = if kvm.is_some_and(|kvm| kvm.gid == device.gid) && device.mode & 0o060 == 0o060 {
        Check::new(
            GROUP_ID,
            GROUP_TITLE,
            Status::Ok,
            format!("{DEVICE} is read-write for the kvm group"),
        )
    } else {
        let owner = users
            .groups
            .iter()
            .find(|group| group.gid == device.gid)
            .map_or_else(|| format!("gid {}", device.gid), |group| group.name.clone());
        Check::new(
            GROUP_ID,
            GROUP_TITLE,
            Status::Fail,
            format!(
                "{DEVICE} belongs to group {owner} with mode {:04o}: smolvm run as root drops each VM to its own uid keeping only the kvm group, so every machine start fails with EACCES",
                device.mode
            ),
        )
        .with_remediation(group_remediation(kvm.is_some(), exists(&ctx.root, "/etc/NIXOS")?))
    };
    Ok(check.soften(ctx.backend == BackendKind::Smolmachines, ONLY_SMOLVM))
}

/// How to give the `kvm` group read-write access to `/dev/kvm` for good.
fn group_remediation(has_kvm_group: bool, nixos: bool) -> String {
    if nixos {
        return format!(
            "add to /etc/nixos/configuration.nix:\n  services.udev.extraRules = ''{UDEV_RULE}'';\nthen run `sudo nixos-rebuild switch`"
        );
    }
    let create = if has_kvm_group {
        ""
    } else {
        "create the group (`sudo groupadd --system kvm`), then "
    };
    format!(
        "{create}add the udev rule `{UDEV_RULE}` (e.g. in /etc/udev/rules.d/65-kvm.rules) and run `sudo udevadm trigger`; until the next boot, `sudo chgrp kvm {DEVICE} && sudo chmod 660 {DEVICE}` does the same"
    )
}

fn skip_off_linux(ctx: &Context<'_>, id: &'static str, title: &'static str) -> Option<Check> {
    let message = match ctx.platform() {
        Platform::Linux => return None,
        Platform::MacOs => "not needed on macos: smolvm uses Hypervisor.framework".to_owned(),
        Platform::Other => format!("kvm is only checked on linux, this is {}", ctx.os),
    };
    Some(Check::new(id, title, Status::Skip, message))
}

fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "regular file"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_fifo() {
        "fifo"
    } else {
        "special file"
    }
}

/// Module names from `/proc/modules` that are live (not loading or
/// unloading). Each line reads `name size refcount deps state address`.
pub fn parse_proc_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            match fields.nth(3) {
                Some("Live") | None => Some(name.to_owned()),
                Some(_) => None,
            }
        })
        .collect()
}

fn sys_module(name: &str) -> String {
    format!("/sys/module/{name}")
}

fn module_name(sys_path: &str) -> &str {
    sys_path.rsplit('/').next().unwrap_or(sys_path)
}

fn first_existing<const N: usize>(
    root: &HostRoot,
    paths: [String; N],
) -> Result<Option<String>, PreflightError> {
    for path in paths {
        if exists(root, &path)? {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// `kvm_*` modules other than the vendor ones (`kvm_pvm`), from
/// `/proc/modules` and `/sys/module`.
fn other_kvm_providers(root: &HostRoot, listed: &[String]) -> Result<Vec<String>, PreflightError> {
    let mut names: Vec<String> = listed.to_vec();
    let dir = root.join("/sys/module");
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|source| PreflightError::Read {
                    path: dir.clone(),
                    source,
                })?;
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(PreflightError::Read { path: dir, source }),
    }
    names.retain(|name| name.starts_with("kvm_") && !VENDOR_MODULES.contains(&name.as_str()));
    names.sort();
    names.dedup();
    Ok(names)
}

/// The CPU as far as KVM remediation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Cpu {
    vendor: Option<Vendor>,
    /// `Some(false)` when an x86 flags line lacks both `vmx` and `svm`.
    virtualisation: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vendor {
    Intel,
    Amd,
}

fn parse_cpuinfo(text: &str) -> Cpu {
    let mut cpu = Cpu::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "vendor_id" if cpu.vendor.is_none() => {
                cpu.vendor = match value.trim() {
                    "GenuineIntel" => Some(Vendor::Intel),
                    "AuthenticAMD" => Some(Vendor::Amd),
                    _ => None,
                };
            }
            "flags" if cpu.virtualisation.is_none() => {
                cpu.virtualisation = Some(
                    value
                        .split_whitespace()
                        .any(|flag| flag == "vmx" || flag == "svm"),
                );
            }
            _ => {}
        }
        if cpu.vendor.is_some() && cpu.virtualisation.is_some() {
            break;
        }
    }
    cpu
}

/// How to get a KVM module loaded, for this CPU and distribution.
fn module_remediation(root: &HostRoot) -> Result<String, PreflightError> {
    let cpu = read_optional(root, "/proc/cpuinfo")?
        .map(|text| parse_cpuinfo(&text))
        .unwrap_or_default();
    let nixos = exists(root, "/etc/NIXOS")?;
    let firmware = "enable virtualisation (VT-x / AMD-V) in the firmware, or nested virtualisation when this host is itself a VM";
    let mut text = String::new();
    if cpu.virtualisation == Some(false) {
        text.push_str(&format!(
            "this CPU does not advertise hardware virtualisation (no vmx or svm flag): {firmware}; then "
        ));
    }
    if nixos {
        let modules = match cpu.vendor {
            Some(Vendor::Intel) => r#"[ "kvm-intel" ];"#,
            Some(Vendor::Amd) => r#"[ "kvm-amd" ];"#,
            None => r#"[ "kvm-intel" ];  # "kvm-amd" on AMD CPUs"#,
        };
        text.push_str(&format!(
            "add to /etc/nixos/configuration.nix:\n  boot.kernelModules = {modules}\nthen run `sudo nixos-rebuild switch`"
        ));
    } else {
        let modprobe = match cpu.vendor {
            Some(Vendor::Intel) => "`sudo modprobe kvm_intel`".to_owned(),
            Some(Vendor::Amd) => "`sudo modprobe kvm_amd`".to_owned(),
            None => "`sudo modprobe kvm_intel` (Intel) or `sudo modprobe kvm_amd` (AMD)".to_owned(),
        };
        text.push_str(&format!("load the kvm module for this CPU: {modprobe}"));
    }
    if cpu.virtualisation != Some(false) {
        text.push_str(&format!("; if it will not load, {firmware}"));
    }
    Ok(text)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// The user and group databases, as far as they could be read.
#[derive(Debug, Clone, Default)]
struct Users {
    passwd: Vec<PasswdEntry>,
    groups: Vec<GroupEntry>,
}

impl Users {
    fn passwd_by_uid(&self, uid: u32) -> Option<&PasswdEntry> {
        self.passwd.iter().find(|entry| entry.uid == uid)
    }

    fn group_by_name(&self, name: &str) -> Option<&GroupEntry> {
        self.groups.iter().find(|entry| entry.name == name)
    }
}

fn read_users(root: &HostRoot) -> Result<Users, PreflightError> {
    Ok(Users {
        passwd: read_optional(root, "/etc/passwd")?
            .map(|text| parse_passwd(&text))
            .unwrap_or_default(),
        groups: read_optional(root, "/etc/group")?
            .map(|text| parse_group(&text))
            .unwrap_or_default(),
    })
}

/// `name:password:uid:gid:gecos:home:shell` lines; malformed ones are skipped.
fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            Some(PasswdEntry {
                name: (*fields.first()?).to_owned(),
                uid: fields.get(2)?.parse().ok()?,
                gid: fields.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// `name:password:gid:member,member` lines; malformed ones are skipped.
fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            Some(GroupEntry {
                name: (*fields.first()?).to_owned(),
                gid: fields.get(2)?.parse().ok()?,
                members: fields
                    .get(3)
                    .map(|list| {
                        list.split(',')
                            .map(str::trim)
                            .filter(|member| !member.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DeviceOwner {
    gid: u32,
    mode: u32,
}

/// Why this user cannot open `/dev/kvm`, and what to do about it.
fn access_remediation(
    users: &Users,
    identity: &Identity,
    device: DeviceOwner,
    nixos: bool,
) -> String {
    let user = users.passwd_by_uid(identity.uid);
    let name = user.map_or("$USER", |user| user.name.as_str());
    let relogin = "log out and back in so the new group applies";
    let nixos_groups = format!(
        "add to /etc/nixos/configuration.nix:\n  users.users.{name}.extraGroups = [ \"kvm\" ];\nthen run `sudo nixos-rebuild switch` and {relogin}"
    );
    let join = if nixos {
        nixos_groups
    } else {
        format!("add {name} to the kvm group: `sudo usermod -aG kvm {name}`, then {relogin}")
    };
    let Some(kvm) = users.group_by_name("kvm") else {
        return if nixos {
            join
        } else {
            format!(
                "there is no kvm group: create it (`sudo groupadd --system kvm`), give it {DEVICE} with the udev rule `{UDEV_RULE}` and `sudo udevadm trigger`; then {join}"
            )
        };
    };
    let group_rw = device.mode & 0o060 == 0o060;
    if device.gid != kvm.gid || !group_rw {
        let owner = users
            .groups
            .iter()
            .find(|group| group.gid == device.gid)
            .map_or_else(|| format!("gid {}", device.gid), |group| group.name.clone());
        let rule = if nixos {
            format!(
                "add to /etc/nixos/configuration.nix:\n  services.udev.extraRules = ''{UDEV_RULE}'';\nthen run `sudo nixos-rebuild switch`"
            )
        } else {
            format!(
                "add the udev rule `{UDEV_RULE}` (e.g. in /etc/udev/rules.d/65-kvm.rules) and run `sudo udevadm trigger`"
            )
        };
        return format!(
            "{DEVICE} belongs to group {owner} with mode {:04o}, so the kvm group cannot open it: {rule}; then {join}",
            device.mode
        );
    }
    let member = kvm.members.iter().any(|member| member == name)
        || user.is_some_and(|user| user.gid == kvm.gid);
    let session_has_it = identity.gid == kvm.gid || identity.groups.contains(&kvm.gid);
    match (member, session_has_it) {
        (true, false) => format!(
            "{name} is in the kvm group, but this login session started before that: log out and back in (or run `newgrp kvm`)"
        ),
        (_, true) => format!(
            "this session holds the kvm group and {DEVICE} is group read-write, yet access is denied: check its ACL (`getfacl {DEVICE}`) and security modules (SELinux, AppArmor)"
        ),
        (false, false) => join,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000:Alice:/home/alice:/bin/bash\nbob:x:1001:994::/home/bob:/bin/sh\nbroken line\n";
    const GROUP: &str = "root:x:0:\nkvm:x:994:carol, alice\nalice:x:1000:\n";

    fn users(group: &str) -> Users {
        Users {
            passwd: parse_passwd(PASSWD),
            groups: parse_group(group),
        }
    }

    fn alice(groups: Vec<u32>) -> Identity {
        Identity {
            uid: 1000,
            gid: 1000,
            groups,
        }
    }

    const KVM_0660: DeviceOwner = DeviceOwner {
        gid: 994,
        mode: 0o660,
    };

    #[test]
    fn parses_passwd_and_group() {
        let users = users(GROUP);
        assert_eq!(users.passwd.len(), 3);
        assert_eq!(users.passwd_by_uid(1000).unwrap().name, "alice");
        let kvm = users.group_by_name("kvm").unwrap();
        assert_eq!(kvm.gid, 994);
        assert_eq!(kvm.members, ["carol", "alice"]);
        assert!(users.group_by_name("root").unwrap().members.is_empty());
    }

    #[test]
    fn parses_real_proc_modules_lines() {
        let text = "kvm_intel 409600 0 - Live 0xffffffffc0a4d000\n\
                    kvm 1146880 1 kvm_intel, Live 0x0000000000000000\n\
                    irqbypass 16384 1 kvm, Live 0x0000000000000000\n\
                    kvm_amd 200000 0 - Unloading 0x0000000000000000\n";
        assert_eq!(parse_proc_modules(text), ["kvm_intel", "kvm", "irqbypass"]);
        assert!(parse_proc_modules("").is_empty());
    }

    #[test]
    fn parses_cpu_vendor_and_virtualisation_flag() {
        let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme vmx sse\n";
        assert_eq!(
            parse_cpuinfo(intel),
            Cpu {
                vendor: Some(Vendor::Intel),
                virtualisation: Some(true)
            }
        );
        let amd = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse\n";
        assert_eq!(
            parse_cpuinfo(amd),
            Cpu {
                vendor: Some(Vendor::Amd),
                virtualisation: Some(false)
            }
        );
        let arm = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n";
        assert_eq!(parse_cpuinfo(arm), Cpu::default());
    }

    #[test]
    fn hint_when_not_in_the_group() {
        let hint = access_remediation(
            &users("kvm:x:994:carol\n"),
            &alice(vec![1000]),
            KVM_0660,
            false,
        );
        assert_eq!(
            hint,
            "add alice to the kvm group: `sudo usermod -aG kvm alice`, then log out and back in so the new group applies"
        );
    }

    #[test]
    fn hint_when_in_the_group_but_session_predates_it() {
        let hint = access_remediation(&users(GROUP), &alice(vec![1000]), KVM_0660, false);
        assert_eq!(
            hint,
            "alice is in the kvm group, but this login session started before that: log out and back in (or run `newgrp kvm`)"
        );
        // Membership through the primary group counts too.
        let bob = Identity {
            uid: 1001,
            gid: 100,
            groups: vec![],
        };
        let hint = access_remediation(&users("kvm:x:994:\n"), &bob, KVM_0660, false);
        assert!(hint.starts_with("bob is in the kvm group"), "{hint}");
    }

    #[test]
    fn hint_when_session_holds_the_group_points_at_acls() {
        let hint = access_remediation(&users(GROUP), &alice(vec![1000, 994]), KVM_0660, false);
        assert!(hint.contains("getfacl /dev/kvm"), "{hint}");
    }

    #[test]
    fn hint_when_device_is_not_group_accessible() {
        let root_only = DeviceOwner {
            gid: 0,
            mode: 0o600,
        };
        let hint = access_remediation(&users(GROUP), &alice(vec![1000]), root_only, false);
        assert_eq!(
            hint,
            "/dev/kvm belongs to group root with mode 0600, so the kvm group cannot open it: add the udev rule `KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\"` (e.g. in /etc/udev/rules.d/65-kvm.rules) and run `sudo udevadm trigger`; then add alice to the kvm group: `sudo usermod -aG kvm alice`, then log out and back in so the new group applies"
        );
    }

    #[test]
    fn hint_when_there_is_no_kvm_group() {
        let hint = access_remediation(
            &users("root:x:0:\n"),
            &alice(vec![]),
            DeviceOwner {
                gid: 0,
                mode: 0o600,
            },
            false,
        );
        assert!(
            hint.starts_with("there is no kvm group: create it (`sudo groupadd --system kvm`)"),
            "{hint}"
        );
        assert!(
            hint.ends_with(
                "`sudo usermod -aG kvm alice`, then log out and back in so the new group applies"
            ),
            "{hint}"
        );
    }

    #[test]
    fn hint_for_unknown_uid_uses_dollar_user() {
        let stranger = Identity {
            uid: 4242,
            gid: 4242,
            groups: vec![],
        };
        let hint = access_remediation(&users(GROUP), &stranger, KVM_0660, false);
        assert!(hint.contains("`sudo usermod -aG kvm $USER`"), "{hint}");
    }

    #[test]
    fn hint_on_nixos_is_configuration() {
        let hint = access_remediation(&users("kvm:x:994:\n"), &alice(vec![]), KVM_0660, true);
        assert_eq!(
            hint,
            "add to /etc/nixos/configuration.nix:\n  users.users.alice.extraGroups = [ \"kvm\" ];\nthen run `sudo nixos-rebuild switch` and log out and back in so the new group applies"
        );
    }
}
