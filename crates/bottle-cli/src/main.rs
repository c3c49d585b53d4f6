//! The `bottle` binary: parse arguments, call the libraries, print, exit.
//!
//! Only this crate prints to the terminal or chooses exit codes; the
//! libraries return typed errors with stable codes.

mod arg_values;
mod args;
mod backends;
mod checkout;
mod commands;
mod cp;
mod detach_keys;
mod devices;
mod execute;
mod failure;
mod forward;
mod interrupt;
mod logs;
mod lookup;
mod output;
mod pool;
mod prompt;
mod requests;
mod reset;
mod serve;
mod session;
mod spawn_self;
mod start;
mod stop;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args = args::Cli::parse();
    match commands::run(args) {
        Ok(code) => code,
        Err(failure) => {
            output::print_failure(&failure);
            failure.exit_code()
        }
    }
}
