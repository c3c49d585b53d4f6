//! What goes into a freshly started microVM before the agent runs: the
//! bundle's CA, the prompt, the skills, the supervise settings, and the
//! agent's environment (`bottle_core::agent`, which also routes git to
//! git-gate). Files go in with `machine cp`, and the few
//! commands are plain POSIX `sh`, `mkdir` and `cat`, so any agent image with
//! a shell can be provisioned.
//!
//! The environment is not baked into the `.smolmachine` (that would make
//! the image cache per-bottle): every `machine exec` carries it as `-e`, and
//! `/etc/bottle/env` plus `/etc/profile.d/bottle.sh` hold a copy for shells
//! started inside the bottle.

use std::path::{Path, PathBuf};

use bottle_core::agent::{
    AGENT_CA_PATH, AGENT_DIR, AGENT_MCP_CONFIG, AGENT_PROMPT_PATH, AGENT_SKILLS_DIR,
};
use bottle_core::bundle_host::BundleEndpoint;
use bottle_core::spec::BottleSpec;
use serde::{Deserialize, Serialize};

use crate::cli::Smolvm;
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
        &format!("mkdir -p {AGENT_DIR} {AGENT_SKILLS_DIR} /etc/profile.d"),
    )?;

    // CA: trusted through the variables above, and appended to whichever
    // system bundle the image has, for tools that read only that.
    smolvm.copy_in(machine, &endpoint.ca_cert, AGENT_CA_PATH)?;
    run(
        "install the bundle CA",
        &format!(
            "for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do \
             if [ -f \"$f\" ]; then cat {AGENT_CA_PATH} >> \"$f\"; fi; done"
        ),
    )?;

    if let Some(prompt) = &inputs.prompt {
        smolvm.copy_in(machine, prompt, AGENT_PROMPT_PATH)?;
    }
    for host in &inputs.skills {
        let name = host
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "skill".into());
        smolvm.copy_in(machine, host, &format!("{AGENT_SKILLS_DIR}/{name}"))?;
    }
    let file = write(
        "guest-mcp.json",
        &bottle_core::bundle::mcp_config(&endpoint.address.to_string()),
    )?;
    smolvm.copy_in(machine, &file, AGENT_MCP_CONFIG)?;
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
    fn env_file_quotes_for_sh() {
        let text = env_file(&[("A".into(), "it's $HOME".into())]);
        assert_eq!(text, "export A='it'\\''s $HOME'\n");
    }
}
