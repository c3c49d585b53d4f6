//! The cap on an agent's writable layer (`limits.disk`): whether the
//! daemon's storage driver can enforce one, judged from what the Engine's
//! `GET /info` reports.
//!
//! The plan, the launch and `bottle doctor`'s `docker.disk_quota` read the
//! same answer from here, so the plan and the doctor never disagree.
//!
//! What enforces `HostConfig.StorageOpt.size` follows moby's graph drivers:
//! `btrfs` (a qgroup), `zfs` (the dataset quota), `devicemapper` (a
//! thin device of that size) and `windowsfilter` always can; `overlay2` can
//! only over xfs, and only when the filesystem is mounted with `pquota`
//! (`daemon/graphdriver/overlay2`: project quotas are tried on xfs alone,
//! and otherwise a create with a size fails "--storage-opt is supported
//! only for overlay over xfs with 'pquota' mount option"). `/info` names
//! the backing filesystem but not its mount options, so for overlay2 on
//! xfs the Engine's answer to the create is what settles it. Any other
//! driver is taken as unable to: failing closed beats trusting a cap
//! nobody verified.

use bollard::models::SystemInfo;
use bottle_core::disk::format_size;

/// The `DriverStatus` key under which overlay2 names its filesystem.
const BACKING_FILESYSTEM: &str = "Backing Filesystem";

/// Drivers that enforce `StorageOpt size` whatever they sit on.
const ENFORCING_DRIVERS: &[&str] = &["btrfs", "zfs", "devicemapper", "windowsfilter"];

/// Whether the daemon's storage can cap a container's writable layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerCap {
    /// The driver enforces a size.
    Enforced {
        /// The storage, e.g. `btrfs`.
        storage: String,
    },
    /// overlay2 on xfs: enforced if the filesystem is mounted with
    /// `pquota`, which only the Engine's answer to a create can tell.
    IfPquota {
        /// The storage, `overlay2 on xfs`.
        storage: String,
    },
    /// The driver cannot limit a container's writable layer.
    Unsupported {
        /// The storage, e.g. `overlay2 on extfs`.
        storage: String,
    },
}

impl LayerCap {
    /// Judges a daemon's storage from `GET /info`'s `Driver` and
    /// `DriverStatus` (label, value pairs).
    pub fn of_docker<'a>(
        driver: &str,
        driver_status: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> LayerCap {
        let backing = driver_status
            .into_iter()
            .find(|(label, _)| *label == BACKING_FILESYSTEM)
            .map(|(_, value)| value);
        let storage = match backing {
            Some(fs) => format!("{driver} on {fs}"),
            None if driver.is_empty() => "an unnamed storage driver".to_string(),
            None => driver.to_string(),
        };
        if ENFORCING_DRIVERS.contains(&driver) {
            LayerCap::Enforced { storage }
        } else if driver == "overlay2" && backing == Some("xfs") {
            LayerCap::IfPquota { storage }
        } else {
            LayerCap::Unsupported { storage }
        }
    }

    /// Judges the storage `GET /info` reports.
    pub fn of_info(info: &SystemInfo) -> LayerCap {
        let status = info.driver_status.as_deref().unwrap_or_default();
        LayerCap::of_docker(
            info.driver.as_deref().unwrap_or_default(),
            status.iter().filter_map(|pair| match pair.as_slice() {
                [label, value] => Some((label.as_str(), value.as_str())),
                _ => None,
            }),
        )
    }

    /// The storage as the operator should read it.
    pub fn storage(&self) -> &str {
        match self {
            LayerCap::Enforced { storage }
            | LayerCap::IfPquota { storage }
            | LayerCap::Unsupported { storage } => storage,
        }
    }

