//! Piecework's router for one queue: the write → wait → recheck takeover state machine, and the
//! routing policy that hands pending tasks to idle workers.
//!
//! The router is sans-IO, in the style of quinn-proto: it reads no clock, opens no socket and
//! writes no document. Time comes in as `now` on every call; what the router wants done comes
//! out as [`Action`]s, and what happened as [`Event`]s.
//!
//! # Driving a router
//!
//! - Inputs: [`Router::handle_view`] after every change to the queue document (including the
//!   driver's own writes), [`Router::handle_router_beat`] and [`Router::handle_pool_beat`] for
//!   heartbeats heard on the network (and the local pool's own), and [`Router::handle_timeout`]
//!   when [`Router::poll_timeout`] says so.
//! - Outputs: drain [`Router::poll_action`] after every input and carry each action out:
//!   [`Action::Claim`] and [`Action::Assign`] are writes to the queue document (then feed the new
//!   view back), [`Action::Fire`] asks for one task per due schedule slot (a submit and the
//!   slot's record, in one change), [`Action::Beat`] is a broadcast. Tell the router the wall
//!   clock with [`Router::handle_clock`]: not-before times and schedule slots are wall times. [`Router::poll_event`] reports role changes.
//! - Then ask [`Router::poll_timeout`] for the next deadline.
//!
//! # The protocol
//!
//! A follower that has not heard the effective router for `takeover_after` writes a claim with
//! `term + 1`, waits `settle`, re-reads the document, and becomes active only if the document
//! still names it: the effective router is the greatest `(term, peer)` among the concurrent
//! values of the router record. An active router steps down as soon as a view or a heartbeat
//! shows a greater claim, and waits one pool-heartbeat interval before its first assignment, to
//! learn what is already running. Time is only ever measured on the local monotonic clock;
//! clocks of different peers are never compared.
//!
//! # Values from peers
//!
//! Timers come from the queue's configuration, which [`QueueView::read`] clamps into its
//! documented ranges, and are added to instants with checked arithmetic. Heartbeats whose term
//! is above [`MAX_TERM`] are ignored ([`Event::RejectedBeat`]); the next term is computed with
//! checked arithmetic and never passes [`MAX_TERM`]: a router that knows of a claim at
//! [`MAX_TERM`] does not claim ([`Event::TermsExhausted`]). Each assignment names the
//! incarnation of the pool whose heartbeat it was based on.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use piecework_queue_doc::{PeerId, QueueId, QueueView};
//! use piecework_router::{Action, Router};
//!
//! let t0 = Instant::now(); // in a node; the simulator passes virtual instants
//! let mut router = Router::new(QueueId::new("automerge:q"), PeerId::new("me"), t0);
//! router.handle_view(t0, QueueView::default().into());
//! // No router is named yet: claim at once, term 1.
//! router.handle_timeout(t0);
//! assert!(matches!(router.poll_action(), Some(Action::Claim(c)) if c.term == 1));
//! ```

#![warn(missing_docs, unreachable_pub)]

mod policy;

pub use policy::{MAX_REFUSAL_BACKOFF, REFUSAL_BACKOFF};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use piecework_queue_doc::schedule::{Schedule, SlotRecord};
use piecework_queue_doc::{
    Assignment, AttemptId, Claim, Firing, Lack, MAX_TERM, PeerId, PoolBeat, QueueId, QueueView,
    RouterBeat, TaskEntry, TaskId,
};

/// Something the driver must do for the router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write this claim as the queue's router record, then feed the new view back.
    Claim(Claim),
    /// Broadcast this heartbeat to the queue's members.
    Beat(RouterBeat),
    /// Record these assignments in the queue document in one change, then feed the view back.
    Assign(Vec<Assignment>),
    /// Submit one task per firing from its schedule's template, with the firing's dedup key,
    /// and record each firing's slot, all in one change; then feed the view back.
    Fire(Vec<Firing>),
}

