//! Integration tests for `bottle-net`: real route-table files, a temp dir
//! per test.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns panic on setup failure, as tests do"
)]

mod routes;
