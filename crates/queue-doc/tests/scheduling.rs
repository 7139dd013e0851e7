//! The scheduling rules a task's entry carries (tags, a not-before time, dependencies) and the
//! queue's boosts: how a view orders and holds back tasks by them, how a dependency's outcome
//! reaches its dependents (in the same document, across a rotation, in a late carried entry),
//! and how boosts merge and are carried as registers.

use automerge::{ActorId, Automerge};
use piecework_queue_doc::epoch::{self, Rotation};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueId, QueueView, Rules,
    Submission, TaskId, TaskState, ViewCache, WorkerId, queue,
};

fn new_queue() -> Automerge {
    let mut doc = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    let config = QueueConfig {
        max_attempts: 1,
        ..QueueConfig::default()
    };
    queue::create(&mut doc, "q", &config, &PeerId::new("s"), 0).unwrap();
    doc
}

fn fork(doc: &Automerge, actor: u8) -> Automerge {
    doc.fork().with_actor(ActorId::from(vec![actor; 16]))
}

fn id(n: &str) -> TaskId {
    TaskId::new(format!("automerge:{n}"))
}

fn submit(doc: &mut Automerge, name: &str, at: u64, rules: Rules) -> TaskId {
    let t = id(name);
    queue::submit(
        doc,
        &Submission {
            id: t.clone(),
            kind: "k".into(),
            submitter: PeerId::new("s"),
            submitted_at: at,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules,
        },
    )
    .unwrap();
    t
}

fn after(deps: &[&TaskId]) -> Rules {
    Rules {
        depends_on: deps.iter().map(|d| (*d).clone()).collect(),
        ..Rules::default()
    }
}

/// Runs `task` to `outcome` as attempt `n`.
fn run(doc: &mut Automerge, task: &TaskId, n: u64, outcome: AttemptOutcome) {
    let a = Assignment {
        task: task.clone(),
        attempt: AttemptId {
            n,
            claim: Claim::new(1, PeerId::new("r")),
        },
        worker: WorkerId::new(PeerId::new("w"), 0),
        incarnation: 1,
    };
    queue::record_assignments(doc, std::slice::from_ref(&a), 10).unwrap();
    queue::record_start(doc, task, &a.attempt, &a.worker, 1, 11).unwrap();
    let error = (outcome != AttemptOutcome::Succeeded).then_some("no");
    queue::record_finish(doc, task, &a.attempt, &a.worker, outcome, error, 12).unwrap();
}

fn view(doc: &Automerge) -> QueueView {
    QueueView::read(doc).unwrap()
}

fn pending(doc: &Automerge) -> Vec<TaskId> {
    view(doc).pending().iter().map(|t| t.id.clone()).collect()
}

fn rotate(old: &Automerge) -> Automerge {
    let origin = QueueId::new("automerge:q0");
    let sealer = Claim::new(1, PeerId::new("router"));
    let mut succ = Automerge::new().with_actor(ActorId::from(vec![9u8; 16]));
    epoch::build_successor(
        old,
        &view(old),
        &mut succ,
        &Rotation {
            origin: &origin,
            prev: "automerge:q0",
            successor: "automerge:q1",
            epoch: 1,
            claim: &sealer,
            now_ms: 1_000,
        },
    )
    .unwrap();
    succ
}

