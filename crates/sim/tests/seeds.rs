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
        // A crash losing a write in flight: rare in the default mix since claims were
        // chained; `seed_272_a_crash_loses_an_unacknowledged_write` pins one.
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
/// (about one seed in a hundred since queue documents rotate): seed 797 is the first from 227
/// to show it since claims were chained (it was 227, found by a search over seeds 60..1,000). It must still pass, and still
/// time a fetch out: if it stops doing so, randomness is consumed differently and a new seed
/// must be found (`piecework-sim --seeds 1000 --json` reports `fetch_timeout` per seed).
#[test]
fn a_fetch_that_times_out_is_exercised() {
    // Seed 797 until the queue document's first change held the dedup and idempotency maps;
    // 938 until retry delays had jitter; 449 until members joined by invite; 494 until actors
    // were tagged with their peer (692 is the first from 494 since).
    let r = run(692, &Config::default());
    assert!(r.passed(), "{}", describe(&r));
    let fired = r.faults.get("fetch_timeout").copied().unwrap_or(0);
    assert!(
        fired > 0,
        "seed 692 no longer times a fetch out: {:?}",
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

/// Members pause, resume and reconfigure the queues at run time from any node, among every
/// fault of the default mix: every task finishes, rotations carry the settings, and once
/// healed every member holds the same settings (invariant 11). Some pauses and resumes
/// written apart merge to paused and are resumed after the heal.
#[test]
fn settings_seeds_pass_and_every_member_ends_with_the_same_settings() {
    let faults = seeds(FaultMix::settings(), 9_000..9_000 + CI_SEEDS / 2);
    for kind in [
        "setting_pause",
        "setting_resume",
        "setting_config",
        "setting_resume_after_heal",
        "rotation",
        "partition",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never fired: {faults:?}"
        );
    }
}

/// The `scheduling` mix: tasks with priority tags, delays, dependencies and dedup keys,
/// idempotent retries, and boosts changed at run time, under the default faults. Every seed
/// passes, invariants 12 (no dependent starts before its dependencies succeeded), 13 (no
/// assignment before a not-before time), 14 (no two fresh pending copies of a dedup key in a
/// view), 15 (an idempotent retry answers the first task) and 16 (a run starts only on a node
/// with its kind and required resources, and no router assigns a task to a pool that never
/// had them) and 17 (a schedule's slot is fired no earlier than its time, never twice unless
/// both copies started, and none is skipped without being counted missed) included, and each
/// situation happened: tasks of a kind only some nodes run, tasks that require a resource,
/// withdrawn for a while now and then, schedule slots fired in turn and fired late after a
/// takeover.
#[test]
fn scheduling_seeds_pass_and_dependents_wait_for_their_dependencies() {
    let faults = seeds(FaultMix::scheduling(), 11_000..11_000 + CI_SEEDS / 2);
    for kind in [
        "scheduling_tagged",
        "scheduling_dependent",
        "scheduling_delayed",
        "setting_boost",
        "dependent_started",
        "delayed_started",
        "scheduling_dedup_key",
        "dedup_bumped",
        "dedup_copy_cancelled",
        "idempotent_retry",
        "rare_kind_started",
        "requiring_started",
        "resource_withdrawn",
        "schedule_slot_fired",
        "schedule_slot_fired_late",
        "rotation",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never fired: {faults:?}"
        );
    }
}

