//! `bottle attach BOTTLE`: joins a detached bottle's agent session.
//!
//! On a terminal it goes raw (as `exec -t` does), forwards the terminal's
//! size as it changes, and detaches on the detach keys, restoring the
//! terminal. Without one it relays all the same, for scripts: the end of
//! its input detaches. The agent's output is relayed as it is, as `start`
//! and `exec -t` do: the operator joined the agent's terminal.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bottle_core::slug;
use bottle_core::state::SessionPaths;

use super::frame::{self, Frame};
use crate::detach_keys::{DetachKeys, Matcher};
use crate::failure::Failure;
use crate::output::note;

/// How often the terminal's size is looked at. Polling rather than a
/// SIGWINCH handler: it needs no process-wide signal disposition, and a
/// quarter second is quicker than a person resizes.
const SIZE_POLL: Duration = Duration::from_millis(250);

/// How the relay ended.
enum End {
    /// The operator detached (keys, or the end of a non-terminal input).
    Detached,
    /// The agent exited with this code.
    Exited(i32),
    /// The holder went away without saying (killed by `stop`).
    Lost,
}

/// Runs `bottle attach`.
pub(crate) fn run(
    global: &crate::args::Global,
    bottle: &str,
    keys: DetachKeys,
) -> Result<ExitCode, Failure> {
    let name = slug::bottle_name(slug::slug_of(bottle));
    let paths = SessionPaths::new(&crate::lookup::state_root()?, slug::slug_of(bottle));
    let Ok(stream) = UnixStream::connect(paths.socket()) else {
        return exited(&paths, &name);
    };
    let end = relay(stream, keys)?;
    match end {
        End::Detached => {
            note(
                global.quiet,
                &format!(
                    "detached from {name}; its agent keeps running (`bottle attach {name}` to return)"
                ),
            );
            Ok(ExitCode::SUCCESS)
        }
        End::Exited(code) => {
            note(
                global.quiet,
                &format!("the agent in {name} exited with code {code}"),
            );
            Ok(exit_code(code))
        }
        End::Lost => Err(Failure::new(
            "BOT-C012",
            crate::failure::EXIT_BACKEND,
            format!("the agent session of {name} ended without an exit code"),
        )
        .with_fix(format!(
            "see `bottle list`; `bottle stop {name}` ends the session"
        ))),
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// No live session: the agent's last output and exit code if it ran, else
/// the bottle never had a session.
fn exited(paths: &SessionPaths, name: &str) -> Result<ExitCode, Failure> {
    let Some(code) = std::fs::read_to_string(paths.exit_code())
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok())
    else {
        // No state dir at all: there is no such bottle, session or not.
        if !paths.dir.parent().is_some_and(std::path::Path::exists) {
            return Err(crate::lookup::no_bottle_named(name));
        }
        return Err(Failure::new(
            "BOT-C013",
            crate::failure::EXIT_USAGE,
            format!("{name} has no agent session to attach to"),
        )
        .with_fix(format!(
            "only `bottle start --detach` runs the agent in a session; see `bottle list`, or run a command with `bottle exec -t {name} -- COMMAND`"
        )));
    };
    crate::output::out_bytes(&std::fs::read(paths.scrollback()).unwrap_or_default());
    crate::output::err(&format!(
        "\nthe agent in {name} has exited with code {code}; `bottle stop {name}` removes the bottle\n"
    ));
    Ok(exit_code(code))
}

fn relay(stream: UnixStream, keys: DetachKeys) -> Result<End, Failure> {
    let tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let lost = |err: std::io::Error| {
        Failure::new(
            "BOT-C012",
            crate::failure::EXIT_BACKEND,
            format!("cannot talk to the agent session: {err}"),
        )
    };
    let writer = Arc::new(Mutex::new(stream.try_clone().map_err(lost)?));
    let mut reader = stream.try_clone().map_err(lost)?;
    // Restored when dropped, on every way out of this function.
    let _raw = if tty { RawMode::enable() } else { None };
    let (ends, ended) = mpsc::channel();

    {
        let ends = ends.clone();
        std::thread::spawn(move || {
            let mut stdout = std::io::stdout();
            let end = loop {
                match frame::read(&mut reader) {
                    Ok(Some(Frame::Data(bytes))) => {
                        let _ = stdout.write_all(&bytes).and_then(|()| stdout.flush());
                    }
                    Ok(Some(Frame::Exit(code))) => break End::Exited(code),
                    Ok(Some(Frame::Resize { .. })) => {}
                    Ok(None) | Err(_) => break End::Lost,
                }
            };
            let _ = ends.send(end);
        });
    }
    if tty {
        let writer = Arc::clone(&writer);
        std::thread::spawn(move || forward_sizes(&writer));
    }
    {
        let writer = Arc::clone(&writer);
        std::thread::spawn(move || forward_input(&writer, keys, &ends));
    }
    let end = ended.recv().unwrap_or(End::Lost);
    // Closing is detaching; it also ends the reader if it still runs.
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(end)
}

fn send(writer: &Mutex<UnixStream>, frame: &Frame) -> bool {
    let mut stream = writer.lock().unwrap_or_else(PoisonError::into_inner);
    frame::write(&mut *stream, frame).is_ok()
}

fn forward_input(writer: &Mutex<UnixStream>, keys: DetachKeys, ends: &Sender<End>) {
    let mut matcher = Matcher::new(keys);
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let (forward, detach) = matcher.feed(&buf[..n]);
        if !forward.is_empty() && !send(writer, &Frame::Data(forward)) {
            return;
        }
        if detach {
            break;
        }
    }
    let _ = ends.send(End::Detached);
}

fn forward_sizes(writer: &Mutex<UnixStream>) {
    let mut last = None;
    loop {
        let size = rustix::termios::tcgetwinsize(std::io::stdout())
            .ok()
            .map(|size| (size.ws_row, size.ws_col))
            .filter(|(rows, cols)| *rows > 0 && *cols > 0);
        if let Some((rows, cols)) = size
            && size != last
        {
            if !send(writer, &Frame::Resize { rows, cols }) {
                return;
            }
            last = size;
        }
        std::thread::sleep(SIZE_POLL);
    }
}

/// The operator's terminal in raw mode until dropped.
struct RawMode {
    original: rustix::termios::Termios,
}

impl RawMode {
    /// `None` when the terminal's settings cannot be changed: then the
    /// relay runs in the terminal's own mode, which still works.
    fn enable() -> Option<RawMode> {
        use rustix::termios::{OptionalActions, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let original = tcgetattr(&stdin).ok()?;
        let mut raw = original.clone();
        raw.make_raw();
        tcsetattr(&stdin, OptionalActions::Now, &raw).ok()?;
        Some(RawMode { original })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        use rustix::termios::{OptionalActions, tcsetattr};
        let _ = tcsetattr(std::io::stdin(), OptionalActions::Drain, &self.original);
    }
}
