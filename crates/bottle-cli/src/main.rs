//! The `bottle` binary.
fn main() {}
