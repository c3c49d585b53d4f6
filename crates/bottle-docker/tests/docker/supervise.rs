//! supervise through the docker backend: the agent asks for a host over
//! MCP (busybox `wget --post-data`), the request lands in the host's state
//! dir, the operator approves it through `bottle_core::requests`, and the
//! running proxy opens that host (no restart), with an audit line.
//!
//! The proxy is probed with `CONNECT` and plain HTTP inside the tunnel,
//! which it answers from the policy alone, before any name is resolved (a
//! denied host with its denial, an allowed one with the refusal of plain
//! HTTP to a TLS port): no traffic leaves this machine.

use std::time::Duration;

use bottle_core::requests::{self, Status};
use bottle_test_support::eventually;

use crate::support::{self, name, sh};

const WANTED: &str = "wanted.bottle.test";

/// One JSON-RPC message to supervise from inside the agent; the reply body.
fn mcp(bottle: &dyn bottle_core::Bottle, message: &str) -> String {
    let out = sh(
        bottle,
        &format!(
            "wget -Y off -qO- --header 'Content-Type: application/json' --header 'Accept: application/json, text/event-stream' --post-data '{message}' \"$MCP_SUPERVISE_URL\""
        ),
    );
    assert_eq!(
        out.exit_code,
        0,
        "wget to supervise failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The proxy's answer to `CONNECT host:443` and a plain-HTTP request
/// inside the tunnel, asked from the agent: a denied host's tunnel carries
/// `Blocked by bottle`. The client keeps its side open for a second: a
/// client that half-closes right after the request can lose the answer to
/// the proxy's connection teardown, which showed as an empty answer under
/// load.
fn tunnel_answer(bottle: &dyn bottle_core::Bottle, host: &str) -> String {
    let out = sh(
        bottle,
        &format!(
            "proxy=${{HTTP_PROXY#http://}}; (printf 'CONNECT {host}:443 HTTP/1.1\\r\\nHost: {host}:443\\r\\n\\r\\nGET / HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n'; sleep 1) | timeout 5 nc -w 2 ${{proxy%:*}} ${{proxy##*:}}"
        ),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_approved_host_opens_in_the_running_proxy() {
    let Some(fx) = support::setup("an_approved_host_opens_in_the_running_proxy") else {
        return;
    };
    let bottle_name = name("supervise");
    let spec = fx.spec(&bottle_name);
    let queue = requests::requests_dir(&spec.state_dir);
    let (_guard, bottle) = fx.start(&bottle_name);
    let bottle = &*bottle;

    // Provisioning told the agent where supervise is.
    let url = String::from_utf8_lossy(&sh(bottle, "echo \"$MCP_SUPERVISE_URL\"").stdout)
        .trim()
        .to_string();
    assert!(
        url.starts_with("http://") && url.ends_with(":9100/mcp"),
        "{url}"
    );
    let config =
        String::from_utf8_lossy(&sh(bottle, "cat /etc/bottle/mcp.json").stdout).into_owned();
    assert!(config.contains(&url), "{config}");

    let init = mcp(
        bottle,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"busybox","version":"1"}}}"#,
    );
    assert!(init.contains(r#""serverInfo""#), "{init}");
    let asked = mcp(
        bottle,
        &format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"request_egress","arguments":{{"host":"{WANTED}","reason":"fetch the docs"}}}}}}"#
        ),
    );
    assert!(asked.contains("pending operator approval"), "{asked}");

    // The request is on the host, pending; the proxy still refuses.
    let pending = requests::pending(&queue).unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let id = pending[0].id.clone();
    assert_eq!(
        pending[0].ask,
        requests::Ask::Egress {
            host: WANTED.into()
        }
    );
    assert!(asked.contains(&id), "{asked}");
    let before = tunnel_answer(bottle, WANTED);
    assert!(
        before.contains("Blocked by bottle") && before.contains("request_egress"),
        "before approval: {before:?}"
    );

    requests::decide(&queue, &id, Status::Approved, None).unwrap();
    let mut after = String::new();
    let opened = eventually(Duration::from_secs(10), || {
        after = tunnel_answer(bottle, WANTED);
        after.starts_with("HTTP/1.1 200") && !after.contains("Blocked by bottle")
    });
    assert!(opened, "after approval: {after:?}");

    let status = mcp(
        bottle,
        &format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"request_status","arguments":{{"id":"{id}"}}}}}}"#
        ),
    );
    assert!(status.contains("approved"), "{status}");

    let audit =
        bottle_bundle::read_audit(&spec.state_dir.join("logs").join("audit.jsonl")).unwrap();
    let approval = audit
        .iter()
        .find(|r| r.daemon == "supervise" && r.reason == "operator_approved")
        .unwrap_or_else(|| panic!("no operator_approved line in {audit:?}"));
    assert_eq!(approval.host, WANTED);
    assert_eq!(approval.decision, bottle_bundle::Decision::Allow);
    // The launch made the audit marker; a bundle that writes fine keeps it.
    assert_eq!(
        bottle_core::audit_files::audit_health(&spec.state_dir.join("logs")),
        bottle_core::audit_files::AuditHealth::Ok
    );
}
