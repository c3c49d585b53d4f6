//! `bottle start --timings`: the timeline on stderr after the launch names
//! the CLI's phases and every launch step, each with a duration and a
//! round-trip count, and the total, and none of it reaches stdout. Only the
//! shape is asserted, never a duration.
//!
//! Needs Docker, `/bin/busybox` (the demo agent image) and
//! `BOTTLE_BUNDLE_BIN`; skips with a line unless `BOTTLE_REQUIRE_DOCKER=1`.

use crate::bottle;

const IMAGE: &str = "bottle-demo-agent:cli-timings";

/// Every lap a detached docker start records, in order.
const LAPS: [&str; 24] = [
    "load-manifest",
    "preflight",
    "prepare",
    "confirm",
    "network",
    "egress-network",
    "bundle-create",
    "bundle-connect",
    "bundle-files",
    "agent-create",
    "agent-files",
    "bundle-start",
    "bundle-verify",
    "bundle-health",
    "agent-start",
    "agent-verify",
    "provision-ca",
    "provision-git",
    "provision-supervise",
    "snapshot",
    "complete",
    "launched",
    "forwards",
    "session-spawn",
];

/// Stops the bottle when the test ends, however it ends.
struct Stop<'a> {
    manifest: &'a std::path::Path,
    state: &'a std::path::Path,
    name: &'a str,
}

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        let _ = bottle(self.state)
            .arg("--manifest")
            .arg(self.manifest)
            .args(["--quiet", "stop", "--wait", self.name])
            .output();
    }
}

#[test]
fn start_with_timings_prints_every_phase_and_step_on_stderr() {
    let test = "start_with_timings_prints_every_phase_and_step_on_stderr";
    let _serial = crate::one_launch_at_a_time();
    if crate::docker_with_demo_image(test, IMAGE, &["BOTTLE_BUNDLE_BIN"]).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let manifest = dir.path().join("bottle.toml");
    std::fs::write(
        &manifest,
        format!(
            "[agents.idle]\nimage = \"{IMAGE}\"\ncommand = [\"/bin/sh\", \"-c\", \"echo started\"]\n\n[agents.idle.egress]\nallow = [\"api.example.com\"]\n"
        ),
    )
    .unwrap();
    let name = format!("timings-{}", std::process::id());
    let _stop = Stop {
        manifest: &manifest,
        state: &state,
        name: &name,
    };
    let out = bottle(&state)
        .arg("--manifest")
        .arg(&manifest)
        .args(["--backend", "docker", "--yes", "--quiet", "start", "idle"])
        .args(["--name", &name, "--detach", "--timings"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("timings:"),
        "the timeline is on stdout: {stdout}"
    );

    let table: Vec<&str> = stderr
        .lines()
        .skip_while(|line| *line != "timings:")
        .skip(2)
        .collect();
    let laps: Vec<&str> = table
        .iter()
        .map(|line| line.split_whitespace().next().unwrap_or(""))
        .collect();
    let mut expected = LAPS.to_vec();
    expected.push("total");
    assert_eq!(laps, expected, "{stderr}");
    for line in &table {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "{line}");
        assert!(fields[1].parse::<f64>().is_ok(), "{line}");
        assert!(fields[2].parse::<u64>().is_ok(), "{line}");
    }
    // The steps that create containers talk to the Engine.
    let round_trips = |step: &str| -> u64 {
        let line = table.iter().find(|l| l.starts_with(step)).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    assert!(round_trips("bundle-create") > 0, "{stderr}");
    assert!(round_trips("total") >= round_trips("bundle-create"));

    bottle(&state)
        .arg("--manifest")
        .arg(&manifest)
        .args(["--quiet", "stop", &name])
        .assert()
        .success();
}
