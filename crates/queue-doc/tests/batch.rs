//! Batched writes: a turn's starts and ends of attempts go into the queue document as one
//! change, each checked as its single-write form would check it; a run's record and the task's
//! summary go into the task document as one change.

use automerge::Automerge;
use piecework_queue_doc::queue::{AttemptError, AttemptWrite};
use piecework_queue_doc::task::{self, NewTask, RunEnd, RunStart, Summary};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueId, QueueView,
    Submission, TaskId, TaskState, WorkerId, queue,
};

fn me() -> PeerId {
    PeerId::new("peer-a")
}

fn worker(i: u32) -> WorkerId {
    WorkerId::new(me(), i)
}

fn attempt() -> AttemptId {
    AttemptId {
        n: 1,
        claim: Claim::new(1, me()),
    }
}

/// A queue with `n` tasks, task `i` assigned to worker `i`.
fn queue_with_assigned(n: u32) -> (Automerge, Vec<TaskId>) {
    let mut doc = Automerge::new();
    queue::create(&mut doc, "q", &QueueConfig::default(), &me(), 0).unwrap();
    let ids: Vec<TaskId> = (0..n)
        .map(|i| TaskId::new(format!("automerge:t{i}")))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        queue::submit(
            &mut doc,
            &Submission {
                id: id.clone(),
                kind: "k".into(),
                submitter: me(),
                submitted_at: i as u64,
                priority: 0,
                urgent: false,
                max_attempts: None,
                input: None,
                rules: Default::default(),
            },
        )
        .unwrap();
    }
    let assignments: Vec<Assignment> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Assignment {
            task: id.clone(),
            attempt: attempt(),
            worker: worker(i as u32),
            incarnation: 1,
        })
        .collect();
    queue::record_assignments(&mut doc, &assignments, 1).unwrap();
    (doc, ids)
}

fn start(task: &TaskId, w: u32) -> AttemptWrite {
    AttemptWrite::Start {
        task: task.clone(),
        attempt: attempt(),
        worker: worker(w),
        incarnation: 1,
    }
}

fn finish(task: &TaskId, w: u32, outcome: AttemptOutcome) -> AttemptWrite {
    AttemptWrite::Finish {
        task: task.clone(),
        attempt: attempt(),
        worker: worker(w),
        outcome,
        error: None,
        output: None,
        follow_ups: vec![],
    }
}

#[test]
fn a_batch_of_starts_and_ends_is_one_change_and_reads_as_the_single_writes_do() {
    let (mut batched, ids) = queue_with_assigned(3);
    let mut single = batched.fork();
    let before = batched.get_changes(&[]).len();
    let writes = vec![
        start(&ids[0], 0),
        start(&ids[1], 1),
        // Later writes see earlier ones: this end needs the start above.
        finish(&ids[0], 0, AttemptOutcome::Succeeded),
        finish(&ids[2], 2, AttemptOutcome::Refused),
    ];
    let results = queue::record_attempts(&mut batched, &writes, 7);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(batched.get_changes(&[]).len(), before + 1, "one change");

    queue::record_start(&mut single, &ids[0], &attempt(), &worker(0), 1, 7).unwrap();
    queue::record_start(&mut single, &ids[1], &attempt(), &worker(1), 1, 7).unwrap();
    let a = attempt();
    queue::record_finish(
        &mut single,
        &ids[0],
        &a,
        &worker(0),
        AttemptOutcome::Succeeded,
        None,
        7,
    )
    .unwrap();
    queue::record_finish(
        &mut single,
        &ids[2],
        &a,
        &worker(2),
        AttemptOutcome::Refused,
        None,
        7,
    )
    .unwrap();
    let (b, s) = (
        QueueView::read(&batched).unwrap(),
        QueueView::read(&single).unwrap(),
    );
    for id in &ids {
        assert_eq!(b.task(id), s.task(id), "{id}");
    }
    assert_eq!(b.task(&ids[0]).unwrap().state(), TaskState::Succeeded);
    assert_eq!(b.task(&ids[1]).unwrap().state(), TaskState::Running);
}

