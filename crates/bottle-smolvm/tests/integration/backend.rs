//! The backend end to end against the fake: the launch refuses whenever the
//! allowlist cannot be confirmed, and leaves nothing behind; when it can,
//! the machine boots with exactly the bundle's /32 and no DNS names.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use bottle_core::backend::{BackendErrorKind, BackendKind, BottleBackend, BottleLauncher};
use bottle_core::spec::BottleSpec;
use bottle_smolvm::SmolvmBackend;
use bottle_smolvm::pack::SmolmachineCache;
use serde_json::json;

use crate::support::{ArchiveImages, RecordingBundles, World, sandbox_available};

const BUNDLE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);
pub(crate) const MACHINE: &str = "bot-bottle-coder";

pub(crate) struct Setup {
    pub(crate) world: World,
    pub(crate) backend: SmolvmBackend<RecordingBundles>,
    pub(crate) bundles: Arc<RecordingBundles>,
    pub(crate) spec: BottleSpec,
}

pub(crate) fn setup(version: &str, mode: &str) -> Setup {
    setup_with(version, mode, |smolvm| smolvm)
}

/// [`setup`], with the fake's command adjusted by `configure`.
fn setup_with(
    version: &str,
    mode: &str,
    configure: impl FnOnce(bottle_smolvm::Smolvm) -> bottle_smolvm::Smolvm,
) -> Setup {
    let world = World::new();
    let project = world.dir.path().join("project");
    std::fs::create_dir_all(project.join("skills/review")).unwrap();
    std::fs::write(project.join("prompt.md"), "do the thing\n").unwrap();
    std::fs::write(project.join("skills/review/SKILL.md"), "# review\n").unwrap();
    let manifest_path = project.join("bottle.toml");
    let text = r#"
[agents.coder]
image = "agent:test"
prompt = "prompt.md"
skills = ["skills/review"]
env = { EDITOR = "vi" }

[agents.coder.egress]
allow = ["api.example.com"]

[[agents.coder.git]]
name = "repo"
url = "https://example.com/repo.git"
"#;
    std::fs::write(&manifest_path, text).unwrap();
    let manifest = bottle_core::manifest::parse(&manifest_path, text).unwrap();
    let spec = BottleSpec::new(
        &manifest,
        &manifest_path,
        "coder",
        None,
        &world.state_root(),
    )
    .unwrap();
    let bundles = RecordingBundles::new(&world, BUNDLE);
    let images = ArchiveImages::new(&world);
    let backend = SmolvmBackend::new(
        configure(world.smolvm(version, mode)),
        images,
        SmolmachineCache::new(world.cache()),
        Arc::clone(&bundles),
        world.state_root(),
    )
    .with_host_check(Arc::new(|| Ok(())));
    Setup {
        world,
        backend,
        bundles,
        spec,
    }
}

fn machines(s: &Setup) -> Vec<String> {
    s.backend
        .smolvm()
        .list()
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect()
}

fn state_file(s: &Setup) -> PathBuf {
    s.world.state_root().join("coder").join("smolvm.json")
}

/// Nothing a refused launch created is left: no machine, no bundle, no
/// state file.
pub(crate) fn assert_nothing_left(s: &Setup) {
    assert!(machines(s).is_empty(), "machines left: {:?}", machines(s));
    assert!(
        s.bundles.live().is_empty(),
        "bundles left: {:?}",
        s.bundles.live()
    );
    assert!(!state_file(s).exists(), "state file left");
    let record = state_file(s).with_file_name(bottle_core::life::RECORD_FILE);
    assert!(!record.exists(), "record left");
}

#[test]
fn smolvm_without_an_enforced_allowlist_is_refused_before_anything_starts() {
    let s = setup("1.1.2", "");
    let err = s.backend.preflight().unwrap_err();
    assert_eq!(err.kind, BackendErrorKind::Preflight);
    assert_eq!(err.code, "BOT-K004");
    assert!(err.message.contains("1.1.2"), "{}", err.message);
    assert!(s.backend.prepare(&s.spec).is_err());
    assert!(s.bundles.calls().is_empty());
    let s = setup("0.8.0", "");
    assert_eq!(s.backend.preflight().unwrap_err().code, "BOT-K004");
}