/// The `lifecycle` mix: members cancel tasks and requeue dead letters, runs time out, and
/// handlers asked to stop either stop or run past their grace time. Every seed passes,
/// invariant 18 (no run starts where its task's cancel is known) and invariant 2's requeue
/// rule included, and each situation happened (a requeue of dead letters read back from a
/// node's disk among them).
#[test]
fn lifecycle_seeds_pass_and_cancels_requeues_and_timeouts_happen() {
    let faults = seeds(FaultMix::lifecycle(), 12_000..12_000 + CI_SEEDS / 4);
    for kind in [
        "cancelled_by_member",
        "attempt_cancelled",
        "attempt_timed_out",
        "attempt_overdue",
        "attempt_ignored",
        "life_refused_as_ended",
        "life_requeued",
        "requeue_reopened",
        "run_cancel_signalled",
        "rotation",
        "follow_up_seen",
        "life_undo_task",
        "event_submitted",
        "event_succeeded",
        "event_retrying",
        "event_dead_lettered",
        "event_cancelled",
        "event_requeued",
        "ends_found",
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

/// The `byzantine` mix: the last node is a hostile member (see `docs/testing.md`, "The
/// Byzantine member"). Every seed passes, invariant 10 (no honest node counts a hostile value)
/// included, and every task succeeds; every hostile act is sent and refused at least once. On
/// a network that loses nothing, with no crash, no router is ever deposed: before the router
/// told replays per claim, a member's heartbeat at the term bound hid the effective router's
/// and followers took over every `takeover_after` (30 takeovers in seeds 0 and 1).
#[test]
fn byzantine_seeds_pass_and_every_hostile_act_is_refused() {
    let config = Config {
        mix: FaultMix::byzantine(),
        ..Config::default()
    };
    let (mut sent, mut refused) = (
        BTreeMap::<String, u64>::new(),
        BTreeMap::<String, u64>::new(),
    );
    let mut takeovers = 0;
    for seed in 6_000..6_000 + CI_SEEDS / 2 {
        let r = run(seed, &config);
        assert!(r.passed(), "{}", describe(&r));
        assert_eq!(r.lost, 0, "{}", describe(&r));
        takeovers += r.takeovers;
        for (k, v) in r.byzantine_sent {
            *sent.entry(k).or_default() += v;
        }
        for (k, v) in r.byzantine_refused {
            *refused.entry(k).or_default() += v;
        }
    }
    for act in [
        "router_beat",
        "claim",
        "oversized",
        "pool_flood",
        "forged_successor",
    ] {
        assert!(
            sent.get(act).copied().unwrap_or(0) > 0,
            "{act} never sent: {sent:?}"
        );
        assert!(
            refused.get(act).copied().unwrap_or(0) > 0,
            "{act} never refused: {refused:?} (sent {sent:?})"
        );
    }
    assert_eq!(takeovers, 0, "routers churned beside the hostile member");
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
    // Seeds 0..10 until actors were tagged with their peer; seed 11 is the first since.
    let faults = seeds_with(&config, 0..12);
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
/// seed 1 (the first of a search over seeds 0..1,500, since claims were chained; it was 354
/// once only the document raised a fence, and 60 while heartbeats raised fences too). A pool alone that does not fence is
/// not caught in 1,000 seeds: the core's checks stand behind it (its own story in
/// `piecework-worker-pool`'s tests catches it).
#[test]
fn a_core_that_does_not_fence_its_starts_is_caught() {
    let config = Config {
        broken_core_fencing: true,
        ..Config::default()
    };
    // Seed 1 until the queue document's first change held the dedup and idempotency maps,
    // which moved its schedule off a fenced start; 257 until retry delays had jitter; 214 until
    // members joined by invite (each the first of seeds 200-899 that fails).
    caught_fencing(258, &config);
}

/// A node that does not fence at all (neither its pool nor its core): caught at seed 1 (the
/// first of a search over seeds 0..1,500 since claims were chained; it was 12), or the
/// simulator proves nothing when it passes.
#[test]
fn a_node_that_does_not_fence_is_caught() {
    let config = Config {
        broken_fencing: true,
        broken_core_fencing: true,
        ..Config::default()
    };
    // Seed 1 until the queue document's first change held the dedup and idempotency maps,
    // which moved its schedule off a fenced start; 16 until retry delays had jitter; 2 until
    // members joined by invite; 5 until actors were tagged with their peer (14 is the first
    // from 5 caught since).
    caught_fencing(14, &config);
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

/// Seeds that once failed, kept as named tests. Each names the bug it found, and asserts the
/// signature of the situation that bug needed (`shows`: counters the simulator reports), so
/// that a seed whose schedule moved (randomness consumed differently) fails loudly instead of
/// passing without meeting its bug.
mod regressions {
    use super::*;

    fn passes(seed: u64) -> Report {
        passes_with(seed, FaultMix::default_mix())
    }

    fn passes_with(seed: u64, mix: FaultMix) -> Report {
        let config = Config {
            mix,
            ..Config::default()
        };
        passes_config(seed, &config)
    }

    fn passes_config(seed: u64, config: &Config) -> Report {
        let r = run(seed, config);
        assert!(r.passed() && r.lost == 0, "{}", describe(&r));
        r
    }

    /// The seed still reaches its situation: every counter named fired (`fenced` is
    /// `Report::fenced`, the others are keys of `Report::faults`).
    fn shows(r: &Report, keys: &[&str]) {
        for k in keys {
            let n = match *k {
                "fenced" => r.fenced as u64,
                _ => r.faults.get(*k).copied().unwrap_or(0),
            };
            assert!(
                n > 0,
                "seed {} no longer shows `{k}`: its schedule moved and it no longer reaches the \
                 bug it was pinned for; find a seed that does ({:?})",
                r.seed,
                r.faults
            );
        }
    }

    /// Sealed epochs deleted on disk (2 kept): node1, whose messages were lost while the
    /// other side of a partition sealed epoch 1 again (a double seal), had to move sideways
    /// to the winner, whose seal covered writes to epoch 1 that node1 never got. It waited
    /// for them from the members, but every member had deleted epoch 1 by then: node1 stayed
    /// on the losing successor under its own claim, and the queue never settled on one router
    /// (invariant 3). A member now waits `BEHIND_WAIT` for them and then moves without.
    ///
    /// Found at seed 2269; that seed's schedule moved (no double seal any more): seed 2001
    /// was the first of the same shape that reaches the situation, and seed 2003 is since
    /// claims were chained.
    ///
    /// Re-pinned from seed 2003 to 2005: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 2003's schedule off this situation.
    #[test]
    fn seed_2005_partitions_a_member_behind_a_deleted_epoch_moves_on() {
        let config = Config {
            mix: FaultMix::partitions(),
            keep_sealed_epochs: 2,
            ..Config::default()
        };
        let r = passes_config(2005, &config);
        shows(&r, &["double_seal_followed", "epoch_evicted"]);
    }

    /// Fault 1 of the node-core issue: node1 was assigned a task, crashed before starting it and
    /// stayed down longer than the lease; the router assigned the task again and another node
    /// started it. node1 restarted, saw its old attempt open, unstarted and still under the
    /// effective router, and started it too: two runs at once with no message lost
    /// (invariants 5 and 7). Pools now refuse attempts addressed to an earlier incarnation of
    /// themselves, attempts that are not the task's current one, and attempts of a task
    /// running elsewhere. With those checks removed this seed fails (as do 16, 24, 93, 99,
    /// 112 and 115 of the first 150).
    ///
    /// Found at seed 11; that seed's schedule moved (the pool's three checks switched off
    /// no longer fail it; seed 1 of the same mix fails on invariants 5 and 7 with them
    /// off): seed 1 is the first of the same shape that reaches the situation.
    ///
    /// Re-pinned from seed 1 to 3: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 1's schedule off this situation.
    ///
    /// Re-pinned from seed 3 to 1: retry delays with jitter moved seed 3's
    /// schedule off this situation.
    #[test]
    fn seed_1_crashes_a_restarted_pool_never_runs_a_superseded_attempt() {
        let r = passes_with(1, FaultMix::crashes());
        shows(&r, &["superseded_attempt_held", "long_downtime"]);
    }

    /// Found by the 1,000-seed crashes hunt (also 764): node0 crashed during a submit with the
    /// task document's write kept and the index entry's write lost, so the submit was never
    /// acknowledged and no index names the task; the task document stayed on node0's disk.
    /// Invariant 9 took it for a document of a queue node0 never joined. It is node0's own, for
    /// a queue it joined: invariant 9 now allows exactly that.
    ///
    /// Found at seed 395; that seed's schedule moved (no write kept by a crash any more):
    /// seed 1011 is the first of the same shape that reaches the situation.
    ///
    /// Re-pinned from seed 1011 to 1025: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 1011's schedule off this situation.
    ///
    /// Re-pinned from seed 1025 to 1058: retry delays with jitter moved seed 1025's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 1058 to 1074: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 1058's schedule off this situation.
    ///
    /// Re-pinned from seed 1074 to 1123: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 1074's schedule off this situation.
    #[test]
    fn seed_1123_crashes_an_unacknowledged_submit_leaves_only_its_own_document() {
        let r = passes_with(1123, FaultMix::crashes());
        shows(&r, &["unacknowledged_write_kept"]);
    }

    /// Found by the 1,000-seed swarm hunt (3 nodes, a concurrency limit of 3): node2 was
    /// stopped with 214 ms of grace while its disk failed every write. At the grace its core
    /// recorded its run interrupted and the task was routed again, but the handler went on
    /// until the node exited, when the stop was answered: four runs in flight under a limit of
    /// 3 (invariant 6). The core now asks its driver to cancel a run it interrupts
    /// (`Io::Abort`): the node aborts the handler's task, the simulator ends the run.
    ///
    /// Found at seed 865; its schedule moved when claims were chained (then seed 802), and
    /// again with the byzantine, sync and disk work merged: seed 818 is the first from 800
    /// that aborts a run.
    ///
    /// Re-pinned from seed 818 to 826: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 818's schedule off this situation.
    ///
    /// Re-pinned from seed 826 to 832: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 826's schedule off this situation.
    ///
    /// Re-pinned from seed 832 to 836: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 832's schedule off this situation.
    #[test]
    fn seed_836_swarm_a_run_interrupted_by_a_stop_is_cancelled() {
        let r = passes_config(836, &Config::swarm(836));
        shows(&r, &["run_aborted"]);
    }

    /// A partitioned router ran a task its side did not know was done; after the heal that
    /// run was still going while the router, now effective everywhere, assigned another task:
    /// two runs under one claim with a concurrency limit of 1 (invariant 6). Routers now count
    /// runs that outlived their task's outcome against the limit while their pool is alive.
    ///
    /// Re-pinned from seed 25 to 35: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 25's schedule off this situation.
    ///
    /// Re-pinned from seed 35 to 11: retry delays with jitter moved seed 35's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 11 to 44: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 11's schedule off this situation.
    #[test]
    fn seed_44_a_run_that_outlived_its_tasks_outcome_counts_against_the_limit() {
        let r = passes(44);
        shows(&r, &["partition", "refused_final"]);
    }

    /// Found by the 10,000-seed run: node0 was partitioned alone and became a router at the
    /// same term as node3 on the other side; both assigned one task to node0. node0 ran its
    /// own assignment to success, and after healing started node3's assignment of the same,
    /// finished task: a second run no router counted, over the concurrency limit (invariant
    /// 6). Pools now refuse assignments of tasks that already have an outcome.
    ///
    /// Found at seed 7743; that seed's schedule moved (no refusal of a finished task's
    /// assignment any more): seed 3 was the first of the same shape that reaches the
    /// situation, and seed 10 is since claims were chained.
    ///
    /// Re-pinned from seed 10 to 13: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 10's schedule off this situation.
    ///
    /// Re-pinned from seed 13 to 11: retry delays with jitter moved seed 13's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 11 to 21: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 11's schedule off this situation.
    ///
    /// Re-pinned from seed 21 to 36: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 21's schedule off this situation.
    #[test]
    fn seed_36_an_assignment_of_a_finished_task_is_refused() {
        let r = passes(36);
        shows(&r, &["refused_final"]);
    }

    /// Found at 7 nodes (40 tasks): across a partition, node3 (claim node3@3) and node5 (the
    /// smaller node5@2) both routed one task of queue 1. node3's attempt 1 ran on node0; on
    /// node5's side attempts 1 and 2 ran on node1 and failed. After the heal node3's view had
    /// the task's current attempts (number 2) failed, so it was pending again, and node3's own
    /// run of it was counted nowhere: node3 assigned another task to node0's second worker,
    /// two runs under node3@3 with a concurrency limit of 1 (invariant 6). Routers now count
    /// every open attempt a task's state does not show (router story 13).
    ///
    /// Found at seed 212; its schedule moved when claims were chained: seed 203 is the first
    /// from 200 of the same shape.
    ///
    /// Re-pinned from seed 203 to 204: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 203's schedule off this situation.
    ///
    /// Re-pinned from seed 204 to 213: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 204's schedule off this situation.
    ///
    /// Re-pinned from seed 213 to 214: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 213's schedule off this situation.
    #[test]
    fn seed_214_at_7_an_earlier_run_of_a_pending_task_counts_against_the_limit() {
        let config = Config {
            nodes: 7,
            ..Config::default()
        };
        let r = passes_config(214, &config);
        shows(&r, &["partition", "fenced"]);
    }

    /// node2 restarted alone in a partition, claimed the router at term 2 on its side and,
    /// right after the heal, routed a task it had just indexed to its own worker, which started
    /// it. node3, the greater claim at the same term, saw the attempt arrive on a pool it had
    /// not heard from for the whole partition, took its lease as long expired and routed the
    /// task again at once: two runs with no message lost since the first assignment
    /// (invariant 7, with the window from the earlier attempt's assignment). A router's lease
    /// on an attempt now runs from when it first saw the attempt at the earliest (router story
    /// 11).
    #[test]
    fn seed_28_an_attempt_learned_at_a_heal_is_not_routed_again_at_once() {
        let r = passes(28);
        shows(&r, &["partition", "router_reunited"]);
    }

    /// A partition split node2's side from node3's; node2 took over at term 3 while node3 kept
    /// routing at term 2. Right after the heal, node3 (deposed, not knowing it yet) assigned a
    /// task just submitted on its side, and node2 assigned the same task before either had
    /// synced: two runs with no message lost since the first assignment (invariant 7). An
    /// active router now holds its assignments for `heartbeat + settle` when it hears a pool
    /// again after a silence longer than `takeover_after` (router story 12).
    #[test]
    fn seed_31_a_router_that_hears_a_lost_side_again_holds_its_assignments() {
        let r = passes(31);
        shows(&r, &["partition", "router_reunited"]);
    }

    // Seeds the rotation mix failed while epochs were being built (each fix is in the
    // commit history of `crates/core/src/node.rs`); they replay the same faults on every
    // change.

    /// Two routers sealed one epoch while partitioned and one side rotated again: nodes on
    /// each branch only knew their own, and a carry from the losing branch brought back a
    /// task the winning chain had finished. Nodes now follow the greatest lineage, and a carry
    /// from a losing branch skips every task the winning chain since the fork indexes.
    ///
    /// Found at seed 2; that seed's schedule moved (no double seal any more): seed 16 was
    /// the first of the same shape that reaches the situation, and seed 1 is since claims
    /// were chained.
    ///
    /// Re-pinned from seed 1 to 3: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 1's schedule off this situation.
    ///
    /// Re-pinned from seed 3 to 1: retry delays with jitter moved seed 3's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 1 to 41: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 1's schedule off this situation.
    ///
    /// Re-pinned from seed 41 to 44: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 41's schedule off this situation.
    #[test]
    fn seed_44_a_double_seal_converges_on_one_branch() {
        let r = passes(44);
        shows(&r, &["double_seal_followed", "successor_merge"]);
    }

    /// Starts and ends became one change per turn, and the timing moved. Two routers ran the
    /// same tasks across a partition; the other side's router sealed the epoch, and the
    /// rotation dropped those tasks as finished while this router's runs of them went on.
    /// After following the successor, this router no longer saw its own open attempts and
    /// assigned past the concurrency limit (invariant 6). A router now counts its attempts
    /// whose task left the view, for a lease and then while pool heartbeats report them.
    #[test]
    fn seed_98_a_rotation_does_not_hide_a_routers_own_runs() {
        let r = passes(98);
        shows(&r, &["rotation", "partition"]);
    }

    /// A start was written a few inputs after its fence check, and a view in between raised
    /// the fence: a run started under a superseded router (invariant 4). Starts are checked
    /// against the fence again where they are written.
    ///
    /// Found at seed 24; its schedule moved when claims were chained: seed 1 is the first of
    /// the same shape.
    ///
    /// Re-pinned from seed 1 to 16: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 1's schedule off this situation.
    ///
    /// Re-pinned from seed 16 to 56: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 16's schedule off this situation.
    ///
    /// Re-pinned from seed 56 to 88: actors tagged with their peer (each write
    /// judged by its writer's role) and a successor's `built` marker moved seed 56's
    /// schedule off this situation.
    #[test]
    fn seed_88_a_start_is_fenced_where_it_is_written() {
        let r = passes(88);
        shows(&r, &["fenced", "double_seal_followed"]);
    }

    /// Every node crashed at some point; the simulator forgot that a task it never showed
    /// again had been final. A task is now done once any view showed it final.
    ///
    /// Re-pinned from seed 44 to 51: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 44's schedule off this situation.
    #[test]
    fn seed_51_a_task_left_behind_counts_as_done_after_crashes() {
        let r = passes(51);
        shows(&r, &["long_downtime", "rotation"]);
    }

    /// A node fetching a newer epoch found no member with it during a partition and never
    /// looked again. Heartbeats now name each node's epoch document, and a named document
    /// whose fetch failed is looked for again.
    ///
    /// Found at seed 124; its schedule moved when claims were chained: seed 0 is the first of
    /// the same shape.
    ///
    /// Re-pinned from seed 0 to 1: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 0's schedule off this situation.
    #[test]
    fn seed_1_a_failed_fetch_of_the_next_epoch_is_retried() {
        let r = passes(1);
        shows(&r, &["epoch_switch", "long_downtime"]);
    }

    /// A node missed the seal and jumped two epochs: the seal heads were unknown to it and it
    /// carried back a task that ended before the seal. The heads now come from the next
    /// document of the chain, and a carrier behind them waits for them.
    #[test]
    fn seed_151_seal_heads_come_from_the_next_epoch() {
        let r = passes(151);
        shows(&r, &["rotation", "epoch_switch"]);
    }

    /// A node cut off on the queue's first document took five submits there after the
    /// others had retired epoch 1. They carried those late writes into epoch 1, their first
    /// document's successor, which nobody carried from any more: six tasks were lost. A held
    /// document whose target is retired now carries into the current one. Found once task
    /// documents were read ahead of their start (timings moved).
    #[test]
    fn seed_66_late_writes_skip_a_retired_epoch() {
        let r = passes(66);
        shows(&r, &["carried_late_writes", "epoch_evicted"]);
    }

    /// A node whose own messages were lost for 12 s jumped from epoch 0 to epoch 2. It held
    /// the epoch-1 document only as an empty shell (its fetch had found no member answering,
    /// and such a document was never asked for again), counted it as held, and carried back
    /// three tasks that had ended in epoch 1. A carry now waits for every document of the
    /// chain with its content, and a document no member had is asked for again when a peer
    /// connects. Found once pending tasks' documents left memory (timings moved).
    ///
    /// Re-pinned from seed 133 to 140: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 133's schedule off this situation.
    ///
    /// Re-pinned from seed 140 to 100: retry delays with jitter moved seed 140's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 100 to 109: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 100's schedule off this situation.
    ///
    /// Re-pinned from seed 109 to 110: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 109's schedule off this situation.
    #[test]
    fn seed_110_a_carry_waits_for_an_empty_chain_document() {
        let r = passes(110);
        shows(&r, &["double_seal_followed", "carried_late_writes"]);
    }

    /// A loser carried into the winner without the winning chain's documents at hand, and
    /// brought back a task dropped there. Such a carry now waits for them.
    ///
    /// Found at seed 159; that seed's schedule moved when heartbeats stopped raising fences
    /// (no successor merge any more): seed 24 reached the same situation, and seed 7 does
    /// since claims were chained (1, earlier, is pinned for another bug).
    ///
    /// Re-pinned from seed 7 to 41: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 7's schedule off this situation.
    ///
    /// Re-pinned from seed 41 to 44: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 41's schedule off this situation.
    #[test]
    fn seed_44_a_losing_branch_waits_for_the_winning_chain() {
        let r = passes(44);
        shows(&r, &["double_seal_followed", "successor_merge"]);
    }

    /// Two epoch documents of the same number never met: nodes ignored heartbeats naming an
    /// epoch of their own number. Every named document is now weighed by lineage.
    ///
    /// Found at seed 195; that seed's schedule moved (no double seal any more): seed 22 is
    /// the first of the same shape that reaches the situation.
    ///
    /// Re-pinned from seed 22 to 41: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 22's schedule off this situation.
    ///
    /// Re-pinned from seed 41 to 44: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 41's schedule off this situation.
    #[test]
    fn seed_44_a_same_numbered_winner_is_followed() {
        let r = passes(44);
        shows(&r, &["double_seal_followed"]);
    }

    /// A restarted node jumped to a later epoch and carried from its old one without the
    /// documents in between: a task finished there came back. Moves and carries now wait for
    /// the chain's documents, and the chain's documents stay requestable after a restart (the
    /// node that had them was restarted too, and the others stayed behind).
    #[test]
    fn seed_1055_crashes_a_restart_jump_waits_for_the_chain() {
        let r = passes_with(1055, FaultMix::crashes());
        shows(&r, &["long_downtime", "epoch_switch"]);
    }

    /// Nodes waiting to move to a newer epoch (for the documents between) set it aside as an
    /// older epoch of their chain and never moved: two routers stayed active. A document a
    /// node waits for now stays a candidate.
    #[test]
    fn seed_2023_partitions_a_candidate_waited_for_stays_a_candidate() {
        let r = passes_with(2023, FaultMix::partitions());
        shows(&r, &["partition", "router_reunited"]);
    }

    /// The router rotated in the same turn as it carried a late submit into its current
    /// document: the successor was built from the view of before the carry but sealed at the
    /// document's heads after it, so the task was neither in the successor nor a late write
    /// (lost). A router no longer rotates while its view is behind its document. Once
    /// successors were built off the node's thread, the same seed showed a sideways move that
    /// did not wait for what the target's seal covered of the document it continues: a task
    /// ended there showed live for a turn. A move now waits for that document, held and whole.
    ///
    /// Re-pinned from seed 2200 to 2207: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 2200's schedule off this situation.
    #[test]
    fn seed_2207_partitions_a_rotation_waits_for_a_fresh_view() {
        let r = passes_with(2207, FaultMix::partitions());
        shows(&r, &["partition", "rotation", "fenced"]);
    }

    /// A node wrote a task's success into an epoch document, rotated it away and retired it;
    /// across a partition another router sealed the same document without that write. When
    /// the partition healed the node switched to the other side's successor: the retired
    /// document it continues was not carried from, and the task came back as running on two
    /// nodes. A switch holds again (and carries from) the document its target continues.
    ///
    /// Found at seed 2116; that seed's schedule moved (no double seal any more): seed 2003
    /// is the first of the same shape that reaches the situation.
    ///
    /// Re-pinned from seed 2003 to 2005: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 2003's schedule off this situation.
    #[test]
    fn seed_2005_partitions_a_switch_carries_the_retired_document_its_target_continues() {
        let r = passes_with(2005, FaultMix::partitions());
        shows(&r, &["double_seal_followed", "carried_late_writes"]);
    }

    /// A one-way silent cut hid a second router (same term, greater peer) from the other; the
    /// cut ended, and 35 ms later, before the next heartbeat could arrive, the router that had
    /// not heard the other assigned a task the other also assigned: an overlap caused by the
    /// loss, which invariant 7 now counts as explained for one heartbeat after a disturbance.
    ///
    /// Found at seed 2093; that seed's schedule moved (no overlap excused by a loss any
    /// more): seed 2005 is the first of the same shape that reaches the situation.
    ///
    /// Re-pinned from seed 2005 to 2012: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 2005's schedule off this situation.
    #[test]
    fn seed_2012_partitions_a_loss_explains_overlaps_until_the_next_heartbeat() {
        let r = passes_with(2012, FaultMix::partitions());
        shows(&r, &["overlap_explained_by_loss"]);
    }

    /// Once successors were built off the node's thread: a node on a losing branch started a
    /// run its own router had assigned, in the same turn as a switch to the winning branch
    /// showed it a higher claim (invariant 4). A start is handed to the driver only at the end
    /// of its turn, and one a fence raised meanwhile is refused instead.
    ///
    /// Re-pinned from seed 2360 to 2306: retry delays with jitter moved seed 2360's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 2306 to 2307: a successor's `built` marker (and actors tagged with
    /// their peer) moved seed 2306's schedule off this situation.
    #[test]
    fn seed_2307_partitions_a_start_fenced_later_in_its_turn_is_not_run() {
        let r = passes_with(2307, FaultMix::partitions());
        shows(&r, &["fenced", "partition"]);
    }

    /// A retired losing successor was named again by a stale peer and carried from anew,
    /// bringing back a finished task. A retired epoch is never followed or carried again.
    #[test]
    fn seed_2053_partitions_a_retired_epoch_stays_retired() {
        let r = passes_with(2053, FaultMix::partitions());
        shows(&r, &["epoch_evicted", "carried_late_writes", "partition"]);
    }

    /// 7 nodes, 120 tasks, 2 sealed epochs kept per node.
    fn passes_at_7(seed: u64, mix: FaultMix, relay_ms: Option<(u64, u64)>) -> Report {
        let config = Config {
            mix,
            nodes: 7,
            tasks: 120,
            relay_ms,
            ..Config::default()
        };
        passes_config(seed, &config)
    }

    fn passes_at_7_deleting(seed: u64, mix: FaultMix) -> Report {
        let config = Config {
            mix,
            nodes: 7,
            tasks: 120,
            keep_sealed_epochs: 2,
            ..Config::default()
        };
        passes_config(seed, &config)
    }

    /// A member behind a seal whose chain every member had deleted waited for the changes it
    /// lacked at every turn, and the members' answers made the next turn: minutes of real
    /// time for a minute of virtual time. Its carry now reads what the chain absorbed of the
    /// sealed document from the target's covers (`epoch::Cover`), and needs no history.
    #[test]
    fn seed_3003_partitions_at_7_a_carry_behind_a_deleted_chain_needs_no_history() {
        let r = passes_at_7_deleting(3003, FaultMix::partitions());
        shows(&r, &["carried_late_writes", "epoch_evicted", "partition"]);
    }

    /// Passes on the commit before covers, whose carry waited; a variant that carried without
    /// the changes a seal covered, after a wait (tried and reverted), brought a finished task
    /// back as running here (invariant 2). With covers a carrier tells a task the chain knew
    /// from a late submit by the task's entry alone.
    ///
    /// With the byzantine, sync and disk work merged beside chained claims its course moved:
    /// a double seal of epoch 5, the task's end written on the side that lost, every document
    /// holding the end deleted (2 kept), and the winner's branch showing the task running at
    /// the sideways move (invariant 2). A node now keeps the ends it saw (`Ends`) and writes
    /// them into the branch it moves to (`Core::keep_ends`).
    #[test]
    fn seed_3013_at_7_a_carry_without_the_chain_brings_no_finished_task_back() {
        let r = passes_at_7_deleting(3013, FaultMix::default_mix());
        shows(&r, &["carried_late_writes", "epoch_evicted"]);
    }

    /// Found once covers changed this seed's course (it passes on the commit before them,
    /// whose carry waits the same way): a member on the losing side of a double seal (its
    /// outgoing messages lost) submitted 4 tasks there, then moved to the winner after the
    /// winner's documents since the fork were deleted everywhere. Its carry waited for them
    /// forever: 4 tasks lost. A losing branch now carries with its predecessor and the
    /// winner's covers.
    ///
    /// Re-pinned from seed 3008 to 3010: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 3008's schedule off this situation.
    #[test]
    fn seed_3010_partitions_at_7_a_losing_branch_carries_after_the_chain_was_deleted() {
        let r = passes_at_7_deleting(3010, FaultMix::partitions());
        shows(
            &r,
            &["double_seal_followed", "successor_merge", "epoch_evicted"],
        );
    }

    /// Found the same way (it passes on the commit before covers): the same kind of wait,
    /// asked at every turn for documents no member had, and a sealed document kept while
    /// dirty whose retention timer then fired at every turn: a livelock.
    /// Waits are now looked at again after `CARRY_RETRY`, and a dirty document sets no
    /// retention timer.
    ///
    /// Re-pinned from seed 3014 to 3015: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 3014's schedule off this situation.
    #[test]
    fn seed_3015_partitions_at_7_waiting_carries_do_not_spin() {
        let r = passes_at_7_deleting(3015, FaultMix::partitions());
        shows(&r, &["double_seal_followed", "successor_merge"]);
    }

    /// Found the same way, with all sealed epochs kept. A router's assignment held while its
    /// queue was frozen for a rotation's last catch-up
    /// was recorded when written, a moment later: with the next one made a rate interval
    /// after the first, the records were 89 ms apart under a 90 ms interval (invariant 6).
    /// An assignment is now recorded as made when the router decided it.
    #[test]
    fn seed_3017_crashes_at_7_a_held_assignment_keeps_its_time() {
        let config = Config {
            mix: FaultMix::crashes(),
            nodes: 7,
            tasks: 120,
            ..Config::default()
        };
        let r = passes_config(3017, &config);
        shows(&r, &["rotation", "long_downtime"]);
    }

    /// Found with other relay waits (`--relay-ms 100,300`): after a partition with a double
    /// seal, two nodes carried a task from their copies of a losing branch's document into
    /// the winner. The copies stopped before the task's end; the one that had it believed
    /// the winner's chain had absorbed the task, carried nothing of it, and so left its end
    /// behind too. The task showed running again on a node that had seen it succeed
    /// (invariant 2). An attempt's end (and output) is now carried even when the target
    /// does not hold the task yet.
    ///
    /// Re-pinned from seed 5014 to 5001: retry delays with jitter moved seed 5014's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 5001 to 5002: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 5001's schedule off this situation.
    #[test]
    fn seed_5002_partitions_at_7_an_end_is_carried_before_its_task() {
        let r = passes_at_7(5002, FaultMix::partitions(), Some((100, 300)));
        shows(&r, &["double_seal_followed", "successor_merge"]);
    }

    /// Found while fixing the one above (with that fix alone): node3 moved sideways to the
    /// winning branch, which showed live a task node3 had seen succeed (the branch's copy of
    /// a shared document lacked the end); node3's own carries into it came turns later
    /// (invariant 2). A node that moves sideways now writes into the target, before reading
    /// it, the records of every task the target shows live and a document it holds shows
    /// final.
    ///
    /// Found at seed 5013; its schedule moved when claims were chained: seed 5000 is the
    /// first from 5000 of the same shape.
    ///
    /// Re-pinned from seed 5000 to 5001: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 5000's schedule off this situation.
    ///
    /// Re-pinned from seed 5001 to 5002: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 5001's schedule off this situation.
    #[test]
    fn seed_5002_partitions_at_7_a_sideways_move_keeps_the_ends_this_node_holds() {
        let r = passes_at_7(5002, FaultMix::partitions(), None);
        shows(&r, &["double_seal_followed"]);
    }

    /// Found with the two above fixed (`--relay-ms 100,300`): node5 ran a task and saw it
    /// succeed in a document that a partition then sealed twice, then retired that document.
    /// It moved sideways to the winner, whose copy of the fork lacked the end: the task showed
    /// running again (invariant 2), and nothing node5 still held had the end. A sideways move
    /// now waits for the fork (read back from disk) and carries from it, so the end is kept
    /// at the move.
    ///
    /// Found at seed 5016; its schedule moved when claims were chained: seed 5004 is the
    /// first from 5000 of the same shape.
    ///
    /// Re-pinned from seed 5004 to 5005: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 5004's schedule off this situation.
    ///
    /// Re-pinned from seed 5005 to 5008: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 5005's schedule off this situation.
    #[test]
    fn seed_5008_default_at_7_a_sideways_move_reads_the_fork_back() {
        let r = passes_at_7(5008, FaultMix::default_mix(), Some((100, 300)));
        shows(&r, &["double_seal_followed"]);
    }

    /// A crash loses a write in flight, unacknowledged (the path behind invariant 8): the
    /// default mix's CI seeds showed it until claims were chained; seed 272 is the first to.
    ///
    /// Re-pinned from seed 272 to 319: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 272's schedule off this situation.
    ///
    /// Re-pinned from seed 319 to 402: retry delays with jitter moved seed 319's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 402 to 440: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 402's schedule off this situation.
    ///
    /// Re-pinned from seed 440 to 1113 (none of 440..1,113 shows it): actors tagged with
    /// their peer (each write judged by its writer's role) moved seed 440's schedule off this
    /// situation.
    #[test]
    fn seed_1113_a_crash_loses_an_unacknowledged_write() {
        let r = passes(1113);
        shows(&r, &["unacknowledged_write_lost"]);
    }

    /// Found by `--faults partitions --seeds 400 --seed 20000` (it failed the same way on
    /// f71d491): epoch 2 of queue 1 was sealed twice across a partition. On node0's branch
    /// node3 claimed term 3 and routed, so nodes 0, 1 and 3 raised their fences to node3@3. At
    /// the heal they moved sideways to node2's winning branch, where node2@3 is the effective
    /// router: node3@3's chain runs through the losing branch's sealer claim, a lineage base
    /// there and not a record, so no carry brings it. The fences stayed at node3@3 and every
    /// assignment node2@3 made was refused `fenced`, for good: the queue stopped routing (two
    /// tasks pending for 300 virtual seconds; invariant 1). Fences are now per chain: a
    /// sideways move starts the node's fence again from the view of the document it moves to.
    ///
    /// Re-pinned from seed 20034 to 20038: the maps a queue document holds from its first
    /// change since dedup keys and idempotent submits (`bumps`, `idempotency`) moved seed
    /// 20034's schedule off this situation.
    ///
    /// Re-pinned from seed 20038 to 20014: retry delays with jitter moved seed 20038's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 20014 to 20020: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 20014's schedule off this situation.
    ///
    /// Re-pinned from seed 20020 to 20023: actors tagged with their peer (each write
    /// judged by its writer's role) moved seed 20020's schedule off this situation.
    #[test]
    fn seed_20023_partitions_a_fence_raised_on_a_losing_branch_does_not_outlive_the_move() {
        let r = passes_config(
            20_023,
            &Config {
                mix: FaultMix::partitions(),
                ..Config::default()
            },
        );
        shows(&r, &["double_seal_followed", "fenced"]);
    }

    /// Found by the `settings` mix (seeds 10,000–10,399): the restart case of seed 20034.
    /// node0, on the losing branch of a double seal of epoch 2, claimed term 3 there; after
    /// its move to the winning branch (router node2@2) and a restart, it ran node2@2's
    /// assignment, which invariant 4 refused as below the node0@3 it had seen. Invariant 4
    /// now judges per chain, as fences are: a claim seen on a document that is not on the
    /// chain the node is on (the document itself, the queue's first, or one its lineage
    /// names) no longer binds.
    ///
    /// Re-pinned from seed 10332 to 10343: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 10332's schedule off this situation.
    #[test]
    fn seed_10343_settings_a_fence_is_per_chain_across_a_restart() {
        let r = passes_config(
            10_343,
            &Config {
                mix: FaultMix::settings(),
                ..Config::default()
            },
        );
        shows(&r, &["double_seal_followed", "restart"]);
    }

    /// Found by the `scheduling` mix (seeds 11,000–11,199) once the mix fired a schedule:
    /// node3 submitted a task depending on one that, merged with a concurrent copy of its
    /// dedup key, lost and was cancelled; the submit reached the queue's document after its
    /// seal. The carry brought the late entry into the successor depending on the copy, which
    /// the rotation had left behind (cancelled) and whose loss its own entry does not show:
    /// the dependent waited for good. A carried entry now depends on the survivor, as a
    /// rotation writes it.
    ///
    /// Re-pinned from seed 11029 to 11002: retry delays with jitter moved seed 11029's
    /// schedule off this situation.
    ///
    /// Re-pinned from seed 11002 to 11003: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 11002's schedule off this situation.
    ///
    /// Re-pinned from seed 11003 to 11011: actors tagged with their peer (each write
    /// judged by its writer's role) and a successor's `built` marker moved seed 11003's
    /// schedule off this situation.
    #[test]
    fn seed_11011_scheduling_a_late_dependent_of_a_dedup_copy_follows_the_survivor() {
        let r = passes_config(
            11_011,
            &Config {
                mix: FaultMix::scheduling(),
                ..Config::default()
            },
        );
        shows(&r, &["dedup_copy_cancelled", "carried_late_writes"]);
    }

    /// Found by the `lifecycle` mix as it was built: a requeue written into a sealed epoch on
    /// one side of a partition was carried into a successor that had left its task behind as
    /// succeeded on the other side, and brought the task back (invariant 2: succeeded to
    /// pending). A carry now merges a requeue only where the successor holds the task.
    ///
    /// Re-pinned from seed 35 to 1: the mix's failure-policy switches moved seed
    /// 35's schedule off this situation.
    #[test]
    fn seed_1_lifecycle_a_late_requeue_never_revives_a_task_left_behind() {
        let r = passes_config(1, &lifecycle());
        shows(
            &r,
            &["life_requeued", "requeue_reopened", "carried_late_writes"],
        );
    }

    /// Found by the `lifecycle` mix: a task document's reads failed for 700 ms, so the start
    /// waited, and the run's 201 ms timeout, counted from the pool's decision, ran out before
    /// the handler was handed over: its grace ended with an end the document refused (the
    /// attempt had not started), and the run's real end was then dropped as recorded, leaving
    /// the task running for good. Timeouts and grace times now run from the hand-over.
    ///
    /// Re-pinned from seed 76 to 2: the follow-ups and undos the mix gained moved seed 76's
    /// schedule off timeouts beside failing reads.
    ///
    /// Re-pinned from seed 2 to 6: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 2's schedule off this situation.
    ///
    /// Re-pinned from seed 6 to 8: actors tagged with their peer (each write
    /// judged by its writer's role) and a successor's `built` marker moved seed 6's
    /// schedule off this situation.
    #[test]
    fn seed_8_lifecycle_a_timeout_runs_from_the_hand_over() {
        let r = passes_config(8, &lifecycle());
        shows(&r, &["attempt_timed_out", "load_error"]);
    }

    /// Found by the `lifecycle` mix once it undid tasks (whose writes moved the schedule), as
    /// seed 12,027: a partitioned node took two submits into its epoch document after the
    /// other side sealed it, and rotated into its own successor (a double seal). A member of
    /// the winning side carried that losing successor's writes and handed on its cover of the
    /// shared document, which counted the two tasks as absorbed; the carry itself left them to
    /// the shared document's own carry, which then found them covered: two acknowledged tasks
    /// lost (invariant 1). A carry from off the winner's chain now hands on only its own cover.
    ///
    /// Re-pinned from 12,027 to 12,200 when the batches of attempt writes changed their order
    /// of operations: 12,200 is the one seed of 12,000–12,400 that fails without the fix (there
    /// as invariant 7: a run started again while it still ran, the winner missing what the
    /// losing branch had absorbed).
    ///
    /// Re-pinned from seed 12200 to 12201: members joining by invite (a signed add written
    /// into the queue when it is created, the join presented to the members) moved seed
    /// 12200's schedule off this situation.
    #[test]
    fn seed_12201_lifecycle_a_losing_branch_never_covers_the_winners_chain() {
        let r = passes_config(12_201, &lifecycle());
        shows(&r, &["double_seal_followed", "carried_late_writes"]);
    }

    fn lifecycle() -> Config {
        Config {
            mix: FaultMix::lifecycle(),
            ..Config::default()
        }
    }
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
