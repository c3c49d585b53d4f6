//! The isolation tier of an agent's box (`isolation` in the manifest):
//! `container` (the default: the engine's default runtime, runc, on the
//! host kernel) or `gvisor` (the engine's `runsc` runtime: gVisor's
//! user-space kernel answers the box's system calls, and only gVisor's own
//! few host processes, under its own seccomp filter, talk to the host
//! kernel).
//!
//! What a gVisor registration must look like for bottle, and what its
//! limits become, is decided here from plain data (the runtime's binary
//! and arguments as its engine registers it, `runsc --version`), so a
//! backend's launch and `bottle doctor` judge a host alike, and a backend
//! on another engine that runs runsc would judge it the same way. How a
//! particular engine is told of gVisor is that backend's (the docker
//! backend's `runsc.rs`). Nothing here does I/O.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How an agent's box is isolated from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// A container on the host kernel (runc): today's docker bottle.
    #[default]
    Container,
    /// A container under gVisor (the engine's `runsc` runtime): the box's
    /// system calls are answered by gVisor's kernel in user space.
    Gvisor,
}

impl Isolation {
    /// Every value as the manifest writes it.
    pub const CHOICES: [&'static str; 2] = ["container", "gvisor"];

    /// The value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// One line for the plan.
    pub fn describe(self) -> &'static str {
        match self {
            Isolation::Container => "container (runc: the host kernel answers the box)",
            Isolation::Gvisor => {
                "gvisor (runsc: gVisor's user-space kernel answers the box; the bundle stays runc)"
            }
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name bottle looks the gVisor runtime up under in its engine
/// (the name gVisor's own installation instructions give it), unless
/// [`GVISOR_RUNTIME_ENV`] names another.
pub const GVISOR_RUNTIME: &str = "runsc";

/// The variable naming another registration of gVisor to run boxes under
/// (a backend's and the doctor's).
pub const GVISOR_RUNTIME_ENV: &str = "BOTTLE_GVISOR_RUNTIME";

/// The gVisor runtime's name from [`GVISOR_RUNTIME_ENV`]'s value (`value`):
/// [`GVISOR_RUNTIME`] when unset or blank.
pub fn gvisor_runtime_name(value: Option<&str>) -> String {
    value
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .unwrap_or(GVISOR_RUNTIME)
        .to_string()
}

/// Host tasks (threads) gVisor's own machinery takes in the box's pids
/// cgroup before the box runs anything: the Sentry's threads and its stub
/// processes (38 to 55 measured idle with runsc 20221219, ptrace).
pub const GVISOR_BASE_TASKS: i64 = 256;

/// Host tasks each process in the box costs under gVisor: on the ptrace
/// platform every process of the box has a stub process of its own on the
/// host, with threads, and the Sentry's threads grow with the box (7.3 per
/// process measured with 168 processes, runsc 20221219).
pub const GVISOR_TASKS_PER_PROCESS: i64 = 12;

/// Memory gVisor's own kernel takes inside the box's memory limit (61 MiB
/// idle against runc's 16 measured): added to `limits.memory` so the agent
/// has what the manifest gives it.
pub const GVISOR_MEMORY_HEADROOM: u64 = 128 << 20;

/// What the engine enforces for a box of `isolation` whose manifest says
/// `memory` bytes and `pids` processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// The box's memory cgroup limit (and swap limit), in bytes.
    pub memory: u64,
    /// The box's pids cgroup limit: host tasks.
    pub pids: i64,
    /// `RLIMIT_NPROC` inside the box, where the box's kernel enforces the
    /// process count itself (gVisor does; the host's pids cgroup counts
    /// gVisor's own threads, not the box's processes).
    pub nproc: Option<u64>,
}

/// The limits the engine is given for a box of `isolation`.
///
/// - `container`: the manifest's, as they are.
/// - `gvisor`: the box's process count is gVisor's to enforce
///   (`RLIMIT_NPROC` = `limits.pids`, which gVisor's kernel enforces per
///   user in the box: fork fails with EAGAIN); the host's pids cgroup,
///   which counts gVisor's own threads and stub processes, gets room for
///   them ([`GVISOR_BASE_TASKS`] + [`GVISOR_TASKS_PER_PROCESS`] per
///   process) and stays a backstop. The memory cgroup holds the whole
///   sandbox, gVisor's kernel included, and the host kills the whole
///   sandbox when it is exceeded (there is no OOM killer inside gVisor
///   that picks one process): it gets [`GVISOR_MEMORY_HEADROOM`] on top,
///   so the agent has what the manifest gives it before that kill.
pub fn engine_limits(isolation: Isolation, memory: u64, pids: u32) -> EngineLimits {
    match isolation {
        Isolation::Container => EngineLimits {
            memory,
            pids: i64::from(pids),
            nproc: None,
        },
        Isolation::Gvisor => EngineLimits {
            memory: memory.saturating_add(GVISOR_MEMORY_HEADROOM),
            pids: GVISOR_BASE_TASKS + GVISOR_TASKS_PER_PROCESS * i64::from(pids),
            nproc: Some(u64::from(pids)),
        },
    }
}

/// gVisor's network modes (`--network`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GvisorNetwork {
    /// gVisor's own network stack (netstack), on the box's interfaces: the
    /// default, and the stronger one.
    Sandbox,
    /// The box's network system calls go to the host kernel's stack, in
    /// the box's own network namespace.
    Host,
}

impl GvisorNetwork {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            GvisorNetwork::Sandbox => "sandbox",
            GvisorNetwork::Host => "host",
        }
    }
}