#[test]
fn a_patch_that_does_not_take_refuses_the_launch_and_unwinds() {
    // 1.7.7 drops --allow-cidr with --from, so the patch is needed; the
    // fake's trigger undoes it.
    let s = setup("1.7.7", "revert-db-writes");
    s.backend.preflight().unwrap();
    let plan = s.backend.prepare(&s.spec).unwrap();
    let err = match s.backend.launch(&plan) {
        Ok(_) => panic!("the launch must be refused"),
        Err(err) => err,
    };
    assert_eq!(err.kind, BackendErrorKind::IsolationUnconfirmed, "{err}");
    assert_eq!(err.code, "BOT-K015");
    assert!(
        s.world.booted(MACHINE).is_none(),
        "the machine must never start"
    );
    assert_eq!(
        s.bundles.calls(),
        [format!("start {MACHINE}"), format!("stop {MACHINE}")]
    );
    assert_nothing_left(&s);
}

#[test]
fn the_bundle_plan_travels_to_start_and_its_address_binds_the_launch() {
    let s = setup("1.9.3", "");
    *s.bundles.planned.lock().unwrap() = Some((
        Ipv4Addr::new(192, 168, 78, 2),
        vec![("bundle".into(), "recorded".into())],
    ));
    let plan = s.backend.prepare(&s.spec).unwrap();
    assert!(
        plan.backend_lines
            .contains(&("bundle".to_string(), "recorded".to_string()))
    );
    let allowlist = plan.backend_lines.iter().find(|(k, _)| k == "allowlist");
    assert!(
        allowlist.is_some_and(|(_, v)| v.starts_with("192.168.78.2/32 only")),
        "{allowlist:?}"
    );
    // The host then puts the bundle somewhere else: refused, unwound.
    let err = s.backend.launch(&plan).err().expect("refused");
    assert_eq!(err.code, "BOT-K060", "{err}");
    assert_eq!(err.kind, BackendErrorKind::IsolationUnconfirmed);
    assert_eq!(
        s.bundles
            .started_with
            .lock()
            .unwrap()
            .as_ref()
            .map(|b| b.network.as_str()),
        Some(MACHINE)
    );
    assert!(s.world.booted(MACHINE).is_none());
    assert_nothing_left(&s);
}

#[test]
fn a_missing_record_refuses_the_launch() {
    let s = setup("1.9.3", "no-row");
    let plan = s.backend.prepare(&s.spec).unwrap();
    let err = s.backend.launch(&plan).err().expect("refused");
    assert_eq!(err.kind, BackendErrorKind::IsolationUnconfirmed, "{err}");
    assert_eq!(err.code, "BOT-K013");
    assert!(s.world.booted(MACHINE).is_none());
    assert!(s.bundles.live().is_empty());
    assert!(!state_file(&s).exists());
}

#[test]
fn a_policy_rewritten_at_boot_refuses_the_launch_and_stops_the_vm() {
    let s = setup("1.9.3", "start-clears-cidrs");
    let plan = s.backend.prepare(&s.spec).unwrap();
    let err = s.backend.launch(&plan).err().expect("refused");
    assert_eq!(err.code, "BOT-K015", "{err}");
    assert_nothing_left(&s);
}

