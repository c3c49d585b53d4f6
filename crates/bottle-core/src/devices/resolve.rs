//! Resolving a [`DevicePolicy`] against the device nodes under a root.
//!
//! Paths are handled relative to the root (`dev/nvidia0`) and symlinks are
//! followed by hand, with `/` meaning the root, so that a test root never
//! reaches into the real host's `/dev` and an absolute link cannot climb out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use super::drivers::{BlockDrivers, DISK_DRIVERS};
use super::error::DeviceError;
use super::policy::{BlacklistSource, DevicePolicy};
use super::{
    DeviceKind, DeviceNode, DroppedDevice, LEFT_OUT_OF_DEFAULTS, PTS_MIN_KERNEL, ResolvedDevices,
};

/// Paths one pattern may expand to before the resolver gives up.
const MAX_MATCHES: usize = 4096;
/// Directory depth below a matched directory that is walked.
const MAX_DEPTH: usize = 16;
/// Symlinks followed while resolving one path (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

/// Device numbers the kernel fixes (Documentation/admin-guide/devices.txt),
/// refused with the built-in entry that names them even when the host has no
/// such node to compare against: a `mknod /dev/x c 1 1` is `/dev/mem`
/// whatever it is called and wherever the real one is.
const FIXED_NUMBERS: &[(&str, DeviceKind, RangeInclusive<u32>, RangeInclusive<u32>)] = &[
    ("/dev/mem", DeviceKind::Char, 1..=1, 1..=1),
    ("/dev/kmem", DeviceKind::Char, 1..=1, 2..=2),
    ("/dev/port", DeviceKind::Char, 1..=1, 4..=4),
    ("/dev/kmsg", DeviceKind::Char, 1..=1, 11..=11),
    ("/dev/pts", DeviceKind::Char, 136..=143, 0..=u32::MAX),
    ("/dev/console", DeviceKind::Char, 5..=5, 1..=1),
    ("/dev/tty[0-9]*", DeviceKind::Char, 4..=4, 0..=63),
    ("/dev/vcs*", DeviceKind::Char, 7..=7, 0..=u32::MAX),
    ("/dev/input", DeviceKind::Char, 13..=13, 0..=u32::MAX),
    ("/dev/loop*", DeviceKind::Block, 7..=7, 0..=u32::MAX),
    ("/dev/sd*", DeviceKind::Block, 8..=8, 0..=u32::MAX),
    ("/dev/sd*", DeviceKind::Block, 65..=71, 0..=u32::MAX),
    ("/dev/sd*", DeviceKind::Block, 128..=135, 0..=u32::MAX),
    ("/dev/md*", DeviceKind::Block, 9..=9, 0..=u32::MAX),
    ("/dev/sr*", DeviceKind::Block, 11..=11, 0..=u32::MAX),
    ("/dev/nbd*", DeviceKind::Block, 43..=43, 0..=u32::MAX),
    ("/dev/mmcblk*", DeviceKind::Block, 179..=179, 0..=u32::MAX),
    ("/dev/sg*", DeviceKind::Char, 21..=21, 0..=u32::MAX),
];

type DeviceId = (DeviceKind, u32, u32);

/// The blacklist's device numbers: which entry refuses each, and the node
/// that carried it.
#[derive(Default)]
struct BlacklistedNumbers {
    found: HashMap<DeviceId, Vec<(usize, String)>>,
    errors: Vec<(PathBuf, io::Error)>,
}

impl BlacklistedNumbers {
    fn collect(policy: &DevicePolicy, root: &Path) -> Result<BlacklistedNumbers, DeviceError> {
        let mut numbers = BlacklistedNumbers::default();
        for (index, entry) in policy.blacklist.iter().enumerate() {
            let expansion = expand(root, &entry.pattern, true)?;
            numbers.errors.extend(expansion.errors);
            for rel in expansion.paths {
                let candidates = match walk_if_dir(root, &rel) {
                    Ok(candidates) => candidates,
                    Err(Walk::Io(path, err)) => {
                        numbers.errors.push((path, err));
                        continue;
                    }
                    Err(Walk::TooMany) => {
                        return Err(DeviceError::TooManyMatches {
                            pattern: entry.pattern.clone(),
                            limit: MAX_MATCHES,
                        });
                    }
                };
                for candidate in candidates {
                    let resolved = match resolve_in_root(root, &candidate) {
                        Ok(resolved) => resolved,
                        // A dangling or looping link names no device, so
                        // nothing can be an alias of it.
                        Err(Unresolvable::NoTarget(_)) => continue,
                        Err(Unresolvable::Io(err)) => {
                            numbers.errors.push((root.join(&candidate), err));
                            continue;
                        }
                    };
                    match device_id(&root.join(&resolved)) {
                        Ok(Some(id)) => numbers
                            .found
                            .entry(id)
                            .or_default()
                            .push((index, display(&resolved))),
                        Ok(None) => {}
                        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                        Err(err) => numbers.errors.push((root.join(&resolved), err)),
                    }
                }
            }
        }
        Ok(numbers)
    }

