//! Turning serde's deserialisation errors into manifest problems: wrong
//! types with a concrete rewrite, out-of-range numbers, missing keys.
//! Unknown keys and enumeration values never get here: the schema walk
//! ([`super::schema`]) finds them on the spanned tree first.
//!
//! serde reports these as formatted strings (`invalid type: string "x",
//! expected u32`); the formats are serde's own and have been stable for
//! years, and every shape handled here is pinned by a file in the
//! bad-manifest catalogue, so a change in serde shows up as a test failure,
//! not as a silently worse message.

use std::ops::Range;

use super::Problem;
use super::codes;
use super::span::{Doc, FieldPath, Kind, Seg};

/// The problem a serde error describes.
pub(crate) fn problem(doc: &Doc<'_>, err: &serde_path_to_error::Error<toml::de::Error>) -> Problem {
    let mut path = FieldPath::root();
    for seg in err.path().iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => path.push(Seg::Index(*index)),
            serde_path_to_error::Segment::Map { key } => path.push(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Enum { variant } => {
                path.push(Seg::Key(variant.clone()));
            }
            serde_path_to_error::Segment::Unknown => {}
        }
    }
    let inner = err.inner();
    let span = inner
        .span()
        .or_else(|| doc.locate(&path).map(|found| found.value));
    let raw = span.as_ref().map_or("", |s| doc.slice(s));
    classify(inner.message(), path, span, raw)
}

/// Tables written as arrays. serde lets a struct be read from a sequence
/// of its fields in order, so `egress = [["a.com"], [443]]` would load;
/// the manifest format has no such form, and accepting it would make a
/// typo like `egress = ["a.com"]` fail with a baffling message.
pub(crate) fn tables_written_as_arrays(doc: &Doc<'_>) -> Option<Problem> {
    let agents = FieldPath::root().key("agents");
    let mut found = Vec::new();
    let mut check = |path: FieldPath, fix: &dyn Fn(&str) -> String| {
        if doc.kind(&path) == Some(Kind::Array) {
            let span = doc.locate(&path).map(|l| l.value);
            let raw = span.as_ref().map_or("", |s| doc.slice(s));
            let fix = fix(raw);
            found.push(Problem::new(
                codes::WRONG_TYPE,
                path,
                span,
                "expected a table, found an array".to_string(),
                fix,
            ));
        }
    };
    for name in doc.keys(&agents) {
        let agent = agents.key(&name);
        check(agent.key("build"), &|_| {
            "write build = { context = \"DIR\" }".to_string()
        });
        check(agent.key("egress"), &|raw| {
            let hosts = if raw.contains('\n') {
                "[\"api.example.com\"]"
            } else {
                raw
            };
            format!("write egress.allow = {hosts}; egress is a table with allow and ports")
        });
        check(agent.key("limits"), &|_| {
            "write limits = { memory = \"4g\", pids = 1024 }".to_string()
        });
        for key in ["credentials", "git"] {
            let list = agent.key(key);
            for i in 0..doc.array_len(&list) {
                let item = list.index(i);
                check(item.clone(), &|_| {
                    format!("write each entry as a table: [[{list}]]")
                });
                if key == "credentials" {
                    check(item.key("source"), &|_| {
                        "write source = { env = \"NAME\" } or source = { file = \"PATH\" }"
                            .to_string()
                    });
                }
            }
        }
    }
    found
        .into_iter()
        .min_by_key(|p| p.span.as_ref().map_or(usize::MAX, |s| s.start))
}

