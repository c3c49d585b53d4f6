//! The box's side of a copy: paths in a box, what bottle owns there, where
//! a copy in lands by `docker cp`'s rules, and the walk that refuses a
//! symbolic link anywhere on the way. Pure: a backend supplies what is at a
//! path (`stat`), at a moment the agent cannot change it or with the
//! agent's own rights (see `docs/SECURITY.md`).

use std::fmt;

use super::archive::{ArchiveEntry, CopyIn, CopySource, EntryKind};
use super::error::CopyError;
use crate::agent::BOTTLE_OWNED_DIRS;

/// A path inside a box as `bottle cp` takes it: `/`-separated, taken from
/// `/` when relative (as `docker cp` does), `.` and empty components
/// dropped. `..` is refused rather than resolved: what a `..` means in the
/// box depends on links there, which bottle never follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPath {
    parts: Vec<String>,
    /// Written with a trailing `/` (or `/.`): it must name a directory.
    directory: bool,
}

impl GuestPath {
    /// Parses a path given for a box.
    pub fn parse(text: &str) -> Result<GuestPath, CopyError> {
        let bad = |why| CopyError::GuestPath {
            path: text.to_string(),
            why,
        };
        if text.is_empty() {
            return Err(bad("it is empty"));
        }
        if text.contains('\0') {
            return Err(bad("it holds a NUL byte"));
        }
        let mut parts = Vec::new();
        for part in text.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(bad("`..` is not followed inside a bottle")),
                name => parts.push(name.to_string()),
            }
        }
        let directory = text.ends_with('/') || text.ends_with("/.") || text == ".";
        Ok(GuestPath { parts, directory })
    }

    /// `/`.
    pub fn root() -> GuestPath {
        GuestPath {
            parts: Vec::new(),
            directory: true,
        }
    }

    /// Its components, from the root down.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// Whether it is `/`.
    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// Whether it was written as a directory (trailing `/` or `/.`).
    pub fn names_a_directory(&self) -> bool {
        self.directory
    }

    /// Its last component (`None` for `/`).
    pub fn file_name(&self) -> Option<&str> {
        self.parts.last().map(String::as_str)
    }

    /// The directory it is in (`None` for `/`).
    pub fn parent(&self) -> Option<GuestPath> {
        let (_, rest) = self.parts.split_last()?;
        Some(GuestPath {
            parts: rest.to_vec(),
            directory: true,
        })
    }

    /// `self/relative`, `relative` being `/`-separated clean components.
    pub fn join(&self, relative: &str) -> GuestPath {
        let mut parts = self.parts.clone();
        parts.extend(
            relative
                .split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_string),
        );
        GuestPath {
            parts,
            directory: false,
        }
    }

    /// Every directory above it, from `/` down, itself not included.
    pub fn ancestors(&self) -> Vec<GuestPath> {
        (0..self.parts.len())
            .map(|n| GuestPath {
                parts: self.parts[..n].to_vec(),
                directory: true,
            })
            .collect()
    }

    /// The directory of [`BOTTLE_OWNED_DIRS`] it is, or is under.
    pub fn owned_by_bottle(&self) -> Option<&'static str> {
        let text = self.to_string();
        BOTTLE_OWNED_DIRS
            .iter()
            .copied()
            .find(|dir| text == *dir || text.starts_with(&format!("{dir}/")))
    }
}

impl fmt::Display for GuestPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parts.is_empty() {
            return f.write_str("/");
        }
        for part in &self.parts {
            write!(f, "/{part}")?;
        }
        Ok(())
    }
}

/// What is at a path in a box, a final link not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEntry {
    /// A directory (not a link to one).
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Link,
    /// A fifo, socket or device node.
    Other,
    /// Nothing.
    Missing,
}

impl GuestEntry {
    fn described(self) -> &'static str {
        match self {
            GuestEntry::Dir => "a directory",
            GuestEntry::File => "a file",
            GuestEntry::Link => "a symbolic link",
            GuestEntry::Other => "a special file",
            GuestEntry::Missing => "nothing",
        }
    }
}

/// Walks `dest` from `/` down with `stat`: every directory above it must
/// be a directory and not a link; returns what is at `dest` itself. The
/// first link, file or missing directory on the way is the error.
///
/// The answer holds only while nothing can change the box between this
/// walk and the write: the backend runs both with the box frozen, or
/// writes with no more than the agent's own rights.
pub fn walk<E>(
    bottle: &str,
    dest: &GuestPath,
    mut stat: impl FnMut(&GuestPath) -> Result<GuestEntry, E>,
) -> Result<Result<GuestEntry, CopyError>, E> {
    for dir in dest.ancestors().iter().skip(1) {
        let found = stat(dir)?;
        if found != GuestEntry::Dir {
            return Ok(Err(blocked(bottle, dest, dir, found)));
        }
    }
    if dest.is_root() {
        return Ok(Ok(GuestEntry::Dir));
    }
    stat(dest).map(Ok)
}

