//! Asking the operator y/N on the terminal.

use std::io::{self, BufRead as _, Write as _};

use crate::failure::{EXIT_USAGE, Failure};
use crate::output;

/// Asks y/N on the terminal; anything but y/yes declines.
pub(crate) fn confirm(question: &str) -> Result<bool, Failure> {
    confirm_to(question, "the plan", "start")
}

/// [`confirm`] for `what` (`the plan`), which `--yes` would `act` on
/// (`start`) without asking: with no terminal to ask on, an error saying so.
pub(crate) fn confirm_to(question: &str, what: &str, act: &str) -> Result<bool, Failure> {
    if !output::interactive() {
        return Err(Failure::new(
            "BOT-C003",
            EXIT_USAGE,
            format!("no terminal to confirm {what} on"),
        )
        .with_fix(format!("pass --yes to {act} without confirming")));
    }
    let mut stderr = io::stderr();
    let _ = write!(stderr, "{question} [y/N] ");
    let _ = stderr.flush();
    let mut answer = String::new();
    io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|err| anyhow::anyhow!("could not read the answer: {err}"))?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}