/// A boost moves every pending task with its tag ahead of (or behind) untagged ones at once,
/// by `boost × 200,000` of effective priority: more than any priority difference.
#[test]
fn a_boost_reorders_the_pending_tasks_with_its_tag_at_once() {
    let mut doc = new_queue();
    let plain = submit(&mut doc, "plain", 1, Rules::default());
    let tagged = submit(
        &mut doc,
        "tagged",
        2,
        Rules {
            tags: vec!["vip".into()],
            ..Rules::default()
        },
    );
    assert_eq!(pending(&doc), [plain.clone(), tagged.clone()]);
    queue::set_boost(&mut doc, "vip", 1, 5).unwrap();
    let v = view(&doc);
    assert_eq!(v.effective_priority(v.task(&tagged).unwrap()), 200_000);
    assert_eq!(pending(&doc), [tagged.clone(), plain.clone()]);
    queue::set_boost(&mut doc, "vip", -1, 6).unwrap();
    assert_eq!(pending(&doc), [plain.clone(), tagged.clone()]);
    // Removed (0): back to submit order.
    queue::set_boost(&mut doc, "vip", 0, 7).unwrap();
    assert_eq!(pending(&doc), [plain, tagged]);
    assert!(view(&doc).boosts.is_empty());
    assert!(queue::set_boost(&mut doc, "vip", 1_000_001, 8).is_err());
    assert!(queue::set_boost(&mut doc, "no spaces", 1, 8).is_err());
}

/// Two members boost one tag concurrently: every replica keeps the later write (by the time
/// each recorded), whatever Automerge's own pick among the conflicting values.
#[test]
fn concurrent_boosts_of_one_tag_merge_to_the_later_write() {
    let doc = new_queue();
    for (first, second) in [(2u8, 3u8), (3, 2)] {
        let mut a = fork(&doc, first);
        let mut b = fork(&doc, second);
        queue::set_boost(&mut a, "t", 7, 100).unwrap();
        queue::set_boost(&mut b, "t", -3, 200).unwrap();
        a.merge(&mut b).unwrap();
        b.merge(&mut a.clone()).unwrap();
        assert_eq!(view(&a).boosts.get("t"), Some(&-3));
        assert_eq!(view(&b).boosts.get("t"), Some(&-3));
    }
}

/// A rotation copies the boosts, and a boost written into the sealed document afterwards is
/// carried into the successor unless the successor holds a later one.
#[test]
fn boosts_are_copied_by_a_rotation_and_carried_as_registers() {
    let mut old = new_queue();
    queue::set_boost(&mut old, "a", 3, 100).unwrap();
    let seal = old.get_heads();
    let mut succ = rotate(&old);
    assert_eq!(view(&succ).boosts.get("a"), Some(&3));
    let mut late = fork(&old, 2);
    queue::set_boost(&mut late, "a", 5, 300).unwrap();
    queue::set_boost(&mut late, "b", 1, 300).unwrap();
    queue::set_boost(&mut succ, "b", 2, 400).unwrap();
    let none = |_: &TaskId| false;
    epoch::carry(&late, &seal, &mut succ, &none, None, usize::MAX).unwrap();
    let v = view(&succ);
    assert_eq!(v.boosts.get("a"), Some(&5), "the late write is carried");
    assert_eq!(
        v.boosts.get("b"),
        Some(&2),
        "the successor's later write stays"
    );
}

/// A dependent waits for its dependencies' success; when one fails, it and its own dependents
/// end cancelled without running, naming the dependency.
#[test]
fn a_dependent_waits_for_success_and_is_cancelled_by_a_failure_down_the_chain() {
    let mut doc = new_queue();
    let a = submit(&mut doc, "a", 1, Rules::default());
    let b = submit(&mut doc, "b", 2, Rules::default());
    let c = submit(&mut doc, "c", 3, after(&[&a, &b]));
    let d = submit(&mut doc, "d", 4, after(&[&c]));
    assert_eq!(pending(&doc), [a.clone(), b.clone()]);
    let v = view(&doc);
    let waiting: Vec<&TaskId> = v.waiting_on_dependencies().map(|t| &t.id).collect();
    assert_eq!(waiting, [&c, &d]);
    assert_eq!(
        v.task(&c).unwrap().waiting_on().collect::<Vec<_>>(),
        [&a, &b]
    );
    run(&mut doc, &a, 1, AttemptOutcome::Succeeded);
    assert_eq!(pending(&doc), std::slice::from_ref(&b));
    run(&mut doc, &b, 1, AttemptOutcome::Failed);
    let v = view(&doc);
    assert_eq!(v.task(&c).unwrap().state(), TaskState::Cancelled);
    assert_eq!(
        v.task(&c).unwrap().cancel_reason().unwrap(),
        format!("dependency {b} failed")
    );
    assert_eq!(
        v.task(&d).unwrap().cancel_reason().unwrap(),
        format!("dependency {c} was cancelled")
    );
    assert_eq!(v.counts().cancelled, 2);
    assert!(v.pending().is_empty());
}