/// A runtime registration as its engine reports it (the docker daemon's
/// `GET /info` `Runtimes`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Registration {
    /// The binary.
    pub path: String,
    /// The arguments the engine passes before its own.
    pub args: Vec<String>,
}

/// What a gVisor registration gives a box, read from its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorSetup {
    /// `--platform` (`ptrace` unless set).
    pub platform: String,
    /// `--network`.
    pub network: GvisorNetwork,
    /// Whether the root filesystem is revalidated against the host
    /// (`--file-access=shared`).
    pub file_access_shared: bool,
}

impl GvisorSetup {
    /// One line for plans and the doctor.
    pub fn describe(&self) -> String {
        format!(
            "platform {}, network {}{}",
            self.platform,
            self.network.as_str(),
            if self.file_access_shared {
                ", file access shared"
            } else {
                ""
            }
        )
    }
}

/// Why a gVisor registration cannot run bottle's boxes, or would weaken
/// them: each a lowercase fragment naming the flag.
pub type Unfit = Vec<String>;

/// Reads a runsc registration's arguments: the setup it gives, or every
/// reason bottle refuses it.
///
/// Only flags bottle knows to leave the box as strong pass
/// (`HARMLESS_FLAGS`, and the ones read here); any other is refused, so a
/// flag a newer runsc adds is judged before a box runs under it. Refused by
/// name: `--network=none` (the box could not reach its bundle); a root
/// filesystem not revalidated against the host (`--file-access` other
/// than `shared`: what bottle writes into a running box, its CA and
/// `bottle cp`, would stay unseen) or overlaid (`--overlay2` other than
/// `none`, which must be said: current builds default to a root overlay
/// in memory, out of the layer reset snapshots, and refuse it with shared
/// file access); no `--oci-seccomp` (without it gVisor ignores the
/// container's seccomp profile, and the box could make calls, user
/// namespaces among them, the container tier refuses); and flags that open the sandbox when on (`--overlay`,
/// `--net-raw`, `--profile`, `--ignore-cgroups`, `--rootless`,
/// `--fsgofer-host-uds`, `--nvproxy`, `--tpuproxy`, `--host-uds` or
/// `--host-fifo` other than `none`, `--TESTONLY-*`). A boolean is on
/// unless it says one of Go's false spellings.
pub fn assess(registration: &Registration) -> Result<GvisorSetup, Unfit> {
    let mut setup = GvisorSetup {
        platform: "ptrace".into(),
        network: GvisorNetwork::Sandbox,
        file_access_shared: false,
    };
    let mut unfit = Vec::new();
    let mut overlay_off = false;
    let mut oci_seccomp = false;
    let flags = parse_flags(&registration.args);
    for (name, value) in &flags {
        let value = value.as_deref();
        let shown = value.unwrap_or_default();
        match name.as_str() {
            "platform" => setup.platform = shown.to_string(),
            "network" => match value {
                Some("sandbox") => setup.network = GvisorNetwork::Sandbox,
                Some("host") => setup.network = GvisorNetwork::Host,
                Some("none") => {
                    unfit.push("--network=none: the box could not reach its bundle".into())
                }
                _ => unfit.push(format!(
                    "--network={shown}: not a network mode bottle knows"
                )),
            },
            "file-access" => setup.file_access_shared = value == Some("shared"),
            "overlay2" => {
                overlay_off = value == Some("none");
                if !overlay_off {
                    unfit.push(format!(
                        "--overlay2={shown}: the box's writes would stay in gVisor's overlay, out of the layer bottle's reset snapshots"
                    ));
                }
            }
            "oci-seccomp" => oci_seccomp = is_on(value),
            "host-uds" | "host-fifo" => {
                if value != Some("none") {
                    unfit.push(format!(
                        "--{name}={shown}: the box could reach host sockets or fifos"
                    ));
                }
            }
            flag => {
                if let Some(why) = OPENING_FLAGS
                    .iter()
                    .find(|(opening, _)| *opening == flag)
                    .map(|(_, why)| why)
                {
                    if is_on(value) {
                        unfit.push(format!("--{flag}: {why}"));
                    }
                } else if !HARMLESS_FLAGS.contains(&flag) {
                    unfit.push(format!(
                        "--{flag}: not a flag bottle knows to leave the box as strong (remove it, or tell bottle's maintainers what it does)"
                    ));
                }
            }
        }
    }
    if !setup.file_access_shared {
        unfit.push(
            "--file-access is not `shared`: gVisor would cache the root filesystem and never see what bottle writes into a running box (its CA, `bottle cp`)".into(),
        );
    }
    if !oci_seccomp {
        unfit.push(
            "no --oci-seccomp: gVisor would not apply the container's seccomp profile inside the box, so the box could make calls (user namespaces among them) the container tier refuses".into(),
        );
    }
    if !overlay_off {
        unfit.push(
            "no --overlay2=none: current runsc builds put a root overlay in memory by default, which keeps the box's writes out of the layer bottle's reset snapshots (and which they refuse with shared file access)".into(),
        );
    }
    if unfit.is_empty() {
        Ok(setup)
    } else {
        Err(unfit)
    }
}

