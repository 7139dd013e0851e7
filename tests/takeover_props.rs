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

/// A fault's target: mostly the router, else a node of the cluster (never one beyond it, which
/// would strike nothing: the simulator refuses such a schedule).
fn target(nodes: usize) -> impl Strategy<Value = Target> {
    prop_oneof![4 => Just(Target::Router), 1 => (0..nodes).prop_map(Target::Node)]
}

fn fault(nodes: usize) -> impl Strategy<Value = Fault> {
    prop_oneof![
        target(nodes).prop_map(Fault::Crash),
        target(nodes).prop_map(Fault::Isolate),
        Just(Fault::Halves),
        target(nodes).prop_map(Fault::SilenceOut),
        (target(nodes), 1_000u64..8_000, 1_000u64..15_000).prop_map(
            |(target, extra_ms, for_ms)| Fault::DelayBeats {
                target,
                extra_ms,
                for_ms,
            }
        ),
        Just(Fault::Heal),
    ]
}

/// A node count (3–5) and a schedule for that many nodes.
fn cluster_and_schedule() -> impl Strategy<Value = (usize, Vec<(u64, Fault)>)> {
    (3usize..=5).prop_flat_map(|nodes| {
        let schedule =
            prop::collection::vec((0u64..36_000, fault(nodes)), 1..6).prop_map(|mut v| {
                v.sort_by_key(|(t, _)| *t);
                v
            });
        (Just(nodes), schedule)
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
        (nodes, schedule) in cluster_and_schedule(),
    ) {
        check(seed, &config(nodes, schedule));
    }
}

// ----- stories: schedules worth keeping by name -----

/// How often `kind` was counted in a run.
fn counted(r: &Report, kind: &str) -> u64 {
    r.faults.get(kind).copied().unwrap_or(0)
}

/// The router crashes; the others take over with the next term, and it rejoins as a follower.
#[test]
fn the_router_crashes_mid_run() {
    for seed in 0..8 {
        let r = check(
            seed,
            &config(5, vec![(5_000, Fault::Crash(Target::Router))]),
        );
        assert_eq!(counted(&r, "crash"), 1, "the crash struck: {r:?}");
        assert!(r.takeovers >= 1, "a takeover happened: {r:?}");
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
        assert_eq!(counted(&r, "isolate"), 1, "the router was isolated: {r:?}");
        assert!(r.takeovers >= 1, "a takeover happened: {r:?}");
        assert!(
            counted(&r, "router_stepped_down") >= 1,
            "the old router stepped down: {r:?}"
        );
    }
}

/// The router's heartbeats arrive later than the takeover timeout while it still works: a
/// follower takes over although the router is alive (it steps down once it hears the greater
/// claim), and fencing keeps the two apart: seed 106 (the first of seeds 0..120; before the
/// chained claims and the byzantine, sync and disk work, seed 14) has a start refused as
/// fenced, an assignment of the old router that reached a node after the new claim. Seed 127
/// since members join by invite (seed 114 since retry delays have jitter, seed 116 before, and
/// seed 106 before the queue document's first change held the dedup and idempotency maps). If
/// it stops fencing, randomness is consumed differently: find another seed (the report's
/// `fenced`).
#[test]
fn the_routers_heartbeats_are_delayed_past_the_timeout() {
    for seed in (0..8).chain([127]) {
        let delay = Fault::DelayBeats {
            target: Target::Router,
            extra_ms: 6_000,
            for_ms: 12_000,
        };
        let r = check(seed, &config(4, vec![(5_000, delay)]));
        assert_eq!(
            counted(&r, "beats_delayed"),
            1,
            "the router's heartbeats were delayed: {r:?}"
        );
        assert!(r.takeovers >= 1, "a follower took over: {r:?}");
        assert!(
            counted(&r, "router_stepped_down") >= 1,
            "the live router stepped down: {r:?}"
        );
        if seed == 127 {
            assert!(r.fenced > 0, "seed 127 no longer fences a start: {r:?}");
        }
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

/// Halves with no majority anywhere: each side elects its own router (a takeover on the side
/// without one); after healing, the greatest claim wins everywhere (a router steps down). Seed
/// 10 (seed 22 before members joined by invite) has starts refused as fenced: assignments of
/// the losing side's router that reached nodes after the heal. If it stops fencing, find
/// another seed.
#[test]
fn the_cluster_splits_in_halves_then_heals() {
    for seed in (0..8).chain([10]) {
        let r = check(
            seed,
            &config(4, vec![(4_000, Fault::Halves), (25_000, Fault::Heal)]),
        );
        assert_eq!(counted(&r, "halves"), 1, "the cluster split: {r:?}");
        assert!(
            r.takeovers >= 1,
            "the side without a router elected one: {r:?}"
        );
        assert!(
            counted(&r, "router_stepped_down") >= 1,
            "one of the two routers stepped down after the heal: {r:?}"
        );
        if seed == 10 {
            assert!(r.fenced > 0, "seed 10 no longer fences a start: {r:?}");
        }
    }
}
