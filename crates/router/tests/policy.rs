//! The routing policy's rules, one story each, with explicit instants over a real queue
//! document: the concurrency limit, the rate interval, the retry and refusal backoffs, the
//! routing order (urgent, priority, submit time, FIFO or LIFO), and a run that outlived its
//! task's outcome, and a schedule's slots. One router (already active) and one pool of four
//! workers on another peer; the story writes what the workers do into the document.

use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::Automerge;
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, Every, Firing, Order, PeerId, PoolBeat,
    QueueConfig, QueueId, QueueView, RunningReport, Submission, TaskId, WorkerId, WorkerReport,
    queue,
};
use piecework_router::{Action, Router};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn router_peer() -> PeerId {
    PeerId::new("router")
}

fn pool_peer() -> PeerId {
    PeerId::new("pool")
}

/// A router, active, over one queue document, and the pool it routes to.
struct Lone {
    doc: Automerge,
    router: Router,
    t0: Instant,
    /// The time reached.
    at: u64,
    pool_counter: u64,
    /// What each of the pool's four workers runs (the pool's heartbeats report it).
    running: [Option<(TaskId, AttemptId)>; 4],
    /// Every assignment made, in order.
    assigned: Vec<Assignment>,
    next_task: u64,
    /// The kinds the pool's heartbeats report (`None`: any).
    kinds: Option<Vec<String>>,
    /// The resources the pool's heartbeats report.
    resources: Vec<String>,
    /// The kind of the tasks [`Lone::submit_with`] submits.
    kind: String,
    /// Every schedule slot fired, in order.
    fired: Vec<Firing>,
}

impl Lone {
    /// An active router over a queue with `config` (its timings are the test's own: router
    /// heartbeat 100 ms, pool heartbeat 100 ms, lease 1 s).
    fn new(config: QueueConfig) -> Self {
        let config = QueueConfig {
            heartbeat_ms: 100,
            takeover_after_ms: 500,
            settle_ms: 100,
            pool_heartbeat_ms: 100,
            lease_ms: 1_000,
            ..config
        };
        config
            .validate()
            .expect("the story's configuration is valid");
        let mut doc = Automerge::new();
        queue::create(&mut doc, "q", &config, &router_peer(), 0).unwrap();
        queue::set_member(&mut doc, &pool_peer(), &[], 0).unwrap();
        // The anchor of virtual time; every instant below is an offset from it.
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let router = Router::new(QueueId::new("automerge:q"), router_peer(), t0);
        let mut l = Lone {
            doc,
            router,
            t0,
            at: 0,
            pool_counter: 0,
            running: Default::default(),
            assigned: vec![],
            next_task: 0,
            kinds: None,
            resources: Vec::new(),
            kind: "k".into(),
            fired: vec![],
        };
        l.view();
        // No router is named: it claims at once, rechecks a settle later, and routes a pool
        // heartbeat after that.
        l.to(0);
        l.to(100);
        assert!(l.router.is_active(), "{:?}", l.router.role());
        l
    }

    fn view(&mut self) {
        let v = Arc::new(QueueView::read(&self.doc).unwrap());
        self.router.handle_view(self.t0 + ms(self.at), v);
    }

    /// Submits a task: `(priority, urgent)`, at submit time `at` (unix ms).
    fn submit(&mut self, priority: i64, urgent: bool, at: u64) -> TaskId {
        self.submit_with(priority, urgent, at, Default::default())
    }

    /// [`Lone::submit`], with tags, a not-before time or dependencies.
    fn submit_with(
        &mut self,
        priority: i64,
        urgent: bool,
        at: u64,
        rules: piecework_queue_doc::Rules,
    ) -> TaskId {
        self.next_task += 1;
        let id = TaskId::new(format!("automerge:task{:04}", self.next_task));
        queue::submit(
            &mut self.doc,
            &Submission {
                id: id.clone(),
                kind: self.kind.clone(),
                submitter: router_peer(),
                submitted_at: at,
                priority,
                urgent,
                max_attempts: None,
                input: None,
                rules,
            },
        )
        .unwrap();
        self.view();
        id
    }

    /// Moves to `at` ms: the pool beats (reporting what its workers run), then the router's
    /// timers fire; its actions are carried out. Returns the assignments made then.
    fn to(&mut self, at: u64) -> Vec<Assignment> {
        let workers = self.reports();
        self.advance_reporting(at, workers)
    }

