//! Every git invocation the gate and its hook make, built in one place, and
//! the one function that turns an invocation into a process.
//!
//! The gate needs streaming stdin/stdout (a push can be gigabytes), which
//! `bottle_core::exec::CommandRunner` (run to completion, captured output)
//! does not offer; so the spawn lives here, in [`Invocation::command`].
//!
//! Children get a cleared environment: no system or user git config, no
//! credential helpers, no terminal prompts. Upstream credentials travel as
//! `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` variables,
//! never in argv (visible in `ps`) and never in a repository's config.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bottle_core::exec::CommandOutput;

use super::push_rules::{RefUpdate, RepoPolicy};

/// The environment variable carrying the hook's instructions (JSON).
pub const HOOK_ENV: &str = "BOTTLE_GIT_GATE_HOOK";

/// The protocols an upstream URL may use. `ext::` (runs a command) and
/// friends are never allowed; `file` is for tests and host-local remotes.
const UPSTREAM_PROTOCOLS: [&str; 3] = ["https", "http", "file"];

/// A program, its arguments and its environment.
#[derive(Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The program (an absolute path for git).
    pub program: PathBuf,
    /// Arguments, not including the program.
    pub args: Vec<OsString>,
    /// Variables set for the child.
    pub env: BTreeMap<OsString, OsString>,
    /// Start from the parent's environment (`true`) or an empty one.
    pub inherit_env: bool,
    /// Variables removed from the inherited environment.
    pub remove_env: Vec<OsString>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
}

impl std::fmt::Debug for Invocation {
    // The environment may hold a credential: show argv and names only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("argv", &self.argv())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("inherit_env", &self.inherit_env)
            .field("cwd", &self.cwd)
            .finish()
    }
}

impl Invocation {
    /// A program with no arguments, a cleared environment and no cwd.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            inherit_env: false,
            remove_env: Vec::new(),
            cwd: None,
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets a variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// The argv as lossy strings (for messages and tests).
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.as_os_str())
            .chain(self.args.iter().map(OsString::as_os_str))
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    /// The value of a variable this invocation sets.
    pub fn env_value(&self, key: &str) -> Option<&OsStr> {
        self.env.get(OsStr::new(key)).map(OsString::as_os_str)
    }

    /// The process builder. Stdio is left to the caller.
    pub fn command(&self) -> std::process::Command {
        #[expect(
            clippy::disallowed_methods,
            reason = "git-gate streams request and response bodies through git's stdin/stdout, which the run-to-completion CommandRunner cannot; this is the gate's one spawn point"
        )]
        let mut cmd = std::process::Command::new(&self.program);
        cmd.args(&self.args);
        if !self.inherit_env {
            cmd.env_clear();
        }
        for key in &self.remove_env {
            cmd.env_remove(key);
        }
        cmd.envs(&self.env);
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        cmd
    }

    /// Spawns with piped stdin, stdout and stderr; killed when dropped.
    pub fn spawn_piped(&self) -> io::Result<tokio::process::Child> {
        let mut cmd = tokio::process::Command::from(self.command());
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd.spawn()
    }

    /// Runs to completion (async), capturing output; stdin is empty.
    pub async fn output(&self) -> io::Result<CommandOutput> {
        let mut cmd = tokio::process::Command::from(self.command());
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        let out = cmd.output().await?;
        Ok(CommandOutput {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    /// Runs to completion (blocking), capturing output; for the hook,
    /// which is a short-lived process of its own.
    pub fn output_blocking(&self) -> io::Result<CommandOutput> {
        let mut cmd = self.command();
        cmd.stdin(Stdio::null());
        let out = cmd.output()?;
        Ok(CommandOutput {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}

/// Which smart-HTTP service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Fetch and clone.
    UploadPack,
    /// Push.
    ReceivePack,
}

impl Service {
    /// `git-upload-pack` / `git-receive-pack`.
    pub fn name(self) -> &'static str {
        match self {
            Self::UploadPack => "git-upload-pack",
            Self::ReceivePack => "git-receive-pack",
        }
    }

    /// Parses [`Service::name`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "git-upload-pack" => Some(Self::UploadPack),
            "git-receive-pack" => Some(Self::ReceivePack),
            _ => None,
        }
    }

    fn subcommand(self) -> &'static str {
        match self {
            Self::UploadPack => "upload-pack",
            Self::ReceivePack => "receive-pack",
        }
    }
}

