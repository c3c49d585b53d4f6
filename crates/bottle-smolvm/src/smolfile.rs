//! The per-bottle Smolfile, in smolvm's schema
//! (`crates/smolvm-smolfile/src/lib.rs`, `Smolfile` and `NetworkConfig`,
//! both `deny_unknown_fields`): `image`, `entrypoint`, `cmd`,
//! `env = ["K=V"]`, and `[network] allow_cidrs` holding exactly one `/32`.
//!
//! Rendering is a pure function. The file is written to the bottle's state
//! dir as the declarative record of the machine: smolvm refuses `--smolfile`
//! together with `--from`, so the launch passes the allowlist as
//! `--allow-cidr` and confirms it in the state DB, and the environment as
//! `machine exec -e`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::Serialize;

use crate::error::SmolvmError;

/// What a bottle's Smolfile says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmolfileSpec {
    /// The image reference the `.smolmachine` was packed from.
    pub image: String,
    /// Entrypoint override; empty keeps the image's.
    pub entrypoint: Vec<String>,
    /// Cmd override; empty keeps the image's.
    pub cmd: Vec<String>,
    /// Environment (sorted by key when rendered).
    pub env: BTreeMap<String, String>,
    /// The one address the guest may reach.
    pub allow: Ipv4Addr,
}

#[derive(Serialize)]
struct Rendered<'a> {
    image: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    entrypoint: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cmd: &'a [String],
    env: Vec<String>,
    network: Network,
}

#[derive(Serialize)]
struct Network {
    allow_cidrs: [String; 1],
}

/// Renders `spec` as Smolfile TOML.
pub fn render(spec: &SmolfileSpec) -> Result<String, SmolvmError> {
    if let Some(bad) = spec.env.keys().find(|k| k.is_empty() || k.contains('=')) {
        return Err(SmolvmError::Smolfile {
            detail: format!("environment variable name {bad:?} is empty or contains '='"),
        });
    }
    let rendered = Rendered {
        image: &spec.image,
        entrypoint: &spec.entrypoint,
        cmd: &spec.cmd,
        env: spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        network: Network {
            allow_cidrs: [format!("{}/32", spec.allow)],
        },
    };
    toml::to_string(&rendered).map_err(|err| SmolvmError::Smolfile {
        detail: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn fixture() -> SmolfileSpec {
        SmolfileSpec {
            image: "localhost:41234/bottle-agent:3f2a".into(),
            entrypoint: vec!["/usr/local/bin/claude".into()],
            cmd: vec!["--print".into(), "say \"hi\"".into()],
            env: BTreeMap::from([
                ("HTTPS_PROXY".into(), "http://192.168.7.2:8888".into()),
                ("NO_PROXY".into(), String::new()),
                ("NODE_EXTRA_CA_CERTS".into(), "/etc/bottle/ca.pem".into()),
            ]),
            allow: Ipv4Addr::new(192, 168, 7, 2),
        }
    }

    #[test]
    fn renders_smolvms_schema_with_one_address() {
        let text = render(&fixture()).unwrap();
        expect![[r#"
            image = "localhost:41234/bottle-agent:3f2a"
            entrypoint = ["/usr/local/bin/claude"]
            cmd = ["--print", 'say "hi"']
            env = ["HTTPS_PROXY=http://192.168.7.2:8888", "NODE_EXTRA_CA_CERTS=/etc/bottle/ca.pem", "NO_PROXY="]

            [network]
            allow_cidrs = ["192.168.7.2/32"]
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn the_network_table_holds_exactly_one_32_and_nothing_else() {
        let text = render(&fixture()).unwrap();
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let network = doc["network"].as_table().unwrap();
        assert_eq!(network.len(), 1, "{network:?}");
        let cidrs = network["allow_cidrs"].as_array().unwrap();
        assert_eq!(cidrs.len(), 1);
        assert_eq!(cidrs[0].as_str(), Some("192.168.7.2/32"));
        let keys: Vec<&str> = doc.keys().map(String::as_str).collect();
        for key in keys {
            assert!(
                ["image", "entrypoint", "cmd", "env", "network"].contains(&key),
                "{key} is not in smolvm's schema"
            );
        }
    }

    #[test]
    fn empty_overrides_keep_the_images_own() {
        let mut spec = fixture();
        spec.entrypoint.clear();
        spec.cmd.clear();
        spec.env.clear();
        expect![[r#"
            image = "localhost:41234/bottle-agent:3f2a"
            env = []

            [network]
            allow_cidrs = ["192.168.7.2/32"]
        "#]]
        .assert_eq(&render(&spec).unwrap());
    }

    #[test]
    fn refuses_an_env_name_that_would_change_meaning() {
        let mut spec = fixture();
        spec.env.insert("A=B".into(), "c".into());
        assert!(render(&spec).is_err());
    }
}
