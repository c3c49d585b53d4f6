//! Runs the real probe binary on the host against canaries these tests
//! start on loopback: as the positive control (every network probe must
//! reach, with the token), against closed ports (every probe blocked), and
//! against a strict and a leaky fake proxy. Binding the canaries' fixed
//! ports (80, 443, 53, ...) needs root; without it the tests say so and
//! skip, unless `BOTTLE_REQUIRE_ROOT=1`.

#![expect(
    clippy::unwrap_used,
    reason = "test harness helpers outside #[test] fns: a failure must fail the test loudly"
)]

mod audit;
mod fixture;
mod git;
mod network;
mod operator;
mod output;
mod proxy;