/// The view a cache keeps follows a dependency's outcome into its dependents, reports them as
/// changed, and equals a whole read.
#[test]
fn a_cached_view_follows_a_dependencys_outcome_into_its_dependents() {
    let mut doc = new_queue();
    let a = submit(&mut doc, "a", 1, Rules::default());
    let b = submit(&mut doc, "b", 2, after(&[&a]));
    let mut cache = ViewCache::new();
    cache.refresh(&doc);
    cache.take_changed();
    run(&mut doc, &a, 1, AttemptOutcome::Failed);
    let v = cache.refresh(&doc).unwrap().clone();
    assert_eq!(v.task(&b).unwrap().state(), TaskState::Cancelled);
    assert_eq!(*v, view(&doc));
    match cache.take_changed() {
        piecework_queue_doc::Changed::Tasks(t) => assert!(t.contains(&b), "{t:?}"),
        piecework_queue_doc::Changed::Everything => panic!("an incremental refresh"),
    }
}

/// A dependency that ended before a rotation does not follow its pending dependent into the
/// successor: its outcome is recorded in the dependent's entry there.
#[test]
fn a_rotation_records_a_finished_dependencys_outcome_in_its_dependent() {
    let mut doc = new_queue();
    let a = submit(&mut doc, "a", 1, Rules::default());
    let b = submit(&mut doc, "b", 2, Rules::default());
    let c = submit(&mut doc, "c", 3, after(&[&a, &b]));
    run(&mut doc, &a, 1, AttemptOutcome::Succeeded);
    let succ = rotate(&doc);
    let v = view(&succ);
    assert!(v.task(&a).is_none(), "a finished task is not carried");
    let entry = v.task(&c).unwrap();
    assert_eq!(entry.rules.outcomes.get(&a), Some(&TaskState::Succeeded));
    assert_eq!(entry.waiting_on().collect::<Vec<_>>(), [&b]);
    assert_eq!(epoch::task_state(&succ, &c), Some(TaskState::Pending));
}

/// A dependent submitted late into a sealed document, after its dependency ended there and
/// was left behind by the rotation, is carried with that dependency's outcome.
#[test]
fn a_late_dependent_is_carried_with_its_left_behind_dependencys_outcome() {
    let mut old = new_queue();
    let a = submit(&mut old, "a", 1, Rules::default());
    run(&mut old, &a, 1, AttemptOutcome::Succeeded);
    let f = submit(&mut old, "f", 2, Rules::default());
    run(&mut old, &f, 1, AttemptOutcome::Failed);
    let seal = old.get_heads();
    let mut succ = rotate(&old);
    let mut late = fork(&old, 2);
    let b = submit(&mut late, "b", 3, after(&[&a]));
    let c = submit(&mut late, "c", 4, after(&[&f]));
    let dropped = |t: &TaskId| epoch::known_at(&late, &seal, t);
    epoch::carry(&late, &seal, &mut succ, &dropped, None, usize::MAX).unwrap();
    let v = view(&succ);
    assert_eq!(
        v.pending().first().map(|t| &t.id),
        Some(&b),
        "b is routable"
    );
    assert_eq!(v.task(&c).unwrap().state(), TaskState::Cancelled);
}

