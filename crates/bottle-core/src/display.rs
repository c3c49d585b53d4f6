//! Making agent-controlled text safe to show on the operator's terminal.
//!
//! Request paths and hosts in the audit log, supervise reasons and messages,
//! repository and ref names: the agent chooses them, and the CLI prints them.
//! A terminal acts on some characters instead of showing them: C0 and C1
//! controls (ESC and the single-byte CSI `U+009B`, OSC `U+009D` and ST
//! `U+009C` start sequences that move the cursor, clear the screen, set the
//! title or plant hyperlinks), DEL, bidirectional overrides and isolates
//! (which make text read in another order than it is stored) and the line and
//! paragraph separators (which some terminals and viewers break lines on).
//! Every one of them is shown here as a visible escape instead, so the
//! operator sees that something was there and nothing acts on the terminal.
//!
//! Text output uses Rust's form, `\u{1b}` (lowercase hex, no padding), for
//! every such character; JSON output uses JSON's own `\u001b`, so it still
//! parses to the same value. A backslash is left as it is: an agent that
//! writes a literal `\u{1b}` can make text look escaped, but cannot make it
//! act.

use std::borrow::Cow;

/// Whether a terminal could act on `c` rather than show it: C0 controls,
/// DEL, C1 controls, bidirectional marks, overrides and isolates, and the
/// Unicode line and paragraph separators.
pub fn acts_on_terminal(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// `text` with every character [`acts_on_terminal`] replaced by its visible
/// escape, `\u{XXXX}` (lowercase hex, no padding: ESC is `\u{1b}`). Newlines
/// and tabs are escaped too, so the result is always one line: a caller whose
/// output has its own line structure escapes each piece it puts in it.
/// Everything else, other UTF-8 included, is unchanged; escaping twice gives
/// the same as escaping once.
pub fn escape_for_terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts_on_terminal) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if acts_on_terminal(c) {
            escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// `json`, which must be JSON text (as `serde_json` writes it), with every
/// character [`acts_on_terminal`] written so that none reaches the terminal
/// raw and the text still parses to the same value.
///
/// In JSON text a raw control character can only be whitespace between
/// tokens (a string holds C0 controls only escaped), so a raw tab or carriage
/// return becomes a space and a newline, the output's own line structure,
/// stays. Every other such character can only be inside a string, where its
/// `\uXXXX` escape (all of them are in the Basic Multilingual Plane) means
/// the same character. `serde_json` already escapes C0 controls in strings
/// but leaves DEL, C1, bidirectional characters and U+2028/U+2029 raw.
pub fn escape_json_for_terminal(json: &str) -> Cow<'_, str> {
    if !json.chars().any(|c| c != '\n' && acts_on_terminal(c)) {
        return Cow::Borrowed(json);
    }
    let mut escaped = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '\n' => escaped.push('\n'),
            '\t' | '\r' => escaped.push(' '),
            c if acts_on_terminal(c) => {
                escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile strings an agent could plant, and what the operator sees.
    const HOSTILE: &[(&str, &str, &str)] = &[
        // (input, text form, JSON string-content form)
        ("\u{1b}[2J", r"\u{1b}[2J", r"\u001b[2J"),
        ("\u{9b}31m", r"\u{9b}31m", r"\u009b31m"),
        (
            "\u{1b}]8;;http://evil/\u{1b}\\click\u{1b}]8;;\u{1b}\\",
            r"\u{1b}]8;;http://evil/\u{1b}\click\u{1b}]8;;\u{1b}\",
            r"\u001b]8;;http://evil/\u001b\\click\u001b]8;;\u001b\\",
        ),
        (
            "\u{9d}0;title\u{9c}",
            r"\u{9d}0;title\u{9c}",
            r"\u009d0;title\u009c",
        ),
        ("txt.\u{202e}exe", r"txt.\u{202e}exe", r"txt.\u202eexe"),
        (
            "\u{2066}admin\u{2069}",
            r"\u{2066}admin\u{2069}",
            r"\u2066admin\u2069",
        ),
        (
            "a\u{200e}b\u{200f}c\u{61c}",
            r"a\u{200e}b\u{200f}c\u{61c}",
            r"a\u200eb\u200fc\u061c",
        ),
        (
            "line\u{2028}next\u{2029}",
            r"line\u{2028}next\u{2029}",
            r"line\u2028next\u2029",
        ),
        ("bell\u{7}", r"bell\u{7}", r"bell\u0007"),
        ("del\u{7f}", r"del\u{7f}", r"del\u007f"),
        ("a\nb\tc\rd", r"a\u{a}b\u{9}c\u{d}d", r"a\nb\tc\rd"),
        ("café ☕ 🦀 日本", "café ☕ 🦀 日本", "café ☕ 🦀 日本"),
        ("", "", ""),
    ];

    #[test]
    fn text_form_shows_every_hostile_character_as_an_escape() {
        for (input, text, _) in HOSTILE {
            let escaped = escape_for_terminal(input);
            assert_eq!(escaped, *text, "{input:?}");
            assert!(!escaped.chars().any(acts_on_terminal), "{input:?}");
            assert_eq!(escape_for_terminal(&escaped), escaped, "idempotent");
        }
    }

    #[test]
    fn json_form_escapes_what_serde_json_leaves_raw_and_keeps_the_value() {
        for (input, _, json) in HOSTILE {
            let value = serde_json::json!({ "path": input, "list": [input] });
            let pretty = serde_json::to_string_pretty(&value).unwrap();
            let escaped = escape_json_for_terminal(&pretty);
            assert!(
                !escaped.chars().any(|c| c != '\n' && acts_on_terminal(c)),
                "{input:?}: {escaped}"
            );
            assert!(
                escaped.contains(&format!("\"path\": \"{json}\"")),
                "{escaped}"
            );
            let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
            assert_eq!(back, value, "{input:?}");
        }
    }

    #[test]
    fn raw_whitespace_between_json_tokens_becomes_a_space() {
        let line = "{\"a\":1\r,\t\"b\":\"\u{9b}\"}";
        let escaped = escape_json_for_terminal(line);
        assert_eq!(escaped, "{\"a\":1 , \"b\":\"\\u009b\"}");
        let value: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(value["b"], "\u{9b}");
    }

    #[test]
    fn clean_text_is_borrowed() {
        assert!(matches!(escape_for_terminal("docs.rs"), Cow::Borrowed(_)));
        assert!(matches!(
            escape_json_for_terminal("{\n  \"a\": \"é\"\n}"),
            Cow::Borrowed(_)
        ));
    }
}
