//! The gVisor tier of a docker bottle (`isolation = "gvisor"`): the agent
//! container runs under the Engine's `runsc` runtime, the bundle stays on
//! runc.
//!
//! - Before anything is created, [`runtime_of`] finds the runtime in the
//!   daemon's `GET /info` and refuses a daemon without one (`BOT-D090`) or
//!   with a registration that cannot run a bottle's box (`BOT-D091`, judged
//!   by [`bottle_core::isolation::assess`]).
//! - After the agent container starts, [`confirm`] checks that it really
//!   runs under gVisor, from three places: the Engine's record
//!   (`HostConfig.Runtime`), the host kernel (the container's init process
//!   is gVisor's sandbox, `runsc-sandbox ... boot`), and the box itself
//!   (the kernel answering `uname(2)` inside is not the host's). Any one
//!   that disagrees refuses the bottle (`BOT-D092`) and the launch unwinds.
//! - A reset's descriptor source cannot read the box's processes from the
//!   host's `/proc` (they live in gVisor's kernel, and the sandbox shares
//!   the host's pid namespace); [`stray_descriptors`] counts what could
//!   outlive a revert instead: host processes in the box's cgroup that are
//!   not the running sandbox's.

use std::collections::BTreeSet;
use std::path::Path;

use bollard::models::{ContainerInspectResponse, SystemInfo};
use bottle_core::isolation::{GvisorSetup, Registration};

use crate::error::DockerError;
use crate::pause::{UNAME_PATH, parse_utsname};

/// The daemon's gVisor runtime, as `GET /info` registers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorRuntime {
    /// Its registered name (`runsc`).
    pub name: String,
    /// Its binary.
    pub path: String,
    /// What its arguments give a box.
    pub setup: GvisorSetup,
}

impl GvisorRuntime {
    /// The plan's line.
    pub fn describe(&self) -> String {
        format!("{} at {} ({})", self.name, self.path, self.setup.describe())
    }
}

