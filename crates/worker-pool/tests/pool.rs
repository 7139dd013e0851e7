//! The pool state machine over real queue documents, and the runner's handling of handler
//! errors and panics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::transaction::Transactable;
use automerge::{Automerge, AutomergeError, ROOT, ReadDoc};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueId, QueueView,
    Submission, TaskId, TaskState, WorkerId, queue,
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
                input: None,
                rules: Default::default(),
            },
        )
        .unwrap();
        id
    }

    /// Assigns the task's next attempt to this pool's `worker`, addressed to the pool's
    /// incarnation.
    fn assign(&mut self, task: &TaskId, claim: &Claim, worker: u32) -> AttemptId {
        let incarnation = self.pool.config().incarnation;
        self.assign_to(task, claim, WorkerId::new(me(), worker), incarnation)
    }

    /// Assigns the task's next attempt to any worker, addressed to `incarnation` of its pool.
    fn assign_to(
        &mut self,
        task: &TaskId,
        claim: &Claim,
        worker: WorkerId,
        incarnation: u64,
    ) -> AttemptId {
        let view = QueueView::read(&self.doc).unwrap();
        let attempt = AttemptId {
            n: view.tasks()[task].last_n() + 1,
            claim: claim.clone(),
        };
        queue::record_assignments(
            &mut self.doc,
            &[Assignment {
                task: task.clone(),
                attempt: attempt.clone(),
                worker,
                incarnation,
            }],
            0,
        )
        .unwrap();
        attempt
    }

    /// The node restarts: a new pool of the next incarnation, same documents.
    fn restart(&mut self) {
        let c = self.pool.config().clone();
        self.pool = Pool::new(
            Config {
                incarnation: c.incarnation + 1,
                ..c
            },
            self.t0,
        );
    }

    /// Hands the pool the view and carries out its document actions; returns them.
    fn step(&mut self) -> Vec<Action> {
        let view = Arc::new(QueueView::read(&self.doc).unwrap());
        self.pool.handle_view(&qid(), &view, self.t0);
        self.apply()
    }

    fn apply(&mut self) -> Vec<Action> {
        let mut out = vec![];
        while let Some(a) = self.pool.poll_action() {
            match &a {
                Action::Start(run) => {
                    let incarnation = self.pool.config().incarnation;
                    queue::record_start(
                        &mut self.doc,
                        &run.task,
                        &run.attempt,
                        &run.worker,
                        incarnation,
                        0,
                    )
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
                Action::Beat(_) | Action::Cancel(_) => {}
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
    assert!(f.pool.handle_finished(1, RunEnd::Succeeded, f.t0).is_some());
    assert!(
        f.pool.handle_finished(1, RunEnd::Succeeded, f.t0).is_none(),
        "an idle worker has nothing to finish"
    );
    f.apply();
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks()[&t].state(), TaskState::Succeeded);
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
    // A claim that reaches the document later fences what its predecessor assigns from then.
    queue::claim_router(&mut f.doc, &router(3, "newer"), 0).unwrap();
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
        view.tasks()[&t1].state(),
        TaskState::Pending,
        "a refusal hands the task back"
    );
}

/// The mutation the story above catches: a pool with its fence switched off starts the
/// superseded router's assignment.
#[test]
fn a_pool_that_does_not_fence_starts_a_superseded_routers_assignment() {
    let mut f = Fixture::new(2, 1);
    f.pool.break_fencing();
    queue::claim_router(&mut f.doc, &router(1, "old"), 0).unwrap();
    let t1 = f.submit(1);
    f.assign(&t1, &router(1, "old"), 0);
    queue::claim_router(&mut f.doc, &router(2, "new"), 0).unwrap();
    let actions = f.step();
    assert_eq!(starts(&actions), 1, "{actions:?}");
    assert!(refusals(&actions).is_empty(), "{actions:?}");
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
    f.restart();
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
    assert_eq!(view.tasks()[&t].failures(), 1);
    assert_eq!(view.tasks()[&t].state(), TaskState::Pending);
}

#[test]
fn refuses_an_assignment_for_a_task_that_already_has_an_outcome() {
    // Both sides of a partition had a router (same term, different peers) and both assigned
    // the task to this pool. The lower one's run succeeded; when the higher one's assignment
    // merges in, the task must not run again.
    let mut f = Fixture::new(2, 1);
    // Claims are chained: a term-2 claim names the term-1 claim it supersedes.
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    queue::claim_router(&mut f.doc, &router(2, "a"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(2, "a"), 0);
    assert!(matches!(&f.step()[..], [Action::Start(_)]));
    assert!(f.pool.handle_finished(0, RunEnd::Succeeded, f.t0).is_some());
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
    assert_eq!(view.tasks()[&t].state(), TaskState::Succeeded);
    assert_eq!(view.tasks()[&t].refusals(), 1);
}

fn other_worker() -> WorkerId {
    WorkerId::new(PeerId::new("other-peer"), 0)
}

fn refusals(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Finish {
                outcome: AttemptOutcome::Refused,
                error,
                ..
            } => Some(error.clone().unwrap_or_default()),
            _ => None,
        })
        .collect()
}

