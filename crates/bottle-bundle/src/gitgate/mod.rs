//! git-gate: the agent's only route to git remotes.
//!
//! The gate speaks git's smart HTTP protocol on `0.0.0.0:9418`
//! (`GIT_GATE_URL=http://<bundle-ip>:9418`); each repository the manifest
//! lists appears as `<GIT_GATE_URL>/<name>.git`:
//!
//! - `GET /<name>.git/info/refs?service=git-upload-pack|git-receive-pack`
//! - `POST /<name>.git/git-upload-pack`, `POST /<name>.git/git-receive-pack`
//!   (request bodies may be gzip-encoded)
//!
//! Anything else is a 404 whose text git shows to the agent. Each request
//! runs `git upload-pack` / `git receive-pack --stateless-rpc` on the
//! repository with the bodies streamed through (memory per request stays
//! bounded; sizes are capped by [`GateLimits`]).
//!
//! A repository is either a host-side bare repository bind-mounted into
//! the bundle (served as is) or a mirror of a remote, refreshed from the
//! upstream before it is advertised, with the remote's credential added as
//! an HTTP header by the gate's own git processes: the agent never holds
//! it (see [`upstream`]).
//!
//! Pushes are checked twice. The gate reads the request's whole framing
//! before receive-pack runs ([`push_request`]: shallow lines, the command
//! list, a push certificate and the commands in and after it, push options,
//! the start of the packfile), refuses what is outside git's grammar as
//! `malformed_request`, refuses signed pushes (`signed_push`: the gate does
//! not verify certificates) and push options (`push_options`: not offered),
//! and refuses the whole push (answering in
//! git's report-status format, so git prints `[remote rejected]` and our
//! reasons) when a ref is outside the push globs, is a tag without an
//! explicit `refs/tags/` glob, or is a deletion without `allow_delete`; a
//! read-only repository refuses receive-pack outright (403). What passes
//! goes to receive-pack with our `pre-receive` hook ([`hook`]), which
//! repeats those checks, refuses non-fast-forward updates unless
//! `allow_force`, and in mirror mode pushes the updates on to the upstream
//! before the mirror's refs move. A refused push leaves the repository
//! (and the upstream) unchanged. The push globs are the manifest's plus
//! the exact refs the operator approved through supervise while the bundle
//! runs ([`push_rules::RuntimePushRules`]); approvals never reach a read-only
//! repository and never allow a force push or a deletion.
//!
//! Audit: one line per request that reaches a repository (daemon
//! `git-gate`), in the bundle's audit log. The proxy-shaped record is
//! filled as: `host` = repository name, `port` = the gate's port,
//! `method` = `advertise` (info/refs), `fetch` / `ls-refs` (upload-pack)
//! or `push`, `path` = the request path, `rule` = the refs a push updates
//! (space-separated), `reason` = `allowed` or the refusal
//! (`ref_not_allowed`, `non_fast_forward`, ... then `: <ref>`).

pub mod command;
pub mod hook;
pub mod pktline;
pub mod push_request;
pub mod push_rules;
pub mod upstream;

mod server;

/// Git's runtime files: the host copies them into the bundle image, the
/// gate runs git from [`BUNDLE_GIT`] there; one definition for both sides.
pub use bottle_bundle_files::git_runtime as runtime;
pub use runtime::BUNDLE_GIT;
pub use server::{GateLimits, GitGate, GitRuntime, daemon};
