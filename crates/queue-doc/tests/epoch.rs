//! Epochs, property-tested: a queue document is rotated into a successor at a random point,
//! two replicas of the sealed document keep receiving late writes (submits, assignments,
//! starts, outcomes, input marks), and the writes are carried into the successor once, in
//! steps, twice, or by two carriers concurrently whose successors then merge. Every way gives
//! the state of carrying once, and that state is the sealed document's own view of every task
//! that was live at the seal or submitted after it. The late writes include ends of every
//! outcome, input marks, restarts of the worker's pool (a new incarnation: its earlier life's
//! runs end `interrupted`, stale assignments `refused`) and one attempt ended on both offline
//! replicas with different outcomes; the carried state holds, for each attempt, the greatest
//! start and end written anywhere, and each task's state is the one its attempts give
//! (`rules`).

use automerge::{ActorId, Automerge};
use piecework_queue_doc::epoch::{self, Latest, Link, Rotation, Seal};
use piecework_queue_doc::{
    AttemptId, AttemptOutcome, Claim, Finished, PeerId, QueueConfig, QueueId, QueueView, Started,
    Submission, TaskId, WorkerId, queue,
};
use proptest::prelude::*;

mod rules;

#[derive(Clone, Debug)]
enum Op {
    Submit,
    Assign {
        pick: u8,
    },
    Start {
        pick: u8,
    },
    Finish {
        pick: u8,
        outcome: u8,
    },
    Mark {
        pick: u8,
    },
    /// The worker's node restarts: its pool's next incarnation.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Submit),
        3 => any::<u8>().prop_map(|pick| Op::Assign { pick }),
        3 => any::<u8>().prop_map(|pick| Op::Start { pick }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(pick, outcome)| Op::Finish { pick, outcome }),
        1 => any::<u8>().prop_map(|pick| Op::Mark { pick }),
        1 => Just(Op::Restart),
    ]
}

fn worker() -> WorkerId {
    WorkerId::new(PeerId::new("w"), 0)
}

struct Writer {
    next: u64,
    clock: u64,
    /// Distinct task ids per writer, and its own router claim (one writer per attempt key,
    /// as in the system: routers on either side of a partition hold distinct claims).
    prefix: &'static str,
    /// The worker's pool incarnation as this writer knows it.
    incarnation: u64,
    /// What this writer wrote that took.
    written: rules::Written,
}

impl Writer {
    fn new(prefix: &'static str, clock: u64) -> Self {
        Writer {
            next: 0,
            clock,
            prefix,
            incarnation: 1,
            written: rules::Written::default(),
        }
    }

    fn router(&self) -> Claim {
        Claim::new(1, PeerId::new(format!("router-{}", self.prefix)))
    }
}

