//! What the queue document's hot paths cost as history grows: a queue holding 1k, 10k or 100k
//! finished tasks (history) or pending ones (live), and per iteration one operation followed by
//! the incremental view refresh a node does after every change.
//!
//! `cargo bench -p piecework-queue-doc --bench view` (all sizes; building the 100k queues takes
//! a while). `PIECEWORK_BENCH_SIZES=1000,10000` picks the sizes.
//!
//! - `submit`: index one new task.
//! - `task_life`: one task's whole life on one replica: submit, assign, start, succeed.
//! - `task_life_as_a_node`: the same as a node writes it: the start and the end checked
//!   against the cached view (`queue::record_attempts_in_view`), a refresh after each write.
//! - `full_read`: reading the whole view (what a node does once, when it opens a queue), for
//!   comparison.
//! - `.../judged`: the same over history, in a queue whose membership makes every value read
//!   be judged by its writer (signed membership with a submitter and a removed member, writes
//!   under the creator's tagged actor): the cost of `judge.rs` where it cannot be skipped.
//! - `rotate/live`: a rotation of a queue holding 1k or 10k live tasks (with as many finished
//!   ones): writing the successor (`epoch::build_successor`). `rotate/load` loads that
//!   successor from its saved bytes and reads its view, as a node opening it does. The
//!   successor's size is printed on stderr. `PIECEWORK_ROTATE_SIZES` picks the sizes.
//! - `carry/late`: carrying into that successor the late writes of a busy cluster (8 batches
//!   of 64 submits, and the assignment, start and end of 512 live tasks), as the sealer does.

use std::time::Duration;

use automerge::Automerge;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use piecework_queue_doc::membership::{MemberOp, NewOp, OpKind, actor_for};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueId, QueueView, Role,
    Signer, Submission, TaskId, ViewCache, WorkerId, epoch, queue,
};

fn me() -> PeerId {
    PeerId::new("12D3KooWQQBxbWrSXaDyidDrDBf9ZbUT1tasngy2Q3SonNMdWt2W")
}

fn submit(doc: &mut Automerge, i: u64) -> TaskId {
    let id = TaskId::new(format!("automerge:task{i:08}"));
    let s = Submission {
        id: id.clone(),
        kind: "noop".into(),
        submitter: me(),
        submitted_at: i,
        priority: 0,
        urgent: false,
        max_attempts: None,
        input: None,
        rules: Default::default(),
    };
    queue::submit(doc, &s).expect("submit");
    id
}

/// Assigns `task` as attempt 1 to worker 0.
fn assign(doc: &mut Automerge, task: &TaskId) -> (WorkerId, AttemptId) {
    let worker = WorkerId::new(me(), 0);
    let attempt = AttemptId {
        n: 1,
        claim: Claim::new(1, me()),
    };
    let a = Assignment {
        task: task.clone(),
        attempt: attempt.clone(),
        worker: worker.clone(),
        incarnation: 1,
    };
    queue::record_assignments(doc, &[a], 1).expect("assign");
    (worker, attempt)
}

/// Assigns, starts and finishes `task` as attempt 1.
fn run(doc: &mut Automerge, task: &TaskId) {
    let (worker, attempt) = assign(doc, task);
    queue::record_start(doc, task, &attempt, &worker, 1, 2).expect("start");
    queue::record_finish(
        doc,
        task,
        &attempt,
        &worker,
        AttemptOutcome::Succeeded,
        None,
        3,
    )
    .expect("finish");
}

/// Assigns, starts and finishes `task` as a node does: each write followed by a refresh, the
/// start and the end checked against the refreshed view.
fn life_as_a_node(doc: &mut Automerge, cache: &mut ViewCache, task: &TaskId) {
    let (worker, attempt) = assign(doc, task);
    let writes = [
        queue::AttemptWrite::Start {
            task: task.clone(),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        },
        queue::AttemptWrite::Finish {
            task: task.clone(),
            attempt,
            worker,
            outcome: AttemptOutcome::Succeeded,
            error: None,
            output: None,
            follow_ups: vec![],
        },
    ];
    for w in writes {
        let view = cache.refresh(doc).expect("a queue").clone();
        let r = queue::record_attempts_in_view(doc, &view, std::slice::from_ref(&w), 2);
        assert!(r.iter().all(Result::is_ok), "{r:?}");
    }
}

