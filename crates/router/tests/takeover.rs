//! The takeover protocol, driven with explicit instants over real queue documents.
//!
//! Each story runs routers of a few peers, each with its own replica of the queue document;
//! `sync` merges replicas the way the network eventually would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::transaction::Transactable;
use automerge::{ActorId, Automerge, AutomergeError, ROOT, ReadDoc};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, MAX_TERM, PeerId, PoolBeat, QueueConfig, QueueId,
    QueueView, RouterBeat, RunningReport, Submission, TaskId, TaskState, WorkerId, WorkerReport,
    queue,
};
use piecework_router::{Action, Event, Rejection, Role, Router};

const QUEUE: &str = "automerge:queue";

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn config() -> QueueConfig {
    QueueConfig {
        heartbeat_ms: 100,
        takeover_after_ms: 500,
        settle_ms: 100,
        pool_heartbeat_ms: 100,
        lease_ms: 1_000,
        ..QueueConfig::default()
    }
}

struct Peer {
    id: PeerId,
    doc: Automerge,
    router: Router,
    beats: Vec<RouterBeat>,
    events: Vec<Event>,
    /// Every assignment this peer's router made.
    assigned: Vec<piecework_queue_doc::Assignment>,
    pool_counter: u64,
    /// The incarnation this peer's pool reports.
    pool_incarnation: u64,
    /// The latest instant this peer was driven at.
    last_now: Instant,
}

impl Peer {
    fn view(&self) -> Arc<QueueView> {
        Arc::new(QueueView::read(&self.doc).unwrap())
    }

    /// Feeds the router a timeout at `now` and carries out its actions until it has none.
    fn tick(&mut self, now: Instant) {
        self.router.handle_timeout(now);
        self.drain(now);
    }

    fn drain(&mut self, now: Instant) {
        self.last_now = now;
        while let Some(a) = self.router.poll_action() {
            match a {
                Action::Claim(c) => {
                    queue::claim_router(&mut self.doc, &c, 0).unwrap();
                    let v = self.view();
                    self.router.handle_view(now, v);
                }
                Action::Assign(list) => {
                    queue::record_assignments(&mut self.doc, &list, 0).unwrap();
                    self.assigned.extend(list);
                    let v = self.view();
                    self.router.handle_view(now, v);
                }
                Action::Beat(b) => self.beats.push(b),
                // These stories hold no schedule.
                Action::Fire(_) => {}
            }
        }
        while let Some(e) = self.router.poll_event() {
            self.events.push(e);
        }
    }

    /// This peer's pool reports `workers` idle workers.
    fn pool_beat(&mut self, workers: u32) -> PoolBeat {
        self.pool_counter += 1;
        PoolBeat {
            peer: self.id.clone(),
            incarnation: self.pool_incarnation,
            counter: self.pool_counter,
            workers: (0..workers)
                .map(|index| WorkerReport {
                    index,
                    running: None,
                })
                .collect(),
            epoch: None,
            draining: false,
            kinds: None,
            resources: Vec::new(),
        }
    }

    fn submit(&mut self, n: u64) -> TaskId {
        let id = TaskId::new(format!("automerge:task{n}"));
        queue::submit(
            &mut self.doc,
            &Submission {
                id: id.clone(),
                kind: "k".into(),
                submitter: self.id.clone(),
                submitted_at: n,
                priority: 0,
                urgent: false,
                max_attempts: None,
                input: None,
                rules: Default::default(),
            },
        )
        .unwrap();
        let v = self.view();
        self.router.handle_view(self.last_now, v);
        id
    }
}

struct Cluster {
    t0: Instant,
    peers: Vec<Peer>,
}

impl Cluster {
    /// `n` peers, all members of one queue with no router yet.
    fn new(n: usize) -> Self {
        Cluster::new_with(n, |_| {})
    }

    /// `n` peers, all members of one queue with no router yet, whose document `edit` changed
    /// (as a faulty peer could) before anyone read it.
    fn new_with(n: usize, edit: impl FnOnce(&mut Automerge)) -> Self {
        // The anchor of virtual time; every instant below is an offset from it.
        #[allow(clippy::disallowed_methods)]
        let t0 = Instant::now();
        let ids: Vec<PeerId> = (0..n).map(|i| PeerId::new(format!("peer-{i}"))).collect();
        let mut first = Automerge::new().with_actor(ActorId::from(vec![0u8; 16]));
        queue::create(&mut first, "q", &config(), &ids[0], 0).unwrap();
        for id in &ids[1..] {
            queue::set_member(&mut first, id, &[], 0).unwrap();
        }
        edit(&mut first);
        let bytes = first.save();
        let peers = ids
            .into_iter()
            .enumerate()
            .map(|(i, id)| {
                let mut doc = Automerge::load(&bytes).unwrap();
                doc.set_actor(ActorId::from(vec![u8::try_from(i).unwrap() + 1; 16]));
                let mut router = Router::new(QueueId::new(QUEUE), id.clone(), t0);
                router.handle_view(t0, Arc::new(QueueView::read(&doc).unwrap()));
                Peer {
                    id,
                    doc,
                    router,
                    beats: vec![],
                    events: vec![],
                    assigned: vec![],
                    pool_counter: 0,
                    pool_incarnation: 1,
                    last_now: t0,
                }
            })
            .collect();
        Cluster { t0, peers }
    }

    fn at(&self, offset_ms: u64) -> Instant {
        self.t0 + ms(offset_ms)
    }

    /// Merges replicas `a` and `b` and hands both routers the new view.
    fn sync(&mut self, a: usize, b: usize, now: Instant) {
        let mut other = self.peers[b].doc.fork();
        self.peers[a].doc.merge(&mut other).unwrap();
        let mut back = self.peers[a].doc.fork();
        self.peers[b].doc.merge(&mut back).unwrap();
        for i in [a, b] {
            let v = self.peers[i].view();
            self.peers[i].router.handle_view(now, v);
            self.peers[i].drain(now);
        }
    }