impl Writer {
    fn apply(&mut self, doc: &mut Automerge, op: &Op) {
        self.clock += 1;
        let now = self.clock;
        let view = QueueView::read(doc).unwrap();
        let tasks: Vec<_> = view.tasks().values().map(|t| (**t).clone()).collect();
        let pick = |p: u8, len: usize| -> Option<usize> { (len > 0).then(|| usize::from(p) % len) };
        match *op {
            Op::Submit => {
                self.next += 1;
                queue::submit(
                    doc,
                    &Submission {
                        id: TaskId::new(format!("automerge:{}{}", self.prefix, self.next)),
                        kind: "k".into(),
                        submitter: PeerId::new("s"),
                        submitted_at: now,
                        priority: 0,
                        urgent: false,
                        max_attempts: Some(2),
                        input: None,
                        rules: Default::default(),
                    },
                )
                .unwrap();
            }
            Op::Assign { pick: p } => {
                let pending: Vec<_> = view.pending().into_iter().cloned().collect();
                let Some(i) = pick(p, pending.len()) else {
                    return;
                };
                let t = &pending[i];
                let a = piecework_queue_doc::Assignment {
                    task: t.id.clone(),
                    attempt: AttemptId {
                        n: t.last_n() + 1,
                        claim: self.router(),
                    },
                    worker: worker(),
                    incarnation: self.incarnation,
                };
                let _ = queue::record_assignments(doc, &[a], now);
            }
            Op::Start { pick: p } => {
                let Some(i) = pick(p, tasks.len()) else {
                    return;
                };
                let t = &tasks[i];
                // The pool starts only what is addressed to its incarnation.
                if let Some(a) = t.attempts.iter().find(|a| {
                    a.is_open()
                        && a.started.is_none()
                        && a.pool_incarnation == Some(self.incarnation)
                }) {
                    let i = self.incarnation;
                    if queue::record_start(doc, &t.id, &a.id, &worker(), i, now).is_ok() {
                        let s = Started {
                            at: now,
                            incarnation: i,
                        };
                        self.written.start(&t.id, &a.id, s);
                    }
                }
            }
            Op::Finish { pick: p, outcome } => {
                let Some(i) = pick(p, tasks.len()) else {
                    return;
                };
                let t = &tasks[i];
                if let Some(a) = t.attempts.iter().find(|a| a.is_open()) {
                    let outcome = match (a.started.is_some(), outcome % 3) {
                        (true, 0) => AttemptOutcome::Failed,
                        (true, 1) => AttemptOutcome::Succeeded,
                        (false, 0) => AttemptOutcome::Unavailable,
                        (false, 1) => AttemptOutcome::Refused,
                        (_, _) => AttemptOutcome::Interrupted,
                    };
                    self.finish(doc, &t.id, &a.id, outcome, self.prefix, now);
                }
            }
            Op::Mark { pick: p } => {
                let Some(i) = pick(p, tasks.len()) else {
                    return;
                };
                let t = &tasks[i];
                if queue::mark_input_available(doc, &t.id, t.last_n()).is_ok() {
                    self.written.mark(&t.id, t.last_n());
                }
            }
            Op::Restart => {
                // What a restarted pool does with its open attempts (`Pool::sync`): its
                // earlier life's runs end `interrupted`, what it did not start and is addressed
                // to another incarnation (or whose task has an outcome) is refused.
                self.incarnation += 1;
                for t in &tasks {
                    for a in t.attempts.iter().filter(|a| a.is_open()) {
                        let outcome = match &a.started {
                            Some(s) if s.incarnation != self.incarnation => {
                                AttemptOutcome::Interrupted
                            }
                            Some(_) => continue,
                            None if t.state().is_final() => AttemptOutcome::Refused,
                            None if a.pool_incarnation != Some(self.incarnation) => {
                                AttemptOutcome::Refused
                            }
                            None => continue,
                        };
                        self.finish(doc, &t.id, &a.id, outcome, "restarted", now);
                    }
                }
            }
        }
    }

    fn finish(
        &mut self,
        doc: &mut Automerge,
        task: &TaskId,
        attempt: &AttemptId,
        outcome: AttemptOutcome,
        error: &str,
        now: u64,
    ) {
        if queue::record_finish(doc, task, attempt, &worker(), outcome, Some(error), now).is_ok() {
            let f = Finished::new(now, outcome, Some(error.to_owned()));
            self.written.end(task, attempt, f);
        }
    }
}

fn fork(doc: &Automerge, actor: u8) -> Automerge {
    doc.fork().with_actor(ActorId::from(vec![actor; 16]))
}

fn carry_all(
    from: &Automerge,
    since: &[automerge::ChangeHash],
    into: &mut Automerge,
    sealed: &Automerge,
    seal_heads: &[automerge::ChangeHash],
) -> epoch::Carried {
    carry_with(from, since, into, sealed, seal_heads, None)
}

/// As [`carry_all`], starting from the marks other carriers left in `into` too, and leaving
/// one: what a node does when it carries into its sealed document's direct successor.
fn carry_marked(
    from: &Automerge,
    since: &[automerge::ChangeHash],
    into: &mut Automerge,
    sealed: &Automerge,
    seal_heads: &[automerge::ChangeHash],
) -> epoch::Carried {
    let mut since = since.to_vec();
    since.extend(epoch::carried_marks(into, "automerge:q0"));
    carry_with(from, &since, into, sealed, seal_heads, Some("automerge:q0"))
}