    /// The blacklist entries that refuse `id`, each with the node it was
    /// seen on.
    fn hits(&self, policy: &DevicePolicy, id: DeviceId) -> Vec<(usize, String)> {
        let mut hits = self.found.get(&id).cloned().unwrap_or_default();
        let (kind, major, minor) = id;
        for (pattern, fixed_kind, majors, minors) in FIXED_NUMBERS {
            if *fixed_kind == kind && majors.contains(&major) && minors.contains(&minor) {
                let builtin = policy.blacklist.iter().position(|entry| {
                    entry.source == BlacklistSource::BuiltIn && entry.pattern == *pattern
                });
                if let Some(index) = builtin {
                    hits.push((index, (*pattern).to_string()));
                }
            }
        }
        hits
    }
}

impl DevicePolicy {
    /// Expands the requested globs under `root` (`/` in production) and
    /// applies the blacklist. `kernel` is the host's `(major, minor)`
    /// version, `None` if unknown (treated as old).
    ///
    /// Dropped paths and warnings are part of the result; an error means the
    /// blacklist itself could not be checked while something would have
    /// passed, or a pattern matched absurdly many paths.
    pub fn resolve(
        &self,
        root: &Path,
        kernel: Option<(u32, u32)>,
    ) -> Result<ResolvedDevices, DeviceError> {
        let numbers = BlacklistedNumbers::collect(self, root)?;
        let drivers = BlockDrivers::read(root);
        let pts_entry = self.blacklist.iter().position(|entry| {
            entry.source == BlacklistSource::BuiltIn && entry.pattern == "/dev/pts"
        });
        let new_kernel = kernel.is_some_and(|version| version >= PTS_MIN_KERNEL);
        let kernel_text = kernel.map_or("unknown".to_string(), |(major, minor)| {
            format!("{major}.{minor}")
        });

        let left_out = if self.explicit {
            Vec::new()
        } else {
            left_out_nodes(root)
        };
        let mut out = ResolvedDevices::default();
        let mut seen = HashSet::new();
        for request in &self.requests {
            let pts_request =
                self.explicit && (request == "/dev/pts" || request.starts_with("/dev/pts/"));
            // The built-in /dev/pts entry steps aside only for an explicit
            // request on a new enough kernel; an admin or manifest entry for
            // /dev/pts still refuses it.
            let relaxed = if pts_request && new_kernel {
                pts_entry
            } else {
                None
            };
            let mut passed_by_relaxing = false;

            let expansion = expand(root, request, false)?;
            for (path, err) in expansion.errors {
                out.dropped.push(DroppedDevice {
                    path: display_in_root(root, &path),
                    reason: format!("cannot list: {err}"),
                });
            }
            for rel in expansion.paths {
                let candidates = match walk_if_dir(root, &rel) {
                    Ok(candidates) => candidates,
                    Err(Walk::Io(path, err)) => {
                        out.dropped.push(DroppedDevice {
                            path: display_in_root(root, &path),
                            reason: format!("cannot list: {err}"),
                        });
                        continue;
                    }
                    Err(Walk::TooMany) => {
                        return Err(DeviceError::TooManyMatches {
                            pattern: request.clone(),
                            limit: MAX_MATCHES,
                        });
                    }
                };
                for candidate in candidates {
                    let container_path = display(&candidate);
                    if !seen.insert(container_path.clone()) {
                        continue;
                    }
                    match self.check(root, &candidate, &numbers, &drivers, relaxed) {
                        Verdict::Pass(node, used_relaxation) => {
                            if let Some(reason) = left_out_reason(root, &node, &left_out) {
                                out.dropped.push(DroppedDevice {
                                    path: container_path,
                                    reason: reason.to_string(),
                                });
                                continue;
                            }
                            passed_by_relaxing |= used_relaxation;
                            out.passed.push(node);
                        }
                        Verdict::Drop(reason) => out.dropped.push(DroppedDevice {
                            path: container_path,
                            reason,
                        }),
                        Verdict::Unconfirmed(reason) => {
                            out.warnings.push(format!(
                                "device {container_path} cannot be checked, skipping: {reason}"
                            ));
                            out.dropped.push(DroppedDevice {
                                path: container_path,
                                reason,
                            });
                        }
                        Verdict::Blacklisted { mut reason, entry } => {
                            if pts_request && !new_kernel && Some(entry) == pts_entry {
                                reason.push_str(&format!(
                                    "; an explicit request is kept only on kernel >= {}.{}, this is {kernel_text}",
                                    PTS_MIN_KERNEL.0, PTS_MIN_KERNEL.1
                                ));
                            }
                            out.warnings.push(format!(
                                "device {container_path} is blacklisted, skipping: {reason}"
                            ));
                            out.dropped.push(DroppedDevice {
                                path: container_path,
                                reason,
                            });
                        }
                    }
                }
            }
            if passed_by_relaxing {
                out.warnings.push(format!(
                    "device {request} passed because the manifest asks for it (kernel {kernel_text} >= {}.{}), but it hands the bottle the host's terminals, which a process inside can read from and write to; ptys work inside the bottle without it, so remove it from devices unless the agent needs the host's terminals (an admin can refuse it by adding /dev/pts to {})",
                    PTS_MIN_KERNEL.0,
                    PTS_MIN_KERNEL.1,
                    self.policy_file
                        .as_deref()
                        .map_or(super::DEFAULT_POLICY_FILE.to_string(), |p| p.display().to_string())
                ));
            }
        }

        if !out.passed.is_empty()
            && let Some((path, source)) = numbers.errors.into_iter().next()
        {
            return Err(DeviceError::BlacklistUnreadable { path, source });
        }
        Ok(out)
    }

