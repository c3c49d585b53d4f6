//! What goes into a freshly started microVM before the agent runs: what
//! every box receives (`bottle_core::agent_box`: `/etc/bottle`, the MCP
//! config naming supervise, the prompt, the skills), the bundle's CA, and
//! the agent's environment (`bottle_core::agent`, which also routes git to
//! git-gate). Files go in with `machine cp`, and the few
//! commands are plain POSIX `sh`, `mkdir`, `cat`, `chmod` and `readlink`,
//! so any agent image with a shell can be provisioned. The CA goes in as
//! `bottle_core::ca_install` defines, the same as in a docker bottle.
//!
//! The environment is not baked into the `.smolmachine` (that would make
//! the image cache per-bottle): every `machine exec` carries it as `-e`, and
//! `/etc/bottle/env` plus `/etc/profile.d/bottle.sh` hold a copy for shells
//! started inside the bottle.

use std::path::{Path, PathBuf};

use bottle_core::agent_box::{
    self, AgentBox, AgentFileInputs, BoxFile, Contents, Entry, Refused, ToolRun,
};
use bottle_core::bundle_binary::ToolboxBinary;
use bottle_core::bundle_host::BundleEndpoint;
use bottle_core::sandbox::{TOOLBOX_MODE, TOOLBOX_PATH};
use bottle_core::spec::BottleSpec;
use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::cli::{GuestOutput, Smolvm};
use crate::error::{SmolvmError, io_err};

/// The host-side files provisioning copies in, resolved from the spec at
/// `prepare` and carried in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProvisionInputs {
    /// The prompt file on the host.
    pub prompt: Option<PathBuf>,
    /// Skills directories on the host.
    pub skills: Vec<PathBuf>,
}

impl ProvisionInputs {
    /// Resolves manifest-relative paths against the manifest's directory.
    pub fn from_spec(spec: &BottleSpec) -> ProvisionInputs {
        ProvisionInputs {
            prompt: spec.agent.prompt.as_deref().map(|p| spec.resolve(p)),
            skills: spec.agent.skills.iter().map(|s| spec.resolve(s)).collect(),
        }
    }
}

/// Where the guest's lines for `/etc/hosts` are kept, appended to it.
const AGENT_HOSTS_FILE: &str = "/etc/bottle/hosts";

/// `/etc/hosts` lines giving each of `names` the bundle's `address`.
pub fn hosts_lines(address: std::net::Ipv4Addr, names: &[String]) -> String {
    names
        .iter()
        .map(|name| format!("{address}\t{name}\n"))
        .collect()
}