fn starts(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Start(_)))
        .count()
}

#[test]
fn a_restarted_pool_refuses_an_assignment_addressed_to_its_earlier_incarnation() {
    let mut f = Fixture::new(1, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    // Assigned to incarnation 1, which dies before it sees the assignment.
    f.assign(&t, &router(1, "r"), 0);
    f.restart();
    let actions = f.step();
    assert_eq!(starts(&actions), 0, "{actions:?}");
    assert!(
        matches!(&refusals(&actions)[..], [e] if e.contains("incarnation 1") && e.contains("incarnation 2")),
        "{actions:?}"
    );
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks()[&t].state(), TaskState::Pending, "routed again");
    // An assignment addressed to the new incarnation runs.
    f.assign(&t, &router(1, "r"), 0);
    assert_eq!(starts(&f.step()), 1);
}

/// The story: the router assigns T as attempt 1 to this pool's worker; the node dies before
/// starting it and stays down longer than the lease; the router routes T again as attempt 2 to
/// another pool, which starts it. The node restarts, syncs and sees attempt 1 open, unstarted,
/// from the effective router: it must not run T a second time.
#[test]
fn a_restarted_pool_never_runs_a_task_that_was_routed_again() {
    let mut f = Fixture::new(1, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(1, "r"), 0);
    let again = f.assign_to(&t, &router(1, "r"), other_worker(), 1);
    queue::record_start(&mut f.doc, &t, &again, &other_worker(), 1, 0).unwrap();
    f.restart();
    let actions = f.step();
    assert_eq!(starts(&actions), 0, "{actions:?}");
    assert_eq!(refusals(&actions).len(), 1, "{actions:?}");
    assert_eq!(f.pool.idle(), 1);
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(
        view.tasks()[&t].state(),
        TaskState::Running,
        "on the other pool"
    );
}

