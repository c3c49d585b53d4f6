//! `bottle cp`, both ways, with `docker cp`'s argument shapes:
//!
//! - `bottle cp PATH BOTTLE:DEST`, `bottle cp - BOTTLE:DIR` (a tar on
//!   stdin): into the box, by the backend, which never follows a link
//!   inside it ([`bottle_core::copy`]);
//! - `bottle cp BOTTLE:PATH DEST`, `bottle cp BOTTLE:PATH -` (a tar on
//!   stdout): out of the box. The backend streams the box's archive
//!   through a pipe to a checker on another thread, which writes each
//!   entry that passes into a fresh directory beside the destination (or
//!   a spooled clean archive); only when the whole archive passed and the
//!   backend said its side succeeded is it renamed into place (or
//!   written out).

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::process::ExitCode;

use bottle_core::copy::host::{self, HostTarget};
use bottle_core::copy::{ArchiveSource, CopyError, CopyIn, GuestPath};

use crate::args::{CpArgs, Global};
use crate::failure::{EXIT_INTERRUPTED, EXIT_USAGE, Failure, exit_for};
use crate::interrupt;
use crate::lookup::find_bottle;
use crate::output::note;

/// One side of a copy as written on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    /// A host path.
    Host(PathBuf),
    /// `-`: stdin or stdout.
    Stdio,
    /// `BOTTLE:PATH`.
    Bottle {
        /// The bottle (`bot-bottle-<slug>` or `<slug>`).
        bottle: String,
        /// The path in it.
        path: String,
    },
}

/// `docker cp`'s reading of an argument: `-` is the stream; an absolute
/// path, or one starting with `.`, is the host's (so `./a:b` names a host
/// file); otherwise `NAME:PATH` with a name holding no `/` is a bottle's.
fn side(arg: &OsStr) -> Side {
    if arg == "-" {
        return Side::Stdio;
    }
    let host = || Side::Host(PathBuf::from(arg));
    let Some(text) = arg.to_str() else {
        return host();
    };
    if text.starts_with('/') || text.starts_with('.') {
        return host();
    }
    match text.split_once(':') {
        Some((bottle, path)) if !bottle.is_empty() && !bottle.contains('/') => Side::Bottle {
            bottle: bottle.to_string(),
            path: path.to_string(),
        },
        _ => host(),
    }
}

/// `bottle cp`.
pub(crate) fn run(global: &Global, args: &CpArgs) -> Result<ExitCode, Failure> {
    match (side(&args.source), side(&args.destination)) {
        (Side::Host(source), Side::Bottle { bottle, path }) => {
            copy_in(global, Some(source), &bottle, &path, args.max_size)
        }
        (Side::Stdio, Side::Bottle { bottle, path }) => {
            copy_in(global, None, &bottle, &path, args.max_size)
        }
        (Side::Bottle { bottle, path }, Side::Host(dest)) => {
            copy_out(global, &bottle, &path, Some(dest), args.max_size)
        }
        (Side::Bottle { bottle, path }, Side::Stdio) => {
            copy_out(global, &bottle, &path, None, args.max_size)
        }
        _ => Err(Failure::new(
            "BOT-C006",
            EXIT_USAGE,
            format!(
                "exactly one of {} and {} must name a bottle, as BOTTLE:PATH",
                shown(&args.source),
                shown(&args.destination)
            ),
        )
        .with_fix(
            "e.g. `bottle cp notes.txt demo:/home/agent`, or `bottle cp demo:/home/agent/out .`; write a host path holding `:` as ./name",
        )),
    }
}

fn shown(arg: &OsStr) -> String {
    format!("{:?}", String::from_utf8_lossy(arg.as_bytes()))
}

/// A copy error on its way to the operator.
fn failure(err: &CopyError) -> Failure {
    let exit = match err {
        CopyError::Interrupted => EXIT_INTERRUPTED,
        CopyError::HostIo { .. } => 1,
        other => exit_for(other.kind()),
    };
    Failure::coded(err, exit)
}

fn copy_in(
    global: &Global,
    source: Option<PathBuf>,
    bottle: &str,
    path: &str,
    limit: u64,
) -> Result<ExitCode, Failure> {
    let dest = GuestPath::parse(path).map_err(|e| failure(&e))?;
    let signals = interrupt::during_copy()?;
    let interrupt = interrupt::launch();
    let copy = match &source {
        Some(path) => CopyIn::from_host(path),
        None => CopyIn::from_archive(std::io::stdin().lock(), limit, Some(&interrupt)),
    }
    .map_err(|e| failure(&e))?;
    let bottle = find_bottle(global, bottle)?;
    bottle.copy_in(&copy, &dest)?;
    signals.ended();
    note(
        global.quiet,
        &format!(
            "copied {} to {}:{dest}",
            source.map_or_else(|| "stdin".into(), |p| p.display().to_string()),
            bottle.name()
        ),
    );
    Ok(ExitCode::SUCCESS)
}

