//! Device passthrough through the docker backend: a node the policy passes
//! is usable inside the agent; a blacklisted one, even requested under
//! another name, never appears.

use bottle_core::BottleLauncher;
use bottle_core::devices::{AdminPolicy, DevicePolicy};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use crate::support::{self, Guard, name, sh};

#[test]
fn passed_nodes_work_and_blacklisted_nodes_stay_out() {
    let Some(fx) = support::setup("passed_nodes_work_and_blacklisted_nodes_stay_out") else {
        return;
    };
    // A fake /dev: `bottle-zero` is the zero device (1,5) under a name no
    // blacklist covers; `mem` is /dev/mem (1,1) itself, and `innocent` is
    // /dev/mem again under a harmless-looking name.
    let root = fx.dir.path().join("root");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    let node = |name: &str, major, minor| {
        mknod(
            &root.join("dev").join(name),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
    };
    if let Err(err) = node("bottle-zero", 1, 5) {
        support::unavailable(
            "passed_nodes_work_and_blacklisted_nodes_stay_out",
            &format!("mknod: {err}"),
        );
        return;
    }
    node("mem", 1, 1).unwrap();
    node("innocent", 1, 1).unwrap();
    // Written before `spec` so the fixture keeps it.
    std::fs::write(
        fx.dir.path().join("bottle.toml"),
        format!(
            "[agents.demo]\nimage = \"{}\"\ncommand = [\"/bin/sh\"]\ndevices = [\"/dev/bottle-zero\", \"/dev/mem\", \"/dev/innocent\"]\n",
            fx.image
        ),
    )
    .unwrap();

    let spec = fx.spec(&name("devices"));
    let policy = DevicePolicy::for_spec(&spec, &AdminPolicy::builtin_only()).unwrap();
    let resolved = policy.resolve(&root, None).unwrap();
    let mut plan = fx.backend.prepare(&spec).unwrap();
    resolved.fill_plan(&mut plan, &root);
    let passed: Vec<&str> = plan
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(passed, ["/dev/bottle-zero"], "{:?}", plan.devices_dropped);
    let dropped: Vec<&str> = plan
        .devices_dropped
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(dropped, ["/dev/mem", "/dev/innocent"]);
    assert!(plan.render().contains("/dev/bottle-zero"));

    let _guard = Guard {
        backend: &fx.backend,
        name: spec.name.clone(),
    };
    let bottle = fx.backend.launch(&plan).unwrap();
    // The passed node reads as the zero device inside the agent.
    let read = sh(&*bottle, "head -c 4 /dev/bottle-zero | od -An -tx1");
    assert_eq!(
        read.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim(), "00 00 00 00");
    // Neither spelling of /dev/mem got in.
    let absent = sh(
        &*bottle,
        "test -e /dev/innocent || test -e /dev/mem && echo present || echo absent",
    );
    assert_eq!(String::from_utf8_lossy(&absent.stdout).trim(), "absent");
}
