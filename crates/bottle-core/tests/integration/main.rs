//! bottle-core integration tests: the manifest catalogue, manifest loading, the device policy.

mod catalogue;
mod devices;
mod manifest;