#[test]
fn refuses_a_superseded_attempt() {
    let mut f = Fixture::new(2, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    // Attempt 1 to this pool, then attempt 2 elsewhere (not started yet) before the pool looks.
    f.assign(&t, &router(1, "r"), 0);
    f.assign_to(&t, &router(1, "r"), other_worker(), 1);
    let actions = f.step();
    assert_eq!(starts(&actions), 0, "{actions:?}");
    assert!(
        matches!(&refusals(&actions)[..], [e] if e.contains("superseded") && e.contains("#2")),
        "{actions:?}"
    );
}

#[test]
fn refuses_an_attempt_while_another_pool_runs_the_task() {
    // Two routers on either side of a partition numbered their attempts alike: router a's
    // attempt 1 runs on another pool; router b (the effective one) assigned its attempt 1 here.
    let mut f = Fixture::new(2, 1);
    // Claims are chained: router a's term-1 claim, then b's at term 2.
    queue::claim_router(&mut f.doc, &router(1, "a"), 0).unwrap();
    queue::claim_router(&mut f.doc, &router(2, "b"), 0).unwrap();
    let t = f.submit(1);
    let theirs = f.assign_to(&t, &router(1, "a"), other_worker(), 1);
    queue::record_start(&mut f.doc, &t, &theirs, &other_worker(), 1, 0).unwrap();
    let ours = AttemptId {
        n: 1,
        claim: router(2, "b"),
    };
    queue::record_assignments(
        &mut f.doc,
        &[Assignment {
            task: t.clone(),
            attempt: ours,
            worker: WorkerId::new(me(), 0),
            incarnation: 1,
        }],
        0,
    )
    .unwrap();
    let actions = f.step();
    assert_eq!(starts(&actions), 0, "{actions:?}");
    assert!(
        matches!(&refusals(&actions)[..], [e] if e.contains("running already") && e.contains("other-peer/0")),
        "{actions:?}"
    );
}

#[test]
fn refuses_an_attempt_while_this_pool_runs_the_task() {
    // This pool runs the task on worker 0; a router that thought the pool silent (past the
    // lease) assigns the next attempt to worker 1 of the same pool.
    let mut f = Fixture::new(2, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    f.assign(&t, &router(1, "r"), 0);
    assert_eq!(starts(&f.step()), 1);
    f.assign(&t, &router(1, "r"), 1);
    let actions = f.step();
    assert_eq!(starts(&actions), 0, "{actions:?}");
    assert!(
        matches!(&refusals(&actions)[..], [e] if e.contains("running already")),
        "{actions:?}"
    );
    assert_eq!(f.pool.idle(), 1);
}

#[test]
fn runs_an_attempt_that_replaces_a_run_on_a_silent_pool() {
    // The other pool started attempt 1 and went silent past the lease; the router routed the
    // task again here. Its open attempt 1 must not block the new run, or a task whose pool
    // died would never finish.
    let mut f = Fixture::new(1, 1);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = f.submit(1);
    let first = f.assign_to(&t, &router(1, "r"), other_worker(), 1);
    queue::record_start(&mut f.doc, &t, &first, &other_worker(), 1, 0).unwrap();
    f.assign(&t, &router(1, "r"), 0);
    let actions = f.step();
    assert!(
        matches!(&actions[..], [Action::Start(run)] if run.attempt.n == 2),
        "{actions:?}"
    );
}

#[test]
fn assignments_written_before_incarnations_were_recorded_still_run() {
    let mut f = Fixture::new(1, 3);
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    // A task and its attempt as an older writer left them: a layout-1 entry whose attempt
    // names no pool incarnation.
    let t = TaskId::new("automerge:old");
    let tasks = match f.doc.get(ROOT, "tasks").unwrap() {
        Some((_, id)) => id,
        None => panic!("no tasks"),
    };
    let worker = WorkerId::new(me(), 0).to_string();
    f.doc
        .transact::<_, _, AutomergeError>(|tx| {
            let e = tx.put_object(&tasks, t.as_str(), automerge::ObjType::Map)?;
            tx.put(&e, "kind", "k")?;
            tx.put(&e, "submitted_at", 1u64)?;
            tx.put(&e, "submitter", me().as_str())?;
            tx.put(&e, "max_attempts", 3u64)?;
            let list = tx.put_object(&e, "attempts", automerge::ObjType::List)?;
            let a = tx.insert_object(&list, 0, automerge::ObjType::Map)?;
            tx.put(&a, "n", 1u64)?;
            tx.put(&a, "term", 1u64)?;
            tx.put(&a, "router", "r")?;
            tx.put(&a, "worker", worker.as_str())?;
            tx.put(&a, "assigned_at", 0u64)?;
            Ok(())
        })
        .unwrap();
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks()[&t].attempts[0].pool_incarnation, None);
    assert_eq!(starts(&f.step()), 1);
}

#[test]
fn heartbeat_intervals_are_clamped_to_the_configured_minimum() {
    #[allow(clippy::disallowed_methods)] // the anchor of virtual time
    let t0 = Instant::now();
    let min = Duration::from_millis(QueueConfig::MIN_POOL_HEARTBEAT_MS);
    let mut pool = Pool::new(
        Config {
            peer: me(),
            workers: 1,
            incarnation: 1,
            heartbeat: Duration::ZERO,
        },
        t0,
    );
    assert_eq!(pool.config().heartbeat, min);
    pool.handle_timeout(t0);
    assert!(matches!(pool.poll_action(), Some(Action::Beat(_))));
    assert_eq!(pool.poll_timeout(), t0 + min, "no busy loop");
    pool.set_heartbeat(Duration::ZERO);
    assert_eq!(pool.config().heartbeat, min);
    pool.set_heartbeat(Duration::MAX);
    assert_eq!(
        pool.config().heartbeat,
        Duration::from_millis(QueueConfig::MAX_POOL_HEARTBEAT_MS)
    );
    pool.handle_timeout(t0 + min);
    assert!(matches!(pool.poll_action(), Some(Action::Beat(b)) if b.counter == 2));
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

/// A handler's result over `MAX_RESULT_BYTES` fails its run with "result too large" (it is
/// never written); logs keep at most `MAX_LOG_BYTES`, each line cut to `MAX_LOG_LINE_BYTES`,
/// and the lines beyond are counted.
#[tokio::test]
async fn results_and_logs_over_their_limits_are_refused_or_cut() {
    use piecework_worker_pool::runner::{MAX_LOG_BYTES, MAX_LOG_LINE_BYTES, MAX_RESULT_BYTES};
    let mut reg = Registry::new();
    reg.register(
        "big",
        |_ctx: Context, _input: serde_json::Value| async move {
            Ok(serde_json::Value::String("x".repeat(MAX_RESULT_BYTES)))
        },
    );
    reg.register(
        "chatty",
        |ctx: Context, _input: serde_json::Value| async move {
            ctx.log("é".repeat(MAX_LOG_LINE_BYTES));
            for _ in 0..100 {
                ctx.log("y".repeat(1_000));
            }
            Ok(serde_json::Value::Null)
        },
    );
    let big = execute(&reg, "big", ctx(), serde_json::Value::Null).await;
    let err = big.result.unwrap_err();
    assert!(err.starts_with("result too large"), "{err}");
    let chatty = execute(&reg, "chatty", ctx(), serde_json::Value::Null).await;
    assert!(chatty.result.is_ok());
    let kept: usize = chatty.logs.iter().map(String::len).sum();
    assert!(kept <= MAX_LOG_BYTES + 64, "{kept} bytes of logs kept");
    assert!(chatty.logs[0].len() <= MAX_LOG_LINE_BYTES + 64);
    assert!(
        chatty.logs[0].contains("more bytes cut"),
        "{}",
        &chatty.logs[0][..40]
    );
    assert!(
        chatty.logs.last().unwrap().contains("more lines dropped"),
        "{:?}",
        chatty.logs.last()
    );
}

/// A stopping node's pool (`Pool::drain`) starts nothing new: an assignment is refused, so its
/// router routes the task elsewhere at once, and its heartbeat, due at once, says it is
/// stopping. A run in progress goes on; when the grace time runs out, `Pool::interrupt` ends it
/// as interrupted by this incarnation, and the handler's later end is ignored.
#[test]
fn a_draining_pool_refuses_new_work_and_interrupts_what_outlives_the_grace() {
    let mut f = Fixture::new(2, 3);
    let claim = router(1, "r");
    queue::claim_router(&mut f.doc, &claim, 0).unwrap();
    let running = f.submit(1);
    f.assign(&running, &claim, 0);
    assert!(matches!(&f.step()[..], [Action::Start(_)]));
    // The node is asked to stop.
    let stop = f.t0 + Duration::from_secs(5);
    f.pool.drain(stop);
    assert!(f.pool.is_draining());
    f.pool.handle_timeout(stop);
    let beats: Vec<Action> = f.apply();
    assert!(
        matches!(&beats[..], [Action::Beat(b)] if b.draining && b.workers[0].running.is_some()),
        "{beats:?}"
    );
    // A new assignment is refused, with the reason.
    let next = f.submit(2);
    f.assign(&next, &claim, 1);
    let actions = f.step();
    assert!(
        matches!(&actions[..], [Action::Finish { outcome: AttemptOutcome::Refused, error: Some(e), .. }]
            if e.contains("stopping")),
        "{actions:?}"
    );
    assert_eq!(f.pool.idle(), 1);
    // The grace time runs out: the run is interrupted, by this incarnation.
    assert!(f.pool.interrupt(0, "stopped".into()));
    let actions = f.apply();
    assert!(
        matches!(&actions[..], [Action::Finish { outcome: AttemptOutcome::Interrupted, started_by: Some(3), task, .. }]
            if *task == running),
        "{actions:?}"
    );
    assert!(
        f.pool.handle_finished(0, RunEnd::Succeeded, f.t0).is_none(),
        "its end comes too late"
    );
    assert!(!f.pool.interrupt(0, "again".into()));
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks()[&running].state(), TaskState::Pending);
}

/// The pool's heartbeat of `f` at `at` ms after its start.
fn beat_at(f: &mut Fixture, at: u64) -> piecework_queue_doc::PoolBeat {
    f.pool.handle_timeout(f.t0 + Duration::from_millis(at));
    let beats: Vec<_> = f
        .apply()
        .into_iter()
        .filter_map(|a| match a {
            Action::Beat(b) => Some(b),
            _ => None,
        })
        .collect();
    beats.last().cloned().expect("the pool beat")
}

/// A pool's heartbeats name its kinds and the resources it holds; a withdrawn resource leaves
/// them at once and comes back by itself at its restore time; and an assignment of a kind the
/// pool has no handler for, or that requires a resource it does not hold (a router's stale
/// heartbeat), is refused (which burns no attempt) instead of run.
#[test]
fn heartbeats_carry_kinds_and_resources_and_the_pool_refuses_what_it_lacks() {
    let mut f = Fixture::new(2, 1);
    f.pool.set_kinds(["k".to_owned()]);
    f.pool.add_resource("net".into(), f.t0);
    let b = beat_at(&mut f, 0);
    assert_eq!(b.kinds, Some(vec!["k".to_owned()]));
    assert_eq!(b.resources, vec!["net".to_owned()]);
    assert!(f.pool.withdraw_resource(
        "net",
        f.t0 + Duration::from_millis(100),
        Some(Duration::from_secs(5))
    ));
    assert!(!f.pool.withdraw_resource("gpu", f.t0, None), "not held");
    assert!(
        !f.pool
            .withdraw_resource("gpu", f.t0, Some(Duration::from_millis(1))),
        "a withdrawal of a resource the pool never held restores nothing later"
    );
    let b = beat_at(&mut f, 100);
    assert!(b.resources.is_empty(), "withdrawn: {b:?}");
    assert_eq!(
        f.pool.poll_timeout(),
        f.t0 + Duration::from_millis(600),
        "the next beat comes before the restore"
    );

    // A task that requires the withdrawn resource, and one of another kind.
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let needs_net = TaskId::new("automerge:needs-net");
    let other = TaskId::new("automerge:other-kind");
    for (id, kind, requires) in [
        (&needs_net, "k", vec!["net".to_owned()]),
        (&other, "x", vec![]),
    ] {
        queue::submit(
            &mut f.doc,
            &Submission {
                id: id.clone(),
                kind: kind.into(),
                submitter: me(),
                submitted_at: 1,
                priority: 0,
                urgent: false,
                max_attempts: None,
                input: None,
                rules: piecework_queue_doc::Rules {
                    requires,
                    ..Default::default()
                },
            },
        )
        .unwrap();
    }
    f.assign(&needs_net, &router(1, "r"), 0);
    f.assign(&other, &router(1, "r"), 1);
    let actions = f.step();
    assert_eq!(starts(&actions), 0);
    let mut why = refusals(&actions);
    why.sort();
    assert_eq!(
        why,
        vec![
            "no handler for kind \"x\" on this node".to_owned(),
            "resource \"net\" is not held on this node".to_owned(),
        ]
    );

    // Restored at 5.1 s: the heartbeat then holds it again, and the task starts.
    let b = beat_at(&mut f, 5_100);
    assert_eq!(b.resources, vec!["net".to_owned()]);
    f.assign(&needs_net, &router(1, "r"), 0);
    assert_eq!(starts(&f.step()), 1);
}

/// Submits task `n` with `timeout_ms` and assigns it to worker 0; its start is the pool's next
/// action.
fn assigned(f: &mut Fixture, n: u32, timeout_ms: u64) -> TaskId {
    queue::claim_router(&mut f.doc, &router(1, "r"), 0).unwrap();
    let t = TaskId::new(format!("automerge:t{n}"));
    queue::submit(
        &mut f.doc,
        &Submission {
            id: t.clone(),
            kind: "k".into(),
            submitter: me(),
            submitted_at: 1,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules: piecework_queue_doc::Rules {
                timeout_ms,
                ..Default::default()
            },
        },
    )
    .unwrap();
    f.assign(&t, &router(1, "r"), 0);
    t
}

/// Starts task `n` (with `timeout_ms`) on worker 0, its handler handed over at `t0`, and
/// returns it.
fn started(f: &mut Fixture, n: u32, timeout_ms: u64) -> TaskId {
    let t = assigned(f, n, timeout_ms);
    assert!(matches!(&f.step()[..], [Action::Start(run)] if run.number == 1));
    f.pool.handle_started(0, f.t0);
    t
}

fn cancels(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Cancel(_)))
        .count()
}

