//! The `pre-receive` hook the gate installs for every push it lets through
//! to `git receive-pack`.
//!
//! The hook file is a two-line script whose shebang runs this binary
//! (`#!/bottle-bundle git-hook`), so the bundle image needs no shell. It
//! runs after the pushed objects arrived (in git's quarantine) and before
//! any ref moves; a non-zero exit makes git refuse every update of the
//! push and show our stderr to the agent as `remote: ...`. It
//!
//! 1. re-checks each update against the repository's rules (the gate
//!    already did; this is defence in depth),
//! 2. refuses non-fast-forward updates unless `allow_force` (with
//!    `git merge-base --is-ancestor old new`),
//! 3. in mirror mode, pushes the updates on to the upstream first, each
//!    leased on the value the agent saw; if the upstream refuses, so does
//!    the hook, and the mirror stays as it was.
//!
//! Its verdict goes to the result file the gate named, for the audit line.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bottle_core::bundle::BundleGitRepo;
use serde::{Deserialize, Serialize};

use super::command::{self, HOOK_ENV};
use super::push_rules::{RefUpdate, Refusal, RefusalKind, RepoPolicy};
use super::upstream::read_auth_header;

/// What the gate tells the hook (JSON in [`HOOK_ENV`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookSpec {
    /// The repository and its rules.
    pub repo: BundleGitRepo,
    /// The git binary.
    pub git: PathBuf,
    /// Where to write the [`HookResult`].
    pub result_file: PathBuf,
}

/// One refused update, as the hook reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookRefusal {
    /// The ref.
    pub refname: String,
    /// Why.
    pub kind: RefusalKind,
    /// The message shown to the agent.
    pub message: String,
}

/// The hook's verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookResult {
    /// Refused updates (empty: all accepted).
    pub refused: Vec<HookRefusal>,
    /// The updates were pushed on to the upstream.
    pub forwarded: bool,
}

impl HookResult {
    fn refuse(&mut self, r: Refusal) {
        self.refused.push(HookRefusal {
            refname: r.refname,
            kind: r.kind,
            message: r.message,
        });
    }
}

/// Decides a push. `updates` is the hook's stdin (`old new ref` lines).
pub fn decide(spec: &HookSpec, updates: &str, err: &mut dyn Write) -> HookResult {
    let mut result = HookResult::default();
    let policy = match RepoPolicy::new(&spec.repo) {
        Ok(p) => p,
        Err(e) => {
            result.refuse(Refusal {
                kind: RefusalKind::Malformed,
                refname: String::new(),
                message: format!("the gate's rules for {} are invalid: {e}", spec.repo.name),
            });
            return result;
        }
    };
    let mut parsed = Vec::new();
    for line in updates.lines().filter(|l| !l.trim().is_empty()) {
        match RefUpdate::parse(line.trim()) {
            Some(u) => parsed.push(u),
            None => result.refuse(Refusal {
                kind: RefusalKind::Malformed,
                refname: String::new(),
                message: format!("could not read the update {line:?}"),
            }),
        }
    }
    for u in &parsed {
        if let Err(r) = policy.check(u) {
            result.refuse(r);
            continue;
        }
        if policy.allow_force || u.is_create() || u.is_delete() {
            continue;
        }
        match command::is_ancestor(&spec.git, &u.old, &u.new).output_blocking() {
            Ok(out) if out.success() => {}
            Ok(out) if out.code == Some(1) => result.refuse(policy.non_fast_forward(u)),
            Ok(out) => {
                let mut r = policy.non_fast_forward(u);
                r.message = format!(
                    "{} in {}: could not check for a fast-forward ({}); force pushes are not allowed",
                    u.refname,
                    spec.repo.name,
                    out.stderr_text().trim()
                );
                result.refuse(r);
            }
            Err(e) => {
                let mut r = policy.non_fast_forward(u);
                r.message = format!("could not run git merge-base: {e}");
                result.refuse(r);
            }
        }
    }
    if result.refused.is_empty()
        && !parsed.is_empty()
        && let Some(url) = &spec.repo.upstream
    {
        match forward(spec, url, &parsed) {
            Ok(summary) => {
                result.forwarded = true;
                let _ = writeln!(err, "bottle git-gate: {summary}");
            }
            Err(message) => {
                for u in &parsed {
                    result.refused.push(HookRefusal {
                        refname: u.refname.clone(),
                        kind: RefusalKind::UpstreamPushFailed,
                        message: message.clone(),
                    });
                }
            }
        }
    }
    for r in &result.refused {
        let _ = writeln!(err, "bottle git-gate: {}", r.message);
    }
    result
}

fn forward(spec: &HookSpec, url: &str, updates: &[RefUpdate]) -> Result<String, String> {
    let name = &spec.repo.name;
    let auth = match &spec.repo.credential_file {
        Some(file) => Some(read_auth_header(Path::new(file)).map_err(|e| {
            format!(
                "could not read the upstream credential of {name}: {e}; nothing was pushed; fix: ask the operator to check the credential file"
            )
        })?),
        None => None,
    };
    let out = command::push_upstream(&spec.git, url, updates, auth.as_deref())
        .output_blocking()
        .map_err(|e| format!("could not run git push to the upstream of {name}: {e}"))?;
    if out.success() {
        let refs: Vec<&str> = updates.iter().map(|u| u.refname.as_str()).collect();
        return Ok(format!(
            "pushed {} to the upstream of {name}",
            refs.join(", ")
        ));
    }
    // Porcelain lines (`!\t<src>:<dst>\t[rejected] (reason)`) say why.
    let detail: Vec<String> = out
        .stdout_text()
        .lines()
        .filter(|l| l.starts_with('!'))
        .map(|l| l.split('\t').skip(1).collect::<Vec<_>>().join(" "))
        .collect();
    let stderr = out.stderr_text();
    let detail = if detail.is_empty() {
        stderr
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("no detail")
            .trim()
            .to_string()
    } else {
        detail.join("; ")
    };
    Err(format!(
        "the upstream of {name} refused the push ({detail}); nothing was changed; fix: fetch, rebase onto the upstream, and push again"
    ))
}

/// The hook's entry point (the binary's hidden `git-hook` subcommand).
/// Returns the exit code.
pub fn main() -> u8 {
    let mut stderr = std::io::stderr();
    let spec: HookSpec = match std::env::var(HOOK_ENV)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(
                stderr,
                "bottle git-gate: the pre-receive hook has no instructions ({e}); refusing the push"
            );
            return 1;
        }
    };
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        let _ = writeln!(
            stderr,
            "bottle git-gate: could not read the push's updates: {e}"
        );
        return 1;
    }
    let result = decide(&spec, &input, &mut stderr);
    let written = serde_json::to_vec(&result)
        .map_err(|e| e.to_string())
        .and_then(|json| std::fs::write(&spec.result_file, json).map_err(|e| e.to_string()));
    if let Err(e) = written {
        // The verdict still stands; only the audit detail is lost.
        let _ = writeln!(
            stderr,
            "bottle git-gate: could not record the verdict in {}: {e}",
            spec.result_file.display()
        );
    }
    u8::from(!result.refused.is_empty())
}

/// The hook script: a shebang running `program git-hook`.
pub fn script(program: &Path) -> String {
    format!(
        "#!{} git-hook\n# bottle git-gate pre-receive hook: see bottle-bundle's gitgate::hook\n",
        program.display()
    )
}
