//! The pool state machine over real queue documents, and the runner's handling of handler
//! errors and panics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::Automerge;
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueId, QueueView,
    RouterBeat, Submission, TaskId, TaskState, WorkerId, queue,
};
use piecework_worker_pool::{
    Action, Config, Context, HandlerError, Pool, Registry, RunEnd, execute,
};

fn me() -> PeerId {
    PeerId::new("pool-peer")
}

fn qid() -> QueueId {
    QueueId::new("automerge:q")
}

struct Fixture {
    doc: Automerge,
    pool: Pool,
    t0: Instant,
}

impl Fixture {
    fn new(workers: u32, incarnation: u64) -> Self {
        #[allow(clippy::disallowed_methods)] // the anchor of virtual time
        let t0 = Instant::now();
        let mut doc = Automerge::new();
        queue::create(&mut doc, "q", &QueueConfig::default(), &me(), 0).unwrap();
        let pool = Pool::new(
            Config {
                peer: me(),
                workers,
                incarnation,
                heartbeat: Duration::from_millis(500),
            },
            t0,
        );
        Fixture { doc, pool, t0 }
    }

    fn submit(&mut self, n: u32) -> TaskId {
        let id = TaskId::new(format!("automerge:t{n}"));
        queue::submit(
            &mut self.doc,
            &Submission {
                id: id.clone(),
                kind: "k".into(),
                submitter: me(),
                submitted_at: u64::from(n),
                priority: 0,
                urgent: false,
                max_attempts: None,
            },
        )
        .unwrap();
        id
    }

    fn assign(&mut self, task: &TaskId, claim: &Claim, worker: u32) -> AttemptId {
        let view = QueueView::read(&self.doc).unwrap();
        let attempt = AttemptId {
            n: view.tasks[task].last_n() + 1,
            claim: claim.clone(),
        };
        queue::record_assignments(
            &mut self.doc,
            &[Assignment {
                task: task.clone(),
                attempt: attempt.clone(),
                worker: WorkerId::new(me(), worker),
            }],
            0,
        )
        .unwrap();
        attempt
    }

    /// Hands the pool the view and carries out its document actions; returns them.
    fn step(&mut self) -> Vec<Action> {
        let view = Arc::new(QueueView::read(&self.doc).unwrap());
        self.pool.handle_view(&qid(), &view);
        self.apply()
    }

    fn apply(&mut self) -> Vec<Action> {
        let mut out = vec![];
        while let Some(a) = self.pool.poll_action() {
            match &a {
                Action::Start(run) => {
                    queue::record_start(&mut self.doc, &run.task, &run.attempt, &run.worker, 1, 0)
                        .unwrap();
                }
                Action::Finish {
                    worker,
                    task,
                    attempt,
                    outcome,
                    error,
                    ..
                } => {
                    queue::record_finish(
                        &mut self.doc,
                        task,
                        attempt,
                        worker,
                        *outcome,
                        error.as_deref(),
                        0,
                    )
                    .unwrap();
                }
                Action::Beat(_) => {}
            }
            out.push(a);
        }
        out
    }
}

fn router(term: u64, peer: &str) -> Claim {
    Claim::new(term, PeerId::new(peer))
}

#[test]
fn starts_an_assignment_on_an_idle_worker_and_records_its_end() {
    let mut f = Fixture::new(2, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(1, "r"), 1);
    let actions = f.step();
    assert!(matches!(&actions[..], [Action::Start(run)] if run.worker.index == 1 && run.task == t));
    assert_eq!(f.pool.idle(), 1);
    assert!(
        f.step().is_empty(),
        "an answered attempt is not answered twice"
    );
    assert!(f.pool.handle_finished(1, RunEnd::Succeeded));
    assert!(
        !f.pool.handle_finished(1, RunEnd::Succeeded),
        "an idle worker has nothing to finish"
    );
    f.apply();
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks[&t].state(), TaskState::Succeeded);
    assert_eq!(f.pool.idle(), 2);
}

#[test]
fn fences_assignments_from_a_superseded_router() {
    let mut f = Fixture::new(2, 1);
    queue::claim_router(&mut f.doc, &router(1, "old"), 0).unwrap();
    let t1 = f.submit(1);
    let t2 = f.submit(2);
    f.assign(&t1, &router(1, "old"), 0);
    // The new router's claim reaches the document before the pool looks.
    queue::claim_router(&mut f.doc, &router(2, "new"), 0).unwrap();
    let actions = f.step();
    assert!(
        matches!(&actions[..], [Action::Finish { outcome: AttemptOutcome::Refused, error: Some(e), .. }] if e.contains("fenced")),
        "{actions:?}"
    );
    // A heartbeat alone fences too, before its claim reaches the document.
    f.pool.handle_router_beat(&RouterBeat {
        queue: qid(),
        claim: router(3, "newer"),
        counter: 1,
    });
    f.assign(&t2, &router(2, "new"), 0);
    let actions = f.step();
    assert!(
        matches!(
            &actions[..],
            [Action::Finish {
                outcome: AttemptOutcome::Refused,
                ..
            }]
        ),
        "{actions:?}"
    );
    assert_eq!(f.pool.idle(), 2);
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(
        view.tasks[&t1].state(),
        TaskState::Pending,
        "a refusal hands the task back"
    );
}