/// The error for finding `found` at `at`, a directory on the way to `dest`.
pub fn blocked(bottle: &str, dest: &GuestPath, at: &GuestPath, found: GuestEntry) -> CopyError {
    match found {
        GuestEntry::Link => CopyError::LinkOnTheWay {
            bottle: bottle.to_string(),
            path: dest.to_string(),
            link: at.to_string(),
        },
        GuestEntry::Missing => CopyError::Missing {
            bottle: bottle.to_string(),
            path: at.to_string(),
        },
        other => CopyError::InTheWay {
            bottle: bottle.to_string(),
            path: at.to_string(),
            found: other.described(),
            wanted: "a directory",
        },
    }
}

/// Where a copy in lands: extracted into `dir`, its top entry named `top`
/// (a [`CopySource::Named`] copy) or its entries as they are
/// ([`CopySource::Contents`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The directory the archive is extracted into; it exists and is a
    /// directory, not a link.
    pub dir: GuestPath,
    /// The name the top entry gets (`None`: the archive's entries as
    /// they are).
    pub top: Option<String>,
}

impl Placement {
    /// Where the archive's `entry` lands in the box.
    pub fn target(&self, entry: &str) -> GuestPath {
        match &self.top {
            None => self.dir.join(entry),
            Some(top) => {
                let rest = entry.split_once('/').map_or("", |(_, rest)| rest);
                self.dir.join(top).join(rest)
            }
        }
    }
}

/// `docker cp`'s rules for where `copy` lands given what is at `dest`
/// ([`walk`]'s answer): into an existing directory under its own name; as
/// `dest` where `dest` does not exist (its directory does: the walk saw
/// it); over an existing file when it is one. Then nothing it writes may
/// be under what bottle owns.
pub fn place(
    bottle: &str,
    dest: &GuestPath,
    found: GuestEntry,
    copy: &CopyIn,
) -> Result<Placement, CopyError> {
    let in_the_way = |found: GuestEntry, wanted| CopyError::InTheWay {
        bottle: bottle.to_string(),
        path: dest.to_string(),
        found: found.described(),
        wanted,
    };
    let placement = match (copy.source(), found) {
        (_, GuestEntry::Link) => {
            return Err(blocked(bottle, dest, dest, GuestEntry::Link));
        }
        (CopySource::Contents, GuestEntry::Dir) => Placement {
            dir: dest.clone(),
            top: None,
        },
        (CopySource::Contents, GuestEntry::Missing) => {
            return Err(blocked(bottle, dest, dest, GuestEntry::Missing));
        }
        (CopySource::Contents, other) => return Err(in_the_way(other, "a directory")),
        (CopySource::Named(name), GuestEntry::Dir) => Placement {
            dir: dest.clone(),
            top: Some(name.clone()),
        },
        (CopySource::Named(_), GuestEntry::Missing) if dest.names_a_directory() => {
            return Err(blocked(bottle, dest, dest, GuestEntry::Missing));
        }
        (CopySource::Named(_), GuestEntry::File) if copy.is_dir() => {
            return Err(in_the_way(GuestEntry::File, "a directory"));
        }
        (CopySource::Named(_), GuestEntry::File) if dest.names_a_directory() => {
            return Err(in_the_way(GuestEntry::File, "a directory"));
        }
        (CopySource::Named(_), GuestEntry::Missing | GuestEntry::File) => {
            match (dest.parent(), dest.file_name()) {
                (Some(dir), Some(name)) => Placement {
                    dir,
                    top: Some(name.to_string()),
                },
                _ => return Err(in_the_way(found, "a directory")),
            }
        }
        (CopySource::Named(_), GuestEntry::Other) => {
            return Err(in_the_way(GuestEntry::Other, "a file or a directory"));
        }
    };
    if let Some(owned) = placement.dir.owned_by_bottle() {
        return Err(CopyError::OwnedByBottle {
            path: placement.dir.to_string(),
            owned,
        });
    }
    for entry in copy.entries() {
        let target = placement.target(&entry.path);
        if let Some(owned) = target.owned_by_bottle() {
            return Err(CopyError::OwnedByBottle {
                path: target.to_string(),
                owned,
            });
        }
    }
    Ok(placement)
}

