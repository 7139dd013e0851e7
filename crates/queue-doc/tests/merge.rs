//! Merge rules, property-tested: two or three replicas of a queue document apply random
//! operations and exchange sync messages in random orders (including partial, one-way rounds).
//! After every step no task state regresses on any replica, no attempt's start or end steps
//! back, and every task's state is the one `docs/protocol.md` derives from its attempts; after a
//! full sync every replica reads the same view, and that view holds, for every attempt, the
//! greatest start and end ever written for it, the greatest input mark and the greatest claim.
//!
//! The operations: submits, router claims, assignments (addressed to the worker's current pool
//! incarnation or, from a stale pool heartbeat, to the one before), starts, ends of every
//! outcome (`unavailable` included), marks of a task's input as available again, restarts of
//! a pool (a new incarnation: its earlier life's started attempts end `interrupted`, stale
//! assignments `refused`), one attempt ended twice on two replicas with outcomes drawn apart
//! (a node restarted from a copy that lacked its own end), one attempt started twice on two
//! replicas (the start rule), and sync rounds. Rotations are `epoch.rs`'s.

use std::collections::BTreeMap;

use automerge::sync::{State as SyncState, SyncDoc};
use automerge::{ActorId, Automerge};
use piecework_queue_doc::{
    Attempt, AttemptId, AttemptOutcome, Claim, Finished, PeerId, QueueConfig, QueueView, Started,
    StateCounts, Submission, TaskEntry, TaskId, TaskState, ViewCache, WorkerId, queue,
};
use proptest::prelude::*;
use rules::{Key, end_key, expected_state, start_key};

mod rules;

#[derive(Clone, Debug)]
enum Op {
    Submit {
        at: u8,
        urgent: bool,
        priority: i8,
    },
    Claim {
        at: u8,
    },
    Assign {
        at: u8,
        pick: u8,
        worker: u8,
        stale: bool,
    },
    Start {
        worker: u8,
        pick: u8,
    },
    Finish {
        worker: u8,
        pick: u8,
        outcome: u8,
    },
    /// A member holding the document of a task it sees `input_unavailable` marks it.
    Mark {
        at: u8,
        pick: u8,
    },
    /// The worker's node restarts: its pool's next incarnation.
    Restart {
        worker: u8,
    },
    /// One attempt ended on two replicas, each with an outcome its own copy allows.
    FinishTwice {
        a: u8,
        b: u8,
        pick: u8,
        outcome_a: u8,
        outcome_b: u8,
    },
    /// One attempt started on two replicas, under incarnations drawn independently.
    StartTwice {
        a: u8,
        b: u8,
        pick: u8,
        incarnation_a: u8,
        incarnation_b: u8,
    },
    Sync {
        from: u8,
        to: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (any::<u8>(), any::<bool>(), any::<i8>()).prop_map(|(at, urgent, priority)| Op::Submit { at, urgent, priority }),
        1 => any::<u8>().prop_map(|at| Op::Claim { at }),
        4 => (any::<u8>(), any::<u8>(), any::<u8>(), proptest::bool::weighted(0.2)).prop_map(|(at, pick, worker, stale)| Op::Assign { at, pick, worker, stale }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(worker, pick)| Op::Start { worker, pick }),
        3 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(worker, pick, outcome)| Op::Finish { worker, pick, outcome }),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(at, pick)| Op::Mark { at, pick }),
        1 => any::<u8>().prop_map(|worker| Op::Restart { worker }),
        2 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, pick, outcome_a, outcome_b)| Op::FinishTwice { a, b, pick, outcome_a, outcome_b }),
        1 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, pick, incarnation_a, incarnation_b)| Op::StartTwice { a, b, pick, incarnation_a, incarnation_b }),
        4 => (any::<u8>(), any::<u8>()).prop_map(|(from, to)| Op::Sync { from, to }),
    ]
}

fn peer(i: usize) -> PeerId {
    PeerId::new(format!("peer-{i}"))
}

/// An outcome a worker may write for an attempt, by whether its copy shows the attempt started
/// (`queue::record_finish`'s rule): `refused`, `unavailable` or `interrupted` before a start;
/// `succeeded`, `failed` or `interrupted` after one.
fn outcome_for(started: bool, pick: u8) -> AttemptOutcome {
    match (started, pick % 3) {
        (false, 0) => AttemptOutcome::Refused,
        (false, 1) => AttemptOutcome::Unavailable,
        (false, _) => AttemptOutcome::Interrupted,
        (true, 0) => AttemptOutcome::Succeeded,
        (true, 1) => AttemptOutcome::Failed,
        (true, _) => AttemptOutcome::Interrupted,
    }
}