/// A submit names dependencies the document indexes (or whose outcome it records): an unknown
/// one is refused, and so is a task that depends on itself or carries a bad tag.
#[test]
fn a_submit_with_an_unknown_dependency_or_a_bad_tag_is_refused() {
    let mut doc = new_queue();
    let ghost = id("ghost");
    let sub = |name: &str, rules: Rules| Submission {
        id: id(name),
        kind: "k".into(),
        submitter: PeerId::new("s"),
        submitted_at: 1,
        priority: 0,
        urgent: false,
        max_attempts: None,
        input: None,
        rules,
    };
    assert!(matches!(
        queue::submit(&mut doc, &sub("x", after(&[&ghost]))),
        Err(queue::SubmitError::UnknownDependency(d)) if d == ghost
    ));
    assert!(matches!(
        queue::submit(&mut doc, &sub("x", after(&[&id("x")]))),
        Err(queue::SubmitError::BadDependencies)
    ));
    let bad = Rules {
        tags: vec!["a b".into()],
        ..Rules::default()
    };
    assert!(matches!(
        queue::submit(&mut doc, &sub("x", bad)),
        Err(queue::SubmitError::BadTag(_))
    ));
    // With the outcome recorded (it ended in an earlier epoch), the dependency is known.
    let mut known = after(&[&ghost]);
    known.outcomes.insert(ghost.clone(), TaskState::Succeeded);
    queue::submit(&mut doc, &sub("x", known)).unwrap();
    assert_eq!(pending(&doc), [id("x")]);
}

/// A dependency cycle, which only a hostile writer can make (a submit names existing tasks),
/// neither hangs a view nor lets either task run.
#[test]
fn a_dependency_cycle_from_a_hostile_writer_runs_nothing() {
    let mut doc = new_queue();
    let a = id("a");
    let b = id("b");
    // Written as a hostile peer would: a's entry names b before b exists, with a made-up
    // outcome, then b names a.
    let mut rules_a = after(&[&b]);
    rules_a.outcomes.insert(b.clone(), TaskState::Succeeded);
    submit(&mut doc, "a", 1, rules_a);
    submit(&mut doc, "b", 2, after(&[&a]));
    // a counts b as succeeded (its recorded outcome), b waits for a: a may run, b may not.
    assert_eq!(pending(&doc), std::slice::from_ref(&a));
    run(&mut doc, &a, 1, AttemptOutcome::Failed);
    // Each outcome follows the other round the cycle once, and the view settles.
    let v = view(&doc);
    assert_eq!(v.task(&b).unwrap().state(), TaskState::Cancelled);
    assert_eq!(v.task(&a).unwrap().state(), TaskState::Cancelled);
    assert!(v.pending().is_empty());
}

/// Tasks with a not-before time are held apart from the routing index, by that time.
#[test]
fn a_task_with_a_not_before_time_is_held_in_the_timed_index() {
    let mut doc = new_queue();
    let now = submit(&mut doc, "now", 1, Rules::default());
    let later = submit(
        &mut doc,
        "later",
        2,
        Rules {
            not_before: 5_000,
            ..Rules::default()
        },
    );
    let v = view(&doc);
    assert_eq!(pending(&doc), [now]);
    let timed: Vec<(u64, &TaskId)> = v.timed().map(|(at, t)| (at, &t.id)).collect();
    assert_eq!(timed, [(5_000, &later)]);
}

fn keyed(key: &str) -> Rules {
    Rules {
        dedup_key: Some(key.into()),
        ..Rules::default()
    }
}

fn bump(doc: &mut Automerge, task: &TaskId, t: u64, p: i64) {
    let b = piecework_queue_doc::Bump { t, p, u: false };
    queue::submit_and_bump(doc, &[], &[(task.clone(), b)]).unwrap();
}