#[test]
fn a_failed_start_leaves_no_machine_behind() {
    if !nix::unistd::geteuid().is_root() {
        println!("skip: smolvm fails a start on a root-only /dev/kvm only when run as root");
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("kvm");
    std::fs::write(&device, "").unwrap();
    std::fs::set_permissions(&device, std::fs::Permissions::from_mode(0o600)).unwrap();
    // smolvm run as root keeps only the kvm group for the VM, so a
    // root-only device fails the start and leaves the machine `created`.
    let s = setup_with("1.9.3", "", |smolvm| {
        smolvm.env("FAKE_SMOLVM_KVM_DEVICE", &device)
    });
    let plan = s.backend.prepare(&s.spec).unwrap();
    let err = s.backend.launch(&plan).err().expect("refused");
    assert!(
        err.message.contains("krun_start_enter returned: -13"),
        "{err}"
    );
    assert!(s.world.booted(MACHINE).is_none());
    assert_nothing_left(&s);
}

#[test]
fn an_existing_machine_is_not_overwritten() {
    let s = setup("1.9.3", "");
    let artifact = s.world.dir.path().join("x.smolmachine");
    std::fs::write(&artifact, r#"{"format":"fake-smolmachine/1","image":"x"}"#).unwrap();
    s.backend
        .smolvm()
        .create(MACHINE, &artifact, &[], None)
        .unwrap();
    let plan = s.backend.prepare(&s.spec).unwrap();
    let err = s.backend.launch(&plan).err().expect("refused");
    assert_eq!(err.code, "BOT-K072");
    assert!(s.bundles.calls().is_empty());
    assert_eq!(machines(&s), [MACHINE]);
}

fn launch_and_check(version: &str) {
    let s = setup(version, "");
    if !sandbox_available(&s.world) {
        return;
    }
    s.backend.preflight().unwrap();
    let plan = s.backend.prepare(&s.spec).unwrap();
    assert!(plan.backend_lines.iter().any(|(k, _)| k == "allowlist"));
    let bottle = s
        .backend
        .launch(&plan)
        .unwrap_or_else(|e| panic!("{version}: {e}"));
    assert_eq!(bottle.name(), MACHINE);

    // The machine booted with exactly the bundle's /32 and no DNS names.
    assert_eq!(
        s.world.booted(MACHINE).unwrap(),
        json!({ "allowed_cidrs": ["192.168.77.2/32"], "dns_filter_hosts": [], "network": true }),
        "{version}"
    );
    let record = bottle_smolvm::statedb::read(&s.world.db(), MACHINE).unwrap();
    assert_eq!(record["allowed_cidrs"], json!(["192.168.77.2/32"]));
    assert_eq!(
        record["source_smolmachine"]
            .as_str()
            .map(|p| p.ends_with(".smolmachine")),
        Some(true)
    );

    // Provisioned: CA, prompt, skills, git, supervise, environment.
    let guest = s.world.guest(MACHINE);
    assert!(
        std::fs::read_to_string(guest.join("etc/bottle/ca.pem"))
            .unwrap()
            .contains("TEST")
    );
    assert_eq!(
        std::fs::read_to_string(guest.join("etc/bottle/prompt.md")).unwrap(),
        "do the thing\n"
    );
    assert!(guest.join("etc/bottle/skills/review/SKILL.md").is_file());
    assert!(
        std::fs::read_to_string(guest.join("etc/bottle/mcp.json"))
            .unwrap()
            .contains("http://192.168.77.2:9100/mcp")
    );
    assert_eq!(
        std::fs::read_to_string(guest.join("etc/profile.d/bottle.sh")).unwrap(),
        ". /etc/bottle/env\n"
    );

    // Commands see the bottle's environment; exit codes come through.
    let out = bottle
        .exec(&[
            "sh".into(),
            "-c".into(),
            "echo \"$HTTPS_PROXY $EDITOR $GIT_CONFIG_VALUE_0\"; exit 4".into(),
        ])
        .unwrap();
    assert_eq!(out.exit_code, 4);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "http://192.168.77.2:8888 vi https://example.com/repo.git\n"
    );
    let file = s.world.dir.path().join("notes.txt");
    std::fs::write(&file, "n").unwrap();
    let copy = bottle_core::copy::CopyIn::from_host(&file).unwrap();
    let tmp = bottle_core::copy::GuestPath::parse("/tmp").unwrap();
    bottle.copy_in(&copy, &tmp).unwrap();
    assert!(guest.join("tmp/notes.txt").is_file());

    // Listed, attachable, then stopped with nothing left.
    let list = s.backend.list_active().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, MACHINE);
    assert_eq!(list[0].agent, "coder");
    assert_eq!(list[0].state, "running");
    assert_eq!(list[0].bundle_address.as_deref(), Some("192.168.77.2"));
    let record = bottle_core::life::StateDir::new(state_file(&s).parent().unwrap())
        .read()
        .unwrap()
        .unwrap();
    assert!(!record.legacy);
    assert_eq!(record.record.phase, bottle_core::life::Phase::Running);
    assert_eq!(record.record.backend, BackendKind::Smolmachines);
    let attached = s.backend.attach("coder").unwrap();
    assert_eq!(attached.exec(&["true".into()]).unwrap().exit_code, 0);
    // No image is made of a microVM: refused as unsupported, with why.
    let refused = attached.commit("kept:1").unwrap_err();
    assert_eq!(refused.kind, BackendErrorKind::Unsupported);
    assert_eq!(refused.code, "BOT-K095");

    // The image is now a cache hit.
    let again = s.backend.prepare(&s.spec).unwrap();
    let image_line = again
        .backend_lines
        .iter()
        .find(|(k, _)| k == "image")
        .unwrap();
    assert!(image_line.1.starts_with("cached "), "{image_line:?}");

    let report = s.backend.stop(MACHINE).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(
        report.removed.contains(&format!("vm {MACHINE}")),
        "{report:?}"
    );
    assert!(
        report.removed.contains(&format!("bundle {MACHINE}")),
        "{report:?}"
    );
    // The audit log the bundle's host kept is reported, not dropped.
    assert_eq!(report.kept, [format!("audit log of {MACHINE}")]);
    assert_nothing_left(&s);
    assert!(!guest.exists());
    let err = s.backend.stop(MACHINE).unwrap_err();
    assert_eq!(err.kind, BackendErrorKind::NotFound);
}