/// What every gate-side git invocation shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Git {
    /// The git binary (`/usr/bin/git` in the bundle).
    pub program: PathBuf,
    /// `HOME` for children: the gate's work dir, which holds no config.
    pub home: PathBuf,
    /// The directory holding the gate's `pre-receive` hook.
    pub hooks_dir: PathBuf,
}

/// Adds `-c key=value` pairs.
fn config_args(pairs: &[(&str, String)]) -> Vec<OsString> {
    pairs
        .iter()
        .flat_map(|(k, v)| ["-c".into(), OsString::from(format!("{k}={v}"))])
        .collect()
}

/// Sets config through the environment (for secrets: not in argv).
fn secret_config(mut inv: Invocation, pairs: &[(&str, &str)]) -> Invocation {
    inv = inv.env("GIT_CONFIG_COUNT", pairs.len().to_string());
    for (i, (k, v)) in pairs.iter().enumerate() {
        inv = inv
            .env(format!("GIT_CONFIG_KEY_{i}"), *k)
            .env(format!("GIT_CONFIG_VALUE_{i}"), *v);
    }
    inv
}

/// Config for every invocation that talks to an upstream.
fn upstream_config() -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("protocol.allow", "never".to_string()),
        ("http.followRedirects", "false".to_string()),
        ("credential.helper", String::new()),
    ];
    for p in UPSTREAM_PROTOCOLS {
        pairs.push(match p {
            "https" => ("protocol.https.allow", "always".into()),
            "http" => ("protocol.http.allow", "always".into()),
            _ => ("protocol.file.allow", "always".into()),
        });
    }
    pairs
}

/// Whether an upstream URL uses a protocol the gate allows.
pub fn upstream_protocol_ok(url: &str) -> bool {
    UPSTREAM_PROTOCOLS
        .iter()
        .any(|p| url.starts_with(&format!("{p}://")))
}

impl Git {
    fn base(&self, repo: &Path) -> Invocation {
        Invocation::new(&self.program)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_COMMITTER_NAME", "bottle git-gate")
            .env("GIT_COMMITTER_EMAIL", "git-gate@bottle.invalid")
            .env("LC_ALL", "C")
            .args(config_args(&[
                ("safe.directory", repo.display().to_string()),
                ("core.hooksPath", self.hooks_dir.display().to_string()),
                ("gc.auto", "0".into()),
                ("maintenance.auto", "false".into()),
            ]))
    }

    /// `git upload-pack --stateless-rpc [--advertise-refs] <repo>`.
    /// `protocol` is the client's `Git-Protocol` header (already checked).
    pub fn upload_pack(&self, repo: &Path, advertise: bool, protocol: Option<&str>) -> Invocation {
        let mut inv = self
            .base(repo)
            .args(config_args(&[("uploadpack.allowFilter", "true".into())]))
            .args([Service::UploadPack.subcommand(), "--stateless-rpc"]);
        if advertise {
            inv = inv.args(["--advertise-refs"]);
        }
        inv = inv.args([repo.as_os_str()]);
        if let Some(p) = protocol {
            inv = inv.env("GIT_PROTOCOL", p);
        }
        inv
    }

    /// `git receive-pack --stateless-rpc [--advertise-refs] <repo>` with
    /// the repository's rules as git config (defence in depth behind the
    /// gate's own checks and the hook) and `hook` (JSON) for the
    /// `pre-receive` hook.
    pub fn receive_pack(
        &self,
        repo: &Path,
        advertise: bool,
        policy: &RepoPolicy,
        max_input_bytes: u64,
        hook: Option<&str>,
    ) -> Invocation {
        let mut inv = self
            .base(repo)
            .args(config_args(&[
                ("receive.autogc", "false".into()),
                ("receive.fsckObjects", "true".into()),
                (
                    "receive.denyNonFastForwards",
                    (!policy.allow_force).to_string(),
                ),
                ("receive.denyDeletes", (!policy.allow_delete).to_string()),
                ("receive.maxInputSize", max_input_bytes.to_string()),
                ("receive.advertisePushOptions", "false".into()),
            ]))
            .args([Service::ReceivePack.subcommand(), "--stateless-rpc"]);
        if advertise {
            inv = inv.args(["--advertise-refs"]);
        }
        inv = inv.args([repo.as_os_str()]);
        if let Some(h) = hook {
            inv = inv.env(HOOK_ENV, h);
        }
        inv
    }

    /// `git init --bare --template= <path>` (no sample hooks).
    pub fn init_bare(&self, path: &Path) -> Invocation {
        self.base(path)
            .args(["init", "--quiet", "--bare", "--template="])
            .args([path.as_os_str()])
    }