/// Something that happened to the router, for logs, metrics and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The router wrote a claim and is waiting `settle` to recheck it.
    Claimed(Claim),
    /// The recheck found the claim still effective: the router is active.
    BecameActive(Claim),
    /// The recheck found another claim effective.
    ClaimLost {
        /// The router's claim.
        claim: Claim,
        /// The effective claim at the recheck, if any.
        winner: Option<Claim>,
    },
    /// The router was active and saw a greater claim.
    SteppedDown {
        /// The router's claim.
        claim: Claim,
        /// The greater claim it saw.
        by: Claim,
    },
    /// An active router heard a pool again after a silence longer than `takeover_after` and
    /// holds its assignments for `heartbeat + settle`.
    Reunited {
        /// The pool's peer.
        peer: PeerId,
    },
    /// A router heartbeat was ignored because its content cannot be valid.
    RejectedBeat {
        /// The claim the heartbeat carried.
        claim: Claim,
        /// Why it was ignored.
        reason: Rejection,
    },
    /// A pool heartbeat listed workers a reader does not count: an index listed more than
    /// once, or one at or above `MAX_POOL_WORKERS` ([`PoolBeat::normalized`]). The router
    /// keeps one report per index below the bound, so the extra reports win no assignment.
    PoolBeatTrimmed {
        /// The pool's peer.
        peer: PeerId,
        /// How many of the heartbeat's reports were not counted.
        dropped: usize,
    },
    /// The router would have claimed, but the greatest known term is already [`MAX_TERM`]:
    /// it stays a follower (and says so once per `takeover_after`).
    TermsExhausted {
        /// The greatest known claim.
        known: Claim,
    },
    /// The node is stopping ([`Router::stop`]): the router neither claims nor routes any more.
    Stopped {
        /// The active router's claim it hands over, if it was active.
        claim: Option<Claim>,
        /// The member it hands the role to, if any (the one that claims at once).
        to: Option<PeerId>,
    },
    /// The active router's heartbeat handed the role to this node: it claims at once.
    HandedOver {
        /// The claim of the router that is stopping.
        from: Claim,
    },
}

/// Why a heartbeat was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The term is above [`MAX_TERM`]: no honest router gets there, and nobody could out-claim
    /// it.
    TermTooLarge,
    /// The queue document does not hold the claim (yet): the heartbeat counted as a sign of
    /// life once, and deposes nobody.
    NotInDocument,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::TermTooLarge => write!(f, "the term is above the maximum {MAX_TERM}"),
            Rejection::NotInDocument => write!(
                f,
                "the queue document does not hold the claim: a sign of life once, nothing more"
            ),
        }
    }
}

/// The router's role for its queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Listening for the effective router's heartbeats.
    Follower,
    /// Claim written; waiting to recheck it at `recheck_at`.
    Claiming {
        /// The claim written.
        claim: Claim,
        /// When the claim is re-read.
        recheck_at: Instant,
    },
    /// The effective router.
    Active {
        /// The router's claim.
        claim: Claim,
        /// No assignment before this instant (one pool heartbeat after becoming active).
        route_from: Instant,
    },
    /// The node is stopping: no claim and no assignment any more. An active router that
    /// stopped goes on beating under its claim, naming the member it hands over to
    /// ([`RouterBeat::handover`]), until a view shows another effective claim.
    Stopped {
        /// The claim handed over and the member it goes to, while handing over.
        handing: Option<(Claim, PeerId)>,
    },
}

#[derive(Clone, Debug)]
struct PoolState {
    heard_at: Instant,
    beat: PoolBeat,
}