/// What the checker made of the box's archive.
enum Checked {
    /// Written beside the destination, to rename into place.
    Received(host::Received),
    /// Spooled as a clean archive, to write to stdout.
    Repacked(host::Repacked),
}

fn copy_out(
    global: &Global,
    bottle: &str,
    path: &str,
    dest: Option<PathBuf>,
    limit: u64,
) -> Result<ExitCode, Failure> {
    let path = GuestPath::parse(path).map_err(|e| failure(&e))?;
    let Some(name) = path.file_name() else {
        return Err(failure(&CopyError::GuestPath {
            path: path.to_string(),
            why: "copy out a file or a directory, not /",
        }));
    };
    let target = dest
        .as_deref()
        .map(|dest| HostTarget::resolve(dest, name))
        .transpose()
        .map_err(|e| failure(&e))?;
    let bottle = find_bottle(global, bottle)?;
    let from = ArchiveSource::Bottle(bottle.name().to_string());
    let signals = interrupt::during_copy()?;
    let interrupt = interrupt::launch();
    let owner = (
        u64::from(nix::unistd::getuid().as_raw()),
        u64::from(nix::unistd::getgid().as_raw()),
    );
    let (reader, writer) =
        std::io::pipe().map_err(|e| anyhow::anyhow!("could not make a pipe: {e}"))?;
    let mut writer = Tracked {
        inner: Some(writer),
        failed: false,
    };
    let (produced, checked) = std::thread::scope(|scope| {
        let checker =
            scope.spawn(|| match &target {
                Some(target) => host::receive(reader, &from, target, limit, Some(&interrupt))
                    .map(Checked::Received),
                None => host::repack(reader, &from, limit, Some(&interrupt), owner)
                    .map(Checked::Repacked),
            });
        let produced = bottle.copy_out(&path, &mut writer);
        // The end of the stream, for the checker.
        writer.inner = None;
        (produced, checker.join())
    });
    let checked = checked.map_err(|_| anyhow::anyhow!("the archive checker panicked"))?;
    let checked = match (produced, checked) {
        (Ok(()), Ok(checked)) => checked,
        // The checker stopped reading (a refused entry, the bound, ^C):
        // the backend's failed write is only its consequence.
        (_, Err(err)) if writer.failed => return Err(failure(&err)),
        (Err(err), _) => return Err(err.into()),
        (Ok(()), Err(err)) => return Err(failure(&err)),
    };
    let landed = match checked {
        Checked::Received(received) => {
            let at = received.commit().map_err(|e| failure(&e))?;
            Some(at)
        }
        Checked::Repacked(repacked) => {
            let mut stdout = std::io::stdout().lock();
            repacked.write_to(&mut stdout).map_err(|e| failure(&e))?;
            None
        }
    };
    signals.ended();
    if let Some(at) = landed {
        note(
            global.quiet,
            &format!("copied {}:{path} to {}", bottle.name(), at.display()),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The pipe's writing end, remembering whether a write failed (the
/// checker closed its end).
struct Tracked {
    inner: Option<std::io::PipeWriter>,
    failed: bool,
}

impl Write for Tracked {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(inner) = &mut self.inner else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        inner.write(buf).inspect_err(|_| self.failed = true)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.inner {
            Some(inner) => inner.flush(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use bottle_core::Coded as _;

    use super::*;

    fn of(text: &str) -> Side {
        side(OsStr::new(text))
    }

    #[test]
    fn arguments_are_read_as_docker_cp_reads_them() {
        assert_eq!(of("-"), Side::Stdio);
        assert_eq!(
            of("demo:/home/agent"),
            Side::Bottle {
                bottle: "demo".into(),
                path: "/home/agent".into()
            }
        );
        assert_eq!(of("notes.txt"), Side::Host("notes.txt".into()));
        assert_eq!(of("./a:b"), Side::Host("./a:b".into()));
        assert_eq!(of("/tmp/a:b"), Side::Host("/tmp/a:b".into()));
        assert_eq!(of("dir/a:b"), Side::Host("dir/a:b".into()));
        assert_eq!(of(":x"), Side::Host(":x".into()));
        assert_eq!(
            of("demo:"),
            Side::Bottle {
                bottle: "demo".into(),
                path: String::new()
            }
        );
    }

    #[test]
    fn an_interrupted_copy_exits_as_interrupted() {
        assert_eq!(CopyError::Interrupted.code(), "BOT-F024");
        assert_eq!(failure(&CopyError::Interrupted).exit, EXIT_INTERRUPTED);
    }
}