    /// Delivers every beat `from` has sent since the last call to all other routers.
    fn deliver_beats(&mut self, from: usize, now: Instant) {
        let beats = std::mem::take(&mut self.peers[from].beats);
        for (i, p) in self.peers.iter_mut().enumerate() {
            if i != from {
                for b in &beats {
                    p.router.handle_router_beat(now, b);
                }
                p.drain(now);
            }
        }
    }

    fn tick(&mut self, i: usize, offset_ms: u64) {
        let now = self.at(offset_ms);
        self.peers[i].tick(now);
    }

    /// Which of `among` are active.
    fn active(&self, among: &[usize]) -> Vec<usize> {
        among
            .iter()
            .copied()
            .filter(|&i| self.peers[i].router.is_active())
            .collect()
    }

    /// Elects peer `i` on a fresh queue (no router named yet) and syncs everyone.
    fn elect_first(&mut self, i: usize) {
        let t = self.at(0);
        self.peers[i].tick(t);
        let t = self.at(100);
        self.peers[i].tick(t);
        assert!(self.peers[i].router.is_active());
        for j in 0..self.peers.len() {
            if j != i {
                self.sync(i, j, t);
            }
        }
    }
}

/// Story 1: A fresh queue: the first router claims term 1 at once, waits `settle`, rechecks and
/// becomes active; it beats at once, and routes only one pool heartbeat later.
#[test]
fn first_election() {
    let mut c = Cluster::new(1);
    let p = &mut c.peers[0];
    p.tick(c.t0);
    assert!(matches!(p.router.role(), Role::Claiming { claim, .. } if claim.term == 1));
    assert_eq!(p.events, vec![Event::Claimed(Claim::new(1, p.id.clone()))]);
    assert_eq!(
        p.router.poll_timeout(),
        Some(c.t0 + ms(100)),
        "recheck after settle"
    );

    p.tick(c.t0 + ms(99));
    assert!(!p.router.is_active(), "not before settle");
    p.tick(c.t0 + ms(100));
    assert!(p.router.is_active());
    assert_eq!(
        p.events.last(),
        Some(&Event::BecameActive(Claim::new(1, p.id.clone())))
    );
    assert_eq!(p.beats.len(), 1, "the first heartbeat goes out at once");

    // Work arrives, and a pool with two idle workers.
    let t1 = p.submit(1);
    let t2 = p.submit(2);
    p.submit(3);
    let beat = p.pool_beat(2);
    p.router.handle_pool_beat(c.t0 + ms(120), &beat);
    let v = p.view();
    p.router.handle_view(c.t0 + ms(120), v);
    p.tick(c.t0 + ms(150));
    assert!(
        p.view()
            .tasks()
            .values()
            .all(|t| t.state() == TaskState::Pending),
        "waits one pool heartbeat"
    );
    p.tick(c.t0 + ms(200));
    let view = p.view();
    assert_eq!(
        view.tasks()[&t1].state(),
        TaskState::Assigned,
        "oldest first"
    );
    assert_eq!(view.tasks()[&t2].state(), TaskState::Assigned);
    assert_eq!(view.counts().pending, 1, "two workers, two assignments");
    assert_eq!(
        view.tasks()[&t1].attempts[0].id.claim,
        Claim::new(1, p.id.clone())
    );
}

/// Story 2: Followers that keep hearing the router never claim; once it goes silent for
/// `takeover_after`, one takes over with the next term.
#[test]
fn takeover_after_silence() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    for k in 1..=20 {
        let now = c.at(100 + k * 100);
        c.peers[0].tick(now);
        c.deliver_beats(0, now);
        c.peers[1].tick(now);
    }
    assert!(
        !c.peers[1]
            .events
            .iter()
            .any(|e| matches!(e, Event::Claimed(_))),
        "no claim while beats arrive"
    );
    // Peer 0 dies at 2.1 s; peer 1 last heard it then.
    let dead_at = 2_100;
    c.tick(1, dead_at + 499);
    assert_eq!(c.peers[1].router.role(), &Role::Follower);
    assert_eq!(c.peers[1].router.poll_timeout(), Some(c.at(dead_at + 500)));
    c.tick(1, dead_at + 500);
    assert!(matches!(c.peers[1].router.role(), Role::Claiming { claim, .. } if claim.term == 2));
    c.tick(1, dead_at + 600);
    assert!(c.peers[1].router.is_active());
    assert_eq!(
        c.peers[1].view().router,
        Some(Claim::new(2, c.peers[1].id.clone()))
    );
}

/// Story 3: Two followers claim at once. If their claims meet within `settle`, only the greater
/// becomes active; if they meet later, the lesser steps down as soon as it sees the other.
#[test]
fn two_concurrent_claimants_leave_exactly_one_active() {
    for meet_within_settle in [true, false] {
        let mut c = Cluster::new(3);
        c.elect_first(0);
        // Peer 0 dies (it is driven no more); 1 and 2 both time out and claim term 2.
        c.tick(1, 600);
        c.tick(2, 600);
        for i in [1, 2] {
            assert!(
                matches!(c.peers[i].router.role(), Role::Claiming { claim, .. } if claim.term == 2)
            );
        }
        if meet_within_settle {
            c.sync(1, 2, c.at(650));
        }
        c.tick(1, 700);
        c.tick(2, 700);
        if !meet_within_settle {
            assert_eq!(
                c.active(&[1, 2]),
                vec![1, 2],
                "without the sync both recheck their own replica"
            );
            c.sync(1, 2, c.at(750));
        }
        assert_eq!(
            c.active(&[1, 2]),
            vec![2],
            "peer-2 > peer-1 at the same term"
        );
        let loser = &c.peers[1].events;
        assert!(
            loser
                .iter()
                .any(|e| matches!(e, Event::ClaimLost { .. } | Event::SteppedDown { .. })),
            "{loser:?}"
        );
        assert_eq!(c.peers[1].view().router, c.peers[2].view().router);
    }
}