/// Everything every replica ever wrote: what a fully synced view must show.
#[derive(Default)]
struct Written {
    /// Each attempt's worker and pool incarnation, as assigned.
    assigned: BTreeMap<Key, (WorkerId, u64)>,
    /// Starts, ends and input marks.
    records: rules::Written,
    claims: Vec<Claim>,
}

/// An attempt's start and end, as a replica showed them.
type Shown = (Option<Started>, Option<Finished>);

struct Cluster {
    docs: Vec<Automerge>,
    sync: BTreeMap<(usize, usize), SyncState>,
    /// The highest state rank each replica has shown for each task, and whether it was final.
    seen: Vec<BTreeMap<TaskId, TaskState>>,
    /// The start and end each replica last showed for each attempt.
    seen_attempts: Vec<BTreeMap<Key, Shown>>,
    /// Each replica's incrementally maintained view, checked against full reads.
    caches: Vec<ViewCache>,
    /// Each peer's pool incarnation: one more at each restart.
    incarnations: Vec<u64>,
    written: Written,
    next_task: u64,
    clock: u64,
}

impl Cluster {
    fn new(n: usize) -> Self {
        Self::with_router(n, false)
    }

    /// `n` replicas of a new queue document; with `routed`, replica 0 holds the first claim.
    fn with_router(n: usize, routed: bool) -> Self {
        let mut first = Automerge::new().with_actor(ActorId::from(vec![0u8; 16]));
        let config = QueueConfig {
            max_attempts: 2,
            ..QueueConfig::default()
        };
        queue::create(&mut first, "q", &config, &peer(0), 0).unwrap();
        let mut claims = Vec::new();
        if routed {
            // Tasks get routed from the first step.
            let claim = Claim::new(1, peer(0));
            queue::claim_router(&mut first, &claim, 0).unwrap();
            claims.push(claim);
        }
        let bytes = first.save();
        let mut docs = vec![first];
        for i in 1..n {
            let mut d = Automerge::load(&bytes).unwrap();
            d.set_actor(ActorId::from(vec![u8::try_from(i).unwrap(); 16]));
            docs.push(d);
        }
        Cluster {
            docs,
            sync: BTreeMap::new(),
            seen: vec![BTreeMap::new(); n],
            seen_attempts: vec![BTreeMap::new(); n],
            caches: (0..n).map(|_| ViewCache::new()).collect(),
            incarnations: vec![1; n],
            written: Written {
                claims,
                ..Written::default()
            },
            next_task: 0,
            clock: 1,
        }
    }

    fn view(&self, i: usize) -> QueueView {
        QueueView::read(&self.docs[i]).expect("replica reads as a queue")
    }

    /// One sync message from `from` to `to`, if `from` has something to say.
    fn sync_round(&mut self, from: usize, to: usize) -> bool {
        let msg = {
            let state = self.sync.entry((from, to)).or_default();
            self.docs[from].generate_sync_message(state)
        };
        let Some(msg) = msg else { return false };
        let state = self.sync.entry((to, from)).or_default();
        self.docs[to].receive_sync_message(state, msg).unwrap();
        true
    }

    fn sync_all(&mut self) {
        let n = self.docs.len();
        loop {
            let mut any = false;
            for a in 0..n {
                for b in 0..n {
                    if a != b {
                        any |= self.sync_round(a, b);
                    }
                }
            }
            if !any {
                break;
            }
        }
    }

    /// A start written on replica `at`, logged if the document took it.
    fn start(&mut self, at: usize, task: &TaskId, a: &Attempt, incarnation: u64, now: u64) {
        if queue::record_start(&mut self.docs[at], task, &a.id, &a.worker, incarnation, now).is_ok()
        {
            self.written.records.start(
                task,
                &a.id,
                Started {
                    at: now,
                    incarnation,
                },
            );
        }
    }

    /// An end written on replica `at`, logged if the document took it.
    fn finish(
        &mut self,
        at: usize,
        task: &TaskId,
        a: &Attempt,
        outcome: AttemptOutcome,
        error: &str,
        now: u64,
    ) {
        if queue::record_finish(
            &mut self.docs[at],
            task,
            &a.id,
            &a.worker,
            outcome,
            Some(error),
            now,
        )
        .is_ok()
        {
            self.written.records.end(
                task,
                &a.id,
                Finished::new(now, outcome, Some(error.to_owned())),
            );
        }
    }