#[test]
fn a_cancelled_run_is_signalled_once_and_its_error_ends_it_cancelled() {
    let mut f = Fixture::new(1, 1);
    let t = started(&mut f, 1, 0);
    assert_eq!(cancels(&f.step()), 0);
    queue::cancel(&mut f.doc, &t, &PeerId::new("m"), 5).unwrap();
    assert_eq!(cancels(&f.step()), 1, "the run is asked to stop");
    assert_eq!(cancels(&f.step()), 0, "once");
    let end = f
        .pool
        .handle_finished(0, RunEnd::Failed("stopped".into()), f.t0);
    assert_eq!(
        end,
        Some((AttemptOutcome::Failed, Some("cancelled: stopped".into())))
    );
    f.apply();
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(
        view.tasks()[&t].state(),
        piecework_queue_doc::TaskState::Cancelled
    );
    // A success after the signal stands.
    let mut g = Fixture::new(1, 1);
    let u = started(&mut g, 2, 0);
    queue::cancel(&mut g.doc, &u, &PeerId::new("m"), 5).unwrap();
    g.step();
    let end = g.pool.handle_finished(0, RunEnd::Succeeded, g.t0);
    assert_eq!(end, Some((AttemptOutcome::Succeeded, None)));
}

#[test]
fn a_handler_that_ignores_the_signal_is_recorded_after_its_grace_and_keeps_its_worker() {
    let mut f = Fixture::new(1, 1);
    f.pool.set_cancel_grace(Duration::from_secs(1));
    let t = started(&mut f, 1, 0);
    queue::cancel(&mut f.doc, &t, &PeerId::new("m"), 5).unwrap();
    assert_eq!(cancels(&f.step()), 1);
    let grace_end = f.t0 + Duration::from_secs(1);
    assert!(f.pool.poll_timeout() <= grace_end);
    f.pool.handle_timeout(grace_end - Duration::from_millis(1));
    assert!(!f.apply().iter().any(|a| matches!(a, Action::Finish { .. })));
    f.pool.handle_timeout(grace_end);
    let actions = f.apply();
    let finish = actions.iter().find_map(|a| match a {
        Action::Finish {
            outcome,
            error,
            overdue,
            ..
        } => Some((*outcome, error.clone(), *overdue)),
        _ => None,
    });
    assert_eq!(
        finish,
        Some((
            AttemptOutcome::Failed,
            Some("cancelled (the handler did not stop within its grace time)".into()),
            true
        ))
    );
    // Its worker stays busy, and its heartbeat says the run is overdue.
    assert_eq!(f.pool.idle(), 0);
    let beat = actions.iter().find_map(|a| match a {
        Action::Beat(b) => Some(b.clone()),
        _ => None,
    });
    let running = beat.unwrap().workers[0].running.clone().unwrap();
    assert!(running.overdue);
    // The handler returns at last: nothing more is recorded, the worker is free.
    assert_eq!(f.pool.handle_finished(0, RunEnd::Succeeded, f.t0), None);
    assert_eq!(f.pool.idle(), 1);
    assert!(
        f.apply()
            .iter()
            .all(|a| !matches!(a, Action::Finish { .. }))
    );
}