/// Story 4: An active router steps down on the first view that names a greater claim, and stops
/// beating and routing at once.
#[test]
fn step_down_on_a_document_change() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    // Peer 1 has heard nothing (a partition) and takes over on its side.
    c.tick(1, 600);
    c.tick(1, 700);
    assert!(c.peers[1].router.is_active());
    c.peers[0].submit(1);
    let beats_before = c.peers[0].beats.len();
    c.sync(0, 1, c.at(800));
    assert_eq!(c.active(&[0, 1]), vec![1]);
    assert!(matches!(
        c.peers[0].events.last(),
        Some(Event::SteppedDown { by, .. }) if by == &Claim::new(2, c.peers[1].id.clone())
    ));
    let beat = c.peers[0].pool_beat(4);
    let t = c.at(850);
    c.peers[0].router.handle_pool_beat(t, &beat);
    c.tick(0, 900);
    assert_eq!(
        c.peers[0].beats.len(),
        beats_before,
        "no heartbeat after stepping down"
    );
    assert_eq!(
        c.peers[0].view().counts().assigned,
        0,
        "no assignment after stepping down"
    );
}

/// Story 5: Only the document deposes a router. A heartbeat under a greater claim the
/// document does not hold leaves the active router active and does not raise the term the
/// next claim takes; it counts as a sign of life once per claim; stale or replayed
/// heartbeats are ignored. The same claim, once in the document, deposes.
#[test]
fn only_the_document_deposes_a_router() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    let higher = RouterBeat {
        queue: QueueId::new(QUEUE),
        claim: Claim::new(2, c.peers[1].id.clone()),
        counter: 1,
        epoch: None,
        handover: None,
    };
    let lower = RouterBeat {
        queue: QueueId::new(QUEUE),
        claim: Claim::new(0, c.peers[1].id.clone()),
        counter: 99,
        epoch: None,
        handover: None,
    };
    let t = c.at(150);
    c.peers[0].router.handle_router_beat(t, &lower);
    c.peers[0].drain(t);
    assert!(
        c.peers[0].router.is_active(),
        "a lower claim does not depose"
    );
    let t = c.at(160);
    c.peers[0].router.handle_router_beat(t, &higher);
    c.peers[0].drain(t);
    assert!(
        c.peers[0].router.is_active(),
        "a claim only a heartbeat shows does not depose: {:?}",
        c.peers[0].router.role()
    );
    // Written into the document, the same claim deposes.
    queue::claim_router(&mut c.peers[0].doc, &higher.claim, 0).unwrap();
    let t = c.at(170);
    let v = c.peers[0].view();
    c.peers[0].router.handle_view(t, v);
    c.peers[0].drain(t);
    assert_eq!(c.peers[0].router.role(), &Role::Follower);

    // A follower counts a heartbeat under a claim its document does not hold once: its
    // silence starts over then, not at the replay nor at the next beat of that claim.
    let mut f = Cluster::new(2);
    f.elect_first(0);
    let t = f.at(100);
    f.peers[1].router.handle_router_beat(t, &higher);
    let t = f.at(450);
    f.peers[1].router.handle_router_beat(t, &higher);
    let again = RouterBeat {
        counter: 2,
        ..higher.clone()
    };
    f.peers[1].router.handle_router_beat(t, &again);
    f.tick(1, 600);
    assert!(
        matches!(f.peers[1].router.role(), Role::Claiming { claim, .. } if claim.term == 2),
        "the claim follows the document's term, 500 ms after the first beat: {:?}",
        f.peers[1].router.role()
    );
}

/// A member's heartbeat at the term bound ([`MAX_TERM`]) stops nothing: the active router
/// stays active and routes, and a follower whose router falls silent claims the term after
/// the document's, as if the heartbeat had never been sent. (Before, the active router
/// stepped down and every router reported `TermsExhausted` from then on.)
#[test]
fn a_members_heartbeat_at_the_term_bound_stops_nothing() {
    let mut c = Cluster::new(3);
    c.elect_first(0);
    let bound = RouterBeat {
        queue: QueueId::new(QUEUE),
        claim: Claim::new(MAX_TERM, c.peers[2].id.clone()),
        counter: 1,
        epoch: None,
        handover: None,
    };
    let t = c.at(150);
    for p in 0..2 {
        c.peers[p].router.handle_router_beat(t, &bound);
        c.peers[p].drain(t);
    }
    assert!(
        c.peers[0].router.is_active(),
        "{:?}",
        c.peers[0].router.role()
    );
    let task = c.peers[0].submit(1);
    let b1 = c.peers[1].pool_beat(1);
    let t = c.at(200);
    c.peers[0].router.handle_pool_beat(t, &b1);
    c.peers[0].tick(t);
    let assigned = c.peers[0].view().tasks()[&task].attempts.len();
    assert_eq!(assigned, 1, "the active router still routes");
    // Peer 0 falls silent; peer 1 takes over at the next term, not at the bound.
    c.tick(1, 150 + 500);
    assert!(
        matches!(c.peers[1].router.role(), Role::Claiming { claim, .. } if claim.term == 2),
        "{:?}, events {:?}",
        c.peers[1].router.role(),
        c.peers[1].events
    );
    assert!(
        !c.peers[1]
            .events
            .iter()
            .any(|e| matches!(e, Event::TermsExhausted { .. })),
        "{:?}",
        c.peers[1].events
    );
}

