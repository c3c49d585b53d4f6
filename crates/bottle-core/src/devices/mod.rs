//! Device passthrough policy: which host device nodes a bottle gets.
//!
//! The manifest's `devices` globs (or [`DEFAULT_DEVICES`] when it sets none)
//! are expanded against the host's `/dev`. Every resulting path is checked
//! against the device blacklist, which is [`BUILTIN_BLACKLIST`] plus the
//! admin policy file plus the manifest's `devices_blacklist`: a manifest can
//! add to it but never remove from it. Only character and block device nodes
//! (or symlinks to them) that survive are passed; everything else is dropped
//! with a reason. See `docs/DEVICES.md`.
//!
//! A blacklisted node must not get in under another name, so a candidate is
//! refused when its own path, the path it finally resolves to, or its device
//! number (kind, major, minor) matches the blacklist. A block node is also
//! refused when the driver that owns its major in `/proc/devices` is a raw
//! disk driver of a built-in entry, and every block node is refused when
//! `/proc/devices` cannot be read.
//!
//! **I/O:** unlike the rest of bottle-core, this module touches the host: it
//! reads the admin policy file it is given ([`AdminPolicy::load`]) and lists
//! and stats device nodes and reads `proc/devices` under the root it is given
//! ([`DevicePolicy::resolve`]). Production passes `/`; tests pass a temporary
//! directory holding a fake `dev/` made with `mknod`. Nothing outside that
//! root is read, and nothing is ever written.

mod drivers;
mod error;
mod policy;
mod resolve;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
pub use crate::plan::DroppedDevice;
use crate::plan::Plan;

pub use error::{CODES, DeviceError};
pub use policy::{AdminPolicy, BlacklistEntry, BlacklistSource, DevicePolicy};

/// Where the admin policy lives unless [`POLICY_FILE_ENV`] says otherwise.
pub const DEFAULT_POLICY_FILE: &str = "/etc/bottle/policy.toml";

/// The environment variable the CLI reads to override [`DEFAULT_POLICY_FILE`].
pub const POLICY_FILE_ENV: &str = "BOTTLE_POLICY_FILE";

/// The admin policy file to read: [`POLICY_FILE_ENV`] if set to a
/// non-empty value, else [`DEFAULT_POLICY_FILE`]. The environment is passed
/// in, as for [`crate::state::state_root`].
pub fn policy_file(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    env(POLICY_FILE_ENV)
        .filter(|value| !value.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_POLICY_FILE), PathBuf::from)
}