    /// Fetches an upstream's branches and tags into a mirror, pruning what
    /// the upstream deleted. The URL is given on the command line so the
    /// mirror's config never names it (or a credential).
    pub fn fetch_mirror(&self, path: &Path, url: &str, auth: Option<&str>) -> Invocation {
        let inv = self
            .base(path)
            .args(config_args(&upstream_config()))
            .args([OsString::from("--git-dir"), path.into()])
            .args([
                "fetch",
                "--quiet",
                "--prune",
                "--no-tags",
                "--no-write-fetch-head",
                "--",
                url,
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*",
            ]);
        with_auth(inv, auth)
    }

    /// `git ls-remote --symref <url> HEAD`: the upstream's default branch.
    pub fn ls_remote_head(&self, path: &Path, url: &str, auth: Option<&str>) -> Invocation {
        let inv = self
            .base(path)
            .args(config_args(&upstream_config()))
            .args([OsString::from("--git-dir"), path.into()])
            .args(["ls-remote", "--symref", "--", url, "HEAD"]);
        with_auth(inv, auth)
    }

    /// `git symbolic-ref HEAD <target>` in a mirror.
    pub fn set_head(&self, path: &Path, target: &str) -> Invocation {
        self.base(path)
            .args([OsString::from("--git-dir"), path.into()])
            .args(["symbolic-ref", "HEAD", target])
    }

    /// `git rev-parse --verify --quiet <rev>`: exit 0 when it resolves.
    pub fn verify(&self, path: &Path, rev: &str) -> Invocation {
        self.base(path)
            .args([OsString::from("--git-dir"), path.into()])
            .args(["rev-parse", "--verify", "--quiet", rev])
    }
}

fn with_auth(inv: Invocation, auth: Option<&str>) -> Invocation {
    match auth {
        Some(header) => secret_config(inv, &[("http.extraHeader", header)]),
        None => inv,
    }
}

/// Hook-side: `git merge-base --is-ancestor <old> <new>` in the hook's
/// environment (which points at the quarantined objects).
pub fn is_ancestor(git: &Path, old: &str, new: &str) -> Invocation {
    let mut inv = Invocation::new(git).args(["merge-base", "--is-ancestor", old, new]);
    inv.inherit_env = true;
    inv
}

/// Hook-side: pushes the accepted updates on to the upstream, each
/// guarded by a lease on the value the agent saw, so an upstream that
/// moved meanwhile refuses instead of being overwritten.
pub fn push_upstream(
    git: &Path,
    url: &str,
    updates: &[RefUpdate],
    auth: Option<&str>,
) -> Invocation {
    let mut inv = Invocation::new(git)
        .args(config_args(&upstream_config()))
        .args(["push", "--porcelain", "--no-verify"]);
    if updates.len() > 1 {
        inv = inv.args(["--atomic"]);
    }
    for u in updates {
        inv = inv.args([format!("--force-with-lease={}:{}", u.refname, u.old)]);
    }
    inv = inv.args(["--", url]);
    for u in updates {
        let spec = if u.is_delete() {
            format!(":{}", u.refname)
        } else {
            format!("{}:{}", u.new, u.refname)
        };
        inv = inv.args([spec]);
    }
    inv.inherit_env = true;
    // The objects are read through the quarantine's variables, but a
    // local (file://) upstream's receive-pack would inherit the marker and
    // refuse to update its refs.
    inv.remove_env.push("GIT_QUARANTINE_PATH".into());
    inv.remove_env.push(HOOK_ENV.into());
    with_auth(inv, auth)
}

#[cfg(test)]
mod tests {
    use bottle_core::bundle::BundleGitRepo;
    use bottle_core::manifest::GitMode;

    use super::*;

    fn git() -> Git {
        Git {
            program: "/usr/bin/git".into(),
            home: "/work".into(),
            hooks_dir: "/work/hooks".into(),
        }
    }

    const BASE: [&str; 9] = [
        "/usr/bin/git",
        "-c",
        "safe.directory=/r.git",
        "-c",
        "core.hooksPath=/work/hooks",
        "-c",
        "gc.auto=0",
        "-c",
        "maintenance.auto=false",
    ];

