//! The `input unavailable` state: an attempt whose worker could not get the task's document
//! parks the task, visibly and without routing, until a member holding the document marks its
//! input available; concurrent marks merge to the greatest.

use automerge::{ActorId, Automerge};
use piecework_queue_doc::{
    AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueView, Submission, TaskId,
    TaskState, WorkerId, queue,
};

fn attempt(n: u64) -> AttemptId {
    AttemptId {
        n,
        claim: Claim::new(1, PeerId::new("router")),
    }
}

fn unavailable(doc: &mut Automerge, task: &TaskId, n: u64, worker: &WorkerId) {
    queue::record_assignments(
        doc,
        &[queue::Assignment {
            task: task.clone(),
            attempt: attempt(n),
            worker: worker.clone(),
            incarnation: 1,
        }],
        n,
    )
    .unwrap();
    queue::record_finish(
        doc,
        task,
        &attempt(n),
        worker,
        AttemptOutcome::Unavailable,
        Some("no member has it"),
        n,
    )
    .unwrap();
}

fn state(doc: &Automerge, task: &TaskId) -> TaskState {
    QueueView::read(doc).unwrap().tasks()[task].state()
}

#[test]
fn an_unavailable_input_parks_the_task_until_a_member_marks_it() {
    let me = PeerId::new("me");
    let mut doc = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    queue::create(&mut doc, "q", &QueueConfig::default(), &me, 0).unwrap();
    let task = TaskId::new("automerge:t1");
    queue::submit(
        &mut doc,
        &Submission {
            id: task.clone(),
            kind: "k".into(),
            submitter: me.clone(),
            submitted_at: 1,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules: Default::default(),
        },
    )
    .unwrap();
    let worker = WorkerId::new(PeerId::new("w"), 0);
    unavailable(&mut doc, &task, 1, &worker);
    assert_eq!(state(&doc, &task), TaskState::InputUnavailable);
    assert!(!TaskState::InputUnavailable.is_final());
    // Not a failure: it does not count towards max_attempts.
    assert_eq!(QueueView::read(&doc).unwrap().tasks()[&task].failures(), 0);

    // Two members mark it concurrently, at different attempt numbers: the greatest counts.
    let mut other = doc.fork().with_actor(ActorId::from(vec![2u8; 16]));
    queue::mark_input_available(&mut doc, &task, 1).unwrap();
    queue::mark_input_available(&mut other, &task, 0).unwrap();
    doc.merge(&mut other).unwrap();
    assert_eq!(state(&doc, &task), TaskState::Pending);
    assert_eq!(QueueView::read(&doc).unwrap().tasks()[&task].input_seen, 1);

    // Unavailable again at the next attempt: parked again until marked at that attempt.
    unavailable(&mut doc, &task, 2, &worker);
    assert_eq!(state(&doc, &task), TaskState::InputUnavailable);
    queue::mark_input_available(&mut doc, &task, 1).unwrap();
    assert_eq!(
        state(&doc, &task),
        TaskState::InputUnavailable,
        "an old mark"
    );
    queue::mark_input_available(&mut doc, &task, 2).unwrap();
    assert_eq!(state(&doc, &task), TaskState::Pending);
}