/// The router of one queue on one peer. See the crate docs for how to drive it.
#[derive(Debug)]
pub struct Router {
    queue: QueueId,
    me: PeerId,
    role: Role,
    view: Option<Arc<QueueView>>,
    /// When the effective router last showed life (heartbeat, or a new claim appearing), or
    /// when this router first reached a member of the queue after it started, whichever is
    /// later: the follower's silence counts from then.
    heard_at: Instant,
    /// A member of the queue has been reached since this router started
    /// ([`Router::handle_member_connected`]).
    met_member: bool,
    /// The greatest claim the document did not hold when it was heard in a heartbeat, and
    /// its counter then (each such claim is a sign of life once).
    best_beat: Option<(Claim, u64)>,
    /// The effective router's claim as last heard in a heartbeat, and that beat's counter
    /// (its replays are ignored).
    effective_beat: Option<(Claim, u64)>,
    started_at: Instant,
    next_beat: Instant,
    beat_counter: u64,
    pools: BTreeMap<PeerId, PoolState>,
    /// Local retry schedule: task → ((failures, refusals) seen, not before).
    retry_at: HashMap<TaskId, policy::RetryAt>,
    /// When this router first saw each open attempt (pruned to the open ones at every plan).
    attempt_seen: HashMap<(TaskId, AttemptId), (Instant, PeerId)>,
    last_assign: Option<Instant>,
    /// The wall clock (unix ms) at a monotonic instant, as last given by
    /// [`Router::handle_clock`]: not-before times are compared with it.
    clock: Option<(Instant, u64)>,
    /// Task entries and workers the last routing plan looked at.
    plan_visits: usize,
    /// Set when routing must be re-evaluated.
    dirty: bool,
    /// An `Assign` was emitted; wait for the view that contains it before routing again.
    awaiting_view: bool,
    /// The next instant a timer-driven re-evaluation is due while active (lease, retry, rate).
    next_check: Option<Instant>,
    /// The last claim attempt found the known term at [`MAX_TERM`]: the next one waits a full
    /// `takeover_after`, even with no router named.
    exhausted: bool,
    /// The active router handed its role to this node (a heartbeat named it): claim at once.
    handed: bool,
    /// The schedules as last evaluated, and when the next of their slots falls due.
    schedules: Option<BTreeMap<String, Schedule>>,
    next_fire: Option<Instant>,
    /// The slot record each firing of this router wrote (a view that does not show it yet
    /// fires nothing again).
    fired: BTreeMap<String, SlotRecord>,
    actions: VecDeque<Action>,
    events: VecDeque<Event>,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// `t + d`, without panicking. Durations come from a clamped configuration (a day at most), so
/// the sum always fits; were it ever not to, `t` itself is returned.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or(t)
}

