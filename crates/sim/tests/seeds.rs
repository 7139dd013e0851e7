//! The simulator over many seeds: replays are exact, faults fire, invariants hold, and a broken
//! protocol is caught.

use std::collections::BTreeMap;

use piecework_sim::{Config, FaultMix, Report, run};

/// Seeds per fault mix in CI: a couple of hundred in all. `piecework-sim --seeds 2000` runs
/// more.
const CI_SEEDS: u64 = 60;

fn describe(r: &Report) -> String {
    format!(
        "seed {} failed: {:#?}\ntrace tail:\n{}\nreplay: cargo run -p piecework-sim --release -- --seeds 1 --seed {}",
        r.seed,
        r.violations,
        r.trace_tail.join("\n"),
        r.seed
    )
}

fn seeds(mix: FaultMix, range: std::ops::Range<u64>) -> BTreeMap<String, u64> {
    let config = Config {
        mix,
        ..Config::default()
    };
    seeds_with(&config, range)
}

fn seeds_with(config: &Config, range: std::ops::Range<u64>) -> BTreeMap<String, u64> {
    let mut faults = BTreeMap::new();
    for seed in range {
        let r = run(seed, config);
        assert!(r.passed(), "{}", describe(&r));
        assert_eq!(r.lost, 0, "{}", describe(&r));
        assert!(r.tasks > 0);
        for (k, v) in r.faults {
            *faults.entry(k).or_default() += v;
        }
    }
    faults
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let config = Config::default();
    let a = run(42, &config);
    let b = run(42, &config);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.steps, b.steps);
    assert_eq!(a.trace_tail, b.trace_tail);
    let c = run(43, &config);
    assert_ne!(a.trace_hash, c.trace_hash, "another seed, another run");
    let short = run(
        42,
        &Config {
            trace_lines: 5,
            ..Config::default()
        },
    );
    assert_eq!(
        short.trace_hash, a.trace_hash,
        "the tail's length is not the run"
    );
    assert_eq!(short.trace_tail[..], a.trace_tail[a.trace_tail.len() - 5..]);
}

#[test]
fn default_mix_seeds_pass_and_every_fault_kind_fires() {
    let faults = seeds(FaultMix::default_mix(), 0..CI_SEEDS);
    for kind in [
        "crash",
        "restart",
        "partition",
        "one_way_cut",
        "beat_dropped",
        "beat_duplicated",
        "beat_reordered",
        "sync_reset",
        "resync",
        "handler_failure",
        "write_failure_window",
        "read_failure_window",
        "save_error",
        "load_error",
        "long_downtime",
        "superseded_attempt_held",
        "fetch_failed",
        "input_unavailable",
        "input_revived",
        "silent_cut",
        "batched_inputs",
        "batch_submit",
        // The rotation mix (every seed rotates its queue documents at a tiny threshold).
        "rotation",
        "epoch_switch",
        "carried_late_writes",
        "epoch_evicted",
        // A half-open stream's frames lost, and a crash losing a write in flight (the path
        // behind invariant 8).
        "frame_lost_silently",
        "unacknowledged_write_lost",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never fired: {faults:?}"
        );
    }
    // Invariant 7's excuse: overlaps explained by a loss on a link between the routers and
    // workers involved. 6 in these seeds when this bound was set: more means the excuse grew
    // (or the protocol overlaps more), and deserves a look.
    let excused = faults
        .get("overlap_explained_by_loss")
        .copied()
        .unwrap_or(0);
    assert!(excused <= 12, "{excused} overlaps excused: {faults:?}");
}

/// A run's fetch of its task document that ends at its deadline is rare in the default mix
/// (about one seed in a hundred since queue documents rotate): seed 227 was the first past the
/// CI range to show it (found by a search over seeds 60..1,000). It must still pass, and still
/// time a fetch out: if it stops doing so, randomness is consumed differently and a new seed
/// must be found (`piecework-sim --seeds 1000 --json` reports `fetch_timeout` per seed).
#[test]
fn a_fetch_that_times_out_is_exercised() {
    let r = run(227, &Config::default());
    assert!(r.passed(), "{}", describe(&r));
    let fired = r.faults.get("fetch_timeout").copied().unwrap_or(0);
    assert!(
        fired > 0,
        "seed 227 no longer times a fetch out: {:?}",
        r.faults
    );
}

#[test]
fn crash_only_seeds_pass_with_no_unexplained_second_run() {
    // Invariant 5 is checked in this mix: no loss, no partition, so a task runs twice only if
    // its earlier run failed or its node crashed.
    // Invariant 7 too: no two runs of a task overlap.
    let faults = seeds(FaultMix::crashes(), 1_000..1_000 + CI_SEEDS);
    for kind in [
        "crash",
        "restart",
        "long_downtime",
        "superseded_attempt_held",
        "save_error",
        "load_error",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never fired: {faults:?}"
        );
    }
}

/// Planned stops (`Command::Stop`, what SIGTERM does) among crashes on a lossless network:
/// the stopping router hands its role over, runs outliving their grace are interrupted, and
/// invariants 5 and 7 hold as strictly as with crashes alone.
#[test]
fn planned_stop_seeds_pass_and_routers_hand_over() {
    let faults = seeds(FaultMix::stops(), 4_000..4_000 + CI_SEEDS / 2);
    for kind in [
        "planned_stop",
        "stopped",
        "router_handed_over",
        "runs_interrupted_by_a_stop",
        "crash",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never fired: {faults:?}"
        );
    }
}