    /// The attempts open (and, with `unstarted`, not started) on both replicas `a` and `b`.
    fn open_on_both(&self, a: usize, b: usize, unstarted: bool) -> Vec<(TaskId, Attempt, Attempt)> {
        let (va, vb) = (self.view(a), self.view(b));
        let mut both = Vec::new();
        for t in va.tasks().values() {
            for x in t.attempts.iter().filter(|x| x.is_open()) {
                let Some(y) = vb.task(&t.id).and_then(|u| u.attempt(&x.id)) else {
                    continue;
                };
                if y.is_open() && (!unstarted || (x.started.is_none() && y.started.is_none())) {
                    both.push((t.id.clone(), x.clone(), y.clone()));
                }
            }
        }
        both
    }

    fn apply(&mut self, op: &Op) {
        let n = self.docs.len();
        self.clock += 1;
        let now = self.clock;
        match *op {
            Op::Submit {
                at,
                urgent,
                priority,
            } => {
                let at = usize::from(at) % n;
                self.next_task += 1;
                queue::submit(
                    &mut self.docs[at],
                    &Submission {
                        id: TaskId::new(format!("automerge:t{}", self.next_task)),
                        kind: "k".into(),
                        submitter: peer(at),
                        submitted_at: now,
                        priority: i64::from(priority),
                        urgent,
                        max_attempts: None,
                        input: None,
                        rules: Default::default(),
                    },
                )
                .unwrap();
            }
            Op::Claim { at } => {
                let at = usize::from(at) % n;
                let term = self.view(at).router.map_or(1, |c| c.term + 1);
                let claim = Claim::new(term, peer(at));
                queue::claim_router(&mut self.docs[at], &claim, now).unwrap();
                self.written.claims.push(claim);
            }
            Op::Assign {
                at,
                pick,
                worker,
                stale,
            } => {
                let at = usize::from(at) % n;
                let view = self.view(at);
                // Only a replica that believes itself the router assigns, as in the system.
                let Some(claim) = view.router.clone().filter(|c| c.peer == peer(at)) else {
                    return;
                };
                let pending = view.pending();
                if pending.is_empty() {
                    return;
                }
                let task = pending[usize::from(pick) % pending.len()];
                let w = usize::from(worker) % n;
                // A router addresses the pool incarnation of the last heartbeat it heard: the
                // current one, or (a heartbeat from before a restart) the one before.
                let incarnation = match stale {
                    true => self.incarnations[w].saturating_sub(1).max(1),
                    false => self.incarnations[w],
                };
                let a = piecework_queue_doc::Assignment {
                    task: task.id.clone(),
                    attempt: AttemptId {
                        n: task.last_n() + 1,
                        claim,
                    },
                    worker: WorkerId::new(peer(w), 0),
                    incarnation,
                };
                queue::record_assignments(&mut self.docs[at], std::slice::from_ref(&a), now)
                    .unwrap();
                self.written.assigned.insert(
                    (a.task.clone(), a.attempt.clone()),
                    (a.worker.clone(), incarnation),
                );
            }
            Op::Start { worker, pick } => {
                // A worker's writes happen on its own replica; its pool starts only what is
                // addressed to its current incarnation.
                let w = usize::from(worker) % n;
                let me = peer(w);
                let incarnation = self.incarnations[w];
                let view = self.view(w);
                let open: Vec<_> = view
                    .open_attempts_of(&me)
                    .filter(|(_, a)| a.started.is_none() && a.pool_incarnation == Some(incarnation))
                    .map(|(t, a)| (t.id.clone(), a.clone()))
                    .collect();
                if open.is_empty() {
                    return;
                }
                let (task, a) = &open[usize::from(pick) % open.len()];
                self.start(w, task, a, incarnation, now);
            }
            Op::Finish {
                worker,
                pick,
                outcome,
            } => {
                let w = usize::from(worker) % n;
                let me = peer(w);
                let view = self.view(w);
                let open: Vec<_> = view
                    .open_attempts_of(&me)
                    .map(|(t, a)| (t.id.clone(), a.clone()))
                    .collect();
                if open.is_empty() {
                    return;
                }
                let (task, a) = &open[usize::from(pick) % open.len()];
                let outcome = outcome_for(a.started.is_some(), outcome);
                self.finish(w, task, a, outcome, "e", now);
            }
            Op::Mark { at, pick } => {
                let at = usize::from(at) % n;
                let view = self.view(at);
                let waiting: Vec<(TaskId, u64)> = view
                    .input_unavailable()
                    .map(|t| (t.id.clone(), t.last_n()))
                    .collect();
                if waiting.is_empty() {
                    return;
                }
                let (task, last) = &waiting[usize::from(pick) % waiting.len()];
                queue::mark_input_available(&mut self.docs[at], task, *last).unwrap();
                self.written.records.mark(task, *last);
            }
            Op::Restart { worker } => {
                // What a restarted pool does with the open attempts its replica shows
                // (`worker-pool`'s `Pool::sync`): its earlier life's runs end `interrupted`;
                // assignments it did not start are refused if the task already has an outcome
                // or if they are addressed to another incarnation.
                let w = usize::from(worker) % n;
                self.incarnations[w] += 1;
                let incarnation = self.incarnations[w];
                let view = self.view(w);
                let open: Vec<_> = view
                    .open_attempts_of(&peer(w))
                    .map(|(t, a)| (t.id.clone(), t.state().is_final(), a.clone()))
                    .collect();
                for (task, is_final, a) in open {
                    let outcome = match &a.started {
                        Some(s) if s.incarnation != incarnation => AttemptOutcome::Interrupted,
                        Some(_) => continue,
                        None if is_final => AttemptOutcome::Refused,
                        None if a.pool_incarnation.is_some_and(|i| i != incarnation) => {
                            AttemptOutcome::Refused
                        }
                        None => continue,
                    };
                    self.finish(w, &task, &a, outcome, "restarted", now);
                }
            }
            Op::FinishTwice {
                a,
                b,
                pick,
                outcome_a,
                outcome_b,
            } => {
                let (a, b) = (usize::from(a) % n, usize::from(b) % n);
                if a == b {
                    return;
                }
                let both = self.open_on_both(a, b, false);
                if both.is_empty() {
                    return;
                }
                let (task, x, y) = &both[usize::from(pick) % both.len()];
                let oa = outcome_for(x.started.is_some(), outcome_a);
                let mut ob = outcome_for(y.started.is_some(), outcome_b);
                if ob == oa {
                    // Two different outcomes: the next one the copy allows.
                    ob = outcome_for(y.started.is_some(), outcome_b % 3 + 1);
                }
                self.finish(a, task, x, oa, "fork a", now);
                self.finish(b, task, y, ob, "fork b", now);
            }
            Op::StartTwice {
                a,
                b,
                pick,
                incarnation_a,
                incarnation_b,
            } => {
                let (a, b) = (usize::from(a) % n, usize::from(b) % n);
                if a == b {
                    return;
                }
                let both = self.open_on_both(a, b, true);
                if both.is_empty() {
                    return;
                }
                let (task, x, y) = &both[usize::from(pick) % both.len()];
                self.start(a, task, x, u64::from(incarnation_a % 3) + 1, now);
                // The second start is the later one, so that time and incarnation can disagree.
                self.start(b, task, y, u64::from(incarnation_b % 3) + 1, now + 1);
                self.clock += 1;
            }
            Op::Sync { from, to } => {
                let (from, to) = (usize::from(from) % n, usize::from(to) % n);
                if from != to {
                    self.sync_round(from, to);
                }
            }
        }
    }