/// A queue with `n` tasks, finished (history) or pending (live).
fn queue_with(n: u64, finished: bool) -> Automerge {
    let mut doc = Automerge::new();
    queue::create(&mut doc, "q", &QueueConfig::default(), &me(), 0).expect("create");
    for i in 0..n {
        let t = submit(&mut doc, i);
        if finished {
            run(&mut doc, &t);
        }
    }
    doc
}

/// A queue with `n` finished tasks whose every value is judged: signed membership, a
/// submitter and a removed member beside the creator, who writes everything.
fn judged_queue_with(n: u64) -> Automerge {
    // Not a libp2p id: its key is the signer's own.
    let creator = Signer::new(PeerId::new("bench-creator"), [1; 32]);
    let q = QueueId::new("automerge:judged");
    let mut doc = Automerge::new().with_actor(actor_for(creator.peer(), [1; 8]));
    queue::create(&mut doc, "q", &QueueConfig::default(), creator.peer(), 0).expect("create");
    queue::set_signed_membership(&mut doc, &q, &creator.public()).expect("signed");
    for (peer, kind) in [
        ("submitter", OpKind::Add),
        ("gone", OpKind::Add),
        ("gone", OpKind::Remove),
    ] {
        let secret = [peer.len() as u8; 32];
        let peer = Signer::new(PeerId::new(peer), secret);
        let deps = QueueView::read(&doc).expect("a queue").membership.heads();
        let op = MemberOp::sign(
            &creator,
            NewOp {
                queue: &q,
                kind,
                peer: peer.peer(),
                role: (kind == OpKind::Add).then_some(Role::Submitter),
                key: Some(peer.public()),
                deps,
                at_ms: 0,
                via: None,
                cut: None,
            },
        );
        queue::add_member_op(&mut doc, &op).expect("op");
    }
    assert!(
        !QueueView::read(&doc)
            .expect("a queue")
            .membership
            .all_work()
    );
    for i in 0..n {
        let t = submit(&mut doc, i);
        run(&mut doc, &t);
    }
    doc
}

fn sizes() -> Vec<u64> {
    std::env::var("PIECEWORK_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000])
}

fn hot_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue_doc");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    for n in sizes() {
        for (what, finished) in [("history", true), ("live", false), ("judged", true)] {
            let mut doc = match what {
                "judged" => judged_queue_with(n),
                _ => queue_with(n, finished),
            };
            let mut cache = ViewCache::new();
            cache.refresh(&doc);
            let mut next = n;
            g.bench_function(BenchmarkId::new(format!("submit/{what}"), n), |b| {
                b.iter(|| {
                    submit(&mut doc, next);
                    next += 1;
                    cache.refresh(&doc).map(|v| v.tasks().len())
                });
            });
            g.bench_function(BenchmarkId::new(format!("task_life/{what}"), n), |b| {
                b.iter(|| {
                    let t = submit(&mut doc, next);
                    next += 1;
                    cache.refresh(&doc);
                    run(&mut doc, &t);
                    cache.refresh(&doc).map(|v| v.counts().pending)
                });
            });
            g.bench_function(
                BenchmarkId::new(format!("task_life_as_a_node/{what}"), n),
                |b| {
                    b.iter(|| {
                        let t = submit(&mut doc, next);
                        next += 1;
                        cache.refresh(&doc);
                        life_as_a_node(&mut doc, &mut cache, &t);
                        cache.refresh(&doc).map(|v| v.counts().pending)
                    });
                },
            );
            if n <= 10_000 {
                g.bench_function(BenchmarkId::new(format!("full_read/{what}"), n), |b| {
                    b.iter(|| QueueView::read(&doc).map(|v| v.tasks().len()));
                });
            }
        }
    }
    g.finish();
}