impl Router {
    /// A follower router for `queue` on peer `me`, started at `now`.
    pub fn new(queue: QueueId, me: PeerId, now: Instant) -> Self {
        Router {
            queue,
            me,
            role: Role::Follower,
            view: None,
            heard_at: now,
            met_member: false,
            best_beat: None,
            effective_beat: None,
            started_at: now,
            next_beat: now,
            beat_counter: 0,
            pools: BTreeMap::new(),
            retry_at: HashMap::new(),
            attempt_seen: HashMap::new(),
            last_assign: None,
            clock: None,
            plan_visits: 0,
            dirty: true,
            awaiting_view: false,
            next_check: None,
            exhausted: false,
            handed: false,
            schedules: None,
            next_fire: None,
            fired: BTreeMap::new(),
            actions: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Tells the router the wall clock (unix ms) at `now`: a task's not-before time is a wall
    /// time, compared with this clock as it advances with `now`. Until it is told, no task with
    /// a not-before time is routed.
    pub fn handle_clock(&mut self, now: Instant, unix_ms: u64) {
        self.clock = Some((now, unix_ms));
    }

    /// The wall clock at `now`, from the last [`Router::handle_clock`].
    fn wall_ms(&self, now: Instant) -> Option<u64> {
        let (at, ms) = self.clock?;
        let since =
            u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX);
        Some(ms.saturating_add(since))
    }

    // ----- getters -----

    /// How many task entries and workers the last routing plan looked at: a work counter that
    /// grows with the tasks it can route and the runs in flight, never with the queue's
    /// history (for tests and metrics; no timing involved).
    pub fn plan_visits(&self) -> usize {
        self.plan_visits
    }

    /// The queue this router serves.
    pub fn queue(&self) -> &QueueId {
        &self.queue
    }

    /// The router's current role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// Whether this router is the active router.
    pub fn is_active(&self) -> bool {
        matches!(self.role, Role::Active { .. })
    }

    /// The effective router according to the last view, if any.
    pub fn effective(&self) -> Option<&Claim> {
        self.view.as_ref().and_then(|v| v.router.as_ref())
    }

    /// The last view handed in.
    pub fn view(&self) -> Option<&Arc<QueueView>> {
        self.view.as_ref()
    }

    // ----- inputs -----

    /// The queue document changed (or was first read). Call after every change, including
    /// the driver's own writes of this router's actions.
    pub fn handle_view(&mut self, now: Instant, view: Arc<QueueView>) {
        let before = self.effective().cloned();
        self.view = Some(view);
        self.awaiting_view = false;
        self.dirty = true;
        let after = self.effective().cloned();
        if after != before && after.as_ref().is_some_and(|c| c.peer != self.me) {
            // A new claim appeared: its claimant is alive. Give it time to settle and beat.
            self.heard_at = now;
        }
        match &self.role {
            Role::Active { claim, .. } if after.as_ref() != Some(claim) => {
                let (claim, by) = (claim.clone(), after.unwrap_or_else(|| claim.clone()));
                self.step_down(now, claim, by);
            }
            Role::Claiming { claim, .. } if after.as_ref().is_some_and(|a| a > claim) => {
                let claim = claim.clone();
                self.role = Role::Follower;
                self.events.push_back(Event::ClaimLost {
                    claim,
                    winner: after,
                });
            }
            // The successor's claim is in: nothing left to hand over.
            Role::Stopped {
                handing: Some((claim, _)),
            } if after.as_ref() != Some(claim) => {
                self.role = Role::Stopped { handing: None };
            }
            _ => {}
        }
    }

    /// This node reached a member of the queue (a sync stream to it opened). The first time
    /// after the router started, the follower's silence starts over: a node that starts (or
    /// restarts) and only then finds its peers gives the live router's heartbeats time to reach
    /// it before it claims, however long its start took. A node that reaches no member still
    /// claims `takeover_after` after it started, so an isolated node serves its own side.
    pub fn handle_member_connected(&mut self, now: Instant) {
        if !self.met_member {
            self.met_member = true;
            self.heard_at = self.heard_at.max(now);
        }
    }

    /// A router heartbeat was heard (its sender authenticated by the network layer). One whose
    /// term is above [`MAX_TERM`] is ignored ([`Event::RejectedBeat`]).
    ///
    /// Only the document deposes a router: a heartbeat is a sign of life, nothing more. One
    /// under the claim the document holds (the effective router) keeps the follower's silence
    /// from counting, every time. One under a claim the document does not hold (yet: the
    /// claim of a router this node's replica has not synced, or a claim nobody wrote) counts
    /// as a sign of life once per claim, so a member that beats under a claim of its own
    /// choosing, up to the term bound, neither deposes the active router nor keeps a follower
    /// from taking over, nor raises the term the next claim takes.
    pub fn handle_router_beat(&mut self, now: Instant, beat: &RouterBeat) {
        if beat.queue != self.queue || beat.claim.peer == self.me {
            return;
        }
        if !beat.claim.is_valid() {
            self.events.push_back(Event::RejectedBeat {
                claim: beat.claim.clone(),
                reason: Rejection::TermTooLarge,
            });
            return;
        }
        match self.effective() {
            Some(e) if *e == beat.claim => {
                // Replays are told apart per claim: a greater claim heard before (one the
                // document does not hold, at the term bound say) must not hide the effective
                // router's beats, or every follower takes over once per `takeover_after`.
                if let Some((last, counter)) = &self.effective_beat
                    && *last == beat.claim
                    && beat.counter <= *counter
                {
                    return; // stale or replayed
                }
                self.effective_beat = Some((beat.claim.clone(), beat.counter));
                self.heard_at = now;
                if beat.handover.as_ref() == Some(&self.me)
                    && self.role == Role::Follower
                    && !self.handed
                {
                    // A planned stop: the router names this node its successor.
                    self.handed = true;
                    self.events.push_back(Event::HandedOver {
                        from: beat.claim.clone(),
                    });
                }
            }
            Some(e) if beat.claim < *e => {} // a deposed router that does not know it yet
            _ => {
                // A claim the document does not hold: a sign of life once per claim, and
                // only for a claim greater than any such claim heard before.
                if self
                    .best_beat
                    .as_ref()
                    .is_some_and(|(best, _)| beat.claim <= *best)
                {
                    return;
                }
                self.best_beat = Some((beat.claim.clone(), beat.counter));
                self.heard_at = now;
                self.events.push_back(Event::RejectedBeat {
                    claim: beat.claim.clone(),
                    reason: Rejection::NotInDocument,
                });
            }
        }
    }

    /// A pool heartbeat was heard (including this node's own pool's).
    ///
    /// A pool heard again after a silence longer than `takeover_after` was cut off from this
    /// router long enough for its side to elect another one. An active router then holds its
    /// assignments for `heartbeat + settle`: time for that side's router heartbeat or claim to
    /// arrive, so that a router deposed while apart does not assign work the other side's
    /// router is assigning too.
    pub fn handle_pool_beat(&mut self, now: Instant, beat: &PoolBeat) {
        if let Some(p) = self.pools.get(&beat.peer) {
            let old = (p.beat.incarnation, p.beat.counter);
            if (beat.incarnation, beat.counter) <= old {
                return; // stale or replayed
            }
            if let (Some(view), Role::Active { claim, route_from }) = (&self.view, &self.role) {
                let c = &view.config;
                if now.saturating_duration_since(p.heard_at) > ms(c.takeover_after_ms) {
                    let hold = later(now, ms(c.heartbeat_ms.saturating_add(c.settle_ms)));
                    self.role = Role::Active {
                        claim: claim.clone(),
                        route_from: (*route_from).max(hold),
                    };
                    self.events.push_back(Event::Reunited {
                        peer: beat.peer.clone(),
                    });
                }
            }
        }
        let normalized = beat.normalized();
        let dropped = beat.workers.len() - normalized.workers.len();
        if dropped > 0 {
            self.events.push_back(Event::PoolBeatTrimmed {
                peer: beat.peer.clone(),
                dropped,
            });
        }
        self.pools.insert(
            beat.peer.clone(),
            PoolState {
                heard_at: now,
                beat: normalized,
            },
        );
        self.dirty = true;
    }

    /// A deadline from [`Router::poll_timeout`] passed (calling early is harmless).
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(view) = self.view.clone() else {
            return;
        };
        let config = view.config.clone();
        match self.role.clone() {
            Role::Follower => {
                let silent =
                    now.saturating_duration_since(self.heard_at) >= ms(config.takeover_after_ms);
                if (view.router.is_none() && !self.exhausted) || silent || self.handed {
                    self.handed = false;
                    // The term to claim follows the document's claims only: a heartbeat's claim
                    // the document does not hold raises nothing.
                    let known = view.router.clone();
                    let next = known
                        .as_ref()
                        .map_or(Some(1), |c| c.term.checked_add(1))
                        .filter(|t| *t <= MAX_TERM);
                    match (next, known) {
                        (Some(term), _) => {
                            self.exhausted = false;
                            let claim = Claim::new(term, self.me.clone());
                            self.role = Role::Claiming {
                                claim: claim.clone(),
                                recheck_at: later(now, ms(config.settle_ms)),
                            };
                            self.actions.push_back(Action::Claim(claim.clone()));
                            self.events.push_back(Event::Claimed(claim));
                        }
                        (None, known) => {
                            // Nobody can out-claim the known term: wait another takeover
                            // interval rather than spin.
                            self.exhausted = true;
                            self.heard_at = now;
                            if let Some(known) = known {
                                self.events.push_back(Event::TermsExhausted { known });
                            }
                        }
                    }
                }
            }
            Role::Claiming { claim, recheck_at } if now >= recheck_at => {
                if view.router.as_ref() == Some(&claim) {
                    let wait = config.pool_heartbeat_ms.max(config.rate_interval_ms);
                    self.role = Role::Active {
                        claim: claim.clone(),
                        route_from: later(now, ms(wait)),
                    };
                    self.next_beat = now;
                    self.beat_counter = 0;
                    self.last_assign = None;
                    self.retry_at.clear();
                    self.schedules = None;
                    self.next_fire = None;
                    self.dirty = true;
                    self.events.push_back(Event::BecameActive(claim));
                } else {
                    self.role = Role::Follower;
                    self.heard_at = now;
                    self.events.push_back(Event::ClaimLost {
                        claim,
                        winner: view.router.clone(),
                    });
                }
            }
            Role::Claiming { .. } => {}
            Role::Active { .. } | Role::Stopped { .. } => {}
        }
        if let Some(beat) = self.poll_beat(now) {
            self.actions.push_back(Action::Beat(beat));
        }
        if let Role::Active { claim, route_from } = self.role.clone() {
            if now >= route_from {
                self.fire(now, &view);
            }
            let due = self.dirty || self.next_check.is_some_and(|t| now >= t);
            if now >= route_from && due && !self.awaiting_view {
                self.route(now, &claim, &view);
            }
        }
    }