#[test]
fn a_run_past_its_timeout_is_asked_to_stop_and_recorded_timed_out() {
    let mut f = Fixture::new(1, 1);
    let t = started(&mut f, 1, 200);
    let at = f.t0 + Duration::from_millis(200);
    assert!(f.pool.poll_timeout() <= at);
    f.pool.handle_timeout(at - Duration::from_millis(1));
    assert_eq!(cancels(&f.apply()), 0);
    f.pool.handle_timeout(at);
    assert_eq!(cancels(&f.apply()), 1);
    // Whatever the handler returns, the run failed: it timed out.
    let end = f.pool.handle_finished(0, RunEnd::Succeeded, f.t0);
    assert_eq!(
        end,
        Some((
            AttemptOutcome::Failed,
            Some("timed out after 200 ms".into())
        ))
    );
    f.apply();
    let view = QueueView::read(&f.doc).unwrap();
    assert_eq!(view.tasks()[&t].failures(), 1);
    assert_eq!(
        view.tasks()[&t].state(),
        piecework_queue_doc::TaskState::Pending
    );
}

/// Fetching a task's input and writing its start take a while (seed 76 of the `lifecycle` mix:
/// a task document read kept failing for 700 ms): a run's timeout runs from its handler's
/// hand-over, never from the start's decision, and a run not handed over is never signalled
/// nor recorded past a grace time.
#[test]
fn a_timeout_runs_from_the_hand_over_of_the_handler() {
    let mut f = Fixture::new(1, 1);
    let t = assigned(&mut f, 1, 200);
    assert!(matches!(&f.step()[..], [Action::Start(_)]));
    // Not handed over yet: a cancel does not signal it, and no time runs out.
    queue::cancel(&mut f.doc, &t, &PeerId::new("m"), 5).unwrap();
    assert_eq!(cancels(&f.step()), 0);
    f.pool.handle_timeout(f.t0 + Duration::from_secs(60));
    assert!(
        f.apply()
            .iter()
            .all(|a| !matches!(a, Action::Cancel(_) | Action::Finish { .. }))
    );
    // Handed over a minute later: its 200 ms run from then.
    let later = f.t0 + Duration::from_secs(60);
    f.pool.handle_started(0, later);
    f.pool.handle_timeout(later + Duration::from_millis(199));
    assert_eq!(cancels(&f.apply()), 0);
    f.pool.handle_timeout(later + Duration::from_millis(200));
    assert_eq!(cancels(&f.apply()), 1);
}