fn carry_with(
    from: &Automerge,
    since: &[automerge::ChangeHash],
    into: &mut Automerge,
    sealed: &Automerge,
    seal_heads: &[automerge::ChangeHash],
    mark: Option<&str>,
) -> epoch::Carried {
    let dropped = |t: &TaskId| epoch::known_at(sealed, seal_heads, t);
    epoch::carry(from, since, into, &dropped, mark, usize::MAX).unwrap()
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(64))]

    #[test]
    fn carrying_late_writes_is_idempotent(
        before in prop::collection::vec(op(), 0..40),
        late_a in prop::collection::vec(op(), 0..25),
        late_b in prop::collection::vec(op(), 0..25),
        twice in prop::option::of((any::<u8>(), any::<u8>(), any::<u8>())),
    ) {
        let origin = QueueId::new("automerge:q0");
        let mut old = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
        queue::create(&mut old, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
        let mut w = Writer::new("t", 0);
        for o in &before {
            w.apply(&mut old, o);
        }
        // Rotate.
        let view = QueueView::read(&old).unwrap();
        let claim = Claim::new(2, PeerId::new("router"));
        let mut succ = Automerge::new().with_actor(ActorId::from(vec![9u8; 16]));
        let rotated = epoch::build_successor(&old, &view, &mut succ, &Rotation {
            origin: &origin, prev: "automerge:q0", successor: "automerge:q1", epoch: 1, claim: &claim, now_ms: 1_000,
        }).unwrap();
        let seal_heads = old.get_heads();
        epoch::seal(&mut old, &Seal { claim: claim.clone(), successor: "automerge:q1".into(), epoch: 1 }, &seal_heads).unwrap();
        prop_assert_eq!(epoch::seal_heads(&old, "automerge:q1"), Some(seal_heads.clone()));
        epoch::set_latest(&mut old, &Latest { epoch: 1, doc: "automerge:q1".into() }).unwrap();
        let live_at_seal: Vec<TaskId> = view.tasks().values().filter(|t| !t.state().is_final()).map(|t| t.id.clone()).collect();
        prop_assert_eq!(rotated.carried, live_at_seal.len());
        let sv = QueueView::read(&succ).unwrap();
        prop_assert_eq!(sv.epoch, 1);
        prop_assert_eq!(sv.origin.as_ref(), Some(&origin));
        prop_assert_eq!(sv.router.as_ref(), Some(&claim));
        prop_assert_eq!(sv.tasks().len(), live_at_seal.len());
        for id in &live_at_seal {
            prop_assert_eq!(sv.task(id), view.task(id));
        }
        let ov = QueueView::read(&old).unwrap();
        prop_assert_eq!(epoch::winner(&ov.seals).map(|s| s.successor.as_str()), Some("automerge:q1"));

        // Two offline replicas of the sealed epoch write late, concurrently.
        let mut a = fork(&old, 2);
        let mut b = fork(&old, 3);
        let mut wa = Writer::new("a", 2_000);
        let mut wb = Writer::new("b", 3_000);
        let half = late_a.len() / 2;
        for o in &late_a[..half] {
            wa.apply(&mut a, o);
        }
        let a_half = fork(&a, 4);
        for o in &late_a[half..] {
            wa.apply(&mut a, o);
        }
        for o in &late_b {
            wb.apply(&mut b, o);
        }
        // One attempt ended on both offline replicas, with different outcomes (a node that
        // restarted from a copy lacking its own end ends it again).
        if let Some((pick, oa, ob)) = twice {
            finish_on_both(&mut a, &mut wa, &mut b, &mut wb, pick, oa, ob);
        }
        let mut merged = fork(&a, 5);
        merged.merge(&mut b.clone()).unwrap();

        // Once.
        let mut once = fork(&succ, 10);
        carry_all(&merged, &seal_heads, &mut once, &old, &seal_heads);
        let reference = QueueView::read(&once).unwrap();

        // Twice: the second carry writes nothing.
        let again = carry_all(&merged, &seal_heads, &mut once, &old, &seal_heads);
        prop_assert_eq!(again.writes, 0);
        prop_assert_eq!(QueueView::read(&once).unwrap().tasks().clone(), reference.tasks().clone());

        // In steps, from what the carrier held at each step.
        let mut steps = fork(&succ, 11);
        let first = carry_all(&a_half, &seal_heads, &mut steps, &old, &seal_heads);
        let second = carry_all(&a, &first.heads, &mut steps, &old, &seal_heads);
        carry_all(&merged, &second.heads, &mut steps, &old, &seal_heads);
        prop_assert_eq!(QueueView::read(&steps).unwrap().tasks().clone(), reference.tasks().clone());

        // Two carriers at once, each from its own replica, then their successors merge.
        let mut c1 = fork(&succ, 12);
        let mut c2 = fork(&succ, 13);
        carry_all(&a, &seal_heads, &mut c1, &old, &seal_heads);
        carry_all(&b, &seal_heads, &mut c2, &old, &seal_heads);
        c1.merge(&mut c2.clone()).unwrap();
        let mut c3 = fork(&succ, 14);
        carry_all(&merged, &seal_heads, &mut c3, &old, &seal_heads);
        c1.merge(&mut c3).unwrap();
        prop_assert_eq!(QueueView::read(&c1).unwrap().tasks().clone(), reference.tasks().clone());

        // A change at a time, each carry going on from where the one before stopped.
        let mut slices = fork(&succ, 19);
        let mut since = seal_heads.clone();
        for _ in 0..200 {
            let c = epoch::carry(&merged, &since, &mut slices, &|t| epoch::known_at(&old, &seal_heads, t), None, 1).unwrap();
            since = c.heads;
            if !c.more {
                break;
            }
        }
        prop_assert_eq!(QueueView::read(&slices).unwrap().tasks().clone(), reference.tasks().clone());

        // Marked carries: each carrier starts from what the marks it holds say was carried.
        // One from half of `a`, a second (holding the first's successor) from everything; two
        // at once from `a` and `b`, merged, then one from everything.
        let mut m1 = fork(&succ, 15);
        carry_marked(&a_half, &seal_heads, &mut m1, &old, &seal_heads);
        let mut m2 = fork(&m1, 16);
        carry_marked(&merged, &seal_heads, &mut m2, &old, &seal_heads);
        prop_assert_eq!(QueueView::read(&m2).unwrap().tasks().clone(), reference.tasks().clone());
        let mut m3 = fork(&succ, 17);
        let mut m4 = fork(&succ, 18);
        carry_marked(&a, &seal_heads, &mut m3, &old, &seal_heads);
        carry_marked(&b, &seal_heads, &mut m4, &old, &seal_heads);
        m3.merge(&mut m4).unwrap();
        let last = carry_marked(&merged, &seal_heads, &mut m3, &old, &seal_heads);
        prop_assert_eq!(QueueView::read(&m3).unwrap().tasks().clone(), reference.tasks().clone());
        // Once both marks are known, nothing is left to carry (or even to look at).
        prop_assert_eq!(last.writes, 0);

        // What carrying gives: the sealed epoch's own entries of every task live at the seal
        // or submitted after it; nothing of the tasks finished before the seal.
        let full = QueueView::read(&merged).unwrap();
        for (id, t) in full.tasks() {
            match reference.task(id) {
                Some(r) => prop_assert_eq!(r, &**t),
                None => prop_assert!(view.task(id).is_some_and(|v| v.state().is_final())),
            }
        }
        for id in reference.tasks().keys() {
            prop_assert!(full.task(id).is_some());
        }

        // And that state follows the merge rules: for each attempt the greatest start and end
        // written on any replica, before or after the seal; the greatest input mark; the
        // state its attempts give.
        let mut written = rules::Written::default();
        for x in [&w, &wa, &wb] {
            written.extend(&x.written);
        }
        for id in full.tasks().keys() {
            written.check_task(&full, id)?;
        }
        for id in reference.tasks().keys() {
            written.check_task(&reference, id)?;
        }
    }
}

