//! docs/MANIFEST.md's table of the variables bottle sets against
//! `agent_env`, the one definition: every variable the table names is set,
//! when the table says, and nothing else is. The CLI's tests read the same
//! variables from inside real bottles on both backends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;

use bottle_core::agent::{AgentEnvInputs, GitRoute, OwnAddresses, agent_env};

/// One row of the table: the names it lists (`<n>` read as `0`) and
/// whether it says they are always set.
struct Row {
    names: Vec<String>,
    always: bool,
}

fn documented_rows() -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/MANIFEST.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = doc
        .split("### `[agents.<name>.env]`")
        .nth(1)
        .and_then(|rest| rest.split("\n### ").next())
        .unwrap_or_else(|| panic!("docs/MANIFEST.md has no [agents.<name>.env] section"));
    let rows: Vec<Row> = section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            let names = cells[0]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|name| name.replace("<n>", "0"))
                .collect();
            Row {
                names,
                always: cells.last().is_some_and(|set| set.trim() == "always"),
            }
        })
        .collect();
    assert!(rows.len() >= 5, "the table was not found: {section}");
    rows
}

fn names_set(git: &[GitRoute], prompt: bool) -> BTreeSet<String> {
    agent_env(&AgentEnvInputs {
        manifest_env: &BTreeMap::new(),
        bundle_address: Ipv4Addr::new(192, 168, 7, 2),
        own: &OwnAddresses::default(),
        git,
        prompt,
        host_services: false,
    })
    .into_iter()
    .map(|(name, _)| name)
    .collect()
}

#[test]
fn the_documented_variables_are_the_ones_bottle_sets() {
    let rows = documented_rows();
    let documented: BTreeSet<String> = rows.iter().flat_map(|r| r.names.clone()).collect();
    let always: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.always)
        .flat_map(|r| r.names.clone())
        .collect();
    let git = [GitRoute {
        name: "app".into(),
        url: "/srv/app.git".into(),
    }];

    assert_eq!(names_set(&git, true), documented);
    assert_eq!(names_set(&[], false), always);
    assert!(always.contains("ALL_PROXY") && always.contains("all_proxy"));
}