/// Story 5b: After a member's heartbeat at the term bound (a claim the document does not
/// hold), the effective router's own heartbeats still count: the followers hear it, and none
/// takes over while it beats. Found by the simulator's `byzantine` mix: beats were told stale
/// by the greatest claim ever heard, so the bound's claim hid the effective router's and every
/// follower took over once per `takeover_after` (60 takeovers in four calm seeds).
#[test]
fn the_effective_routers_beats_count_after_a_heartbeat_at_the_term_bound() {
    let mut c = Cluster::new(3);
    c.elect_first(0);
    let bound = RouterBeat {
        queue: QueueId::new(QUEUE),
        claim: Claim::new(MAX_TERM, c.peers[2].id.clone()),
        counter: 1,
        epoch: None,
        handover: None,
    };
    let t = c.at(150);
    c.peers[1].router.handle_router_beat(t, &bound);
    c.peers[1].drain(t);
    // Peer 0 beats every 100 ms for three times `takeover_after`.
    for k in 2..=15 {
        let now = c.at(k * 100);
        c.peers[0].tick(now);
        c.deliver_beats(0, now);
        c.peers[1].tick(now);
        assert!(
            c.peers[1].router.role() == &Role::Follower,
            "at {} ms peer 1 is {:?}, events {:?}",
            k * 100,
            c.peers[1].router.role(),
            c.peers[1].events
        );
    }
    assert!(c.peers[0].router.is_active());
}

/// Story 6: A task whose worker's pool goes silent for `lease` is routed again, to a live worker,
/// with the next attempt number.
#[test]
fn lease_expiry_routes_again() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    let task = c.peers[0].submit(1);
    // Only peer 1's pool is around at first.
    let b1 = c.peers[1].pool_beat(1);
    let t = c.at(150);
    c.peers[0].router.handle_pool_beat(t, &b1);
    c.tick(0, 200);
    let v = c.peers[0].view();
    let a = &v.tasks()[&task].attempts[0];
    assert_eq!((a.id.n, a.worker.peer.clone()), (1, c.peers[1].id.clone()));
    // Peer 1 falls silent; peer 0's own pool keeps beating.
    for k in 0..12 {
        let now = c.at(300 + k * 100);
        let b0 = c.peers[0].pool_beat(1);
        c.peers[0].router.handle_pool_beat(now, &b0);
        c.peers[0].tick(now);
    }
    let view = c.peers[0].view();
    let t = &view.tasks()[&task];
    assert_eq!(t.last_n(), 2, "routed again after the lease");
    let again = t.current_attempts().next().unwrap();
    assert_eq!(again.worker.peer, c.peers[0].id);
}

/// Story 7: An assignment names the incarnation of the pool whose heartbeat it was based on, so
/// that a restarted pool can tell work meant for its earlier life.
#[test]
fn assignments_carry_the_incarnation_of_the_pool_beat() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    let t1 = c.peers[0].submit(1);
    let t2 = c.peers[0].submit(2);
    c.peers[1].pool_incarnation = 7;
    let b1 = c.peers[1].pool_beat(1);
    let t = c.at(150);
    c.peers[0].router.handle_pool_beat(t, &b1);
    c.tick(0, 200);
    let assigned = &c.peers[0].assigned;
    assert_eq!(assigned.len(), 1, "{assigned:?}");
    assert_eq!((&assigned[0].task, assigned[0].incarnation), (&t1, 7));
    let view = c.peers[0].view();
    assert_eq!(view.tasks()[&t1].attempts[0].pool_incarnation, Some(7));
    // The pool restarts: the next assignment is addressed to its new incarnation.
    c.peers[1].pool_incarnation = 8;
    c.peers[1].pool_counter = 0;
    let b1 = c.peers[1].pool_beat(2);
    let t = c.at(250);
    c.peers[0].router.handle_pool_beat(t, &b1);
    c.tick(0, 300);
    let assigned = &c.peers[0].assigned;
    assert_eq!(assigned.len(), 2, "{assigned:?}");
    assert_eq!((&assigned[1].task, assigned[1].incarnation), (&t2, 8));
}

/// Story 8: the worker could not get a task's input (no reachable member had its document):
/// the attempt ends `unavailable` and the task waits, visible and unrouted, instead of being
/// refused and routed again every few seconds forever. When a member holding the document
/// marks the input available, it is routed again.
#[test]
fn a_task_whose_input_is_unavailable_waits_unrouted_until_marked_available() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    let task = c.peers[0].submit(1);
    let b = c.peers[1].pool_beat(1);
    let t = c.at(150);
    c.peers[0].router.handle_pool_beat(t, &b);
    c.tick(0, 200);
    assert_eq!(c.peers[0].assigned.len(), 1);
    let a = c.peers[0].assigned[0].clone();
    queue::record_finish(
        &mut c.peers[0].doc,
        &task,
        &a.attempt,
        &a.worker,
        AttemptOutcome::Unavailable,
        Some("no reachable member has the task document"),
        0,
    )
    .unwrap();
    let v = c.peers[0].view();
    assert_eq!(v.tasks()[&task].state(), TaskState::InputUnavailable);
    assert_eq!(v.counts().input_unavailable, 1);
    let now = c.at(250);
    c.peers[0].router.handle_view(now, v);
    // A minute of idle pools: nothing is routed.
    for ms in (300..60_000).step_by(100) {
        let b = c.peers[1].pool_beat(1);
        let t = c.at(ms);
        c.peers[0].router.handle_pool_beat(t, &b);
        c.tick(0, ms);
    }
    assert_eq!(
        c.peers[0].assigned.len(),
        1,
        "an unavailable input is not routed"
    );
    // The submitter, which holds the document, marks it available: routed again.
    queue::mark_input_available(&mut c.peers[0].doc, &task, 1).unwrap();
    let v = c.peers[0].view();
    assert_eq!(v.tasks()[&task].state(), TaskState::Pending);
    let now = c.at(60_000);
    c.peers[0].router.handle_view(now, v);
    for ms in (60_100..70_000).step_by(100) {
        let b = c.peers[1].pool_beat(1);
        let t = c.at(ms);
        c.peers[0].router.handle_pool_beat(t, &b);
        c.tick(0, ms);
    }
    let assigned = &c.peers[0].assigned;
    assert_eq!(assigned.len(), 2, "{assigned:?}");
    assert_eq!(assigned[1].attempt.n, 2);
}

