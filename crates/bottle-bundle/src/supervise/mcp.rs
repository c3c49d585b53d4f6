//! JSON-RPC 2.0 and the MCP methods supervise answers, independent of HTTP.
//!
//! [`handle_body`] takes one POST body and returns the JSON to send back, or
//! `None` when the body held only notifications or responses (HTTP 202).
//! Nothing here panics on input: every malformed message gets a JSON-RPC
//! error object (`-32700` parse error, `-32600` invalid request, `-32601`
//! unknown method, `-32602` bad params).

use serde_json::{Map, Value, json};

/// JSON-RPC: the body is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: the params do not fit the method.
pub const INVALID_PARAMS: i64 = -32602;

/// The protocol version answered when the client asks for one we do not know.
pub const PROTOCOL_VERSION: &str = "2025-03-26";
/// Versions whose request/response shapes this server speaks.
const KNOWN_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];
/// Most messages in one batch.
pub const MAX_BATCH: usize = 64;

/// What the agent is told when it connects.
const INSTRUCTIONS: &str = "This bottle's network and git access are limited to what the operator allowed. \
When you need something you cannot do alone (reach a new host, push a ref), ask with request_egress or \
request_push, then poll request_status with the id you get: nothing is approved until the operator says so, \
and nothing is approved by timeout. Use notify to tell the operator something.";

/// What a tool call needs from the rest of supervise: the request queue
/// and the live policy.
pub trait Tools {
    /// Runs tool `name` with validated-as-object `args`. `Err(Params)` is a
    /// protocol error (-32602: unknown tool, missing or ill-typed
    /// argument); `Err(Tool)` is a failed call the agent should read.
    fn call(&self, name: &str, args: &Map<String, Value>) -> Result<Value, CallError>;
}

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The call itself is malformed (JSON-RPC -32602).
    Params(String),
    /// The tool ran and refused (tool result with `isError`).
    Tool(String),
}

/// A successful tool result carrying `text` for the model and `data` for
/// clients that read structured content.
pub fn tool_result(text: &str, data: Value) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": data,
        "isError": false,
    })
}

fn tool_failure(text: &str) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
    })
}

/// The tool catalogue (`tools/list`).
pub fn tool_list() -> Value {
    let string = |d: &str| json!({"type": "string", "description": d});
    json!({"tools": [
        {
            "name": "request_egress",
            "description": "Ask the operator to allow this bottle to reach a new host through its proxy. Returns a request id at once; the host is reachable only after the operator approves (poll request_status).",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "host": string("The host name, e.g. docs.rs (no scheme, port or path)."),
                    "reason": string("Why you need it, for the operator."),
                },
                "required": ["host", "reason"],
            },
        },
        {
            "name": "request_push",
            "description": "Ask the operator to allow pushes of one ref to a repository behind git-gate (a fast-forward update or a new ref; not a force push or a deletion). Returns a request id at once; poll request_status. Once approved, push again.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "repo": string("The repository's name as git-gate serves it."),
                    "ref": string("The ref to push: a branch name like fix-1 or a full ref name like refs/heads/fix-1."),
                    "reason": string("Why, for the operator."),
                },
                "required": ["repo", "ref", "reason"],
            },
        },
        {
            "name": "notify",
            "description": "Show the operator a message (it appears in `bottle requests`). Returns a request id; the operator acknowledges it by approving.",
            "inputSchema": {
                "type": "object",
                "properties": {"message": string("The message.")},
                "required": ["message"],
            },
        },
        {
            "name": "request_status",
            "description": "The status of a request made with request_egress, request_push or notify: pending, approved or denied.",
            "inputSchema": {
                "type": "object",
                "properties": {"id": string("The request id.")},
                "required": ["id"],
            },
        },
    ]})
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn success(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// Answers one POST body.
pub fn handle_body(body: &[u8], tools: &dyn Tools) -> Option<Value> {
    let parsed: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Some(error(
                Value::Null,
                PARSE_ERROR,
                &format!("parse error: {e}"),
            ));
        }
    };
    match parsed {
        Value::Array(batch) => {
            if batch.is_empty() {
                return Some(error(Value::Null, INVALID_REQUEST, "empty batch"));
            }
            if batch.len() > MAX_BATCH {
                return Some(error(
                    Value::Null,
                    INVALID_REQUEST,
                    &format!("batch of {} messages (at most {MAX_BATCH})", batch.len()),
                ));
            }
            let answers: Vec<Value> = batch
                .into_iter()
                .filter_map(|m| handle_message(m, tools))
                .collect();
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        message => handle_message(message, tools),
    }
}

