//! The subnet pool when it is full, and a planned subnet that a launch
//! running at the same time took first: both say so, with a fix, and the
//! refused launch leaves nothing behind. The pool is made one `/24` small
//! through the operator's own knob rather than by starting 253 bottles.

use bottle_core::{BottleBackend, BottleLauncher};

use crate::support::{self, Guard};

/// One `/24`: the first bottle takes it all.
const TINY_POOL: &str = "10.213.77.0/24";

#[test]
fn a_full_subnet_pool_and_a_taken_subnet_say_so() {
    let Some(fx) = support::setup_with("a_full_subnet_pool_and_a_taken_subnet_say_so", |o| {
        o.subnet_pool = Some(TINY_POOL.parse().unwrap());
    }) else {
        return;
    };
    let (first, second, third) = (
        support::name("pool-first"),
        support::name("pool-second"),
        support::name("pool-third"),
    );
    let _guards = [&first, &second, &third].map(|name| Guard {
        backend: &fx.backend,
        name: name.clone(),
    });

    // Planned before either runs, both plans hold the pool's one subnet,
    // as two `bottle start`s at the same time would.
    let first_plan = fx.backend.prepare(&fx.spec(&first)).unwrap();
    let second_plan = fx.backend.prepare(&fx.spec(&second)).unwrap();
    assert_eq!(first_plan.backend_data.bundle.subnet, TINY_POOL);
    assert_eq!(second_plan.backend_data.bundle.subnet, TINY_POOL);
    let first_bottle = fx.backend.launch(&first_plan).unwrap();

    let Err(taken) = fx.backend.launch(&second_plan) else {
        panic!("a second bottle launched on a subnet already in use");
    };
    assert_eq!(taken.code, "BOT-D150", "{taken}");
    assert_eq!(
        taken.kind,
        bottle_core::backend::BackendErrorKind::PlanTaken,
        "the CLI plans again on this kind"
    );
    assert!(taken.message.contains(TINY_POOL), "{}", taken.message);
    assert!(
        taken.fix.contains("start the bottle again"),
        "{}",
        taken.fix
    );
    assert_eq!(
        support::resources_of(&fx.backend, &second),
        Vec::<String>::new(),
        "the refused launch left resources"
    );
    assert!(
        !second_plan.state_dir.exists(),
        "the refused launch left its state dir"
    );

    // Planning a third now finds the pool full.
    let Err(full) = fx.backend.prepare(&fx.spec(&third)) else {
        panic!("a bottle was planned from a full pool");
    };
    assert_eq!(full.code, "BOT-N001", "{full}");
    assert!(full.message.contains(TINY_POOL), "{}", full.message);
    assert!(full.message.contains("all 1 "), "{}", full.message);
    assert!(full.fix.contains("BOTTLE_SUBNET_POOL"), "{}", full.fix);
    assert!(full.fix.contains("bottle stop"), "{}", full.fix);

    // Stopping the first frees it.
    drop(first_bottle);
    fx.backend.stop(&first).unwrap();
    let freed = fx.backend.prepare(&fx.spec(&third)).unwrap();
    assert_eq!(freed.backend_data.bundle.subnet, TINY_POOL);
}