/// Overwrites every numeric configuration value with `v`, straight into the document.
fn config_values(doc: &mut Automerge, v: u64) {
    let config = match doc.get(ROOT, "config").unwrap() {
        Some((_, id)) => id,
        None => panic!("no config"),
    };
    doc.transact::<_, _, AutomergeError>(|tx| {
        for k in [
            "heartbeat_ms",
            "takeover_after_ms",
            "settle_ms",
            "pool_heartbeat_ms",
            "lease_ms",
            "max_attempts",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
            "concurrency",
            "rate_interval_ms",
        ] {
            tx.put(&config, k, v)?;
        }
        Ok(())
    })
    .unwrap();
}

/// Story 8: A queue document whose configuration a faulty peer set to `u64::MAX` everywhere
/// reads clamped, and a router driven with it claims, settles, becomes active, beats and
/// routes without overflowing an instant.
#[test]
fn a_config_of_u64_max_everywhere_does_not_panic() {
    let mut c = Cluster::new_with(2, |doc| config_values(doc, u64::MAX));
    let config = c.peers[0].view().config.clone();
    assert_eq!(config.settle_ms, QueueConfig::MAX_SETTLE_MS);
    assert_eq!(config.validate(), Ok(()));
    let p = &mut c.peers[0];
    p.tick(c.t0);
    assert!(matches!(p.router.role(), Role::Claiming { .. }));
    let recheck = p.router.poll_timeout().unwrap();
    assert_eq!(recheck, c.t0 + ms(QueueConfig::MAX_SETTLE_MS));
    p.tick(recheck);
    assert!(p.router.is_active());
    let task = p.submit(1);
    let beat = p.pool_beat(1);
    p.router.handle_pool_beat(recheck, &beat);
    // It routes once the rate interval (a day, at most) has passed since it became active.
    let mut now = recheck;
    for _ in 0..2_000 {
        let next = p.router.poll_timeout().unwrap();
        assert!(next > now, "no busy loop");
        now = next;
        let beat = p.pool_beat(1);
        p.router.handle_pool_beat(now, &beat);
        p.tick(now);
        if !p.assigned.is_empty() {
            break;
        }
    }
    assert_eq!(now, recheck + ms(QueueConfig::MAX_RATE_INTERVAL_MS));
    assert_eq!(p.view().tasks()[&task].state(), TaskState::Assigned);
    // A follower that learns of the claim waits the clamped takeover delay.
    c.sync(0, 1, now);
    assert_eq!(
        c.peers[1].router.poll_timeout(),
        Some(now + ms(QueueConfig::MAX_TAKEOVER_AFTER_MS))
    );
}

/// Story 9: A heartbeat with a term of `u64::MAX` is ignored: it deposes nobody, and the next
/// claim neither overflows nor wraps.
#[test]
fn a_heartbeat_with_an_impossible_term_is_ignored() {
    let mut c = Cluster::new(3);
    c.elect_first(0);
    let hostile = RouterBeat {
        queue: QueueId::new(QUEUE),
        claim: Claim::new(u64::MAX, c.peers[2].id.clone()),
        counter: 1,
        epoch: None,
        handover: None,
    };
    let t = c.at(150);
    for i in [0, 1] {
        c.peers[i].router.handle_router_beat(t, &hostile);
        c.peers[i].drain(t);
        assert!(
            c.peers[i].events.contains(&Event::RejectedBeat {
                claim: hostile.claim.clone(),
                reason: Rejection::TermTooLarge,
            }),
            "{:?}",
            c.peers[i].events
        );
    }
    assert!(c.peers[0].router.is_active(), "it deposes nobody");
    // Peer 0 dies; peer 1 takes over with the next term after the real one.
    c.tick(1, 600);
    assert!(
        matches!(c.peers[1].router.role(), Role::Claiming { claim, .. } if claim.term == 2),
        "{:?}",
        c.peers[1].router.role()
    );
    c.tick(1, 700);
    assert!(c.peers[1].router.is_active());
}

/// Story 10: A claim at `MAX_TERM` written straight into the router record (no honest
/// router could: terms rise one at a time from a claim that counts) does not count: the
/// router claims term 1 as if it were not there. (Before, every router reported
/// `TermsExhausted` from then on.)
#[test]
fn a_forged_claim_at_the_term_bound_does_not_stop_claims() {
    let mut c = Cluster::new_with(1, |doc| {
        doc.transact::<_, _, AutomergeError>(|tx| {
            let r = tx.put_object(ROOT, "router", automerge::ObjType::Map)?;
            tx.put(&r, "term", MAX_TERM)?;
            tx.put(&r, "peer", "ghost")?;
            Ok(())
        })
        .unwrap();
    });
    let p = &mut c.peers[0];
    assert_eq!(p.view().router, None);
    assert_eq!(p.view().malformed, 1);
    p.tick(c.t0 + ms(500));
    assert!(
        matches!(p.router.role(), Role::Claiming { claim, .. } if claim.term == 1),
        "{:?}, events {:?}",
        p.router.role(),
        p.events
    );
}