/// A bump moves a task to the front of its priority class (FIFO: before every unbumped task,
/// the latest bump first; LIFO: as a new push) and raises its priority where the bump's is
/// higher; concurrent bumps merge field by field.
#[test]
fn a_bump_moves_a_task_to_the_front_of_its_class_and_raises_its_priority() {
    let mut doc = new_queue();
    let a = submit(&mut doc, "a", 1, keyed("k"));
    let b = submit(&mut doc, "b", 2, Rules::default());
    let c = submit(&mut doc, "c", 3, Rules::default());
    bump(&mut doc, &c, 10, 0);
    assert_eq!(pending(&doc), [c.clone(), a.clone(), b.clone()]);
    bump(&mut doc, &b, 11, 0);
    assert_eq!(pending(&doc), [b.clone(), c.clone(), a.clone()]);
    let mut other = fork(&doc, 2);
    bump(&mut doc, &a, 12, 4);
    bump(&mut other, &a, 13, 2);
    doc.merge(&mut other).unwrap();
    let v = view(&doc);
    let e = v.task(&a).unwrap();
    assert_eq!(
        (e.priority_now(), e.bumped_at()),
        (4, 13),
        "merged field by field"
    );
    assert_eq!(pending(&doc), [a.clone(), b.clone(), c.clone()]);
    // A LIFO queue: a bump is a new push, and a later submit goes above it.
    queue::set_config(
        &mut doc,
        &piecework_queue_doc::ConfigPatch {
            order: Some(piecework_queue_doc::Order::Lifo),
            ..Default::default()
        },
        20,
    )
    .unwrap();
    let d = submit(&mut doc, "d", 14, Rules::default());
    bump(&mut doc, &b, 15, 0);
    assert_eq!(pending(&doc), [a, b, d, c]);
}

/// Two copies of one dedup key made apart: once merged, the smaller id survives and the other
/// ends cancelled naming it; a dependent of the loser depends on the survivor, in the view and
/// in a successor epoch.
#[test]
fn concurrent_copies_merge_to_the_smaller_id_and_dependents_follow_the_survivor() {
    let doc = new_queue();
    let mut left = fork(&doc, 2);
    let mut right = fork(&doc, 3);
    let x1 = submit(&mut left, "x1", 1, keyed("k"));
    let x2 = submit(&mut right, "x2", 2, keyed("k"));
    let dep = submit(&mut right, "dep", 3, after(&[&x2]));
    left.merge(&mut right).unwrap();
    let v = view(&left);
    assert_eq!(v.task(&x2).unwrap().state(), TaskState::Cancelled);
    assert_eq!(
        v.task(&x2).unwrap().cancel_reason().unwrap(),
        format!("duplicate of {x1}")
    );
    assert_eq!(v.dedup_target("k").map(|t| &t.id), Some(&x1));
    assert_eq!(pending(&left), std::slice::from_ref(&x1));
    // The dependent waits for the survivor, and its success releases it.
    let succ = rotate(&left);
    let sv = view(&succ);
    assert!(sv.task(&x2).is_none(), "the cancelled copy is left behind");
    assert_eq!(
        sv.task(&dep).unwrap().rules.depends_on,
        std::slice::from_ref(&x1)
    );
    run(&mut left, &x1, 1, AttemptOutcome::Succeeded);
    assert_eq!(pending(&left), [dep]);
}

/// A copy that started before the merge survives, whatever the ids; a task made after the key's
/// task started, naming it, is no copy of it.
#[test]
fn a_started_copy_survives_and_a_task_made_after_a_start_is_no_copy() {
    let doc = new_queue();
    let mut left = fork(&doc, 2);
    let mut right = fork(&doc, 3);
    let x1 = submit(&mut left, "x1", 1, keyed("k"));
    let x2 = submit(&mut right, "x2", 2, keyed("k"));
    // x2 starts on the right.
    let a = Assignment {
        task: x2.clone(),
        attempt: AttemptId {
            n: 1,
            claim: Claim::new(1, PeerId::new("r")),
        },
        worker: WorkerId::new(PeerId::new("w"), 0),
        incarnation: 1,
    };
    queue::record_assignments(&mut right, std::slice::from_ref(&a), 5).unwrap();
    queue::record_start(&mut right, &x2, &a.attempt, &a.worker, 1, 6).unwrap();
    // Then a new task of the key is made there, knowing x2 started.
    let x3 = submit(
        &mut right,
        "x3",
        7,
        Rules {
            dedup_after: vec![x2.clone()],
            ..keyed("k")
        },
    );
    left.merge(&mut right).unwrap();
    let v = view(&left);
    assert_eq!(
        v.task(&x1).unwrap().cancel_reason().unwrap(),
        format!("duplicate of {x2}")
    );
    assert_eq!(v.task(&x2).unwrap().state(), TaskState::Running);
    // x3 was made after x2 started: no copy of it. It is x1's copy (neither knew of the
    // other), but x1 lost to x2, so x3 survives: the new run it asked for is kept.
    assert_eq!(v.task(&x3).unwrap().duplicate_of, None);
    assert_eq!(pending(&left), [x3]);
}