/// The devices requested when the manifest sets no `devices`: the NVIDIA
/// nodes, but for those in [`LEFT_OUT_OF_DEFAULTS`]. On a host without them
/// they expand to nothing, silently.
pub const DEFAULT_DEVICES: &[&str] = &[
    "/dev/nvidia*",
    "/dev/nvidia-caps/*",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// Nodes the defaults' globs match but do not pass, each with why: an
/// administrator's capability rather than the GPU's use. Only the defaults
/// leave them out (a manifest that lists them in `devices` gets them), and
/// by path, by the path a candidate resolves to, and by device number, so
/// no other name of the node under `/dev/nvidia*` brings it back.
pub const LEFT_OUT_OF_DEFAULTS: &[(&str, &str)] = &[(
    "/dev/nvidia-caps/nvidia-cap1",
    "the MIG configuration capability (creating and destroying the GPU instances every user of the GPU shares) is an administrator's, left out of the default devices; list it in `devices` to pass it",
)];

/// The blacklist that always applies, whatever the admin file says.
///
/// A pattern also covers everything below a directory it matches, so
/// `/dev/disk` refuses `/dev/disk/by-id/x`. `docs/DEVICES.md` gives the
/// reason for each entry.
pub const BUILTIN_BLACKLIST: &[&str] = &[
    // Physical memory, I/O ports, CPU registers, hibernation image.
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/dev/cpu/*/msr",
    "/dev/snapshot",
    "/dev/kmsg",
    // Host-bound secrets and host reboot.
    "/dev/tpm*",
    "/dev/watchdog*",
    // The host's terminals, consoles and input devices (keystroke capture and
    // injection).
    "/dev/pts",
    "/dev/console",
    "/dev/tty[0-9]*",
    "/dev/vcs*",
    "/dev/input",
    "/dev/uinput",
    "/dev/hidraw*",
    // Raw storage: the host's disks, partitions, volumes and their aliases.
    "/dev/sd*",
    "/dev/sg*",
    "/dev/bsg",
    "/dev/nvme*",
    "/dev/loop*",
    "/dev/vd*",
    "/dev/xvd*",
    "/dev/hd*",
    "/dev/sr*",
    "/dev/md*",
    "/dev/mmcblk*",
    "/dev/nbd*",
    "/dev/zram*",
    "/dev/ram*",
    "/dev/dm-*",
    "/dev/mapper",
    "/dev/disk*",
    "/dev/rdisk*",
    "/dev/block",
];

/// The kernel version from which an explicit `/dev/pts` request is kept
/// (with a warning) instead of refused by the built-in blacklist.
pub const PTS_MIN_KERNEL: (u32, u32) = (5, 4);

/// Character or block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A character device.
    Char,
    /// A block device.
    Block,
}

impl DeviceKind {
    /// `char` or `block`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Char => "char",
            DeviceKind::Block => "block",
        }
    }
}

/// A device node that passed the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// The node's real path on the host (symlinks resolved), e.g.
    /// `/dev/nvidia0`. Under a test root this is inside the root.
    pub host_path: PathBuf,
    /// Where the bottle sees it: the path as requested (or as found while
    /// expanding a glob or directory), e.g. `/dev/nvidia0`.
    pub container_path: String,
    /// Character or block.
    pub kind: DeviceKind,
    /// Major device number.
    pub major: u32,
    /// Minor device number.
    pub minor: u32,
}

impl DeviceNode {
    /// One line for the plan: `/dev/nvidia0 (char 195:0)`, naming the host
    /// node too when the bottle sees it under another name.
    pub fn describe(&self, root: &std::path::Path) -> String {
        let host = resolve::display_in_root(root, &self.host_path);
        let alias = if host == self.container_path {
            String::new()
        } else {
            format!(" -> {host}")
        };
        format!(
            "{}{alias} ({} {}:{})",
            self.container_path,
            self.kind.as_str(),
            self.major,
            self.minor
        )
    }
}

/// The outcome of resolving a device request against a host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedDevices {
    /// Nodes to pass into the bottle, in request order, no duplicates.
    pub passed: Vec<DeviceNode>,
    /// Paths the policy refused, with the reason.
    pub dropped: Vec<DroppedDevice>,
    /// Lines for the operator (one per blacklist hit, and the `/dev/pts`
    /// notice); the CLI prints them.
    pub warnings: Vec<String>,
}

impl ResolvedDevices {
    /// Writes the passed and dropped devices into the plan the operator
    /// confirms. `root` is the root the devices were resolved under.
    pub fn fill_plan<D>(&self, plan: &mut Plan<D>, root: &std::path::Path) {
        plan.devices = self
            .passed
            .iter()
            .map(|d| crate::plan::PlannedDevice {
                host_path: d.host_path.display().to_string(),
                container_path: d.container_path.clone(),
                summary: d.describe(root),
            })
            .collect();
        plan.devices_dropped = self.dropped.clone();
    }
}

/// The one warning a backend that cannot pass devices prints, so every such
/// backend says it the same way. `None` when nothing would have been passed.
///
/// The bottle still starts: the nodes are an optional extra (the defaults are
/// GPU nodes), and refusing to start would make the defaults fatal on any GPU
/// host.
pub fn unsupported_warning(backend: BackendKind, resolved: &ResolvedDevices) -> Option<String> {
    dropped_nodes(resolved).map(|nodes| {
        format!(
            "the {backend} backend does not support device passthrough: starting without {nodes}; use --backend docker to pass them, or set devices = [] to silence this"
        )
    })
}

/// Takes the device nodes out of `resolved` for a box of `isolation` that
/// cannot be given host devices (gVisor's kernel does not drive them), and
/// says so in `resolved.warnings`. Like [`unsupported_warning`], the bottle
/// still starts without them.
pub fn drop_for_isolation(resolved: &mut ResolvedDevices, isolation: crate::isolation::Isolation) {
    if isolation == crate::isolation::Isolation::Container {
        return;
    }
    if let Some(nodes) = dropped_nodes(resolved) {
        resolved.warnings.push(format!(
            "isolation = \"{isolation}\" passes no host devices (gVisor's kernel does not drive them): starting without {nodes}; use isolation = \"container\" to pass them, or set devices = [] to silence this"
        ));
        resolved.passed.clear();
    }
}

/// "N device node(s) (a, b, c and M more)", or `None` when none passed.
fn dropped_nodes(resolved: &ResolvedDevices) -> Option<String> {
    if resolved.passed.is_empty() {
        return None;
    }
    const SHOWN: usize = 3;
    let names: Vec<&str> = resolved
        .passed
        .iter()
        .take(SHOWN)
        .map(|d| d.container_path.as_str())
        .collect();
    let more = resolved.passed.len().saturating_sub(SHOWN);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let count = resolved.passed.len();
    let nodes = if count == 1 { "node" } else { "nodes" };
    Some(format!(
        "{count} device {nodes} ({}{more})",
        names.join(", ")
    ))
}
