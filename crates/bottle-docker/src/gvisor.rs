//! The gVisor tier of a docker bottle (`isolation = "gvisor"`): the agent
//! container runs under the Engine's `runsc` runtime, the bundle stays on
//! runc.
//!
//! - Before anything is created, [`runtime_of`] finds the runtime in the
//!   daemon's `GET /info` and refuses a daemon without one (`BOT-D090`) or
//!   with a registration that cannot run a bottle's box (`BOT-D091`, judged
//!   by [`bottle_core::isolation::assess`]).
//! - After the agent container starts, the launch checks that it really
//!   runs under gVisor, from three places: the Engine's record
//!   (`HostConfig.Runtime`), the host kernel (the container's init process
//!   is gVisor's sandbox, `runsc-sandbox ... boot`, running the registered
//!   runsc binary), and the box itself
//!   (the kernel answering `uname(2)` inside is not the host's). Any one
//!   that disagrees refuses the bottle (`BOT-D092`) and the launch unwinds.
//! - A reset's descriptor source cannot read the box's processes from the
//!   host's `/proc` (they live in gVisor's kernel, and the sandbox shares
//!   the host's pid namespace); `stray_descriptors` counts what could
//!   outlive a revert instead: host processes in the box's cgroup that do
//!   not run gVisor's binary.

use std::path::{Path, PathBuf};

use bollard::models::{ContainerInspectResponse, SystemInfo};
use bottle_core::isolation::{GvisorSetup, Registration};

use crate::error::DockerError;
use crate::pause::{UNAME_PATH, parse_utsname};

/// The daemon's gVisor runtime, as `GET /info` registers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorRuntime {
    /// Its registered name (`runsc`).
    pub name: String,
    /// Its binary as registered.
    pub path: String,
    /// That binary on this host, canonical (the daemon runs here: bind
    /// mounts and resets already need that).
    pub binary: PathBuf,
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
/// bottle cannot run on it. `find_binary` finds a registered path on this
/// host, canonical ([`host_binary`]).
pub fn runtime_of(
    info: &SystemInfo,
    name: &str,
    find_binary: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<GvisorRuntime, DockerError> {
    let runtimes = info.runtimes.clone().unwrap_or_default();
    let Some(runtime) = runtimes.get(name) else {
        return Err(DockerError::GvisorMissing {
            runtime: name.into(),
            registered: crate::runsc::runtime_names(runtimes.keys()),
        });
    };
    let registration = Registration {
        path: runtime.path.clone().unwrap_or_default(),
        args: runtime.runtime_args.clone().unwrap_or_default(),
    };
    let path = registration.path.clone();
    let binary = find_binary(&path);
    let missing = binary.is_none();
    let mut problems = match (bottle_core::isolation::assess(&registration), binary) {
        (Ok(setup), Some(binary)) => {
            return Ok(GvisorRuntime {
                name: name.into(),
                path,
                binary,
                setup,
            });
        }
        (Ok(_), None) => Vec::new(),
        (Err(unfit), _) => unfit,
    };
    if missing {
        problems.insert(0, format!("{path} is not a program on this host"));
    }
    Err(DockerError::GvisorUnfit {
        runtime: name.into(),
        path,
        problems: problems.join("; "),
    })
}

/// A runtime's registered path as the daemon finds it (absolute, or
/// looked up in `PATH`), canonical; `None` when no such file exists.
pub fn host_binary(path: &str) -> Option<PathBuf> {
    let found = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        let dirs = std::env::var_os("PATH")?;
        std::env::split_paths(&dirs)
            .map(|dir| dir.join(path))
            .find(|candidate| candidate.is_file())?
    };
    std::fs::canonicalize(found).ok().filter(|p| p.is_file())
}

/// The host's side of a gVisor box, checked at launch and at every claim
/// and reset: the Engine runs it under `runtime` ([`check_runtime`]) and
/// its process is gVisor's sandbox running `binary`
/// ([`check_sandbox_process`]).
pub(crate) fn check_host_side(
    inspect: &ContainerInspectResponse,
    runtime: &str,
    binary: &Path,
) -> Result<(), String> {
    check_runtime(inspect, runtime)?;
    check_sandbox_process(inspect, Path::new("/proc"), binary).map(drop)
}

