//! The keys each table of `bottle.toml` may hold and the values its
//! enumerations take, checked on the spanned TOML tree before serde sees it.
//!
//! Unknown keys and unknown enumeration values are found here, by walking
//! the document against the known fields, so their messages (with the
//! did-you-mean suggestions) never depend on the text of serde's errors.
//! serde then only converts a document whose keys are all known. The field
//! lists are pinned to the serde model by a test.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::Problem;
use super::codes;
use super::span::{Doc, FieldPath};
use super::suggest;

/// What a value in the manifest is, as far as its keys and enumerations go.
/// Scalars, arrays of scalars and free-form maps are all [`Shape::Free`]:
/// their types are serde's to check.
enum Shape {
    /// Anything: no keys or values to check here.
    Free,
    /// A table with exactly these keys, in the model's order.
    Table(&'static [(&'static str, Shape)]),
    /// A table with keys of the operator's choosing (agent names).
    MapOf(&'static Shape),
    /// An array whose entries have this shape.
    ArrayOf(&'static Shape),
    /// A string that must be one of these values.
    OneOf(&'static [&'static str]),
    /// One of these names, as a one-key table (`{ env = "NAME" }`): an
    /// enumeration whose variants carry a value.
    Variant(&'static [&'static str]),
}

const ROOT: Shape = Shape::Table(&[("version", Shape::Free), ("agents", Shape::MapOf(&AGENT))]);

const AGENT: Shape = Shape::Table(&[
    ("image", Shape::Free),
    ("build", BUILD),
    ("command", Shape::Free),
    ("env", Shape::Free),
    ("prompt", Shape::Free),
    ("skills", Shape::Free),
    ("git", Shape::ArrayOf(&GIT)),
    ("egress", EGRESS),
    ("credentials", Shape::ArrayOf(&CREDENTIAL)),
    ("devices", Shape::Free),
    ("devices_blacklist", Shape::Free),
    ("limits", LIMITS),
    ("publish", Shape::Free),
    ("pool", Shape::Free),
    (
        "isolation",
        Shape::OneOf(&crate::isolation::Isolation::CHOICES),
    ),
]);

const BUILD: Shape = Shape::Table(&[
    ("context", Shape::Free),
    ("dockerfile", Shape::Free),
    ("args", Shape::Free),
]);

const EGRESS: Shape = Shape::Table(&[
    ("allow", Shape::Free),
    ("ports", Shape::Free),
    ("resolve", Shape::Free),
    ("upstream_ca", Shape::Free),
    (
        "upstream_trust",
        Shape::OneOf(&crate::upstream_trust::UpstreamTrust::CHOICES),
    ),
    (
        "on_secret",
        Shape::MapOf(&Shape::OneOf(&super::model::SecretAction::CHOICES)),
    ),
    ("host_services", Shape::Free),
    ("tcp", Shape::Free),
]);

const CREDENTIAL: Shape = Shape::Table(&[
    ("name", Shape::Free),
    ("source", Shape::Variant(&["file", "env"])),
    ("host", Shape::Free),
    ("header", Shape::Free),
    ("format", Shape::Free),
]);

const GIT: Shape = Shape::Table(&[
    ("name", Shape::Free),
    ("url", Shape::Free),
    ("mode", Shape::OneOf(&["read-only", "read-write"])),
    ("push", Shape::Free),
    ("allow_force", Shape::Free),
    ("allow_delete", Shape::Free),
    ("credential", Shape::Free),
]);

const LIMITS: Shape = Shape::Table(&[
    ("memory", Shape::Free),
    ("pids", Shape::Free),
    ("cpus", Shape::Free),
    ("disk", Shape::Free),
    ("audit_log", Shape::Free),
]);

/// Agent keys, for "this belongs under `[agents.<name>]`" hints.
const AGENT_KEYS: &[&str] = &[
    "image",
    "build",
    "command",
    "env",
    "prompt",
    "skills",
    "git",
    "egress",
    "credentials",
    "devices",
    "devices_blacklist",
    "limits",
    "publish",
    "pool",
    "isolation",
];

/// Keys of the agent's sub-tables that people write one level too high.
const NESTED: &[(&str, &str)] = &[
    ("allow", "egress.allow"),
    ("ports", "egress.ports"),
    ("host_services", "egress.host_services"),
    ("tcp", "egress.tcp"),
    ("memory", "limits.memory"),
    ("pids", "limits.pids"),
    ("cpus", "limits.cpus"),
    ("disk", "limits.disk"),
    ("audit_log", "limits.audit_log"),
    ("context", "build.context"),
    ("dockerfile", "build.dockerfile"),
];

