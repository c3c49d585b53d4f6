//! `bottle __session-host BOTTLE -- COMMAND`: the process that holds a
//! detached bottle's agent session (see the module above for why).
//!
//! It leaves the operator's session, closes the descriptors it inherited,
//! opens a pty and makes it its own controlling terminal and stdio, serves
//! the pty's other side on the session socket, and runs the agent through
//! the backend's interactive exec in-process. When the agent exits it keeps the last output and the
//! exit code for `bottle attach`, tells attached clients, and exits; the
//! bottle itself stays up until `bottle stop`.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bottle_core::state::SessionPaths;
use bottle_core::{process::Owner, slug};

use super::SCROLLBACK_BYTES;
use super::frame::{self, Frame};
use crate::failure::{EXIT_BACKEND, Failure};

/// How long the holder lets the agent's last output drain after it exits
/// (a process it left behind may keep the pty open).
const DRAIN_WITHIN: Duration = Duration::from_secs(5);

/// A client that stops reading for this long is dropped, so one stalled
/// client cannot stall the agent.
const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The holder's main: returns the agent's exit code.
pub(crate) fn run(
    global: &crate::args::Global,
    bottle: &str,
    command: &[String],
) -> Result<ExitCode, Failure> {
    let io_failure = |what: &str| {
        let what = what.to_string();
        move |err: std::io::Error| {
            Failure::new(
                "BOT-C011",
                EXIT_BACKEND,
                format!("the session holder could not {what}: {err}"),
            )
            .with_fix("see `bottle exec -t BOTTLE -- COMMAND` to run the agent by hand")
        }
    };
    // First, so closing the operator's terminal cannot signal us.
    rustix::process::setsid().map_err(|e| io_failure("leave the terminal's session")(e.into()))?;
    close_inherited_fds().map_err(io_failure("close the descriptors it inherited"))?;
    let name = slug::bottle_name(slug::slug_of(bottle));
    let paths = SessionPaths::new(&crate::lookup::state_root()?, slug::slug_of(bottle));
    // Before the socket exists, so `start` sees a bottle that cannot be
    // found as the holder's death, with this error in its log.
    let found = crate::lookup::find_bottle(global, &name)?;
    let (master, slave) = open_pty().map_err(io_failure("open a pty"))?;
    let socket = paths.socket();
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).map_err(io_failure("listen on the session socket"))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io_failure("make the session socket owner-only"))?;
    // Before the holder's identity: a session with an identity and no
    // command record is one from before the `started` marker (see
    // bottle-docker's orphan rule). The command also lets a reset start
    // the agent again.
    let argv = serde_json::to_vec(command).map_err(std::io::Error::other);
    argv.and_then(|argv| std::fs::write(paths.command(), argv))
        .map_err(io_failure("record the agent's command"))?;
    let holder = serde_json::to_vec(&Owner::current()).map_err(std::io::Error::other);
    holder
        .and_then(|bytes| std::fs::write(paths.holder(), bytes))
        .map_err(io_failure("record its identity"))?;
    become_stdio(&slave).map_err(io_failure("give the agent its terminal"))?;
    drop(slave);

    let master = Arc::new(master);
    let session = Arc::new(Mutex::new(Shared::default()));
    let (drained_tx, drained) = std::sync::mpsc::channel();
    {
        let (master, session) = (Arc::clone(&master), Arc::clone(&session));
        std::thread::spawn(move || {
            pump_output(&master, &session);
            let _ = drained_tx.send(());
        });
    }
    {
        let (master, session) = (Arc::clone(&master), Arc::clone(&session));
        std::thread::spawn(move || serve(&listener, &master, &session));
    }

    // `start` waits for the agent's command to run (or for this holder to
    // exit when it cannot start): only then is a detached launch complete.
    let mut started = || {
        let _ = std::fs::write(paths.started(), b"1\n");
        super::signal_ready(&paths);
    };
    // The agent's pushes into working checkouts come back while it runs
    // (`crate::checkout`); `stop` syncs again at the end.
    let state_dir = crate::lookup::state_dir_of(bottle)?;
    let watcher = crate::checkout::Watcher::start(&state_dir);
    let code = match found.exec_session(command, &mut started) {
        Ok(code) => code,
        Err(err) => {
            // Onto the pty: the operator reads it on attach.
            crate::output::print_failure(&Failure::from(err));
            1
        }
    };
    drop(found);
    if let Some(watcher) = watcher {
        // Logged in the state dir by the watcher; the agent's terminal
        // stays the agent's.
        drop(watcher.finish());
    }
    // Our stdio holds the pty's terminal side open; let go so the output
    // pump reads the end.
    if let Ok(null) = File::open("/dev/null") {
        let _ = become_stdio(&OwnedFd::from(null));
    }
    let _ = drained.recv_timeout(DRAIN_WITHIN);
    finish(&paths, &session, code);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// The agent's scrollback and the attached clients, behind one lock so a