/// The Engine's record: the container runs under `runtime`.
fn check_runtime(inspect: &ContainerInspectResponse, runtime: &str) -> Result<(), String> {
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
/// `State.Pid`) is gVisor's sandbox, `runsc-sandbox ... boot`, and the
/// program it runs is `binary`, the registered runsc (argv is the
/// process's to write; its executable is the kernel's record).
pub(crate) fn check_sandbox_process(
    inspect: &ContainerInspectResponse,
    proc_root: &Path,
    binary: &Path,
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
    if argv0 != "runsc-sandbox" || !args.iter().any(|a| a == "boot") {
        return Err(format!(
            "the agent container's process {pid} on the host is {argv0:?}, not gVisor's sandbox (runsc-sandbox boot)"
        ));
    }
    let exe_link = proc_root.join(pid.to_string()).join("exe");
    let exe = std::fs::read_link(&exe_link)
        .map_err(|err| format!("cannot read {}: {err}", exe_link.display()))?;
    if exe != binary {
        return Err(format!(
            "the agent container's process {pid} on the host runs {}, not the registered gVisor {}",
            exe.display(),
            binary.display()
        ));
    }
    Ok(pid)
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
/// init is `sandbox_pid` (or below it) that do not run gVisor's `binary`
/// (the sandbox, its stubs, its gofer and each exec's `runsc exec` all
/// do): what could outlive a revert that killed the sandbox. 0 in a box
/// as launched; any other program there, whoever started it, shows here.
pub(crate) fn stray_descriptors(
    proc_root: &Path,
    sandbox_pid: u32,
    binary: &Path,
) -> Result<u64, String> {
    let cgroup_of = |pid: u32| -> Option<String> {
        let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        pids_cgroup(&text)
    };
    let own = cgroup_of(sandbox_pid)
        .ok_or_else(|| format!("cannot read the cgroup of the sandbox {sandbox_pid}"))?;
    let below = format!("{}/", own.trim_end_matches('/'));
    let entries = std::fs::read_dir(proc_root)
        .map_err(|err| format!("cannot list {}: {err}", proc_root.display()))?;
    let mut strays = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(cgroup) = cgroup_of(pid) else {
            continue;
        };
        if cgroup != own && !cgroup.starts_with(&below) {
            continue;
        }
        // A process that ended between listing and reading holds nothing.
        let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        if exe == binary {
            continue;
        }
        if let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) {
            strays += fds.count() as u64;
        }
    }
    Ok(strays)
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

    fn found(path: &str) -> Option<PathBuf> {
        Some(PathBuf::from(path))
    }

    const FIT: &[&str] = &[
        "--platform=ptrace",
        "--network=host",
        "--file-access=shared",
        "--overlay2=none",
        "--oci-seccomp",
    ];

    #[test]
    fn a_daemon_without_runsc_is_refused_naming_what_it_has() {
        let err = runtime_of(&info(&[("runc", "runc", &[])]), "runsc", &found).unwrap_err();
        assert_eq!(bottle_core::Coded::code(&err), "BOT-D090");
        assert!(err.to_string().contains("its runtimes: runc"), "{err}");
        let fix = bottle_core::Coded::fix(&err).unwrap();
        for step in ["apt-get install runsc", "daemon.json", "kill -HUP"] {
            assert!(fix.contains(step), "{fix}");
        }
        let none = runtime_of(&SystemInfo::default(), "runsc", &found).unwrap_err();
        assert!(none.to_string().contains("none reported"), "{none}");
    }

    #[test]
    fn an_unfit_or_missing_registration_is_refused_with_every_reason() {
        let runtime = runtime_of(
            &info(&[("runc", "runc", &[]), ("runsc", "/usr/bin/runsc", FIT)]),
            "runsc",
            &found,
        )
        .unwrap();
        assert_eq!(
            runtime.describe(),
            "runsc at /usr/bin/runsc (platform ptrace, network host, file access shared)"
        );

        let err = runtime_of(
            &info(&[("runsc", "/usr/bin/runsc", &["--network=host"])]),
            "runsc",
            &found,
        )
        .unwrap_err();
        assert_eq!(bottle_core::Coded::code(&err), "BOT-D091");
        assert!(err.to_string().contains("--file-access"), "{err}");

        let gone = runtime_of(&info(&[("runsc", "/usr/bin/runsc", FIT)]), "runsc", &|_| {
            None
        })
        .unwrap_err();
        assert_eq!(bottle_core::Coded::code(&gone), "BOT-D091");
        assert!(
            gone.to_string()
                .contains("/usr/bin/runsc is not a program on this host"),
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
            let program = cmdline.split(' ').next().unwrap_or_default();
            let exe = if program.starts_with("runsc") {
                "/usr/bin/runsc".to_string()
            } else {
                format!("/usr/bin/{program}")
            };
            std::os::unix::fs::symlink(exe, p.join("exe")).unwrap();
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
    fn the_containers_process_must_be_gvisors_sandbox_running_the_registered_binary() {
        let proc = fake_proc(&[
            (
                40,
                1,
                "runsc-sandbox --root=/r boot --bundle=/b id",
                "4:pids:/docker/x\n",
                3,
            ),
            (50, 1, "/pause", "4:pids:/docker/y\n", 1),
            // Any program may call itself runsc-sandbox: its executable
            // is what counts.
            (
                60,
                1,
                "runsc-sandbox-impostor boot",
                "4:pids:/docker/z\n",
                1,
            ),
        ]);
        std::fs::remove_file(proc.path().join("60/cmdline")).unwrap();
        std::fs::write(proc.path().join("60/cmdline"), "runsc-sandbox\0boot\0").unwrap();
        std::fs::remove_file(proc.path().join("60/exe")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/runc", proc.path().join("60/exe")).unwrap();
        let runsc = Path::new("/usr/bin/runsc");
        assert_eq!(
            check_sandbox_process(&inspect_with_pid(40), proc.path(), runsc),
            Ok(40)
        );
        assert!(
            check_sandbox_process(&inspect_with_pid(50), proc.path(), runsc)
                .unwrap_err()
                .contains("not gVisor's sandbox")
        );
        let impostor =
            check_sandbox_process(&inspect_with_pid(60), proc.path(), runsc).unwrap_err();
        assert!(
            impostor.contains("runs /usr/bin/runc, not the registered gVisor /usr/bin/runsc"),
            "{impostor}"
        );
        // Another runsc than the registered one is not it either.
        assert!(
            check_sandbox_process(&inspect_with_pid(40), proc.path(), Path::new("/opt/runsc"))
                .is_err()
        );
        assert!(check_sandbox_process(&inspect_with_pid(0), proc.path(), runsc).is_err());
        assert!(check_sandbox_process(&inspect_with_pid(70), proc.path(), runsc).is_err());
    }

    #[test]
    fn the_box_kernel_must_not_be_the_hosts() {
        let out = crate::pause::gvisor_utsname();
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
    fn only_programs_other_than_gvisor_in_the_box_cgroup_count_as_strays() {
        let box_cgroup = "4:pids:/docker/box\n";
        let runsc = Path::new("/usr/bin/runsc");
        let proc = fake_proc(&[
            (30, 1, "containerd-shim-runc-v2", "4:pids:/\n", 12),
            (39, 30, "runsc-gofer gofer", box_cgroup, 9),
            (40, 30, "runsc-sandbox boot", box_cgroup, 30),
            // The ptrace platform's stubs are forks of the sandbox.
            (41, 40, "runsc-sandbox boot", box_cgroup, 5),
            (42, 41, "runsc-sandbox boot", box_cgroup, 5),
            (70, 1, "sshd", "4:pids:/\n", 9),
        ]);
        assert_eq!(stray_descriptors(proc.path(), 40, runsc), Ok(0));
        let stray = fake_proc(&[
            (30, 1, "containerd-shim-runc-v2", "4:pids:/\n", 12),
            (40, 30, "runsc-sandbox boot", box_cgroup, 30),
            // Started by the sandbox itself, yet not gVisor's program.
            (41, 40, "sh", box_cgroup, 4),
            // In a cgroup below the box's.
            (90, 1, "nc", "4:pids:/docker/box/sub\n", 3),
            // Beside it, not below.
            (91, 1, "nc", "4:pids:/docker/boxer\n", 6),
        ]);
        assert_eq!(stray_descriptors(stray.path(), 40, runsc), Ok(7));
        assert!(stray_descriptors(stray.path(), 99, runsc).is_err());
        // v1 and v2 layouts.
        assert_eq!(
            pids_cgroup("9:name=systemd:/a\n8:pids:/docker/x\n0::/\n").as_deref(),
            Some("/docker/x")
        );
        assert_eq!(
            pids_cgroup("0::/system.slice/docker-x.scope\n").as_deref(),
            Some("/system.slice/docker-x.scope")
        );
    }
}