/// Ends, on `a` and on `b`, an attempt open on both, each with an outcome its copy allows and
/// the two different.
fn finish_on_both(
    a: &mut Automerge,
    wa: &mut Writer,
    b: &mut Automerge,
    wb: &mut Writer,
    pick: u8,
    oa: u8,
    ob: u8,
) {
    let (va, vb) = (QueueView::read(a).unwrap(), QueueView::read(b).unwrap());
    let mut both = Vec::new();
    for t in va.tasks().values() {
        for x in t.attempts.iter().filter(|x| x.is_open()) {
            if let Some(y) = vb
                .task(&t.id)
                .and_then(|u| u.attempt(&x.id))
                .filter(|y| y.is_open())
            {
                both.push((
                    t.id.clone(),
                    x.id.clone(),
                    x.started.is_some(),
                    y.started.is_some(),
                ));
            }
        }
    }
    if both.is_empty() {
        return;
    }
    let (task, id, started_a, started_b) = &both[usize::from(pick) % both.len()];
    let outcome = |started: bool, p: u8| match (started, p % 3) {
        (true, 0) => AttemptOutcome::Failed,
        (true, 1) => AttemptOutcome::Succeeded,
        (false, 0) => AttemptOutcome::Unavailable,
        (false, 1) => AttemptOutcome::Refused,
        (_, _) => AttemptOutcome::Interrupted,
    };
    let first = outcome(*started_a, oa);
    let mut second = outcome(*started_b, ob);
    if second == first {
        second = outcome(*started_b, ob % 3 + 1);
    }
    wa.clock += 1;
    wb.clock += 1;
    let (ta, tb) = (wa.clock, wb.clock);
    wa.finish(a, task, id, first, "fork a", ta);
    wb.finish(b, task, id, second, "fork b", tb);
}

