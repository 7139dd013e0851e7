//! Routing costs what it routes, not what the queue has seen: the router's work counter (task
//! entries and workers a plan looks at) and the view cache's (task entries re-read per refresh)
//! are the same with 1,000 and 100,000 tasks of history, and with 1,000 and 100,000 tasks
//! pending. No timing: the counters are exact.

use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::Automerge;
use piecework_queue_doc::{
    AttemptOutcome, PeerId, PoolBeat, QueueConfig, QueueId, Submission, TaskId, ViewCache,
    WorkerReport, queue,
};
use piecework_router::{Action, Role, Router};

fn me() -> PeerId {
    PeerId::new("12D3KooWQQBxbWrSXaDyidDrDBf9ZbUT1tasngy2Q3SonNMdWt2W")
}

fn submit(doc: &mut Automerge, i: u64) -> TaskId {
    let id = TaskId::new(format!("automerge:task{i:08}"));
    queue::submit(
        doc,
        &Submission {
            id: id.clone(),
            kind: "k".into(),
            submitter: me(),
            submitted_at: i,
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

/// One router over one replica, driven until it is active.
struct Node {
    doc: Automerge,
    cache: ViewCache,
    router: Router,
    now: Instant,
    beats: u64,
    next: u64,
    /// The kinds this node's pool reports (`None`: any).
    kinds: Option<Vec<String>>,
}

impl Node {
    fn new() -> Self {
        let mut doc = Automerge::new();
        let config = QueueConfig {
            heartbeat_ms: 100,
            takeover_after_ms: 500,
            settle_ms: 100,
            pool_heartbeat_ms: 100,
            lease_ms: 1_000,
            ..QueueConfig::default()
        };
        queue::create(&mut doc, "q", &config, &me(), 0).unwrap();
        // The anchor of virtual time; every instant below is an offset from it.
        #[allow(clippy::disallowed_methods)]
        let now = Instant::now();
        let router = Router::new(QueueId::new("automerge:q"), me(), now);
        Node {
            doc,
            cache: ViewCache::new(),
            router,
            now,
            beats: 0,
            next: 0,
            kinds: None,
        }
    }

    fn refresh(&mut self) {
        let view = Arc::clone(self.cache.refresh(&self.doc).unwrap());
        self.router.handle_view(self.now, view);
    }

    /// Advances time by `ms`, beats this node's pool (four idle workers) and carries out the
    /// router's actions; returns the assignments made.
    fn step(&mut self, ms: u64) -> usize {
        self.now += Duration::from_millis(ms);
        self.beats += 1;
        let beat = PoolBeat {
            peer: me(),
            incarnation: 1,
            counter: self.beats,
            workers: (0..4)
                .map(|index| WorkerReport {
                    index,
                    running: None,
                })
                .collect(),
            epoch: None,
            draining: false,
            kinds: self.kinds.clone(),
            resources: Vec::new(),
        };
        self.router.handle_pool_beat(self.now, &beat);
        self.router.handle_timeout(self.now);
        let mut assigned = 0;
        while let Some(a) = self.router.poll_action() {
            match a {
                Action::Claim(c) => queue::claim_router(&mut self.doc, &c, 0).unwrap(),
                Action::Assign(list) => {
                    assigned += list.len();
                    queue::record_assignments(&mut self.doc, &list, 0).unwrap();
                }
                Action::Beat(_) | Action::Fire(_) => {}
            }
            self.refresh();
        }
        while self.router.poll_event().is_some() {}
        assigned
    }

    /// `n` tasks, each run to success (history), or left pending (live).
    fn fill(&mut self, n: u64, finished: bool) {
        for _ in 0..n {
            let t = submit(&mut self.doc, self.next);
            self.next += 1;
            if finished {
                let worker = piecework_queue_doc::WorkerId::new(me(), 0);
                let attempt = piecework_queue_doc::AttemptId {
                    n: 1,
                    claim: piecework_queue_doc::Claim::new(1, me()),
                };
                let a = piecework_queue_doc::Assignment {
                    task: t.clone(),
                    attempt: attempt.clone(),
                    worker: worker.clone(),
                    incarnation: 1,
                };
                queue::record_assignments(&mut self.doc, &[a], 1).unwrap();
                queue::record_start(&mut self.doc, &t, &attempt, &worker, 1, 2).unwrap();
                queue::record_finish(
                    &mut self.doc,
                    &t,
                    &attempt,
                    &worker,
                    AttemptOutcome::Succeeded,
                    None,
                    3,
                )
                .unwrap();
            }
        }
    }

    fn activate(&mut self) {
        self.refresh();
        for _ in 0..50 {
            if matches!(self.router.role(), Role::Active { .. }) {
                return;
            }
            self.step(100);
        }
        panic!("the router never became active: {:?}", self.router.role());
    }
}

/// What one submit costs to see, and what one plan then visits: (tasks re-read by the cache
/// refresh after the submit, the plan's visits, assignments).
fn costs(history: u64, live: u64) -> (u64, usize, usize) {
    let mut n = Node::new();
    n.fill(history, true);
    n.activate();
    // Finish what activation assigned, so that only the tasks below are pending.
    n.fill(live, false);
    n.refresh();
    let before = n.cache.stats().tasks_reread;
    submit(&mut n.doc, u64::MAX / 2);
    n.refresh();
    let reread = n.cache.stats().tasks_reread - before;
    let assigned = n.step(100);
    (reread, n.router.plan_visits(), assigned)
}

#[test]
fn work_per_submit_and_plan_does_not_grow_with_history() {
    let small = costs(1_000, 10);
    let large = costs(100_000, 10);
    assert_eq!(small.2, 4, "four idle workers, four assignments: {small:?}");
    assert_eq!(small, large, "1k vs 100k tasks of history");
}

#[test]
fn work_per_submit_and_plan_does_not_grow_with_pending_tasks() {
    let small = costs(0, 1_000);
    let large = costs(0, 100_000);
    assert_eq!(small.2, 4, "four idle workers, four assignments: {small:?}");
    assert_eq!(small, large, "1k vs 100k pending tasks");
}

/// What a plan visits with `blocked` tasks waiting on a dependency that never ends and
/// `blocked` more waiting for a not-before time far ahead, beside ten routable ones.
fn costs_blocked(blocked: u64) -> (usize, usize) {
    let mut n = Node::new();
    n.router.handle_clock(n.now, 1_000_000);
    n.activate();
    // An anchor that stays running, so its dependents wait.
    let anchor = submit(&mut n.doc, 0);
    n.next = 1;
    n.refresh();
    n.step(100);
    for i in 0..blocked {
        let rules = |r: piecework_queue_doc::Rules| Submission {
            id: TaskId::new(format!("automerge:blocked{i:08}{}", r.not_before)),
            kind: "k".into(),
            submitter: me(),
            submitted_at: i,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules: r,
        };
        let waiting = rules(piecework_queue_doc::Rules {
            depends_on: vec![anchor.clone()],
            ..Default::default()
        });
        let delayed = rules(piecework_queue_doc::Rules {
            not_before: u64::MAX / 2,
            ..Default::default()
        });
        queue::submit_many(&mut n.doc, &[waiting, delayed]).unwrap();
    }
    n.fill(10, false);
    n.refresh();
    let assigned = n.step(100);
    (n.router.plan_visits(), assigned)
}

#[test]
fn tasks_waiting_on_dependencies_or_a_time_cost_a_plan_nothing() {
    let small = costs_blocked(1_000);
    let large = costs_blocked(100_000);
    assert_eq!(
        small.1, 3,
        "three idle workers beside the anchor's: {small:?}"
    );
    assert_eq!(small, large, "1k vs 100k blocked tasks");
}

/// What a plan visits with `unrunnable` pending tasks of a kind no pool runs and as many that
/// require a resource no pool holds, beside ten routable ones: (visits, assignments).
fn costs_unrunnable(unrunnable: u64) -> (usize, usize) {
    let mut n = Node::new();
    n.kinds = Some(vec!["k".into()]);
    n.activate();
    for i in 0..unrunnable {
        let entry = |kind: &str, requires: Vec<String>| Submission {
            id: TaskId::new(format!("automerge:unrunnable{i:08}{kind}")),
            kind: kind.into(),
            submitter: me(),
            // Before the routable ones, so a kind-blind plan would visit them first.
            submitted_at: 0,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules: piecework_queue_doc::Rules {
                requires,
                ..Default::default()
            },
        };
        queue::submit_many(
            &mut n.doc,
            &[entry("other", vec![]), entry("k", vec!["gpu".into()])],
        )
        .unwrap();
    }
    n.next = 1;
    n.fill(10, false);
    n.refresh();
    let assigned = n.step(100);
    (n.router.plan_visits(), assigned)
}

#[test]
fn tasks_no_pool_can_run_cost_a_plan_nothing() {
    let small = costs_unrunnable(1_000);
    let large = costs_unrunnable(100_000);
    assert_eq!(
        small.1, 4,
        "the four idle workers get routable tasks: {small:?}"
    );
    assert_eq!(small, large, "1k vs 100k unrunnable tasks");
}