/// Story 11: An attempt this router learns of late (it arrives with a healed partition),
/// assigned to a pool it has not heard from while they were apart, is not routed again at
/// once: its lease runs from when the router first saw it. Found by simulator seed 28, where
/// the router re-ran a task the pool on the other side had just started.
#[test]
fn an_attempt_learned_late_gets_a_whole_lease_before_it_is_routed_again() {
    let mut c = Cluster::new(3);
    c.elect_first(0);
    let task = c.peers[0].submit(1);
    let t = c.at(200);
    c.sync(0, 2, t);
    // On peer 2's side of a partition, the task is assigned to peer 2's worker.
    let attempt = piecework_queue_doc::AttemptId {
        n: 1,
        claim: Claim::new(1, c.peers[0].id.clone()),
    };
    let a = piecework_queue_doc::Assignment {
        task: task.clone(),
        attempt,
        worker: piecework_queue_doc::WorkerId::new(c.peers[2].id.clone(), 0),
        incarnation: 1,
    };
    queue::record_assignments(&mut c.peers[2].doc, &[a], 4_900).unwrap();
    // The partition heals at 5 s: peer 0 has not heard peer 2's pool for longer than a lease.
    let heal = c.at(5_000);
    c.sync(0, 2, heal);
    for k in 0..10 {
        let now = c.at(5_000 + k * 100);
        let b0 = c.peers[0].pool_beat(1);
        c.peers[0].router.handle_pool_beat(now, &b0);
        c.peers[0].tick(now);
        assert_eq!(
            c.peers[0].view().tasks()[&task].last_n(),
            1,
            "routed again {} ms after it was first seen",
            k * 100
        );
    }
    // Peer 2's pool stays silent for a whole lease after the heal: the task is routed again.
    for k in 10..13 {
        let now = c.at(5_000 + k * 100);
        let b0 = c.peers[0].pool_beat(1);
        c.peers[0].router.handle_pool_beat(now, &b0);
        c.peers[0].tick(now);
    }
    let view = c.peers[0].view();
    assert_eq!(
        view.tasks()[&task].last_n(),
        2,
        "routed again after the lease"
    );
}

/// Story 12: An active router that hears a pool again after a silence longer than
/// `takeover_after` (the pool's side may have elected a router of its own meanwhile) holds its
/// assignments for `heartbeat + settle`, time for that side's heartbeat or claim to arrive.
/// Found by simulator seed 31: a router deposed during a partition assigned a task right after
/// the heal, before it heard of its successor, which assigned the same task too.
#[test]
fn a_router_that_hears_a_lost_pool_again_holds_its_assignments_briefly() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    let b1 = c.peers[1].pool_beat(1);
    let t = c.at(150);
    c.peers[0].router.handle_pool_beat(t, &b1);
    // Peer 1 falls silent for longer than takeover_after; a task arrives meanwhile.
    let task = c.peers[0].submit(1);
    let back = c.at(5_000);
    let b1 = c.peers[1].pool_beat(1);
    c.peers[0].router.handle_pool_beat(back, &b1);
    c.peers[0].tick(back);
    assert!(
        c.peers[0].events.contains(&Event::Reunited {
            peer: c.peers[1].id.clone()
        }),
        "{:?}",
        c.peers[0].events
    );
    assert_eq!(c.peers[0].view().tasks()[&task].last_n(), 0, "held");
    // Heartbeats go on; routing waits until heartbeat + settle after the reunion.
    loop {
        let due = c.peers[0].router.poll_timeout().unwrap();
        c.peers[0].tick(due);
        let routed = c.peers[0].view().tasks()[&task].last_n() == 1;
        assert_eq!(routed, due >= c.at(5_200), "at {:?}", due - c.at(5_000));
        if routed {
            break;
        }
    }
}