/// Checks what is already in the box where `copy`'s entries land, with
/// `stat` (under the same conditions as [`walk`]): no entry may land on a
/// link, a directory entry on anything but a directory, or a file on a
/// directory. Only paths whose directory already existed are asked about;
/// below a directory the copy creates, nothing can be in the way.
pub fn check_existing<E>(
    bottle: &str,
    placement: &Placement,
    entries: &[ArchiveEntry],
    mut stat: impl FnMut(&GuestPath) -> Result<GuestEntry, E>,
) -> Result<Result<(), CopyError>, E> {
    let mut existing = std::collections::BTreeSet::from([placement.dir.to_string()]);
    for entry in entries {
        let target = placement.target(&entry.path);
        let Some(parent) = target.parent() else {
            continue;
        };
        if !existing.contains(&parent.to_string()) {
            continue;
        }
        let found = stat(&target)?;
        let wanted_dir = entry.kind == EntryKind::Dir;
        match found {
            GuestEntry::Missing => {}
            GuestEntry::Link => return Ok(Err(blocked(bottle, &target, &target, found))),
            GuestEntry::Dir if wanted_dir => {
                existing.insert(target.to_string());
            }
            GuestEntry::File if !wanted_dir => {}
            other => {
                return Ok(Err(CopyError::InTheWay {
                    bottle: bottle.to_string(),
                    path: target.to_string(),
                    found: other.described(),
                    wanted: if wanted_dir { "a directory" } else { "a file" },
                }));
            }
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::convert::Infallible;

    use super::*;

    fn path(text: &str) -> GuestPath {
        GuestPath::parse(text).unwrap()
    }

    #[test]
    fn paths_are_taken_from_the_root_and_never_climb() {
        assert_eq!(path("/home/agent/").to_string(), "/home/agent");
        assert!(path("/home/agent/").names_a_directory());
        assert!(path("/tmp/.").names_a_directory());
        assert!(!path("/tmp/x").names_a_directory());
        assert_eq!(path("tmp//x/./y").to_string(), "/tmp/x/y");
        assert_eq!(path("/").to_string(), "/");
        assert!(path("/").is_root());
        for bad in ["", "/tmp/../etc", "..", "a\0b"] {
            assert_eq!(
                GuestPath::parse(bad).unwrap_err().code(),
                "BOT-F001",
                "{bad:?}"
            );
        }
        assert_eq!(
            path("/a/b/c")
                .ancestors()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["/", "/a", "/a/b"]
        );
    }

    use crate::error::Coded as _;

    #[test]
    fn what_bottle_owns_is_named_in_one_place() {
        assert_eq!(path("/etc/bottle").owned_by_bottle(), Some("/etc/bottle"));
        assert_eq!(
            path("/etc/bottle/mcp.json").owned_by_bottle(),
            Some("/etc/bottle")
        );
        assert_eq!(path("/.bottle/toolbox").owned_by_bottle(), Some("/.bottle"));
        assert_eq!(path("/etc/bottles").owned_by_bottle(), None);
        assert_eq!(path("/etc").owned_by_bottle(), None);
        assert_eq!(path("/home/agent/.bottle").owned_by_bottle(), None);
    }

    /// A box made of a map from path to what is there.
    fn stat_in(
        tree: &[(&str, GuestEntry)],
    ) -> impl FnMut(&GuestPath) -> Result<GuestEntry, Infallible> {
        let tree: BTreeMap<String, GuestEntry> =
            tree.iter().map(|(p, e)| ((*p).to_string(), *e)).collect();
        move |p: &GuestPath| Ok(*tree.get(&p.to_string()).unwrap_or(&GuestEntry::Missing))
    }

    const HOME: &[(&str, GuestEntry)] = &[
        ("/home", GuestEntry::Dir),
        ("/home/agent", GuestEntry::Dir),
        ("/home/agent/drop", GuestEntry::Link),
        ("/home/agent/notes", GuestEntry::File),
        ("/home/agent/up", GuestEntry::Link),
    ];

    #[test]
    fn the_walk_refuses_a_link_anywhere_on_the_way() {
        let walked = |dest| walk("b", &path(dest), stat_in(HOME)).unwrap();
        assert_eq!(walked("/home/agent").unwrap(), GuestEntry::Dir);
        assert_eq!(walked("/home/agent/new").unwrap(), GuestEntry::Missing);
        assert_eq!(walked("/home/agent/drop").unwrap(), GuestEntry::Link);
        let err = walked("/home/agent/up/bottle/x").unwrap_err();
        assert_eq!(err.code(), "BOT-F003");
        assert!(err.to_string().contains("through /home/agent/up"), "{err}");
        assert_eq!(
            walked("/home/agent/notes/x").unwrap_err().code(),
            "BOT-F005"
        );
        assert_eq!(walked("/nowhere/x").unwrap_err().code(), "BOT-F004");
        assert_eq!(walked("/").unwrap(), GuestEntry::Dir);
    }

    fn named(name: &str, entries: &[(&str, EntryKind)]) -> CopyIn {
        CopyIn::for_tests(CopySource::Named(name.into()), entries.to_vec())
    }

    #[test]
    fn placement_follows_docker_cps_rules() {
        let file = named("a.txt", &[("a.txt", EntryKind::File)]);
        let tree = named(
            "src",
            &[("src", EntryKind::Dir), ("src/x", EntryKind::File)],
        );
        let placed = |dest: &str, found, copy: &CopyIn| place("b", &path(dest), found, copy);
        // Into an existing directory, under its own name.
        let p = placed("/tmp", GuestEntry::Dir, &tree).unwrap();
        assert_eq!(p.target("src/x").to_string(), "/tmp/src/x");
        // As the destination, which does not exist yet.
        let p = placed("/tmp/copy", GuestEntry::Missing, &tree).unwrap();
        assert_eq!(p.target("src/x").to_string(), "/tmp/copy/x");
        // Over a file, when it is a file.
        let p = placed("/tmp/old.txt", GuestEntry::File, &file).unwrap();
        assert_eq!(p.target("a.txt").to_string(), "/tmp/old.txt");
        for (dest, found, copy, code) in [
            ("/tmp/old.txt", GuestEntry::File, &tree, "BOT-F005"),
            ("/tmp/new/", GuestEntry::Missing, &file, "BOT-F004"),
            ("/tmp/link", GuestEntry::Link, &file, "BOT-F003"),
            ("/tmp/fifo", GuestEntry::Other, &file, "BOT-F005"),
            ("/etc/bottle", GuestEntry::Dir, &file, "BOT-F002"),
            ("/etc/bottle/mcp.json", GuestEntry::File, &file, "BOT-F002"),
            ("/.bottle/toolbox", GuestEntry::File, &file, "BOT-F002"),
        ] {
            assert_eq!(
                placed(dest, found, copy).unwrap_err().code(),
                code,
                "{dest}"
            );
        }
        // An entry reaching into what bottle owns, from a directory above.
        let etc = named(
            "etc",
            &[("etc", EntryKind::Dir), ("etc/bottle", EntryKind::Dir)],
        );
        assert_eq!(
            placed("/", GuestEntry::Dir, &etc).unwrap_err().code(),
            "BOT-F002"
        );
        let contents = CopyIn::for_tests(CopySource::Contents, vec![("x", EntryKind::File)]);
        let p = placed("/tmp", GuestEntry::Dir, &contents).unwrap();
        assert_eq!(p.target("x").to_string(), "/tmp/x");
        assert_eq!(
            placed("/tmp/x", GuestEntry::File, &contents)
                .unwrap_err()
                .code(),
            "BOT-F005"
        );
    }

    #[test]
    fn nothing_already_there_may_be_a_link_or_of_the_wrong_kind() {
        let tree = named(
            "proj",
            &[
                ("proj", EntryKind::Dir),
                ("proj/sub", EntryKind::Dir),
                ("proj/sub/f", EntryKind::File),
                ("proj/g", EntryKind::File),
            ],
        );
        let placement = place("b", &path("/tmp"), GuestEntry::Dir, &tree).unwrap();
        let check = |box_tree: &[(&str, GuestEntry)]| {
            check_existing("b", &placement, tree.entries(), stat_in(box_tree)).unwrap()
        };
        check(&[]).unwrap();
        check(&[
            ("/tmp/proj", GuestEntry::Dir),
            ("/tmp/proj/g", GuestEntry::File),
        ])
        .unwrap();
        let err = check(&[
            ("/tmp/proj", GuestEntry::Dir),
            ("/tmp/proj/sub", GuestEntry::Link),
        ])
        .unwrap_err();
        assert_eq!(err.code(), "BOT-F003");
        assert!(err.to_string().contains("/tmp/proj/sub"), "{err}");
        assert_eq!(
            check(&[("/tmp/proj", GuestEntry::Link)])
                .unwrap_err()
                .code(),
            "BOT-F003"
        );
        assert_eq!(
            check(&[
                ("/tmp/proj", GuestEntry::Dir),
                ("/tmp/proj/g", GuestEntry::Dir)
            ])
            .unwrap_err()
            .code(),
            "BOT-F005"
        );
        assert_eq!(
            check(&[("/tmp/proj", GuestEntry::File)])
                .unwrap_err()
                .code(),
            "BOT-F005"
        );
        // Below a directory the copy creates, nothing is asked.
        let mut asked = Vec::new();
        check_existing("b", &placement, tree.entries(), |p: &GuestPath| {
            asked.push(p.to_string());
            Ok::<_, Infallible>(GuestEntry::Missing)
        })
        .unwrap()
        .unwrap();
        assert_eq!(asked, ["/tmp/proj"]);
    }
}