    /// The heartbeat due at `now`, if this router is active and one is due; the next is then
    /// due a heartbeat later. [`Router::handle_timeout`] sends it first, as
    /// [`Action::Beat`]. A driver whose turns can be long also asks for it on its own (before a
    /// turn's inputs are applied), so that the beats keep their rhythm whatever the turn does.
    pub fn poll_beat(&mut self, now: Instant) -> Option<RouterBeat> {
        let (claim, handover) = match &self.role {
            Role::Active { claim, .. } => (claim, None),
            Role::Stopped {
                handing: Some((claim, to)),
            } => (claim, Some(to.clone())),
            _ => return None,
        };
        let every = self.view.as_ref()?.config.heartbeat_ms;
        if now < self.next_beat {
            return None;
        }
        self.beat_counter += 1;
        self.next_beat = later(now, ms(every));
        Some(RouterBeat {
            queue: self.queue.clone(),
            claim: claim.clone(),
            counter: self.beat_counter,
            epoch: None,
            handover,
        })
    }

    /// The node is stopping (a planned restart): from now on the router neither claims nor
    /// routes. If it is the active router, it hands the role over: its next heartbeats
    /// ([`Router::poll_beat`], due at once) name a successor, which claims without waiting
    /// `takeover_after`, and it beats until a view shows another effective claim. The
    /// successor is the member whose pool was heard last (within its lease, not stopping
    /// itself), the smaller peer id on a tie; with none heard (a loaded machine's beats not
    /// read yet), the first member of the view that routes and runs and was not heard
    /// stopping; with none, nobody is named and the others take over after
    /// `takeover_after` as after a crash (as they do if the member named is gone). Assignments
    /// already made keep their claim: workers run them.
    pub fn stop(&mut self, now: Instant) {
        if matches!(self.role, Role::Stopped { .. }) {
            return;
        }
        let handing = match &self.role {
            Role::Active { claim, .. } => self.successor(now).map(|to| (claim.clone(), to)),
            _ => None,
        };
        self.next_beat = now;
        self.next_check = None;
        self.handed = false;
        self.events.push_back(Event::Stopped {
            claim: handing.as_ref().map(|(c, _)| c.clone()),
            to: handing.as_ref().map(|(_, p)| p.clone()),
        });
        self.role = Role::Stopped { handing };
    }