fn classify(message: &str, path: FieldPath, span: Option<Range<usize>>, raw: &str) -> Problem {
    if let Some(rest) = message.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or(rest);
        return missing_key(path, span, field);
    }
    let in_source = path.segments().contains(&Seg::Key("source".into()));
    if in_source && is_source_shape(message) {
        return source_shape(path, span);
    }
    if path.segments().last() == Some(&Seg::Key("mode".into())) && !raw.starts_with(['"', '\'']) {
        return Problem::new(
            codes::WRONG_TYPE,
            path,
            span,
            format!("expected \"read-only\" or \"read-write\", found {raw}"),
            "write mode = \"read-only\" or mode = \"read-write\"".to_string(),
        );
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let (found, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        if in_source && found.ends_with("variant") {
            return source_shape(path, span);
        }
        return wrong_type(path, span, raw, found, expected);
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        let (found, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let found = humanize_found(found);
        let number = found.rsplit(' ').next().unwrap_or(&found);
        let (what, fix) = match expected {
            "u16" => ("a port number", "use a port from 1 to 65535".to_string()),
            "u32" => (
                "a whole number",
                format!("use a whole number from 0 to {}", u32::MAX),
            ),
            other => {
                return Problem::new(
                    codes::INVALID_VALUE,
                    path,
                    span,
                    format!(
                        "invalid value {found}, expected {}",
                        humanize_expected(other)
                    ),
                    "see docs/MANIFEST.md for what this key takes".to_string(),
                );
            }
        };
        return Problem::new(
            codes::INVALID_VALUE,
            path,
            span,
            format!("{number} is out of range for {what}"),
            fix,
        );
    }
    Problem::new(
        codes::INVALID_VALUE,
        path,
        span,
        message.to_string(),
        "see docs/MANIFEST.md for what this key takes".to_string(),
    )
}

fn missing_key(path: FieldPath, span: Option<Range<usize>>, field: &str) -> Problem {
    if field == "agents" && path.segments().is_empty() {
        // The span is the whole (empty) document: no line to point at.
        return Problem::new(
            codes::NO_AGENTS,
            path.key("agents"),
            None,
            "no agents defined".to_string(),
            "add an agent table, e.g. [agents.claude] with image = \"my-agent:latest\"".to_string(),
        );
    }
    let example = match field {
        "context" => "context = \"agent\" (the directory holding the Dockerfile)",
        "name" => "name = \"...\"",
        "source" => "source = { env = \"NAME\" } or source = { file = \"PATH\" }",
        "host" => "host = \"api.example.com\"",
        "header" => "header = \"x-api-key\"",
        "url" => "url = \"https://git.example.com/org/repo.git\"",
        _ => "",
    };
    let fix = if example.is_empty() {
        format!("add `{field}`")
    } else {
        format!("add {example}")
    };
    Problem::new(
        codes::MISSING_KEY,
        path.key(field),
        span,
        format!("missing required key `{field}`"),
        fix,
    )
}

fn is_source_shape(message: &str) -> bool {
    message.starts_with("wanted exactly 1 element")
        || message.starts_with("wanted string or table")
        || message.starts_with("expected table with exactly 1 entry")
}

fn source_shape(mut path: FieldPath, span: Option<Range<usize>>) -> Problem {
    let keep = path
        .segments()
        .iter()
        .rposition(|s| *s == Seg::Key("source".into()))
        .map_or(path.segments().len(), |i| i + 1);
    let mut trimmed = FieldPath::root();
    for seg in path.segments().iter().take(keep) {
        trimmed.push(seg.clone());
    }
    path = trimmed;
    Problem::new(
        codes::INVALID_VALUE,
        path,
        span,
        "source must be a table with exactly one of `file` or `env`".to_string(),
        "write source = { env = \"NAME\" } or source = { file = \"PATH\" }".to_string(),
    )
}

fn wrong_type(
    path: FieldPath,
    span: Option<Range<usize>>,
    raw: &str,
    found: &str,
    expected: &str,
) -> Problem {
    let expected = humanize_expected(expected);
    // toml hands dates to serde as a one-key table; say what was written.
    let found_h = if found == "map" && raw.starts_with(|c: char| c.is_ascii_digit()) {
        format!("date-time {raw}")
    } else {
        humanize_found(found)
    };
    let segs = path.segments();
    if expected == "a table" && segs.len() == 2 && segs[0] == Seg::Key("agents".into()) {
        let name = match &segs[1] {
            Seg::Key(key) => key.as_str(),
            Seg::Index(_) => "",
        };
        return Problem::new(
            codes::WRONG_TYPE,
            path.clone(),
            span,
            format!("`{name}` is not an agent table"),
            "put agent settings under a named agent table, e.g. [agents.claude]".to_string(),
        );
    }
    let scalar = !raw.is_empty() && !raw.starts_with(['[', '{']);
    let unquoted = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')));
    let fix = match expected.as_str() {
        "a string" if scalar => format!("put it in quotes: \"{raw}\""),
        "a string" => "write one string in quotes, e.g. \"...\"".to_string(),
        "an array" if scalar => {
            let is_command = segs.last() == Some(&Seg::Key("command".into()));
            match unquoted {
                Some(words) if is_command && !words.contains(['"', '\\', '\'']) => {
                    let items: Vec<String> = words
                        .split_whitespace()
                        .map(|w| format!("\"{w}\""))
                        .collect();
                    format!(
                        "write each argument as its own string: [{}]",
                        items.join(", ")
                    )
                }
                _ => format!("wrap it in brackets: [{raw}]"),
            }
        }
        "an array"
            if found == "map"
                && matches!(segs.last(), Some(Seg::Key(k)) if k == "git" || k == "credentials") =>
        {
            format!("use [[{path}]] (double brackets): each entry is a table in an array")
        }
        "an array" => "write an array, e.g. [\"...\"]".to_string(),
        "a table" => match segs.last() {
            Some(Seg::Index(_)) => {
                let mut parent = FieldPath::root();
                for seg in &segs[..segs.len() - 1] {
                    parent.push(seg.clone());
                }
                format!("write each entry as a table: [[{parent}]]")
            }
            _ => format!("write it as a table: [{path}]"),
        },
        "a whole number" | "a port number" | "a number" | "true or false" => match unquoted {
            Some(inner) if !inner.is_empty() && toml_scalar_fits(inner, &expected) => {
                format!("remove the quotes: {inner}")
            }
            _ => match expected.as_str() {
                "a whole number" => match raw.parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => {
                        format!("write a whole number, e.g. {}", v.trunc())
                    }
                    _ => "write a whole number, e.g. 1024".to_string(),
                },
                "a port number" => "write a port number from 1 to 65535, e.g. 443".to_string(),
                "a number" => "write a number, e.g. 2 or 0.5".to_string(),
                _ => "write true or false".to_string(),
            },
        },
        _ => "see docs/MANIFEST.md for what this key takes".to_string(),
    };
    Problem::new(
        codes::WRONG_TYPE,
        path,
        span,
        format!("expected {expected}, found {found_h}"),
        fix,
    )
}

/// Whether the text inside a quoted string would be the wanted scalar.
fn toml_scalar_fits(inner: &str, expected: &str) -> bool {
    match expected {
        "a whole number" => inner.parse::<u32>().is_ok(),
        "a port number" => inner.parse::<u16>().is_ok(),
        "a number" => inner.parse::<f64>().is_ok(),
        _ => inner == "true" || inner == "false",
    }
}

fn humanize_expected(expected: &str) -> String {
    match expected {
        "a sequence" => "an array".into(),
        "a map" => "a table".into(),
        "u16" => "a port number".into(),
        "u8" | "u32" | "u64" | "usize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "variant identifier" => "a string".into(),
        s if s.starts_with("struct ") => "a table".into(),
        s => s.replace('`', ""),
    }
}

fn humanize_found(found: &str) -> String {
    match found {
        "sequence" => "an array".into(),
        "map" => "a table".into(),
        s => s.replace("floating point", "number").replace('`', ""),
    }
}