#[test]
fn partition_seeds_pass() {
    let faults = seeds(FaultMix::partitions(), 2_000..2_000 + CI_SEEDS / 2);
    assert!(
        faults["partition"] > 0 && faults["one_way_cut"] > 0,
        "{faults:?}"
    );
    // Routers on either side seal the same epoch: every replica follows one winner, and the
    // loser's writes are carried into it.
    for kind in [
        "double_seal_followed",
        "successor_merge",
        "carried_late_writes",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never fired: {faults:?}"
        );
    }
}

/// Sealed epochs deleted on disk, 2 kept per node (a node keeps 256 by default): the default
/// mix's seeds still pass. And members come back behind documents of the chain every member
/// deleted and move past them: nodes down across rotations (the crashes mix, 120 tasks, 1
/// kept). A restarted node resumes at the epoch it was on, so only a node down for more
/// rotations than the others keep meets deleted documents (before resumes, every restart
/// walked the chain from the queue's first document and met them).
#[test]
fn seeds_pass_with_sealed_epochs_deleted_and_members_move_past_them() {
    let config = Config {
        keep_sealed_epochs: 2,
        ..Config::default()
    };
    seeds_with(&config, 0..CI_SEEDS / 2);
    let config = Config {
        keep_sealed_epochs: 1,
        tasks: 120,
        mix: FaultMix::crashes(),
        ..Config::default()
    };
    let faults = seeds_with(&config, 0..10);
    assert!(
        faults
            .get("moved_past_deleted_epochs")
            .copied()
            .unwrap_or(0)
            > 0,
        "{faults:?}"
    );
}

/// A core that does not check the fence itself when a start is written (after the task's
/// document was fetched, or when a heartbeat or a switch raised the claim in the same turn),
/// its pool still fencing when it accepts the assignment: caught as a fencing violation at
/// seed 60 (the first of a search over seeds 0..1,000). A pool alone that does not fence is
/// not caught in 1,000 seeds: the core's checks stand behind it (its own story in
/// `piecework-worker-pool`'s tests catches it).
#[test]
fn a_core_that_does_not_fence_its_starts_is_caught() {
    let config = Config {
        broken_core_fencing: true,
        ..Config::default()
    };
    caught_fencing(60, &config);
}

/// A node that does not fence at all (neither its pool nor its core): caught at seed 12 (the
/// first of a search over seeds 0..1,000), or the simulator proves nothing when it passes.
#[test]
fn a_node_that_does_not_fence_is_caught() {
    let config = Config {
        broken_fencing: true,
        broken_core_fencing: true,
        ..Config::default()
    };
    caught_fencing(12, &config);
}

/// Seed `seed` of a broken protocol fails, as a fencing violation (invariant 4).
fn caught_fencing(seed: u64, config: &Config) {
    let r = run(seed, config);
    assert!(
        !r.passed(),
        "seed {seed} of a broken protocol passed: it no longer reaches a fenced start, search \
         for another seed"
    );
    assert!(
        r.violations.iter().any(|v| v.invariant == 4),
        "caught, but not as a fencing violation: {}",
        describe(&r)
    );
}

/// Swarm seeds in CI: each draws its node count (3–9), relay waits and fault rates from the seed
/// (`Config::swarm`). Seeds 5013, 5014 and 5016 failed only at 7 nodes or with other relay waits
/// than a node's; the fixed mixes above run 5 nodes with a node's waits.
const SWARM_SEEDS: std::ops::Range<u64> = 0..40;
/// Tasks and faulty virtual time of a CI swarm seed: less than the default run's (40 tasks,
/// 60 s), to keep the sweep short in CI's build; `piecework-sim --swarm` runs the full length.
const SWARM_TASKS: usize = 30;
const SWARM_FAULT_MS: u64 = 40_000;

/// A bounded swarm sweep: every seed passes and loses nothing, and the sweep covers several node
/// counts (one of 7 or more among them) and relay waits other than a node's.
#[test]
fn swarm_seeds_pass_across_cluster_shapes() {
    let mut nodes = BTreeMap::new();
    let mut other_relays = 0;
    for seed in SWARM_SEEDS {
        let config = Config {
            tasks: SWARM_TASKS,
            fault_ms: SWARM_FAULT_MS,
            ..Config::swarm(seed)
        };
        let r = run(seed, &config);
        assert!(
            r.passed() && r.lost == 0,
            "{}\nshape: {:?}\nreplay: cargo run -p piecework-sim --release -- --swarm --seeds 1 --seed {} --tasks {} --fault-secs {}",
            describe(&r),
            r.shape,
            seed,
            SWARM_TASKS,
            SWARM_FAULT_MS / 1000
        );
        assert_eq!(r.shape, config.shape(), "the report states the drawn shape");
        *nodes.entry(r.shape.nodes).or_insert(0u64) += 1;
        if r.shape.relay_ms.is_some() {
            other_relays += 1;
        }
    }
    assert!(
        nodes.len() >= 3 && nodes.keys().any(|n| *n >= 7),
        "the sweep covered too few node counts: {nodes:?}"
    );
    assert!(other_relays > 0, "no seed drew other relay waits");
}

/// The shape is the seed's: the same seed draws the same shape, and the run replays exactly.
#[test]
fn a_swarm_seed_draws_its_shape_and_replays() {
    let a = Config::swarm(7);
    let b = Config::swarm(7);
    assert_eq!(a.shape(), b.shape());
    assert!((3..=9).contains(&a.nodes));
    assert_eq!(a.mix.name, "swarm");
    let shapes: std::collections::BTreeSet<usize> =
        (0..20).map(|s| Config::swarm(s).nodes).collect();
    assert!(shapes.len() > 3, "node counts drawn: {shapes:?}");
}