    /// The member to hand the router role over to (see [`Router::stop`]).
    fn successor(&self, now: Instant) -> Option<PeerId> {
        let view = self.view.as_ref()?;
        // Within the lease, not three heartbeats as for routing: the latest heard is named
        // anyway, and a router stopping at the end of a long turn (a big batch, a loaded
        // machine) may not have read the last beats. Naming a member that died since costs
        // what naming nobody costs: the others take over after `takeover_after`.
        let fresh = ms(view.config.lease_ms);
        self.pools
            .iter()
            .filter(|(p, s)| {
                **p != self.me
                    && !s.beat.draining
                    && view.may_work(p)
                    && now.saturating_duration_since(s.heard_at) <= fresh
            })
            // The latest heard; on a tie the smaller id (the map is ordered by id).
            .max_by(|(pa, a), (pb, b)| a.heard_at.cmp(&b.heard_at).then(pb.cmp(pa)))
            .map(|(p, _)| p.clone())
            .or_else(|| {
                // None heard: any member that may route. Named and gone costs what naming
                // nobody costs.
                view.membership
                    .active()
                    .filter(|(p, role)| {
                        **p != self.me
                            && role.works()
                            && self.pools.get(*p).is_none_or(|s| !s.beat.draining)
                    })
                    .map(|(p, _)| p.clone())
                    .next()
            })
    }

    /// What keeps every live pool this router hears from running `task`, if no such pool can
    /// (live: heard within three pool-heartbeat intervals, a member, not stopping): no pool
    /// has a handler for its kind, or none with one holds every resource it requires (then
    /// the resources no pool with the kind holds, or all of them if each is held by some such
    /// pool but none holds them all).
    pub fn lack(&self, now: Instant, task: &TaskEntry) -> Option<Lack> {
        let view = self.view.as_ref()?;
        let c = &view.config;
        let fresh = ms(c.pool_heartbeat_ms.saturating_mul(3).min(c.lease_ms));
        let live: Vec<&PoolBeat> = self
            .pools
            .iter()
            .filter(|(peer, p)| {
                now.saturating_duration_since(p.heard_at) <= fresh
                    && view.may_work(peer)
                    && !p.beat.draining
            })
            .map(|(_, p)| &p.beat)
            .collect();
        let requires = &task.rules.requires;
        let lacks: Vec<Option<Lack>> = live.iter().map(|b| b.lacks(&task.kind, requires)).collect();
        if lacks.iter().any(Option::is_none) {
            return None;
        }
        let with_kind: Vec<&&PoolBeat> = live
            .iter()
            .zip(&lacks)
            .filter(|(_, l)| !matches!(l, Some(Lack::Kind(_))))
            .map(|(b, _)| b)
            .collect();
        if with_kind.is_empty() {
            return Some(Lack::Kind(task.kind.clone()));
        }
        let mut missing: Vec<String> = requires
            .iter()
            .filter(|r| {
                !with_kind
                    .iter()
                    .any(|b| b.resources.binary_search(r).is_ok())
            })
            .cloned()
            .collect();
        if missing.is_empty() {
            missing = requires.clone();
        }
        Some(Lack::Resources(missing))
    }

