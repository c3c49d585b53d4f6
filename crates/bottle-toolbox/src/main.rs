//! `bottle-toolbox`: the in-box agent of the sandbox interface.
//!
//! The host starts it once per bottle, as the agent's user, through the
//! stream the backend already has (an attached `docker exec`, a `smolvm
//! machine exec -i`), and speaks `bottle_core::sandbox::wire` with it over
//! its stdin and stdout. It opens no socket and listens on nothing; it ends
//! when its stdin ends. Each call runs in its own process group, which is
//! killed at the call's deadline.
//!
//! Run as `bottle-toolbox connect PORT` it is instead the in-box end of a
//! published port ([`relay`], `bottle_core::port_relay`): one connection
//! to `PORT` on the box's own loopback, copied to and from its stdin and
//! stdout, ending with the connection. It dials nothing else and listens
//! on nothing.
//!
//! Its stdin and stdout are the channel every result travels on, so before
//! anything else it makes itself unreachable to the agent's processes
//! ([`guard`]): not dumpable (so no process without `CAP_SYS_PTRACE` can
//! open its descriptors, read its memory or trace it), no capability and
//! no way to gain one, which every call it runs inherits.

#![expect(
    clippy::print_stderr,
    reason = "a broken channel is said on stderr, which the host keeps apart from the frames"
)]

mod builtin;
mod fds;
mod filter;
mod guard;
mod relay;
mod run;

use std::io::{BufReader, BufWriter};

use bottle_core::sandbox::wire::{self, Op, PROTOCOL_VERSION, Reply, Request, Response};

fn main() -> std::process::ExitCode {
    // A program of the agent's to start under bottle's filter: it is the
    // agent's, not a channel, so nothing below applies to it.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, dashes, argv @ ..] = args.as_slice()
        && mode == bottle_core::sandbox::FILTERED
        && dashes == "--"
    {
        eprintln!("bottle-toolbox: {}", filter::exec_filtered(argv));
        return std::process::ExitCode::from(126);
    }
    // First, before a thread or a descriptor of its own exists: capability
    // sets are per thread, and the channel must be out of reach before a
    // call can run.
    if let Err(why) = guard::guard() {
        eprintln!("bottle-toolbox: refusing to serve: {why}");
        return std::process::ExitCode::FAILURE;
    }
    if let Some(first) = args.first() {
        if first == bottle_core::port_relay::CONNECT && args.len() == 2 {
            return relay::connect(&args[1]);
        }
        eprintln!(
            "bottle-toolbox: unknown arguments {args:?}; run it without any (the host's tool channel), as `{} PORT` or as `{} -- PROGRAM ARGS…`",
            bottle_core::port_relay::CONNECT,
            bottle_core::sandbox::FILTERED
        );
        return std::process::ExitCode::from(2);
    }
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut reader = BufReader::new(stdin.lock());
    let mut writer = BufWriter::new(stdout.lock());
    // Every frame this agent writes is numbered, from 1; the host takes a
    // frame only with the next number and its request's id.
    let mut seq = 0u64;
    loop {
        let request: Request = match wire::read_frame(&mut reader) {
            Ok(Some(request)) => request,
            Ok(None) => return std::process::ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("bottle-toolbox: {err}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let reply = answer(request.op);
        seq += 1;
        if let Err(err) = wire::write_frame(
            &mut writer,
            &Response {
                id: request.id,
                seq,
                reply,
            },
        ) {
            eprintln!("bottle-toolbox: {err}");
            return std::process::ExitCode::FAILURE;
        }
    }
}

fn answer(op: Op) -> Reply {
    match op {
        Op::Hello => Reply::Hello {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        },
        Op::Exec {
            command,
            env,
            cwd,
            stdin,
            deadline_ms,
        } => run::exec(
            &command,
            &env,
            cwd.as_deref(),
            stdin,
            std::time::Duration::from_millis(deadline_ms),
        ),
        Op::CountOpenFds => fds::count(std::path::Path::new("/proc"), std::process::id()),
    }
}