    fn with_base(rest: &[&str]) -> Vec<String> {
        BASE.iter().chain(rest).map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn upload_pack_argv() {
        let inv = git().upload_pack(Path::new("/r.git"), true, Some("version=2"));
        assert_eq!(
            inv.argv(),
            with_base(&[
                "-c",
                "uploadpack.allowFilter=true",
                "upload-pack",
                "--stateless-rpc",
                "--advertise-refs",
                "/r.git"
            ])
        );
        assert_eq!(inv.env_value("GIT_PROTOCOL"), Some(OsStr::new("version=2")));
        assert_eq!(inv.env_value("HOME"), Some(OsStr::new("/work")));
        assert_eq!(inv.env_value("GIT_CONFIG_NOSYSTEM"), Some(OsStr::new("1")));
        assert!(!inv.inherit_env);
        let rpc = git().upload_pack(Path::new("/r.git"), false, None);
        assert_eq!(rpc.argv().last().map(String::as_str), Some("/r.git"));
        assert!(!rpc.argv().iter().any(|a| a == "--advertise-refs"));
        assert_eq!(rpc.env_value("GIT_PROTOCOL"), None);
    }

    #[test]
    fn receive_pack_argv_carries_the_rules() {
        let policy = RepoPolicy::new(&BundleGitRepo {
            name: "r".into(),
            path_in_bundle: "/r.git".into(),
            upstream: None,
            mode: GitMode::ReadWrite,
            push: vec!["agent/*".into()],
            allow_force: false,
            allow_delete: true,
            credential_file: None,
        })
        .unwrap();
        let inv = git().receive_pack(Path::new("/r.git"), false, &policy, 1024, Some("{}"));
        assert_eq!(
            inv.argv(),
            with_base(&[
                "-c",
                "receive.autogc=false",
                "-c",
                "receive.fsckObjects=true",
                "-c",
                "receive.denyNonFastForwards=true",
                "-c",
                "receive.denyDeletes=false",
                "-c",
                "receive.maxInputSize=1024",
                "-c",
                "receive.advertisePushOptions=false",
                "receive-pack",
                "--stateless-rpc",
                "/r.git"
            ])
        );
        assert_eq!(inv.env_value(HOOK_ENV), Some(OsStr::new("{}")));
    }

    #[test]
    fn upstream_credentials_stay_out_of_argv() {
        let header = "Authorization: Basic c2VjcmV0";
        let inv = git().fetch_mirror(
            Path::new("/r.git"),
            "https://example.test/r.git",
            Some(header),
        );
        let argv = inv.argv();
        assert!(!argv.iter().any(|a| a.contains("c2VjcmV0")), "{argv:?}");
        assert!(argv.iter().any(|a| a == "protocol.allow=never"));
        assert!(argv.iter().any(|a| a == "http.followRedirects=false"));
        assert_eq!(
            &argv[argv.len() - 3..],
            [
                "https://example.test/r.git",
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*"
            ]
        );
        assert_eq!(inv.env_value("GIT_CONFIG_COUNT"), Some(OsStr::new("1")));
        assert_eq!(
            inv.env_value("GIT_CONFIG_KEY_0"),
            Some(OsStr::new("http.extraHeader"))
        );
        assert_eq!(
            inv.env_value("GIT_CONFIG_VALUE_0"),
            Some(OsStr::new(header))
        );
        assert!(!format!("{inv:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn push_upstream_leases_every_ref() {
        let upd = |old: char, new: char, r: &str| RefUpdate {
            old: old.to_string().repeat(40),
            new: new.to_string().repeat(40),
            refname: r.into(),
        };
        let inv = push_upstream(
            Path::new("/usr/bin/git"),
            "https://example.test/r.git",
            &[upd('a', 'b', "refs/heads/x"), upd('c', '0', "refs/heads/y")],
            None,
        );
        let argv = inv.argv();
        let tail: Vec<&str> = argv
            .iter()
            .skip_while(|a| *a != "push")
            .map(String::as_str)
            .collect();
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let c = "c".repeat(40);
        assert_eq!(
            tail,
            [
                "push",
                "--porcelain",
                "--no-verify",
                "--atomic",
                &format!("--force-with-lease=refs/heads/x:{a}"),
                &format!("--force-with-lease=refs/heads/y:{c}"),
                "--",
                "https://example.test/r.git",
                &format!("{b}:refs/heads/x"),
                ":refs/heads/y",
            ]
        );
        assert!(inv.inherit_env);
        assert!(inv.remove_env.iter().any(|k| k == "GIT_QUARANTINE_PATH"));
    }

    #[test]
    fn only_plain_protocols_upstream() {
        assert!(upstream_protocol_ok("https://github.com/o/r.git"));
        assert!(upstream_protocol_ok("file:///srv/r.git"));
        assert!(!upstream_protocol_ok("ext::sh -c touch% /tmp/pwned"));
        assert!(!upstream_protocol_ok("ssh://git@github.com/o/r.git"));
        assert!(!upstream_protocol_ok("/srv/r.git"));
    }
}