/// The first unknown key or enumeration value in the document, if any.
pub(crate) fn check(doc: &Doc<'_>) -> Option<Problem> {
    let mut found = Vec::new();
    if let Shape::Table(fields) = &ROOT {
        check_table(doc.root(), fields, &FieldPath::root(), &mut found);
    }
    found
        .into_iter()
        .min_by_key(|p| p.span.as_ref().map_or(usize::MAX, |s| s.start))
}

fn check_table(
    table: &DeTable<'_>,
    fields: &[(&str, Shape)],
    path: &FieldPath,
    found: &mut Vec<Problem>,
) {
    let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
    for (key, value) in table {
        let name = key.get_ref().as_ref();
        let here = path.key(name);
        match fields.iter().find(|(known, _)| *known == name) {
            Some((_, shape)) => check_value(value, shape, &here, found),
            None => found.push(unknown_key(here, Some(key.span()), name, &names)),
        }
    }
}

fn check_value(
    value: &Spanned<DeValue<'_>>,
    shape: &Shape,
    path: &FieldPath,
    found: &mut Vec<Problem>,
) {
    // A value of the wrong kind is left alone: serde reports its type.
    match (shape, value.get_ref()) {
        (Shape::Table(fields), DeValue::Table(table)) => check_table(table, fields, path, found),
        (Shape::MapOf(inner), DeValue::Table(table)) => {
            for (key, value) in table {
                check_value(value, inner, &path.key(key.get_ref()), found);
            }
        }
        (Shape::ArrayOf(inner), DeValue::Array(items)) => {
            for (index, item) in items.iter().enumerate() {
                check_value(item, inner, &path.index(index), found);
            }
        }
        (Shape::OneOf(values) | Shape::Variant(values), DeValue::String(text))
            if !values.contains(&text.as_ref()) =>
        {
            found.push(unknown_value(path.clone(), value.span(), text, values));
        }
        (Shape::Variant(names), DeValue::Table(table)) if table.len() == 1 => {
            // More or fewer than one key is a shape error serde reports.
            if let Some((key, _)) = table.iter().next()
                && !names.contains(&key.get_ref().as_ref())
            {
                let name = key.get_ref().as_ref();
                found.push(unknown_key(path.key(name), Some(key.span()), name, names));
            }
        }
        _ => {}
    }
}

fn unknown_value(path: FieldPath, span: Range<usize>, value: &str, valid: &[&str]) -> Problem {
    let fix = match suggest::did_you_mean(value, valid) {
        Some(close) => format!("did you mean \"{close}\"?"),
        None => format!("use one of: {}", quoted_list(valid)),
    };
    Problem::new(
        codes::INVALID_VALUE,
        path,
        Some(span),
        format!("unknown value \"{value}\""),
        fix,
    )
}

fn unknown_key(path: FieldPath, span: Option<Range<usize>>, key: &str, valid: &[&str]) -> Problem {
    let depth = path.segments().len();
    let parent_is_agent = valid == AGENT_KEYS;
    let fix = if let Some(close) = suggest::did_you_mean(key, valid) {
        format!("did you mean `{close}`?")
    } else if let Some((_, nested)) = NESTED
        .iter()
        .find(|(name, _)| parent_is_agent && *name == key)
    {
        format!("did you mean `{nested}`?")
    } else if depth == 1 && AGENT_KEYS.contains(&key) {
        "agent settings go under a named agent table, e.g. [agents.claude]".to_string()
    } else {
        format!("valid keys here: {}", suggest::list(valid))
    };
    Problem::new(
        codes::UNKNOWN_KEY,
        path,
        span,
        format!("unknown key `{key}`"),
        fix,
    )
}