    /// What the pool's four workers run, as its heartbeat reports it.
    fn reports(&self) -> Vec<WorkerReport> {
        (0..4u32)
            .map(|index| WorkerReport {
                index,
                running: self.running[index as usize]
                    .as_ref()
                    .map(|(task, attempt)| RunningReport {
                        queue: QueueId::new("automerge:q"),
                        task: task.clone(),
                        attempt: attempt.clone(),
                        overdue: false,
                        progress: None,
                    }),
            })
            .collect()
    }

    /// [`Lone::to`], with the pool's heartbeat listing `workers`.
    fn advance_reporting(&mut self, at: u64, workers: Vec<WorkerReport>) -> Vec<Assignment> {
        self.at = at;
        let now = self.t0 + ms(at);
        self.pool_counter += 1;
        let beat = PoolBeat {
            peer: pool_peer(),
            incarnation: 1,
            counter: self.pool_counter,
            workers,
            epoch: None,
            draining: false,
            kinds: self.kinds.clone(),
            resources: self.resources.clone(),
        };
        self.router.handle_pool_beat(now, &beat);
        self.router.handle_timeout(now);
        let mut made = vec![];
        while let Some(a) = self.router.poll_action() {
            match a {
                Action::Claim(c) => queue::claim_router(&mut self.doc, &c, at).unwrap(),
                Action::Assign(list) => {
                    queue::record_assignments(&mut self.doc, &list, at).unwrap();
                    made.extend(list);
                }
                Action::Beat(_) => {}
                Action::Fire(firings) => {
                    let subs: Vec<Submission> = firings
                        .iter()
                        .map(|f| {
                            self.next_task += 1;
                            Submission {
                                id: TaskId::new(format!("automerge:task{:04}", self.next_task)),
                                kind: self.kind.clone(),
                                submitter: router_peer(),
                                submitted_at: at,
                                priority: 0,
                                urgent: false,
                                max_attempts: None,
                                input: None,
                                rules: piecework_queue_doc::Rules {
                                    dedup_key: Some(f.dedup_key()),
                                    ..Default::default()
                                },
                            }
                        })
                        .collect();
                    queue::submit_fired(&mut self.doc, &subs, &[], &[], &firings, at).unwrap();
                    self.fired.extend(firings);
                }
            }
            self.view();
        }
        self.assigned.extend(made.clone());
        made
    }

    /// The assignment's worker starts it.
    fn start(&mut self, a: &Assignment) {
        queue::record_start(&mut self.doc, &a.task, &a.attempt, &a.worker, 1, self.at).unwrap();
        self.running[a.worker.index as usize] = Some((a.task.clone(), a.attempt.clone()));
        self.view();
    }

    /// The assignment ends with `outcome` (started first unless it is a refusal).
    fn end(&mut self, a: &Assignment, outcome: AttemptOutcome) {
        if outcome != AttemptOutcome::Refused
            && self.running[a.worker.index as usize].as_ref().map(|r| &r.1) != Some(&a.attempt)
        {
            self.start(a);
        }
        let error = (outcome != AttemptOutcome::Succeeded).then_some("no");
        queue::record_finish(
            &mut self.doc,
            &a.task,
            &a.attempt,
            &a.worker,
            outcome,
            error,
            self.at,
        )
        .unwrap();
        if self.running[a.worker.index as usize].as_ref().map(|r| &r.1) == Some(&a.attempt) {
            self.running[a.worker.index as usize] = None;
        }
        self.view();
    }
}

/// The concurrency limit caps the tasks assigned or running at once: with a limit of 2, four
/// idle workers and five tasks, two are assigned; one more for each that ends.
#[test]
fn the_concurrency_limit_caps_what_is_in_flight() {
    let mut l = Lone::new(QueueConfig {
        concurrency: 2,
        ..QueueConfig::default()
    });
    for i in 0..5 {
        l.submit(0, false, i);
    }
    let first = l.to(200);
    assert_eq!(first.len(), 2, "{first:?}");
    for a in &first {
        l.start(a);
    }
    assert!(l.to(300).is_empty(), "both slots are taken");
    l.end(&first[0], AttemptOutcome::Succeeded);
    assert_eq!(l.to(400).len(), 1, "one slot freed, one assignment");
    assert!(l.to(500).is_empty());
}

/// A rate interval allows one assignment per interval, on the router's clock, whatever the
/// idle workers: with 1 s, the second comes a second after the first.
#[test]
fn a_rate_interval_allows_one_assignment_per_interval() {
    let mut l = Lone::new(QueueConfig {
        rate_interval_ms: 1_000,
        ..QueueConfig::default()
    });
    for i in 0..3 {
        l.submit(0, false, i);
    }
    // The pool beats every 100 ms; the first route waits the rate interval after the router
    // became active (at 100 ms).
    let mut when = vec![];
    for at in (200..=2_200).step_by(100) {
        for a in l.to(at) {
            when.push(at);
            l.end(&a, AttemptOutcome::Succeeded);
        }
    }
    assert_eq!(when, [1_100, 2_100], "one assignment per second");
}