/// Story 13: Routers on both sides of a partition ran one task. On this router's side its run
/// (attempt 1) goes on; on the other side a router at the same term ran the task twice
/// (attempts 1 and 2), and both runs failed. After the heal the task's current attempts (number
/// 2) have failed, so it is pending again, waiting out its retry delay, while this router's
/// own run of it is still in flight: that run counts against the concurrency limit until it
/// ends. Found by simulator seed 212 (7 nodes), where the router assigned another task beside
/// it under a limit of 1.
#[test]
fn an_earlier_attempt_still_running_counts_against_the_limit() {
    let mut c = Cluster::new_with(3, |doc| {
        let config = match doc.get(ROOT, "config").unwrap() {
            Some((_, id)) => id,
            None => panic!("no config"),
        };
        doc.transact::<_, _, AutomergeError>(|tx| tx.put(&config, "concurrency", 1u64))
            .unwrap();
    });
    c.elect_first(2);
    let first = c.peers[2].submit(1);
    let second = c.peers[2].submit(2);
    let t = c.at(120);
    c.sync(0, 2, t);
    // Peer 1's pool (two workers) beats to the router, peer 2: the first task goes to one of
    // its workers and starts there; the second waits for the limit.
    let b1 = c.peers[1].pool_beat(2);
    let t = c.at(150);
    c.peers[2].router.handle_pool_beat(t, &b1);
    c.tick(2, 200);
    assert_eq!(c.peers[2].assigned.len(), 1, "{:?}", c.peers[2].assigned);
    let mine = c.peers[2].assigned[0].clone();
    assert_eq!(mine.task, first);
    let doc = &mut c.peers[2].doc;
    queue::record_start(doc, &first, &mine.attempt, &mine.worker, 1, 0).unwrap();
    // Meanwhile, on peer 0's side of a partition, a router at the same term (a smaller claim)
    // ran the first task twice on peer 0's worker; both runs failed.
    let other = Claim::new(1, c.peers[0].id.clone());
    for n in 1..=2 {
        let a = Assignment {
            task: first.clone(),
            attempt: AttemptId {
                n,
                claim: other.clone(),
            },
            worker: WorkerId::new(c.peers[0].id.clone(), 0),
            incarnation: 1,
        };
        let doc = &mut c.peers[0].doc;
        queue::record_assignments(doc, std::slice::from_ref(&a), 0).unwrap();
        queue::record_start(doc, &first, &a.attempt, &a.worker, 1, 0).unwrap();
        let failed = AttemptOutcome::Failed;
        queue::record_finish(doc, &first, &a.attempt, &a.worker, failed, Some("boom"), 0).unwrap();
    }
    // The partition heals.
    let heal = c.at(300);
    c.sync(0, 2, heal);
    let view = c.peers[2].view();
    let task = &view.tasks()[&first];
    assert_eq!(
        task.state(),
        TaskState::Pending,
        "its current attempts failed"
    );
    assert!(task.attempt(&mine.attempt).is_some_and(|a| a.is_open()));
    // Peer 1's pool keeps beating, one worker running the router's attempt, the other idle:
    // nothing more is routed while that run goes on.
    let running = |p: &mut Peer| {
        let mut beat = p.pool_beat(2);
        beat.workers[usize::try_from(mine.worker.index).unwrap()].running = Some(RunningReport {
            queue: QueueId::new(QUEUE),
            task: first.clone(),
            attempt: mine.attempt.clone(),
            overdue: false,
            progress: None,
        });
        beat
    };
    for ms in (400..1_000).step_by(100) {
        let now = c.at(ms);
        let beat = running(&mut c.peers[1]);
        c.peers[2].router.handle_pool_beat(now, &beat);
        c.tick(2, ms);
    }
    assert_eq!(
        c.peers[2].assigned.len(),
        1,
        "a second run beside the first, under a limit of 1: {:?}",
        c.peers[2].assigned
    );
    // The run ends (it succeeds): the second task is routed.
    let doc = &mut c.peers[2].doc;
    let ok = AttemptOutcome::Succeeded;
    queue::record_finish(doc, &first, &mine.attempt, &mine.worker, ok, None, 0).unwrap();
    let (v, now) = (c.peers[2].view(), c.at(1_000));
    c.peers[2].router.handle_view(now, v);
    for ms in (1_000..1_300).step_by(100) {
        let now = c.at(ms);
        let beat = c.peers[1].pool_beat(2);
        c.peers[2].router.handle_pool_beat(now, &beat);
        c.tick(2, ms);
    }
    let assigned = &c.peers[2].assigned;
    assert_eq!(assigned.len(), 2, "{assigned:?}");
    assert_eq!(assigned[1].task, second);
}

/// Story 14: A node that starts (or restarts) counts its silence from the later of the live
/// router's last heartbeat and its own first connection to a member of the queue. Its start
/// took longer than `takeover_after` (it loaded a long history before it reached anyone): it
/// does not claim the moment it reaches a member, but gives the live router's heartbeats
/// `takeover_after` to arrive; the first one that does keeps it a follower.
#[test]
fn a_node_that_reaches_a_member_late_waits_for_the_routers_heartbeat() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    // Peer 1 (its router created at 0) reaches peer 0 only at 800 ms, past `takeover_after`
    // (500 ms) since its start.
    let reached = c.at(800);
    c.peers[1].router.handle_member_connected(reached);
    c.tick(1, 800);
    c.tick(1, 1_200);
    assert_eq!(
        c.peers[1].router.role(),
        &Role::Follower,
        "claimed too early"
    );
    // The router's heartbeat arrives: it stays a follower for another `takeover_after`.
    c.tick(0, 1_250);
    c.deliver_beats(0, c.at(1_250));
    c.tick(1, 1_700);
    assert_eq!(c.peers[1].router.role(), &Role::Follower);
    // A second connection (a reconnect) does not restart the silence again: with the router
    // now silent, the follower claims `takeover_after` after the last heartbeat.
    let again = c.at(1_740);
    c.peers[1].router.handle_member_connected(again);
    c.tick(1, 1_760);
    assert!(
        matches!(c.peers[1].router.role(), Role::Claiming { claim, .. } if claim.term == 2),
        "{:?}",
        c.peers[1].router.role()
    );
}

/// Story 15: A node that reaches no member still claims `takeover_after` after it started: an
/// isolated node serves its own side.
#[test]
fn an_isolated_node_claims_after_takeover_after_since_its_start() {
    let mut c = Cluster::new(2);
    c.elect_first(0);
    // Peer 1 restarts at 1,000 ms (a new router on its stored document) and reaches nobody.
    let start = c.at(1_000);
    let p = &mut c.peers[1];
    p.router = Router::new(QueueId::new(QUEUE), p.id.clone(), start);
    let v = p.view();
    p.router.handle_view(start, v);
    c.tick(1, 1_499);
    assert_eq!(c.peers[1].router.role(), &Role::Follower);
    c.tick(1, 1_500);
    assert!(matches!(
        c.peers[1].router.role(),
        Role::Claiming { claim, .. } if claim.term == 2
    ));
}

