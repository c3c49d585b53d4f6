//! Counting the open descriptors of every process in the box (the reset's
//! second source, for a box whose `/proc` the host cannot read).

use std::path::Path;

use bottle_core::sandbox::wire::Reply;

/// Counts the descriptors of every process under `proc` except `own_pid`
/// (this agent, whose descriptors are the channel's, not the box's).
pub(crate) fn count(proc: &Path, own_pid: u32) -> Reply {
    let mut count = 0;
    let mut processes = 0;
    let mut unreadable = 0;
    let entries = match std::fs::read_dir(proc) {
        Ok(entries) => entries,
        Err(err) => {
            return Reply::Error {
                message: format!("cannot read {}: {err}", proc.display()),
            };
        }
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own_pid {
            continue;
        }
        match std::fs::read_dir(entry.path().join("fd")) {
            Ok(fds) => {
                processes += 1;
                count += fds.count() as u64;
            }
            // A process that ended between the two reads is not counted.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => {
                processes += 1;
                unreadable += 1;
            }
        }
    }
    Reply::OpenFds {
        count,
        processes,
        unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_process_but_its_own() {
        let proc = tempfile::tempdir().unwrap();
        for (pid, fds) in [("1", 3), ("42", 2), ("7", 5)] {
            let dir = proc.path().join(pid).join("fd");
            std::fs::create_dir_all(&dir).unwrap();
            for fd in 0..fds {
                std::fs::write(dir.join(fd.to_string()), b"").unwrap();
            }
        }
        std::fs::create_dir_all(proc.path().join("self")).unwrap();
        std::fs::create_dir_all(proc.path().join("99")).unwrap();
        assert_eq!(
            count(proc.path(), 7),
            Reply::OpenFds {
                count: 5,
                processes: 2,
                unreadable: 0
            }
        );
    }
}