#[test]
fn a_refused_write_in_a_batch_leaves_nothing_and_the_others_land() {
    let (mut doc, ids) = queue_with_assigned(2);
    let writes = vec![
        // Not started: it cannot succeed.
        finish(&ids[0], 0, AttemptOutcome::Succeeded),
        // Assigned to worker 1, not 0.
        start(&ids[1], 0),
        start(&ids[1], 1),
        // Twice: the second is refused against the first.
        start(&ids[1], 1),
        start(&TaskId::new("automerge:nope"), 0),
    ];
    let results = queue::record_attempts(&mut doc, &writes, 7);
    assert!(
        matches!(results[0], Err(AttemptError::NotStarted(..))),
        "{results:?}"
    );
    assert!(
        matches!(results[1], Err(AttemptError::WrongWorker { .. })),
        "{results:?}"
    );
    assert!(results[2].is_ok(), "{results:?}");
    assert!(
        matches!(results[3], Err(AttemptError::AlreadyStarted(..))),
        "{results:?}"
    );
    assert!(
        matches!(results[4], Err(AttemptError::UnknownTask(..))),
        "{results:?}"
    );
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.task(&ids[0]).unwrap().state(), TaskState::Assigned);
    assert_eq!(view.task(&ids[1]).unwrap().state(), TaskState::Running);

    // A batch of refused writes only makes no change at all.
    let heads = doc.get_heads();
    let results = queue::record_attempts(&mut doc, &writes[..2], 8);
    assert!(results.iter().all(Result::is_err));
    assert_eq!(doc.get_heads(), heads);
}

#[test]
fn a_run_and_the_summary_go_into_the_task_document_as_one_change() {
    let mut doc = Automerge::new();
    task::init(
        &mut doc,
        &NewTask {
            queue: QueueId::new("automerge:q"),
            kind: "k".into(),
            input: serde_json::json!({"x": 1}),
            submitter: me(),
            submitted_at: 0,
        },
    )
    .unwrap();
    let s = RunStart {
        attempt: attempt(),
        worker: worker(0),
        incarnation: 1,
        at: 5,
    };
    let end = RunEnd {
        outcome: AttemptOutcome::Succeeded,
        at: 9,
        result: Some(serde_json::json!("ok")),
        error: None,
        logs: vec!["one".into(), "two".into()],
        progress: Some(piecework_queue_doc::Progress::count(3, 4)),
    };
    let summary = Summary {
        state: TaskState::Succeeded,
        attempts: vec![],
        error: None,
        priority: Some(0),
        urgent: Some(false),
        max_attempts: Some(3),
        rules: Default::default(),
        cancel_reason: None,
    };
    let before = doc.get_changes(&[]).len();
    task::record_runs(&mut doc, &[(s.clone(), end.clone())], Some(&summary)).unwrap();
    assert_eq!(doc.get_changes(&[]).len(), before + 1, "one change");
    let t = task::read(&doc).unwrap();
    assert_eq!(t.runs.len(), 1);
    assert_eq!(t.runs[0].started_at, 5);
    assert_eq!(t.runs[0].end.as_ref(), Some(&end));
    assert_eq!(t.result(), Some(&serde_json::json!("ok")));
    assert_eq!(t.summary.as_ref(), Some(&summary), "read back whole");
    assert_eq!(task::read_input(&doc).unwrap(), serde_json::json!({"x": 1}));

    // Written again (a retried turn): nothing changes.
    let heads = doc.get_heads();
    task::record_runs(&mut doc, &[(s.clone(), end.clone())], Some(&summary)).unwrap();
    assert_eq!(task::read(&doc).unwrap().runs.len(), 1);
    assert_eq!(doc.get_heads(), heads, "no change");

    // A run whose start an earlier version recorded gets its end in place.
    let mut old = Automerge::new();
    task::init(
        &mut old,
        &NewTask {
            queue: QueueId::new("automerge:q"),
            kind: "k".into(),
            input: serde_json::json!(null),
            submitter: me(),
            submitted_at: 0,
        },
    )
    .unwrap();
    task::record_run_start(&mut old, &s).unwrap();
    task::record_runs(&mut old, &[(s, end.clone())], None).unwrap();
    let t = task::read(&old).unwrap();
    assert_eq!(t.runs.len(), 1);
    assert_eq!(t.runs[0].end.as_ref(), Some(&end));
}

#[test]
fn a_summary_written_before_summaries_carried_priority_reads_without_it() {
    let old = r#"{"state":"succeeded","attempts":[],"error":null}"#;
    let s: Summary = serde_json::from_str(old).expect("an old summary still reads");
    assert_eq!(s.state, TaskState::Succeeded);
    assert_eq!((s.priority, s.urgent, s.max_attempts), (None, None, None));
}

