//! Integration tests for `bottle-net`: real files, real locks, real
//! processes, a temp dir per test.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns panic on setup failure, as tests do"
)]

mod alias;
mod concurrency;
mod routes;
mod support;