    /// No replica's task state regresses, no task leaves a replica's index, no attempt's start
    /// or end steps back, and every task's state is the one its attempts give.
    fn check_monotone(&mut self) -> Result<(), TestCaseError> {
        for i in 0..self.docs.len() {
            let view = self.view(i);
            let cached = self.caches[i].refresh(&self.docs[i]).expect("a queue");
            prop_assert_eq!(
                cached.as_ref(),
                &view,
                "replica {}: the incremental view drifted",
                i
            );
            for (id, before) in &self.seen[i] {
                let entry = view.task(id);
                prop_assert!(entry.is_some(), "task {id} vanished from replica {i}");
                let now = entry.unwrap().state();
                prop_assert!(
                    now.rank() >= before.rank(),
                    "task {id} on replica {i}: {before:?} -> {now:?}"
                );
                if *before == TaskState::Succeeded {
                    prop_assert_eq!(now, TaskState::Succeeded);
                }
            }
            for (id, t) in view.tasks() {
                self.seen[i].insert(id.clone(), t.state());
                prop_assert_eq!(
                    t.state(),
                    expected_state(t),
                    "task {} on replica {}: {:?}",
                    id,
                    i,
                    t
                );
                for a in &t.attempts {
                    let key = (id.clone(), a.id.clone());
                    if let Some((s, f)) = self.seen_attempts[i].get(&key) {
                        prop_assert!(
                            s.as_ref().map(start_key) <= a.started.as_ref().map(start_key),
                            "the start of {:?} on replica {} stepped back: {:?} -> {:?}",
                            key,
                            i,
                            s,
                            a.started
                        );
                        prop_assert!(
                            f.as_ref().map(end_key) <= a.finished.as_ref().map(end_key),
                            "the end of {:?} on replica {} stepped back: {:?} -> {:?}",
                            key,
                            i,
                            f,
                            a.finished
                        );
                    }
                    self.seen_attempts[i].insert(key, (a.started.clone(), a.finished.clone()));
                }
            }
            check_indexes(cached)?;
            prop_assert_eq!(view.router.as_ref(), view.claims.iter().max());
        }
        Ok(())
    }

