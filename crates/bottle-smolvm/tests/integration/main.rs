//! Integration tests of the smolmachines backend: the wrapper, the state-DB
//! patcher, the local registry and the backend, run against `fake-smolvm`
//! and real SQLite files, sockets and processes, a temp dir per test.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns panic on setup failure, as tests do"
)]

mod backend;
mod cli;
mod pool;
mod registry;
mod sandbox;
mod statedb;
mod support;