/// Story 16: A planned stop hands the router role over. The active router stops: it routes
/// nothing more and beats at once, naming as successor the member whose pool it heard last
/// (and not the one whose node is stopping too). The successor claims at once, without
/// waiting `takeover_after`; the other follower stays a follower. Once the successor's claim is
/// in the stopped router's view, it beats no more.
#[test]
fn a_stopping_router_hands_its_role_to_the_member_heard_last() {
    let mut c = Cluster::new(4);
    c.elect_first(0);
    let t = c.at(150);
    // Peer 1's pool was heard first, peer 2's last; peer 3's node is stopping as well.
    let (b1, b2) = (c.peers[1].pool_beat(1), c.peers[2].pool_beat(1));
    let mut b3 = c.peers[3].pool_beat(1);
    b3.draining = true;
    c.peers[0].router.handle_pool_beat(t, &b1);
    let at = c.at(160);
    c.peers[0].router.handle_pool_beat(at, &b3);
    let at = c.at(170);
    c.peers[0].router.handle_pool_beat(at, &b2);
    c.tick(0, 180);
    c.deliver_beats(0, c.at(180));
    let stop = c.at(200);
    c.peers[0].router.stop(stop);
    c.peers[0].drain(stop);
    assert!(c.peers[0].events.iter().any(|e| matches!(
        e,
        Event::Stopped { claim: Some(claim), to: Some(to) } if claim.term == 1 && *to == c.peers[2].id
    )));
    c.tick(0, 200);
    let beat = c.peers[0].beats.last().cloned().expect("a beat at once");
    assert_eq!(beat.handover.as_ref(), Some(&c.peers[2].id));
    c.deliver_beats(0, c.at(205));
    // The successor claims at once; the others wait.
    c.tick(2, 205);
    c.tick(1, 205);
    assert!(matches!(
        c.peers[2].router.role(),
        Role::Claiming { claim, .. } if claim.term == 2
    ));
    assert!(
        c.peers[2]
            .events
            .iter()
            .any(|e| matches!(e, Event::HandedOver { .. }))
    );
    assert_eq!(c.peers[1].router.role(), &Role::Follower);
    // The stopped router never claims nor routes again, whatever it hears.
    c.peers[0].submit(1);
    let beat = c.peers[1].pool_beat(2);
    let at = c.at(250);
    c.peers[0].router.handle_pool_beat(at, &beat);
    c.tick(0, 300);
    assert!(c.peers[0].assigned.is_empty());
    // The successor's claim reaches the stopped router: it stops beating.
    c.sync(0, 2, c.at(310));
    c.peers[0].beats.clear();
    c.tick(0, 400);
    c.tick(0, 2_000);
    assert!(c.peers[0].beats.is_empty(), "{:?}", c.peers[0].beats);
    assert!(matches!(
        c.peers[0].router.role(),
        Role::Stopped { handing: None }
    ));
    // The successor becomes active `settle` after its claim.
    c.tick(2, 305);
    assert!(c.peers[2].router.is_active());
}

/// A router that stops at the end of a long turn (a big batch on a loaded machine) may not
/// have read its members' latest pool beats: a member heard within its lease is named
/// (before, only one heard within three pool heartbeats was, and a stop under load named
/// nobody: the others waited `takeover_after`). Unheard for longer than a lease, it is not
/// preferred: the first member of the view that routes is named instead.
#[test]
fn a_stopping_router_names_a_member_heard_within_its_lease() {
    for (heard, named) in [(900, 2), (1_100, 1)] {
        let mut c = Cluster::new(3);
        c.elect_first(0);
        let b2 = c.peers[2].pool_beat(1);
        let at = c.at(150);
        c.peers[0].router.handle_pool_beat(at, &b2);
        // Three pool heartbeats are 300 ms; the lease is 1,000 ms.
        let stop = c.at(150 + heard);
        c.peers[0].router.stop(stop);
        c.peers[0].drain(stop);
        let to = c.peers[0].events.iter().find_map(|e| match e {
            Event::Stopped { to, .. } => Some(to.clone()),
            _ => None,
        });
        let first = c.peers[1].id.clone().min(c.peers[2].id.clone());
        let expected = match named {
            2 => c.peers[2].id.clone(),
            _ => first,
        };
        assert_eq!(to, Some(Some(expected)), "heard {heard} ms before the stop");
    }
}

/// Story 17: A heartbeat naming a successor that does not come from the effective router (a
/// stale or lesser claim) hands nothing over; nor does one naming another peer. And a router
/// that stops with no member's pool heard names the first member of its view that routes:
/// that one claims at once, the others wait for the silence.
#[test]
fn only_the_effective_router_hands_over_and_only_to_the_member_it_names() {
    let mut c = Cluster::new(3);
    c.elect_first(0);
    // A lesser claim of peer 2 names peer 1: ignored.
    let lesser = RouterBeat {
        queue: QueueId::new(QUEUE),
        claim: Claim::new(0, c.peers[2].id.clone()),
        counter: 1,
        epoch: None,
        handover: Some(c.peers[1].id.clone()),
    };
    let at = c.at(150);
    c.peers[1].router.handle_router_beat(at, &lesser);
    c.tick(1, 160);
    assert_eq!(c.peers[1].router.role(), &Role::Follower);
    // The router stops with no pool heard: it names the first member of its view that routes
    // (its beats may not have been read yet on a loaded machine), and only that one claims
    // at once.
    let (named, other) = match c.peers[1].id < c.peers[2].id {
        true => (1, 2),
        false => (2, 1),
    };
    let at = c.at(200);
    c.peers[0].router.stop(at);
    let at = c.at(200);
    c.peers[0].drain(at);
    let expected = c.peers[named].id.clone();
    assert!(c.peers[0].events.iter().any(|e| matches!(
        e,
        Event::Stopped { claim: Some(_), to: Some(to) } if *to == expected
    )));
    c.tick(0, 250);
    assert!(
        c.peers[0]
            .beats
            .iter()
            .all(|b| b.handover.is_none() || b.handover.as_ref() == Some(&expected))
    );
    c.deliver_beats(0, c.at(250));
    c.tick(named, 255);
    assert!(matches!(
        c.peers[named].router.role(),
        Role::Claiming { .. }
    ));
    // The other is not named: it waits for the silence (peer 0's last beat it heard).
    c.tick(other, 260);
    assert_eq!(c.peers[other].router.role(), &Role::Follower);
}
