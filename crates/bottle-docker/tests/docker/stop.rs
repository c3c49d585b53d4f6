//! A stop in two parts: `begin_stop` removes the agent's container and
//! leaves the bundle, the network and the state dir (recorded as
//! stopping); `finish_stop` removes
//! them even when the state dir vanished first or is vanishing as it comes
//! (a test's temp dir, an operator's `rm -rf`), and a late finisher spares
//! a new bottle of the same name.

use bottle_core::backend::StopProgress;
use bottle_core::life::{Phase, StateDir};
use bottle_core::{BottleBackend, slug::bottle_name};

use crate::support::{self, name, resources_of};

#[test]
fn a_stop_begun_is_finished_without_its_state_dir_and_a_late_finish_spares_a_new_bottle() {
    let test =
        "a_stop_begun_is_finished_without_its_state_dir_and_a_late_finish_spares_a_new_bottle";
    let Some(fx) = support::setup(test) else {
        return;
    };
    let name = name("stop2");
    let full = bottle_name(&name);
    let state_dir = fx.state.path().join(&name);

    let (_guard, bottle) = fx.start(&name);
    drop(bottle);
    let StopProgress::Stopping(report) = fx.backend.begin_stop(&full).unwrap() else {
        panic!("a docker bottle with a state dir stops in two parts");
    };
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        report.removed,
        [format!("container bot-bottle-{name}-agent")],
        "begin_stop removes the agent's container alone"
    );
    let left = resources_of(&fx.backend, &name);
    assert!(
        left.len() == 2
            && left
                .iter()
                .any(|r| r.starts_with("container") && r.contains(&format!("{name}-bundle")))
            && left.contains(&format!("network bot-bottle-{name}")),
        "begin_stop leaves the bundle and the network: {left:?}"
    );
    assert_eq!(
        StateDir::new(&state_dir).phase(),
        Some(Phase::Stopping),
        "the record says the bottle is stopping"
    );

    // The state dir goes before the finisher gets to it.
    std::fs::remove_dir_all(&state_dir).unwrap();
    let report = fx.backend.finish_stop(&full).unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    for gone in [
        format!("container bot-bottle-{name}-bundle"),
        format!("network bot-bottle-{name}"),
    ] {
        assert!(report.removed.contains(&gone), "{:?}", report.removed);
    }
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());

    // The state dir is being removed as the finisher comes: the record is
    // gone, the dir not yet (`rm -rf` deletes what is inside first). The
    // finisher waits for the dir to go and removes the rest.
    let (_guard, bottle) = fx.start(&name);
    drop(bottle);
    let StopProgress::Stopping(_) = fx.backend.begin_stop(&full).unwrap() else {
        panic!("a docker bottle with a state dir stops in two parts");
    };
    std::fs::remove_file(state_dir.join(bottle_core::life::RECORD_FILE)).unwrap();
    let removing = {
        let state_dir = state_dir.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::fs::remove_dir_all(&state_dir).unwrap();
        })
    };
    let report = fx.backend.finish_stop(&full).unwrap();
    removing.join().unwrap();
    assert!(
        report
            .removed
            .contains(&format!("container bot-bottle-{name}-bundle")),
        "{:?}",
        report.removed
    );
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());

    // A new bottle of the same name, not stopping: a finisher that comes
    // late removes nothing of it.
    let (_guard, bottle) = fx.start(&name);
    drop(bottle);
    let before = resources_of(&fx.backend, &name);
    assert_eq!(before.len(), 3, "{before:?}");
    let report = fx.backend.finish_stop(&full).unwrap();
    assert_eq!(report.removed, Vec::<String>::new());
    assert_eq!(resources_of(&fx.backend, &name), before);
    assert!(state_dir.join("plan.json").is_file());
}

/// A bottle whose state dir is of the layout before `bottle.json` (the
/// plan, `owner.json`, `launched`; `stopping` once its stop began), as a
/// bottle started by an earlier `bottle` left it: listed, saying so, and
/// stopped in two parts all the same.
#[test]
fn a_bottle_of_the_earlier_state_layout_is_listed_and_stopped() {
    let Some(fx) = support::setup("a_bottle_of_the_earlier_state_layout_is_listed_and_stopped")
    else {
        return;
    };
    let name = name("legacy");
    let full = bottle_name(&name);
    let state_dir = fx.state.path().join(&name);
    let (_guard, bottle) = fx.start(&name);
    drop(bottle);
    let record = StateDir::new(&state_dir).read().unwrap().unwrap().record;
    std::fs::remove_file(state_dir.join(bottle_core::life::RECORD_FILE)).unwrap();
    std::fs::write(
        state_dir.join("owner.json"),
        serde_json::to_vec(&record.owner).unwrap(),
    )
    .unwrap();
    std::fs::write(state_dir.join("launched"), "1\n").unwrap();

    let listed = fx.backend.list_active().unwrap();
    let this = listed.iter().find(|b| b.name == full).unwrap();
    assert_eq!(this.state, "running (earlier state layout)", "{listed:?}");

    let StopProgress::Stopping(report) = fx.backend.begin_stop(&full).unwrap() else {
        panic!("a docker bottle with a state dir stops in two parts");
    };
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    // The stop's record is the first `bottle.json` of this state dir.
    let stopping = StateDir::new(&state_dir).read().unwrap().unwrap();
    assert!(!stopping.legacy);
    assert_eq!(stopping.record.phase, Phase::Stopping);
    assert_eq!(stopping.record.owner, record.owner);
    let report = fx.backend.finish_stop(&full).unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(resources_of(&fx.backend, &name), Vec::<String>::new());
    assert!(!state_dir.exists());
}