/// A failed task waits `retry_backoff_ms × 2^(failures − 1)`, capped at
/// `retry_backoff_max_ms`, with jitter over its upper half, from when the router first saw the
/// failure.
#[test]
fn a_failed_task_waits_its_backoff_doubled_per_failure_up_to_the_cap() {
    let config = QueueConfig {
        retry_backoff_ms: 200,
        retry_backoff_max_ms: 500,
        max_attempts: 10,
        ..QueueConfig::default()
    };
    let mut l = Lone::new(config.clone());
    l.submit(0, false, 0);
    let mut at = 200;
    let mut a = l.to(at).pop().expect("routed");
    for (failures, cap) in [(1, 200), (2, 400), (3, 500), (4, 500)] {
        let wait = config.retry_delay_jittered_ms(failures, &a.task, a.attempt.n);
        assert!(
            (cap / 2..=cap).contains(&wait),
            "{wait} within the upper half of {cap}"
        );
        l.end(&a, AttemptOutcome::Failed);
        // The router sees the failure at `at`.
        assert!(l.to(at).is_empty());
        assert!(l.to(at + wait - 1).is_empty(), "before {wait} ms");
        a = l
            .to(at + wait)
            .pop()
            .unwrap_or_else(|| panic!("routed after {wait} ms"));
        at += wait;
    }
}

/// A refused attempt (a worker that could not take it) waits 50 ms, doubled per refusal in a
/// row: a task no worker can run does not spin.
#[test]
fn a_refused_task_waits_the_refusal_backoff_doubled_per_refusal() {
    let mut l = Lone::new(QueueConfig::default());
    l.submit(0, false, 0);
    let mut at = 200;
    let mut a = l.to(at).pop().expect("routed");
    for wait in [50, 100, 200] {
        l.end(&a, AttemptOutcome::Refused);
        assert!(l.to(at).is_empty());
        assert!(l.to(at + wait - 1).is_empty(), "before {wait} ms");
        a = l
            .to(at + wait)
            .pop()
            .unwrap_or_else(|| panic!("routed after {wait} ms"));
        at += wait;
    }
    // Refusals do not count as failures: the task is still pending, never dead-lettered.
    l.end(&a, AttemptOutcome::Refused);
    let v = QueueView::read(&l.doc).unwrap();
    assert!(!v.tasks()[&a.task].state().is_final());
}

/// Tasks go out urgent first, then by priority, then by submit time: oldest first in a FIFO
/// queue, newest first in a LIFO one.
#[test]
fn urgent_then_priority_then_submit_time_in_the_queues_order() {
    for order in [Order::Fifo, Order::Lifo] {
        let mut l = Lone::new(QueueConfig {
            concurrency: 1,
            order,
            ..QueueConfig::default()
        });
        let low_old = l.submit(0, false, 1);
        let high_old = l.submit(5, false, 2);
        let urgent = l.submit(-3, true, 3);
        let high_new = l.submit(5, false, 4);
        let low_new = l.submit(0, false, 5);
        let mut seen = vec![];
        let mut at = 200;
        while seen.len() < 5 {
            let a = l.to(at).pop().expect("one at a time");
            seen.push(a.task.clone());
            l.end(&a, AttemptOutcome::Succeeded);
            at += 100;
        }
        let want = match order {
            Order::Fifo => vec![urgent, high_old, high_new, low_old, low_new],
            Order::Lifo => vec![urgent, high_new, high_old, low_new, low_old],
        };
        assert_eq!(seen, want, "{order:?}");
    }
}