    /// The blacklist entry (other than `relaxed`) covering `path`, if any.
    fn covering(&self, path: &str, relaxed: Option<usize>) -> (Option<usize>, bool) {
        let mut relaxed_hit = false;
        for (index, entry) in self.blacklist.iter().enumerate() {
            if entry.covers(path) {
                if Some(index) == relaxed {
                    relaxed_hit = true;
                } else {
                    return (Some(index), relaxed_hit);
                }
            }
        }
        (None, relaxed_hit)
    }

    /// The built-in entry whose raw-disk driver is one of `owners`, with
    /// that driver.
    fn disk_driver_entry<'a>(&self, owners: &[&'a str]) -> Option<(usize, &'a str)> {
        owners.iter().find_map(|owner| {
            let (pattern, _) = DISK_DRIVERS.iter().find(|(_, driver)| driver == owner)?;
            let index = self.blacklist.iter().position(|entry| {
                entry.source == BlacklistSource::BuiltIn && entry.pattern == *pattern
            })?;
            Some((index, *owner))
        })
    }

    fn describe_entry(&self, index: usize) -> String {
        let entry = &self.blacklist[index];
        format!("blacklisted by {} ({})", entry.pattern, entry.source)
    }

    fn check(
        &self,
        root: &Path,
        candidate: &Path,
        numbers: &BlacklistedNumbers,
        drivers: &BlockDrivers,
        relaxed: Option<usize>,
    ) -> Verdict {
        let container_path = display(candidate);
        let (hit, mut used_relaxation) = self.covering(&container_path, relaxed);
        if let Some(entry) = hit {
            return Verdict::Blacklisted {
                reason: self.describe_entry(entry),
                entry,
            };
        }
        let resolved = match resolve_in_root(root, candidate) {
            Ok(resolved) => resolved,
            Err(err) => return Verdict::Drop(format!("cannot be resolved: {err}")),
        };
        let resolved_path = display(&resolved);
        let mut parts = resolved.components();
        let under_dev =
            parts.next() == Some(Component::Normal("dev".as_ref())) && parts.next().is_some();
        if !under_dev {
            return Verdict::Drop(format!("resolves to {resolved_path}, outside /dev"));
        }
        if resolved != candidate {
            let (hit, relaxed_hit) = self.covering(&resolved_path, relaxed);
            used_relaxation |= relaxed_hit;
            if let Some(entry) = hit {
                return Verdict::Blacklisted {
                    reason: format!(
                        "resolves to {resolved_path}, {}",
                        self.describe_entry(entry)
                    ),
                    entry,
                };
            }
        }
        let host_path = root.join(&resolved);
        let id = match device_id(&host_path) {
            Ok(Some(id)) => id,
            Ok(None) => {
                let what = fs::symlink_metadata(&host_path)
                    .map(|meta| file_type_name(&meta.file_type()))
                    .unwrap_or("unknown file type");
                return Verdict::Drop(format!("not a device node ({what})"));
            }
            Err(err) => return Verdict::Drop(format!("cannot stat {resolved_path}: {err}")),
        };
        for (index, node) in numbers.hits(self, id) {
            if Some(index) == relaxed {
                used_relaxation = true;
                continue;
            }
            let (kind, major, minor) = id;
            return Verdict::Blacklisted {
                reason: format!(
                    "same device ({} {major}:{minor}) as {node}, {}",
                    kind.as_str(),
                    self.describe_entry(index)
                ),
                entry: index,
            };
        }
        let (kind, major, minor) = id;
        if kind == DeviceKind::Block {
            let owners = match drivers.owners(major) {
                Ok(owners) => owners,
                Err(why) => {
                    return Verdict::Unconfirmed(format!(
                        "cannot tell which driver owns block major {major}, so no block device is passed: {why}"
                    ));
                }
            };
            if let Some((index, driver)) = self.disk_driver_entry(&owners) {
                return Verdict::Blacklisted {
                    reason: format!(
                        "block major {major} belongs to the {driver} driver (/proc/devices), {}",
                        self.describe_entry(index)
                    ),
                    entry: index,
                };
            }
        }
        Verdict::Pass(
            DeviceNode {
                host_path,
                container_path,
                kind,
                major,
                minor,
            },
            used_relaxation,
        )
    }
}