#[test]
fn refuses_work_for_a_busy_or_missing_worker() {
    let mut f = Fixture::new(1, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t1 = f.submit(1);
    let t2 = f.submit(2);
    let t3 = f.submit(3);
    f.assign(&t1, &router(1, "r"), 0);
    f.assign(&t2, &router(1, "r"), 0);
    f.assign(&t3, &router(1, "r"), 7);
    let actions = f.step();
    let refused: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Finish {
                outcome: AttemptOutcome::Refused,
                task,
                error,
                ..
            } => Some((task.clone(), error.clone().unwrap())),
            _ => None,
        })
        .collect();
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, Action::Start(_)))
            .count(),
        1
    );
    assert_eq!(refused.len(), 2, "{actions:?}");
    assert!(refused.iter().any(|(t, e)| *t == t2 && e.contains("busy")));
    assert!(
        refused
            .iter()
            .any(|(t, e)| *t == t3 && e.contains("no worker 7"))
    );
}

#[test]
fn a_restarted_node_marks_its_earlier_runs_interrupted() {
    let mut f = Fixture::new(1, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(1, "r"), 0);
    f.step();
    // The node restarts: a new pool, next incarnation, same documents.
    f.pool = Pool::new(
        Config {
            peer: me(),
            workers: 1,
            incarnation: 2,
            heartbeat: Duration::from_millis(500),
        },
        f.t0,
    );
    let actions = f.step();
    assert!(
        matches!(
            &actions[..],
            [Action::Finish {
                outcome: AttemptOutcome::Interrupted,
                started_by: Some(1),
                ..
            }]
        ),
        "{actions:?}"
    );
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks[&t].failures(), 1);
    assert_eq!(view.tasks[&t].state(), TaskState::Pending);
}

#[test]
fn refuses_an_assignment_for_a_task_that_already_has_an_outcome() {
    // Both sides of a partition had a router (same term, different peers) and both assigned
    // the task to this pool. The lower one's run succeeded; when the higher one's assignment
    // merges in, the task must not run again.
    let mut f = Fixture::new(2, 1);
    queue::claim_router(&mut f.doc, &router(2, "a"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(2, "a"), 0);
    assert!(matches!(&f.step()[..], [Action::Start(_)]));
    assert!(f.pool.handle_finished(0, RunEnd::Succeeded));
    f.apply();
    f.assign(&t, &router(2, "b"), 1);
    queue::claim_router(&mut f.doc, &router(2, "b"), 0).unwrap();
    let actions = f.step();
    assert!(
        matches!(&actions[..], [Action::Finish { outcome: AttemptOutcome::Refused, error: Some(e), .. }] if e.contains("outcome")),
        "{actions:?}"
    );
    assert_eq!(f.pool.idle(), 2);
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks[&t].state(), TaskState::Succeeded);
    assert_eq!(view.tasks[&t].refusals(), 1);
}

#[test]
fn heartbeats_list_every_worker_on_schedule() {
    let mut f = Fixture::new(3, 4);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(1, "r"), 2);
    f.step();
    f.pool.handle_timeout(f.t0);
    let Some(Action::Beat(b)) = f.pool.poll_action() else {
        panic!("no beat")
    };
    assert_eq!((b.incarnation, b.counter, b.workers.len()), (4, 1, 3));
    assert_eq!(b.workers[2].running.as_ref().map(|r| &r.task), Some(&t));
    assert!(b.workers[0].running.is_none());
    assert_eq!(f.pool.poll_timeout(), f.t0 + Duration::from_millis(500));
    f.pool.handle_timeout(f.t0 + Duration::from_millis(499));
    assert_eq!(f.pool.poll_action(), None);
    f.pool.handle_timeout(f.t0 + Duration::from_millis(500));
    assert!(matches!(f.pool.poll_action(), Some(Action::Beat(b)) if b.counter == 2));
}

fn ctx() -> Context {
    Context::new(
        TaskId::new("automerge:t"),
        AttemptId {
            n: 1,
            claim: router(1, "r"),
        },
        WorkerId::new(me(), 0),
    )
}

#[tokio::test]
async fn handler_results_errors_and_panics_become_outcomes() {
    let mut reg = Registry::new();
    reg.register(
        "echo",
        |ctx: Context, input: serde_json::Value| async move {
            ctx.log("echoing");
            Ok(input)
        },
    );
    reg.register(
        "fail",
        |_ctx: Context, _input: serde_json::Value| async move {
            Err(HandlerError::new("no such mailbox"))
        },
    );
    reg.register(
        "panic",
        |_ctx: Context, _input: serde_json::Value| async move {
            if true {
                panic!("boom");
            }
            Ok(serde_json::Value::Null)
        },
    );
    let ok = execute(&reg, "echo", ctx(), serde_json::json!({"a": 1})).await;
    assert_eq!(ok.result, Ok(serde_json::json!({"a": 1})));
    assert_eq!(ok.logs, vec!["echoing".to_owned()]);
    let err = execute(&reg, "fail", ctx(), serde_json::Value::Null).await;
    assert_eq!(err.result, Err("no such mailbox".to_owned()));
    let panicked = execute(&reg, "panic", ctx(), serde_json::Value::Null).await;
    assert_eq!(panicked.result, Err("handler panicked: boom".to_owned()));
    let missing = execute(&reg, "nope", ctx(), serde_json::Value::Null).await;
    assert!(
        missing
            .result
            .unwrap_err()
            .contains("no handler for kind \"nope\"")
    );
}
