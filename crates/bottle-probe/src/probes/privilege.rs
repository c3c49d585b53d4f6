//! The process's own privileges: effective capabilities, the
//! no-new-privileges flag, the seccomp filter, and whether it can become
//! root.

use super::{Attempt, Probe};
use crate::sys;

const CAT: &str = "privilege";

/// The privilege probes.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "priv-capabilities",
            CAT,
            false,
            "CapEff in /proc/self/status: blocked when it is 0",
            |_| capabilities(&sys_status()),
        ),
        Probe::new(
            "priv-no-new-privs",
            CAT,
            false,
            "NoNewPrivs in /proc/self/status (or prctl(PR_GET_NO_NEW_PRIVS) where the status has no such line, as gVisor's): blocked when it is 1 (setuid binaries cannot raise privileges)",
            |_| no_new_privs(&sys_status(), nix::sys::prctl::get_no_new_privs().ok()),
        ),
        Probe::new(
            "priv-seccomp",
            CAT,
            false,
            "Seccomp in /proc/self/status: blocked when it is 2 (a filter is installed)",
            |_| field_is(&sys_status(), "Seccomp", "2"),
        ),
        Probe::new(
            "priv-setuid-root",
            CAT,
            false,
            "setuid(0): blocked unless it succeeds or the probe already runs as uid 0",
            |_| setuid_root(),
        ),
    ]
}

fn sys_status() -> Option<String> {
    std::fs::read_to_string("/proc/self/status").ok()
}

pub(super) fn capabilities(status: &Option<String>) -> Attempt {
    let Some(text) = status else {
        return Attempt::error("/proc/self/status unreadable");
    };
    let Some(eff) = sys::status_field_in(text, "CapEff") else {
        return Attempt::error("no CapEff in /proc/self/status");
    };
    let fields = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
        .iter()
        .map(|k| format!("{k}={}", sys::status_field_in(text, k).unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(" ");
    match u64::from_str_radix(&eff, 16) {
        Ok(0) => Attempt::blocked(fields),
        Ok(_) => Attempt::reached(format!("effective capabilities present: {fields}")),
        Err(_) => Attempt::error(format!("CapEff {eff:?} is not hex")),
    }
}

/// NoNewPrivs from the status, else the kernel's own answer (`prctl`):
/// gVisor's `/proc/<pid>/status` has no NoNewPrivs line.
pub(super) fn no_new_privs(status: &Option<String>, prctl: Option<bool>) -> Attempt {
    let in_status = status
        .as_deref()
        .and_then(|text| sys::status_field_in(text, "NoNewPrivs"));
    match (in_status, prctl) {
        (Some(_), _) | (None, None) => field_is(status, "NoNewPrivs", "1"),
        (None, Some(true)) => {
            Attempt::blocked("prctl(PR_GET_NO_NEW_PRIVS): 1 (no NoNewPrivs line in the status)")
        }
        (None, Some(false)) => Attempt::reached(
            "prctl(PR_GET_NO_NEW_PRIVS): 0 (no NoNewPrivs line in the status; want 1)",
        ),
    }
}

pub(super) fn field_is(status: &Option<String>, name: &str, want: &str) -> Attempt {
    let Some(text) = status else {
        return Attempt::error("/proc/self/status unreadable");
    };
    match sys::status_field_in(text, name) {
        Some(v) if v == want => Attempt::blocked(format!("{name}: {v}")),
        Some(v) => Attempt::reached(format!("{name}: {v} (want {want})")),
        None => Attempt::reached(format!(
            "{name}: absent from /proc/self/status (want {want})"
        )),
    }
}

fn setuid_root() -> Attempt {
    use nix::unistd::{Uid, geteuid, getuid, setuid};
    if getuid().is_root() || geteuid().is_root() {
        return Attempt::reached(format!("already root: uid {} euid {}", getuid(), geteuid()));
    }
    match setuid(Uid::from_raw(0)) {
        Ok(()) => Attempt::reached("setuid(0) succeeded"),
        Err(e) => Attempt::blocked(format!(
            "setuid(0) as uid {}: {e:?}: {}",
            getuid(),
            e.desc()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Outcome;

    #[test]
    fn judges_status_fields() {
        let dropped = Some("CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n".to_string());
        assert_eq!(capabilities(&dropped).outcome, Outcome::Blocked);
        assert_eq!(
            field_is(&dropped, "NoNewPrivs", "1").outcome,
            Outcome::Blocked
        );
        assert_eq!(field_is(&dropped, "Seccomp", "2").outcome, Outcome::Blocked);
        let root = Some("CapEff:\t000001ffffffffff\nNoNewPrivs:\t0\nSeccomp:\t0\n".to_string());
        assert_eq!(capabilities(&root).outcome, Outcome::Reached);
        assert_eq!(field_is(&root, "NoNewPrivs", "1").outcome, Outcome::Reached);
        assert_eq!(field_is(&root, "Seccomp", "2").outcome, Outcome::Reached);
        assert_eq!(capabilities(&None).outcome, Outcome::Error);
    }

    #[test]
    fn no_new_privs_comes_from_the_kernel_where_the_status_lacks_it() {
        let linux = Some("NoNewPrivs:\t1\nSeccomp:\t2\n".to_string());
        assert_eq!(no_new_privs(&linux, Some(false)).outcome, Outcome::Blocked);
        let gvisor = Some("CapEff:\t0000000000000000\nSeccomp:\t0\n".to_string());
        assert_eq!(no_new_privs(&gvisor, Some(true)).outcome, Outcome::Blocked);
        assert_eq!(no_new_privs(&gvisor, Some(false)).outcome, Outcome::Reached);
        assert_eq!(no_new_privs(&gvisor, None).outcome, Outcome::Reached);
    }
}
