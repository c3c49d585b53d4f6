//! The bundle's own log: one line per event on stderr, which is the
//! container's log (`docker logs`, and the tail `bottle` shows when a bundle
//! fails its health check). Decisions about traffic go to the audit log
//! instead (`audit.rs`).

/// Writes `bottle-bundle: <line>` to the bundle's log.
#[expect(
    clippy::print_stderr,
    reason = "the bundle's stderr is its log; this is the one place that writes it"
)]
pub fn line(line: std::fmt::Arguments<'_>) {
    eprintln!("bottle-bundle: {line}");
}

/// `log!("daemon: {x}")`: a line in the bundle's log.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}
