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

#[cfg(test)]
mod tests {
    use super::*;

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
