//! Each agent's git repository, on the host: a bare repository the run
//! seeds with real git (`base`, and `main` one commit past it), which the
//! agent's git-gate serves as `probe.git`; after a bottle's git probes the
//! harness reads its refs back with real git.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;

use super::{GIT_PROBES, Gate};
use crate::escape::evidence;
use crate::escape::fixture;
use crate::escape::sys::{Run, Sys, checked};

/// `git --git-dir=<repo> args...`, free of the host's git configuration.
fn git(sys: &dyn Sys, repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec![format!("--git-dir={}", repo.display())];
    all.extend(args.iter().map(|a| a.to_string()));
    let run = Run::new("git", &all)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bottle escape gate")
        .env("GIT_AUTHOR_EMAIL", "gate@bottle.invalid")
        .env("GIT_COMMITTER_NAME", "bottle escape gate")
        .env("GIT_COMMITTER_EMAIL", "gate@bottle.invalid");
    Ok(checked(sys.output(&run)?, &run)?.trim().to_string())
}

/// Creates the bare repository `repo` with `refs/heads/base` and
/// `refs/heads/main` (a child of base; both of the empty tree) and returns
/// main's object id.
pub(super) fn seed(sys: &dyn Sys, repo: &Path) -> anyhow::Result<String> {
    let path = repo.display().to_string();
    let run = Run::new(
        "git",
        &["init", "-q", "--bare", "-b", "main", path.as_str()],
    )
    .env("GIT_CONFIG_NOSYSTEM", "1")
    .env("GIT_CONFIG_GLOBAL", "/dev/null");
    checked(sys.output(&run)?, &run)?;
    let tree = git(sys, repo, &["hash-object", "-w", "-t", "tree", "/dev/null"])?;
    let base = git(sys, repo, &["commit-tree", &tree, "-m", "base"])?;
    let main = git(
        sys,
        repo,
        &["commit-tree", &tree, "-p", &base, "-m", "main"],
    )?;
    git(sys, repo, &["update-ref", "refs/heads/base", &base])?;
    git(sys, repo, &["update-ref", "refs/heads/main", &main])?;
    Ok(main)
}

/// Every ref of `repo` and its object id.
pub(super) fn refs(sys: &dyn Sys, repo: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text = git(
        sys,
        repo,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    )?;
    Ok(evidence::parse_refs(&text))
}

impl Gate {
    /// The host's evidence of a bottle's git probes: its repository's refs
    /// as rows, and the control of the in-bottle signed-push rows (the
    /// plain push landed).
    pub(super) fn git_evidence(&mut self, phase: &str, key: &str) -> anyhow::Result<()> {
        let seeded = self
            .git_seeds
            .get(key)
            .with_context(|| format!("no git repository was seeded for {key}"))?
            .clone();
        let repo = fixture::git_repo_path(&self.work.join("git"), key);
        let refs = refs(self.sys.as_ref(), &repo)?;
        let (rows, control) = evidence::git_rows(phase, &refs, &seeded, &self.token);
        self.report.rows.extend(rows);
        for probe in GIT_PROBES {
            self.extra_controls.insert(probe.to_string(), control);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::sys::RealSys;

    #[test]
    fn a_seeded_repository_has_main_one_past_base() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("escape-a.git");
        let main = seed(&RealSys, &repo).unwrap();
        let refs = refs(&RealSys, &repo).unwrap();
        assert_eq!(refs.len(), 2, "{refs:?}");
        assert_eq!(refs["refs/heads/main"], main);
        let parent = git(&RealSys, &repo, &["rev-parse", "main^"]).unwrap();
        assert_eq!(refs["refs/heads/base"], parent);
        assert_ne!(parent, main);
    }
}