/// A node [`LEFT_OUT_OF_DEFAULTS`] names: its path, its device number when
/// the host has it, and why it is left out.
struct LeftOut {
    path: &'static str,
    id: Option<DeviceId>,
    reason: &'static str,
}

/// The left-out nodes under `root`, with the device number each has there
/// (none when the host has no such node, or it cannot be read: its path
/// still matches).
fn left_out_nodes(root: &Path) -> Vec<LeftOut> {
    LEFT_OUT_OF_DEFAULTS
        .iter()
        .map(|(path, reason)| {
            let rel = Path::new(path.trim_start_matches('/'));
            let id = resolve_in_root(root, rel)
                .ok()
                .and_then(|resolved| device_id(&root.join(resolved)).ok().flatten());
            LeftOut { path, id, reason }
        })
        .collect()
}

/// Why the defaults leave `node` out, if they do: it is a left-out node by
/// the path it was found at, the path it resolves to, or its number.
fn left_out_reason(root: &Path, node: &DeviceNode, left_out: &[LeftOut]) -> Option<&'static str> {
    let host = display_in_root(root, &node.host_path);
    left_out
        .iter()
        .find(|l| {
            l.path == node.container_path
                || l.path == host
                || l.id == Some((node.kind, node.major, node.minor))
        })
        .map(|l| l.reason)
}

enum Verdict {
    /// Passed; the flag says whether only the relaxed `/dev/pts` entry
    /// stood in the way.
    Pass(DeviceNode, bool),
    /// Refused by the blacklist entry `entry` (warned about).
    Blacklisted { reason: String, entry: usize },
    /// Refused because the blacklist could not be checked for it (warned
    /// about).
    Unconfirmed(String),
    /// Not a usable device node.
    Drop(String),
}

/// The paths (relative to the root) a `/dev/...` glob matches.
struct Expansion {
    paths: Vec<PathBuf>,
    errors: Vec<(PathBuf, io::Error)>,
}

fn has_wildcards(component: &str) -> bool {
    component.contains(['*', '?', '['])
}

