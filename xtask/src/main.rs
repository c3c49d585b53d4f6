//! `cargo xtask`: project automation (gates, benchmarks).

use std::process::ExitCode;

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "sandbox-escape" | "bench" => {
            eprintln!("xtask {task}: not built yet; it lands with the docker backend (issue 4/6)");
            ExitCode::from(2)
        }
        _ => {
            eprintln!("usage: cargo xtask <sandbox-escape|bench>");
            ExitCode::from(2)
        }
    }
}
