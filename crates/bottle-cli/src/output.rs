//! Writing to the terminal. A closed stdout (`bottle list | head`) is not a
//! failure, so writes ignore broken pipes.
//!
//! Much of what the CLI prints was written by the agent (request hosts,
//! reasons, audit lines), so every text and JSON writer here passes it
//! through `bottle_core::display` first: nothing a terminal would act on
//! reaches it raw. Only `out_bytes`/`err_bytes` write bytes as they are:
//! for a detached agent's kept output that `bottle attach` replays (as
//! `bottle exec` and `attach` stream the agent's bytes unaltered, as the
//! operator asked), and for the image build's progress lines.

use std::borrow::Cow;
use std::io::{self, IsTerminal as _, Write as _};

use bottle_core::display::{escape_for_terminal, escape_json_for_terminal};

use crate::failure::Failure;

/// Prints `error[CODE]: message` and, when there is one, a single `fix:`
/// line to stderr.
pub(crate) fn print_failure(failure: &Failure) {
    let mut text = match failure.code {
        Some(code) => format!("error[{code}]: {}\n", failure.message),
        None => format!("error: {}\n", failure.message),
    };
    if let Some(fix) = &failure.fix {
        text.push_str(&format!("  fix: {fix}\n"));
    }
    let _ = io::stderr().write_all(escape_lines(&text).as_bytes());
}

/// `text` with each line escaped for the terminal: its newlines are the
/// output's own structure and stay, every other control is escaped.
fn escape_lines(text: &str) -> Cow<'_, str> {
    if !text
        .chars()
        .any(|c| c != '\n' && bottle_core::display::needs_escape(c))
    {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.split('\n')
            .map(escape_for_terminal)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Writes text to stdout, each line escaped for the terminal, ignoring a
/// closed pipe.
pub(crate) fn out(text: &str) {
    let mut stdout = io::stdout().lock();
    let _ = stdout.write_all(escape_lines(text).as_bytes());
    let _ = stdout.flush();
}

/// Writes raw bytes to stdout, ignoring a closed pipe.
pub(crate) fn out_bytes(bytes: &[u8]) {
    let mut stdout = io::stdout().lock();
    let _ = stdout.write_all(bytes);
    let _ = stdout.flush();
}

/// Writes raw bytes to stderr.
pub(crate) fn err_bytes(bytes: &[u8]) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(bytes);
    let _ = stderr.flush();
}

/// Writes text to stderr, each line escaped for the terminal.
pub(crate) fn err(text: &str) {
    err_bytes(escape_lines(text).as_bytes());
}

/// A note on stderr (warnings, progress), each line escaped for the
/// terminal, unless quiet.
pub(crate) fn note(quiet: bool, text: &str) {
    if !quiet {
        err(&format!("{text}\n"));
    }
}

/// Pretty JSON on stdout; characters a terminal would act on are written as
/// `\uXXXX` escapes, so the text still parses to the same value.
pub(crate) fn json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|err| anyhow::anyhow!("could not render JSON: {err}"))?;
    out(&format!("{}\n", escape_json_for_terminal(&text)));
    Ok(())
}

/// Whether stdin and stderr are both terminals (a prompt can be answered).
pub(crate) fn interactive() -> bool {
    io::stdin().is_terminal() && io::stderr().is_terminal()
}

/// A fixed-width table: a header row and left-aligned columns. Each cell is
/// escaped for the terminal, so no cell can add a row or act on it.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| escape_for_terminal(cell).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let render = |cells: Vec<&str>| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        line.trim_end().to_string() + "\n"
    };
    let mut out = render(header.to_vec());
    for row in &rows {
        out.push_str(&render(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let rows = vec![
            vec!["a".to_string(), "long value".to_string(), "x".to_string()],
            vec!["bbbb".to_string(), "v".to_string(), "y".to_string()],
        ];
        let text = table(&["K", "VALUE", "Z"], &rows);
        assert_eq!(
            text,
            "K     VALUE       Z\na     long value  x\nbbbb  v           y\n"
        );
    }

    #[test]
    fn table_cells_cannot_add_rows_or_controls() {
        let rows = vec![vec!["a\nb".to_string(), "\u{9b}2J".to_string()]];
        let text = table(&["K", "V"], &rows);
        assert_eq!(text, "K        V\na\\u{a}b  \\u{9b}2J\n");
    }

    #[test]
    fn lines_stay_lines_and_controls_in_them_are_escaped() {
        assert_eq!(escape_lines("a\u{1b}[2J\nb\r\n"), "a\\u{1b}[2J\nb\\u{d}\n");
    }
}
