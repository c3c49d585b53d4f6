//! `bottle-probe --config FILE`: runs the escape probes the config selects
//! and prints one `ProbeResult` JSON line per probe. Exit 0 when every
//! probe ran (whatever they found: the harness judges), 1 when the config
//! is unusable or stdout closed, 2 on a usage error.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "the probe's contract with the harness is one JSON line per probe on stdout"
)]

use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "usage: bottle-probe --config FILE";

fn main() -> ExitCode {
    // Before anything opens a descriptor of its own.
    let startup = bottle_probe::Startup::capture();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--child") => ExitCode::from(bottle_probe::child::run(&args[1..])),
        Some("--help" | "-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some("--config") if args.len() == 2 => {
            let config = match bottle_probe::load_config(Path::new(&args[1])) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("bottle-probe: {e}");
                    return ExitCode::from(1);
                }
            };
            let mut out = std::io::stdout().lock();
            match bottle_probe::run_to(&config, startup, &mut out) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bottle-probe: {e}");
                    ExitCode::from(1)
                }
            }
        }
        _ => {
            eprintln!("bottle-probe: {USAGE}");
            ExitCode::from(2)
        }
    }
}
