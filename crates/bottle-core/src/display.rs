//! Making agent-controlled text safe to show on the operator's terminal.
//!
//! Request paths and hosts in the audit log, supervise reasons and messages,
//! repository and ref names: the agent chooses them, and the CLI prints them.
//! Some characters are not shown as what they are, so [`needs_escape`], the
//! one definition every operator-facing output uses, escapes:
//!
//! - what a terminal *acts on*: C0 and C1 controls (ESC and the single-byte
//!   CSI `U+009B`, OSC `U+009D` and ST `U+009C` start sequences that move the
//!   cursor, clear the screen, set the title or plant hyperlinks) and DEL;
//! - what makes text *read otherwise than it is stored*: every Unicode format
//!   character (general category Cf: bidirectional marks, embeddings,
//!   overrides and isolates, zero-width space, joiners and non-joiners, word
//!   joiner and invisible operators, the byte-order mark, the soft hyphen,
//!   interlinear annotations, the tag characters U+E0000–U+E007F, which can
//!   carry a whole hidden message), and the line and paragraph separators
//!   (Zl, Zp), which some terminals and viewers break lines on;
//! - what has *no agreed look*: private-use characters (Co), which a font
//!   may draw as anything, an icon or another letter.
//!
//! Every one of them is shown here as a visible escape instead, so the
//! operator sees that something was there, and nothing hides or acts.
//!
//! Text output uses Rust's form, `\u{1b}` (lowercase hex, no padding), for
//! every such character; JSON output uses JSON's own `\u001b` (a surrogate
//! pair above the Basic Multilingual Plane), so it still parses to the same
//! value. A backslash is left as it is: an agent that writes a literal
//! `\u{1b}` can make text look escaped, but cannot make it act or hide.

use std::borrow::Cow;

/// The Unicode format characters (general category Cf) as of Unicode 15.1,
/// as inclusive ranges. Written out rather than taken from a crate: the list
/// is short, changes rarely, and a test pins its size.
const FORMAT: &[(char, char)] = &[
    ('\u{ad}', '\u{ad}'),
    ('\u{600}', '\u{605}'),
    ('\u{61c}', '\u{61c}'),
    ('\u{6dd}', '\u{6dd}'),
    ('\u{70f}', '\u{70f}'),
    ('\u{890}', '\u{891}'),
    ('\u{8e2}', '\u{8e2}'),
    ('\u{180e}', '\u{180e}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{fff9}', '\u{fffb}'),
    ('\u{110bd}', '\u{110bd}'),
    ('\u{110cd}', '\u{110cd}'),
    ('\u{13430}', '\u{1343f}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0001}', '\u{e0001}'),
    ('\u{e0020}', '\u{e007f}'),
];

/// Whether `c` is shown to the operator as an escape rather than as itself:
/// C0 controls (newline and tab included), DEL, C1 controls, Unicode format
/// characters (Cf, the tag block U+E0000–U+E007F whole), the line and
/// paragraph separators (Zl, Zp), private-use characters (Co), and the
/// default-ignorable characters that are none of these (variation
/// selectors, the combining grapheme joiner, Hangul fillers).
pub fn needs_escape(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{2028}'
            | '\u{2029}'
            // Private use (Co): the BMP's area and planes 15 and 16.
            | '\u{e000}'..='\u{f8ff}'
            | '\u{f0000}'..='\u{ffffd}'
            | '\u{100000}'..='\u{10fffd}'
            // Tags, unassigned ones included: nothing in the block is shown.
            | '\u{e0000}'..='\u{e007f}'
            // Default-ignorable characters outside Cf, which show nothing:
            // the combining grapheme joiner, the Hangul fillers, and the
            // 256 variation selectors (one byte hidden in each).
            | '\u{34f}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{3164}'
            | '\u{ffa0}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{e0100}'..='\u{e01ef}'
    ) || FORMAT
        .iter()
        .any(|&(first, last)| (first..=last).contains(&c))
}