/// The daemon's gVisor runtime registered as `name`, or why a gVisor
/// bottle cannot run on it.
/// `binary_exists` says whether an absolute path names a file on this host
/// (the daemon runs here: bind mounts and resets already need that).
pub fn runtime_of(
    info: &SystemInfo,
    name: &str,
    binary_exists: &dyn Fn(&Path) -> bool,
) -> Result<GvisorRuntime, DockerError> {
    let runtimes = info.runtimes.clone().unwrap_or_default();
    let Some(runtime) = runtimes.get(name) else {
        let mut names: Vec<&String> = runtimes.keys().collect();
        names.sort();
        return Err(DockerError::GvisorMissing {
            runtime: name.into(),
            registered: if names.is_empty() {
                "none reported".into()
            } else {
                names
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        });
    };
    let registration = Registration {
        path: runtime.path.clone().unwrap_or_default(),
        args: runtime.runtime_args.clone().unwrap_or_default(),
    };
    let path = registration.path.clone();
    let missing = Path::new(&path).is_absolute() && !binary_exists(Path::new(&path));
    let mut problems = match bottle_core::isolation::assess(&registration) {
        Ok(setup) if !missing => {
            return Ok(GvisorRuntime {
                name: name.into(),
                path,
                setup,
            });
        }
        Ok(_) => Vec::new(),
        Err(unfit) => unfit,
    };
    if missing {
        problems.insert(0, format!("{path} does not exist"));
    }
    Err(DockerError::GvisorUnfit {
        runtime: name.into(),
        path,
        problems: problems.join("; "),
    })
}

/// The Engine's record: the container runs under `runtime`.
pub(crate) fn check_runtime(
    inspect: &ContainerInspectResponse,
    runtime: &str,
) -> Result<(), String> {
    let found = inspect
        .host_config
        .as_ref()
        .and_then(|h| h.runtime.as_deref())
        .unwrap_or("the daemon's default");
    if found == runtime {
        Ok(())
    } else {
        Err(format!(
            "the Engine runs the agent container under {found}, not {runtime}"
        ))
    }
}

/// The host kernel's view: the container's init process (the Engine's
/// `State.Pid`) is gVisor's sandbox, `runsc-sandbox ... boot`.
pub(crate) fn check_sandbox_process(
    inspect: &ContainerInspectResponse,
    proc_root: &Path,
) -> Result<u32, String> {
    let pid = inspect
        .state
        .as_ref()
        .and_then(|s| s.pid)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or("the Engine reports no process for the agent container")?;
    let path = proc_root.join(pid.to_string()).join("cmdline");
    let cmdline =
        std::fs::read(&path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let argv0 = args.first().map(String::as_str).unwrap_or_default();
    if argv0 == "runsc-sandbox" && args.iter().any(|a| a == "boot") {
        Ok(pid)
    } else {
        Err(format!(
            "the agent container's process {pid} on the host is {:?}, not gVisor's sandbox (runsc-sandbox boot)",
            argv0
        ))
    }
}

/// The box's own answer: [`UNAME_PATH`]'s output names a kernel other than
/// the host's (`host_release`, `host_version`: `/proc/sys/kernel`'s
/// `osrelease` and `version`). Returns the box's kernel for the notes.
pub(crate) fn check_box_kernel(
    out: &[u8],
    exit_code: i32,
    host_release: &str,
    host_version: &str,
) -> Result<String, String> {
    if exit_code != 0 {
        return Err(format!("{UNAME_PATH} exited with {exit_code} in the box"));
    }
    let (release, version) = parse_utsname(out)
        .ok_or_else(|| format!("{UNAME_PATH} printed {} bytes, not a utsname", out.len()))?;
    if release == host_release.trim() && version == host_version.trim() {
        return Err(format!(
            "the box's kernel is the host's ({release} {version})"
        ));
    }
    Ok(format!("{release} {version}"))
}

/// The host's kernel release and version, as `uname(2)` would give them.
pub(crate) fn host_kernel() -> Result<(String, String), String> {
    let read = |name: &str| {
        let path = format!("/proc/sys/kernel/{name}");
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|err| format!("cannot read {path}: {err}"))
    };
    Ok((read("osrelease")?, read("version")?))
}

/// Descriptors held by host processes in the cgroup of the sandbox whose
/// init is `sandbox_pid` that are not that sandbox's own (everything its
/// shim started: the sandbox, its stubs, its gofer, `runsc exec`s): what
/// could outlive a revert that killed the sandbox. 0 in a box as launched;
/// a process that escaped gVisor into the box's cgroup, or was left there,
/// shows here.
pub(crate) fn stray_descriptors(proc_root: &Path, sandbox_pid: u32) -> Result<u64, String> {
    let cgroup_of = |pid: u32| -> Option<String> {
        let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        pids_cgroup(&text)
    };
    let own = cgroup_of(sandbox_pid)
        .ok_or_else(|| format!("cannot read the cgroup of the sandbox {sandbox_pid}"))?;
    let entries = std::fs::read_dir(proc_root)
        .map_err(|err| format!("cannot list {}: {err}", proc_root.display()))?;
    let mut parents = std::collections::BTreeMap::new();
    let mut members = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(ppid) = parent_of(&stat) {
            parents.insert(pid, ppid);
        }
        if cgroup_of(pid).as_deref() == Some(own.as_str()) {
            members.push(pid);
        }
    }
    // The sandbox's own: everything below the runtime's shim, which
    // starts the sandbox, its gofer and each exec's `runsc exec` (they
    // share the box's cgroup); the sandbox alone if it has no shim.
    let root = parents
        .get(&sandbox_pid)
        .copied()
        .filter(|ppid| *ppid > 1)
        .unwrap_or(sandbox_pid);
    let sandbox = descendants(&parents, root);
    Ok(members
        .into_iter()
        .filter(|pid| !sandbox.contains(pid))
        .filter_map(|pid| std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")).ok())
        .map(|fds| fds.count() as u64)
        .sum())
}

/// The box's cgroup from a `/proc/<pid>/cgroup` text: the `pids`
/// controller's path (cgroup v1), else the unified one (v2). The pids
/// cgroup is the one whose limit holds the box's host tasks.
fn pids_cgroup(text: &str) -> Option<String> {
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "pids") {
            return Some(path.to_string());
        }
        if controllers.is_empty() {
            unified = Some(path.to_string());
        }
    }
    unified
}