/// Expands `pattern` component by component without following symlinked
/// directories, so the walk stays inside `root/dev` and cannot loop. A
/// `**` component matches any run of real directories. `lossy` matches
/// non-UTF-8 names by their lossy form (right for the blacklist, which should
/// over-match); otherwise such names are skipped.
fn expand(root: &Path, pattern: &str, lossy: bool) -> Result<Expansion, DeviceError> {
    let too_many = || DeviceError::TooManyMatches {
        pattern: pattern.to_string(),
        limit: MAX_MATCHES,
    };
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let components: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    let mut errors = Vec::new();
    let mut current = vec![PathBuf::new()];
    for (position, component) in components.iter().enumerate() {
        let last = position + 1 == components.len();
        let mut next = Vec::new();
        for base in &current {
            if *component == "**" {
                // Matched directories are walked whole later, so a trailing
                // `**` only needs the directory itself.
                next.push(base.clone());
                if !last {
                    collect_dirs(root, base, 0, &mut next, &mut errors);
                }
            } else if !has_wildcards(component) {
                let path = base.join(component);
                match fs::symlink_metadata(root.join(&path)) {
                    Ok(meta) if last || meta.is_dir() => next.push(path),
                    Ok(_) => {}
                    Err(err) if is_absent(&err) => {}
                    Err(err) => errors.push((root.join(&path), err)),
                }
            } else {
                let Ok(compiled) = glob::Pattern::new(component) else {
                    continue;
                };
                let entries = match fs::read_dir(root.join(base)) {
                    Ok(entries) => entries,
                    Err(err) if is_absent(&err) => continue,
                    Err(err) => {
                        errors.push((root.join(base), err));
                        continue;
                    }
                };
                let mut matched = Vec::new();
                for entry in entries {
                    let entry = match entry {
                        Ok(entry) => entry,
                        Err(err) => {
                            errors.push((root.join(base), err));
                            continue;
                        }
                    };
                    let name = entry.file_name();
                    let text = match name.to_str() {
                        Some(text) => text.to_string(),
                        None if lossy => name.to_string_lossy().into_owned(),
                        None => continue,
                    };
                    if !compiled.matches_with(&text, options) {
                        continue;
                    }
                    let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                    if last || is_dir {
                        matched.push(base.join(&name));
                    }
                }
                matched.sort();
                next.extend(matched);
            }
            if next.len() > MAX_MATCHES {
                return Err(too_many());
            }
        }
        current = next;
    }
    current.dedup();
    Ok(Expansion {
        paths: current,
        errors,
    })
}