fn quoted_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("\"{v}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::manifest::model::{
        Agent, Build, Credential, CredentialSource, Egress, GitMode, GitRepo, Limits, Manifest,
    };

    /// A manifest with every optional field set, so that serialising it
    /// writes every key the model knows.
    fn full_manifest() -> Manifest {
        let agent = Agent {
            image: Some("x".into()),
            build: Some(Build {
                context: "c".into(),
                dockerfile: Some("D".into()),
                args: BTreeMap::new(),
            }),
            command: vec![],
            env: BTreeMap::new(),
            prompt: Some("p".into()),
            skills: vec![],
            git: vec![GitRepo {
                name: "n".into(),
                url: "u".into(),
                mode: GitMode::ReadWrite,
                push: vec![],
                allow_force: false,
                allow_delete: false,
                credential: Some("c".into()),
            }],
            egress: Egress {
                allow: vec![],
                ports: Some(vec![443]),
                resolve: BTreeMap::new(),
                upstream_ca: vec!["ca.pem".into()],
                upstream_trust: Some(crate::upstream_trust::UpstreamTrust::WebAndSystem),
                on_secret: BTreeMap::from([(
                    "h".into(),
                    super::super::model::SecretAction::Redact,
                )]),
                host_services: vec![],
                tcp: vec![],
            },
            credentials: vec![Credential {
                name: "n".into(),
                source: CredentialSource::Env("E".into()),
                host: "h".into(),
                header: "x".into(),
                format: Some("{}".into()),
            }],
            devices: Some(vec![]),
            devices_blacklist: vec![],
            limits: Limits {
                memory: Some("1g".into()),
                pids: Some(1),
                cpus: Some(1.0),
                disk: Some("1g".into()),
                audit_log: Some("64m".into()),
            },
            publish: vec![],
            pool: Some(2),
            isolation: crate::isolation::Isolation::Gvisor,
        };
        Manifest {
            version: 1,
            agents: BTreeMap::from([("a".to_string(), agent)]),
        }
    }

    /// Every key of `value` and the schema's keys for it, in order, for
    /// each table the schema describes.
    fn compare(value: &toml::Value, shape: &Shape, path: &str, out: &mut Vec<String>) {
        match (shape, value) {
            (Shape::Table(fields), toml::Value::Table(table)) => {
                let model: Vec<&str> = table.keys().map(String::as_str).collect();
                let schema: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
                if model != schema {
                    out.push(format!("{path}: model {model:?}, schema {schema:?}"));
                }
                for (name, inner) in *fields {
                    if let Some(value) = table.get(*name) {
                        compare(value, inner, &format!("{path}.{name}"), out);
                    }
                }
            }
            (Shape::MapOf(inner), toml::Value::Table(table)) => {
                for (key, value) in table {
                    compare(value, inner, &format!("{path}.{key}"), out);
                }
            }
            (Shape::ArrayOf(inner), toml::Value::Array(items)) => {
                for item in items {
                    compare(item, inner, &format!("{path}[]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_schema_lists_the_models_keys_in_order() {
        let value = toml::Value::try_from(full_manifest()).unwrap();
        let mut mismatches = Vec::new();
        compare(&value, &ROOT, "", &mut mismatches);
        assert!(mismatches.is_empty(), "{mismatches:#?}");
        let Shape::Table(fields) = &AGENT else {
            panic!("agents are tables")
        };
        let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, AGENT_KEYS);
    }

    #[test]
    fn the_enumerations_are_the_models() {
        let modes = [GitMode::ReadOnly, GitMode::ReadWrite].map(|mode| {
            toml::Value::try_from(mode)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        });
        let Shape::Table(git) = &GIT else {
            panic!("git entries are tables")
        };
        let Some((_, Shape::OneOf(values))) = git.iter().find(|(name, _)| *name == "mode") else {
            panic!("mode is an enumeration")
        };
        assert_eq!(modes.as_slice(), *values);

        let sources = [
            CredentialSource::File("f".into()),
            CredentialSource::Env("e".into()),
        ]
        .map(|source| {
            let value = toml::Value::try_from(source).unwrap();
            value.as_table().unwrap().keys().next().unwrap().clone()
        });
        let Shape::Table(credential) = &CREDENTIAL else {
            panic!("credentials are tables")
        };
        let Some((_, Shape::Variant(names))) =
            credential.iter().find(|(name, _)| *name == "source")
        else {
            panic!("source is an enumeration")
        };
        assert_eq!(sources.as_slice(), *names);
    }

    #[test]
    fn unknown_keys_and_values_are_found_in_document_order() {
        let text = "[agents.a]\nimage = \"x\"\n[[agents.a.git]]\nname = \"n\"\nurl = \"u\"\nmode = \"read-onyl\"\n[agents.a.limits]\nmemroy = \"1g\"\n";
        let doc = Doc::parse(text).unwrap();
        let problem = check(&doc).unwrap();
        assert_eq!(problem.code, codes::INVALID_VALUE);
        assert_eq!(problem.path.to_string(), "agents.a.git[0].mode");
        assert_eq!(problem.message, "unknown value \"read-onyl\"");
        assert_eq!(problem.fix, "did you mean \"read-only\"?");

        let doc =
            Doc::parse("[agents.a]\nimage = \"x\"\n[agents.a.limits]\nmemroy = \"1g\"\n").unwrap();
        let problem = check(&doc).unwrap();
        assert_eq!(problem.code, codes::UNKNOWN_KEY);
        assert_eq!(problem.path.to_string(), "agents.a.limits.memroy");
        assert_eq!(problem.fix, "did you mean `memory`?");

        let good = Doc::parse("[agents.a]\nimage = \"x\"\nenv = { ANY = \"1\" }\n").unwrap();
        assert!(check(&good).is_none());
    }
}