/// A task with a not-before time goes out once the router's wall clock (told at one instant,
/// advanced by its monotonic clock) reaches it, not before, ahead of later-ordered tasks
/// then; a dependent goes out only after its dependency's success is in the document.
#[test]
fn a_delayed_task_waits_for_the_routers_clock_and_a_dependent_for_its_dependency() {
    let mut l = Lone::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    // The wall clock reads 1,000,000 ms at the story's 0.
    l.router.handle_clock(l.t0, 1_000_000);
    let delayed = l.submit_with(
        5,
        false,
        1,
        piecework_queue_doc::Rules {
            not_before: 1_000_500,
            ..Default::default()
        },
    );
    let first = l.submit(0, false, 2);
    let dependent = l.submit_with(
        9,
        false,
        3,
        piecework_queue_doc::Rules {
            depends_on: vec![first.clone()],
            ..Default::default()
        },
    );
    let a = l.to(200).pop().expect("routed");
    assert_eq!(
        a.task, first,
        "the delayed task is not due, the dependent waits"
    );
    l.end(&a, AttemptOutcome::Succeeded);
    // The dependency succeeded: its dependent (priority 9) goes before the delayed one, which
    // is still not due.
    let b = l.to(300).pop().expect("routed");
    assert_eq!(b.task, dependent);
    l.end(&b, AttemptOutcome::Succeeded);
    assert!(l.to(400).is_empty(), "not due at 400 ms");
    assert!(l.to(499).is_empty(), "not due at 499 ms");
    let c = l.to(500).pop().expect("due at 500 ms");
    assert_eq!(c.task, delayed);
}

/// A pause in the queue document stops every assignment until a resume; a change of the
/// configuration written at run time (here the concurrency limit, then the order) applies
/// from the next view on.
#[test]
fn a_pause_and_a_config_change_at_run_time_apply_from_the_next_view() {
    let mut l = Lone::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    queue::set_paused(&mut l.doc, true, 100).unwrap();
    l.view();
    let first = l.submit(0, false, 1);
    let second = l.submit(0, false, 2);
    for at in (200..2_000).step_by(100) {
        assert!(l.to(at).is_empty(), "an assignment while paused at {at} ms");
    }
    queue::set_paused(&mut l.doc, false, 2_000).unwrap();
    l.view();
    let a = l.to(2_000);
    assert_eq!(a.iter().map(|a| &a.task).collect::<Vec<_>>(), [&first]);
    // One in flight, the limit reached: nothing more until the limit rises.
    assert!(l.to(2_100).is_empty());
    queue::set_config(
        &mut l.doc,
        &piecework_queue_doc::ConfigPatch {
            concurrency: Some(2),
            order: Some(Order::Lifo),
            ..Default::default()
        },
        2_150,
    )
    .unwrap();
    l.view();
    let third = l.submit(0, false, 3);
    // Two may run now, and the queue is a stack: the newest pending task goes first.
    let b = l.to(2_200);
    assert_eq!(b.iter().map(|a| &a.task).collect::<Vec<_>>(), [&third]);
    l.end(&a[0], AttemptOutcome::Succeeded);
    let c = l.to(2_300);
    assert_eq!(c.iter().map(|a| &a.task).collect::<Vec<_>>(), [&second]);
}

/// A run that outlived its task's outcome (routers on both sides of a partition both ran the
/// task, and the other's run succeeded first) still holds its worker: it counts against the
/// concurrency limit until it ends, or until its pool is silent for the lease.
#[test]
fn a_run_that_outlived_its_tasks_outcome_counts_against_the_limit() {
    let mut l = Lone::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    let first = l.submit(0, false, 1);
    let second = l.submit(0, false, 2);
    let mine = l.to(200).pop().expect("routed");
    assert_eq!(mine.task, first);
    l.start(&mine);
    // Another router's run of the same task, on another worker, succeeded meanwhile.
    let other = Assignment {
        task: first.clone(),
        attempt: AttemptId {
            n: mine.attempt.n,
            claim: Claim::new(0, PeerId::new("other")),
        },
        worker: WorkerId::new(pool_peer(), 3),
        incarnation: 1,
    };
    queue::record_assignments(&mut l.doc, std::slice::from_ref(&other), 250).unwrap();
    l.end(&other, AttemptOutcome::Succeeded);
    let v = QueueView::read(&l.doc).unwrap();
    assert!(v.tasks()[&first].state().is_final());
    // The task has its outcome, but this router's run goes on: nothing else is routed.
    for at in [300, 400, 500] {
        assert!(
            l.to(at).is_empty(),
            "a second run beside the first at {at} ms"
        );
    }
    // It ends: the second task goes out.
    l.end(&mine, AttemptOutcome::Succeeded);
    let next = l.to(600);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].task, second);
}

/// A pool heartbeat that lists one idle worker a thousand times gets it one assignment, not a
/// thousand: a worker is counted once, whatever its pool's beat says.
#[test]
fn a_pool_beat_that_lists_one_worker_a_thousand_times_gets_one_assignment() {
    let mut l = Lone::new(QueueConfig::default());
    for at in 0..10 {
        l.submit(0, false, at);
    }
    let one = WorkerReport {
        index: 0,
        running: None,
    };
    let made = l.advance_reporting(200, vec![one; 1_000]);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].worker.index, 0);
}