fn is_absent(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Every real directory below `base` (not following symlinks), depth-first.
fn collect_dirs(
    root: &Path,
    base: &Path,
    depth: usize,
    out: &mut Vec<PathBuf>,
    errors: &mut Vec<(PathBuf, io::Error)>,
) {
    if depth >= MAX_DEPTH || out.len() > MAX_MATCHES {
        return;
    }
    let entries = match fs::read_dir(root.join(base)) {
        Ok(entries) => entries,
        Err(err) if is_absent(&err) => return,
        Err(err) => {
            errors.push((root.join(base), err));
            return;
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|entry| base.join(entry.file_name()))
        .collect();
    dirs.sort();
    for dir in dirs {
        out.push(dir.clone());
        collect_dirs(root, &dir, depth + 1, out, errors);
    }
}

enum Walk {
    Io(PathBuf, io::Error),
    TooMany,
}

/// `rel` itself, or everything that is not a directory below it when it is
/// a real directory (a requested `/dev/snd` means the nodes in it).
fn walk_if_dir(root: &Path, rel: &Path) -> Result<Vec<PathBuf>, Walk> {
    let is_dir = fs::symlink_metadata(root.join(rel))
        .map(|meta| meta.is_dir())
        .unwrap_or(false);
    if !is_dir {
        return Ok(vec![rel.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![(rel.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries =
            fs::read_dir(root.join(&dir)).map_err(|err| Walk::Io(root.join(&dir), err))?;
        let mut names: Vec<(PathBuf, bool)> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|err| Walk::Io(root.join(&dir), err))?;
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            names.push((dir.join(entry.file_name()), is_dir));
        }
        names.sort();
        for (path, is_dir) in names.into_iter().rev() {
            if is_dir {
                if depth + 1 < MAX_DEPTH {
                    stack.push((path, depth + 1));
                }
            } else {
                out.push(path);
            }
            if out.len() > MAX_MATCHES {
                return Err(Walk::TooMany);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Why a path could not be resolved.
#[derive(Debug)]
enum Unresolvable {
    /// The path (or a link on the way) leads nowhere: missing, through a
    /// non-directory, a name too long, or a symlink loop. The kernel would
    /// fail to open it too.
    NoTarget(String),
    /// Something on the way could not be read.
    Io(io::Error),
}

impl std::fmt::Display for Unresolvable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresolvable::NoTarget(what) => f.write_str(what),
            Unresolvable::Io(err) => write!(f, "{err}"),
        }
    }
}

impl From<io::Error> for Unresolvable {
    fn from(err: io::Error) -> Self {
        match err.kind() {
            io::ErrorKind::NotFound
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::InvalidFilename => Unresolvable::NoTarget(err.to_string()),
            _ => Unresolvable::Io(err),
        }
    }
}

/// Resolves every symlink in `rel` (relative to `root`), treating `root` as
/// `/`: an absolute target restarts at the root and `..` stops there. The
/// result names no symlink. Proc magic links resolve by their text
/// (`/proc/self/fd/0` -> `/dev/pts/3`), which is what they point at.
fn resolve_in_root(root: &Path, rel: &Path) -> Result<PathBuf, Unresolvable> {
    let mut queue: VecDeque<OsString> = components_of(rel);
    let mut current: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(part) = queue.pop_front() {
        if part == "." {
            continue;
        }
        if part == ".." {
            current.pop();
            continue;
        }
        current.push(part);
        let here: PathBuf = current.iter().collect();
        let meta = fs::symlink_metadata(root.join(&here))?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(Unresolvable::NoTarget(
                    "too many levels of symbolic links".into(),
                ));
            }
            let target = fs::read_link(root.join(&here))?;
            current.pop();
            if target.is_absolute() {
                current.clear();
            }
            for part in components_of(&target).into_iter().rev() {
                queue.push_front(part);
            }
        } else if !queue.is_empty() && !meta.is_dir() {
            return Err(Unresolvable::NoTarget("not a directory".into()));
        }
    }
    Ok(current.iter().collect())
}

fn components_of(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|component| match component {
            Component::Normal(part) => Some(part.to_os_string()),
            Component::CurDir => None,
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// `(kind, major, minor)` of a character or block node, `None` for anything
/// else. Does not follow a final symlink.
fn device_id(path: &Path) -> io::Result<Option<DeviceId>> {
    let meta = fs::symlink_metadata(path)?;
    let file_type = meta.file_type();
    let kind = if file_type.is_char_device() {
        DeviceKind::Char
    } else if file_type.is_block_device() {
        DeviceKind::Block
    } else {
        return Ok(None);
    };
    let (major, minor) = split_dev(meta.rdev());
    Ok(Some((kind, major, minor)))
}

/// glibc's `gnu_dev_major` / `gnu_dev_minor`.
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff);
    // Both fit in 32 bits by construction of the masks.
    (
        u32::try_from(major).unwrap_or(u32::MAX),
        u32::try_from(minor).unwrap_or(u32::MAX),
    )
}

fn file_type_name(file_type: &fs::FileType) -> &'static str {
    if file_type.is_file() {
        "regular file"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "unknown file type"
    }
}

/// `/dev/x` for the root-relative `dev/x`.
fn display(rel: &Path) -> String {
    format!("/{}", rel.to_string_lossy())
}

/// `/dev/x` for `<root>/dev/x`; a path outside the root is shown as is.
pub(super) fn display_in_root(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) => display(rel),
        Err(_) => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_dev_matches_glibc() {
        // makedev(1, 1), makedev(195, 255), makedev(259, 0x12345).
        assert_eq!(split_dev(0x0101), (1, 1));
        assert_eq!(split_dev((195 << 8) | 255), (195, 255));
        let big = ((0x12345u64 & 0xffff_ff00) << 12) | (0x45) | ((259 & 0xfff) << 8);
        assert_eq!(split_dev(big), (259, 0x12345));
    }

    #[test]
    fn fixed_numbers_name_builtin_entries() {
        for (pattern, ..) in FIXED_NUMBERS {
            assert!(
                super::super::BUILTIN_BLACKLIST.contains(pattern),
                "{pattern}"
            );
        }
    }

    #[test]
    fn resolve_in_root_keeps_absolute_links_inside() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("dev/sub")).unwrap();
        fs::write(root.path().join("dev/target"), b"").unwrap();
        std::os::unix::fs::symlink("/dev/target", root.path().join("dev/abs")).unwrap();
        std::os::unix::fs::symlink("../target", root.path().join("dev/sub/rel")).unwrap();
        std::os::unix::fs::symlink("../../../../../dev/target", root.path().join("dev/climb"))
            .unwrap();
        std::os::unix::fs::symlink("loop", root.path().join("dev/loop")).unwrap();
        for link in ["dev/abs", "dev/sub/rel", "dev/climb"] {
            assert_eq!(
                resolve_in_root(root.path(), Path::new(link)).unwrap(),
                PathBuf::from("dev/target"),
                "{link}"
            );
        }
        assert!(resolve_in_root(root.path(), Path::new("dev/loop")).is_err());
    }
}