/// Boolean flags that open the sandbox when on, and what they would open.
const OPENING_FLAGS: &[(&str, &str)] = &[
    (
        "overlay",
        "the box's writes would stay in gVisor's memory, out of the layer bottle's reset snapshots",
    ),
    ("net-raw", "raw sockets in the box"),
    ("profile", "loosens the sandbox's own seccomp filter"),
    (
        "ignore-cgroups",
        "the box's memory and pids limits would not hold",
    ),
    (
        "rootless",
        "the sandbox and its gofer would run without their own namespaces' protections",
    ),
    ("fsgofer-host-uds", "the box could reach host sockets"),
    ("nvproxy", "host GPU devices in the box"),
    ("nvproxy-docker", "host GPU devices in the box"),
    ("tpuproxy", "host TPU devices in the box"),
    ("TESTONLY-unsafe-nonroot", "a test-only flag"),
    ("TESTONLY-allow-packet-endpoint-write", "a test-only flag"),
];

/// Flags that change how gVisor logs, is placed in cgroups, or how fast
/// it runs, never what the box can reach: a registration may carry them.
const HARMLESS_FLAGS: &[&str] = &[
    "root",
    "debug",
    "debug-log",
    "debug-log-format",
    "debug-command",
    "log",
    "log-format",
    "log-fd",
    "debug-log-fd",
    "panic-log",
    "panic-log-fd",
    "alsologtostderr",
    "systemd-cgroup",
    "cgroupfs",
    "cpu-num-from-quota",
    "num-network-channels",
    "gso",
    "software-gso",
    "gvisor-gro",
    "qdisc",
    "rx-checksum-offload",
    "tx-checksum-offload",
    "buffer-pooling",
    "watchdog-action",
    "dcache",
    "fdlimit",
    "lisafs",
    "vfs2",
    "directfs",
    "traceback",
    "ref-leak-mode",
    "platform_device_path",
    "panic-signal",
];