/// The `/etc/bottle/env` file: one `export K='V'` per line, shell-quoted.
pub fn env_file(env: &[(String, String)]) -> String {
    env.iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

/// Single-quotes `value` for POSIX sh.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Provisions `machine`. `scratch` is a host directory for the generated
/// files (the bottle's state dir). Returns what installing the CA could not
/// do, for the operator.
///
/// `bundle_names` are the names the guest's `/etc/hosts` gives the
/// bundle's address (`bottle_core::agent::bundle_host_names`): the agent
/// has no DNS, and reaches the bundle's relays by them.
pub fn provision(
    smolvm: &Smolvm,
    machine: &str,
    inputs: &ProvisionInputs,
    endpoint: &BundleEndpoint,
    env: &[(String, String)],
    bundle_names: &[String],
    scratch: &Path,
) -> Result<Vec<String>, SmolvmError> {
    let run = |step: &str, script: &str| run_script(smolvm, machine, env, step, script);
    let write = |name: &str, contents: &str| -> Result<PathBuf, SmolvmError> {
        let path = scratch.join(name);
        std::fs::write(&path, contents).map_err(|e| io_err("write", &path, e))?;
        Ok(path)
    };

    let mut target = GuestBox {
        smolvm,
        machine,
        env,
        scratch,
    };
    // What every box receives, as the shared definition lists it.
    let files = agent_box::agent_files(&AgentFileInputs {
        bundle_address: endpoint.address,
        prompt: inputs.prompt.as_deref(),
        skills: &inputs.skills,
    });
    agent_box::provision(&mut target, &files)?.map_err(|Refused(detail)| {
        SmolvmError::Provision {
            step: "put the agent's files in".into(),
            detail,
        }
    })?;
    // CA: as the shared definition says, over `machine cp` and `exec`.
    let report = bottle_core::ca_install::install(&mut target, &ca_cert(endpoint)?)?;

    let file = write("guest-env", &env_file(env))?;
    smolvm.copy_in(machine, &file, "/etc/bottle/env")?;
    run(
        "make the environment visible to shells",
        "mkdir -p /etc/profile.d && printf '. /etc/bottle/env\\n' > /etc/profile.d/bottle.sh",
    )?;
    if !bundle_names.is_empty() {
        let file = write("guest-hosts", &hosts_lines(endpoint.address, bundle_names))?;
        smolvm.copy_in(machine, &file, AGENT_HOSTS_FILE)?;
        run(
            "name the bundle's relays in /etc/hosts",
            &format!("cat {AGENT_HOSTS_FILE} >> /etc/hosts"),
        )?;
    }
    Ok(report.warnings)
}

/// Puts the in-box agent `binary` at [`TOOLBOX_PATH`], root-owned and
/// execute-only ([`TOOLBOX_MODE`]): the agent may run it, not read or
/// change it, and the process is never dumpable.
pub fn install_toolbox(
    smolvm: &Smolvm,
    machine: &str,
    binary: &ToolboxBinary,
    env: &[(String, String)],
    scratch: &Path,
) -> Result<(), SmolvmError> {
    let dir = TOOLBOX_PATH.rsplit_once('/').map_or("/", |(dir, _)| dir);
    run_script(
        smolvm,
        machine,
        env,
        &format!("create {dir}"),
        &format!("mkdir -p {dir}"),
    )?;
    // `machine cp` names the guest file after the host one.
    let staged = scratch.join("toolbox");
    std::fs::write(&staged, &binary.bytes).map_err(|e| io_err("write", &staged, e))?;
    let copied = smolvm.copy_in(machine, &staged, TOOLBOX_PATH);
    std::fs::remove_file(&staged).map_err(|e| io_err("remove", &staged, e))?;
    copied?;
    run_script(
        smolvm,
        machine,
        env,
        "make the in-box agent root-owned and execute-only",
        &format!(
            "chown 0:0 {TOOLBOX_PATH} && chmod {TOOLBOX_MODE:o} {TOOLBOX_PATH} && chmod 0755 {dir}"
        ),
    )
}

/// Runs `script` with `/bin/sh -c` in `machine`; a non-zero exit is a
/// failed provisioning `step`.
fn run_script(
    smolvm: &Smolvm,
    machine: &str,
    env: &[(String, String)],
    step: &str,
    script: &str,
) -> Result<(), SmolvmError> {
    let out = smolvm.exec(
        machine,
        &["/bin/sh".to_string(), "-c".to_string(), script.to_string()],
        env,
    )?;
    if out.exit_code == 0 {
        Ok(())
    } else {
        Err(failed_step(step.into(), &out))
    }
}

/// A provisioning `step` whose guest command exited non-zero (`out`).
fn failed_step(step: String, out: &GuestOutput) -> SmolvmError {
    SmolvmError::Provision {
        step,
        detail: format!(
            "exit {}: {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// A guest write's outcome (`out`): done, or refused with its stderr.
fn written(out: &GuestOutput) -> Result<(), Refused> {
    if out.exit_code == 0 {
        Ok(())
    } else {
        Err(Refused(String::from_utf8_lossy(&out.stderr).into_owned()))
    }
}

fn ca_cert(endpoint: &BundleEndpoint) -> Result<Vec<u8>, SmolvmError> {
    std::fs::read(&endpoint.ca_cert).map_err(|e| io_err("read", &endpoint.ca_cert, e))
}

/// What is at `$1`, a final symlink not followed: a header line (`link`,
/// `dir`, `file <octal mode>`, `missing`), then the link's target or the
/// file's contents.
const ENTRY_SCRIPT: &str = r#"if [ -L "$1" ]; then printf 'link\n'; readlink "$1"
elif [ -d "$1" ]; then printf 'dir\n'
elif [ -f "$1" ]; then printf 'file %s\n' "$(stat -c %a "$1" 2>/dev/null || echo 644)"; cat "$1"
else printf 'missing\n'; fi"#;

/// Moves the staged file `$2` to `$1` with mode `$3`, creating the
/// directory; a symlink at `$1` is replaced, not followed. Writing through
/// the guest's own shell resolves the path inside the guest.
const WRITE_SCRIPT: &str = r#"dir=${1%/*}; mkdir -p "${dir:-/}" || exit 1
if [ -L "$1" ]; then rm -f "$1" || exit 1; fi
cat "$2" > "$1" && chmod "$3" "$1"; rc=$?; rm -f "$2"; exit $rc"#;

/// Makes the directory `$1` (and its parents) with mode `$2`.
const DIR_SCRIPT: &str = r#"mkdir -p "$1" && chmod "$2" "$1""#;

/// Makes `$1` a symlink to `$2`, replacing a file or link there, a link
/// to a directory included (`-n`), but not a directory: `ln` would put
/// the link inside it.
const LINK_SCRIPT: &str = r#"if [ -d "$1" ] && [ ! -L "$1" ]; then echo "$1 is a directory" >&2; exit 1; fi
ln -sfn "$2" "$1""#;

/// Prints `entries` when the directory `$1` holds any entry, hidden ones
/// included, and nothing otherwise (a missing `$1` holds none).
const DIR_ENTRIES_SCRIPT: &str = r#"[ -d "$1" ] || exit 0
for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
  if [ -e "$f" ] || [ -L "$f" ]; then echo entries; exit 0; fi
done"#;

/// Where a file is staged in the guest before [`WRITE_SCRIPT`] moves it
/// (the first provisioning step made the directory).
const STAGED: &str = "/etc/bottle/.ca-install";

/// The host file in the state dir each CA write is staged through (removed
/// after each write; `stop` removes one a crash left).
pub(crate) const CA_SCRATCH: &str = "ca-install";

/// The microVM as [`agent_box`] and [`bottle_core::ca_install`] see it.
/// `machine cp` and `machine exec` act as the guest's root, who is the
/// agent's user in a microVM: a file that is the agent's is root's there.
struct GuestBox<'a> {
    smolvm: &'a Smolvm,
    machine: &'a str,
    env: &'a [(String, String)],
    scratch: &'a Path,
}

impl GuestBox<'_> {
    /// Runs `script` under `sh` with `args` as `$1`...
    fn sh(&self, script: &str, args: &[&str]) -> Result<GuestOutput, SmolvmError> {
        let mut argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            script.to_string(),
            "bottle-ca".to_string(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        self.smolvm.exec(self.machine, &argv, self.env)
    }
}

impl AgentBox for GuestBox<'_> {
    type Error = SmolvmError;

    fn entry(&mut self, path: &str) -> Result<Entry, SmolvmError> {
        let out = self.sh(ENTRY_SCRIPT, &[path])?;
        let entry = (out.exit_code == 0)
            .then(|| parse_entry(&out.stdout))
            .flatten();
        entry.ok_or_else(|| failed_step(format!("look at {path} for the CA"), &out))
    }

    fn write(
        &mut self,
        path: &str,
        contents: &[u8],
        mode: u32,
    ) -> Result<Result<(), Refused>, SmolvmError> {
        let host = self.scratch.join(CA_SCRATCH);
        std::fs::write(&host, contents).map_err(|e| io_err("write", &host, e))?;
        let copied = self.smolvm.copy_in(self.machine, &host, STAGED);
        std::fs::remove_file(&host).map_err(|e| io_err("remove", &host, e))?;
        copied?;
        let mode = format!("{:o}", mode & 0o7777);
        let out = self.sh(WRITE_SCRIPT, &[path, STAGED, &mode])?;
        Ok(written(&out))
    }

    fn put(&mut self, file: &BoxFile) -> Result<Result<(), Refused>, SmolvmError> {
        match &file.contents {
            Contents::Dir { mode } => {
                let mode = format!("{:o}", mode & 0o7777);
                let out = self.sh(DIR_SCRIPT, &[&file.path, &mode])?;
                Ok(written(&out))
            }
            Contents::File { bytes, mode } => self.write(&file.path, bytes, *mode),
            Contents::Host(host) => {
                self.smolvm.copy_in(self.machine, host, &file.path)?;
                Ok(Ok(()))
            }
        }
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<Result<(), Refused>, SmolvmError> {
        let out = self.sh(LINK_SCRIPT, &[path, target])?;
        Ok(written(&out))
    }

    fn dir_has_entries(&mut self, dir: &str) -> Result<bool, SmolvmError> {
        let out = self.sh(DIR_ENTRIES_SCRIPT, &[dir])?;
        if out.exit_code != 0 {
            return Err(failed_step(format!("list {dir} for the CA"), &out));
        }
        Ok(out.stdout.starts_with(b"entries"))
    }

    fn run(&mut self, argv: &[&str], timeout: Duration) -> Result<ToolRun, SmolvmError> {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        Ok(
            match self
                .smolvm
                .exec_within(self.machine, &argv, self.env, timeout)?
            {
                None => ToolRun::TimedOut,
                Some(out) => ToolRun::Exited {
                    code: out.exit_code,
                    stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                },
            },
        )
    }
}

/// Reads [`ENTRY_SCRIPT`]'s output.
fn parse_entry(stdout: &[u8]) -> Option<Entry> {
    let newline = stdout.iter().position(|b| *b == b'\n')?;
    let (header, rest) = (&stdout[..newline], &stdout[newline + 1..]);
    match std::str::from_utf8(header).ok()? {
        "missing" => Some(Entry::Missing),
        "dir" => Some(Entry::Dir),
        "link" => {
            // readlink ends the target with one newline.
            let target = rest.strip_suffix(b"\n").unwrap_or(rest);
            Some(Entry::Link(String::from_utf8_lossy(target).into_owned()))
        }
        header => {
            let mode = u32::from_str_radix(header.strip_prefix("file ")?, 8).ok()?;
            Some(Entry::File {
                contents: rest.to_vec(),
                mode,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_from_the_guest_script() {
        assert_eq!(parse_entry(b"missing\n"), Some(Entry::Missing));
        assert_eq!(parse_entry(b"dir\n"), Some(Entry::Dir));
        assert_eq!(
            parse_entry(b"link\n../a b\n"),
            Some(Entry::Link("../a b".into()))
        );
        assert_eq!(
            parse_entry(b"file 644\nroots\n"),
            Some(Entry::File {
                contents: b"roots\n".to_vec(),
                mode: 0o644
            })
        );
        assert_eq!(parse_entry(b"file rw\n"), None);
        assert_eq!(parse_entry(b"nothing"), None);
    }

    /// Runs a guest script under the host's `sh` (dash here, as busybox's
    /// in many guests: POSIX only) with `args`.
    fn run_script(script: &str, args: &[&str]) -> bottle_core::exec::CommandOutput {
        use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
        SystemRunner
            .run(
                &CommandSpec::new("/bin/sh")
                    .args(["-c", script, "bottle-ca"])
                    .args(args.iter().copied()),
            )
            .unwrap()
    }

    #[test]
    fn the_guest_scripts_list_a_directory_and_link_without_following() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name).display().to_string();
        std::fs::create_dir(at("empty")).unwrap();
        std::fs::create_dir(at("hidden")).unwrap();
        std::fs::write(at("hidden/.hook"), "").unwrap();
        std::fs::create_dir(at("dangling")).unwrap();
        std::os::unix::fs::symlink("/nowhere", at("dangling/hook")).unwrap();
        for (path, holds) in [
            ("empty", false),
            ("missing", false),
            ("hidden", true),
            ("dangling", true),
        ] {
            let out = run_script(DIR_ENTRIES_SCRIPT, &[&at(path)]);
            assert_eq!(out.code, Some(0), "{path}");
            assert_eq!(out.stdout.starts_with(b"entries"), holds, "{path}");
        }

        std::fs::write(at("file"), "old").unwrap();
        std::os::unix::fs::symlink(at("empty"), at("to-dir")).unwrap();
        for path in ["file", "new", "to-dir"] {
            let out = run_script(LINK_SCRIPT, &[&at(path), "bottle.crt"]);
            assert_eq!(out.code, Some(0), "{path}: {}", out.stderr_text());
            assert_eq!(
                std::fs::read_link(at(path)).unwrap(),
                Path::new("bottle.crt")
            );
        }
        let out = run_script(LINK_SCRIPT, &[&at("empty"), "bottle.crt"]);
        assert_ne!(out.code, Some(0), "a directory is not replaced");
        assert!(std::fs::read_dir(at("empty")).unwrap().next().is_none());
    }

    #[test]
    fn env_file_quotes_for_sh() {
        let text = env_file(&[("A".into(), "it's $HOME".into())]);
        assert_eq!(text, "export A='it'\\''s $HOME'\n");
    }
}