/// `PIECEWORK_ROTATE_SIZES`, or 1k and 10k.
fn rotate_sizes() -> Vec<u64> {
    std::env::var("PIECEWORK_ROTATE_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000])
}

/// A queue of `n` finished tasks then `n` live ones, the live ones, and its view.
fn to_rotate(n: u64) -> (Automerge, Vec<TaskId>, QueueView) {
    let mut doc = queue_with(n, true);
    let live: Vec<TaskId> = (n..2 * n).map(|i| submit(&mut doc, i)).collect();
    let view = QueueView::read(&doc).expect("a queue");
    (doc, live, view)
}

/// The rotation of `origin` into its first successor.
fn rotation_of<'a>(
    origin: &'a piecework_queue_doc::QueueId,
    claim: &'a Claim,
) -> epoch::Rotation<'a> {
    epoch::Rotation {
        origin,
        prev: "automerge:origin",
        successor: "automerge:next",
        epoch: 1,
        claim,
        now_ms: 1,
    }
}

fn rotation(c: &mut Criterion) {
    let mut g = c.benchmark_group("rotate");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    let (origin, claim) = (
        piecework_queue_doc::QueueId::new("automerge:origin"),
        Claim::new(1, me()),
    );
    let r = rotation_of(&origin, &claim);
    for n in rotate_sizes() {
        let (doc, _, view) = to_rotate(n);
        g.bench_function(BenchmarkId::new("live", n), |b| {
            b.iter(|| {
                let mut succ = Automerge::new();
                epoch::build_successor(&doc, &view, &mut succ, &r).map(|s| s.carried)
            });
        });
        let mut succ = Automerge::new();
        epoch::build_successor(&doc, &view, &mut succ, &r).expect("rotate");
        let bytes = succ.save();
        eprintln!(
            "rotate/{n}: the successor of {n} live tasks is {} bytes (the old document {} bytes)",
            bytes.len(),
            doc.save().len()
        );
        g.bench_function(BenchmarkId::new("load", n), |b| {
            b.iter(|| {
                let d = Automerge::load(&bytes).expect("loads");
                QueueView::read(&d).map(|v| v.tasks().len())
            });
        });
    }
    g.finish();
}

/// Carrying late writes: a queue of `n` live tasks (and as many finished) is rotated at its
/// heads, then written to as the nodes of a busy cluster write a sealed document before they
/// hear of the seal: 8 batches of 64 submits, and an assignment, a start and an end for 512
/// of the live tasks, one change each. `carry/late` carries them into a copy of the successor
/// with the node's rule for a task left behind at the seal (`epoch::known_at`).
fn carry(c: &mut Criterion) {
    let mut g = c.benchmark_group("carry");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    let (origin, claim) = (
        piecework_queue_doc::QueueId::new("automerge:origin"),
        Claim::new(1, me()),
    );
    let r = rotation_of(&origin, &claim);
    for n in rotate_sizes() {
        let (mut doc, live, view) = to_rotate(n);
        let mut succ = Automerge::new();
        epoch::build_successor(&doc, &view, &mut succ, &r).expect("rotate");
        let heads = doc.get_heads();
        let mut next = 2 * n;
        for _ in 0..8 {
            let batch: Vec<Submission> = (0..64)
                .map(|_| {
                    next += 1;
                    Submission {
                        id: TaskId::new(format!("automerge:task{next:08}")),
                        kind: "noop".into(),
                        submitter: me(),
                        submitted_at: next,
                        priority: 0,
                        urgent: false,
                        max_attempts: None,
                        input: None,
                        rules: Default::default(),
                    }
                })
                .collect();
            queue::submit_many(&mut doc, &batch).expect("submit");
        }
        for t in live.iter().take(512) {
            run(&mut doc, t);
        }
        g.bench_function(BenchmarkId::new("late", n), |b| {
            b.iter_batched(
                || succ.clone(),
                |mut into| {
                    let dropped = |t: &TaskId| epoch::known_at(&doc, &heads, t);
                    epoch::carry(
                        &doc,
                        &heads,
                        &mut into,
                        &dropped,
                        Some("automerge:origin"),
                        usize::MAX,
                    )
                    .map(|c| c.writes)
                },
                criterion::BatchSize::LargeInput,
            );
        });
    }
    g.finish();
}

criterion_group!(benches, hot_paths, rotation, carry);
criterion_main!(benches);