/// The routing order against a reference model (plain lists, sorted), across replicas.
mod model {
    use std::collections::{BTreeMap, BTreeSet};

    use automerge::ActorId;
    use piecework_queue_doc::{Bump, Rules, TaskState};
    use proptest::prelude::*;

    use super::*;

    const TAGS: [&str; 3] = ["a", "b", "c"];
    const KEYS: [&str; 2] = ["k1", "k2"];

    #[derive(Clone, Debug)]
    enum Op {
        /// On replica `r`: a submit with `(priority, urgent, tags, dependencies, dedup key)`
        /// (indexes into `TAGS`, the tasks submitted so far and `KEYS`). With a key that a
        /// pending task of the replica's view holds, it bumps that task instead, as a node does.
        Submit(usize, i64, bool, Vec<usize>, Vec<usize>, Option<usize>),
        /// On replica `r`: tag `TAGS[i]` gets a boost.
        Boost(usize, usize, i64),
        /// On replica `r`: a router assigns a task it sees routable, and it succeeds or fails.
        Run(usize, usize, bool),
        /// Replica `a` receives what `b` has.
        Merge(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let r = 0..3usize;
        prop_oneof![
            5 => (
                r.clone(),
                prop_oneof![(-5i64..=5), Just(99_999), Just(-99_999)],
                proptest::bool::weighted(0.15),
                proptest::collection::vec(0..TAGS.len(), 0..3),
                proptest::collection::vec(0..64usize, 0..3),
                proptest::option::weighted(0.4, 0..KEYS.len()),
            )
                .prop_map(|(r, p, u, t, d, k)| Op::Submit(r, p, u, t, d, k)),
            2 => (r.clone(), 0..TAGS.len(), prop_oneof![Just(0i64), -2i64..=2, Just(1_000_000)])
                .prop_map(|(r, t, b)| Op::Boost(r, t, b)),
            2 => (r.clone(), 0..64usize, proptest::bool::weighted(0.8))
                .prop_map(|(r, t, ok)| Op::Run(r, t, ok)),
            2 => (r.clone(), r).prop_map(|(a, b)| Op::Merge(a, b)),
        ]
    }

    /// A task as the model keeps it.
    #[derive(Clone, Debug)]
    struct M {
        id: TaskId,
        at: u64,
        priority: i64,
        urgent: bool,
        tags: BTreeSet<String>,
        deps: Vec<TaskId>,
        key: Option<String>,
        /// The tasks of its key the submitter saw when it made this one.
        after: BTreeSet<TaskId>,
        /// Merged bumps: (latest time, greatest priority, any urgent).
        bump: Option<(u64, i64, bool)>,
        started: bool,
        succeeded: bool,
        failed: bool,
    }

    impl M {
        fn priority(&self) -> i64 {
            self.bump.map_or(self.priority, |b| self.priority.max(b.1))
        }
        fn urgent(&self) -> bool {
            self.urgent || self.bump.is_some_and(|b| b.2)
        }
        fn bumped(&self) -> u64 {
            self.bump.map_or(0, |b| b.0)
        }
    }

    struct Model {
        tasks: BTreeMap<TaskId, M>,
        /// Tag → (time of the write, boost): the latest write wins.
        boosts: BTreeMap<String, (u64, i64)>,
        order: Order,
    }

    impl Model {
        /// The copy a task is a duplicate of: its key's tasks taken started first, then by
        /// id; each survives unless a surviving copy (neither made knowing of the other) came
        /// before it.
        fn duplicate_of(&self, id: &TaskId) -> Option<TaskId> {
            let t = &self.tasks[id];
            let key = t.key.as_ref()?;
            let mut group: Vec<&M> = self
                .tasks
                .values()
                .filter(|m| m.key.as_ref() == Some(key))
                .collect();
            group.sort_by_key(|m| (!m.started, m.id.clone()));
            let mut survivors: Vec<&M> = vec![];
            for m in group {
                let beaten = survivors
                    .iter()
                    .find(|s| !s.after.contains(&m.id) && !m.after.contains(&s.id))
                    .map(|s| s.id.clone());
                if m.id == *id {
                    return beaten.filter(|_| !m.started);
                }
                if beaten.is_none() || m.started {
                    survivors.push(m);
                }
            }
            None
        }

        /// A dependency stands for its survivor.
        fn resolve(&self, id: &TaskId) -> TaskId {
            self.duplicate_of(id).unwrap_or_else(|| id.clone())
        }

