//! bottle-core integration tests: the manifest catalogue, manifest loading, the device policy, the
//! documented agent environment, working checkouts behind git-gate with
//! real git.

mod agent_env;
mod catalogue;
mod checkout;
mod devices;
mod manifest;
