//! Resolving the manifest's device requests against this host for a plan.

use std::path::Path;

use bottle_core::BottleSpec;
use bottle_core::devices::{self, AdminPolicy, DevicePolicy, ResolvedDevices};

use crate::failure::{EXIT_USAGE, Failure};

/// Loads the admin policy: `/etc/bottle/policy.toml`, plus the file named by
/// `BOTTLE_POLICY_FILE` if set. The override can only add to the system
/// file's blacklist, never replace it, so a user cannot point it at a
/// permissive file to get around the administrator.
pub(crate) fn admin_policy() -> Result<AdminPolicy, Failure> {
    let load =
        |path: &Path| AdminPolicy::load(path).map_err(|err| Failure::coded(&err, EXIT_USAGE));
    let mut policy = load(Path::new(devices::DEFAULT_POLICY_FILE))?;
    if let Ok(extra) = std::env::var(devices::POLICY_FILE_ENV) {
        let extra = load(Path::new(&extra))?;
        policy.devices_blacklist.extend(extra.devices_blacklist);
        if policy.file.is_none() {
            policy.file = extra.file;
        }
    }
    Ok(policy)
}

/// Resolves the spec's device requests against the host's `/dev` (none
/// for a gVisor box, with a warning).
pub(crate) fn resolve(spec: &BottleSpec) -> Result<ResolvedDevices, Failure> {
    let admin = admin_policy()?;
    let policy =
        DevicePolicy::for_spec(spec, &admin).map_err(|err| Failure::coded(&err, EXIT_USAGE))?;
    // An unknown kernel counts as old: the /dev/pts rule then stays strict.
    let kernel = bottle_preflight::kernel_version(&bottle_preflight::HostRoot::host())
        .ok()
        .flatten();
    let mut resolved = policy
        .resolve(Path::new("/"), kernel)
        .map_err(|err| Failure::coded(&err, EXIT_USAGE))?;
    devices::drop_for_isolation(&mut resolved, spec.agent.isolation);
    Ok(resolved)
}