        fn state(&self, id: &TaskId) -> TaskState {
            let t = &self.tasks[id];
            if t.succeeded {
                return TaskState::Succeeded;
            }
            if self.duplicate_of(id).is_some() {
                return TaskState::Cancelled;
            }
            let dep_ended = t.deps.iter().any(|d| {
                matches!(
                    self.state(&self.resolve(d)),
                    TaskState::Failed | TaskState::Cancelled
                )
            });
            match (dep_ended, t.failed) {
                (true, _) => TaskState::Cancelled,
                (false, true) => TaskState::Failed,
                (false, false) => TaskState::Pending,
            }
        }

        /// The pending tasks whose dependencies all succeeded, in the order the queue's rules
        /// give, written out plainly: urgent, boost sum, priority, bump (FIFO: bumped first,
        /// latest first; LIFO: a bump is a push), submit time, id.
        fn routable(&self) -> Vec<TaskId> {
            let boost = |t: &M| -> i64 {
                t.tags
                    .iter()
                    .map(|g| self.boosts.get(g).map_or(0, |b| b.1))
                    .sum()
            };
            let mut list: Vec<&M> = self
                .tasks
                .values()
                .filter(|t| self.state(&t.id) == TaskState::Pending)
                .filter(|t| {
                    t.deps
                        .iter()
                        .all(|d| self.state(&self.resolve(d)) == TaskState::Succeeded)
                })
                .collect();
            list.sort_by(|a, b| {
                b.urgent()
                    .cmp(&a.urgent())
                    .then(boost(b).cmp(&boost(a)))
                    .then(b.priority().cmp(&a.priority()))
                    .then(match self.order {
                        Order::Fifo => b.bumped().cmp(&a.bumped()).then(a.at.cmp(&b.at)),
                        Order::Lifo => b.at.max(b.bumped()).cmp(&a.at.max(a.bumped())),
                    })
                    .then(a.id.cmp(&b.id))
            });
            list.into_iter().map(|t| t.id.clone()).collect()
        }
    }

    /// A run of a task on replica `doc`, as attempt `n` of router `r`.
    fn run(doc: &mut Automerge, task: &TaskId, n: u64, r: usize, ok: bool, at: u64) {
        let a = Assignment {
            task: task.clone(),
            attempt: AttemptId {
                n,
                claim: Claim::new(1, PeerId::new(format!("r{r}"))),
            },
            worker: WorkerId::new(pool_peer(), 0),
            incarnation: 1,
        };
        queue::record_assignments(doc, std::slice::from_ref(&a), at).unwrap();
        queue::record_start(doc, task, &a.attempt, &a.worker, 1, at).unwrap();
        let (outcome, error) = match ok {
            true => (AttemptOutcome::Succeeded, None),
            false => (AttemptOutcome::Failed, Some("no")),
        };
        queue::record_finish(doc, task, &a.attempt, &a.worker, outcome, error, at).unwrap();
    }