#[test]
fn launch_on_the_newest_smolvm() {
    launch_and_check("1.9.3");
}

#[test]
fn launch_where_from_drops_the_allowlist() {
    // 1.1.3..1.7.x: enforced, but `create --from` drops --allow-cidr, so the
    // state-DB patch is what puts the /32 there.
    launch_and_check("1.1.3");
}

#[test]
fn cleanup_removes_orphans_and_nothing_else() {
    let s = setup("1.9.3", "");
    let artifact = s.world.dir.path().join("x.smolmachine");
    std::fs::write(&artifact, r#"{"format":"fake-smolmachine/1","image":"x"}"#).unwrap();
    let smolvm = s.backend.smolvm();
    // A machine with no state here (another install's, or one whose state
    // root went), and one that is not a bottle at all: neither is this
    // install's to remove.
    smolvm
        .create("bot-bottle-orphan", &artifact, &[], None)
        .unwrap();
    smolvm.start("bot-bottle-orphan").unwrap();
    smolvm
        .create("someone-elses-vm", &artifact, &[], None)
        .unwrap();
    // A state file whose machine is gone (written by a bottle before
    // `bottle.json`: version 1 held the launch's process and phase), and a
    // bundle nobody owns.
    let stale = s.world.state_root().join("stale");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(
        stale.join("smolvm.json"),
        serde_json::to_vec(&json!({
            "version": 1, "bottle": "bot-bottle-stale", "agent": "x", "machine": "bot-bottle-stale",
            "bundle_address": "192.168.77.2", "env": [], "default_command": [], "created": 1,
            "launch_pid": 0, "phase": "running"
        }))
        .unwrap(),
    )
    .unwrap();
    s.bundles
        .live
        .lock()
        .unwrap()
        .push("bot-bottle-stale".into());
    s.bundles
        .live
        .lock()
        .unwrap()
        .push("bot-bottle-lost".into());

    let listed: Vec<(String, String)> = s
        .backend
        .list_active()
        .unwrap()
        .into_iter()
        .map(|b| (b.name, b.state))
        .collect();
    assert_eq!(
        listed,
        [
            (
                "bot-bottle-orphan".to_string(),
                "running (orphaned: no bottle state)".to_string()
            ),
            (
                "bot-bottle-stale".to_string(),
                "vm missing (earlier state layout)".to_string()
            ),
        ]
    );

    // Listed first, removing nothing; a vm with no state in this install's
    // state root may be another install's: not listed, kept.
    let plan: Vec<(String, String)> = s
        .backend
        .cleanup_plan()
        .unwrap()
        .into_iter()
        .map(|item| (item.kind, item.name))
        .collect();
    assert_eq!(
        plan,
        [
            ("bottle".to_string(), "bot-bottle-stale".to_string()),
            ("bundle".to_string(), "bot-bottle-lost".to_string()),
        ]
    );
    assert!(stale.join("smolvm.json").exists());
    let report = s.backend.cleanup_orphans().unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(
        !report.removed.contains(&"vm bot-bottle-orphan".to_string()),
        "{report:?}"
    );
    assert!(
        report
            .removed
            .contains(&"bundle bot-bottle-stale".to_string()),
        "{report:?}"
    );
    assert!(
        report
            .removed
            .contains(&"bundle bot-bottle-lost".to_string()),
        "{report:?}"
    );
    assert!(!stale.join("smolvm.json").exists());
    assert_eq!(machines(&s), ["bot-bottle-orphan", "someone-elses-vm"]);
    assert!(s.bundles.live().is_empty());
    assert_eq!(s.backend.list_active().unwrap().len(), 1);
}

#[test]
fn attach_to_an_unknown_bottle_is_not_found() {
    let s = setup("1.9.3", "");
    let err = s.backend.attach("nobody").err().expect("not found");
    assert_eq!(err.kind, BackendErrorKind::NotFound);
}

#[test]
fn the_state_database_follows_smolvms_environment() {
    let s = setup("1.9.3", "");
    assert_eq!(s.backend.db_path().unwrap(), s.world.db());
}

#[test]
fn cleanup_finishes_off_a_launch_whose_process_died() {
    let s = setup("1.9.3", "");
    let artifact = s.world.dir.path().join("x.smolmachine");
    std::fs::write(&artifact, r#"{"format":"fake-smolmachine/1","image":"x"}"#).unwrap();
    s.backend
        .smolvm()
        .create(MACHINE, &artifact, &[], None)
        .unwrap();
    s.bundles.live.lock().unwrap().push(MACHINE.into());
    // A launcher that crashed between `machine create` and the end.
    #[expect(
        clippy::disallowed_methods,
        reason = "the test needs the pid of a process that has exited"
    )]
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    std::fs::create_dir_all(state_file(&s).parent().unwrap()).unwrap();
    std::fs::write(
        state_file(&s),
        serde_json::to_vec(&json!({
            "version": 1, "bottle": MACHINE, "agent": "coder", "machine": MACHINE,
            "bundle_address": "192.168.77.2", "env": [], "default_command": [], "created": 1,
            "launch_pid": dead, "phase": "launching"
        }))
        .unwrap(),
    )
    .unwrap();
    let listed = s.backend.list_active().unwrap();
    // A state file of the layout before `bottle.json`, read as such.
    assert_eq!(
        listed[0].state,
        "created (abandoned launch) (earlier state layout)"
    );
    let report = s.backend.cleanup_orphans().unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert_nothing_left(&s);
}

