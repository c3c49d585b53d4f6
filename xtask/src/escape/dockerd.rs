//! Restarting the Docker daemon mid-run (a fault the gate injects): through
//! systemd when it manages dockerd, otherwise by stopping the running
//! `dockerd` and starting it again, detached, with the same arguments.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::engine::EngineSocket;
use super::sys::{Run, Sys};

/// Where a dockerd the gate starts writes its output.
pub(crate) const LOG: &str = "/var/log/bottle-escape-dockerd.log";

/// PIDs of processes whose `comm` is `name`.
pub(crate) fn pids_named(name: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect()
}

/// Splits `/proc/<pid>/cmdline`.
pub(crate) fn parse_cmdline(raw: &[u8]) -> Vec<String> {
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The `sh -c` line that starts `argv` in its own session, detached from
/// the gate, output appended to [`LOG`].
pub(crate) fn detached_start(argv: &[String]) -> Run {
    let mut args = vec![
        "-c".to_string(),
        format!("setsid -f \"$@\" >>{LOG} 2>&1 </dev/null"),
        "sh".to_string(),
    ];
    args.extend(argv.iter().cloned());
    Run::new("sh", &args)
}

/// Restarts dockerd and waits until the Engine answers again; returns how.
pub(crate) fn restart(sys: &Arc<dyn Sys>, engine: &EngineSocket) -> anyhow::Result<String> {
    let systemd = sys
        .output(&Run::new("systemctl", &["is-active", "docker"]))
        .is_ok_and(|o| o.success() && o.stdout.trim() == "active");
    let how = if systemd {
        sys.run("systemctl", &["restart", "docker"])?;
        "systemctl restart docker".to_string()
    } else {
        let pids = pids_named("dockerd");
        let [pid] = pids.as_slice() else {
            bail!(
                "expected one dockerd process, found {pids:?}\n  fix: run the gate where one Docker daemon runs, or pass --skip-dockerd-restart"
            );
        };
        let pid = *pid;
        let argv = parse_cmdline(
            &std::fs::read(format!("/proc/{pid}/cmdline"))
                .with_context(|| format!("reading dockerd's command line (pid {pid})"))?,
        );
        if argv.is_empty() {
            bail!("dockerd (pid {pid}) has an empty command line");
        }
        let target = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM)
            .with_context(|| format!("stopping dockerd (pid {pid})"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if Path::new(&format!("/proc/{pid}")).exists() {
            let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
            std::thread::sleep(Duration::from_secs(1));
        }
        let start = detached_start(&argv);
        let out = sys.output(&start)?;
        if !out.success() {
            bail!(
                "starting dockerd again (`{}`) failed: {}\n  fix: start dockerd by hand",
                start.display(),
                out.stderr.trim()
            );
        }
        format!(
            "SIGTERM to dockerd (pid {pid}), then `{}` detached",
            argv.join(" ")
        )
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while !engine.ping() {
        if Instant::now() > deadline {
            bail!(
                "the Docker Engine did not answer within 90 s after `{how}` (log: {LOG})\n  fix: start dockerd by hand"
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(how)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdlines_split_on_nul() {
        assert_eq!(
            parse_cmdline(b"dockerd\0--debug\0-H\0unix:///x\0"),
            ["dockerd", "--debug", "-H", "unix:///x"]
        );
        assert!(parse_cmdline(b"").is_empty());
    }

    #[test]
    fn the_daemon_starts_in_its_own_session_with_its_own_arguments() {
        let run = detached_start(&["dockerd".into(), "--data-root".into(), "/d r".into()]);
        assert_eq!(run.program, "sh");
        assert_eq!(run.args[0], "-c");
        assert_eq!(
            run.args[1],
            format!("setsid -f \"$@\" >>{LOG} 2>&1 </dev/null")
        );
        assert_eq!(&run.args[2..], ["sh", "dockerd", "--data-root", "/d r"]);
    }

    #[test]
    fn this_process_is_found_by_name() {
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert!(pids_named(comm.trim()).contains(&std::process::id()));
    }
}