/// Answers one message; `None` for notifications and responses.
pub fn handle_message(message: Value, tools: &dyn Tools) -> Option<Value> {
    let Value::Object(mut obj) = message else {
        return Some(error(
            Value::Null,
            INVALID_REQUEST,
            "a JSON-RPC message must be an object",
        ));
    };
    let id = obj.remove("id");
    let id_ok = matches!(
        id,
        None | Some(Value::String(_) | Value::Number(_) | Value::Null)
    );
    let reply_id = if id_ok {
        id.clone().unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") || !id_ok {
        return Some(error(
            reply_id,
            INVALID_REQUEST,
            "not a JSON-RPC 2.0 request (need \"jsonrpc\": \"2.0\", a string method and a string or number id)",
        ));
    }
    let Some(method) = obj
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        if obj.contains_key("result") || obj.contains_key("error") {
            // A response to a server request: we send none, so ignore it.
            return None;
        }
        return Some(error(reply_id, INVALID_REQUEST, "missing method"));
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => {
            return id.map(|id| error(id, INVALID_PARAMS, "params must be an object"));
        }
    };
    // A request without an id is a notification: never answered.
    let id = id?;
    let answer = match method.as_str() {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(tool_list()),
        "tools/call" => call(&params, tools),
        m if m.starts_with("notifications/") => Ok(json!({})),
        m => Err((METHOD_NOT_FOUND, format!("method not found: {m}"))),
    };
    Some(match answer {
        Ok(result) => success(id, result),
        Err((code, message)) => error(id, code, &message),
    })
}

fn initialize(params: &Map<String, Value>) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| KNOWN_VERSIONS.contains(v))
        .unwrap_or(PROTOCOL_VERSION);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "bottle-supervise", "version": env!("CARGO_PKG_VERSION")},
        "instructions": INSTRUCTIONS,
    })
}

fn call(params: &Map<String, Value>, tools: &dyn Tools) -> Result<Value, (i64, String)> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err((INVALID_PARAMS, "tools/call needs a string `name`".into()));
    };
    let empty = Map::new();
    let args = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(a)) => a,
        Some(_) => return Err((INVALID_PARAMS, "`arguments` must be an object".into())),
    };
    match tools.call(name, args) {
        Ok(result) => Ok(result),
        Err(CallError::Params(m)) => Err((INVALID_PARAMS, m)),
        Err(CallError::Tool(m)) => Ok(tool_failure(&m)),
    }
}

/// Reads a required string argument.
pub fn arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, CallError> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(CallError::Params(format!(
            "argument `{name}` must be a string"
        ))),
        None => Err(CallError::Params(format!("missing argument `{name}`"))),
    }
}

/// Reads an optional string argument (`""` when absent).
pub fn opt_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, CallError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(""),
        Some(_) => arg(args, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;
    impl Tools for Echo {
        fn call(&self, name: &str, args: &Map<String, Value>) -> Result<Value, CallError> {
            match name {
                "echo" => Ok(tool_result(arg(args, "text")?, json!({}))),
                "fail" => Err(CallError::Tool("no".into())),
                other => Err(CallError::Params(format!("unknown tool {other}"))),
            }
        }
    }

    fn one(body: &str) -> Value {
        handle_body(body.as_bytes(), &Echo).unwrap()
    }

    #[test]
    fn malformed_messages_get_errors() {
        assert_eq!(one("{").pointer("/error/code"), Some(&json!(PARSE_ERROR)));
        assert_eq!(
            one("[]").pointer("/error/code"),
            Some(&json!(INVALID_REQUEST))
        );
        assert_eq!(
            one("3").pointer("/error/code"),
            Some(&json!(INVALID_REQUEST))
        );
        assert_eq!(
            one(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#).pointer("/error/code"),
            Some(&json!(INVALID_REQUEST))
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#).pointer("/error/code"),
            Some(&json!(INVALID_REQUEST))
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":1,"method":"nope"}"#).pointer("/error/code"),
            Some(&json!(METHOD_NOT_FOUND))
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#)
                .pointer("/error/code"),
            Some(&json!(INVALID_PARAMS))
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"zz"}}"#)
                .pointer("/error/code"),
            Some(&json!(INVALID_PARAMS))
        );
        assert_eq!(
            one(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":3}}}"#)
                .pointer("/error/code"),
            Some(&json!(INVALID_PARAMS))
        );
    }

    #[test]
    fn notifications_and_responses_are_not_answered() {
        assert_eq!(
            handle_body(
                br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                &Echo
            ),
            None
        );
        assert_eq!(
            handle_body(br#"{"jsonrpc":"2.0","id":5,"result":{}}"#, &Echo),
            None
        );
        assert_eq!(
            handle_body(
                br#"[{"jsonrpc":"2.0","method":"notifications/cancelled"}]"#,
                &Echo
            ),
            None
        );
    }

    #[test]
    fn batches_answer_each_request() {
        let out = one(
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":"b","method":"nope"}]"#,
        );
        let arr = out.as_array().unwrap();
        assert_eq!(arr.len(), 2);
        assert_eq!(arr[0]["id"], 1);
        assert_eq!(arr[0]["result"], json!({}));
        assert_eq!(arr[1]["id"], "b");
        assert_eq!(arr[1]["error"]["code"], METHOD_NOT_FOUND);
    }

    #[test]
    fn initialize_echoes_known_versions_only() {
        let v = one(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05"}}"#,
        );
        assert_eq!(v["result"]["protocolVersion"], "2024-11-05");
        assert_eq!(v["result"]["capabilities"]["tools"]["listChanged"], false);
        let v = one(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}"#,
        );
        assert_eq!(v["result"]["protocolVersion"], PROTOCOL_VERSION);
    }

    #[test]
    fn tool_failures_are_results_the_model_reads() {
        let v = one(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fail","arguments":{}}}"#,
        );
        assert_eq!(v["result"]["isError"], true);
        assert_eq!(v["result"]["content"][0]["text"], "no");
        let names: Vec<String> = tool_list()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            ["request_egress", "request_push", "notify", "request_status"]
        );
    }
}