/// The parent pid from a `/proc/<pid>/stat` line.
fn parent_of(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `root` and every process below it.
fn descendants(parents: &std::collections::BTreeMap<u32, u32>, root: u32) -> BTreeSet<u32> {
    let mut found = BTreeSet::from([root]);
    loop {
        let before = found.len();
        for (pid, ppid) in parents {
            if found.contains(ppid) {
                found.insert(*pid);
            }
        }
        if found.len() == before {
            return found;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::{ContainerState, HostConfig, Runtime};

    use super::*;

    fn info(runtimes: &[(&str, &str, &[&str])]) -> SystemInfo {
        SystemInfo {
            runtimes: Some(
                runtimes
                    .iter()
                    .map(|(name, path, args)| {
                        (
                            name.to_string(),
                            Runtime {
                                path: Some(path.to_string()),
                                runtime_args: Some(args.iter().map(|a| a.to_string()).collect()),
                                status: None,
                            },
                        )
                    })
                    .collect::<HashMap<_, _>>(),
            ),
            ..SystemInfo::default()
        }
    }

    const FIT: &[&str] = &[
        "--platform=ptrace",
        "--network=host",
        "--file-access=shared",
    ];

    #[test]
    fn a_daemon_without_runsc_is_refused_naming_what_it_has() {
        let err = runtime_of(&info(&[("runc", "runc", &[])]), "runsc", &|_| true).unwrap_err();
        assert_eq!(bottle_core::Coded::code(&err), "BOT-D090");
        assert!(err.to_string().contains("its runtimes: runc"), "{err}");
        let fix = bottle_core::Coded::fix(&err).unwrap();
        for step in ["apt-get install runsc", "daemon.json", "kill -HUP"] {
            assert!(fix.contains(step), "{fix}");
        }
        let none = runtime_of(&SystemInfo::default(), "runsc", &|_| true).unwrap_err();
        assert!(none.to_string().contains("none reported"), "{none}");
    }

    #[test]
    fn an_unfit_or_missing_registration_is_refused_with_every_reason() {
        let runtime = runtime_of(
            &info(&[("runc", "runc", &[]), ("runsc", "/usr/bin/runsc", FIT)]),
            "runsc",
            &|_| true,
        )
        .unwrap();
        assert_eq!(
            runtime.describe(),
            "runsc at /usr/bin/runsc (platform ptrace, network host, file access shared)"
        );

        let err = runtime_of(
            &info(&[("runsc", "/usr/bin/runsc", &["--network=host"])]),
            "runsc",
            &|_| true,
        )
        .unwrap_err();
        assert_eq!(bottle_core::Coded::code(&err), "BOT-D091");
        assert!(err.to_string().contains("--file-access"), "{err}");

        let gone = runtime_of(&info(&[("runsc", "/usr/bin/runsc", FIT)]), "runsc", &|_| {
            false
        })
        .unwrap_err();
        assert_eq!(bottle_core::Coded::code(&gone), "BOT-D091");
        assert!(
            gone.to_string().contains("/usr/bin/runsc does not exist"),
            "{gone}"
        );
    }

    #[test]
    fn the_engines_runtime_must_be_the_one_asked_for() {
        let with = |runtime: Option<&str>| ContainerInspectResponse {
            host_config: Some(HostConfig {
                runtime: runtime.map(str::to_string),
                ..HostConfig::default()
            }),
            ..ContainerInspectResponse::default()
        };
        assert_eq!(check_runtime(&with(Some("runsc")), "runsc"), Ok(()));
        assert!(
            check_runtime(&with(Some("runc")), "runsc")
                .unwrap_err()
                .contains("under runc, not runsc")
        );
        assert!(
            check_runtime(&with(None), "runsc")
                .unwrap_err()
                .contains("default")
        );
    }

    fn fake_proc(processes: &[(u32, u32, &str, &str, usize)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, ppid, cmdline, cgroup, fds) in processes {
            let p = dir.path().join(pid.to_string());
            std::fs::create_dir_all(p.join("fd")).unwrap();
            std::fs::write(p.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
            std::fs::write(p.join("cgroup"), cgroup).unwrap();
            std::fs::write(p.join("stat"), format!("{pid} (exe) S {ppid} 1 1 0 -1 0\n")).unwrap();
            for fd in 0..*fds {
                std::fs::write(p.join("fd").join(fd.to_string()), "").unwrap();
            }
        }
        dir
    }

    fn inspect_with_pid(pid: i64) -> ContainerInspectResponse {
        ContainerInspectResponse {
            state: Some(ContainerState {
                pid: Some(pid),
                running: Some(true),
                ..ContainerState::default()
            }),
            ..ContainerInspectResponse::default()
        }
    }

    #[test]
    fn the_containers_process_must_be_gvisors_sandbox() {
        let proc = fake_proc(&[
            (
                40,
                1,
                "runsc-sandbox --root=/r boot --bundle=/b id",
                "4:pids:/docker/x\n",
                3,
            ),
            (50, 1, "/pause", "4:pids:/docker/y\n", 1),
        ]);
        assert_eq!(
            check_sandbox_process(&inspect_with_pid(40), proc.path()),
            Ok(40)
        );
        assert!(
            check_sandbox_process(&inspect_with_pid(50), proc.path())
                .unwrap_err()
                .contains("not gVisor's sandbox")
        );
        assert!(check_sandbox_process(&inspect_with_pid(0), proc.path()).is_err());
        assert!(check_sandbox_process(&inspect_with_pid(60), proc.path()).is_err());
    }

    #[test]
    fn the_box_kernel_must_not_be_the_hosts() {
        let mut out = vec![0u8; crate::pause::UTSNAME_LEN];
        for (i, text) in [
            "Linux",
            "bottle",
            "4.4.0",
            "#1 SMP Sun Jan 10 15:06:54 PST 2016",
        ]
        .iter()
        .enumerate()
        {
            out[i * 65..i * 65 + text.len()].copy_from_slice(text.as_bytes());
        }
        assert_eq!(
            check_box_kernel(&out, 0, "6.18.44", "#1 SMP PREEMPT_DYNAMIC"),
            Ok("4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016".into())
        );
        assert!(
            check_box_kernel(&out, 0, "4.4.0", "#1 SMP Sun Jan 10 15:06:54 PST 2016\n")
                .unwrap_err()
                .contains("is the host's")
        );
        assert!(check_box_kernel(&out[..10], 0, "a", "b").is_err());
        assert!(check_box_kernel(&out, 1, "a", "b").is_err());
    }

    #[test]
    fn only_processes_outside_the_sandbox_count_as_strays() {
        let box_cgroup = "4:pids:/docker/box\n";
        let proc = fake_proc(&[
            (30, 1, "containerd-shim-runc-v2", "4:pids:/\n", 12),
            (39, 30, "runsc-gofer gofer", box_cgroup, 9),
            (40, 30, "runsc-sandbox boot", box_cgroup, 30),
            (41, 40, "exe", box_cgroup, 5),
            (42, 41, "exe", box_cgroup, 5),
            (70, 1, "sshd", "4:pids:/\n", 9),
        ]);
        assert_eq!(stray_descriptors(proc.path(), 40), Ok(0));
        let stray = fake_proc(&[
            (30, 1, "containerd-shim-runc-v2", "4:pids:/\n", 12),
            (40, 30, "runsc-sandbox boot", box_cgroup, 30),
            (41, 40, "exe", box_cgroup, 5),
            (90, 1, "sh", box_cgroup, 4),
        ]);
        assert_eq!(stray_descriptors(stray.path(), 40), Ok(4));
        assert!(stray_descriptors(stray.path(), 99).is_err());
        // v1 and v2 layouts.
        assert_eq!(
            pids_cgroup("9:name=systemd:/a\n8:pids:/docker/x\n0::/\n").as_deref(),
            Some("/docker/x")
        );
        assert_eq!(
            pids_cgroup("0::/system.slice/docker-x.scope\n").as_deref(),
            Some("/system.slice/docker-x.scope")
        );
        // A sandbox without a shim counts only itself as its own.
        let orphan = fake_proc(&[
            (40, 1, "runsc-sandbox boot", box_cgroup, 30),
            (39, 1, "runsc-gofer gofer", box_cgroup, 9),
        ]);
        assert_eq!(stray_descriptors(orphan.path(), 40), Ok(9));
    }
}
