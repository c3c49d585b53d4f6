//! The operator's terminal during `exec_interactive`: raw mode (restored by
//! a guard's `Drop`, so on every way out), its window size, and a stdin
//! reader thread that can be told to stop.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::termios::{self, SetArg, Termios};

use crate::error::DockerError;

/// True when both stdin and stdout are terminals.
pub(crate) fn stdin_and_stdout_are_terminals() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// Puts stdin's terminal in raw mode until dropped.
#[derive(Debug)]
pub(crate) struct RawMode {
    original: Termios,
}

impl RawMode {
    /// Saves the current settings and switches to raw mode.
    pub(crate) fn enable() -> Result<RawMode, DockerError> {
        let stdin = std::io::stdin();
        let err = |action: &str| {
            let action = action.to_string();
            move |e: nix::Error| DockerError::Terminal {
                action,
                detail: e.to_string(),
            }
        };
        let original =
            termios::tcgetattr(stdin.as_fd()).map_err(err("read the terminal settings"))?;
        let mut raw = original.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)
            .map_err(err("put the terminal in raw mode"))?;
        Ok(RawMode { original })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing sensible to do if this fails; the terminal is gone.
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &self.original);
    }
}

/// The terminal's (rows, columns), from stdout.
pub(crate) fn window_size() -> Option<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// Reads stdin on its own thread and forwards chunks over a channel. The
/// thread polls with a short timeout so [`StdinPump::stop`] ends it without
/// waiting for the operator to type.
#[derive(Debug)]
pub(crate) struct StdinPump {
    stop: Arc<AtomicBool>,
}

impl StdinPump {
    /// Starts the reader. The channel closes at end of input.
    pub(crate) fn start() -> (tokio::sync::mpsc::Receiver<Vec<u8>>, StdinPump) {
        // Bounded, so a large piped input is read no faster than the exec
        // takes it (at most this many 16 KiB chunks in flight).
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        // If no thread can be started, the sender is dropped with the
        // closure and the operator's input reads as already ended.
        let _ = std::thread::Builder::new()
            .name("bottle-stdin".into())
            .spawn(move || pump(&tx, &flag));
        (rx, StdinPump { stop })
    }

    /// Tells the reader thread to finish.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Drop for StdinPump {
    fn drop(&mut self) {
        self.stop();
    }
}

fn pump(tx: &tokio::sync::mpsc::Sender<Vec<u8>>, stop: &AtomicBool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let stdin = std::io::stdin();
    // Larger than std's 8 KiB buffer, so reads bypass it and poll() sees
    // exactly what is left unread.
    let mut buf = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        let ready = {
            let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(100u16)) {
                Ok(0) => false,
                Ok(_) => true,
                Err(nix::Error::EINTR) => false,
                Err(_) => return,
            }
        };
        if !ready {
            continue;
        }
        match stdin.lock().read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if tx.blocking_send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
