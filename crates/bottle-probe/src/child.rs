//! Helper processes the probes spawn by re-executing the probe binary with
//! `--child <task>`, so the probe never forks without exec'ing and never
//! changes its own namespaces or limits.
//!
//! - `sleep MS`: sleeps (a fork-bomb member, a ptrace target).
//! - `alloc BYTES DEADLINE_MS`: touches up to BYTES of memory, printing
//!   progress; exit 0 when all were touched, 3 when an allocation failed,
//!   4 on the deadline.
//! - `unshare-user`: tries `unshare(CLONE_NEWUSER)`; exit 0 on success.
//! - `serve PORT TOKEN SECONDS`: listens on the box's `0.0.0.0:PORT` and
//!   answers each connection with [`crate::contract::serve_reply`] for at
//!   most SECONDS (at most 120): the published-port rows' box-side server.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a child task answers its parent probe on stdout"
)]

use std::io::Write;
use std::time::{Duration, Instant};

/// Runs a child task; returns the process exit code.
pub fn run(args: &[String]) -> u8 {
    let arg = |i: usize| args.get(i).and_then(|s| s.parse::<u64>().ok());
    match args.first().map(String::as_str) {
        Some("sleep") => {
            std::thread::sleep(Duration::from_millis(arg(1).unwrap_or(1000).min(120_000)));
            0
        }
        Some("alloc") => alloc(
            arg(1).unwrap_or(0),
            Duration::from_millis(arg(2).unwrap_or(10_000)),
        ),
        Some("unshare-user") => match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
            Ok(()) => {
                println!("unshared");
                0
            }
            Err(e) => {
                println!("{e:?}: {}", e.desc());
                1
            }
        },
        Some("serve") => match (arg(1), args.get(2)) {
            (Some(port), Some(token)) => serve(
                u16::try_from(port).unwrap_or(0),
                token,
                Duration::from_secs(arg(3).unwrap_or(20).min(120)),
            ),
            _ => {
                eprintln!("bottle-probe: serve PORT TOKEN SECONDS");
                2
            }
        },
        _ => {
            eprintln!("bottle-probe: unknown --child task {args:?}");
            2
        }
    }
}

fn serve(port: u16, token: &str, bound: Duration) -> u8 {
    let listener = match std::net::TcpListener::bind(("0.0.0.0", port)) {
        Ok(l) => l,
        Err(e) => {
            println!("bind 0.0.0.0:{port}: {e}");
            return 1;
        }
    };
    if listener.set_nonblocking(true).is_err() {
        return 1;
    }
    println!("listening on 0.0.0.0:{port}");
    let _ = std::io::stdout().flush();
    let reply = crate::contract::serve_reply(token);
    let end = Instant::now() + bound;
    let mut served = 0u32;
    // Bounded: at most 64 connections, each answered at once.
    while Instant::now() < end && served < 64 {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let _ = stream.write_all(reply.as_bytes());
                served += 1;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    println!("served {served}");
    0
}

fn alloc(target: u64, deadline: Duration) -> u8 {
    const CHUNK: usize = 16 << 20;
    let end = Instant::now() + deadline;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    let mut out = std::io::stdout();
    while total < target {
        if Instant::now() >= end {
            let _ = writeln!(out, "deadline at {total} bytes");
            return 4;
        }
        let mut v: Vec<u8> = Vec::new();
        if v.try_reserve_exact(CHUNK).is_err() {
            let _ = writeln!(out, "allocation failed at {total} bytes");
            return 3;
        }
        v.resize(CHUNK, 0);
        // Touch every page so the memory is really committed.
        for i in (0..CHUNK).step_by(4096) {
            v[i] = 1;
        }
        held.push(v);
        total += CHUNK as u64;
        let _ = writeln!(out, "{total}");
        let _ = out.flush();
    }
    let _ = writeln!(out, "touched {total} bytes");
    std::hint::black_box(&held);
    0
}
