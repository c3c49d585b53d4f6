//! The manifest's host-side path fields, listed once.
//!
//! [`host_paths`] is the one list of fields that name a file or directory
//! on the host. Validation checks through it that the paths exist, and
//! loading rewrites each one to an absolute path (`~/` against the home
//! directory, anything relative against the manifest's directory), so no
//! later stage — a Docker bind source, a smolvm pack, the bundle's
//! config — ever sees a path relative to whatever directory `bottle` ran
//! in. A new path field is one more entry here.

use std::path::{Path, PathBuf};

use super::codes;
use super::model::{Agent, CredentialSource, Manifest};
use super::resolve_path;
use super::span::FieldPath;

/// What must be at a host path for the manifest to be usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A directory that is a git repository: a working checkout or a bare
    /// one ([`crate::checkout::RepoKind::of_path`]).
    GitRepository,
    /// Not checked at load: a secret the bundle reads (and reports) at
    /// launch.
    Unchecked,
}

/// One host path field of one agent.
pub(crate) struct HostPath<'a> {
    /// Where it is, e.g. `agents.claude.git[0].url`.
    pub(crate) field: FieldPath,
    /// The path as written (or, after loading, absolute).
    pub(crate) value: &'a mut String,
    /// What must be there.
    pub(crate) expect: Expect,
    /// How messages name it, e.g. `prompt file`.
    pub(crate) noun: &'static str,
    /// The code of a missing or wrong-kind path.
    pub(crate) code: &'static str,
    /// How to fix a missing or wrong-kind path.
    pub(crate) fix: &'static str,
}

/// The fix for most missing paths.
const CREATE_OR_FIX: &str = "create it, or fix the path (relative to the manifest's directory)";

/// Every host path field of `agent`, whose table is at `agent_path`.
///
/// `build.dockerfile` is not here: it is relative to the build context,
/// which is.
pub(crate) fn host_paths<'a>(agent_path: &FieldPath, agent: &'a mut Agent) -> Vec<HostPath<'a>> {
    let Agent {
        build,
        prompt,
        skills,
        git,
        credentials,
        egress,
        ..
    } = agent;
    let mut paths = Vec::new();
    let mut push = |field: FieldPath, value, expect, noun, (code, fix)| {
        paths.push(HostPath {
            field,
            value,
            expect,
            noun,
            code,
            fix,
        });
    };
    if let Some(build) = build {
        push(
            agent_path.key("build").key("context"),
            &mut build.context,
            Expect::Dir,
            "build context",
            (
                codes::BUILD_CONTEXT,
                "point context at the directory holding the Dockerfile \
                 (relative to the manifest's directory)",
            ),
        );
    }
    if let Some(prompt) = prompt {
        push(
            agent_path.key("prompt"),
            prompt,
            Expect::File,
            "prompt file",
            (codes::PROMPT_FILE, CREATE_OR_FIX),
        );
    }
    for (i, dir) in skills.iter_mut().enumerate() {
        push(
            agent_path.key("skills").index(i),
            dir,
            Expect::Dir,
            "skills directory",
            (codes::SKILLS_DIR, CREATE_OR_FIX),
        );
    }
    for (i, repo) in git.iter_mut().enumerate() {
        let item = agent_path.key("git").index(i);
        if !is_remote_git_url(&repo.url) {
            push(
                item.key("url"),
                &mut repo.url,
                Expect::GitRepository,
                "git repository",
                (
                    codes::GIT_PATH,
                    "point url at an existing working checkout or bare repository \
                     (relative to the manifest's directory)",
                ),
            );
        }
        if let Some(credential) = &mut repo.credential {
            push(
                item.key("credential"),
                credential,
                Expect::Unchecked,
                "git credential file",
                (codes::GIT_PATH, CREATE_OR_FIX),
            );
        }
    }
    for (i, credential) in credentials.iter_mut().enumerate() {
        if let CredentialSource::File(file) = &mut credential.source {
            push(
                agent_path
                    .key("credentials")
                    .index(i)
                    .key("source")
                    .key("file"),
                file,
                Expect::Unchecked,
                "credential file",
                (codes::CREDENTIAL_FILE, CREATE_OR_FIX),
            );
        }
    }
    for (i, file) in egress.upstream_ca.iter_mut().enumerate() {
        // Checked (exists, holds PEM certificates) by validation itself.
        push(
            agent_path.key("egress").key("upstream_ca").index(i),
            file,
            Expect::Unchecked,
            "upstream CA file",
            (codes::UPSTREAM_CA_FILE, CREATE_OR_FIX),
        );
    }
    paths
}

/// A git remote (`scheme://...` other than `file://`, or scp-like
/// `user@host:path`) rather than a path on the host.
pub fn is_remote_git_url(url: &str) -> bool {
    if url.contains("://") {
        return !url.starts_with("file://");
    }
    match url.split_once(':') {
        Some((before, _)) => !before.contains('/') && before.contains('@'),
        None => false,
    }
}

/// Rewrites every host path of `manifest` to an absolute path: `~/` against
/// `home`, relative against `base_dir` (itself absolute). A `~/` path with
/// no home directory, a `file://` URL and an empty path stay as written
/// (validation has reported the empty ones).
pub(crate) fn make_absolute(manifest: &mut Manifest, base_dir: &Path, home: Option<&Path>) {
    for agent in manifest.agents.values_mut() {
        for path in host_paths(&FieldPath::root(), agent) {
            if path.value.is_empty() || path.value.starts_with("file://") {
                continue;
            }
            // A base directory that is not UTF-8 cannot be written into the
            // manifest's strings; such paths stay as written.
            if let Some(absolute) = resolve_path(base_dir, path.value, home)
                && let Some(text) = absolute.to_str()
            {
                *path.value = text.to_string();
            }
        }
    }
}

/// The manifest directory `path`, absolute and without `..`: canonical when
/// it exists, else joined to the current directory, else as written.
pub(crate) fn absolute_dir(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_and_local_git_urls() {
        for remote in [
            "https://example.com/a.git",
            "ssh://git@example.com/a.git",
            "git@example.com:org/a.git",
        ] {
            assert!(is_remote_git_url(remote), "{remote}");
        }
        for local in [
            "git/app.git",
            "/srv/git/app.git",
            "~/git/app.git",
            "file:///srv/a.git",
            "dir/with@sign:x",
            "./a:b",
        ] {
            assert!(!is_remote_git_url(local), "{local}");
        }
    }
}
