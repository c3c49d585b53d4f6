//! `bottle requests`, `bottle approve`, `bottle deny`: the operator's side
//! of supervise's request queue (`bottle_core::requests`).

use std::path::Path;
use std::process::ExitCode;

use bottle_core::display::escape_for_terminal;
use bottle_core::requests::{self, RequestError, Status};
use bottle_core::slug;

use crate::args::{DecideArgs, Global, RequestsArgs};
use crate::failure::{EXIT_USAGE, Failure};
use crate::output::{self, note, out};

impl From<RequestError> for Failure {
    fn from(err: RequestError) -> Failure {
        let exit = match err {
            RequestError::Io { .. } | RequestError::Invalid { .. } => 1,
            RequestError::Unknown { .. }
            | RequestError::BadId { .. }
            | RequestError::AlreadyDecided { .. } => EXIT_USAGE,
        };
        Failure::coded(&err, exit)
    }
}

/// `bottle requests [BOTTLE] [--all]`.
pub(crate) fn list(
    global: &Global,
    args: &RequestsArgs,
    state_root: &Path,
) -> Result<ExitCode, Failure> {
    let mut all = match &args.bottle {
        Some(bottle) => {
            let dir = requests::requests_dir(&state_root.join(slug::slug_of(bottle)));
            requests::list(&dir)?
        }
        None => requests::list_all(state_root, true)?,
    };
    if !args.all {
        all.retain(|r| r.status == Status::Pending);
    }
    if global.json {
        output::json(&all)?;
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        note(
            global.quiet,
            if args.all {
                "no requests"
            } else {
                "no pending requests"
            },
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.bottle.clone(),
                r.ask.kind().to_string(),
                one_line(&r.ask.summary(), 60),
                r.status.to_string(),
                one_line(&r.reason, 60),
            ]
        })
        .collect();
    out(&output::table(
        &["ID", "BOTTLE", "KIND", "WHAT", "STATUS", "REASON"],
        &rows,
    ));
    if !args.all {
        note(
            global.quiet,
            "answer with `bottle approve ID` or `bottle deny ID [--reason TEXT]`",
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `bottle approve ID` / `bottle deny ID`.
pub(crate) fn decide(
    global: &Global,
    args: &DecideArgs,
    decision: Status,
    state_root: &Path,
) -> Result<ExitCode, Failure> {
    let request = requests::decide_in(state_root, &args.id, decision, args.reason.as_deref())?;
    if global.json {
        output::json(&request)?;
        return Ok(ExitCode::SUCCESS);
    }
    let effect = match (&request.ask, decision) {
        (requests::Ask::Egress { host }, Status::Approved) => {
            format!(
                "; {} is allowed for {} from now on",
                escape_for_terminal(host),
                escape_for_terminal(&request.bottle)
            )
        }
        (requests::Ask::Push { repo, git_ref }, Status::Approved) => format!(
            "; {} can be pushed to {} from now on",
            escape_for_terminal(git_ref),
            escape_for_terminal(repo)
        ),
        _ => String::new(),
    };
    out(&format!(
        "{} {}: {} {}{effect}\n",
        request.status,
        escape_for_terminal(&request.id),
        request.ask.kind(),
        one_line(&request.ask.summary(), 80)
    ));
    Ok(ExitCode::SUCCESS)
}

/// Pending requests of the bottle named `bottle` (for `bottle list`).
pub(crate) fn pending_count(state_root: &Path, bottle: &str) -> usize {
    let dir = requests::requests_dir(&state_root.join(slug::slug_of(bottle)));
    requests::pending(&dir).map_or(0, |p| p.len())
}

/// `text` escaped for the terminal (so on one line), cut to `max`
/// characters: the agent wrote it, so it must not be able to forge extra
/// table rows or act on the terminal.
fn one_line(text: &str, max: usize) -> String {
    let clean = escape_for_terminal(text);
    if clean.chars().count() > max {
        clean
            .chars()
            .take(max.saturating_sub(1))
            .collect::<String>()
            + "…"
    } else {
        clean.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_text_stays_on_one_line() {
        assert_eq!(one_line("a\nb\x1b[2J", 80), r"a\u{a}b\u{1b}[2J");
        assert_eq!(one_line("abcdef", 4), "abc…");
    }
}
