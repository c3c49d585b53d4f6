//! `bottle-bundle` is the per-bottle sidecar bundle: the agent-facing proxy,
//! the loopback-only egress daemon and the audit log.