#[test]
fn cleanup_leaves_a_launch_in_progress_alone() {
    let s = setup("1.9.3", "");
    let artifact = s.world.dir.path().join("x.smolmachine");
    std::fs::write(&artifact, r#"{"format":"fake-smolmachine/1","image":"x"}"#).unwrap();
    s.backend
        .smolvm()
        .create(MACHINE, &artifact, &[], None)
        .unwrap();
    std::fs::create_dir_all(state_file(&s).parent().unwrap()).unwrap();
    std::fs::write(
        state_file(&s),
        serde_json::to_vec(&json!({
            "version": 1, "bottle": MACHINE, "agent": "coder", "machine": MACHINE,
            "bundle_address": null, "env": [], "default_command": [], "created": 1,
            "launch_pid": std::process::id(), "phase": "launching"
        }))
        .unwrap(),
    )
    .unwrap();
    let report = s.backend.cleanup_orphans().unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(machines(&s), [MACHINE]);
    assert!(state_file(&s).exists());
}

#[test]
fn the_agent_session_runs_the_image_command_with_the_bottle_env_on_the_terminal() {
    struct Recorder(std::sync::Mutex<Vec<Vec<String>>>);
    impl bottle_smolvm::interactive::InteractiveRunner for Recorder {
        fn run_interactive(&self, spec: &bottle_core::exec::CommandSpec) -> std::io::Result<i32> {
            self.0.lock().unwrap().push(spec.argv());
            Ok(7)
        }
    }
    let recorder = Arc::new(Recorder(std::sync::Mutex::new(Vec::new())));
    let s = setup("1.9.3", "");
    let backend = s.backend.with_interactive(
        Arc::clone(&recorder) as Arc<dyn bottle_smolvm::interactive::InteractiveRunner>
    );
    let artifact = s.world.dir.path().join("x.smolmachine");
    std::fs::write(&artifact, r#"{"format":"fake-smolmachine/1","image":"x"}"#).unwrap();
    backend
        .smolvm()
        .create(MACHINE, &artifact, &[], None)
        .unwrap();
    backend.smolvm().start(MACHINE).unwrap();
    let dir = s.world.state_root().join("coder");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("smolvm.json"),
        serde_json::to_vec(&json!({
            "version": 1, "bottle": MACHINE, "agent": "coder", "machine": MACHINE,
            "bundle_address": "192.168.77.2", "env": [["HTTPS_PROXY", "http://192.168.77.2:8888"]],
            "default_command": ["/bin/agent", "--serve"], "created": 1,
            "launch_pid": 1, "phase": "running"
        }))
        .unwrap(),
    )
    .unwrap();
    let bottle = backend.attach(MACHINE).unwrap();
    assert_eq!(bottle.exec_interactive(&[]).unwrap(), 7);
    let argv = recorder.0.lock().unwrap()[0].clone();
    let at = |w: &str| argv.iter().position(|a| a == w).unwrap();
    assert_eq!(&argv[1..5], ["machine", "exec", "--name", MACHINE]);
    assert_eq!(argv[at("-e") + 1], "HTTPS_PROXY=http://192.168.77.2:8888");
    assert!(at("-i") < at("--"));
    assert_eq!(&argv[at("--") + 1..], ["/bin/agent", "--serve"]);

    // `bottle exec` without -t: stdin passes through (-i), never a TTY.
    let command = ["cat".to_string()];
    assert_eq!(bottle.exec_piped(&command).unwrap(), 7);
    let argv = recorder.0.lock().unwrap()[1].clone();
    let at = |w: &str| argv.iter().position(|a| a == w);
    assert!(at("-i").unwrap() < at("--").unwrap(), "{argv:?}");
    assert_eq!(at("-t"), None, "{argv:?}");
    assert_eq!(&argv[at("--").unwrap() + 1..], ["cat"]);

    // Its state dir is of the layout before `bottle.json`: listed as such,
    // and stopped whole.
    let listed = backend.list_active().unwrap();
    assert_eq!(listed[0].state, "running (earlier state layout)");
    assert_eq!(listed[0].agent, "coder");
    let report = backend.stop(MACHINE).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(backend.smolvm().list().unwrap().is_empty());
    assert!(
        !dir.exists(),
        "{:?}",
        std::fs::read_dir(&dir).map(|d| d.count())
    );
}

/// A real certificate (bottle-core's test CA) and the name OpenSSL's
/// `-subject_hash` gives it.
const REAL_CA: &str = include_str!("../../../bottle-core/src/subject_hash/test-ca.pem");
const REAL_CA_HASH: &str = include_str!("../../../bottle-core/src/subject_hash/test-ca.hash");

#[test]
fn the_ca_is_installed_as_bottle_core_defines_and_its_problems_are_warnings() {
    let s = setup("1.9.3", "");
    if !sandbox_available(&s.world) {
        return;
    }
    std::fs::write(&s.bundles.ca, REAL_CA).unwrap();
    // The guest's /etc before boot: a bundle that is a relative symlink, a
    // Fedora bundle and anchor directory, a link that dangles.
    let guest = s.world.guest(MACHINE);
    let extracted = guest.join("etc/ca-certificates/extracted");
    std::fs::create_dir_all(&extracted).unwrap();
    std::fs::write(extracted.join("tls-ca-bundle.pem"), "ROOTS\n").unwrap();
    std::fs::create_dir_all(guest.join("etc/ssl/certs")).unwrap();
    std::os::unix::fs::symlink(
        "../../ca-certificates/extracted/tls-ca-bundle.pem",
        guest.join("etc/ssl/certs/ca-certificates.crt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "/nix/store/gone/ca-bundle.crt",
        guest.join("etc/ssl/cert.pem"),
    )
    .unwrap();
    std::fs::create_dir_all(guest.join("etc/pki/tls/certs")).unwrap();
    std::fs::write(guest.join("etc/pki/tls/certs/ca-bundle.crt"), "ROOTS\n").unwrap();
    std::fs::create_dir_all(guest.join("etc/pki/ca-trust/source/anchors")).unwrap();

    let plan = s.backend.prepare(&s.spec).unwrap();
    let bottle = s.backend.launch(&plan).unwrap();
    let read = |path: &str| std::fs::read_to_string(guest.join(path)).unwrap();
    assert_eq!(read("etc/bottle/ca.pem"), REAL_CA);
    assert_eq!(
        read("etc/ca-certificates/extracted/tls-ca-bundle.pem"),
        format!("ROOTS\n{REAL_CA}")
    );
    assert!(
        std::fs::symlink_metadata(guest.join("etc/ssl/certs/ca-certificates.crt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        read("etc/pki/tls/certs/ca-bundle.crt"),
        format!("ROOTS\n{REAL_CA}")
    );
    assert_eq!(read("etc/pki/ca-trust/source/anchors/bottle.pem"), REAL_CA);
    assert_eq!(
        read(&format!("etc/ssl/certs/{}.0", REAL_CA_HASH.trim())),
        REAL_CA
    );
    assert!(!guest.join("etc/bottle/.ca-install").exists());
    assert!(!s.world.state_root().join("coder/ca-install").exists());

    // The dangling link is a warning on the bottle. (The fake's guest sees
    // the host's read-only /usr, so a host with Debian's tool adds a
    // refused anchor write; nothing under /etc is refused.)
    let warnings = bottle.launch_warnings();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("/etc/ssl/cert.pem") && w.contains("/nix/store/gone")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .all(|w| w.contains("/etc/ssl/cert.pem") || w.contains("could not write /usr/")),
        "{warnings:?}"
    );
    s.backend.stop(MACHINE).unwrap();
    assert_nothing_left(&s);
}

/// `BOTTLE_FAILPOINT` after every step of the microVM's launch fails it
/// there, and the launch unwinds everything it had made.
#[test]
fn every_failed_step_unwinds_everything() {
    use bottle_core::launch_steps::LaunchStep as _;
    if !sandbox_available(&setup("1.9.3", "").world) {
        return;
    }
    for step in bottle_smolvm::launch::Step::ALL
        .iter()
        .map(|step| step.name())
    {
        let s = setup("1.9.3", "");
        let backend = s.backend.with_failpoint(Some(step.to_string()));
        let s = Setup { backend, ..s };
        let plan = s.backend.prepare(&s.spec).unwrap();
        let err = s
            .backend
            .launch(&plan)
            .map(drop)
            .expect_err(&format!("{step}: the launch succeeded"));
        assert_eq!(err.code, "BOT-K074", "{step}: {err}");
        assert!(
            err.message.contains(&format!("after step {step} ")),
            "{step}: {err}"
        );
        assert_nothing_left(&s);
    }
}

/// A failpoint naming neither the microVM's steps nor its bundle host's
/// is refused before anything starts, listing both; one naming a step of
/// the bundle host's is left to the host.
#[test]
fn failpoints_are_the_microvms_or_its_bundle_hosts() {
    for value in ["machine-strat", "machine-create:sleep:sleep"] {
        let s = setup("1.9.3", "");
        let backend = s.backend.with_failpoint(Some(value.into()));
        let s = Setup { backend, ..s };
        let plan = s.backend.prepare(&s.spec).unwrap();
        let err = s.backend.launch(&plan).map(drop).unwrap_err();
        assert_eq!(err.code, "BOT-K075", "{value}: {err}");
        assert!(err.message.contains("machine-create"), "{err}");
        assert!(s.bundles.calls().is_empty(), "{:?}", s.bundles.calls());
        assert_nothing_left(&s);
    }
}

/// `bottle start --timings` on smolmachines: every step of the launch
/// ends a lap, in order.
#[test]
fn every_step_ends_a_lap_on_the_timeline() {
    use bottle_core::launch_steps::LaunchStep as _;
    let s = setup("1.9.3", "");
    if !sandbox_available(&s.world) {
        return;
    }
    let timeline = bottle_core::timeline::Timeline::new();
    let backend = s.backend.with_timeline(Some(timeline.clone()));
    let s = Setup { backend, ..s };
    let plan = s.backend.prepare(&s.spec).unwrap();
    let bottle = s.backend.launch(&plan).unwrap();
    drop(bottle);
    let laps: Vec<String> = timeline.laps().into_iter().map(|lap| lap.name).collect();
    let steps: Vec<&str> = bottle_smolvm::launch::Step::ALL
        .iter()
        .map(|step| step.name())
        .collect();
    assert_eq!(laps, steps);
    s.backend.stop(MACHINE).unwrap();
    assert_nothing_left(&s);
}

#[test]
fn an_interrupted_launch_unwinds_what_it_started() {
    let s = setup("1.9.3", "");
    let interrupt = bottle_core::undo::Interrupt::default();
    let backend = s.backend.with_interrupt(interrupt.clone());
    let s = Setup { backend, ..s };
    *s.bundles.interrupt_on_start.lock().unwrap() = Some(interrupt);
    let plan = s.backend.prepare(&s.spec).unwrap();
    let err = s.backend.launch(&plan).map(drop).unwrap_err();
    assert_eq!(err.code, "BOT-S007", "{err}");
    assert!(err.message.contains("after step bundle"), "{err}");
    assert!(
        s.bundles.calls().iter().any(|c| c.starts_with("stop ")),
        "the started bundle was not stopped: {:?}",
        s.bundles.calls()
    );
    assert_nothing_left(&s);
}

/// A running microVM bottle as a launch leaves it: the machine, the
/// bundle, the record.
fn lay_out_running_bottle(s: &Setup) -> bottle_core::life::StateDir {
    let artifact = s.world.dir.path().join("x.smolmachine");
    std::fs::write(&artifact, r#"{"format":"fake-smolmachine/1","image":"x"}"#).unwrap();
    let smolvm = s.backend.smolvm();
    smolvm.create(MACHINE, &artifact, &[], None).unwrap();
    smolvm.start(MACHINE).unwrap();
    s.bundles.live.lock().unwrap().push(MACHINE.into());
    let dir = bottle_core::life::StateDir::new(state_file(s).parent().unwrap());
    let record =
        bottle_core::life::BottleRecord::launching(MACHINE, "coder", BackendKind::Smolmachines);
    dir.begin(&record).unwrap();
    dir.advance(bottle_core::life::Phase::Running).unwrap();
    dir
}

/// `bottle stop` on smolmachines in two parts: the first records the
/// bottle as stopping and stops its machine (nothing of the agent runs);
/// the finish removes the machine, the bundle and the state, and only
/// while the record says stopping.
#[test]
fn a_microvm_bottle_stops_in_two_parts_and_a_late_finish_spares_a_new_one() {
    use bottle_core::backend::StopProgress;
    use bottle_core::life::Phase;
    let s = setup("1.9.3", "");
    let dir = lay_out_running_bottle(&s);
    let StopProgress::Stopping(report) = s.backend.begin_stop("coder").unwrap() else {
        panic!("a microVM bottle with a record stops in two parts");
    };
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(dir.phase(), Some(Phase::Stopping));
    let machine = s.backend.smolvm().list().unwrap();
    assert_eq!(machine.len(), 1);
    assert_ne!(
        machine[0].state(),
        "running",
        "the agent's machine is stopped"
    );
    assert_eq!(s.bundles.live(), [MACHINE]);
    let listed = s.backend.list_active().unwrap();
    assert_eq!(listed[0].state, "stopping");

    let report = s.backend.finish_stop(MACHINE).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(
        report.removed.contains(&format!("vm {MACHINE}")),
        "{report:?}"
    );
    assert_nothing_left(&s);
    assert!(!dir.root().exists());

    // A new bottle of the name: a finisher that comes late removes nothing.
    let dir = lay_out_running_bottle(&s);
    let report = s.backend.finish_stop(MACHINE).unwrap();
    assert_eq!(report, bottle_core::backend::CleanupReport::default());
    assert_eq!(machines(&s), [MACHINE]);
    assert_eq!(dir.phase(), Some(Phase::Running));
}

/// A stop whose finisher died: `cleanup` finishes it, machine and all.
#[test]
fn cleanup_finishes_a_microvm_stop_whose_finisher_died() {
    use bottle_core::backend::StopProgress;
    let s = setup("1.9.3", "");
    lay_out_running_bottle(&s);
    let StopProgress::Stopping(_) = s.backend.begin_stop("coder").unwrap() else {
        panic!("a microVM bottle with a record stops in two parts");
    };
    let plan: Vec<(String, String)> = s
        .backend
        .cleanup_plan()
        .unwrap()
        .into_iter()
        .map(|item| (item.kind, item.why))
        .collect();
    assert_eq!(
        plan,
        [(
            "bottle".to_string(),
            "its stop was not finished".to_string()
        )]
    );
    let report = s.backend.cleanup_orphans().unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert_nothing_left(&s);
}

/// A launch of the name of a bottle whose stop is not finished finishes
/// that stop first, then starts: never beside the old one's leftovers.
#[test]
fn a_launch_finishes_the_unfinished_stop_of_its_name_first() {
    use bottle_core::backend::StopProgress;
    let s = setup("1.9.3", "");
    lay_out_running_bottle(&s);
    let StopProgress::Stopping(_) = s.backend.begin_stop("coder").unwrap() else {
        panic!("a microVM bottle with a record stops in two parts");
    };
    let plan = s.backend.prepare(&s.spec).unwrap();
    let bottle = s.backend.launch(&plan).unwrap();
    drop(bottle);
    assert!(
        s.bundles.calls().contains(&format!("stop {MACHINE}")),
        "{:?}",
        s.bundles.calls()
    );
    let record = bottle_core::life::StateDir::new(state_file(&s).parent().unwrap());
    assert_eq!(record.phase(), Some(bottle_core::life::Phase::Running));
    assert_eq!(machines(&s), [MACHINE]);
    s.backend.stop(MACHINE).unwrap();
    assert_nothing_left(&s);
}
