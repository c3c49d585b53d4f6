//! `cargo xtask`: project automation. One module per subcommand.
//!
//! - `cargo xtask bench [--quick] [BENCH...]`: every benchmark (or those named) against its baseline
//!   in the same run (see [`bench`](mod@bench)).
//! - `cargo xtask test`: build the static binaries the tests put into images
//!   and the Debian agent image, then run every test of the workspace.
//! - `cargo xtask dist`: build the static binaries only.
//! - `cargo xtask install [--prefix DIR]`: build `bottle` and its bundle and
//!   install them (see [`install`]).
//! - `cargo xtask agent-image`: the Debian agent image the end-to-end test
//!   runs (see [`agent_image`]).
//! - `cargo xtask demo`: bring up the example bottle and show its policy.
//! - `cargo xtask sandbox-escape`: the escape gate (see [`escape`]).
//! - `cargo xtask fuzz`: the long fuzz campaign against the bundle's
//!   daemons (see [`fuzz`]).
//!
//! Its tests include tidy (`tidy.rs`): checks of the repository's own text.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a build tool: it reports to the developer's terminal"
)]

mod agent_image;
mod bench;
mod demo;
mod dist;
mod escape;
mod fuzz;
mod install;
mod process;
mod test;
#[cfg(test)]
mod tidy;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("", &[][..]),
    };
    let result = match task {
        "test" => test::run(rest),
        "bench" => bench::run(rest),
        "demo" => demo::run(),
        "dist" => dist::run().map(|_| ExitCode::SUCCESS),
        "install" => install::run(rest),
        "agent-image" => agent_image::run().map(|()| ExitCode::SUCCESS),
        "sandbox-escape" => escape::run(rest),
        "fuzz" => fuzz::run(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <test|bench|dist|install|agent-image|demo|sandbox-escape|fuzz> [args]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: xtask {task}: {err:#}");
            ExitCode::FAILURE
        }
    }
}