/// Go's `strconv.ParseBool`: a boolean flag is on unless it says false
/// (a value runsc cannot parse fails its start, which is also no box).
fn is_on(value: Option<&str>) -> bool {
    !matches!(value, Some("0" | "f" | "F" | "false" | "False" | "FALSE"))
}

/// Flags whose value may follow as the next argument (Go's flag package).
const VALUE_FLAGS: &[&str] = &[
    "platform",
    "network",
    "file-access",
    "overlay2",
    "host-uds",
    "host-fifo",
    "root",
    "log",
    "debug-log",
];

/// `--name=value`, `-name=value`, `--name value` (for flags that take a
/// value) and `--name` (booleans), in order.
fn parse_flags(args: &[String]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        match flag.split_once('=') {
            Some((name, value)) => out.push((name.to_string(), Some(value.to_string()))),
            None if VALUE_FLAGS.contains(&flag) => {
                let value = it.next_if(|next| !next.starts_with('-')).cloned();
                out.push((flag.to_string(), value));
            }
            None => out.push((flag.to_string(), None)),
        }
    }
    out
}

/// What `runsc --version` says, and the gaps of that build bottle knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorBuild {
    /// The version as printed (`0.0~20221219.0`, `release-20240513.0`).
    pub version: String,
    /// The build's date, `YYYYMMDD`, when the version carries one.
    pub date: Option<u32>,
}

/// Builds older than this have no systrap platform: every system call of
/// the box costs two ptrace stops (ptrace) or needs KVM.
pub const SYSTRAP_SINCE: u32 = 2023_0417;

/// Builds of 2022 refuse `statx(2)` with `AT_NO_AUTOMOUNT` (EINVAL, seen
/// with 20221219), which GNU coreutils 9 passes.
pub const STATX_FIXED_SINCE: u32 = 2023_0101;

/// Builds older than this refuse to start their own network stack on
/// recent kernels ("cannot run with network enabled in root network
/// namespace", google/gvisor#10704, fixed upstream later): they need
/// `--network=host`.
pub const NETSTACK_FIXED_SINCE: u32 = 2024_0801;

impl GvisorBuild {
    /// Reads the first line of `runsc --version`.
    pub fn parse(output: &str) -> Option<GvisorBuild> {
        let line = output.lines().find(|l| l.starts_with("runsc version"))?;
        let version = line.trim_start_matches("runsc version").trim().to_string();
        if version.is_empty() {
            return None;
        }
        let date = version
            .as_bytes()
            .windows(8)
            .filter(|w| w.iter().all(u8::is_ascii_digit))
            .filter_map(|w| std::str::from_utf8(w).ok()?.parse::<u32>().ok())
            .find(|d| (2018_0101..2100_0101).contains(d));
        Some(GvisorBuild { version, date })
    }

