//! `bottle execute`: one tool call through the bottle's in-box agent
//! (`Bottle::execute`), a program or a built-in tool.
//!
//! Without `--json` the call's stdout and stderr are written raw and its
//! exit code is `bottle`'s; with `--json` the whole `ToolResult` is printed
//! (outputs in base64) and `bottle` exits 0. A sandbox error prints like
//! every other error and exits with its own code (1).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;
use std::process::ExitCode;

use bottle_core::sandbox::{SandboxError, ToolCall, ToolResult};

use crate::args::{ExecuteArgs, Global};
use crate::failure::{EXIT_USAGE, Failure};
use crate::output;

/// Runs `bottle execute`.
pub(crate) fn run(global: &Global, args: &ExecuteArgs) -> Result<ExitCode, Failure> {
    let call = tool_call(args, &mut std::io::stdin().lock())?;
    let bottle = crate::lookup::find_bottle(global, &args.bottle)?;
    let result = bottle.execute(&call).map_err(|err| sandbox_failure(&err))?;
    if global.json {
        output::json(&result)?;
        return Ok(ExitCode::SUCCESS);
    }
    Ok(passed_through(&result))
}

/// The call the arguments describe; `stdin` is read for `--stdin-file -`.
fn tool_call(args: &ExecuteArgs, stdin: &mut dyn std::io::Read) -> Result<ToolCall, Failure> {
    let mut call = match &args.tool {
        Some(tool) => {
            let params: serde_json::Value = serde_json::from_str(&args.params).map_err(|err| {
                Failure::new(
                    "BOT-C030",
                    EXIT_USAGE,
                    format!("--params is not JSON: {err}"),
                )
                .with_fix(r#"give the tool's parameters as a JSON object, e.g. --params '{"path":"/tmp/x"}'"#)
            })?;
            ToolCall::tool(tool.clone(), params)
        }
        None => ToolCall::argv(args.argv.clone()),
    };
    call.deadline = args.deadline;
    call.cwd = args.cwd.clone();
    call.env = env_of(&args.env)?;
    if let Some(source) = &args.stdin_file {
        call.stdin = stdin_bytes(source, stdin)?;
    }
    Ok(call)
}

fn env_of(pairs: &[String]) -> Result<BTreeMap<String, String>, Failure> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
            _ => Err(Failure::new(
                "BOT-C031",
                EXIT_USAGE,
                format!("--env {pair:?} is not NAME=VALUE"),
            )
            .with_fix("write each variable as --env NAME=VALUE")),
        })
        .collect()
}

fn stdin_bytes(source: &Path, stdin: &mut dyn std::io::Read) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    let read = if source == Path::new("-") {
        stdin.read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::File::open(source).and_then(|mut file| file.read_to_end(&mut bytes).map(|_| ()))
    };
    read.map_err(|err| {
        Failure::new(
            "BOT-C032",
            EXIT_USAGE,
            format!(
                "cannot read the call's stdin from {}: {err}",
                source.display()
            ),
        )
        .with_fix("name a readable file, or `-` for this process's stdin")
    })?;
    Ok(bytes)
}

/// A sandbox error as the operator sees every error: its code, message and
/// fix, and its own exit code.
fn sandbox_failure(err: &SandboxError) -> Failure {
    Failure::coded(err, err.exit_code())
}

/// Writes the call's outputs raw and returns its exit code (1 for a code
/// outside 0..=255).
fn passed_through(result: &ToolResult) -> ExitCode {
    output::out_bytes(&result.stdout);
    output::err_bytes(&result.stderr);
    ExitCode::from(u8::try_from(result.exit_code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use std::time::Duration;

    use super::*;
    use crate::args::{Cli, Command};

    fn parse(argv: &[&str]) -> ExecuteArgs {
        let cli = Cli::try_parse_from(["bottle"].iter().chain(argv)).unwrap();
        match cli.command {
            Command::Execute(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn a_program_call_carries_its_deadline_cwd_env_and_stdin() {
        let args = parse(&[
            "execute",
            "demo",
            "--deadline",
            "500ms",
            "--cwd",
            "/tmp",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--stdin-file",
            "-",
            "--",
            "cat",
            "-n",
        ]);
        let call = tool_call(&args, &mut &b"\x00\xffbytes"[..]).unwrap();
        assert_eq!(call.summary(), "cat -n");
        assert_eq!(call.deadline, Duration::from_millis(500));
        assert_eq!(call.cwd.as_deref(), Some("/tmp"));
        assert_eq!(
            call.env,
            BTreeMap::from([("A".into(), "1".into()), ("B".into(), "x=y".into())])
        );
        assert_eq!(call.stdin, b"\x00\xffbytes");
    }

    #[test]
    fn a_tool_call_takes_json_params_and_no_argv() {
        let args = parse(&[
            "execute",
            "demo",
            "--tool",
            "read_file",
            "--params",
            r#"{"path":"/etc/hostname"}"#,
        ]);
        let call = tool_call(&args, &mut std::io::empty()).unwrap();
        assert_eq!(
            call.command,
            bottle_core::sandbox::Command::Tool {
                name: "read_file".into(),
                params: serde_json::json!({"path": "/etc/hostname"}),
            }
        );
        assert_eq!(call.deadline, Duration::from_secs(60));
        assert!(call.stdin.is_empty());

        let both = Cli::try_parse_from(["bottle", "execute", "demo", "--tool", "t", "--", "ls"]);
        assert!(both.is_err());
        let neither = Cli::try_parse_from(["bottle", "execute", "demo"]);
        assert!(neither.is_err());
    }

    #[test]
    fn bad_input_has_its_own_codes() {
        let bad_json = parse(&["execute", "demo", "--tool", "t", "--params", "{nope"]);
        let err = tool_call(&bad_json, &mut std::io::empty()).unwrap_err();
        assert_eq!((err.code, err.exit), (Some("BOT-C030"), EXIT_USAGE));

        let bad_env = parse(&["execute", "demo", "--env", "NOVALUE", "--", "true"]);
        let err = tool_call(&bad_env, &mut std::io::empty()).unwrap_err();
        assert_eq!(err.code, Some("BOT-C031"));

        let missing = parse(&[
            "execute",
            "demo",
            "--stdin-file",
            "/nonexistent/in",
            "--",
            "cat",
        ]);
        let err = tool_call(&missing, &mut std::io::empty()).unwrap_err();
        assert_eq!(err.code, Some("BOT-C032"));
    }

    #[test]
    fn a_sandbox_error_keeps_its_code_fix_and_exit() {
        let err = SandboxError::ToolTimeout {
            bottle: "bot-bottle-demo".into(),
            call: "sleep 9".into(),
            deadline: Duration::from_secs(1),
        };
        let failure = sandbox_failure(&err);
        assert_eq!(failure.code, Some("BOT-X003"));
        assert_eq!(failure.exit, 1);
        assert!(failure.fix.is_some());
    }
}