    proptest! {
        #![proptest_config(piecework_proptest_config::config(64))]

        /// Submits with tags, priorities, urgency, dependencies and dedup keys (a re-submit of
        /// a key bumps its pending task, as a node does), boost changes, runs and merges on
        /// three replicas: once merged, the view's pending tasks and every task's state are the
        /// model's, and one effective router hands the tasks out (one at a time, each
        /// succeeding, which releases its dependents) in the model's order.
        #[test]
        fn the_routing_order_is_the_models(
            ops in proptest::collection::vec(op(), 1..40),
            lifo in any::<bool>(),
        ) {
            let order = if lifo { Order::Lifo } else { Order::Fifo };
            let mut l = Lone::new(QueueConfig {
                concurrency: 1,
                order,
                max_attempts: 1,
                ..QueueConfig::default()
            });
            let mut docs: Vec<Automerge> = (0..3u8)
                .map(|i| l.doc.fork().with_actor(ActorId::from(vec![i + 1; 16])))
                .collect();
            let mut model = Model { tasks: BTreeMap::new(), boosts: BTreeMap::new(), order };
            let mut ids: Vec<TaskId> = vec![];
            for (i, op) in ops.into_iter().enumerate() {
                let t = 1_000 + i as u64;
                match op {
                    Op::Submit(r, priority, urgent, tags, deps, key) => {
                        let view = QueueView::read(&docs[r]).unwrap();
                        let key = key.map(|k| KEYS[k].to_owned());
                        if let Some(target) = key.as_deref().and_then(|k| view.dedup_target(k)) {
                            // A re-submit: the pending task is bumped.
                            let b = Bump {
                                t,
                                p: target.priority_now().max(priority),
                                u: target.urgent_now() || urgent,
                            };
                            let id = target.id.clone();
                            queue::submit_and_bump(&mut docs[r], &[], &[(id.clone(), b)]).unwrap();
                            let m = model.tasks.get_mut(&id).unwrap();
                            m.bump = Some(match m.bump {
                                Some((bt, bp, bu)) => (bt.max(b.t), bp.max(b.p), bu || b.u),
                                None => (b.t, b.p, b.u),
                            });
                            continue;
                        }
                        let id = TaskId::new(format!("automerge:t{i:03}"));
                        // Dependencies this replica knows (a submit names existing tasks).
                        let deps: Vec<TaskId> = deps
                            .iter()
                            .filter_map(|d| ids.get(*d))
                            .filter(|d| view.task(d).is_some())
                            .cloned()
                            .collect::<BTreeSet<_>>()
                            .into_iter()
                            .collect();
                        let tags: BTreeSet<String> =
                            tags.iter().map(|g| TAGS[*g].to_owned()).collect();
                        let after: BTreeSet<TaskId> = key
                            .as_deref()
                            .map(|k| view.with_dedup_key(k).iter().map(|e| e.id.clone()).collect())
                            .unwrap_or_default();
                        // Ties of submit time happen: two ops share one.
                        let at = t / 2;
                        queue::submit(&mut docs[r], &Submission {
                            id: id.clone(),
                            kind: "k".into(),
                            submitter: router_peer(),
                            submitted_at: at,
                            priority,
                            urgent,
                            max_attempts: None,
                            input: None,
                            rules: Rules {
                                tags: tags.iter().cloned().collect(),
                                depends_on: deps.clone(),
                                dedup_key: key.clone(),
                                dedup_after: after.iter().cloned().collect(),
                                ..Rules::default()
                            },
                        }).unwrap();
                        model.tasks.insert(id.clone(), M {
                            id: id.clone(), at, priority, urgent, tags, deps, key, after,
                            bump: None, started: false, succeeded: false, failed: false,
                        });
                        ids.push(id);
                    }
                    Op::Boost(r, tag, b) => {
                        queue::set_boost(&mut docs[r], TAGS[tag], b, t).unwrap();
                        model.boosts.insert(TAGS[tag].to_owned(), (t, b));
                    }
                    Op::Run(r, task, ok) => {
                        let Some(id) = ids.get(task) else { continue };
                        let view = QueueView::read(&docs[r]).unwrap();
                        if !view.routable().any(|e| &e.id == id) {
                            continue;
                        }
                        run(&mut docs[r], id, t, r, ok, t);
                        let m = model.tasks.get_mut(id).unwrap();
                        m.started = true;
                        match ok {
                            true => m.succeeded = true,
                            false => m.failed = true,
                        }
                    }
                    Op::Merge(a, b) if a != b => {
                        let mut other = docs[b].clone();
                        docs[a].merge(&mut other).unwrap();
                    }
                    Op::Merge(..) => {}
                }
            }
            for d in &mut docs {
                l.doc.merge(d).unwrap();
            }
            l.view();
            let view = QueueView::read(&l.doc).unwrap();
            for id in model.tasks.keys() {
                prop_assert_eq!(view.tasks()[id].state(), model.state(id), "{}", id);
            }
            let want = model.routable();
            let got: Vec<TaskId> = view.pending().iter().map(|t| t.id.clone()).collect();
            prop_assert_eq!(&got, &want, "the view's order");
            // One router hands them out, one at a time; each success may release dependents.
            let mut at = l.at + 100;
            let mut handed = vec![];
            loop {
                let want = model.routable();
                let made = l.to(at);
                prop_assert!(made.len() <= 1);
                let Some(a) = made.first() else {
                    prop_assert!(want.is_empty(), "nothing handed out, the model has {:?}", want);
                    break;
                };
                prop_assert_eq!(Some(&a.task), want.first(), "after {:?}", handed);
                handed.push(a.task.clone());
                l.end(a, AttemptOutcome::Succeeded);
                let m = model.tasks.get_mut(&a.task).unwrap();
                m.started = true;
                m.succeeded = true;
                at += 100;
            }
        }
    }
}

/// A task goes only to a pool whose heartbeat names its kind and every resource it requires;
/// tasks no pool can run wait (the router says what they lack) without holding back the
/// tasks behind them, and are routed once a heartbeat brings what they need.
#[test]
fn tasks_go_only_to_pools_with_their_kind_and_resources() {
    let mut l = Lone::new(QueueConfig::default());
    l.kinds = Some(vec!["a".into()]);
    l.resources = vec!["net".into()];
    let requiring = |r: &[&str]| piecework_queue_doc::Rules {
        requires: r.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    l.kind = "b".into();
    let other_kind = l.submit(0, true, 1);
    l.kind = "a".into();
    let needs_gpu = l.submit_with(0, true, 2, requiring(&["gpu", "net"]));
    let needs_net = l.submit_with(0, false, 3, requiring(&["net"]));
    let plain = l.submit(0, false, 4);
    let first: Vec<TaskId> = l.to(200).into_iter().map(|a| a.task).collect();
    assert_eq!(first, vec![needs_net.clone(), plain.clone()]);
    let now = l.t0 + ms(l.at);
    let lack = |l: &Lone, id: &TaskId| {
        let view = l.router.view().unwrap().clone();
        l.router.lack(now, view.task(id).unwrap())
    };
    assert_eq!(
        lack(&l, &other_kind),
        Some(piecework_queue_doc::Lack::Kind("b".into()))
    );
    assert_eq!(
        lack(&l, &needs_gpu),
        Some(piecework_queue_doc::Lack::Resources(vec!["gpu".into()]))
    );
    assert_eq!(lack(&l, &plain), None);
    assert!(l.to(300).is_empty(), "nothing else can run here");
    // The pool gains the resource: its next heartbeat brings the task its worker.
    l.resources.push("gpu".into());
    l.resources.sort();
    let next: Vec<TaskId> = l.to(400).into_iter().map(|a| a.task).collect();
    assert_eq!(next, vec![needs_gpu]);
    assert!(l.to(500).is_empty(), "no pool runs kind b");
}

/// The active router fires each slot of a schedule once, when its wall clock reaches it, and
/// records it with the task in one change; it asks to be woken at the next slot. Slots that
/// fell due more than one interval ago (the router was not running) are skipped and counted,
/// and a paused schedule fires nothing.
#[test]
fn the_active_router_fires_each_slot_once_and_skips_what_is_more_than_an_interval_late() {
    let mut l = Lone::new(QueueConfig::default());
    // The wall clock reads 1,000,000 ms at the story's 0.
    l.router.handle_clock(l.t0, 1_000_000);
    queue::put_schedule(
        &mut l.doc,
        "tick",
        Every::Ms(1_000),
        "{}".into(),
        false,
        1_000_150,
    )
    .unwrap();
    l.view();
    l.to(200);
    assert!(l.fired.is_empty(), "nothing is due before 1,001,000");
    assert!(l.router.poll_timeout().unwrap() <= l.t0 + ms(1_000));
    l.to(999);
    assert!(l.fired.is_empty());
    l.to(1_000);
    l.to(1_500);
    l.to(1_999);
    let slots: Vec<(u64, u64)> = l.fired.iter().map(|f| (f.slot, f.missed)).collect();
    assert_eq!(slots, vec![(1_001_000, 0)], "fired once");
    let view = QueueView::read(&l.doc).unwrap();
    let task = view.with_dedup_key("schedule/tick/1001000");
    assert_eq!(task.len(), 1, "the slot's task is in the document");
    assert_eq!(view.schedules["tick"].slot.l, 1_001_000);
    l.to(2_000);
    assert_eq!(l.fired.last().map(|f| f.slot), Some(1_002_000));
    // The router was not running from 2.0 s to 5.8 s: 3,000 and 4,000 are skipped and
    // counted, 5,000 fires.
    // (Hearing the pool again after that silence, the router holds for heartbeat + settle
    // before it acts, as after a partition.)
    l.to(5_600);
    assert_eq!(l.fired.len(), 2);
    l.to(5_800);
    let last = l.fired.last().unwrap();
    assert_eq!((last.slot, last.missed), (1_005_000, 2));
    assert_eq!(l.fired.len(), 3);
    // Paused: no slot fires; resumed at 8.5 s, the next fires at 9 s.
    queue::put_schedule(
        &mut l.doc,
        "tick",
        Every::Ms(1_000),
        "{}".into(),
        true,
        1_005_700,
    )
    .unwrap();
    l.view();
    l.to(6_000);
    l.to(8_000);
    assert_eq!(l.fired.len(), 3, "a paused schedule fires nothing");
    queue::put_schedule(
        &mut l.doc,
        "tick",
        Every::Ms(1_000),
        "{}".into(),
        false,
        1_008_500,
    )
    .unwrap();
    l.view();
    l.to(8_600);
    assert_eq!(
        l.fired.len(),
        3,
        "the slots passed while paused do not fire"
    );
    l.to(9_000);
    let last = l.fired.last().unwrap();
    assert_eq!((last.slot, last.missed), (1_009_000, 2));
}