    /// The gaps of this build bottle knows of, each a sentence; `setup` is
    /// how the engine runs it.
    pub fn known_gaps(&self, setup: Option<&GvisorSetup>) -> Vec<String> {
        let mut gaps = Vec::new();
        let Some(date) = self.date else {
            return gaps;
        };
        if date < SYSTRAP_SINCE {
            gaps.push(format!(
                "runsc {} predates the systrap platform: the box's system calls go through ptrace (slow; `docker run` took 1.63x runc here), or kvm where /dev/kvm is usable",
                self.version
            ));
        }
        if date < STATX_FIXED_SINCE {
            gaps.push(format!(
                "runsc {} refuses statx(2) with AT_NO_AUTOMOUNT (EINVAL), which GNU coreutils 9 passes: `ls -l`, `stat` and friends of Debian 12 and newer images fail in the box (python, git, curl, pip and npm do not use it)",
                self.version
            ));
        }
        if date < NETSTACK_FIXED_SINCE {
            let how = match setup.map(|s| s.network) {
                Some(GvisorNetwork::Host) => {
                    "registered with --network=host, so the box's network calls reach the host kernel's stack in its own namespace (docs/SECURITY.md)"
                }
                _ => "register it with --network=host, or its boxes will not start on this kernel",
            };
            gaps.push(format!(
                "runsc {}'s own network stack refuses to start on recent kernels (\"cannot run with network enabled in root network namespace\", google/gvisor#10704): {how}",
                self.version
            ));
            if setup.map(|s| s.network) == Some(GvisorNetwork::Host) {
                gaps.push(format!(
                    "runsc {} in host network mode ignores SO_RCVTIMEO (a recv with nothing to read blocks for good) and answers a blocking read(2) on a socket that has nothing yet with EAGAIN (seen with 20221219): programs that read sockets through stdio, such as busybox wget, fail in the box; curl, python, pip, node, npm and git wait with poll first and work",
                    self.version
                ));
            }
        }
        gaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(args: &[&str]) -> Registration {
        Registration {
            path: "/usr/bin/runsc".into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn the_manifest_spellings_round_trip() {
        for choice in Isolation::CHOICES {
            let parsed: Isolation = serde_json::from_str(&format!("{choice:?}")).unwrap();
            assert_eq!(parsed.as_str(), choice);
        }
        assert_eq!(Isolation::default(), Isolation::Container);
        assert_eq!(gvisor_runtime_name(None), "runsc");
        assert_eq!(gvisor_runtime_name(Some("  ")), "runsc");
        assert_eq!(gvisor_runtime_name(Some("runsc-kvm")), "runsc-kvm");
    }

    #[test]
    fn the_registration_bottle_writes_is_fit() {
        let setup = assess(&registration(&[
            "--platform=ptrace",
            "--network=host",
            "--file-access=shared",
            "--overlay2=none",
            "--oci-seccomp",
        ]))
        .unwrap();
        assert_eq!(setup.platform, "ptrace");
        assert_eq!(setup.network, GvisorNetwork::Host);
        assert_eq!(
            setup.describe(),
            "platform ptrace, network host, file access shared"
        );
        // Go's other spellings.
        let setup = assess(&registration(&[
            "-platform",
            "kvm",
            "--file-access",
            "shared",
            "--overlay2",
            "none",
            "--oci-seccomp=true",
            "--debug-log=/var/log/runsc/",
            "--systemd-cgroup",
        ]))
        .unwrap();
        assert_eq!(setup.platform, "kvm");
        assert_eq!(setup.network, GvisorNetwork::Sandbox);
    }

    #[test]
    fn registrations_that_break_or_open_the_box_are_refused_with_every_reason() {
        let unfit = assess(&registration(&["--network=host"])).unwrap_err();
        assert_eq!(unfit.len(), 3, "{unfit:?}");
        assert!(unfit[0].contains("--file-access"), "{unfit:?}");
        assert!(unfit[1].contains("--oci-seccomp"), "{unfit:?}");
        assert!(unfit[2].contains("--overlay2=none"), "{unfit:?}");
        assert!(
            assess(&registration(&[
                "--file-access=shared",
                "--overlay2=none",
                "--oci-seccomp=false"
            ]))
            .unwrap_err()[0]
                .contains("--oci-seccomp")
        );
        let fit = ["--file-access=shared", "--overlay2=none", "--oci-seccomp"];
        let with = |extra: &[&str]| {
            let mut args = fit.to_vec();
            args.extend_from_slice(extra);
            assess(&registration(&args))
        };
        // Go's true spellings are all on.
        for on in [
            "--net-raw=True",
            "--ignore-cgroups=T",
            "--profile=TRUE",
            "--overlay=t",
            "--rootless=1",
        ] {
            assert!(with(&[on]).is_err(), "{on}");
        }
        // Devices, host sockets by their old name, and flags bottle does
        // not know are refused.
        for opening in [
            "--nvproxy",
            "--tpuproxy",
            "--fsgofer-host-uds",
            "--host-uds=open",
            "--EXPERIMENTAL-afxdp",
            "--a-flag-from-2030=x",
        ] {
            let unfit = with(&[opening]).unwrap_err();
            let name = opening.trim_start_matches('-').split('=').next().unwrap();
            assert!(unfit.join(" ").contains(name), "{opening}: {unfit:?}");
        }

        let unfit = assess(&registration(&[
            "--file-access=shared",
            "--overlay2=none",
            "--oci-seccomp",
            "--network=none",
            "--host-uds=all",
            "--net-raw",
            "--overlay2=root:memory",
            "--ignore-cgroups",
            "--profile=true",
            "--TESTONLY-unsafe-nonroot",
        ]))
        .unwrap_err();
        let text = unfit.join("\n");
        for flag in [
            "--network=none",
            "--host-uds=all",
            "--net-raw",
            "--overlay2=root:memory",
            "--ignore-cgroups",
            "--profile",
            "--TESTONLY-unsafe-nonroot",
        ] {
            assert!(text.contains(flag), "{flag} missing from {text}");
        }
        // Off is fine.
        assert!(
            assess(&registration(&[
                "--file-access=shared",
                "--host-uds=none",
                "--net-raw=false",
                "--overlay2=none",
                "--oci-seccomp"
            ]))
            .is_ok()
        );
    }

    #[test]
    fn limits_are_translated_for_gvisor_only() {
        let runc = engine_limits(Isolation::Container, 256 << 20, 128);
        assert_eq!(
            runc,
            EngineLimits {
                memory: 256 << 20,
                pids: 128,
                nproc: None
            }
        );
        let gvisor = engine_limits(Isolation::Gvisor, 256 << 20, 128);
        assert_eq!(gvisor.memory, (256 << 20) + GVISOR_MEMORY_HEADROOM);
        assert_eq!(gvisor.nproc, Some(128));
        assert_eq!(gvisor.pids, 256 + 12 * 128);
    }

    #[test]
    fn debians_build_and_its_gaps() {
        let build = GvisorBuild::parse("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n").unwrap();
        assert_eq!(build.version, "0.0~20221219.0");
        assert_eq!(build.date, Some(2022_1219));
        let setup = GvisorSetup {
            platform: "ptrace".into(),
            network: GvisorNetwork::Host,
            file_access_shared: true,
        };
        let gaps = build.known_gaps(Some(&setup));
        assert_eq!(gaps.len(), 4, "{gaps:?}");
        assert!(gaps[0].contains("systrap"), "{gaps:?}");
        assert!(gaps[1].contains("AT_NO_AUTOMOUNT"), "{gaps:?}");
        assert!(gaps[2].contains("10704") && gaps[2].contains("registered with --network=host"));
        assert!(gaps[3].contains("SO_RCVTIMEO"), "{gaps:?}");
        let sandbox = build.known_gaps(None);
        assert_eq!(sandbox.len(), 3, "{sandbox:?}");
        assert!(sandbox[2].contains("will not start"), "{sandbox:?}");

        let current = GvisorBuild::parse("runsc version release-20261116.0\n").unwrap();
        assert_eq!(current.date, Some(2026_1116));
        assert!(current.known_gaps(Some(&setup)).is_empty());
        assert!(
            GvisorBuild::parse("runsc version custom-build\n")
                .unwrap()
                .known_gaps(None)
                .is_empty()
        );
        assert_eq!(GvisorBuild::parse("something else"), None);
    }
}
