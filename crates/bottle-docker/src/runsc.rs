//! How the Engine is told of gVisor: the `daemon.json` registration bottle
//! asks for, the fix that quotes it, and the daemon's runtimes named in a
//! message. What a registration must be is core's
//! (`bottle_core::isolation::assess`), for any engine that runs runsc.

/// The registration bottle asks for, as `daemon.json` holds it: the
/// platform this host has (ptrace works everywhere; systrap or kvm where
/// the build and the host have them), the box's own network namespace,
/// and revalidated file access to the root filesystem.
pub const GVISOR_DAEMON_JSON: &str = r#"{ "runtimes": { "runsc": { "path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", "--network=host", "--file-access=shared", "--overlay2=none", "--oci-seccomp"] } } }"#;

/// How to get a usable gVisor runtime, for error fixes and the doctor.
pub const GVISOR_FIX: &str = "install gVisor (Debian: `apt-get install runsc`), register it with the docker daemon as `runsc` in /etc/docker/daemon.json (bottle's CI writes { \"runtimes\": { \"runsc\": { \"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--platform=ptrace\", \"--network=host\", \"--file-access=shared\", \"--overlay2=none\", \"--oci-seccomp\"] } } }) and reload the daemon without restarting it: `kill -HUP $(pidof dockerd)`; `bottle doctor` checks it";

/// The names of the daemon's runtimes, sorted, for a message saying which
/// it has.
pub fn runtime_names<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    let mut names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    names.sort_unstable();
    if names.is_empty() {
        "none reported".into()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use bottle_core::isolation::{Registration, assess};

    use super::*;

    #[test]
    fn the_registration_the_fixes_quote_is_fit() {
        let json: serde_json::Value = serde_json::from_str(GVISOR_DAEMON_JSON).unwrap();
        let args: Vec<String> = json["runtimes"]["runsc"]["runtimeArgs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert!(GVISOR_FIX.contains(&args.join("\", \"")), "{GVISOR_FIX}");
        assert!(
            assess(&Registration {
                path: String::new(),
                args
            })
            .is_ok()
        );
    }

    #[test]
    fn the_daemons_runtimes_are_named_sorted() {
        let names = ["runsc".to_string(), "runc".to_string()];
        assert_eq!(runtime_names(&names), "runc, runsc");
        assert_eq!(runtime_names(&[]), "none reported");
    }
}
