//! A tool call, its result, and the evidence hash that binds them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a tool call runs inside the box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// A program and its arguments, run without a shell (`argv[0]` is
    /// looked up on the box's `PATH`).
    Argv(Vec<String>),
    /// One of the in-box agent's built-in tools ([`BUILTIN_TOOLS`]) with
    /// its parameters.
    Tool {
        /// The tool's name.
        name: String,
        /// Its parameters, a JSON object.
        params: serde_json::Value,
    },
}

/// The tools the in-box agent answers itself, without a program:
/// - `read_file {path}`: the file's bytes on stdout;
/// - `write_file {path, content, mode?}`: writes `content` (UTF-8 text),
///   creating or truncating the file, with `mode` (octal string, default
///   `"644"`) for a new file;
/// - `list_dir {path}`: one JSON object per entry on stdout
///   (`{"name","kind","size"}`, sorted by name).
pub const BUILTIN_TOOLS: [&str; 3] = ["read_file", "write_file", "list_dir"];

/// One tool call: what to run, in which environment, and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The program or built-in tool.
    pub command: Command,
    /// Variables added to the agent's environment for this call only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory inside the box (`None`: the agent's home, or
    /// `/` when it has none).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Bytes given to the program's stdin, which then sees EOF (base64 in
    /// JSON).
    #[serde(default, with = "base64_bytes")]
    pub stdin: Vec<u8>,
    /// How long the call may run before it is killed.
    #[serde(with = "duration_ms")]
    pub deadline: Duration,
}

impl ToolCall {
    /// A call of `argv` with no extra environment, no stdin and
    /// [`DEFAULT_DEADLINE`].
    pub fn argv<I, S>(argv: I) -> ToolCall
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ToolCall {
            command: Command::Argv(argv.into_iter().map(Into::into).collect()),
            env: BTreeMap::new(),
            cwd: None,
            stdin: Vec::new(),
            deadline: DEFAULT_DEADLINE,
        }
    }

    /// A call of a built-in tool.
    pub fn tool(name: impl Into<String>, params: serde_json::Value) -> ToolCall {
        ToolCall {
            command: Command::Tool {
                name: name.into(),
                params,
            },
            ..ToolCall::argv(Vec::<String>::new())
        }
    }

    /// A short description for logs and errors: the argv joined by spaces,
    /// or the tool's name. Agent-chosen text: sanitize before printing.
    pub fn summary(&self) -> String {
        match &self.command {
            Command::Argv(argv) => argv.join(" "),
            Command::Tool { name, .. } => format!("tool {name}"),
        }
    }
}

/// The deadline of a call that names none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The program's exit code (128 + n when signal n ended it).
    pub exit_code: i32,
    /// Everything it wrote to stdout (up to [`OUTPUT_CAP`]; base64 in
    /// JSON).
    #[serde(with = "base64_bytes")]
    pub stdout: Vec<u8>,
    /// Everything it wrote to stderr (up to [`OUTPUT_CAP`]; base64 in
    /// JSON).
    #[serde(with = "base64_bytes")]
    pub stderr: Vec<u8>,
    /// Whether stdout or stderr was cut at [`OUTPUT_CAP`].
    pub truncated: bool,
    /// Wall time inside the box, from spawn to exit.
    #[serde(with = "duration_ms")]
    pub duration: Duration,
    /// `sha256:<hex>` over the call and this result ([`evidence_hash`]).
    pub evidence_hash: String,
}

/// The most of each output stream a call returns; the rest is dropped and
/// [`ToolResult::truncated`] set.
pub const OUTPUT_CAP: usize = 16 << 20;

/// The SHA-256 that binds a call to its result, as `sha256:<hex>`.
///
/// It is computed on the host from what was sent and what came back, never
/// taken from the box. The input is a domain tag followed by each field as
/// an 8-byte big-endian length and its bytes, so that no two different
/// calls or results share an encoding:
///
/// `"bottle-evidence-v1"`, the call as the JSON bottle serializes it
/// (fields in declaration order, `env` sorted, `stdin` in base64), the exit
/// code as decimal text, stdout, stderr, and `"1"`/`"0"` for truncated.
pub fn evidence_hash(
    call: &ToolCall,
    exit_code: i32,
    stdout: &[u8],
    stderr: &[u8],
    truncated: bool,
) -> String {
    let call_json = serde_json::to_vec(call).unwrap_or_default();
    let exit = exit_code.to_string();
    let truncated: &[u8] = if truncated { b"1" } else { b"0" };
    let mut hasher = Sha256::new();
    for field in [
        b"bottle-evidence-v1".as_slice(),
        &call_json,
        exit.as_bytes(),
        stdout,
        stderr,
        truncated,
    ] {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field);
    }
    format!("sha256:{}", hex(&hasher.finalize()))
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes as standard base64 text in JSON.
pub(crate) mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(value))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// Durations as whole milliseconds in JSON.
pub(crate) mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evidence_hash_changes_with_every_field() {
        let call = ToolCall::argv(["echo", "hi"]);
        let base = evidence_hash(&call, 0, b"hi\n", b"", false);
        assert!(base.starts_with("sha256:") && base.len() == 7 + 64);
        let mut other_env = call.clone();
        other_env.env.insert("A".into(), "1".into());
        let mut other_stdin = call.clone();
        other_stdin.stdin = b"x".to_vec();
        for different in [
            evidence_hash(&ToolCall::argv(["echo", "hi "]), 0, b"hi\n", b"", false),
            evidence_hash(&other_env, 0, b"hi\n", b"", false),
            evidence_hash(&other_stdin, 0, b"hi\n", b"", false),
            evidence_hash(&call, 1, b"hi\n", b"", false),
            evidence_hash(&call, 0, b"hi", b"\n", false),
            evidence_hash(&call, 0, b"hi\n", b"", true),
        ] {
            assert_ne!(different, base);
        }
        assert_eq!(evidence_hash(&call, 0, b"hi\n", b"", false), base);
    }

    #[test]
    fn the_evidence_hash_is_pinned() {
        // The same value as computed independently in Python (docs/SANDBOX.md).
        let call = ToolCall::argv(["echo", "hi"]);
        expect_test::expect![
            "sha256:60a098866ca0d86f27aeae309c6b93d043b514de5c537b1170f5613bd9a5b0e2"
        ]
        .assert_eq(&evidence_hash(&call, 0, b"hi\n", b"", false));
    }
}
