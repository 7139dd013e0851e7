//! A task's life-cycle records: cancel requests and requeues of dead-lettered tasks. How a
//! view derives states from them, how concurrent ones merge, and how they reach a successor
//! epoch, by rotation and by carry (a requeue even of a task the successor left behind).

use automerge::{ActorId, Automerge};
use piecework_queue_doc::epoch::{self, Rotation};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, PlannedTask, QueueConfig, QueueId,
    QueueView, Rules, Submission, TaskId, TaskState, ViewCache, WorkerId, follow_up_id, queue,
};

fn new_queue() -> Automerge {
    let mut doc = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    let config = QueueConfig {
        max_attempts: 2,
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

fn submit(doc: &mut Automerge, name: &str, rules: Rules) -> TaskId {
    let t = id(name);
    queue::submit(
        doc,
        &Submission {
            id: t.clone(),
            kind: "k".into(),
            submitter: PeerId::new("s"),
            submitted_at: 5,
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

fn attempt(task: &TaskId, n: u64) -> Assignment {
    Assignment {
        task: task.clone(),
        attempt: AttemptId {
            n,
            claim: Claim::new(1, PeerId::new("r")),
        },
        worker: WorkerId::new(PeerId::new("w"), 0),
        incarnation: 1,
    }
}

/// Runs `task` to `outcome` as attempt `n` (`None`: started, still running).
fn run(doc: &mut Automerge, task: &TaskId, n: u64, outcome: Option<AttemptOutcome>) {
    let a = attempt(task, n);
    queue::record_assignments(doc, std::slice::from_ref(&a), 10).unwrap();
    queue::record_start(doc, task, &a.attempt, &a.worker, 1, 11).unwrap();
    if let Some(outcome) = outcome {
        let error = (outcome != AttemptOutcome::Succeeded).then_some("no");
        queue::record_finish(doc, task, &a.attempt, &a.worker, outcome, error, 12).unwrap();
    }
}

fn view(doc: &Automerge) -> QueueView {
    QueueView::read(doc).unwrap()
}

fn state(doc: &Automerge, t: &TaskId) -> TaskState {
    view(doc).task(t).unwrap().state()
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

fn fail_twice(doc: &mut Automerge, t: &TaskId, from: u64) {
    run(doc, t, from, Some(AttemptOutcome::Failed));
    run(doc, t, from + 1, Some(AttemptOutcome::Failed));
}

#[test]
fn a_cancelled_pending_task_is_cancelled_and_its_dependents_follow() {
    let mut doc = new_queue();
    let a = submit(&mut doc, "a", Rules::default());
    let b = submit(
        &mut doc,
        "b",
        Rules {
            depends_on: vec![a.clone()],
            ..Rules::default()
        },
    );
    let mut cache = ViewCache::new();
    cache.refresh(&doc);
    queue::cancel(&mut doc, &a, &PeerId::new("m"), 50).unwrap();
    let v = view(&doc);
    let entry = v.task(&a).unwrap();
    assert_eq!(entry.state(), TaskState::Cancelled);
    assert_eq!(entry.cancel_reason().as_deref(), Some("cancelled by m"));
    assert_eq!(v.task(&b).unwrap().state(), TaskState::Cancelled);
    assert!(v.pending().is_empty());
    // The incremental view reads the same as a whole read.
    let inc = cache.refresh(&doc).unwrap();
    assert_eq!(inc.task(&a).unwrap().state(), TaskState::Cancelled);
    assert_eq!(inc.task(&b).unwrap().state(), TaskState::Cancelled);
    // A second request merges with the first: the earlier stands.
    queue::cancel(&mut doc, &a, &PeerId::new("n"), 40).unwrap();
    assert_eq!(view(&doc).task(&a).unwrap().cancel.as_ref().unwrap().b, "n");
    // Cancelling a task the document does not index is refused.
    assert!(queue::cancel(&mut doc, &id("zz"), &PeerId::new("m"), 1).is_err());
}

#[test]
fn a_success_outranks_a_cancel_and_an_error_after_it_leaves_the_task_cancelled() {
    let mut doc = new_queue();
    let ok = submit(&mut doc, "ok", Rules::default());
    let err = submit(&mut doc, "err", Rules::default());
    run(&mut doc, &ok, 1, None);
    run(&mut doc, &err, 1, None);
    for t in [&ok, &err] {
        queue::cancel(&mut doc, t, &PeerId::new("m"), 50).unwrap();
        // Shown cancelled at once, while its run goes on.
        assert_eq!(state(&doc, t), TaskState::Cancelled);
    }
    let finish = |doc: &mut Automerge, t: &TaskId, o| {
        let a = attempt(t, 1);
        queue::record_finish(doc, t, &a.attempt, &a.worker, o, None, 60).unwrap();
    };
    finish(&mut doc, &ok, AttemptOutcome::Succeeded);
    finish(&mut doc, &err, AttemptOutcome::Failed);
    assert_eq!(state(&doc, &ok), TaskState::Succeeded);
    let v = view(&doc);
    assert!(v.task(&ok).unwrap().cancel_requested());
    assert_eq!(v.task(&err).unwrap().state(), TaskState::Cancelled);
    assert_eq!(v.task(&err).unwrap().failures(), 1);
}

#[test]
fn a_requeued_task_is_pending_with_a_fresh_budget_and_its_attempts_go_on() {
    let mut doc = new_queue();
    let t = submit(&mut doc, "t", Rules::default());
    fail_twice(&mut doc, &t, 1);
    assert_eq!(state(&doc, &t), TaskState::Failed);
    let mut cache = ViewCache::new();
    cache.refresh(&doc);
    let rq = view(&doc).task(&t).unwrap().requeue_now(100);
    assert_eq!((rq.n, rq.s), (2, 2));
    queue::requeue(&mut doc, &t, rq).unwrap();
    let v = view(&doc);
    let e = v.task(&t).unwrap();
    assert_eq!(e.state(), TaskState::Pending);
    assert_eq!(e.failures(), 0);
    assert_eq!(e.last_n(), 2);
    assert_eq!(e.attempts.len(), 2, "its history is kept");
    assert_eq!(v.pending().len(), 1);
    assert_eq!(
        cache.refresh(&doc).unwrap().task(&t).unwrap().state(),
        TaskState::Pending
    );
    // Attempts number on; a run started after the requeue is the third of its life.
    run(&mut doc, &t, 3, Some(AttemptOutcome::Failed));
    let e = view(&doc).task(&t).unwrap().clone();
    assert_eq!(
        (e.state(), e.failures(), e.runs_started()),
        (TaskState::Pending, 1, 3)
    );
    run(&mut doc, &t, 4, Some(AttemptOutcome::Failed));
    assert_eq!(state(&doc, &t), TaskState::Failed, "dead-lettered again");
}

#[test]
fn concurrent_requeues_merge_and_a_concurrent_cancel_wins_over_them() {
    let mut doc = new_queue();
    let t = submit(&mut doc, "t", Rules::default());
    fail_twice(&mut doc, &t, 1);
    let mut a = fork(&doc, 2);
    let mut b = fork(&doc, 3);
    let rq = view(&doc).task(&t).unwrap().requeue_now(100);
    queue::requeue(&mut a, &t, rq).unwrap();
    queue::requeue(&mut b, &t, piecework_queue_doc::Requeue { t: 200, ..rq }).unwrap();
    a.merge(&mut b.clone()).unwrap();
    b.merge(&mut a.clone()).unwrap();
    assert_eq!(
        view(&a).task(&t).unwrap().requeue,
        view(&b).task(&t).unwrap().requeue
    );
    assert_eq!(state(&a, &t), TaskState::Pending);
    let mut c = fork(&a, 4);
    queue::cancel(&mut c, &t, &PeerId::new("m"), 300).unwrap();
    a.merge(&mut c).unwrap();
    assert_eq!(state(&a, &t), TaskState::Cancelled);
}

#[test]
fn cancels_and_requeues_reach_the_successor_by_rotation_and_by_carry() {
    let mut doc = new_queue();
    let live = submit(&mut doc, "live", Rules::default());
    let requeued = submit(&mut doc, "requeued", Rules::default());
    let dead = submit(&mut doc, "dead", Rules::default());
    fail_twice(&mut doc, &requeued, 1);
    fail_twice(&mut doc, &dead, 1);
    let rq = view(&doc).task(&requeued).unwrap().requeue_now(100);
    queue::requeue(&mut doc, &requeued, rq).unwrap();
    // By rotation: the requeued task goes on with its record (its failures stay forgiven);
    // the dead-lettered one is left behind.
    let mut succ = rotate(&doc);
    let v = view(&succ);
    assert_eq!(v.task(&requeued).unwrap().state(), TaskState::Pending);
    assert_eq!(v.task(&requeued).unwrap().last_n(), 2);
    assert!(v.task(&dead).is_none());
    // Written in the sealed document after the seal: a cancel of a live task, and a requeue
    // of the task the successor left behind. The cancel is carried; the requeue is not: the
    // successor cannot tell whether the task it left behind failed or ended otherwise on a
    // branch `doc` does not hold (a success outranks a requeue), so it stays behind, failed.
    let since = doc.get_heads();
    queue::cancel(&mut doc, &live, &PeerId::new("m"), 200).unwrap();
    let rq = view(&doc).task(&dead).unwrap().requeue_now(200);
    queue::requeue(&mut doc, &dead, rq).unwrap();
    let none = |_: &TaskId| false;
    let carried = epoch::carry(&doc, &since, &mut succ, &none, None, usize::MAX).unwrap();
    assert_eq!((carried.writes, carried.skipped), (1, 1), "{carried:?}");
    let v = view(&succ);
    assert_eq!(v.task(&live).unwrap().state(), TaskState::Cancelled);
    assert!(v.task(&dead).is_none());
    // Carrying again writes nothing.
    let again = epoch::carry(&doc, &since, &mut succ, &none, None, usize::MAX).unwrap();
    assert_eq!(again.writes, 0);
}

/// Ends attempt `n` of `task` (assigned and started) with `outcome`, with `follow_ups` in the
/// same batch.
fn finish_with(
    doc: &mut Automerge,
    task: &TaskId,
    n: u64,
    outcome: AttemptOutcome,
    follow_ups: Vec<Submission>,
) -> Vec<Result<(), queue::AttemptError>> {
    let a = attempt(task, n);
    queue::record_assignments(doc, std::slice::from_ref(&a), 10).unwrap();
    queue::record_start(doc, task, &a.attempt, &a.worker, 1, 11).unwrap();
    let error = (outcome != AttemptOutcome::Succeeded).then(|| "no".to_owned());
    queue::record_attempts(
        doc,
        &[queue::AttemptWrite::Finish {
            task: task.clone(),
            attempt: a.attempt.clone(),
            worker: a.worker.clone(),
            outcome,
            error,
            output: None,
            follow_ups,
        }],
        12,
    )
}

fn follow_ups_of(task: &TaskId, n: usize) -> Vec<Submission> {
    (0..n)
        .map(|i| {
            PlannedTask::new("next", format!("{{\"i\":{i}}}")).submission(
                follow_up_id(task, i),
                PeerId::new("w"),
                12,
                |r| {
                    r.follows = Some(task.clone());
                    r.depends_on = vec![task.clone()];
                },
            )
        })
        .collect()
}

#[test]
fn follow_ups_are_written_with_the_success_and_only_with_it() {
    let mut doc = new_queue();
    let t = submit(&mut doc, "t", Rules::default());
    // A failure writes none.
    finish_with(
        &mut doc,
        &t,
        1,
        AttemptOutcome::Failed,
        follow_ups_of(&t, 2),
    )
    .into_iter()
    .for_each(|r| r.unwrap());
    assert_eq!(
        view(&doc).tasks().len(),
        1,
        "a failed run submits no follow-up"
    );
    // The success writes both, in the change that ends the attempt.
    let before = doc.get_heads();
    finish_with(
        &mut doc,
        &t,
        2,
        AttemptOutcome::Succeeded,
        follow_ups_of(&t, 2),
    )
    .into_iter()
    .for_each(|r| r.unwrap());
    let v = view(&doc);
    assert_eq!(v.task(&t).unwrap().state(), TaskState::Succeeded);
    for i in 0..2 {
        let f = v
            .task(&follow_up_id(&t, i))
            .expect("the follow-up is indexed");
        assert_eq!(f.rules.follows.as_ref(), Some(&t));
        assert_eq!(f.input.as_deref(), Some(format!("{{\"i\":{i}}}").as_str()));
        assert_eq!(
            f.state(),
            TaskState::Pending,
            "its task succeeded: it may run"
        );
        assert!(f.dependencies_met());
    }
    // The success and the follow-ups are one change (after the assignment's and the
    // start's): a replica that has it has both, one that lacks it has neither.
    let last = doc.get_changes(&before).last().unwrap().hash();
    let without_last: Vec<_> = doc
        .get_changes(&[])
        .into_iter()
        .filter(|c| c.hash() != last)
        .collect();
    let mut lacking = Automerge::new();
    lacking.apply_changes(without_last).unwrap();
    let lv = view(&lacking);
    assert_eq!(lv.task(&t).unwrap().state(), TaskState::Running);
    assert_eq!(lv.tasks().len(), 1, "without the success, no follow-up");
    // Another successful run of the task (two routers apart) makes no second follow-up.
    let mut other = fork(&doc, 3);
    finish_with(
        &mut other,
        &t,
        3,
        AttemptOutcome::Succeeded,
        follow_ups_of(&t, 2),
    )
    .into_iter()
    .for_each(|r| r.unwrap());
    doc.merge(&mut other).unwrap();
    assert_eq!(
        view(&doc).tasks().len(),
        3,
        "one task and its two follow-ups"
    );
}

#[test]
fn a_follow_up_held_where_its_task_has_not_succeeded_waits_on_it() {
    // Where branches meet: a document holds the follow-up (carried from the branch where its
    // task succeeded) and the task still running.
    let mut doc = new_queue();
    let t = submit(&mut doc, "t", Rules::default());
    run(&mut doc, &t, 1, None);
    queue::submit_many(&mut doc, &follow_ups_of(&t, 1)).unwrap();
    let f = follow_up_id(&t, 0);
    let v = view(&doc);
    assert_eq!(v.task(&t).unwrap().state(), TaskState::Running);
    assert!(
        !v.task(&f).unwrap().dependencies_met(),
        "it waits on its task"
    );
    assert!(v.routable().all(|e| e.id != f), "and is not routed");
    // The success arrives: it may run.
    let a = attempt(&t, 1);
    queue::record_finish(
        &mut doc,
        &t,
        &a.attempt,
        &a.worker,
        AttemptOutcome::Succeeded,
        None,
        13,
    )
    .unwrap();
    let v = view(&doc);
    assert!(v.task(&f).unwrap().dependencies_met());
    assert!(v.routable().any(|e| e.id == f));
}

/// A task's end stored on disk (`TaskEnd::encode`) reads back as the document held it: its
/// entry (rules, dependency outcomes, attempts, errors, requeue), its runs' outputs (an undo
/// list with them); restored from there into a successor that left it behind, its requeue
/// makes it pending again. Bytes that are not an end are refused, not read as one.
#[test]
fn a_stored_end_reads_back_whole_and_restores_the_task() {
    use piecework_queue_doc::epoch::{DecodeEndError, TaskEnd};
    let mut doc = new_queue();
    let dep = submit(&mut doc, "dep", Rules::default());
    run(&mut doc, &dep, 1, Some(AttemptOutcome::Succeeded));
    let rules = Rules {
        depends_on: vec![dep.clone()],
        tags: vec!["fast".into()],
        ..Rules::default()
    };
    let t = submit(&mut doc, "t", rules);
    fail_twice(&mut doc, &t, 1);
    let requeue = view(&doc).task(&t).unwrap().requeue_now(20);
    queue::requeue(&mut doc, &t, requeue).unwrap();
    run(&mut doc, &t, 3, Some(AttemptOutcome::Failed));
    let undo = PlannedTask::new("mark_unread", "{}");
    let a = attempt(&t, 4);
    queue::record_assignments(&mut doc, std::slice::from_ref(&a), 30).unwrap();
    queue::record_start(&mut doc, &t, &a.attempt, &a.worker, 1, 31).unwrap();
    let out = piecework_queue_doc::Output {
        result: Some("{\"ok\":1}".into()),
        undo: vec![undo],
        ..Default::default()
    };
    let finish = queue::AttemptWrite::Finish {
        task: t.clone(),
        attempt: a.attempt.clone(),
        worker: a.worker.clone(),
        outcome: AttemptOutcome::Failed,
        error: Some("no".into()),
        output: Some(out),
        follow_ups: vec![],
    };
    assert!(queue::record_attempts(&mut doc, &[finish], 32)[0].is_ok());
    assert_eq!(state(&doc, &t), TaskState::Failed);

    let held = epoch::task_entry(&doc, &t).unwrap();
    let outputs = piecework_queue_doc::read_outputs(&doc, &t);
    assert_eq!(outputs.len(), 1);
    let queue_id = QueueId::new("automerge:q0");
    let bytes = TaskEnd::new(std::sync::Arc::new(held.clone()), outputs.clone()).encode(&queue_id);
    let (q, back) = TaskEnd::decode(&bytes).unwrap();
    assert_eq!(q, queue_id);
    assert_eq!(back.entry().state(), TaskState::Failed);
    assert_eq!(back.entry().attempts, held.attempts);
    assert_eq!(back.entry().requeue, held.requeue);
    assert_eq!(back.entry().rules.tags, held.rules.tags);
    assert_eq!(back.entry().dependencies, held.dependencies);
    assert_eq!(
        (back.entry().kind.as_str(), back.entry().max_attempts),
        (held.kind.as_str(), held.max_attempts)
    );
    assert_eq!(back.outputs(), &outputs[..]);

    // The successor leaves both behind (ended); the end comes back with a requeue.
    let mut succ = rotate(&doc);
    assert!(view(&succ).task(&t).is_none());
    assert_eq!(view(&succ).total_counts().failed, 1);
    let mut entry = back.entry().clone();
    let again = entry.requeue_now(40);
    entry.requeue = Some(entry.requeue.map_or(again, |r| r.merge(again)));
    let requeued = TaskEnd::new(std::sync::Arc::new(entry), back.outputs().to_vec());
    epoch::restore_ends(&mut succ, &[&requeued]).unwrap();
    let v = view(&succ);
    let task = v.task(&t).unwrap();
    assert_eq!(task.state(), TaskState::Pending);
    assert_eq!(task.last_n(), 4, "its attempt numbers go on");
    // Counted once: live again, no longer among the retired failures.
    assert_eq!(v.total_counts().failed, 0);
    assert_eq!(v.total_counts().pending, 1);

    assert!(matches!(
        TaskEnd::decode(b"{\"v\":1}"),
        Err(DecodeEndError::Malformed(_))
    ));
    let later = String::from_utf8(bytes.clone())
        .unwrap()
        .replace("\"v\":1", "\"v\":9");
    assert_eq!(
        TaskEnd::decode(later.as_bytes()).map(|_| ()),
        Err(DecodeEndError::Version(9))
    );
    let bad_map = String::from_utf8(bytes).unwrap().replace("[5,", "[0,");
    assert!(TaskEnd::decode(bad_map.as_bytes()).is_err());
}