    /// The plan's `disk` line for a cap of `bytes` (`None`: the manifest
    /// sets no `limits.disk`).
    pub fn plan_line(&self, bytes: Option<u64>) -> String {
        match (self, bytes) {
            (LayerCap::Enforced { storage }, Some(bytes)) => {
                format!("capped at {} ({storage})", format_size(bytes))
            }
            (LayerCap::IfPquota { storage }, Some(bytes)) => {
                format!("capped at {} ({storage}, pquota)", format_size(bytes))
            }
            (LayerCap::Unsupported { storage }, None) => {
                format!("NOT capped — {storage} cannot limit a container's writable layer")
            }
            (LayerCap::Unsupported { storage }, Some(bytes)) => format!(
                "NOT capped — {storage} cannot limit a container's writable layer, so `bottle start` refuses the {} cap (BOT-D080)",
                format_size(bytes)
            ),
            (LayerCap::Enforced { storage } | LayerCap::IfPquota { storage }, None) => {
                format!("NOT capped — limits.disk is not set ({storage} could cap it)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(driver: &str, status: &[(&str, &str)]) -> LayerCap {
        LayerCap::of_docker(driver, status.iter().copied())
    }

    #[test]
    fn overlay2_caps_only_on_xfs() {
        let ext4 = judge(
            "overlay2",
            &[("Backing Filesystem", "extfs"), ("Supports d_type", "true")],
        );
        assert_eq!(
            ext4,
            LayerCap::Unsupported {
                storage: "overlay2 on extfs".into()
            }
        );
        assert_eq!(
            judge("overlay2", &[("Backing Filesystem", "xfs")]),
            LayerCap::IfPquota {
                storage: "overlay2 on xfs".into()
            }
        );
        assert!(matches!(
            judge("overlay2", &[]),
            LayerCap::Unsupported { .. }
        ));
    }

    #[test]
    fn drivers_that_always_cap_and_unknown_ones() {
        for driver in ["btrfs", "zfs", "devicemapper", "windowsfilter"] {
            assert!(
                matches!(judge(driver, &[]), LayerCap::Enforced { .. }),
                "{driver}"
            );
        }
        for driver in ["vfs", "fuse-overlayfs", "overlayfs", ""] {
            assert!(
                matches!(judge(driver, &[]), LayerCap::Unsupported { .. }),
                "{driver:?}"
            );
        }
        assert_eq!(judge("", &[]).storage(), "an unnamed storage driver");
    }

    #[test]
    fn plan_lines_say_what_holds() {
        let xfs = judge("overlay2", &[("Backing Filesystem", "xfs")]);
        assert_eq!(
            xfs.plan_line(Some(10 << 30)),
            "capped at 10 GiB (overlay2 on xfs, pquota)"
        );
        assert_eq!(
            xfs.plan_line(None),
            "NOT capped — limits.disk is not set (overlay2 on xfs could cap it)"
        );
        let ext4 = judge("overlay2", &[("Backing Filesystem", "extfs")]);
        assert_eq!(
            ext4.plan_line(None),
            "NOT capped — overlay2 on extfs cannot limit a container's writable layer"
        );
        assert_eq!(
            ext4.plan_line(Some(10 << 30)),
            "NOT capped — overlay2 on extfs cannot limit a container's writable layer, so \
             `bottle start` refuses the 10 GiB cap (BOT-D080)"
        );
        assert_eq!(
            judge("btrfs", &[]).plan_line(Some(512 << 20)),
            "capped at 512 MiB (btrfs)"
        );
    }

    /// `GET /info` as a Docker 28 daemon on overlay2 over ext4 sends it
    /// (the fields this reads, with their neighbours).
    const INFO_OVERLAY2_EXT4: &str = r#"{"Driver":"overlay2","DriverStatus":[["Backing Filesystem","extfs"],["Supports d_type","true"],["Using metacopy","false"],["Native Overlay Diff","true"],["userxattr","false"]],"Architecture":"x86_64","DockerRootDir":"/var/lib/docker"}"#;

    fn info_with(driver: &str, backing: &str) -> SystemInfo {
        let text = INFO_OVERLAY2_EXT4
            .replace("\"overlay2\"", &format!("{driver:?}"))
            .replace("\"extfs\"", &format!("{backing:?}"));
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn the_layer_cap_is_read_from_the_daemons_info() {
        let ext4: SystemInfo = serde_json::from_str(INFO_OVERLAY2_EXT4).unwrap();
        assert_eq!(
            LayerCap::of_info(&ext4),
            LayerCap::Unsupported {
                storage: "overlay2 on extfs".into()
            }
        );
        let xfs = LayerCap::of_info(&info_with("overlay2", "xfs"));
        assert_eq!(
            xfs.plan_line(Some(10 << 30)),
            "capped at 10 GiB (overlay2 on xfs, pquota)"
        );
        assert!(matches!(
            LayerCap::of_info(&info_with("btrfs", "btrfs")),
            LayerCap::Enforced { .. }
        ));
        assert!(matches!(
            LayerCap::of_info(&SystemInfo::default()),
            LayerCap::Unsupported { .. }
        ));
    }
}