    /// The converged view holds every write, each key resolved by its merge rule.
    fn check_written(&self, view: &QueueView) -> Result<(), TestCaseError> {
        let w = &self.written;
        prop_assert_eq!(
            view.router.as_ref(),
            w.claims.iter().max(),
            "the greatest claim wins"
        );
        let mut attempts = 0;
        for (id, t) in view.tasks() {
            w.records.check_task(view, id)?;
            for a in &t.attempts {
                attempts += 1;
                let key = (id.clone(), a.id.clone());
                let Some((worker, incarnation)) = w.assigned.get(&key) else {
                    return Err(TestCaseError::fail(format!("{key:?} was never assigned")));
                };
                prop_assert_eq!(&a.worker, worker);
                prop_assert_eq!(a.pool_incarnation, Some(*incarnation));
            }
        }
        prop_assert_eq!(attempts, w.assigned.len(), "every attempt is kept");
        Ok(())
    }
}
/// The view's indexes agree with a scan of every task.
fn check_indexes(view: &QueueView) -> Result<(), TestCaseError> {
    let mut pending: Vec<&TaskEntry> = view
        .tasks()
        .values()
        .map(|t| &**t)
        .filter(|t| t.state() == TaskState::Pending)
        .collect();
    pending.sort_by(|a, b| view.route_cmp(a, b));
    let ids = |v: Vec<&TaskEntry>| v.into_iter().map(|t| t.id.clone()).collect::<Vec<_>>();
    prop_assert_eq!(ids(view.pending()), ids(pending));
    let mut counts = StateCounts::default();
    for t in view.tasks().values() {
        match t.state() {
            TaskState::Pending | TaskState::Blocked => counts.pending += 1,
            TaskState::Assigned => counts.assigned += 1,
            TaskState::Running => counts.running += 1,
            TaskState::InputUnavailable => counts.input_unavailable += 1,
            TaskState::Failed => counts.failed += 1,
            TaskState::Cancelled => counts.cancelled += 1,
            TaskState::Succeeded => counts.succeeded += 1,
        }
    }
    prop_assert_eq!(view.counts(), counts);
    let open: Vec<(TaskId, AttemptId)> = view
        .tasks()
        .values()
        .flat_map(|t| {
            t.attempts
                .iter()
                .filter(|a| a.is_open())
                .map(|a| (t.id.clone(), a.id.clone()))
        })
        .collect();
    let mut indexed: Vec<(TaskId, AttemptId)> = view
        .open_attempts()
        .values()
        .flatten()
        .map(|(t, a)| (t.id.clone(), a.id.clone()))
        .collect();
    indexed.sort();
    let mut open = open;
    open.sort();
    prop_assert_eq!(indexed, open);
    let unavailable: Vec<_> = view
        .tasks()
        .values()
        .filter(|t| t.state() == TaskState::InputUnavailable)
        .map(|t| t.id.clone())
        .collect();
    prop_assert_eq!(ids(view.input_unavailable().collect()), unavailable);
    Ok(())
}

