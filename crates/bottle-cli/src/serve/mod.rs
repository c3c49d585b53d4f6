//! `bottle serve`: the sandbox interface for orchestrators that are not
//! Rust, as JSON over HTTP/1.1 on an owner-only unix socket (never TCP).
//! The protocol is docs/SANDBOX.md.
//!
//! - [`socket`]: the socket, owner-only, never taken from a live server;
//! - [`api`]: the endpoints;
//! - [`bottles`]: one worker per bottle, keeping its in-box agent's
//!   channel open across calls;
//! - [`children`]: boot, list and shutdown as `bottle` children;
//! - [`conn`]: how long a head may take, how long a connection may idle,
//!   and how many the server holds;
//! - [`error`]: the JSON errors and their statuses.

mod api;
mod bottles;
mod children;
mod conn;
mod error;
mod socket;

use std::process::ExitCode;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::signal::unix::{SignalKind, signal};

use crate::args::{Global, ServeArgs};
use crate::failure::{EXIT_BACKEND, Failure};
use crate::output::note;

/// How long to wait before accepting again after a failed accept.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// What every request handler shares.
pub(crate) struct Server {
    cli: children::BottleCli,
    bottles: bottles::Bottles,
    verbose: bool,
}

/// Serves until SIGINT or SIGTERM, then removes the socket.
pub(crate) fn run(global: &Global, args: &ServeArgs) -> Result<ExitCode, Failure> {
    let state_root = crate::lookup::state_root()?;
    let path = args
        .socket
        .clone()
        .unwrap_or_else(|| socket::default_path(&state_root));
    let bound = socket::bind(&path)?;
    let failed = |what: &str, err: std::io::Error| {
        Failure::new(
            "BOT-C047",
            EXIT_BACKEND,
            format!("the server could not {what}: {err}"),
        )
        .with_fix("check the host's limits (open files, threads) and try again")
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|err| failed("start its runtime", err))?;
    let server = Arc::new(Server {
        cli: children::BottleCli::current(global.backend.clone())?,
        bottles: bottles::Bottles::new(global.clone(), state_root),
        verbose: args.verbose,
    });
    if args.verbose {
        note(false, &format!("serve: listening on {}", path.display()));
    }
    let listener = bound
        .listener
        .try_clone()
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .map_err(|err| failed("use its socket", err))?;
    runtime
        .block_on(serve(listener, server))
        .map_err(|err| failed("serve", err))?;
    // In-flight requests are abandoned; their bottles' workers end with
    // the process, which closes their in-box agents' channels.
    runtime.shutdown_background();
    drop(bound);
    if args.verbose {
        note(false, "serve: stopped");
    }
    Ok(ExitCode::SUCCESS)
}

/// Accepts connections from this user until SIGINT or SIGTERM.
async fn serve(
    listener: std::os::unix::net::UnixListener,
    server: Arc<Server>,
) -> std::io::Result<()> {
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let uid = rustix::process::getuid().as_raw();
    // A slot per connection held: past the bound, the next connection waits
    // in the socket's backlog, not accepted, until one closes.
    let slots = Arc::new(tokio::sync::Semaphore::new(conn::MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                // Never closed while the loop runs.
                Err(_) => return Ok(()),
            },
        };
        let stream = tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors, say: retrying at once would spin
                // until a connection closes.
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // The socket is owner-only; a peer of another uid could only have
        // connected before its mode was set.
        if stream.peer_cred().map(|cred| cred.uid()).ok() != Some(uid) {
            continue;
        }
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let activity = conn::Activity::new();
            let answers = Arc::clone(&activity);
            let verbose = server.verbose;
            let service = hyper::service::service_fn(move |request| {
                let answering = answers.begin();
                let server = Arc::clone(&server);
                async move {
                    let answer = api::handle(server, request).await;
                    drop(answering);
                    answer
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                // hyper's head timer also runs while a keep-alive
                // connection waits for its next request; `conn::watch`
                // keeps the head's and the idle bound apart.
                .header_read_timeout(None)
                .serve_connection(
                    TokioIo::new(conn::Watched::new(stream, Arc::clone(&activity))),
                    service,
                );
            if let Err(why) = conn::watch(connection, activity, conn::BOUNDS).await
                && verbose
            {
                note(false, &format!("serve: closed a connection: {why}"));
            }
            drop(slot);
        });
    }
}