#[test]
fn a_queue_timeout_applies_to_tasks_without_their_own() {
    let mut f = Fixture::new(1, 1);
    queue::set_config(
        &mut f.doc,
        &piecework_queue_doc::ConfigPatch {
            timeout_ms: Some(300),
            ..Default::default()
        },
        1,
    )
    .unwrap();
    started(&mut f, 1, 0);
    f.pool.handle_timeout(f.t0 + Duration::from_millis(299));
    assert_eq!(cancels(&f.apply()), 0);
    f.pool.handle_timeout(f.t0 + Duration::from_millis(300));
    assert_eq!(cancels(&f.apply()), 1);
}

/// Sets the queue's failure policy of kind `k`.
fn set_policy(f: &mut Fixture, policy: piecework_queue_doc::FailurePolicy) {
    queue::set_config(
        &mut f.doc,
        &piecework_queue_doc::ConfigPatch {
            failure_policy: Some([("k".to_owned(), policy)].into()),
            ..Default::default()
        },
        1,
    )
    .unwrap();
}

#[test]
fn an_ignored_kind_is_dead_lettered_at_its_first_failure() {
    let mut f = Fixture::new(1, 1);
    set_policy(&mut f, piecework_queue_doc::FailurePolicy::Ignore);
    let t = started(&mut f, 1, 0);
    let end = f
        .pool
        .handle_finished(0, RunEnd::Failed("logo gone".into()), f.t0);
    assert_eq!(
        end,
        Some((AttemptOutcome::Failed, Some("ignored: logo gone".into())))
    );
    f.apply();
    let view = QueueView::read(&f.doc).unwrap();
    let e = &view.tasks()[&t];
    assert!(e.max_attempts > 1);
    assert_eq!(e.state(), TaskState::Failed, "no retries");
    assert!(e.attempts[0].finished.as_ref().unwrap().ignored());
}