/// One write of the generated batches: a start or an end (of any outcome) of the only attempt
/// of task `task` (one more than the queue has: unknown) by worker `worker` (task `i` is
/// assigned to worker `i`).
#[derive(Clone, Debug)]
struct Write {
    task: u32,
    worker: u32,
    /// `None`: a start.
    end: Option<AttemptOutcome>,
}

fn write_strategy() -> impl proptest::strategy::Strategy<Value = Write> {
    use proptest::prelude::*;
    let outcome = prop_oneof![
        Just(AttemptOutcome::Succeeded),
        Just(AttemptOutcome::Failed),
        Just(AttemptOutcome::Refused),
        Just(AttemptOutcome::Interrupted),
        Just(AttemptOutcome::Unavailable),
    ];
    (0u32..4, 0u32..4, proptest::option::weighted(0.6, outcome))
        .prop_map(|(task, worker, end)| Write { task, worker, end })
}

proptest::proptest! {
    #![proptest_config(piecework_proptest_config::config(256))]

    /// Checking a batch against the document's view gives the same answers and the same
    /// document as checking it against the document, whatever the batch and whatever earlier
    /// batches left.
    #[test]
    fn a_batch_checked_against_the_view_is_the_batch_checked_against_the_document(
        batches in proptest::collection::vec(proptest::collection::vec(write_strategy(), 0..8), 1..5),
    ) {
        let (mut by_doc, ids) = queue_with_assigned(3);
        let mut by_view = by_doc.fork();
        let mut cache = piecework_queue_doc::ViewCache::new();
        let unknown = TaskId::new("automerge:unknown");
        for (round, batch) in batches.iter().enumerate() {
            let writes: Vec<AttemptWrite> = batch
                .iter()
                .map(|w| {
                    let task = ids.get(w.task as usize).unwrap_or(&unknown);
                    match w.end {
                        None => start(task, w.worker),
                        Some(o) => finish(task, w.worker, o),
                    }
                })
                .collect();
            let now = 10 + round as u64;
            let expected = queue::record_attempts(&mut by_doc, &writes, now);
            let view = cache.refresh(&by_view).unwrap().clone();
            let got = queue::record_attempts_in_view(&mut by_view, &view, &writes, now);
            // (The errors compare by their text: they hold Automerge's, which has no equality.)
            proptest::prop_assert_eq!(format!("{got:?}"), format!("{expected:?}"), "round {}", round);
            proptest::prop_assert_eq!(
                QueueView::read(&by_view).unwrap(),
                QueueView::read(&by_doc).unwrap(),
                "round {}", round
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(piecework_proptest_config::config(256))]

    /// A round of assignments checked against the document's view is refused or written as
    /// the same round checked against the document.
    #[test]
    fn assignments_checked_against_the_view_are_those_checked_against_the_document(
        rounds in proptest::collection::vec(
            proptest::collection::vec((0u32..4, 1u64..4, 0u32..3), 0..5),
            1..5,
        ),
    ) {
        let (mut by_doc, ids) = queue_with_assigned(3);
        let mut by_view = by_doc.fork();
        let mut cache = piecework_queue_doc::ViewCache::new();
        let unknown = TaskId::new("automerge:unknown");
        for (round, list) in rounds.iter().enumerate() {
            let assignments: Vec<Assignment> = list
                .iter()
                .map(|&(t, n, w)| Assignment {
                    task: ids.get(t as usize).unwrap_or(&unknown).clone(),
                    attempt: AttemptId { n, claim: Claim::new(1, me()) },
                    worker: worker(w),
                    incarnation: 1,
                })
                .collect();
            let now = 10 + round as u64;
            let expected = queue::record_assignments(&mut by_doc, &assignments, now);
            let view = cache.refresh(&by_view).unwrap().clone();
            let got = queue::record_assignments_in_view(&mut by_view, &view, &assignments, now);
            proptest::prop_assert_eq!(format!("{got:?}"), format!("{expected:?}"), "round {}", round);
            proptest::prop_assert_eq!(
                QueueView::read(&by_view).unwrap(),
                QueueView::read(&by_doc).unwrap(),
                "round {}", round
            );
        }
    }
}