/// A bump written into a sealed document is carried into the successor, merged with the
/// successor's.
#[test]
fn a_late_bump_is_carried_merged() {
    let mut old = new_queue();
    let a = submit(&mut old, "a", 1, keyed("k"));
    bump(&mut old, &a, 5, 1);
    let seal = old.get_heads();
    let mut succ = rotate(&old);
    assert_eq!(view(&succ).task(&a).unwrap().bumped_at(), 5);
    let mut late = fork(&old, 2);
    bump(&mut late, &a, 9, 0);
    bump(&mut succ, &a, 7, 3);
    let none = |_: &TaskId| false;
    epoch::carry(&late, &seal, &mut succ, &none, None, usize::MAX).unwrap();
    let v = view(&succ);
    let e = v.task(&a).unwrap();
    assert_eq!((e.bumped_at(), e.priority_now()), (9, 3));
}

/// An idempotency record names the task a key's first submit made; a rotation keeps those at
/// most 24 hours old, and a carry keeps the earliest of two documents' records.
#[test]
fn idempotency_records_are_kept_a_day_and_carried_earliest_first() {
    let mut old = new_queue();
    let sub = |name: &str, key: &str| Submission {
        id: id(name),
        kind: "k".into(),
        submitter: PeerId::new("s"),
        submitted_at: 1,
        priority: 0,
        urgent: false,
        max_attempts: None,
        input: None,
        rules: Rules {
            idempotency_key: Some(key.into()),
            ..Rules::default()
        },
    };
    let day = queue::IDEMPOTENCY_KEEP_MS;
    // Rotation at 1,000 ms (see `rotate`): a record from before a day ago is dropped.
    queue::submit_all(&mut old, &[sub("old", "k-old")], &[], 0).unwrap();
    queue::submit_all(&mut old, &[sub("new", "k-new")], &[], 999).unwrap();
    assert_eq!(queue::idempotent_task(&old, "k-new"), Some(id("new")));
    let seal = old.get_heads();
    let mut succ = rotate(&old);
    assert_eq!(queue::idempotent_task(&succ, "k-new"), Some(id("new")));
    assert_eq!(
        queue::idempotent_task(&succ, "k-old"),
        Some(id("old")),
        "within a day"
    );
    let mut late = fork(&old, 2);
    queue::submit_all(&mut late, &[sub("late", "k-late")], &[], 500).unwrap();
    queue::submit_all(&mut succ, &[sub("other", "k-late")], &[], 2_000).unwrap();
    let none = |_: &TaskId| false;
    epoch::carry(&late, &seal, &mut succ, &none, None, usize::MAX).unwrap();
    assert_eq!(
        queue::idempotent_task(&succ, "k-late"),
        Some(id("late")),
        "the earliest"
    );
    // A day later, a rotation leaves the old records behind.
    let origin = QueueId::new("automerge:q0");
    let sealer = Claim::new(2, PeerId::new("router"));
    let mut next = Automerge::new();
    epoch::build_successor(
        &succ,
        &view(&succ),
        &mut next,
        &Rotation {
            origin: &origin,
            prev: "automerge:q1",
            successor: "automerge:q2",
            epoch: 2,
            claim: &sealer,
            now_ms: 999 + day + 1,
        },
    )
    .unwrap();
    assert_eq!(queue::idempotent_task(&next, "k-new"), None);
    assert_eq!(queue::idempotent_task(&next, "k-late"), None);
}