#[test]
fn a_failure_that_pauses_a_resource_withdraws_it_here_and_is_not_counted() {
    let mut f = Fixture::new(1, 1);
    f.pool.add_resource("server".into(), f.t0);
    set_policy(
        &mut f,
        piecework_queue_doc::FailurePolicy::PauseResource {
            resource: "server".into(),
            restore_after_ms: 5_000,
        },
    );
    let t = started(&mut f, 1, 0);
    let end = f
        .pool
        .handle_finished(0, RunEnd::Failed("connection reset".into()), f.t0);
    assert_eq!(
        end,
        Some((
            AttemptOutcome::Failed,
            Some("deferred: resource server paused for 5000 ms: connection reset".into())
        ))
    );
    f.apply();
    // Withdrawn from this pool until the restore time, then held again by itself.
    let (held, withdrawn) = f.pool.resources();
    assert!(!held.contains("server"));
    assert_eq!(
        withdrawn.get("server"),
        Some(&(f.t0 + Duration::from_secs(5)))
    );
    f.pool.handle_timeout(f.t0 + Duration::from_secs(5));
    assert!(f.pool.resources().0.contains("server"));
    // The attempt does not count towards max_attempts: the task is pending, not failed.
    let view = QueueView::read(&f.doc).unwrap();
    let e = &view.tasks()[&t];
    assert_eq!(
        (e.state(), e.failures(), e.refusals()),
        (TaskState::Pending, 0, 1)
    );
}

/// A handler's progress travels with the pool's heartbeats, not as a document change: the next
/// beat reports it for the run, and the run's end forgets it.
#[test]
fn a_runs_progress_goes_out_with_the_next_heartbeat() {
    let mut f = Fixture::new(1, 1);
    started(&mut f, 1, 0);
    let heads = f.doc.get_heads();
    f.pool
        .handle_progress(0, piecework_queue_doc::Progress::count(3, 10));
    assert_eq!(
        f.pool.progress(0),
        Some(piecework_queue_doc::Progress::count(3, 10))
    );
    f.pool.handle_timeout(f.t0 + Duration::from_secs(60));
    let beat = std::iter::from_fn(|| f.pool.poll_action())
        .find_map(|a| match a {
            Action::Beat(b) => Some(b),
            _ => None,
        })
        .expect("a heartbeat is due");
    let running = beat.workers[0].running.clone().unwrap();
    assert_eq!(
        running.progress,
        Some(piecework_queue_doc::Progress::count(3, 10))
    );
    assert_eq!(f.doc.get_heads(), heads, "no document change");
    f.pool.handle_finished(0, RunEnd::Succeeded, f.t0);
    assert_eq!(f.pool.progress(0), None);
}
