//! Inline tasks: a task whose input lives in its queue entry, with no task document. Its runs'
//! results and logs are written with their ends, and both follow the task across a rotation
//! and a late carry.

use automerge::Automerge;
use piecework_queue_doc::epoch::{self, Rotation};
use piecework_queue_doc::queue::{AttemptWrite, record_attempts};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, Output, PeerId, QueueConfig, QueueId, QueueView,
    Submission, TaskId, TaskState, WorkerId, queue, read_outputs,
};

fn me() -> PeerId {
    PeerId::new("peer-a")
}

fn attempt(n: u64) -> AttemptId {
    AttemptId {
        n,
        claim: Claim::new(1, me()),
    }
}

fn submission(id: &TaskId, input: Option<&str>) -> Submission {
    Submission {
        id: id.clone(),
        kind: "k".into(),
        submitter: me(),
        submitted_at: 5,
        priority: 0,
        urgent: false,
        max_attempts: Some(3),
        input: input.map(str::to_owned),
        rules: Default::default(),
    }
}

/// Assigns, starts and ends attempt `n` of `task` on worker 0, with `output`.
fn run(doc: &mut Automerge, task: &TaskId, n: u64, outcome: AttemptOutcome, output: Output) {
    let w = WorkerId::new(me(), 0);
    let a = Assignment {
        task: task.clone(),
        attempt: attempt(n),
        worker: w.clone(),
        incarnation: 1,
    };
    queue::record_assignments(doc, &[a], 10 * n).unwrap();
    let writes = [
        AttemptWrite::Start {
            task: task.clone(),
            attempt: attempt(n),
            worker: w.clone(),
            incarnation: 1,
        },
        AttemptWrite::Finish {
            task: task.clone(),
            attempt: attempt(n),
            worker: w,
            outcome,
            error: (outcome == AttemptOutcome::Failed).then(|| "boom".into()),
            output: Some(output),
            follow_ups: vec![],
        },
    ];
    for r in record_attempts(doc, &writes, 10 * n + 1) {
        r.unwrap();
    }
}

#[test]
fn an_inline_task_keeps_its_input_and_outputs_in_the_queue_document() {
    let mut doc = Automerge::new();
    queue::create(&mut doc, "q", &QueueConfig::default(), &me(), 0).unwrap();
    let inline = TaskId::new("automerge:inline");
    let big = TaskId::new("automerge:big");
    queue::submit_many(
        &mut doc,
        &[
            submission(&inline, Some(r#"{"n":1}"#)),
            submission(&big, None),
        ],
    )
    .unwrap();
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(
        view.task(&inline).unwrap().input.as_deref(),
        Some(r#"{"n":1}"#)
    );
    assert_eq!(view.task(&big).unwrap().input, None);

    let failed = Output {
        result: None,
        logs: vec!["first try".into()],
        ..Output::default()
    };
    run(&mut doc, &inline, 1, AttemptOutcome::Failed, failed.clone());
    let outs = read_outputs(&doc, &inline);
    assert_eq!(outs, vec![(attempt(1), failed.clone())]);
    // An empty output writes nothing.
    run(&mut doc, &big, 1, AttemptOutcome::Failed, Output::default());
    assert!(read_outputs(&doc, &big).is_empty());

    // A rotation carries the live inline task with its input and its failed run's logs.
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.task(&inline).unwrap().state(), TaskState::Pending);
    let mut succ = Automerge::new();
    let claim = Claim::new(1, me());
    let origin = QueueId::new("automerge:q0");
    epoch::build_successor(
        &doc,
        &view,
        &mut succ,
        &Rotation {
            origin: &origin,
            prev: "automerge:q0",
            successor: "automerge:q1",
            epoch: 1,
            claim: &claim,
            now_ms: 100,
        },
    )
    .unwrap();
    let sv = QueueView::read(&succ).unwrap();
    assert_eq!(
        sv.task(&inline).unwrap().input.as_deref(),
        Some(r#"{"n":1}"#)
    );
    assert_eq!(
        read_outputs(&succ, &inline),
        vec![(attempt(1), failed.clone())]
    );

    // A late success written into the sealed document is carried with its result.
    let since = doc.get_heads();
    let ok = Output {
        result: Some("42".into()),
        logs: vec![],
        ..Output::default()
    };
    run(&mut doc, &inline, 2, AttemptOutcome::Succeeded, ok.clone());
    let carried = epoch::carry(&doc, &since, &mut succ, &|_| false, None, usize::MAX).unwrap();
    assert!(carried.writes >= 4, "{carried:?}");
    let sv = QueueView::read(&succ).unwrap();
    assert_eq!(sv.task(&inline).unwrap().state(), TaskState::Succeeded);
    assert_eq!(
        read_outputs(&succ, &inline),
        vec![(attempt(1), failed), (attempt(2), ok)]
    );
    // Carrying again changes nothing.
    let again = epoch::carry(&doc, &since, &mut succ, &|_| false, None, usize::MAX).unwrap();
    assert_eq!(again.writes, 0, "{again:?}");
}
