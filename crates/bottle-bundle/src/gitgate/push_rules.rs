//! Per-repository push rules: which refs the agent may update, and how.
//!
//! The same checks run twice: in the gate, on the command list parsed from
//! the start of the receive-pack request (so a refused push is answered
//! before any object lands), and again in the `pre-receive` hook, which
//! adds the fast-forward check once the pushed objects are present.
//!
//! [`RuntimePushRules`] holds the refs the operator approved through
//! supervise while the bundle runs; the gate merges them into a
//! repository's rules ([`merged_repo`]) for every push, so the gate's check
//! and the hook's (which reads the rules the gate hands it) agree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError, RwLock};

use bottle_core::bundle::BundleGitRepo;
use bottle_core::manifest::GitMode;
use bottle_core::manifest::push_glob::{self, push_glob_problem};
use serde::{Deserialize, Serialize};

use crate::BundleError;

/// One ref update from a push: `old new refname`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefUpdate {
    /// The value the client believes the ref has (all zeros: absent).
    pub old: String,
    /// The value it wants (all zeros: delete).
    pub new: String,
    /// The full ref name (`refs/heads/...`).
    pub refname: String,
}

impl RefUpdate {
    /// Parses `old SP new SP refname`.
    pub fn parse(line: &str) -> Option<Self> {
        let mut parts = line.splitn(3, ' ');
        let old = parts.next()?;
        let new = parts.next()?;
        let refname = parts.next()?;
        let is_oid =
            |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_oid(old) || !is_oid(new) || refname.is_empty() {
            return None;
        }
        Some(Self {
            old: old.to_ascii_lowercase(),
            new: new.to_ascii_lowercase(),
            refname: refname.to_string(),
        })
    }

    /// The ref does not exist yet.
    pub fn is_create(&self) -> bool {
        is_zero(&self.old)
    }

    /// The push deletes the ref.
    pub fn is_delete(&self) -> bool {
        is_zero(&self.new)
    }
}

fn is_zero(oid: &str) -> bool {
    oid.bytes().all(|b| b == b'0')
}

/// Why a ref update was refused. The string forms are the audit reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// The repository is read-only.
    ReadOnly,
    /// No push glob matches the ref.
    RefNotAllowed,
    /// A tag, and no `refs/tags/...` glob matches it.
    TagNotAllowed,
    /// A deletion, and `allow_delete` is off.
    DeleteNotAllowed,
    /// Not a fast-forward, and `allow_force` is off.
    NonFastForward,
    /// The upstream refused or could not be reached.
    UpstreamPushFailed,
    /// Refused only because another ref in the same push was.
    OtherRefRefused,
    /// The request could not be understood.
    Malformed,
    /// A signed push (a push certificate): the gate does not verify
    /// certificates, so it takes none.
    SignedPush,
    /// Push options, which the gate does not offer.
    PushOptions,
}

impl RefusalKind {
    /// The audit reason (`ref_not_allowed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::RefNotAllowed => "ref_not_allowed",
            Self::TagNotAllowed => "tag_not_allowed",
            Self::DeleteNotAllowed => "delete_not_allowed",
            Self::NonFastForward => "non_fast_forward",
            Self::UpstreamPushFailed => "upstream_push_failed",
            Self::OtherRefRefused => "other_ref_refused",
            Self::Malformed => "malformed_request",
            Self::SignedPush => "signed_push",
            Self::PushOptions => "push_options",
        }
    }

    /// Parses [`RefusalKind::as_str`] back.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::ReadOnly,
            Self::RefNotAllowed,
            Self::TagNotAllowed,
            Self::DeleteNotAllowed,
            Self::NonFastForward,
            Self::UpstreamPushFailed,
            Self::OtherRefRefused,
            Self::Malformed,
            Self::SignedPush,
            Self::PushOptions,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// A refused ref update, with the message git shows the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What kind of refusal.
    pub kind: RefusalKind,
    /// The ref.
    pub refname: String,
    /// One line for the user: what was refused and what to do instead.
    pub message: String,
}

