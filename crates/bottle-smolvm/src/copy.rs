//! `bottle cp` on a microVM bottle, through `machine exec` as the agent's
//! user (every `machine exec` runs as the user the agent runs as).
//!
//! ## Into the box: written with the agent's own rights
//!
//! smolvm's `machine cp` writes as root in the guest, creating the
//! destination's directories and resolving its path with the guest's
//! links followed (`install_file_atomic` in smolvm's agent), and smolvm
//! has no pause. So a copy in does not use it: the archive streams over
//! `machine exec -i` into the image's own `tar`, run like every command of
//! the agent, as the agent's user. Whatever a link the agent planted could
//! lead that `tar` to, the agent could already write itself: a race
//! between bottle's check and the write gains the agent nothing. The
//! check still runs, for a clear error and so that a copy lands where the
//! operator named: a walk of the destination in the guest refuses any
//! link or non-directory on the way ([`bottle_core::copy::guest::walk`]),
//! and the extraction walks it again right before `tar` starts. Below the
//! destination, an existing link where the archive puts an entry is
//! replaced by `tar` (it unlinks before it creates), with the same rights.
//!
//! ## Out of the box
//!
//! `tar -c` of the path, run as the agent's user, streams on the exec's
//! stdout. The agent controls every byte of it (it may replace the
//! image's `tar`): the caller checks every entry before writing any.

use std::io::{Read, Write};

use bottle_core::backend::BackendError;
use bottle_core::copy::{CopyError, CopyIn, GuestEntry, GuestPath, Owner, guest};

use crate::cli::Smolvm;
use crate::error::SmolvmError;

/// What is at each directory of `$@` (path components) from `/` down, one
/// word a line, up to the first that is not a directory; a final link is
/// not followed.
const WALK: &str = r#"p=
for c in "$@"; do
  p="$p/$c"
  if [ -L "$p" ]; then echo link; exit 0; fi
  if [ -d "$p" ]; then echo dir; continue; fi
  if [ -f "$p" ]; then echo file; exit 0; fi
  if [ -e "$p" ]; then echo other; exit 0; fi
  echo missing; exit 0
done"#;

/// Walks `$@` again (exit 90 with `link PATH` or `gone PATH` when the way
/// changed since [`WALK`]), then extracts stdin there. `-o`: the files are
/// the extracting user's, whoever the archive names.
const EXTRACT: &str = r#"p=
for c in "$@"; do
  p="$p/$c"
  if [ -L "$p" ]; then echo "link $p"; exit 90; fi
  if [ ! -d "$p" ]; then echo "gone $p"; exit 90; fi
done
cd "${p:-/}" || exit 91
exec tar -x -o -f -"#;

/// The archive of `$2` in directory `$1` on stdout; exit 90 when it is not
/// there.
const ARCHIVE: &str = r#"cd "$1" 2>/dev/null || exit 90
[ -e "$2" ] || [ -L "$2" ] || exit 90
exec tar -c -f - -- "$2""#;

/// The exit code of the scripts above for "not there".
const GONE: i32 = 90;

fn script(body: &str, args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        body.to_string(),
        "bottle-cp".to_string(),
    ];
    argv.extend(args);
    argv
}

/// Copies `copy` into `machine` at `dest` (see the module docs).
pub fn copy_in(
    smolvm: &Smolvm,
    machine: &str,
    env: &[(String, String)],
    copy: &CopyIn,
    dest: &GuestPath,
) -> Result<(), BackendError> {
    let walked = smolvm.exec(machine, &script(WALK, dest.parts().to_vec()), env)?;
    if walked.exit_code != 0 {
        return Err(SmolvmError::Copy {
            machine: machine.to_string(),
            what: format!("look at {dest}"),
            detail: String::from_utf8_lossy(&walked.stderr).into_owned(),
        }
        .into());
    }
    let kinds: Vec<GuestEntry> = String::from_utf8_lossy(&walked.stdout)
        .lines()
        .map(|word| match word.trim() {
            "dir" => GuestEntry::Dir,
            "file" => GuestEntry::File,
            "link" => GuestEntry::Link,
            "other" => GuestEntry::Other,
            _ => GuestEntry::Missing,
        })
        .collect();
    let stat = |path: &GuestPath| -> Result<GuestEntry, SmolvmError> {
        Ok(match path.parts().len() {
            0 => GuestEntry::Dir,
            n => kinds.get(n - 1).copied().unwrap_or(GuestEntry::Missing),
        })
    };
    let found = guest::walk(machine, dest, stat)??;
    let placement = guest::place(machine, dest, found, copy)?;
    // `tar -o` makes every file the agent's, as it extracts as the agent.
    let archive = copy.archive_for(&placement, Owner { uid: 0, gid: 0 })?;
    let out = smolvm.exec_input(
        machine,
        &script(EXTRACT, placement.dir.parts().to_vec()),
        env,
        archive,
    )?;
    match out.exit_code {
        0 => Ok(()),
        GONE => {
            let said = String::from_utf8_lossy(&out.stdout);
            let (word, at) = said.trim().split_once(' ').unwrap_or(("gone", ""));
            let err = if word == "link" {
                CopyError::LinkOnTheWay {
                    bottle: machine.to_string(),
                    path: placement.dir.to_string(),
                    link: at.to_string(),
                }
            } else {
                CopyError::Missing {
                    bottle: machine.to_string(),
                    path: at.to_string(),
                }
            };
            Err(err.into())
        }
        code => Err(SmolvmError::Copy {
            machine: machine.to_string(),
            what: format!("extract the copy into {} (exit {code})", placement.dir),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
        .into()),
    }
}

/// Streams the guest's `tar -c` of `path` to `out`.
pub fn copy_out(
    smolvm: &Smolvm,
    machine: &str,
    env: &[(String, String)],
    path: &GuestPath,
    out: &mut dyn Write,
) -> Result<(), BackendError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(CopyError::GuestPath {
            path: path.to_string(),
            why: "copy out a file or directory, not /",
        }
        .into());
    };
    let mut child = smolvm.spawn_exec(
        machine,
        &script(ARCHIVE, [dir.to_string(), name.to_string()]),
        env,
    )?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match child.stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                child.kill();
                return Err(io_failed(machine, path, &err));
            }
        };
        if let Err(err) = out.write_all(&buf[..n]) {
            // A refused entry closed the reader: the guest's tar is ended.
            child.kill();
            return Err(io_failed(machine, path, &err));
        }
    }
    match child.wait() {
        Ok(Some(0)) => Ok(()),
        Ok(Some(GONE)) => Err(CopyError::Missing {
            bottle: machine.to_string(),
            path: path.to_string(),
        }
        .into()),
        Ok(code) => Err(SmolvmError::Copy {
            machine: machine.to_string(),
            what: format!("archive {path}"),
            detail: match code {
                Some(code) => format!("the guest's tar exited {code}"),
                None => "the guest's tar was killed".into(),
            },
        }
        .into()),
        Err(err) => Err(io_failed(machine, path, &err)),
    }
}

fn io_failed(machine: &str, path: &GuestPath, err: &std::io::Error) -> BackendError {
    SmolvmError::Copy {
        machine: machine.to_string(),
        what: format!("pass on the archive of {path}"),
        detail: err.to_string(),
    }
    .into()
}
