//! Text the agent wrote (supervise requests, audit log lines) reaches the
//! operator's terminal escaped by `bottle requests` and `bottle logs`: no C0
//! or C1 control, DEL, bidirectional override or isolate, line separator,
//! invisible format character (zero-width, word joiner, byte-order mark,
//! soft hyphen, tags) or private-use character comes out raw
//! (`bottle_core::display`).

use std::path::Path;

use bottle_core::requests::{self, Ask, REQUESTS_VERSION, Request, Status};
use bottle_test_support::temp_state_root;

use crate::bottle;

/// Characters that act on a terminal, each of which the tests plant.
const RAW: &[char] = &[
    '\u{1b}',
    '\u{7}',
    '\u{7f}',
    '\u{9b}',
    '\u{9c}',
    '\u{9d}',
    '\u{202e}',
    '\u{2066}',
    '\u{2069}',
    '\u{200f}',
    '\u{61c}',
    '\u{2028}',
    '\u{2029}',
    '\r',
    '\t',
    '\u{200b}',
    '\u{200d}',
    '\u{2060}',
    '\u{feff}',
    '\u{ad}',
    '\u{e0068}',
    '\u{e007f}',
    '\u{e000}',
    '\u{f0000}',
];

/// A screen clear through the C1 CSI byte, then a right-to-left override.
const HOSTILE_MESSAGE: &str = "\u{9b}2J\u{202e}moc.live";
/// An OSC 8 hyperlink, an isolate, a line separator, BEL and DEL, then
/// what does not show: a zero-width space and joiner, a word joiner, a
/// byte-order mark, a soft hyphen, "h" and CANCEL TAG in tag characters,
/// and private-use characters of the BMP and of plane 15.
const HOSTILE_REASON: &str = "\u{1b}]8;;http://x/\u{1b}\\ok\u{2066}\u{2028}\u{7}\u{7f}\u{200b}\u{200d}\u{2060}\u{feff}\u{ad}\u{e0068}\u{e007f}\u{e000}\u{f0000}";
/// An egress host with bidi marks and an OSC title through the C1 bytes.
const HOSTILE_HOST: &str = "docs.rs\u{200f}\u{61c}\u{9d}0;t\u{9c}";

fn assert_no_raw(text: &str) {
    for c in RAW {
        assert!(!text.contains(*c), "raw {c:?} in output:\n{text:?}");
    }
}

fn plant_request(state: &Path, n: u64, ask: Ask) {
    let dir = requests::requests_dir(&state.join("bottle").join("claude"));
    std::fs::create_dir_all(&dir).unwrap();
    requests::write_request(
        &dir,
        &Request {
            v: REQUESTS_VERSION,
            id: format!("claude-{n}"),
            bottle: "bot-bottle-claude".into(),
            ask,
            reason: HOSTILE_REASON.into(),
            created: bottle_core::time::now_rfc3339(),
            status: Status::Pending,
            decision_reason: None,
        },
    )
    .unwrap();
}

fn plant_hostile_requests(state: &Path) {
    plant_request(
        state,
        1,
        Ask::Notify {
            message: HOSTILE_MESSAGE.into(),
        },
    );
    plant_request(
        state,
        2,
        Ask::Egress {
            host: HOSTILE_HOST.into(),
        },
    );
}

#[test]
fn requests_table_shows_agent_text_escaped() {
    let state = temp_state_root();
    plant_hostile_requests(state.path());
    let output = bottle(state.path()).arg("requests").output().unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_no_raw(&text);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.contains(r"\u{9b}2J\u{202e}moc.live"), "{text}");
    assert!(
        text.contains(r"\u{1b}]8;;http://x/\u{1b}\ok\u{2066}\u{2028}\u{7}\u{7f}"),
        "{text}"
    );
    assert!(
        text.contains(r"docs.rs\u{200f}\u{61c}\u{9d}0;t\u{9c}"),
        "{text}"
    );
}