impl Refusal {
    /// The short reason for git's `[remote rejected] (...)` column.
    pub fn short(&self) -> String {
        format!("bottle: {}", self.kind.as_str().replace('_', " "))
    }
}

/// A repository's push rules, compiled.
#[derive(Debug, Clone)]
pub struct RepoPolicy {
    /// The repository's name.
    pub name: String,
    /// Read-only or read-write.
    pub mode: GitMode,
    /// The push globs as written.
    pub push: Vec<String>,
    patterns: Vec<glob::Pattern>,
    /// Non-fast-forward updates allowed.
    pub allow_force: bool,
    /// Deletions allowed.
    pub allow_delete: bool,
}

impl RepoPolicy {
    /// Compiles the rules of one configured repository.
    pub fn new(repo: &BundleGitRepo) -> Result<Self, BundleError> {
        let patterns = repo
            .push
            .iter()
            .map(|g| {
                let refuse = |problem: String| BundleError::GitRepo {
                    repo: repo.name.clone(),
                    detail: format!("push glob {g:?} {problem}"),
                };
                // The manifest's validation refuses the same globs, so a
                // checked manifest never stops its bundle here.
                if let Some(problem) = push_glob_problem(g) {
                    return Err(refuse(problem));
                }
                glob::Pattern::new(g).map_err(|e| refuse(format!("is not a valid glob: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name: repo.name.clone(),
            mode: repo.mode,
            push: repo.push.clone(),
            patterns,
            allow_force: repo.allow_force,
            allow_delete: repo.allow_delete,
        })
    }

    /// Whether the agent may push at all.
    pub fn writable(&self) -> bool {
        self.mode == GitMode::ReadWrite
    }

    /// The glob that lets the agent update `refname`, if any. Globs that
    /// start with `refs/` match full ref names and are the only way to
    /// reach tags or other namespaces; other globs match branch names.
    pub fn matching_glob(&self, refname: &str) -> Option<&str> {
        self.push
            .iter()
            .zip(&self.patterns)
            .find(|(glob, pattern)| push_glob::matches(glob, pattern, refname))
            .map(|(glob, _)| glob.as_str())
    }

    fn allowed_list(&self) -> String {
        if self.push.is_empty() {
            "none".into()
        } else {
            self.push.join(", ")
        }
    }

    /// The checks that need no objects: mode, globs, deletion. Returns the
    /// glob that allowed the update.
    pub fn check(&self, update: &RefUpdate) -> Result<String, Refusal> {
        let refname = &update.refname;
        let refuse = |kind, message: String| Refusal {
            kind,
            refname: refname.clone(),
            message,
        };
        if !self.writable() {
            return Err(refuse(
                RefusalKind::ReadOnly,
                format!(
                    "repository {} is read-only; fix: ask the operator to set mode = \"read-write\" and a push list in the manifest",
                    self.name
                ),
            ));
        }
        let Some(glob) = self.matching_glob(refname) else {
            if refname.starts_with("refs/tags/") {
                return Err(refuse(
                    RefusalKind::TagNotAllowed,
                    format!(
                        "pushing tag {refname} to {} is not allowed (push list: {}); fix: push a branch instead, or ask the operator to add a \"refs/tags/...\" glob",
                        self.name,
                        self.allowed_list()
                    ),
                ));
            }
            let example = self
                .push
                .iter()
                .find(|g| !g.starts_with("refs/"))
                .map(|g| format!(", e.g. {}", g.replace("**", "topic").replace('*', "topic")))
                .unwrap_or_default();
            return Err(refuse(
                RefusalKind::RefNotAllowed,
                format!(
                    "pushing to {refname} in {} is not allowed (push list: {}); fix: push to a branch that matches the list{example}",
                    self.name,
                    self.allowed_list()
                ),
            ));
        };
        if update.is_delete() && !self.allow_delete {
            return Err(refuse(
                RefusalKind::DeleteNotAllowed,
                format!(
                    "deleting {refname} in {} is not allowed; fix: leave the ref in place (the operator can set allow_delete = true)",
                    self.name
                ),
            ));
        }
        Ok(glob.to_string())
    }

    /// The refusal for an update that is not a fast-forward.
    pub fn non_fast_forward(&self, update: &RefUpdate) -> Refusal {
        Refusal {
            kind: RefusalKind::NonFastForward,
            refname: update.refname.clone(),
            message: format!(
                "{} in {} is not a fast-forward and force pushes are not allowed; fix: fetch, rebase or merge onto the remote {}, and push again",
                update.refname, self.name, update.refname
            ),
        }
    }
}

/// Turns a ref as the agent names it into a full ref name, read the way
/// push globs are: a name starting with `refs/` is a full ref name, any
/// other name is a branch (`main` is `refs/heads/main`). Refuses what git
/// would not accept as a ref name (`git check-ref-format`), glob
/// characters included, so the result can only ever name one ref.
pub fn normalize_push_ref(raw: &str) -> Result<String, String> {
    let full = if raw.starts_with("refs/") {
        raw.to_string()
    } else {
        format!("refs/heads/{raw}")
    };
    let bad_char = full
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(*c));
    let problem = if raw.is_empty() || raw == "HEAD" || raw == "@" {
        Some("it names no branch".to_string())
    } else if full.len() > 400 {
        Some("it is longer than 400 bytes".into())
    } else if let Some(c) = bad_char {
        Some(format!("it contains {c:?}"))
    } else if full.contains("..") || full.contains("@{") || full.contains("//") {
        Some("it contains \"..\", \"@{\" or \"//\"".into())
    } else if full.ends_with('/') || full.ends_with('.') || full.ends_with(".lock") {
        Some("it ends with \"/\", \".\" or \".lock\"".into())
    } else if full
        .split('/')
        .any(|c| c.starts_with('.') || c.ends_with(".lock"))
    {
        Some("a part starts with \".\" or ends with \".lock\"".into())
    } else if full.split('/').count() < 3 {
        Some("a full ref name has the form refs/<namespace>/<name>".into())
    } else {
        None
    };
    match problem {
        Some(p) => Err(format!(
            "{raw:?} is not a ref git can push ({p}); fix: name a branch like fix-1 or a full ref like refs/heads/fix-1"
        )),
        None => Ok(full),
    }
}

/// Refs the operator approved for pushing while the bundle runs (supervise
/// `request_push`), per repository. Cheap to clone; every clone is the
/// same set, so git-gate sees an approval the moment supervise records it.
/// Only exact ref names are held: an approval never widens to a glob, and
/// never implies force or delete (those stay the manifest's).
#[derive(Debug, Clone, Default)]
pub struct RuntimePushRules {
    refs: Arc<RwLock<BTreeMap<String, BTreeSet<String>>>>,
}

impl RuntimePushRules {
    /// Makes the full ref name `refname` pushable in `repo`; returns
    /// whether it was new. The caller checks that the repository is served
    /// and read-write, and normalises the ref ([`normalize_push_ref`]).
    pub fn allow(&self, repo: &str, refname: &str) -> bool {
        self.refs
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(repo.to_string())
            .or_default()
            .insert(refname.to_string())
    }

    /// The refs approved for `repo`, sorted.
    pub fn refs(&self, repo: &str) -> Vec<String> {
        self.refs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(repo)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// `config` with the refs `runtime` approved for it appended to its push
/// list, each as a glob that matches only that full ref name. A read-only
/// repository is returned as it is: approvals never make it writable.
pub fn merged_repo(config: &BundleGitRepo, runtime: &RuntimePushRules) -> BundleGitRepo {
    let mut merged = config.clone();
    if config.mode != GitMode::ReadWrite {
        return merged;
    }
    for refname in runtime.refs(&config.name) {
        let glob = glob::Pattern::escape(&refname);
        if !merged.push.contains(&glob) {
            merged.push.push(glob);
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(push: &[&str], force: bool, delete: bool) -> RepoPolicy {
        RepoPolicy::new(&BundleGitRepo {
            name: "demo".into(),
            path_in_bundle: "/x".into(),
            upstream: None,
            mode: GitMode::ReadWrite,
            push: push.iter().map(|s| (*s).to_string()).collect(),
            allow_force: force,
            allow_delete: delete,
            credential_file: None,
        })
        .unwrap()
    }

    fn upd(old: char, new: char, refname: &str) -> RefUpdate {
        RefUpdate {
            old: old.to_string().repeat(40),
            new: new.to_string().repeat(40),
            refname: refname.into(),
        }
    }

    #[test]
    fn branch_globs_match_branch_names_one_level() {
        let p = policy(&["agent/*", "fix-?"], false, false);
        assert_eq!(p.matching_glob("refs/heads/agent/x"), Some("agent/*"));
        assert_eq!(p.matching_glob("refs/heads/fix-1"), Some("fix-?"));
        assert_eq!(p.matching_glob("refs/heads/agent/x/y"), None);
        assert_eq!(p.matching_glob("refs/heads/main"), None);
        // A branch glob never reaches another namespace.
        assert_eq!(p.matching_glob("refs/tags/agent/x"), None);
        assert_eq!(p.matching_glob("refs/notes/agent/x"), None);
        assert_eq!(p.matching_glob("agent/x"), None);
    }

    #[test]
    fn deep_globs_and_full_ref_globs() {
        let p = policy(&["agent/**", "refs/notes/*"], false, false);
        assert_eq!(p.matching_glob("refs/heads/agent/a/b"), Some("agent/**"));
        assert_eq!(p.matching_glob("refs/notes/commits"), Some("refs/notes/*"));
    }

    #[test]
    fn tags_need_an_explicit_tags_glob() {
        let broad = policy(&["refs/*", "refs/**"], false, false);
        assert_eq!(broad.matching_glob("refs/tags/v1"), None);
        // `*` stays within one level: `refs/*` does not reach
        // `refs/heads/x`, `refs/**` does.
        assert_eq!(broad.matching_glob("refs/heads/x"), Some("refs/**"));
        let tags = policy(&["refs/tags/v*"], false, false);
        assert_eq!(tags.matching_glob("refs/tags/v1"), Some("refs/tags/v*"));
        let err = policy(&["agent/*"], false, false)
            .check(&upd('0', 'a', "refs/tags/v1"))
            .unwrap_err();
        assert_eq!(err.kind, RefusalKind::TagNotAllowed);
        assert!(err.message.contains("refs/tags/"), "{}", err.message);
    }

    #[test]
    fn globs_the_manifest_refuses_are_refused_at_start() {
        for glob in ["agent/[x", "agent/ x", ""] {
            let err = RepoPolicy::new(&BundleGitRepo {
                name: "demo".into(),
                path_in_bundle: "/x".into(),
                upstream: None,
                mode: GitMode::ReadWrite,
                push: vec![glob.into()],
                allow_force: false,
                allow_delete: false,
                credential_file: None,
            })
            .unwrap_err();
            let problem = push_glob_problem(glob).unwrap();
            assert!(err.to_string().contains(&problem), "{glob:?}: {err}");
        }
    }

    #[test]
    fn check_refuses_with_a_fix() {
        let p = policy(&["agent/*"], false, false);
        assert_eq!(
            p.check(&upd('0', 'a', "refs/heads/agent/x")).unwrap(),
            "agent/*"
        );
        let err = p.check(&upd('a', 'b', "refs/heads/main")).unwrap_err();
        assert_eq!(err.kind, RefusalKind::RefNotAllowed);
        assert!(err.message.contains("e.g. agent/topic"), "{}", err.message);
        let err = p.check(&upd('a', '0', "refs/heads/agent/x")).unwrap_err();
        assert_eq!(err.kind, RefusalKind::DeleteNotAllowed);
        let deleting = policy(&["agent/*"], false, true);
        assert!(deleting.check(&upd('a', '0', "refs/heads/agent/x")).is_ok());
        // Deleting a ref outside the list is refused for the list, not the
        // deletion.
        let err = deleting
            .check(&upd('a', '0', "refs/heads/main"))
            .unwrap_err();
        assert_eq!(err.kind, RefusalKind::RefNotAllowed);
    }

    #[test]
    fn read_only_refuses_everything() {
        let mut p = policy(&["agent/*"], true, true);
        p.mode = GitMode::ReadOnly;
        let err = p.check(&upd('0', 'a', "refs/heads/agent/x")).unwrap_err();
        assert_eq!(err.kind, RefusalKind::ReadOnly);
    }

    #[test]
    fn bad_glob_is_a_config_error() {
        let err = RepoPolicy::new(&BundleGitRepo {
            name: "demo".into(),
            path_in_bundle: "/x".into(),
            upstream: None,
            mode: GitMode::ReadWrite,
            push: vec!["agent/[".into()],
            allow_force: false,
            allow_delete: false,
            credential_file: None,
        })
        .unwrap_err();
        assert!(err.to_string().contains("agent/["), "{err}");
    }

    #[test]
    fn parses_updates() {
        let u = RefUpdate::parse(&format!(
            "{} {} refs/heads/x",
            "0".repeat(40),
            "A".repeat(40)
        ))
        .unwrap();
        assert!(u.is_create());
        assert!(!u.is_delete());
        assert_eq!(u.new, "a".repeat(40));
        assert!(RefUpdate::parse("zz aa refs/heads/x").is_none());
        assert!(RefUpdate::parse(&format!("{} {}", "0".repeat(40), "1".repeat(40))).is_none());
        for k in [
            "read_only",
            "non_fast_forward",
            "upstream_push_failed",
            "signed_push",
            "push_options",
        ] {
            assert_eq!(RefusalKind::parse(k).unwrap().as_str(), k);
        }
    }

    #[test]
    fn push_refs_normalise_like_push_globs() {
        assert_eq!(normalize_push_ref("main").unwrap(), "refs/heads/main");
        assert_eq!(normalize_push_ref("agent/x").unwrap(), "refs/heads/agent/x");
        assert_eq!(
            normalize_push_ref("refs/heads/main").unwrap(),
            "refs/heads/main"
        );
        assert_eq!(normalize_push_ref("refs/tags/v1").unwrap(), "refs/tags/v1");
        for bad in [
            "",
            "HEAD",
            "agent/*",
            "fix-?",
            "a[b]",
            "a b",
            "a..b",
            "a/",
            "a.lock",
            ".hidden",
            "a//b",
            "x@{1}",
            "refs/heads",
            "refs/",
            "a\\b",
            "a~1",
        ] {
            let err = normalize_push_ref(bad).unwrap_err();
            assert!(err.contains("fix:"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn runtime_refs_merge_as_exact_refs_and_never_into_read_only() {
        let repo = BundleGitRepo {
            name: "demo".into(),
            path_in_bundle: "/x".into(),
            upstream: None,
            mode: GitMode::ReadWrite,
            push: vec!["agent/*".into()],
            allow_force: false,
            allow_delete: false,
            credential_file: None,
        };
        let runtime = RuntimePushRules::default();
        assert_eq!(merged_repo(&repo, &runtime).push, ["agent/*"]);
        assert!(runtime.allow("demo", "refs/heads/main"));
        assert!(!runtime.allow("demo", "refs/heads/main"));
        assert!(runtime.allow("demo", "refs/heads/odd]name"));
        assert!(runtime.allow("other", "refs/heads/release"));
        let merged = merged_repo(&repo, &runtime);
        let p = RepoPolicy::new(&merged).unwrap();
        assert_eq!(p.matching_glob("refs/heads/main"), Some("refs/heads/main"));
        assert!(p.matching_glob("refs/heads/odd]name").is_some());
        assert_eq!(p.matching_glob("refs/heads/mainx"), None);
        assert_eq!(p.matching_glob("refs/heads/release"), None);
        // Approval of the ref is not approval of a deletion or a force.
        let err = p.check(&upd('a', '0', "refs/heads/main")).unwrap_err();
        assert_eq!(err.kind, RefusalKind::DeleteNotAllowed);
        assert!(!p.allow_force);

        let mut read_only = repo.clone();
        read_only.mode = GitMode::ReadOnly;
        assert_eq!(merged_repo(&read_only, &runtime).push, ["agent/*"]);
    }
}
