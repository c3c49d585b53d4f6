//! Writing to the terminal. A closed stdout (`bottle list | head`) is not a
//! failure, so writes ignore broken pipes.

use std::io::{self, IsTerminal as _, Write as _};

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
    let _ = io::stderr().write_all(text.as_bytes());
}

/// Writes to stdout, ignoring a closed pipe.
pub(crate) fn out(text: &str) {
    let mut stdout = io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
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

/// A one-line note on stderr (warnings, progress), unless quiet.
pub(crate) fn note(quiet: bool, text: &str) {
    if !quiet {
        err_bytes(format!("{text}\n").as_bytes());
    }
}

/// Pretty JSON on stdout.
pub(crate) fn json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|err| anyhow::anyhow!("could not render JSON: {err}"))?;
    out(&format!("{text}\n"));
    Ok(())
}

/// Whether stdin and stderr are both terminals (a prompt can be answered).
pub(crate) fn interactive() -> bool {
    io::stdin().is_terminal() && io::stderr().is_terminal()
}

/// A fixed-width table: a header row and left-aligned columns.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
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
    for row in rows {
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
}