#[test]
fn requests_json_escapes_agent_text_and_keeps_its_value() {
    let state = temp_state_root();
    plant_hostile_requests(state.path());
    let output = bottle(state.path())
        .args(["requests", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_no_raw(&text);
    assert!(text.contains(r"\u009b2J\u202emoc.live"), "{text}");
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list[0]["detail"]["message"], HOSTILE_MESSAGE);
    assert_eq!(list[0]["reason"], HOSTILE_REASON);
    assert_eq!(list[1]["detail"]["host"], HOSTILE_HOST);
}

#[test]
fn approving_shows_the_agent_host_escaped() {
    let state = temp_state_root();
    plant_hostile_requests(state.path());
    let output = bottle(state.path())
        .args(["approve", "claude-2"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_no_raw(&text);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains(r"docs.rs\u{200f}\u{61c}\u{9d}0;t\u{9c} is allowed"),
        "{text}"
    );
}

#[test]
fn logs_json_escape_audit_lines_json_or_not() {
    let state = temp_state_root();
    let logs = state.path().join("bottle").join("claude").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let record = serde_json::json!({
        "decision": "deny",
        "host": HOSTILE_HOST,
        "path": format!("/{HOSTILE_MESSAGE}{HOSTILE_REASON}"),
    });
    // serde_json writes C1, DEL, bidi and separators raw; a tab and a
    // carriage return between tokens are still one valid JSON line.
    let json_line = serde_json::to_string(&record)
        .unwrap()
        .replacen(",", "\t,\r", 1);
    let broken_line = "not json \u{1b}[2J\u{1b}]0;owned\u{7}\rdecision: allow\u{9b}K";
    std::fs::write(
        logs.join("audit.jsonl"),
        format!("{json_line}\n{broken_line}\n"),
    )
    .unwrap();

    let output = bottle(state.path())
        .args(["logs", "--json", "claude"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_no_raw(&text);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let parsed: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(parsed, record);
    assert!(lines[0].contains(r"\u009b2J\u202emoc.live"), "{text}");
    assert!(
        lines[0]
            .contains(r"\u200b\u200d\u2060\ufeff\u00ad\udb40\udc68\udb40\udc7f\ue000\udb80\udc00"),
        "{text}"
    );
    assert_eq!(
        lines[1],
        r"not json \u{1b}[2J\u{1b}]0;owned\u{7}\u{d}decision: allow\u{9b}K"
    );
}

#[test]
fn readable_logs_escape_every_agent_chosen_field() {
    let state = temp_state_root();
    let logs = state.path().join("bottle").join("claude").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let record = serde_json::json!({
        "time": format!("2025-01-02T03:04:05Z{HOSTILE_MESSAGE}"),
        "decision": "deny",
        "method": HOSTILE_REASON,
        "host": HOSTILE_HOST,
        "port": 443,
        "path": format!("/{HOSTILE_MESSAGE}\n{HOSTILE_REASON}"),
        "status": 403,
        "reason": format!("host_not_allowed{HOSTILE_MESSAGE}"),
    });
    let broken_line = "not json \u{1b}[2J\u{1b}]0;owned\u{7}\rdecision: allow\u{9b}K";
    std::fs::write(
        logs.join("audit.jsonl"),
        format!("{record}\n{broken_line}\n"),
    )
    .unwrap();
    let output = bottle(state.path())
        .args(["logs", "claude"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_no_raw(&text);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(r"docs.rs\u{200f}\u{61c}\u{9d}0;t\u{9c}:443"),
        "{text}"
    );
    assert!(
        lines[0].contains(r"\u{9b}2J\u{202e}moc.live\u{a}\u{1b}]8;;"),
        "{text}"
    );
    assert!(!lines[0].starts_with('{'), "not the JSON form: {text}");
    assert_eq!(
        lines[1],
        r"not json \u{1b}[2J\u{1b}]0;owned\u{7}\u{d}decision: allow\u{9b}K"
    );
}
