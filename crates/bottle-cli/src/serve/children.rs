//! Boot, list and shutdown run `bottle start -d --yes`, `bottle list
//! --json` and `bottle stop` as children of this `bottle`, through the one
//! runner.
//!
//! Why not in-process: `start` installs the process's ^C/`SIGTERM`
//! handling for its launch and a one-shot interrupt flag every later
//! launch would see, and `start`, `stop` and `list` write to the terminal.
//! A child keeps the server's signals and terminal its own, and boots
//! exactly as the operator's `bottle start -d` does.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use hyper::StatusCode;

use super::error::ApiError;
use crate::failure::{EXIT_USAGE, Failure};

/// How long a boot may take (it may build the agent's image).
const BOOT_WITHIN: Duration = Duration::from_secs(15 * 60);
/// How long `stop` and `list` may take.
const OTHERS_WITHIN: Duration = Duration::from_secs(5 * 60);

/// This `bottle`, run with the server's backend choice.
#[derive(Debug, Clone)]
pub(crate) struct BottleCli {
    exe: PathBuf,
    backend: Option<String>,
}

/// What a boot asks for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Boot {
    /// The manifest, an absolute path on the host.
    pub manifest: PathBuf,
    /// The agent, a key under `[agents]`.
    pub agent: String,
    /// `docker` or `smolmachines` (default: the server's).
    #[serde(default)]
    pub backend: Option<String>,
    /// The bottle's name (default: the agent's).
    #[serde(default)]
    pub name: Option<String>,
}

impl BottleCli {
    /// The running `bottle` executable.
    pub(crate) fn current(backend: Option<String>) -> Result<BottleCli, Failure> {
        let exe = std::env::current_exe()
            .map_err(|err| anyhow::anyhow!("cannot find this bottle executable: {err}"))?;
        Ok(BottleCli { exe, backend })
    }

    /// `bottle start -d --yes --quiet`; the bottle's name.
    pub(crate) fn boot(&self, boot: &Boot) -> Result<String, ApiError> {
        if !boot.manifest.is_absolute() {
            return Err(ApiError::bad_request(
                "\"manifest\" must be an absolute path on the host",
            ));
        }
        let mut args = vec![
            OsString::from("start"),
            "--detach".into(),
            "--yes".into(),
            "--quiet".into(),
        ];
        let mut manifest = OsString::from("--manifest=");
        manifest.push(&boot.manifest);
        args.push(manifest);
        if let Some(backend) = boot.backend.as_ref().or(self.backend.as_ref()) {
            args.push(format!("--backend={backend}").into());
        }
        if let Some(name) = &boot.name {
            args.push(format!("--name={name}").into());
        }
        // After `--`, an agent named like an option is still the agent.
        args.extend(["--".into(), OsString::from(&boot.agent)]);
        let stdout = self.run(args, BOOT_WITHIN, StatusCode::BAD_REQUEST)?;
        let name = String::from_utf8_lossy(&stdout).trim().to_string();
        if name.is_empty() {
            return Err(ApiError::internal("`bottle start` printed no bottle name"));
        }
        Ok(name)
    }

    /// `bottle --json list`, as JSON.
    pub(crate) fn list(&self) -> Result<serde_json::Value, ApiError> {
        let stdout = self.run(
            vec!["--json".into(), "list".into()],
            OTHERS_WITHIN,
            StatusCode::BAD_REQUEST,
        )?;
        serde_json::from_slice(&stdout).map_err(|err| {
            ApiError::internal(format!("`bottle list --json` printed no JSON: {err}"))
        })
    }

    /// `bottle stop NAME`.
    pub(crate) fn stop(&self, name: &str) -> Result<(), ApiError> {
        // The name is the only input: bad input means no such bottle.
        self.run(
            vec!["stop".into(), "--".into(), name.into()],
            OTHERS_WITHIN,
            StatusCode::NOT_FOUND,
        )
        .map(drop)
    }

    /// Runs `bottle ARGS`; its stdout, or its failure with the status
    /// `on_bad_input` when it exited for bad input.
    fn run(
        &self,
        args: Vec<OsString>,
        within: Duration,
        on_bad_input: StatusCode,
    ) -> Result<Vec<u8>, ApiError> {
        let mut spec = CommandSpec::new(&self.exe).args(args).timeout(within);
        if let Some(backend) = &self.backend {
            spec = spec.env("BOT_BOTTLE_BACKEND", backend);
        }
        let output = SystemRunner
            .run(&spec)
            .map_err(|err| ApiError::internal(format!("cannot run `bottle`: {err}")))?;
        if output.success() {
            return Ok(output.stdout);
        }
        let status = if output.code == Some(i32::from(EXIT_USAGE)) {
            on_bad_input
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Err(error_from_stderr(&output.stderr_text(), status))
    }
}

/// The error a `bottle` child printed (`error[CODE]: message`, then
/// `  fix: …`), or `BOT-C046` with its last lines when it printed none.
fn error_from_stderr(stderr: &str, status: StatusCode) -> ApiError {
    let mut lines = stderr.lines().skip_while(|l| !l.starts_with("error"));
    let Some(first) = lines.next() else {
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return ApiError::new(
            status,
            "BOT-C046",
            format!("`bottle` failed without an error: {}", tail.join(" / ")),
            "run the same command by hand to see what happened",
        );
    };
    let (code, message) = match first
        .strip_prefix("error[")
        .and_then(|rest| rest.split_once("]: "))
    {
        Some((code, message)) if code.starts_with("BOT-") => (code, message),
        _ => ("BOT-C046", first.strip_prefix("error: ").unwrap_or(first)),
    };
    let mut error = ApiError {
        status,
        code: code.to_string(),
        message: message.to_string(),
        fix: None,
        report: None,
    };
    for line in lines {
        match line.strip_prefix("  fix: ") {
            Some(fix) => {
                error.fix = Some(fix.to_string());
                break;
            }
            None => {
                error.message.push('\n');
                error.message.push_str(line);
            }
        }
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_error_keeps_its_code_message_and_fix() {
        let err = error_from_stderr(
            "warning: x\nerror[BOT-M004]: unknown agent \"nope\"\n  in bottle.toml\n  fix: use one of: echo\n",
            StatusCode::BAD_REQUEST,
        );
        assert_eq!(err.code, "BOT-M004");
        assert_eq!(err.message, "unknown agent \"nope\"\n  in bottle.toml");
        assert_eq!(err.fix.as_deref(), Some("use one of: echo"));
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_child_that_printed_no_error_is_c046_with_its_last_lines() {
        let err = error_from_stderr(
            "thread panicked\nat x.rs\n",
            StatusCode::INTERNAL_SERVER_ERROR,
        );
        assert_eq!(err.code, "BOT-C046");
        assert!(
            err.message.contains("thread panicked / at x.rs"),
            "{}",
            err.message
        );
        let uncoded = error_from_stderr("error: could not render\n", StatusCode::BAD_REQUEST);
        assert_eq!(
            (uncoded.code.as_str(), uncoded.message.as_str()),
            ("BOT-C046", "could not render")
        );
    }
}