/// A claim a follower wrote into the sealed document after the seal, above the sealer's, reaches
/// the successor by carrying (pools there must be fenced by it too); a later carry that does
/// not touch the router records leaves the claim alone.
#[test]
fn a_late_claim_is_carried_and_only_when_written() {
    let origin = QueueId::new("automerge:q0");
    let mut old = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    queue::create(&mut old, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
    let sealer = Claim::new(2, PeerId::new("router"));
    queue::claim_router(&mut old, &Claim::new(1, PeerId::new("router")), 1).unwrap();
    queue::claim_router(&mut old, &sealer, 1).unwrap();
    let view = QueueView::read(&old).unwrap();
    let mut succ = Automerge::new().with_actor(ActorId::from(vec![9u8; 16]));
    epoch::build_successor(
        &old,
        &view,
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
    let seal_heads = old.get_heads();
    let mut late = fork(&old, 2);
    let follower = Claim::new(3, PeerId::new("follower"));
    queue::claim_router(&mut late, &follower, 2).unwrap();
    let c = carry_all(&late, &seal_heads, &mut succ, &old, &seal_heads);
    // The claim, and the chain below it that counts in the successor only once carried (the
    // term-1 claim: the successor holds the sealer's as its base, not that record).
    assert_eq!(c.writes, 2, "the claim and its chain");
    assert_eq!(epoch::effective_claim(&succ), Some(follower.clone()));
    // A late submit after it: only the task is carried.
    let mut w = Writer::new("z", 5_000);
    w.apply(&mut late, &Op::Submit);
    let c = carry_all(&late, &c.heads, &mut succ, &old, &seal_heads);
    assert_eq!(c.writes, 1, "the task alone");
    assert_eq!(epoch::effective_claim(&succ), Some(follower));
}

/// An empty queue document (actor 1) and a writer of tasks `a1`, `a2`…
fn new_queue() -> (Automerge, Writer) {
    let mut old = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    queue::create(&mut old, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
    let w = Writer::new("a", 10);
    (old, w)
}

fn rotate(old: &Automerge, prev: &str, successor: &str, epoch: u64, actor: u8) -> Automerge {
    let origin = QueueId::new("automerge:q0");
    let sealer = Claim::new(2, PeerId::new("router"));
    let view = QueueView::read(old).unwrap();
    let mut succ = Automerge::new().with_actor(ActorId::from(vec![actor; 16]));
    epoch::build_successor(
        old,
        &view,
        &mut succ,
        &Rotation {
            origin: &origin,
            prev,
            successor,
            epoch,
            claim: &sealer,
            now_ms: 1_000,
        },
    )
    .unwrap();
    succ
}

fn task_ids(doc: &Automerge) -> Vec<TaskId> {
    QueueView::read(doc)
        .unwrap()
        .tasks()
        .keys()
        .cloned()
        .collect()
}

/// Covers: what a chain absorbed of a sealed document, readable without that document's
/// history. A member that missed the seal (its copy stops before the sealer's last writes)
/// holds a task the chain knew and a task it submitted late: the successor's cover tells them
/// apart by their entries alone, two rotations later (the cover is handed on), and a carry
/// records the late one, with the same change that writes it.
#[test]
fn covers_tell_a_task_the_chain_knew_from_a_late_submit_without_history() {
    let (mut old, mut w) = new_queue();
    w.apply(&mut old, &Op::Submit);
    let known = task_ids(&old)[0].clone();
    // The member's copy, from before the task ran and ended at the sealer.
    let mut away = fork(&old, 2);
    w.apply(&mut old, &Op::Assign { pick: 0 });
    w.apply(&mut old, &Op::Start { pick: 0 });
    w.apply(
        &mut old,
        &Op::Finish {
            pick: 0,
            outcome: 1,
        },
    );
    assert!(
        QueueView::read(&old).unwrap().task(&known).unwrap().state()
            == piecework_queue_doc::TaskState::Succeeded
    );
    let s1 = rotate(&old, "automerge:q0", "automerge:q1", 1, 9);
    // Two rotations on: the cover of the first document is handed on.
    let s2 = rotate(&s1, "automerge:q1", "automerge:q2", 2, 9);
    let mut s3 = rotate(&s2, "automerge:q2", "automerge:q3", 3, 9);
    let cover = epoch::read_cover(&s3, "automerge:q0").expect("handed on");
    assert_eq!(cover.epoch, 0);
    assert!(epoch::read_covers(&s3).contains_key("automerge:q2"));

    let mut late_writer = Writer::new("late", 20);
    late_writer.apply(&mut away, &Op::Submit);
    let late = task_ids(&away).into_iter().find(|t| *t != known).unwrap();
    // The member lacks the sealer's last change: it cannot read the seal heads.
    assert!(epoch::known_heads(&away, &old.get_heads()).is_empty());
    assert!(
        epoch::entry_covered(&away, &cover, &known),
        "the chain knew it"
    );
    assert!(!epoch::entry_covered(&away, &cover, &late), "a late submit");
    assert!(!epoch::entry_carried(&away, &late));

    // Carried: the late task only, and a cover of it with it.
    let carry = |into: &mut Automerge, cover: &epoch::Cover| {
        let dropped = |t: &TaskId| epoch::entry_covered(&away, cover, t);
        epoch::carry_covering(
            &away,
            &[],
            into,
            &dropped,
            None,
            Some(("automerge:q0", 0)),
            usize::MAX,
        )
        .unwrap()
    };
    let c = carry(&mut s3, &cover);
    assert_eq!(c.tasks, 1);
    let ids = task_ids(&s3);
    assert!(ids.contains(&late) && !ids.contains(&known));
    let cover = epoch::read_cover(&s3, "automerge:q0").unwrap();
    assert!(epoch::entry_covered(&away, &cover, &late), "recorded");
    assert!(epoch::entry_carried(&s3, &late));
    // Carrying again changes nothing.
    assert_eq!(carry(&mut s3, &cover).writes, 0);
}

/// A successor hands on covers for `COVER_EPOCHS` epochs, no longer.
#[test]
fn covers_are_handed_on_for_a_bounded_number_of_epochs() {
    let mut doc = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    queue::create(&mut doc, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
    let n = epoch::COVER_EPOCHS + 3;
    for e in 1..=n {
        doc = rotate(
            &doc,
            &format!("automerge:q{}", e - 1),
            &format!("automerge:q{e}"),
            e,
            9,
        );
    }
    // The covers of the `COVER_EPOCHS` documents before it.
    let covers = epoch::read_covers(&doc);
    assert_eq!(covers.len() as u64, epoch::COVER_EPOCHS);
    assert!(!covers.contains_key(&format!("automerge:q{}", n - epoch::COVER_EPOCHS - 1)));
    assert!(covers.contains_key(&format!("automerge:q{}", n - epoch::COVER_EPOCHS)));
    assert!(covers.contains_key(&format!("automerge:q{}", n - 1)));
}

#[test]
fn a_double_seal_has_one_winner_everywhere() {
    let mut old = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    queue::create(&mut old, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
    let mut left = fork(&old, 2);
    let mut right = fork(&old, 3);
    let low = Seal {
        claim: Claim::new(3, PeerId::new("a")),
        successor: "automerge:z".into(),
        epoch: 1,
    };
    let high = Seal {
        claim: Claim::new(3, PeerId::new("b")),
        successor: "automerge:a".into(),
        epoch: 1,
    };
    epoch::seal(&mut left, &low, &[]).unwrap();
    epoch::seal(&mut right, &high, &[]).unwrap();
    left.merge(&mut right.clone()).unwrap();
    right.merge(&mut left.clone()).unwrap();
    for d in [&left, &right] {
        let v = QueueView::read(d).unwrap();
        assert_eq!(v.seals, vec![low.clone(), high.clone()]);
        assert_eq!(epoch::winner(&v.seals), Some(&high));
    }
}

#[test]
fn lineages_order_a_fork_by_its_first_seal_and_descendants_above_ancestors() {
    let link = |e: u64, t: u64, p: &str, d: &str| Link {
        epoch: e,
        claim: Claim::new(t, PeerId::new(p)),
        doc: d.into(),
    };
    let w2 = vec![link(1, 1, "a", "d1"), link(2, 2, "b", "w2")];
    let l2 = vec![link(1, 1, "a", "d1"), link(2, 2, "a", "l2")];
    let l3 = [l2.clone(), vec![link(3, 9, "a", "l3")]].concat();
    let w3 = [w2.clone(), vec![link(3, 2, "b", "w3")]].concat();
    use std::cmp::Ordering::*;
    assert_eq!(epoch::cmp_lineage(&w2, &l2), Greater);
    assert_eq!(
        epoch::cmp_lineage(&w2, &l3),
        Greater,
        "the fork decides, not the depth"
    );
    assert_eq!(epoch::cmp_lineage(&l3, &w3), Less);
    assert_eq!(
        epoch::cmp_lineage(&w3, &w2),
        Greater,
        "a descendant is newer"
    );
    assert_eq!(epoch::cmp_lineage(&[], &w2), Less);
    assert_eq!(epoch::cmp_lineage(&w3, &w3), Equal);
}

#[test]
fn rotation_is_due_when_finished_tasks_outweigh_live_ones() {
    let mut c = piecework_queue_doc::StateCounts::default();
    assert!(!epoch::should_rotate(&c, 4, 10));
    c.succeeded = 40;
    assert!(!epoch::should_rotate(&c, 4, 10));
    c.failed = 1;
    assert!(epoch::should_rotate(&c, 4, 10));
    c.pending = 20;
    assert!(!epoch::should_rotate(&c, 4, 10));
}

/// Two carriers of one sealed document, one of which holds less of it. The one that holds the
/// task's end carries it first, while the successor does not hold the task (the chain had
/// absorbed it, as far as that carrier can tell); the other, whose copy stops before the end,
/// then brings the task in live. The end must already be there: the task stays final, where
/// carrying only the ends of tasks the successor holds showed it running again (the 7-node
/// simulator, seed 5014 of the partitions mix with `--relay-ms 100,300`).
#[test]
fn an_end_carried_before_its_task_keeps_it_final_when_another_carrier_brings_the_task_in() {
    let (old, mut w) = new_queue();
    let seal_heads = old.get_heads();
    let succ = rotate(&old, "automerge:q0", "automerge:q1", 1, 9);
    // After the seal: a late submit, assigned and started; one copy also gets its end.
    let mut late = fork(&old, 2);
    w.apply(&mut late, &Op::Submit);
    w.apply(&mut late, &Op::Assign { pick: 0 });
    w.apply(&mut late, &Op::Start { pick: 0 });
    let behind = fork(&late, 3);
    w.apply(
        &mut late,
        &Op::Finish {
            pick: 0,
            outcome: 1,
        },
    );
    let task = task_ids(&late)[0].clone();
    let final_state = QueueView::read(&late).unwrap().task(&task).unwrap().state();
    assert_eq!(final_state, piecework_queue_doc::TaskState::Succeeded);
    // The first carrier believes the chain absorbed the task: its entry stays behind, and
    // so do its assignment and start, but not its end.
    let mut at_first = fork(&succ, 4);
    let absorbed = |_: &TaskId| true;
    epoch::carry(
        &late,
        &seal_heads,
        &mut at_first,
        &absorbed,
        None,
        usize::MAX,
    )
    .unwrap();
    assert!(QueueView::read(&at_first).unwrap().task(&task).is_none());
    // The second carries what its copy holds: the task, assigned and started.
    let mut at_second = fork(&succ, 5);
    let live = |_: &TaskId| false;
    epoch::carry(
        &behind,
        &seal_heads,
        &mut at_second,
        &live,
        None,
        usize::MAX,
    )
    .unwrap();
    assert_eq!(
        QueueView::read(&at_second)
            .unwrap()
            .task(&task)
            .unwrap()
            .state(),
        piecework_queue_doc::TaskState::Running
    );
    // Merged, in either order: final.
    for (mut a, b) in [
        (at_first.fork(), at_second.fork()),
        (at_second.fork(), at_first.fork()),
    ] {
        a.merge(&mut b.clone()).unwrap();
        let view = QueueView::read(&a).unwrap();
        assert_eq!(view.task(&task).unwrap().state(), final_state);
    }
}

/// A node that moves to another branch writes there the records of the tasks the branch
/// shows live and a document this node holds shows final (its copy stopped before the end):
/// after the write the branch shows it final, as this node saw it. Writing again writes
/// nothing.
#[test]
fn the_records_of_tasks_seen_final_make_them_final_in_a_branch_that_shows_them_live() {
    let (mut old, mut w) = new_queue();
    w.apply(&mut old, &Op::Submit);
    w.apply(&mut old, &Op::Submit);
    w.apply(&mut old, &Op::Assign { pick: 0 });
    w.apply(&mut old, &Op::Start { pick: 0 });
    // The other branch: rotated from a copy that has the task started, not ended.
    let mut branch = rotate(&old, "automerge:q0", "automerge:q1b", 1, 8);
    w.apply(
        &mut old,
        &Op::Finish {
            pick: 0,
            outcome: 1,
        },
    );
    let view = QueueView::read(&old).unwrap();
    let finals: Vec<TaskId> = view
        .tasks()
        .values()
        .filter(|t| t.state().is_final())
        .map(|t| t.id.clone())
        .collect();
    assert_eq!(finals.len(), 1);
    let task = &finals[0];
    assert_eq!(
        QueueView::read(&branch)
            .unwrap()
            .task(task)
            .unwrap()
            .state(),
        piecework_queue_doc::TaskState::Running
    );
    let written = epoch::carry_records(&old, &mut branch, &finals).unwrap();
    assert!(written >= 1, "at least the end");
    let after = QueueView::read(&branch).unwrap();
    assert_eq!(
        after.task(task).unwrap().state(),
        piecework_queue_doc::TaskState::Succeeded
    );
    assert_eq!(after.tasks().len(), 2, "the other task untouched");
    assert_eq!(epoch::carry_records(&old, &mut branch, &finals).unwrap(), 0);
}
