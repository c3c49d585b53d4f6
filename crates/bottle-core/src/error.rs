//! Stable error codes and remedies shared by every crate's error type.

/// An error with a stable, documented code (`BOT-<AREA><NNN>`) and, when
/// there is one, what the operator should do about it.
///
/// Codes never change meaning once released: scripts and the docs refer to
/// them. `docs/ERRORS.md` lists every code.
///
/// An error's `Display` is the message alone, a lowercase fragment; the fix
/// is kept apart so that whoever shows the error (the CLI, the bundle's log)
/// renders it exactly once.
pub trait Coded {
    /// The stable code, e.g. `BOT-M001`.
    fn code(&self) -> &'static str;

    /// What the operator should do next, if anything can be said.
    fn fix(&self) -> Option<String>;
}