/// client joining gets the scrollback and then every later byte, once.
#[derive(Default)]
struct Shared {
    scrollback: VecDeque<u8>,
    clients: Vec<UnixStream>,
}

impl Shared {
    fn broadcast(&mut self, frame: &Frame) {
        self.clients
            .retain_mut(|client| frame::write(client, frame).is_ok());
    }
}

/// Closes every descriptor above stdio this process inherited without
/// close-on-exec: the lock of an operator's `flock LOCK bottle start -d`,
/// a file the operator's shell holds open. The holder outlives its starter
/// by design, so whatever it keeps stays held until `bottle stop`. Called
/// first, while the holder has opened nothing of its own and runs one
/// thread, so every descriptor above stdio is inherited.
pub(crate) fn close_inherited_fds() -> std::io::Result<()> {
    let listed: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in listed.into_iter().filter(|&fd| fd > 2) {
        // EBADF is the listing's own descriptor, closed with it. Any other
        // error still releases the descriptor (close(2) on Linux).
        let _ = nix::unistd::close(fd);
    }
    Ok(())
}

fn open_pty() -> std::io::Result<(File, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    // Without O_NOCTTY: as a session leader with no terminal, opening it
    // makes it our controlling terminal, whose resizes signal SIGWINCH.
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(
        &master,
        rustix::termios::Winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok((File::from(master), slave))
}

/// Makes `fd` this process's stdin, stdout and stderr.
fn become_stdio(fd: &OwnedFd) -> std::io::Result<()> {
    rustix::stdio::dup2_stdin(fd)?;
    rustix::stdio::dup2_stdout(fd)?;
    rustix::stdio::dup2_stderr(fd)?;
    Ok(())
}

/// Copies the agent's output into the scrollback and to every client,
/// until the pty's terminal side is closed everywhere.
fn pump_output(master: &File, session: &Mutex<Shared>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match (&*master).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            // EIO: nothing holds the terminal side any more.
            Err(_) => return,
        };
        let mut shared = session.lock().unwrap_or_else(PoisonError::into_inner);
        shared.scrollback.extend(&buf[..n]);
        let excess = shared.scrollback.len().saturating_sub(SCROLLBACK_BYTES);
        shared.scrollback.drain(..excess);
        shared.broadcast(&Frame::Data(buf[..n].to_vec()));
    }
}

/// Accepts clients: each gets the scrollback, then joins the broadcast,
/// and its keystrokes and resizes go to the pty.
fn serve(listener: &UnixListener, master: &Arc<File>, session: &Arc<Mutex<Shared>>) {
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(reader) = client.try_clone() else {
            continue;
        };
        let _ = client.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT));
        {
            let mut shared = session.lock().unwrap_or_else(PoisonError::into_inner);
            let mut client = client;
            let scrollback: Vec<u8> = shared.scrollback.iter().copied().collect();
            if frame::write(&mut client, &Frame::Data(scrollback)).is_err() {
                continue;
            }
            shared.clients.push(client);
        }
        let master = Arc::clone(master);
        std::thread::spawn(move || relay_input(reader, &master));
    }
}

fn relay_input(mut client: UnixStream, master: &File) {
    while let Ok(Some(frame)) = frame::read(&mut client) {
        match frame {
            Frame::Data(bytes) => {
                if (&*master).write_all(&bytes).is_err() {
                    return;
                }
            }
            Frame::Resize { rows, cols } if rows > 0 && cols > 0 => {
                // The kernel signals SIGWINCH to the exec on a change.
                let _ = rustix::termios::tcsetwinsize(
                    master,
                    rustix::termios::Winsize {
                        ws_row: rows,
                        ws_col: cols,
                        ws_xpixel: 0,
                        ws_ypixel: 0,
                    },
                );
            }
            // Clients have no say in how the agent ended.
            Frame::Resize { .. } | Frame::Exit(_) => {}
        }
    }
}

/// Keeps the last output and the exit code for later `attach`es, tells the
/// attached clients, and takes the socket away. The exit code is written
/// before the socket goes, so `attach` always finds one or the other.
fn finish(paths: &SessionPaths, session: &Mutex<Shared>, code: i32) {
    let mut shared = session.lock().unwrap_or_else(PoisonError::into_inner);
    let scrollback: Vec<u8> = shared.scrollback.iter().copied().collect();
    let _ = std::fs::write(paths.scrollback(), scrollback);
    let _ = std::fs::write(paths.exit_code(), code.to_string());
    shared.broadcast(&Frame::Exit(code));
    let _ = std::fs::remove_file(paths.socket());
}