/// `text` with every character that [`needs_escape`] replaced by its visible
/// escape, `\u{XXXX}` (lowercase hex, no padding: ESC is `\u{1b}`). Newlines
/// and tabs are escaped too, so the result is always one line: a caller whose
/// output has its own line structure escapes each piece it puts in it.
/// Everything else, other UTF-8 included, is unchanged; escaping twice gives
/// the same as escaping once.
pub fn escape_for_terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// `json`, which must be JSON text (as `serde_json` writes it), with every
/// character that [`needs_escape`] written so that none reaches the terminal
/// raw and the text still parses to the same value.
///
/// In JSON text a raw control character can only be whitespace between
/// tokens (a string holds C0 controls only escaped), so a raw tab or carriage
/// return becomes a space and a newline, the output's own line structure,
/// stays. Every other such character can only be inside a string, where its
/// `\uXXXX` escape (a surrogate pair above the Basic Multilingual Plane)
/// means the same character. `serde_json` already escapes C0 controls in
/// strings but leaves everything else here raw.
pub fn escape_json_for_terminal(json: &str) -> Cow<'_, str> {
    if !json.chars().any(|c| c != '\n' && needs_escape(c)) {
        return Cow::Borrowed(json);
    }
    let mut escaped = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '\n' => escaped.push('\n'),
            '\t' | '\r' => escaped.push(' '),
            c if needs_escape(c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    escaped.push_str(&format!("\\u{unit:04x}"));
                }
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
        // Invisible: zero-width space, non-joiner and joiner, word joiner,
        // byte-order mark, soft hyphen.
        (
            "pay\u{200b}pal\u{200c}\u{200d}.com\u{2060}\u{feff}\u{ad}",
            r"pay\u{200b}pal\u{200c}\u{200d}.com\u{2060}\u{feff}\u{ad}",
            r"pay\u200bpal\u200c\u200d.com\u2060\ufeff\u00ad",
        ),
        // A hidden message in tag characters ("hi" and CANCEL TAG), above
        // the Basic Multilingual Plane: a surrogate pair each in JSON.
        (
            "ok\u{e0068}\u{e0069}\u{e007f}",
            r"ok\u{e0068}\u{e0069}\u{e007f}",
            r"ok\udb40\udc68\udb40\udc69\udb40\udc7f",
        ),
        // Private use, in the BMP and in plane 15; an interlinear
        // annotation; a Mongolian vowel separator.
        (
            "\u{e000}\u{f0000}\u{fff9}x\u{fffb}\u{180e}",
            r"\u{e000}\u{f0000}\u{fff9}x\u{fffb}\u{180e}",
            r"\ue000\udb80\udc00\ufff9x\ufffb\u180e",
        ),
        ("café ☕ 🦀 日本", "café ☕ 🦀 日本", "café ☕ 🦀 日本"),
        ("", "", ""),
    ];

    #[test]
    fn text_form_shows_every_hostile_character_as_an_escape() {
        for (input, text, _) in HOSTILE {
            let escaped = escape_for_terminal(input);
            assert_eq!(escaped, *text, "{input:?}");
            assert!(!escaped.chars().any(needs_escape), "{input:?}");
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
                !escaped.chars().any(|c| c != '\n' && needs_escape(c)),
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
    fn every_format_character_and_nothing_printable_is_escaped() {
        // Unicode 15.1 has 170 format characters (Cf).
        let format: u32 = FORMAT
            .iter()
            .map(|&(first, last)| u32::from(last) - u32::from(first) + 1)
            .sum();
        assert_eq!(format, 170);
        for pair in FORMAT.windows(2) {
            assert!(pair[0].1 < pair[1].0, "sorted, disjoint: {pair:?}");
        }
        for &(first, last) in FORMAT {
            for c in first..=last {
                assert!(needs_escape(c), "{c:?}");
            }
        }
        for c in [
            '\u{e0000}',
            '\u{e0002}',
            '\u{e001f}',
            '\u{f8ff}',
            '\u{10fffd}',
            // Invisible, though not Cf: what smuggles text past a reader.
            '\u{34f}',
            '\u{115f}',
            '\u{3164}',
            '\u{ffa0}',
            '\u{fe00}',
            '\u{fe0f}',
            '\u{e0100}',
            '\u{e01ef}',
        ] {
            assert!(needs_escape(c), "{c:?}");
        }
        for c in [
            ' ',
            'a',
            '\u{a0}',
            '\u{ae}',
            '\u{2027}',
            '\u{202f}',
            '\u{fffc}',
            '\u{fffd}',
            '\u{1f980}',
            '\u{e0080}',
            '\u{e01f0}',
            '\u{effff}',
        ] {
            assert!(!needs_escape(c), "{c:?}");
        }
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
