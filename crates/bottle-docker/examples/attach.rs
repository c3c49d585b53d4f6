//! Runs a command in a running docker bottle on this terminal (TTY, raw
//! mode, resize): `attach STATE_ROOT NAME [COMMAND...]`. Without a command
//! it runs the image's default one.

#![expect(
    clippy::print_stderr,
    reason = "an example reports what it did on the terminal"
)]

use std::process::ExitCode;

use bottle_core::BottleBackend;
use bottle_docker::{DockerBackend, DockerOptions};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [state_root, name, command @ ..] = args.as_slice() else {
        eprintln!("usage: attach STATE_ROOT NAME [COMMAND...]");
        return ExitCode::from(2);
    };
    let result = DockerBackend::new(DockerOptions::new(state_root))
        .and_then(|backend| backend.attach(name))
        .and_then(|bottle| bottle.exec_interactive(command));
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("attach: {err}");
            ExitCode::FAILURE
        }
    }
}
