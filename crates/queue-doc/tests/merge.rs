//! Merge rules, property-tested: two or three replicas of a queue document apply random
//! operations and exchange sync messages in random orders (including partial, one-way rounds).
//! After every step no task state regresses on any replica; after a full sync every replica
//! reads the same view.

use std::collections::BTreeMap;

use automerge::sync::{State as SyncState, SyncDoc};
use automerge::{ActorId, Automerge};
use piecework_queue_doc::{
    AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueView, StateCounts, Submission,
    TaskEntry, TaskId, TaskState, ViewCache, WorkerId, queue,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Submit { at: u8, urgent: bool, priority: i8 },
    Claim { at: u8 },
    Assign { at: u8, pick: u8, worker: u8 },
    Start { worker: u8, pick: u8 },
    Finish { worker: u8, pick: u8, outcome: u8 },
    Sync { from: u8, to: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (any::<u8>(), any::<bool>(), any::<i8>()).prop_map(|(at, urgent, priority)| Op::Submit { at, urgent, priority }),
        1 => any::<u8>().prop_map(|at| Op::Claim { at }),
        3 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(at, pick, worker)| Op::Assign { at, pick, worker }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(worker, pick)| Op::Start { worker, pick }),
        3 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(worker, pick, outcome)| Op::Finish { worker, pick, outcome }),
        4 => (any::<u8>(), any::<u8>()).prop_map(|(from, to)| Op::Sync { from, to }),
    ]
}

fn peer(i: usize) -> PeerId {
    PeerId::new(format!("peer-{i}"))
}

struct Cluster {
    docs: Vec<Automerge>,
    sync: BTreeMap<(usize, usize), SyncState>,
    /// The highest state rank each replica has shown for each task, and whether it was final.
    seen: Vec<BTreeMap<TaskId, TaskState>>,
    /// Each replica's incrementally maintained view, checked against full reads.
    caches: Vec<ViewCache>,
    next_task: u64,
    clock: u64,
}

impl Cluster {
    fn new(n: usize) -> Self {
        let mut first = Automerge::new().with_actor(ActorId::from(vec![0u8; 16]));
        let config = QueueConfig {
            max_attempts: 2,
            ..QueueConfig::default()
        };
        queue::create(&mut first, "q", &config, &peer(0), 0).unwrap();
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
            caches: (0..n).map(|_| ViewCache::new()).collect(),
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
                    },
                )
                .unwrap();
            }
            Op::Claim { at } => {
                let at = usize::from(at) % n;
                let term = self.view(at).router.map_or(1, |c| c.term + 1);
                queue::claim_router(&mut self.docs[at], &Claim::new(term, peer(at)), now).unwrap();
            }
            Op::Assign { at, pick, worker } => {
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
                let a = piecework_queue_doc::Assignment {
                    task: task.id.clone(),
                    attempt: AttemptId {
                        n: task.last_n() + 1,
                        claim,
                    },
                    worker: WorkerId::new(peer(usize::from(worker) % n), 0),
                    incarnation: 1,
                };
                queue::record_assignments(&mut self.docs[at], &[a], now).unwrap();
            }
            Op::Start { worker, pick } => {
                // A worker's writes happen on its own replica.
                let w = usize::from(worker) % n;
                let me = peer(w);
                let view = self.view(w);
                let open: Vec<_> = view
                    .open_attempts_of(&me)
                    .filter(|(_, a)| a.started.is_none())
                    .map(|(t, a)| (t.id.clone(), a.id.clone(), a.worker.clone()))
                    .collect();
                if open.is_empty() {
                    return;
                }
                let (task, id, wid) = &open[usize::from(pick) % open.len()];
                queue::record_start(&mut self.docs[w], task, id, wid, 1, now).unwrap();
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
                    .map(|(t, a)| {
                        (
                            t.id.clone(),
                            a.id.clone(),
                            a.worker.clone(),
                            a.started.is_some(),
                        )
                    })
                    .collect();
                if open.is_empty() {
                    return;
                }
                let (task, id, wid, started) = &open[usize::from(pick) % open.len()];
                let outcome = match (started, outcome % 3) {
                    (false, 0) => AttemptOutcome::Refused,
                    (false, _) => AttemptOutcome::Interrupted,
                    (true, 0) => AttemptOutcome::Succeeded,
                    (true, 1) => AttemptOutcome::Failed,
                    (true, _) => AttemptOutcome::Interrupted,
                };
                queue::record_finish(&mut self.docs[w], task, id, wid, outcome, Some("e"), now)
                    .unwrap();
            }
            Op::Sync { from, to } => {
                let (from, to) = (usize::from(from) % n, usize::from(to) % n);
                if from != to {
                    self.sync_round(from, to);
                }
            }
        }
    }

    /// No replica's task state regresses, and no task leaves a replica's index.
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
            }
            check_indexes(cached)?;
            prop_assert_eq!(view.router.as_ref(), view.claims.iter().max());
        }
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
    pending.sort_by(|a, b| a.route_cmp(b, view.config.order));
    let ids = |v: Vec<&TaskEntry>| v.into_iter().map(|t| t.id.clone()).collect::<Vec<_>>();
    prop_assert_eq!(ids(view.pending()), ids(pending));
    let mut counts = StateCounts::default();
    for t in view.tasks().values() {
        match t.state() {
            TaskState::Pending => counts.pending += 1,
            TaskState::Assigned => counts.assigned += 1,
            TaskState::Running => counts.running += 1,
            TaskState::InputUnavailable => counts.input_unavailable += 1,
            TaskState::Succeeded => counts.succeeded += 1,
            TaskState::Failed => counts.failed += 1,
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
    let mut c = Cluster::new(n);
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

/// Two claimants of the same term: after they sync, both name the greater peer.
#[test]
fn concurrent_claims_resolve_to_the_greatest_claim() {
    let mut c = Cluster::new(2);
    queue::claim_router(&mut c.docs[0], &Claim::new(1, peer(0)), 1).unwrap();
    queue::claim_router(&mut c.docs[1], &Claim::new(1, peer(1)), 1).unwrap();
    assert_eq!(c.view(0).router, Some(Claim::new(1, peer(0))));
    c.sync_all();
    for i in 0..2 {
        let v = c.view(i);
        assert_eq!(
            v.claims.len(),
            2,
            "both claims survive as concurrent values"
        );
        assert_eq!(v.router, Some(Claim::new(1, peer(1))));
    }
    // A later claim that has seen both replaces them.
    queue::claim_router(&mut c.docs[0], &Claim::new(2, peer(0)), 2).unwrap();
    c.sync_all();
    assert_eq!(c.view(1).claims, vec![Claim::new(2, peer(0))]);
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
