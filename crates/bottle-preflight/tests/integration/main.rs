//! Integration tests for bottle-preflight: every branch of every check
//! against a temp-dir host root, fake and real command runners, and a real
//! unix-socket fake Docker daemon; plus one run against this machine's `/`.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail loudly on unexpected errors"
)]

mod bundle;
mod kernel;
mod kvm;
mod platform;
mod privilege;
mod real_host;
mod smolvm;
mod support;
mod toolbox;
