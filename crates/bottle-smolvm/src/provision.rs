//! What goes into a freshly started microVM before the agent runs: the
//! bundle's CA, the prompt, the skills, the git and supervise settings, and
//! the agent's environment. Files go in with `machine cp`, and the few
//! commands are plain POSIX `sh`, `mkdir` and `cat`, so any agent image with
//! a shell can be provisioned.
//!
//! The environment is not baked into the `.smolmachine` (that would make
//! the image cache per-bottle): every `machine exec` carries it as `-e`, and
//! `/etc/bottle/env` plus `/etc/profile.d/bottle.sh` hold a copy for shells
//! started inside the bottle.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bottle_core::bundle::{GIT_GATE_PORT, PROXY_PORT};
use bottle_core::spec::BottleSpec;
use serde::{Deserialize, Serialize};

use crate::bundle_host::BundleEndpoint;
use crate::cli::Smolvm;
use crate::error::{SmolvmError, io_err};

/// The directory in the guest holding everything bottle puts there.
pub const GUEST_DIR: &str = "/etc/bottle";
/// The bundle CA in the guest.
pub const GUEST_CA: &str = "/etc/bottle/ca.pem";
/// The prompt in the guest.
pub const GUEST_PROMPT: &str = "/etc/bottle/prompt.md";
/// The skills directory in the guest.
pub const GUEST_SKILLS: &str = "/etc/bottle/skills";
/// The MCP configuration naming supervise.
pub const GUEST_MCP: &str = "/etc/bottle/mcp.json";
/// The git configuration routing fetches and pushes to git-gate.
pub const GUEST_GITCONFIG: &str = "/etc/bottle/gitconfig";

/// A repository the agent reaches through git-gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRoute {
    /// The name the agent sees.
    pub name: String,
    /// The real remote it stands for.
    pub url: String,
}

/// The host-side inputs of provisioning, resolved from the spec at
/// `prepare` and carried in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProvisionInputs {
    /// The prompt file on the host.
    pub prompt: Option<PathBuf>,
    /// Skills directories on the host.
    pub skills: Vec<PathBuf>,
    /// Repositories behind git-gate.
    pub git: Vec<GitRoute>,
    /// The manifest's environment for the agent.
    pub env: BTreeMap<String, String>,
}

impl ProvisionInputs {
    /// Resolves manifest-relative paths against the manifest's directory.
    pub fn from_spec(spec: &BottleSpec) -> ProvisionInputs {
        ProvisionInputs {
            prompt: spec.agent.prompt.as_deref().map(|p| spec.resolve(p)),
            skills: spec.agent.skills.iter().map(|s| spec.resolve(s)).collect(),
            git: spec
                .agent
                .git
                .iter()
                .map(|g| GitRoute {
                    name: g.name.clone(),
                    url: g.url.clone(),
                })
                .collect(),
            env: spec.agent.env.clone(),
        }
    }
}

