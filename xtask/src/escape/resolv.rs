//! Makes the recording DNS canary the Engine's upstream resolver for the
//! run, and puts `/etc/resolv.conf` back afterwards.
//!
//! Containers created after the swap get the canary as their embedded
//! resolver's upstream. The host's own nameservers stay listed after it:
//! the canary answers SERVFAIL outside its zone, so the rest of the machine
//! (and other users of this Docker Engine) keep resolving while the gate
//! runs.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::teardown;

/// The file Docker reads.
pub(crate) const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The temporary file: the canary first, then the host's own nameservers.
pub(crate) fn swapped(original: &str, canary: Ipv4Addr) -> String {
    let mut out = format!(
        "# bottle sandbox-escape gate: recording DNS canary first (restored at the end)\nnameserver {canary}\n"
    );
    let mut kept = 0;
    for line in original.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("nameserver")
            && let Some(server) = words.next()
            && server != canary.to_string()
            && kept < 2
        {
            // Docker ignores loopback nameservers for containers; keeping
            // them is harmless for the host.
            out.push_str(&format!("nameserver {server}\n"));
            kept += 1;
        }
    }
    out.push_str("options attempts:1 timeout:2\n");
    out
}

/// The swapped `/etc/resolv.conf`; restored when dropped (and on Ctrl-C).
pub(crate) struct ResolvGuard {
    teardown_id: u64,
}

impl ResolvGuard {
    /// Swaps `path` (following a symlink to the real file) for one listing
    /// `canary` first.
    pub(crate) fn swap(path: &Path, canary: Ipv4Addr) -> anyhow::Result<ResolvGuard> {
        let real: PathBuf = std::fs::canonicalize(path)
            .with_context(|| format!("could not resolve {}", path.display()))?;
        let original =
            std::fs::read(&real).with_context(|| format!("could not read {}", real.display()))?;
        let text = String::from_utf8_lossy(&original).into_owned();
        let restore_path = real.clone();
        let teardown_id = teardown::register("restore /etc/resolv.conf", move || {
            if let Err(err) = std::fs::write(&restore_path, &original) {
                eprintln!(
                    "sandbox-escape: could not restore {}: {err}\n  fix: put the host's nameservers back by hand",
                    restore_path.display()
                );
            }
        });
        let guard = ResolvGuard { teardown_id };
        std::fs::write(&real, swapped(&text, canary))
            .with_context(|| format!("could not write {}", real.display()))?;
        Ok(guard)
    }
}

impl Drop for ResolvGuard {
    fn drop(&mut self) {
        teardown::run(self.teardown_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canary_comes_first_and_the_host_servers_follow() {
        let original = "# generated\nsearch lan\nnameserver 10.255.255.53\nnameserver 10.255.255.54\nnameserver 10.255.255.55\n";
        let out = swapped(original, Ipv4Addr::new(203, 0, 113, 53));
        let servers: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("nameserver "))
            .collect();
        // At most three nameservers count for glibc.
        assert_eq!(servers, ["203.0.113.53", "10.255.255.53", "10.255.255.54"]);
        assert!(!out.contains("search lan"));
    }

    #[test]
    fn the_file_is_restored_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.conf");
        let link = dir.path().join("resolv.conf");
        std::fs::write(&real, "nameserver 10.0.0.2\n").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        {
            let _guard = ResolvGuard::swap(&link, Ipv4Addr::new(203, 0, 113, 53)).unwrap();
            let during = std::fs::read_to_string(&real).unwrap();
            assert!(
                during.contains("nameserver 203.0.113.53\nnameserver 10.0.0.2\n"),
                "{during}"
            );
            assert!(
                std::fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
        }
        assert_eq!(
            std::fs::read_to_string(&real).unwrap(),
            "nameserver 10.0.0.2\n"
        );
    }
}
