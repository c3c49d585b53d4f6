//! Stable error codes shared by every crate's error type.

/// An error with a stable, documented code (`BOT-<AREA><NNN>`).
///
/// Codes never change meaning once released: scripts and the docs refer to
/// them. `docs/ERRORS.md` lists every code.
pub trait Coded {
    /// The stable code, e.g. `BOT-M001`.
    fn code(&self) -> &'static str;
}