    fn step_down(&mut self, now: Instant, claim: Claim, by: Claim) {
        self.role = Role::Follower;
        self.heard_at = now;
        self.next_check = None;
        self.events.push_back(Event::SteppedDown { claim, by });
    }

    fn route(&mut self, now: Instant, claim: &Claim, view: &QueueView) {
        self.dirty = false;
        let wall_ms = self.wall_ms(now);
        let plan = policy::plan(&mut policy::Input {
            now,
            queue: &self.queue,
            me: claim,
            view,
            pools: &self
                .pools
                .iter()
                .map(|(p, s)| (p.clone(), (s.heard_at, &s.beat)))
                .collect(),
            started_at: self.started_at,
            retry_at: &mut self.retry_at,
            attempt_seen: &mut self.attempt_seen,
            last_assign: self.last_assign,
            wall_ms,
        });
        self.next_check = plan.next_check;
        self.plan_visits = plan.visited;
        if !plan.assignments.is_empty() {
            self.last_assign = Some(now);
            self.awaiting_view = true;
            self.actions.push_back(Action::Assign(plan.assignments));
        }
    }

    /// Fires the schedules' due slots ([`Schedule::due`], by this router's wall clock), and
    /// computes when the next falls due. Costs nothing until the schedules change or that time
    /// comes.
    fn fire(&mut self, now: Instant, view: &QueueView) {
        let Some(wall) = self.wall_ms(now) else {
            return;
        };
        let changed = self.schedules.as_ref() != Some(&view.schedules);
        if !changed && self.next_fire.is_none_or(|t| now < t) {
            return;
        }
        if changed {
            self.schedules = Some(view.schedules.clone());
        }
        let mut firings = Vec::new();
        let mut next: Option<u64> = None;
        for (name, schedule) in &view.schedules {
            let mut s = schedule.clone();
            if let Some(mine) = self.fired.get(name) {
                s.slot = s.slot.max(*mine);
            }
            if let Some(f) = s.due(name, wall) {
                s.slot = f.record();
                self.fired.insert(name.clone(), s.slot);
                firings.push(f);
            }
            if let Some(at) = s.next_fire_at() {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        self.next_fire = next.map(|at| later(now, ms(at.saturating_sub(wall))));
        if !firings.is_empty() {
            self.actions.push_back(Action::Fire(firings));
        }
    }

    // ----- outputs -----

    /// The next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Router::handle_timeout`] must next be called; `None` until a view arrives.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let view = self.view.as_ref()?;
        let c = &view.config;
        match &self.role {
            Role::Follower if self.handed => Some(self.heard_at),
            Role::Follower if view.router.is_none() && !self.exhausted => Some(self.heard_at),
            Role::Follower => Some(later(self.heard_at, ms(c.takeover_after_ms))),
            Role::Claiming { recheck_at, .. } => Some(*recheck_at),
            Role::Active { route_from, .. } => {
                let mut t = self.next_beat;
                if !self.awaiting_view {
                    if self.dirty {
                        t = t.min(*route_from);
                    }
                    if let Some(check) = self.next_check {
                        t = t.min(check.max(*route_from));
                    }
                }
                if let Some(fire) = self.next_fire {
                    t = t.min(fire.max(*route_from));
                } else if self.clock.is_some() && self.schedules.as_ref() != Some(&view.schedules) {
                    t = t.min(*route_from);
                }
                Some(t)
            }
            Role::Stopped { handing: Some(_) } => Some(self.next_beat),
            Role::Stopped { handing: None } => None,
        }
    }
}
