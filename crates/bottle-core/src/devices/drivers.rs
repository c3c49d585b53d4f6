//! Which kernel driver owns a block major, read from `/proc/devices`.
//!
//! A raw disk does not need a blacklisted name or the number of an existing
//! node to be a raw disk: `mknod /dev/x b 259 77` opens an NVMe namespace (or
//! nothing, until one appears). So the built-in raw-storage entries are also
//! matched by the driver that owns a block node's major.

use std::fs;
use std::path::Path;

/// The block drivers behind the built-in raw-storage entries, as the kernel
/// names them in `/proc/devices` (the name each passes to `register_blkdev`).
/// Every pattern here is a [`super::BUILTIN_BLACKLIST`] entry (unit-tested).
pub(super) const DISK_DRIVERS: &[(&str, &str)] = &[
    ("/dev/sd*", "sd"),
    ("/dev/sr*", "sr"),
    // NVMe namespaces have no major of their own: they and their partitions
    // (and the partitions of any disk beyond its own minors) live on the
    // extended major 259, "blkext".
    ("/dev/nvme*", "blkext"),
    ("/dev/loop*", "loop"),
    ("/dev/vd*", "virtblk"),
    ("/dev/xvd*", "xvd"),
    ("/dev/hd*", "ide0"),
    ("/dev/hd*", "ide1"),
    ("/dev/hd*", "ide2"),
    ("/dev/hd*", "ide3"),
    ("/dev/hd*", "ide4"),
    ("/dev/hd*", "ide5"),
    ("/dev/hd*", "ide6"),
    ("/dev/hd*", "ide7"),
    ("/dev/hd*", "ide8"),
    ("/dev/hd*", "ide9"),
    ("/dev/md*", "md"),
    ("/dev/md*", "mdp"),
    ("/dev/mmcblk*", "mmc"),
    ("/dev/nbd*", "nbd"),
    ("/dev/zram*", "zram"),
    ("/dev/ram*", "ramdisk"),
    ("/dev/dm-*", "device-mapper"),
];

/// The block majors of the host and their drivers, or why they are unknown.
pub(super) enum BlockDrivers {
    /// `(major, driver)` for every line of the "Block devices:" section.
    Known(Vec<(u32, String)>),
    /// `/proc/devices` could not be read or understood.
    Unknown(String),
}

impl BlockDrivers {
    /// Reads `<root>/proc/devices`.
    pub(super) fn read(root: &Path) -> BlockDrivers {
        let path = root.join("proc/devices");
        match fs::read_to_string(&path) {
            Ok(text) => match parse_block_drivers(&text) {
                Ok(drivers) => BlockDrivers::Known(drivers),
                Err(problem) => BlockDrivers::Unknown(format!("/proc/devices {problem}")),
            },
            Err(err) => BlockDrivers::Unknown(format!("cannot read /proc/devices: {err}")),
        }
    }

    /// The drivers that own block major `major`; empty when none does.
    pub(super) fn owners(&self, major: u32) -> Result<Vec<&str>, &str> {
        match self {
            BlockDrivers::Known(drivers) => Ok(drivers
                .iter()
                .filter(|(owned, _)| *owned == major)
                .map(|(_, name)| name.as_str())
                .collect()),
            BlockDrivers::Unknown(why) => Err(why),
        }
    }
}

/// The `(major, driver)` lines of the "Block devices:" section of
/// `/proc/devices` text. A file without that section, or with a line in it
/// that is not `<major> <name>`, is an error: an unparsed disk driver must
/// not look like no driver at all.
pub(super) fn parse_block_drivers(text: &str) -> Result<Vec<(u32, String)>, String> {
    let mut in_block = false;
    let mut seen_block = false;
    let mut drivers = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line.ends_with(':') {
            in_block = line == "Block devices:";
            seen_block |= in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        let parsed = line
            .split_once(char::is_whitespace)
            .and_then(|(major, name)| Some((major.parse::<u32>().ok()?, name.trim())))
            .filter(|(_, name)| !name.is_empty());
        match parsed {
            Some((major, name)) => drivers.push((major, name.to_string())),
            None => return Err(format!("has a block device line it cannot parse: {line:?}")),
        }
    }
    if !seen_block {
        return Err("has no \"Block devices:\" section".into());
    }
    Ok(drivers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_disk_driver_names_a_builtin_entry() {
        for (pattern, _) in DISK_DRIVERS {
            assert!(
                super::super::BUILTIN_BLACKLIST.contains(pattern),
                "{pattern}"
            );
        }
    }

    #[test]
    fn parses_the_block_section_only() {
        let text = "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n259 nvme-generic\n\nBlock devices:\n  7 loop\n  8 sd\n253 device-mapper\n259 blkext\n";
        assert_eq!(
            parse_block_drivers(text).unwrap(),
            [
                (7, "loop".to_string()),
                (8, "sd".to_string()),
                (253, "device-mapper".to_string()),
                (259, "blkext".to_string()),
            ]
        );
        assert_eq!(
            parse_block_drivers("Block devices:\n").unwrap(),
            [],
            "a host with no block drivers"
        );
    }

    #[test]
    fn refuses_what_it_cannot_read_whole() {
        assert!(parse_block_drivers("").is_err());
        assert!(parse_block_drivers("Character devices:\n  1 mem\n").is_err());
        for line in ["sd", "x sd", "8", "-1 sd", "99999999999 sd"] {
            let text = format!("Block devices:\n  8 sd\n{line}\n");
            assert!(parse_block_drivers(&text).is_err(), "{line:?}");
        }
    }

    #[test]
    fn owners_of_a_major() {
        let drivers = BlockDrivers::Known(vec![(8, "sd".into()), (259, "blkext".into())]);
        assert_eq!(drivers.owners(259), Ok(vec!["blkext"]));
        assert_eq!(drivers.owners(240), Ok(vec![]));
        let unknown = BlockDrivers::Unknown("cannot read /proc/devices".into());
        assert_eq!(unknown.owners(8), Err("cannot read /proc/devices"));
    }
}
