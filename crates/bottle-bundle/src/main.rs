//! `bottle-bundle`: the sidecar bundle's single binary.
//!
//! - `bottle-bundle run --config /run/bottle/bundle.json` runs the daemons
//!   under the supervisor; it exits non-zero when they cannot be kept up.
//! - `bottle-bundle health [--addr 127.0.0.1:8888]` probes the proxy (a
//!   HEALTHCHECK for images that have no curl).
//! - `bottle-bundle gen-ca --bottle NAME --cert FILE --key FILE` writes a
//!   fresh per-bottle CA.

#![expect(
    clippy::print_stderr,
    reason = "a command-line program: `health` and `gen-ca` answer, and startup errors end, on stderr"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bottle_core::Coded;
use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(name = "bottle-bundle", version, about = "The bottle's sidecar bundle")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the bundle's daemons.
    Run {
        /// The bundle config (JSON).
        #[arg(long, default_value = bottle_core::bundle::BUNDLE_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Exit 0 if the proxy answers its health check.
    Health {
        /// The proxy's address.
        #[arg(long, default_value = "127.0.0.1:8888")]
        addr: SocketAddr,
    },
    /// Write a fresh per-bottle CA certificate and key (PEM).
    GenCa {
        /// The bottle's name (goes into the CA's subject).
        #[arg(long)]
        bottle: String,
        /// Where to write the certificate.
        #[arg(long)]
        cert: PathBuf,
        /// Where to write the private key.
        #[arg(long)]
        key: PathBuf,
    },
    /// git-gate's pre-receive hook (run by git through the hook's `#!`
    /// line, never by hand).
    #[command(hide = true)]
    GitHook {
        /// The hook script's path (appended by the kernel).
        script: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Health { addr } => health(addr),
        Command::GenCa { bottle, cert, key } => gen_ca(&bottle, &cert, &key),
        Command::GitHook { script: _ } => ExitCode::from(bottle_bundle::gitgate::hook::main()),
    }
}

fn fail(e: &bottle_bundle::BundleError) -> ExitCode {
    // One line: the bundle's stderr ends up in a log the backend quotes.
    match e.fix() {
        Some(fix) => eprintln!("bottle-bundle: error[{}]: {e}; fix: {fix}", e.code()),
        None => eprintln!("bottle-bundle: error[{}]: {e}", e.code()),
    }
    ExitCode::FAILURE
}

fn run(config: &std::path::Path) -> ExitCode {
    let config = match bottle_bundle::load_config(config) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bottle-bundle: error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let running = match bottle_bundle::start(config).await {
            Ok(r) => r,
            Err(e) => return fail(&e),
        };
        eprintln!("bottle-bundle: proxy on {}", running.proxy_addr);
        if let Some(addr) = running.git_gate_addr {
            eprintln!("bottle-bundle: git-gate on {addr}");
        }
        if let Some(addr) = running.supervise_addr {
            eprintln!("bottle-bundle: supervise on {addr}");
        }
        eprintln!("{}", bottle_core::bundle::BUNDLE_READY_LINE);
        // As PID 1 in a container, an unhandled SIGTERM would be ignored
        // and `docker stop` would wait for its SIGKILL timeout.
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bottle-bundle: error: could not handle SIGTERM: {e}");
                return ExitCode::FAILURE;
            }
        };
        tokio::select! {
            res = running.wait() => match res {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            },
            _ = term.recv() => ExitCode::SUCCESS,
            _ = tokio::signal::ctrl_c() => ExitCode::SUCCESS,
        }
    })
}

fn health(addr: SocketAddr) -> ExitCode {
    let probe = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /__bottle/health HTTP/1.1\r\nHost: bundle\r\nConnection: close\r\n\r\n")?;
        let mut buf = Vec::new();
        s.take(4096).read_to_end(&mut buf)?;
        Ok(buf.starts_with(b"HTTP/1.1 200"))
    };
    match probe() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bottle-bundle: health: {addr} answered, but not 200");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bottle-bundle: health: cannot reach {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gen_ca(bottle: &str, cert: &std::path::Path, key: &std::path::Path) -> ExitCode {
    let pair = match bottle_bundle::generate_ca(bottle) {
        Ok(p) => p,
        Err(e) => return fail(&e.into()),
    };
    if let Err(e) = std::fs::write(cert, pair.cert_pem) {
        eprintln!(
            "bottle-bundle: error: could not write {}: {e}",
            cert.display()
        );
        return ExitCode::FAILURE;
    }
    if let Err(e) = write_private(key, pair.key_pem.as_bytes()) {
        eprintln!(
            "bottle-bundle: error: could not write {}: {e}",
            key.display()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn write_private(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)
}
