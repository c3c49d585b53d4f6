//! The built-in tools (`bottle_core::sandbox::BUILTIN_TOOLS`), answered
//! without starting a program. An unknown tool or a bad parameter is an
//! error of the call; a file that cannot be read or written is the tool's
//! failure (exit code 1, the reason on stderr), as it would be for `cat`.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::run::{Captured, Finished};

/// Runs built-in tool `name`; relative paths are under `cwd` (or `/`).
pub(crate) fn run(name: &str, params: &Value, cwd: Option<&str>) -> Result<Finished, String> {
    let base = Path::new(cwd.unwrap_or("/"));
    let outcome = match name {
        "read_file" => std::fs::read(path(params, base)?).map_err(|err| err.to_string()),
        "write_file" => {
            let content = string(params, "content")?;
            let mode = match params.get("mode") {
                None => 0o644,
                Some(Value::String(text)) => u32::from_str_radix(text, 8)
                    .ok()
                    .filter(|mode| *mode <= 0o7777)
                    .ok_or_else(|| {
                        format!("write_file: mode {text:?} is not an octal file mode")
                    })?,
                Some(_) => {
                    return Err("write_file: mode must be an octal string like \"644\"".into());
                }
            };
            write(&path(params, base)?, content.as_bytes(), mode)
                .map(|()| Vec::new())
                .map_err(|err| err.to_string())
        }
        "list_dir" => list(&path(params, base)?).map_err(|err| err.to_string()),
        other => {
            return Err(format!(
                "no built-in tool is named {other:?} (there are {})",
                bottle_core::sandbox::BUILTIN_TOOLS.join(", ")
            ));
        }
    };
    Ok(match outcome {
        Ok(stdout) => finished(0, stdout, Vec::new()),
        Err(why) => finished(1, Vec::new(), format!("{name}: {why}\n").into_bytes()),
    })
}

fn finished(exit_code: i32, stdout: Vec<u8>, stderr: Vec<u8>) -> Finished {
    let cap = |bytes: Vec<u8>| {
        let truncated = bytes.len() > bottle_core::sandbox::call::OUTPUT_CAP;
        let mut bytes = bytes;
        bytes.truncate(bottle_core::sandbox::call::OUTPUT_CAP);
        Captured { bytes, truncated }
    };
    Finished {
        exit_code,
        stdout: cap(stdout),
        stderr: cap(stderr),
        timed_out: false,
    }
}

fn string<'a>(params: &'a Value, key: &str) -> Result<&'a str, String> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the parameter {key:?} (a string) is missing"))
}

fn path(params: &Value, base: &Path) -> Result<PathBuf, String> {
    Ok(base.join(string(params, "path")?))
}

fn write(path: &Path, content: &[u8], mode: u32) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    file.write_all(content)
}

fn list(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let kind = if meta.is_dir() {
            "dir"
        } else if meta.file_type().is_symlink() {
            "symlink"
        } else if meta.is_file() {
            "file"
        } else {
            "other"
        };
        entries.push((
            entry.file_name().to_string_lossy().into_owned(),
            kind,
            meta.len(),
            meta.permissions().mode() & 0o7777,
        ));
    }
    entries.sort();
    let mut out = Vec::new();
    for (name, kind, size, mode) in entries {
        let line = json!({"name": name, "kind": kind, "size": size, "mode": format!("{mode:o}")});
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_then_list() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().to_str();
        let wrote = run(
            "write_file",
            &json!({"path": "a.txt", "content": "hé\n", "mode": "600"}),
            cwd,
        )
        .unwrap();
        assert_eq!(wrote.exit_code, 0);
        let read = run("read_file", &json!({"path": "a.txt"}), cwd).unwrap();
        assert_eq!(read.stdout.bytes, "hé\n".as_bytes());
        let listed = run("list_dir", &json!({"path": "."}), cwd).unwrap();
        assert_eq!(
            String::from_utf8(listed.stdout.bytes).unwrap(),
            "{\"kind\":\"file\",\"mode\":\"600\",\"name\":\"a.txt\",\"size\":4}\n"
        );
    }

    #[test]
    fn a_missing_file_is_the_tools_failure_and_a_bad_call_an_error() {
        let missing = run("read_file", &json!({"path": "/nonexistent/x"}), None).unwrap();
        assert_eq!(missing.exit_code, 1);
        assert!(String::from_utf8_lossy(&missing.stderr.bytes).starts_with("read_file: "));
        assert!(
            run("rm_rf", &json!({}), None)
                .unwrap_err()
                .contains("no built-in tool")
        );
        assert!(
            run("read_file", &json!({}), None)
                .unwrap_err()
                .contains("\"path\"")
        );
        assert!(
            run(
                "write_file",
                &json!({"path": "x", "content": "", "mode": "999"}),
                None
            )
            .unwrap_err()
            .contains("octal")
        );
    }
}
