//! bottle-core integration tests: the manifest catalogue, manifest loading, the device policy, the
//! documented agent environment.

mod agent_env;
mod catalogue;
mod devices;
mod manifest;
