//! What a git repository's `push` entry may be. One definition for the
//! manifest's validation and for git-gate, which compiles the globs when
//! the bundle starts: a glob `bottle check` accepts is one the gate
//! accepts.
//!
//! How the gate reads a glob (`gitgate/push_rules.rs`): one starting with
//! `refs/` matches full ref names and is the only way to reach tags
//! (`refs/tags/agent-*`) or other namespaces; any other glob matches
//! branch names (`agent/*` is `refs/heads/agent/*`). `*` stays within one
//! `/`-separated level, `**` crosses levels.

/// Why `glob` cannot be a push glob, as a fragment that reads after the
/// glob (`"agent/[x" is not a valid glob: ...`), or `None` when it can.
pub fn push_glob_problem(glob: &str) -> Option<String> {
    if glob.trim().is_empty() {
        return Some("is empty".into());
    }
    // Characters `git check-ref-format` refuses in every ref name: a glob
    // holding one could never match a ref.
    if let Some(c) = glob
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || "~^:\\".contains(*c))
    {
        return Some(format!("contains {c:?}, which no ref name can hold"));
    }
    glob::Pattern::new(glob)
        .err()
        .map(|err| format!("is not a valid glob: {err}"))
}

/// How push globs match: case-sensitive, and `*` never crosses a `/`.
pub const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Whether the push glob `glob`, compiled as `pattern`, lets the agent
/// update the full ref name `refname`: a glob starting with `refs/`
/// matches full ref names, and reaches a tag only when it starts with
/// `refs/tags/`; any other glob matches branch names.
pub fn matches(glob: &str, pattern: &glob::Pattern, refname: &str) -> bool {
    if glob.starts_with("refs/") {
        let is_tag = refname.starts_with("refs/tags/");
        (!is_tag || glob.starts_with("refs/tags/")) && pattern.matches_with(refname, MATCH)
    } else {
        refname
            .strip_prefix("refs/heads/")
            .is_some_and(|branch| pattern.matches_with(branch, MATCH))
    }
}

/// A repository's push globs, compiled.
#[derive(Debug, Clone, Default)]
pub struct PushGlobs {
    globs: Vec<(String, glob::Pattern)>,
}

impl PushGlobs {
    /// Compiles `globs`; the first that is not a push glob is the error,
    /// with why ([`push_glob_problem`]).
    pub fn new(globs: &[String]) -> Result<PushGlobs, String> {
        let globs = globs
            .iter()
            .map(|glob| match push_glob_problem(glob) {
                Some(problem) => Err(format!("push glob {glob:?} {problem}")),
                None => glob::Pattern::new(glob)
                    .map(|pattern| (glob.clone(), pattern))
                    .map_err(|err| format!("push glob {glob:?} is not a valid glob: {err}")),
            })
            .collect::<Result<_, _>>()?;
        Ok(PushGlobs { globs })
    }

    /// The glob that lets the agent update `refname`, if any ([`matches()`]).
    pub fn matching(&self, refname: &str) -> Option<&str> {
        self.globs
            .iter()
            .find(|(glob, pattern)| matches(glob, pattern, refname))
            .map(|(glob, _)| glob.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_globs_match_branches_and_only_tag_globs_match_tags() {
        let globs = PushGlobs::new(&[
            "agent/*".to_string(),
            "refs/**".to_string(),
            "refs/tags/agent-*".to_string(),
        ])
        .unwrap();
        assert_eq!(globs.matching("refs/heads/agent/x"), Some("agent/*"));
        assert_eq!(globs.matching("refs/heads/agent/x/y"), Some("refs/**"));
        assert_eq!(
            globs.matching("refs/tags/agent-1"),
            Some("refs/tags/agent-*")
        );
        assert_eq!(globs.matching("refs/tags/v1"), None);
        let branches = PushGlobs::new(&["agent/*".to_string()]).unwrap();
        assert_eq!(branches.matching("refs/heads/main"), None);
        assert_eq!(branches.matching("refs/heads/agent/x/y"), None);
        assert_eq!(branches.matching("refs/tags/agent/x"), None);
        assert!(PushGlobs::new(&["agent/[x".to_string()]).is_err());
    }

    #[test]
    fn branch_tag_and_full_ref_globs_are_push_globs() {
        for glob in [
            "agent/*",
            "agent/**",
            "fix-?",
            "refs/tags/agent-*",
            "refs/notes/*",
            "agent/[a-z]*",
        ] {
            assert_eq!(push_glob_problem(glob), None, "{glob}");
        }
    }

    #[test]
    fn empty_unmatchable_and_malformed_globs_are_refused() {
        let cases = [
            ("", "is empty"),
            ("  ", "is empty"),
            ("agent/ x", "contains ' '"),
            ("agent/x:main", "contains ':'"),
            ("agent/x~1", "contains '~'"),
            ("agent/[x", "is not a valid glob"),
        ];
        for (glob, expected) in cases {
            let problem = push_glob_problem(glob).unwrap_or_default();
            assert!(problem.starts_with(expected), "{glob:?}: {problem:?}");
        }
    }
}