fn run(n: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut c = Cluster::with_router(n, true);
    for op in ops {
        c.apply(op);
        c.check_monotone()?;
    }
    c.sync_all();
    c.check_monotone()?;
    let first = c.view(0);
    for i in 1..n {
        prop_assert_eq!(c.docs[0].get_heads(), c.docs[i].get_heads());
        prop_assert_eq!(&first, &c.view(i), "replica {} disagrees with replica 0", i);
    }
    prop_assert_eq!(first.malformed, 0);
    c.check_written(&first)?;
    Ok(())
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(200))]

    #[test]
    fn two_replicas_converge_without_regressing(ops in proptest::collection::vec(op(), 1..80)) {
        run(2, &ops)?;
    }

    #[test]
    fn three_replicas_converge_without_regressing(ops in proptest::collection::vec(op(), 1..120)) {
        run(3, &ops)?;
    }
}

/// Two claimants of the same term: after they sync, both name the greater peer. A later claim
/// that names one of them counts above both; every claim that counts stays listed.
#[test]
fn concurrent_claims_resolve_to_the_greatest_claim() {
    let mut c = Cluster::new(2);
    queue::claim_router(&mut c.docs[0], &Claim::new(1, peer(0)), 1).unwrap();
    queue::claim_router(&mut c.docs[1], &Claim::new(1, peer(1)), 1).unwrap();
    assert_eq!(c.view(0).router, Some(Claim::new(1, peer(0))));
    c.sync_all();
    for i in 0..2 {
        let v = c.view(i);
        assert_eq!(v.claims.len(), 2, "both claims count");
        assert_eq!(v.router, Some(Claim::new(1, peer(1))));
    }
    // A later claim that has seen both supersedes them.
    queue::claim_router(&mut c.docs[0], &Claim::new(2, peer(0)), 2).unwrap();
    c.sync_all();
    assert_eq!(c.view(1).router, Some(Claim::new(2, peer(0))));
    assert_eq!(
        c.view(1).claims,
        vec![
            Claim::new(1, peer(0)),
            Claim::new(1, peer(1)),
            Claim::new(2, peer(0))
        ]
    );
}

/// A success recorded on one replica and a dead-letter reached concurrently on another merge to
/// `Succeeded`: the work was done, and the final state only moves up in rank.
#[test]
fn success_beats_a_concurrent_dead_letter() {
    let mut c = Cluster::new(2);
    c.apply(&Op::Submit {
        at: 0,
        urgent: false,
        priority: 0,
    });
    let claim = Claim::new(1, peer(0));
    queue::claim_router(&mut c.docs[0], &claim, 1).unwrap();
    let task = TaskId::new("automerge:t1");
    let (w0, w1) = (WorkerId::new(peer(0), 0), WorkerId::new(peer(1), 0));
    let id = |n| AttemptId {
        n,
        claim: claim.clone(),
    };
    let assign = |n, w: &WorkerId| piecework_queue_doc::Assignment {
        task: task.clone(),
        attempt: id(n),
        worker: w.clone(),
        incarnation: 1,
    };
    queue::record_assignments(&mut c.docs[0], &[assign(1, &w1)], 2).unwrap();
    c.sync_all();
    // Worker 1 starts attempt 1, then the replicas are cut off from each other. The router
    // re-routes the task twice to worker 0, which fails both times: dead-lettered (max 2).
    queue::record_start(&mut c.docs[1], &task, &id(1), &w1, 1, 3).unwrap();
    for n in [2, 3] {
        queue::record_assignments(&mut c.docs[0], &[assign(n, &w0)], 3).unwrap();
        queue::record_start(&mut c.docs[0], &task, &id(n), &w0, 1, 4).unwrap();
        queue::record_finish(
            &mut c.docs[0],
            &task,
            &id(n),
            &w0,
            AttemptOutcome::Failed,
            Some("boom"),
            5,
        )
        .unwrap();
    }
    queue::record_finish(
        &mut c.docs[1],
        &task,
        &id(1),
        &w1,
        AttemptOutcome::Succeeded,
        None,
        6,
    )
    .unwrap();
    assert_eq!(c.view(0).tasks()[&task].state(), TaskState::Failed);
    assert_eq!(c.view(1).tasks()[&task].state(), TaskState::Succeeded);
    c.sync_all();
    assert_eq!(c.view(0).tasks()[&task].state(), TaskState::Succeeded);
    assert_eq!(c.view(1).tasks()[&task].state(), TaskState::Succeeded);
}