/// The agent's environment: the manifest's, then the variables the backend
/// owns (proxy, CA, bundle URLs), which win.
pub fn agent_env(
    manifest_env: &BTreeMap<String, String>,
    address: Ipv4Addr,
    git_gate: bool,
    supervise: bool,
    prompt: bool,
) -> Vec<(String, String)> {
    let mut env = manifest_env.clone();
    let proxy = format!("http://{address}:{PROXY_PORT}");
    for key in [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "https_proxy",
        "http_proxy",
        "ALL_PROXY",
    ] {
        env.insert(key.into(), proxy.clone());
    }
    // Everything goes through the proxy; nothing is exempt.
    env.insert("NO_PROXY".into(), String::new());
    env.insert("no_proxy".into(), String::new());
    for key in [
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ] {
        env.insert(key.into(), GUEST_CA.into());
    }
    if git_gate {
        env.insert(
            "GIT_GATE_URL".into(),
            format!("http://{address}:{GIT_GATE_PORT}"),
        );
        env.insert("GIT_CONFIG_GLOBAL".into(), GUEST_GITCONFIG.into());
    }
    if supervise {
        env.insert(
            "MCP_SUPERVISE_URL".into(),
            bottle_core::bundle::supervise_url(&address.to_string()),
        );
        env.insert("BOTTLE_MCP_CONFIG".into(), GUEST_MCP.into());
    }
    if prompt {
        env.insert("BOTTLE_PROMPT_FILE".into(), GUEST_PROMPT.into());
    }
    env.into_iter().collect()
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

/// The git configuration sending every manifest repository to git-gate.
pub fn gitconfig(address: Ipv4Addr, repos: &[GitRoute]) -> String {
    let mut out = String::new();
    for repo in repos {
        out.push_str(&format!(
            "[url \"http://{address}:{GIT_GATE_PORT}/{}.git\"]\n\tinsteadOf = {}\n",
            repo.name, repo.url
        ));
    }
    out
}

/// Provisions `machine`. `scratch` is a host directory for the generated
/// files (the bottle's state dir).
pub fn provision(
    smolvm: &Smolvm,
    machine: &str,
    inputs: &ProvisionInputs,
    endpoint: &BundleEndpoint,
    env: &[(String, String)],
    scratch: &Path,
) -> Result<(), SmolvmError> {
    let run = |step: &str, script: &str| -> Result<(), SmolvmError> {
        let out = smolvm.exec(
            machine,
            &["/bin/sh".to_string(), "-c".to_string(), script.to_string()],
            env,
        )?;
        if out.exit_code == 0 {
            Ok(())
        } else {
            Err(SmolvmError::Provision {
                step: step.into(),
                detail: format!(
                    "exit {}: {}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr)
                ),
            })
        }
    };
    let write = |name: &str, contents: &str| -> Result<PathBuf, SmolvmError> {
        let path = scratch.join(name);
        std::fs::write(&path, contents).map_err(|e| io_err("write", &path, e))?;
        Ok(path)
    };

    run(
        "prepare /etc/bottle",
        &format!("mkdir -p {GUEST_DIR} {GUEST_SKILLS} /etc/profile.d"),
    )?;

    // CA: trusted through the variables above, and appended to whichever
    // system bundle the image has, for tools that read only that.
    smolvm.copy_in(machine, &endpoint.ca_cert, GUEST_CA)?;
    run(
        "install the bundle CA",
        &format!(
            "for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do \
             if [ -f \"$f\" ]; then cat {GUEST_CA} >> \"$f\"; fi; done"
        ),
    )?;

    if let Some(prompt) = &inputs.prompt {
        smolvm.copy_in(machine, prompt, GUEST_PROMPT)?;
    }
    for host in &inputs.skills {
        let name = host
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "skill".into());
        smolvm.copy_in(machine, host, &format!("{GUEST_SKILLS}/{name}"))?;
    }
    if endpoint.git_gate {
        let file = write("guest-gitconfig", &gitconfig(endpoint.address, &inputs.git))?;
        smolvm.copy_in(machine, &file, GUEST_GITCONFIG)?;
    }
    if endpoint.supervise {
        let file = write(
            "guest-mcp.json",
            &bottle_core::bundle::mcp_config(&endpoint.address.to_string()),
        )?;
        smolvm.copy_in(machine, &file, GUEST_MCP)?;
    }
    let file = write("guest-env", &env_file(env))?;
    smolvm.copy_in(machine, &file, "/etc/bottle/env")?;
    run(
        "make the environment visible to shells",
        "printf '. /etc/bottle/env\\n' > /etc/profile.d/bottle.sh",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_variables_win_over_the_manifest() {
        let manifest = BTreeMap::from([
            ("HTTPS_PROXY".to_string(), "http://evil:1".to_string()),
            ("EDITOR".to_string(), "vi".to_string()),
        ]);
        let env = agent_env(&manifest, Ipv4Addr::new(192, 168, 7, 2), true, false, true);
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("HTTPS_PROXY"), Some("http://192.168.7.2:8888"));
        assert_eq!(get("EDITOR"), Some("vi"));
        assert_eq!(get("GIT_GATE_URL"), Some("http://192.168.7.2:9418"));
        assert_eq!(get("MCP_SUPERVISE_URL"), None);
        assert_eq!(get("NO_PROXY"), Some(""));
        assert_eq!(get("NODE_EXTRA_CA_CERTS"), Some(GUEST_CA));
    }

    #[test]
    fn env_file_quotes_for_sh() {
        let text = env_file(&[("A".into(), "it's $HOME".into())]);
        assert_eq!(text, "export A='it'\\''s $HOME'\n");
    }
}
