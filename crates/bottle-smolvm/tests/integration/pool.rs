//! The warm pool on microVM bottles, against the fake: entries filled
//! like a cold launch, listed as pooled, claimed once each after their
//! checks, refused and removed when their machine or bundle changed while
//! they waited, drained, and cleaned up when they can no longer be claimed.

use bottle_core::backend::{BottleBackend as _, BottleLauncher as _};
use bottle_core::pool::{self, WarmPool as _};
use bottle_core::sandbox::ToolCall;
use bottle_core::spec::BottleSpec;

use crate::backend::{Setup, setup};
use crate::support::sandbox_available;

/// A backend with the in-box agent (a pooled bottle needs the golden
/// snapshot it takes), or `None` after a skip line.
fn pool_setup() -> Option<Setup> {
    let toolbox = crate::sandbox::toolbox()?;
    let s = setup("1.9.3", "");
    if !sandbox_available(&s.world) {
        return None;
    }
    let backend = s.backend.with_toolbox_binary(Some(toolbox));
    Some(Setup { backend, ..s })
}

/// The spec of a fresh entry of the agent.
fn entry_spec(s: &Setup) -> BottleSpec {
    let manifest_path = s.spec.manifest_path.clone();
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    let manifest = bottle_core::manifest::parse(&manifest_path, &text).unwrap();
    let name = pool::entry_name("coder").unwrap();
    BottleSpec::new(
        &manifest,
        &manifest_path,
        "coder",
        Some(&name),
        &s.world.state_root(),
    )
    .unwrap()
}

/// Fills one entry as `bottle pool fill` does; its bottle name and the
/// fingerprint a start of the agent would compute.
fn fill(s: &Setup) -> (String, String) {
    let spec = entry_spec(s);
    let plan = s.backend.prepare(&spec).unwrap();
    let fingerprint = s.backend.pool_fingerprint(&spec, &plan.devices).unwrap();
    drop(s.backend.launch(&plan).unwrap());
    s.backend.mark_pooled(&plan, &fingerprint).unwrap();
    (plan.bottle, fingerprint)
}

fn state_of(s: &Setup, name: &str) -> String {
    s.backend
        .list_active()
        .unwrap()
        .into_iter()
        .find(|b| b.name == name)
        .map_or_else(|| "gone".into(), |b| b.state)
}

fn machine_exists(s: &Setup, name: &str) -> bool {
    s.backend
        .smolvm()
        .list()
        .unwrap()
        .iter()
        .any(|m| m.name == name)
}

#[test]
fn a_pooled_microvm_is_listed_claimed_once_after_its_checks_and_drained() {
    let Some(s) = pool_setup() else { return };
    let (first, fingerprint) = fill(&s);
    let (second, again) = fill(&s);
    assert_eq!(fingerprint, again, "two entries of one manifest");
    assert_eq!(state_of(&s, &first), "pooled");
    let listed: Vec<(String, String)> = pool::list(&s.world.state_root())
        .into_iter()
        .map(|e| (e.name, e.state))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");

    let claim = s.backend.claim_pooled("coder", &fingerprint, true).unwrap();
    assert!(claim.refused.is_empty(), "{:?}", claim.refused);
    let (bottle, plan) = claim.bottle.expect("the oldest entry passes");
    assert_eq!(bottle.name(), first);
    assert_eq!(plan.bottle, first);
    assert!(
        s.bundles.calls().contains(&format!("health {first}")),
        "{:?}",
        s.bundles.calls()
    );
    // What was handed out runs tool calls; it is no longer pooled.
    let result = bottle
        .execute(&ToolCall::argv(["echo", "claimed"]))
        .unwrap();
    assert_eq!(result.stdout, b"claimed\n");
    assert_eq!(state_of(&s, &first), "running");
    assert!(pool::claim_record(&s.world.state_root().join(&plan.slug)).is_some());

    // The claimed one is not claimed again; the second is.
    let claim = s.backend.claim_pooled("coder", &fingerprint, true).unwrap();
    let (next, _) = claim.bottle.expect("the second entry passes");
    assert_eq!(next.name(), second);
    drop(next);
    let claim = s.backend.claim_pooled("coder", &fingerprint, true).unwrap();
    assert!(claim.bottle.is_none() && claim.refused.is_empty());

    let (third, _) = fill(&s);
    let drained = s.backend.drain_pool(Some("coder")).unwrap();
    assert!(
        drained.removed.contains(&format!("vm {third}")),
        "{drained:?}"
    );
    assert!(!machine_exists(&s, &third));
    for name in [&first, &second] {
        assert!(machine_exists(&s, name), "a drain took claimed {name}");
        s.backend.stop(name).unwrap();
    }
    assert!(s.bundles.live().is_empty(), "{:?}", s.bundles.live());
}

