//! Property tests of takeover on the simulator: generated fault schedules strike the active
//! router, and every invariant must hold. proptest shrinks a failing schedule to the smallest
//! one that still fails. Such a schedule is stored in `takeover_props.proptest-regressions`, and
//! named below as a story.

use piecework_sim::{Config, Fault, FaultMix, Report, Target, run};
use proptest::prelude::*;

fn config(nodes: usize, schedule: Vec<(u64, Fault)>) -> Config {
    Config {
        nodes,
        tasks: 24,
        fault_ms: 40_000,
        mix: FaultMix::calm(),
        schedule,
        ..Config::default()
    }
}

fn check(seed: u64, config: &Config) -> Report {
    let r = run(seed, config);
    assert!(
        r.passed() && r.lost == 0,
        "seed {seed}, schedule {:?}: {:#?}\n{}",
        config.schedule,
        r.violations,
        r.trace_tail.join("\n")
    );
    r
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![4 => Just(Target::Router), 1 => (0usize..5).prop_map(Target::Node)]
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        target().prop_map(Fault::Crash),
        target().prop_map(Fault::Isolate),
        Just(Fault::Halves),
        target().prop_map(Fault::SilenceOut),
        (target(), 1_000u64..8_000, 1_000u64..15_000).prop_map(|(target, extra_ms, for_ms)| {
            Fault::DelayBeats {
                target,
                extra_ms,
                for_ms,
            }
        }),
        Just(Fault::Heal),
    ]
}

fn schedule() -> impl Strategy<Value = Vec<(u64, Fault)>> {
    prop::collection::vec((0u64..36_000, fault()), 1..6).prop_map(|mut v| {
        v.sort_by_key(|(t, _)| *t);
        v
    })
}

/// 24 schedules per test run (CI); `PROPTEST_CASES=2000` hunts longer.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(cases()))]

    #[test]
    fn takeover_holds_under_generated_fault_schedules(
        seed in any::<u64>(),
        nodes in 3usize..=5,
        schedule in schedule(),
    ) {
        check(seed, &config(nodes, schedule));
    }
}

// ----- stories: schedules worth keeping by name -----

/// The router crashes; the others take over with the next term, and it rejoins as a follower.
#[test]
fn the_router_crashes_mid_run() {
    for seed in 0..8 {
        let r = check(
            seed,
            &config(5, vec![(5_000, Fault::Crash(Target::Router))]),
        );
        assert!(r.activations >= 2, "a takeover happened: {r:?}");
    }
}

/// The router is cut off for a long time: a new one is elected on the majority side, and when
/// the network heals the old one sees the greater claim and steps down.
#[test]
fn the_router_is_partitioned_away_then_healed() {
    for seed in 0..8 {
        let r = check(
            seed,
            &config(
                5,
                vec![
                    (5_000, Fault::Isolate(Target::Router)),
                    (20_000, Fault::Heal),
                ],
            ),
        );
        assert!(r.activations >= 2, "{r:?}");
    }
}

/// The router's heartbeats arrive later than the takeover timeout while it still works: a
/// follower takes over although the router is alive, and fencing keeps the two apart.
#[test]
fn the_routers_heartbeats_are_delayed_past_the_timeout() {
    for seed in 0..8 {
        let delay = Fault::DelayBeats {
            target: Target::Router,
            extra_ms: 6_000,
            for_ms: 12_000,
        };
        check(seed, &config(4, vec![(5_000, delay)]));
    }
}

/// Followers that heard the same last heartbeat claim at about the same time: across seeds,
/// some claims lose to a concurrent greater one during their settle wait, and every run still
/// ends with one router.
#[test]
fn two_routers_claim_at_once() {
    let mut lost = 0;
    for seed in 0..24 {
        let r = check(
            seed,
            &config(5, vec![(5_000, Fault::Crash(Target::Router))]),
        );
        lost += r.claims_lost;
    }
    assert!(
        lost > 0,
        "no two claims ever met: the concurrent-claim path went untested"
    );
}

/// Halves with no majority anywhere: each side may elect its own router; after healing, the
/// greatest claim wins everywhere.
#[test]
fn the_cluster_splits_in_halves_then_heals() {
    for seed in 0..8 {
        check(
            seed,
            &config(4, vec![(4_000, Fault::Halves), (25_000, Fault::Heal)]),
        );
    }
}