#[test]
fn a_claim_refuses_and_removes_entries_that_changed_while_they_waited() {
    let Some(s) = pool_setup() else { return };
    let (restarted, fingerprint) = fill(&s);
    let (bundle_restarted, _) = fill(&s);
    let (passes, _) = fill(&s);
    let (unhealthy, _) = fill(&s);

    // The machine stopped and started again: another VMM, booted anew.
    s.backend.smolvm().stop(&restarted).unwrap();
    s.backend.smolvm().start(&restarted).unwrap();
    s.bundles
        .restarted
        .lock()
        .unwrap()
        .push(bundle_restarted.clone());
    let claim = s
        .backend
        .claim_pooled("coder", &fingerprint, false)
        .unwrap();
    let (taken, _) = claim.bottle.expect("an entry passes");
    let refused = claim.refused;
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0].0, restarted);
    assert!(refused[0].1.contains("machine's"), "{refused:?}");
    assert_eq!(refused[1].0, bundle_restarted);
    assert!(
        refused[1].1.contains("bundle's restarted changed"),
        "{refused:?}"
    );
    assert_eq!(taken.name(), passes);
    for name in [&restarted, &bundle_restarted] {
        assert!(!machine_exists(&s, name), "refused {name} left running");
        assert_eq!(state_of(&s, name), "gone");
    }
    drop(taken);
    s.backend.stop(&passes).unwrap();

    // The last one's bundle stops answering its health check.
    *s.bundles.unhealthy.lock().unwrap() = Some("the proxy does not answer".into());
    let claim = s
        .backend
        .claim_pooled("coder", &fingerprint, false)
        .unwrap();
    assert!(claim.bottle.is_none());
    assert_eq!(
        claim.refused,
        [(unhealthy.clone(), "the proxy does not answer".to_string())]
    );
    assert!(!machine_exists(&s, &unhealthy));
    *s.bundles.unhealthy.lock().unwrap() = None;

    // A process left running in the guest while it waited.
    let (planted, _) = fill(&s);
    let out = s
        .backend
        .attach(&planted)
        .unwrap()
        .exec(&[
            "sh".into(),
            "-c".into(),
            "sleep 1000 </dev/null >/dev/null 2>&1 &".into(),
        ])
        .unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let claim = s
        .backend
        .claim_pooled("coder", &fingerprint, false)
        .unwrap();
    assert!(claim.bottle.is_none());
    assert_eq!(claim.refused.len(), 1, "{:?}", claim.refused);
    assert_eq!(claim.refused[0].0, planted);
    assert!(
        claim.refused[0].1.contains("open_fds: expected"),
        "{:?}",
        claim.refused
    );
    assert!(!machine_exists(&s, &planted));

    // Another manifest, image or binary: a start's fingerprint differs.
    let (other, _) = fill(&s);
    *s.bundles.made_from.lock().unwrap() = "bundle v2".into();
    let spec = entry_spec(&s);
    let plan = s.backend.prepare(&spec).unwrap();
    let changed = s.backend.pool_fingerprint(&spec, &plan.devices).unwrap();
    assert_ne!(changed, fingerprint);
    let claim = s.backend.claim_pooled("coder", &changed, false).unwrap();
    assert!(claim.bottle.is_none());
    assert_eq!(claim.refused.len(), 1);
    assert_eq!(claim.refused[0].0, other);
    assert!(claim.refused[0].1.contains("fingerprint differs"));
    assert!(s.bundles.live().is_empty(), "{:?}", s.bundles.live());
}

#[test]
fn cleanup_removes_a_waiting_entry_whose_machine_was_started_again() {
    let Some(s) = pool_setup() else { return };
    let (entry, _) = fill(&s);
    let (kept, _) = fill(&s);
    s.backend.smolvm().stop(&entry).unwrap();
    s.backend.smolvm().start(&entry).unwrap();
    let found = s.backend.cleanup_plan().unwrap();
    let names: Vec<(&str, &str)> = found
        .iter()
        .map(|item| (item.kind.as_str(), item.name.as_str()))
        .collect();
    assert_eq!(names, [("pool entry", entry.as_str())], "{found:?}");
    assert!(found[0].why.contains("pid changed"), "{found:?}");
    let report = s.backend.cleanup_approved(&found).unwrap();
    assert!(
        report.removed.contains(&format!("vm {entry}")),
        "{report:?}"
    );
    assert!(!machine_exists(&s, &entry));
    assert_eq!(state_of(&s, &kept), "pooled");
    assert!(s.backend.cleanup_plan().unwrap().is_empty());
    s.backend.drain_pool(None).unwrap();
    assert!(s.bundles.live().is_empty(), "{:?}", s.bundles.live());
}
