//! The checks: the nine invariants of `docs/protocol.md` ("Invariants"), each a function named
//! after what it checks, and when the simulator checks it (`docs/testing.md`, "Invariants").
//!
//! It owns no model. It reads what the others keep (the nodes' cores and disks, the run
//! records, the network's `disturbances`, the crashes) and reports through the parent's
//! `violate`; it also keeps the records only it reads (`seen_states`, which a crash clears,
//! `ever_final`, `assigned`, `last_assign`), which live on the parent's [`World`]. The shell asks it for `check_start`,
//! `a_saved_document_belongs_to_a_joined_queue` and the view checks; the clients for
//! `an_acknowledged_submit_is_on_disk`; the event loop for `is_settled`, `final_checks`,
//! `unsettled` and `lost`. It asks nothing of the other modules but the disk's `read`.
//!
//! Every invariant in one place. "protocol.md" is the row of that number in the table at
//! `docs/protocol.md#invariants`, which lists every test behind it; the simulator's own tests
//! of it are named in that row, in `crates/sim/tests/seeds.rs` (and `tests/takeover_props.rs`).
//!
//! | # | invariant (`docs/protocol.md#invariants`, row #) | function | checked |
//! |---|---|---|---|
//! | 1 | every acknowledged submit reaches an outcome on every member | [`World::every_acknowledged_task_reaches_an_outcome`]; also [`World::unsettled`] and the livelock limit in `World::run` | once settled; at the settle limit |
//! | 2 | no outcome regresses on any replica | [`World::no_outcome_regresses`] | on every view a core reports |
//! | 3 | one agreed router, and exactly it active | [`World::only_the_agreed_router_is_active`] (after [`World::is_settled`] required it); also [`World::unsettled`] | once settled; at the settle limit |
//! | 4 | no worker starts below the greatest claim it has seen on the chain it is on | [`World::no_worker_starts_below_the_greatest_claim_seen`] | at every run start |
//! | 5 | without loss, a task runs again only after a failure or a crash | [`World::a_task_runs_again_only_after_a_failure_or_a_crash`] | at every run start, in runs that lose no messages |
//! | 6 | the concurrency limit and the rate interval hold | [`World::runs_stay_within_the_concurrency_limit`], [`World::assignments_keep_the_rate_interval`] | at every run start; on every view of an active router |
//! | 7 | no two runs of a task overlap (unless a loss explains it) | [`World::no_two_runs_of_a_task_overlap`] | at every run start |
//! | 8 | an acknowledged submit is on the submitting node's disk | [`World::an_acknowledged_submit_is_on_disk`] | at every acknowledged submit |
//! | 9 | a node stores only documents of queues it joined | [`World::a_saved_document_belongs_to_a_joined_queue`], [`World::every_stored_document_belongs_to_a_joined_queue`] | at every save; once settled, on every disk |
//! | 10 | no honest node counts a value the Byzantine member sent or wrote (`byzantine` mix) | `World::judge_hostile_delivery`, `World::judge_hostile_writes` (in `byzantine.rs`); with it, invariant 1 requires every task `succeeded` ([`World::every_task_succeeds_beside_a_hostile_member`]) | at every hostile heartbeat delivered to an honest node; on every view of an honest node |
//!
//! The simulator's tests of each, as `docs/protocol.md` names them (in
//! `crates/sim/tests/seeds.rs` unless said otherwise):
//!
//! 1. `default_mix_seeds_pass_and_every_fault_kind_fires`,
//!    `crash_only_seeds_pass_with_no_unexplained_second_run`, `partition_seeds_pass`;
//!    `tests/takeover_props.rs` `takeover_holds_under_generated_fault_schedules`,
//!    `the_router_crashes_mid_run`.
//! 2. `default_mix_seeds_pass_and_every_fault_kind_fires`.
//! 3. `tests/takeover_props.rs` `two_routers_claim_at_once`,
//!    `the_router_is_partitioned_away_then_healed`, `the_cluster_splits_in_halves_then_heals`.
//! 4. `a_node_that_does_not_fence_is_caught`, `a_core_that_does_not_fence_its_starts_is_caught`; `tests/takeover_props.rs`
//!    `the_routers_heartbeats_are_delayed_past_the_timeout`.
//! 5. `crash_only_seeds_pass_with_no_unexplained_second_run`,
//!    `seed_1_crashes_a_restarted_pool_never_runs_a_superseded_attempt`.
//! 6. `seed_44_a_run_that_outlived_its_tasks_outcome_counts_against_the_limit`,
//!    `seed_3_an_assignment_of_a_finished_task_is_refused`,
//!    `seed_212_at_7_an_earlier_run_of_a_pending_task_counts_against_the_limit`.
//! 7. `crash_only_seeds_pass_with_no_unexplained_second_run`,
//!    `seed_1_crashes_a_restarted_pool_never_runs_a_superseded_attempt`.
//! 8. `default_mix_seeds_pass_and_every_fault_kind_fires`,
//!    `crash_only_seeds_pass_with_no_unexplained_second_run`.
//! 9. `default_mix_seeds_pass_and_every_fault_kind_fires`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use piecework_queue_doc::{Claim, PeerId, QueueId, QueueView, TaskId, TaskState};
use piecework_replica::DocId;

use super::{EPOCH_MS, End, RunRec, World};
use crate::Violation;

impl World {
    /// Records the effective router of each of node `i`'s views, for invariant 4: the
    /// greatest per queue.
    pub(super) fn note_claims_held(&mut self, i: usize) {
        let queues: Vec<QueueId> = self.nodes[i].core.queues().cloned().collect();
        for q in queues {
            let core = &self.nodes[i].core;
            let Some(claim) = core.view(&q).and_then(|v| v.router.clone()) else {
                continue;
            };
            let Some((_, doc)) = core.epoch(&q).map(|(e, d)| (e, d.clone())) else {
                continue;
            };
            let held = self.held_on_chain(i, &q).filter(|h| *h > claim);
            self.claims_held
                .insert((i, q.clone()), (held.unwrap_or(claim), doc));
        }
    }

    /// The greatest claim node `i`'s views of `queue` showed at the end of a step, if the
    /// document it was on then is on the chain of the one it is on now: that document itself,
    /// the queue's first, or one its lineage names (read from the document).
    fn held_on_chain(&self, i: usize, queue: &QueueId) -> Option<Claim> {
        let (claim, was_on) = self.claims_held.get(&(i, queue.clone()))?;
        let core = &self.nodes[i].core;
        let (_, now_on) = core.epoch(queue)?;
        let on_chain = was_on == now_on
            || was_on.as_str() == queue.as_str()
            || core.document(now_on).is_some_and(|d| {
                piecework_queue_doc::epoch::read_lineage(d)
                    .iter()
                    .any(|l| l.doc == was_on.as_str())
            });
        on_chain.then(|| claim.clone())
    }

    // ----- at every run start -----

    /// Invariants 4, 5, 7 and 6, in that order, at the moment a worker starts a run.
    /// `tainted`: the run's node and its router's were cut apart since the assignment
    /// ([`World::cut_from_its_router_since`]); such a run does not count against the limit.
    pub(super) fn check_start(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
        claim: &Claim,
        tainted: bool,
    ) {
        self.no_worker_starts_below_the_greatest_claim_seen(i, queue, task, claim);
        let earlier = self.runs.get(task).cloned().unwrap_or_default();
        self.a_dependent_starts_after_its_dependencies_succeeded(i, queue, task);
        self.a_task_runs_again_only_after_a_failure_or_a_crash(i, task, &earlier);
        self.no_two_runs_of_a_task_overlap(i, task, claim, &earlier);
        if tainted {
            self.count("over_limit_excused_by_loss");
        } else {
            self.runs_stay_within_the_concurrency_limit(queue, claim);
        }
    }

    /// Whether messages between node `i` and the node of `claim` (its router) were lost or
    /// cut at some moment from the assignment (`assigned_us`, less a router heartbeat, as
    /// invariant 7 reads it) to now. The router could not hear the worker's answer to such
    /// an assignment and may have routed the task again: the late start is at-least-once's
    /// duplicate (invariant 7 excuses the overlap the same way), and like a run a cut
    /// separates from its router while it runs, it no longer counts against that router's
    /// concurrency limit (swarm seed 281: an assignment reached a node whose outgoing
    /// messages were lost for 12.7 s; it started 27 ms after the cut ended, the task running
    /// again elsewhere by then).
    pub(super) fn cut_from_its_router_since(
        &self,
        i: usize,
        claim: &Claim,
        assigned_us: u64,
    ) -> bool {
        let Some(r) = self.index_of(&claim.peer) else {
            return false;
        };
        let grace_us = self.qconfig.heartbeat_ms * 1000;
        r != i
            && self.net.disturbances.iter().any(|&(s, e, a, b)| {
                e + grace_us >= assigned_us
                    && s <= self.now_us
                    && ((a, b) == (i, r) || (a, b) == (r, i))
            })
    }

    /// Invariant 4: the attempt's claim is not below the greatest claim the node's queue
    /// documents have held: the effective router of its view now, or of any view it showed
    /// at the end of a step before (`claims_held`) on a document of the chain it is on now
    /// (a move to the winning branch of a double seal leaves the losing branch's claims). Only the document raises a fence (a
    /// heartbeat does not), so this is judged from the documents as `QueueView` reads them,
    /// not from the value the node fences with (`Core::fence`).
    fn no_worker_starts_below_the_greatest_claim_seen(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
        claim: &Claim,
    ) {
        let in_view = self.nodes[i]
            .core
            .view(queue)
            .and_then(|v| v.router.clone());
        let seen = self
            .held_on_chain(i, queue)
            .into_iter()
            .chain(in_view)
            .max();
        if let Some(seen) = seen
            && *claim < seen
        {
            self.violate(
                4,
                format!("node{i} started {task} assigned by {claim}, having seen {seen}"),
            );
        }
    }

    /// Invariant 5, in runs that lose no messages: every earlier run of the task failed, or its
    /// node crashed (or stopped) after starting it.
    fn a_task_runs_again_only_after_a_failure_or_a_crash(
        &mut self,
        i: usize,
        task: &TaskId,
        earlier: &[RunRec],
    ) {
        if self.check_duplicates {
            let unexplained = earlier.iter().find(|r| {
                let crashed_since = self
                    .crashes
                    .iter()
                    .any(|(n, t)| *n == r.node && *t >= r.start_us);
                !matches!(r.end, Some(End::Failed) | Some(End::Crashed)) && !crashed_since
            });
            if let Some(r) = unexplained {
                let what = format!(
                    "{task} starts again on node{i} though its run on node{} ({:?}) neither failed nor lost its node",
                    r.node, r.end
                );
                self.violate(5, what);
            }
        }
    }

    /// Invariant 7: no two runs of a task overlap, unless messages between the routers and the
    /// workers involved were lost or cut since the earlier run began.
    fn no_two_runs_of_a_task_overlap(
        &mut self,
        i: usize,
        task: &TaskId,
        claim: &Claim,
        earlier: &[RunRec],
    ) {
        for r in earlier.iter().filter(|r| r.end_us.is_none()) {
            let involved: BTreeSet<usize> = [Some(i), Some(r.node)]
                .into_iter()
                .chain([self.index_of(&claim.peer), self.index_of(&r.claim.peer)])
                .flatten()
                .collect();
            // From the earlier attempt's assignment to this start, on a link between two of
            // the routers and workers involved (both ends: a loss between one of them and a
            // node not involved hides nothing from them, every pair being linked directly).
            // What a loss hid (a second router's claim, say) is learnt again only once
            // messages flow: a disturbance also explains assignments up to a router heartbeat
            // after it ended (seed 2093: a one-way cut ends, and 35 ms later the router that
            // could not hear the other assigns before the next beat arrives).
            let from = r.assigned_us;
            let grace_us = self.qconfig.heartbeat_ms * 1000;
            let explained = !self.check_duplicates
                && self.net.disturbances.iter().any(|&(s, e, a, b)| {
                    e + grace_us >= from
                        && s <= self.now_us
                        && involved.contains(&a)
                        && involved.contains(&b)
                });
            if explained {
                self.count("overlap_explained_by_loss");
            } else {
                let what = format!(
                    "{task} starts on node{i} (by {claim}) while its run on node{} (by {}) still runs",
                    r.node, r.claim
                );
                self.violate(7, what);
            }
        }
    }

    /// Invariant 6, the limit half: runs in flight under one claim stay within the
    /// concurrency limit, not counting runs cut off from the router.
    fn runs_stay_within_the_concurrency_limit(&mut self, queue: &QueueId, claim: &Claim) {
        let limit = self.qconfig.concurrency;
        if limit > 0 {
            let running = 1 + self
                .nodes
                .iter()
                .flat_map(|n| n.live.values())
                .filter(|l| l.claim == *claim && l.queue == *queue && !l.tainted)
                .count();
            if running > limit as usize {
                self.violate(
                    6,
                    format!("{running} runs under {claim}, concurrency limit {limit}"),
                );
            }
        }
    }

    // ----- on every view a core reports -----

    /// Invariant 2: no outcome regresses on node `i`'s replica: a final state never becomes
    /// open again, and `succeeded` never changes. Each incarnation is watched from what it
    /// reloads (a crash forgets what the node held only in memory). That a known task leaves
    /// the index only when final is checked by `crates/queue-doc/tests/merge.rs`.
    pub(super) fn no_outcome_regresses(&mut self, i: usize, view: &Arc<QueueView>) {
        let mut bad = vec![];
        for (id, t) in view.tasks() {
            let s = t.state();
            let key = (i, id.clone());
            if let Some(prev) = self.seen_states.get(&key).copied() {
                // The one reopening protocol.md allows: a dedup copy shown cancelled as a
                // duplicate, whose start (made before the copies met) arrives, or whose
                // survivor the document it is on no longer holds.
                let reverted = prev == TaskState::Cancelled
                    && !s.is_final()
                    && t.duplicate_of.is_none()
                    && self.sched_dup_cancelled(i, id);
                if reverted {
                    self.count("dedup_cancel_reverted");
                    self.seen_states.insert(key, s);
                    continue;
                }
                // The other: a requeue reopens a dead-lettered task, and the dependents its
                // failure cancelled with it.
                let requeued = t.requeued_at() > self.seen_requeues.get(&key).copied().unwrap_or(0);
                let dependency_requeued = prev == TaskState::Cancelled
                    && t.cancel.is_none()
                    && t.duplicate_of.is_none()
                    && t.rules
                        .depends_on
                        .iter()
                        .any(|d| view.task(d).is_some_and(|d| d.requeue.is_some()));
                if !s.is_final() && ((prev == TaskState::Failed && requeued) || dependency_requeued)
                {
                    self.count("requeue_reopened");
                    self.seen_states.insert(key.clone(), s);
                    self.seen_requeues.insert(key, t.requeued_at());
                    continue;
                }
                let regressed = (prev.is_final() && !s.is_final())
                    || (prev == TaskState::Succeeded && s != TaskState::Succeeded);
                if regressed {
                    bad.push(format!(
                        "node{i}: {id} went from {} to {} (requeued at #{}, attempts {:?})",
                        prev.as_str(),
                        s.as_str(),
                        t.requeued_at(),
                        t.attempts
                            .iter()
                            .map(|a| (a.id.n, a.finished.as_ref().map(|f| f.outcome)))
                            .collect::<Vec<_>>()
                    ));
                }
            }
            if t.duplicate_of.is_some() {
                self.note_dup_cancelled(i, id);
            }
            if t.requeue.is_some() {
                self.seen_requeues.insert(key.clone(), t.requeued_at());
            }
            if s.is_final() || !self.seen_states.contains_key(&key) {
                self.seen_states.insert(key, s);
            }
        }
        for b in bad {
            self.violate(2, b);
        }
    }

    /// Remembers the tasks some node's view showed final, ever (crashes do not forget it), for
    /// invariant 1: a task that a rotation left behind was final on its sealer.
    pub(super) fn remember_final_tasks(&mut self, view: &Arc<QueueView>) {
        for (id, t) in view.tasks() {
            if t.state().is_final() && !self.ever_final.contains(id) {
                self.ever_final.insert(id.clone());
                if t.duplicate_of.is_some() {
                    self.count("dedup_copy_cancelled");
                } else if t.cancel.is_some() && t.state() == TaskState::Cancelled {
                    self.count("cancelled_by_member");
                } else if t.state() == TaskState::Cancelled {
                    self.count("cancelled_by_dependency");
                }
            }
            if t.state() == TaskState::Succeeded && !self.ever_succeeded.contains(id) {
                self.ever_succeeded.insert(id.clone());
            }
        }
    }

    /// Invariant 6, the rate half, on every view of an active router: with a rate interval, at
    /// most one new assignment at once and none within the interval of the last, on the
    /// router's clock.
    pub(super) fn assignments_keep_the_rate_interval(
        &mut self,
        i: usize,
        queue: &QueueId,
        view: &Arc<QueueView>,
    ) {
        let interval_us = self.qconfig.rate_interval_ms * 1000;
        if interval_us > 0 {
            let me = self.nodes[i].peer.clone();
            // Each new attempt with the router's own record of when it assigned it: the
            // view may show an assignment a little after it was made (a rotation's last
            // catch-up holds the router's writes for a moment).
            let mut fresh: Vec<(Claim, u64)> = vec![];
            let mut which = vec![];
            for t in view.tasks().values() {
                for a in t.attempts.iter().filter(|a| a.id.claim.peer == me) {
                    let key = (t.id.clone(), a.id.n, a.id.claim.clone());
                    if self.assigned.insert(key) {
                        fresh.push((a.id.claim.clone(), a.assigned_at));
                        which.push(format!("{} {}", t.id, a.id));
                    }
                }
            }
            // Its own attempts that reach it while it is not active (written before it
            // stepped down, carried later) are remembered, not judged: only the assignments of
            // an active router are.
            if !self.nodes[i].core.is_active(queue) {
                return;
            }
            if fresh.len() > 1 {
                self.violate(
                    6,
                    format!(
                        "node{i} assigned {} tasks at once under a rate interval ({})",
                        fresh.len(),
                        which.join(", ")
                    ),
                );
            }
            if let Some((claim, at_ms)) = fresh.pop() {
                let now = self.now_us;
                // Whole ms of the router's clock: a gap of at least the interval never shows
                // as less.
                let local = at_ms.saturating_sub(EPOCH_MS) * 1000;
                let key = (queue.clone(), claim);
                if let Some(last) = self.last_assign.get(&key)
                    && local.saturating_sub(*last) < interval_us
                {
                    let gap = local.saturating_sub(*last);
                    self.violate(
                        6,
                        format!(
                            "node{i} assigned {gap} µs after its last, rate interval {interval_us} µs (at {now})"
                        ),
                    );
                }
                self.last_assign.insert(key, local);
            }
        }
    }

    // ----- at every acknowledged submit, and at every save -----

    /// Invariant 8: an acknowledged submit is on the submitting node's disk, task document and
    /// index entry both, so no crash can lose it.
    pub(super) fn an_acknowledged_submit_is_on_disk(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
    ) {
        let disk = &self.nodes[i].disk;
        // In whichever epoch document the node wrote it to (the current one, or one it has
        // moved past since).
        // The entry, if any: an inline task has no task document, its entry holds its input.
        let entry_inline = self.nodes[i]
            .core
            .epoch_docs(queue)
            .into_iter()
            .find_map(|d| {
                disk.read(&d, |d| {
                    piecework_queue_doc::epoch::task_entry(d, task).map(|t| t.input.is_some())
                })
                .flatten()
            });
        let indexed = entry_inline.is_some();
        let inline = entry_inline == Some(true);
        let stored =
            inline || DocId::parse(task.as_str()).is_some_and(|d| disk.read(&d, |_| ()).is_some());
        if !indexed || !stored {
            self.violate(
                8,
                format!(
                    "node{i} acknowledged {task} but its disk holds the index entry: {indexed}, the task document: {stored}"
                ),
            );
        }
    }

    /// Invariant 9, at every save a core asks for: a node stores only documents of queues it
    /// joined.
    pub(super) fn a_saved_document_belongs_to_a_joined_queue(&mut self, i: usize, doc: &DocId) {
        // Judged from the node's disk (the queues it remembers joining) and the document's
        // own content, never from the core's queues or views.
        let joined = &self.nodes[i].disk.queues;
        let ok = joined.iter().any(|q| q.as_str() == doc.as_str()) || self.of_joined_queue(i, doc);
        if !ok {
            self.violate(
                9,
                format!("node{i} stores {doc}, which belongs to no queue it joined"),
            );
        }
    }

    /// Whether a document this node stores says it belongs to a queue the node joined: an
    /// epoch document of it, or a task document of it (a finished task that the current epoch
    /// no longer carries).
    fn of_joined_queue(&self, i: usize, doc: &DocId) -> bool {
        let n = &self.nodes[i];
        let origin = |d: &automerge::Automerge| match piecework_queue_doc::epoch::read_epoch(d) {
            Some((_, Some(origin))) => Some(origin),
            _ => piecework_queue_doc::task::read(d).ok().map(|t| t.queue),
        };
        let queue = match n.core.document(doc).filter(|d| !d.get_heads().is_empty()) {
            Some(d) => origin(d),
            None => n.disk.read(doc, origin).flatten(),
        };
        queue.is_some_and(|q| n.disk.queues.contains(&q))
    }

    // ----- once healed and settled, or at the settle limit -----

    /// The router every member of queue `q` names, if they all name the same one.
    fn everyone_agrees(&self, q: usize) -> Option<Claim> {
        let id = self.queues[q].as_ref()?;
        let first = self.nodes[self.members[q][0]]
            .core
            .view(id)?
            .router
            .clone()?;
        self.members[q]
            .iter()
            .all(|&i| {
                self.nodes[i]
                    .core
                    .view(id)
                    .is_some_and(|v| v.router.as_ref() == Some(&first))
            })
            .then_some(first)
    }

    /// Whether the healed cluster has settled: every task acknowledged, every node up, each
    /// queue's members agreeing on one router that alone is active, and no task lost.
    pub(super) fn is_settled(&self) -> bool {
        if self.to_submit > 0
            || self.nodes.iter().any(|n| !n.up || !n.submits.is_empty())
            || self.queues.iter().any(Option::is_none)
        {
            return false;
        }
        for q in 0..self.members.len() {
            let Some(router) = self.everyone_agrees(q) else {
                return false;
            };
            let id = self.queues[q].as_ref().expect("created");
            let active: Vec<&PeerId> = self
                .nodes
                .iter()
                .filter(|n| n.core.is_active(id))
                .map(|n| &n.peer)
                .collect();
            if active != vec![&router.peer] {
                return false;
            }
            if self.settings_seen(id).len() > 1 {
                return false;
            }
        }
        self.lost() == 0
    }

    /// The settings (pause flag and configuration) the members' views of queue `id` hold.
    fn settings_seen(&self, id: &QueueId) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter_map(|n| n.core.view(id))
            .map(|v| format!("paused {} {:?}", v.paused, v.config))
            .collect()
    }

    /// Invariants 1, 3, 9 and 11, once healed and settled.
    pub(super) fn final_checks(&mut self) {
        self.trace(|| "settled".into());
        // Settling proves 1 and 3; re-check explicitly so a wrong `is_settled` cannot hide one.
        self.every_acknowledged_task_reaches_an_outcome();
        self.every_task_succeeds_beside_a_hostile_member();
        self.only_the_agreed_router_is_active();
        self.every_stored_document_belongs_to_a_joined_queue();
        self.every_member_holds_the_same_settings();
        self.no_slot_is_skipped_or_fired_twice();
    }

    /// Invariant 11: once healed and settled, every member's view of a queue holds the same
    /// settings (pause flag and configuration), however members changed them meanwhile.
    /// Settling waits for it (a run whose settings never agree does not settle, and fails);
    /// this re-checks it.
    fn every_member_holds_the_same_settings(&mut self) {
        for q in 0..self.members.len() {
            let Some(id) = self.queues[q].clone() else {
                continue;
            };
            let seen = self.settings_seen(&id);
            if seen.len() > 1 {
                self.violate(
                    11,
                    format!("members hold different settings of {id}: {seen:?}"),
                );
            }
        }
    }

    /// Invariant 1: every acknowledged task has an outcome on every member's replica
    /// ([`World::lost`]).
    fn every_acknowledged_task_reaches_an_outcome(&mut self) {
        let lost = self.lost();
        if lost > 0 {
            self.violate(1, format!("{lost} tasks without an outcome after settling"));
        }
    }

    /// Invariant 1, with a Byzantine member (whose mix has handlers that never fail): every
    /// acknowledged task ended `succeeded` (some view showed it so; invariant 2 keeps it so).
    fn every_task_succeeds_beside_a_hostile_member(&mut self) {
        if self.hostile.is_none() {
            return;
        }
        let not: Vec<TaskId> = self
            .submitted
            .keys()
            .filter(|t| !self.ever_succeeded.contains(*t))
            .cloned()
            .collect();
        if !not.is_empty() {
            self.violate(
                1,
                format!(
                    "{} tasks never succeeded beside the hostile member (first {})",
                    not.len(),
                    not[0]
                ),
            );
        }
    }

    /// Invariant 3: no node is active for a queue whose effective router, in its own view, is
    /// another (`is_settled` already required every member to name the same router, and that
    /// node alone to be active).
    fn only_the_agreed_router_is_active(&mut self) {
        for q in 0..self.members.len() {
            let Some(id) = self.queues[q].clone() else {
                continue;
            };
            for n in &self.nodes {
                if n.core.is_active(&id)
                    && n.core
                        .view(&id)
                        .and_then(|v| v.router.as_ref())
                        .map(|c| &c.peer)
                        != Some(&n.peer)
                {
                    let what =
                        format!("{} is active for {id} but not its effective router", n.peer);
                    self.violations.push(Violation {
                        invariant: 3,
                        at_ms: self.now_us / 1000,
                        what,
                    });
                    break;
                }
            }
        }
    }

    /// Invariant 9, at the end on every disk: every stored document is a joined queue's
    /// document, one of its epoch documents, or the document of one of its tasks.
    fn every_stored_document_belongs_to_a_joined_queue(&mut self) {
        // The node outside queue 1 never stored any of its documents. Judged from each disk:
        // the queues it remembers joining, and what each stored document says it is (an
        // epoch of such a queue, or a task of one: a finished task no epoch carries, or one
        // this node wrote for a submit lost with it before its acknowledgement).
        let mut strays = vec![];
        for (i, n) in self.nodes.iter().enumerate() {
            for doc in n.disk.docs.keys() {
                let ok = n.disk.queues.iter().any(|q| q.as_str() == doc.as_str())
                    || self.of_joined_queue(i, doc);
                if !ok {
                    strays.push(format!("node{i} holds {doc} on disk"));
                }
            }
        }
        for s in strays {
            self.violate(9, s);
        }
    }

    /// Acknowledged tasks that have no outcome on some member. A task counts as done on a
    /// member if its view shows it final, or if the member is on the queue's newest epoch,
    /// whose document no longer carries the task, and some node saw it final (a rotation
    /// leaves only final tasks behind).
    pub(super) fn lost(&self) -> usize {
        self.lost_tasks().len()
    }

    /// The acknowledged tasks without an outcome on some member (see [`World::lost`]).
    pub(super) fn lost_tasks(&self) -> Vec<TaskId> {
        // Per queue: its members and the newest epoch any of them is on.
        let mut per_queue: BTreeMap<&QueueId, (Vec<usize>, Option<Epoch>)> = BTreeMap::new();
        for queue in self.submitted.values() {
            if per_queue.contains_key(queue) {
                continue;
            }
            let q = self.queues.iter().position(|x| x.as_ref() == Some(queue));
            let members = q.map(|q| self.members[q].clone()).unwrap_or_default();
            let lineage = |i: usize| {
                let core = &self.nodes[i].core;
                core.epoch(queue)
                    .and_then(|(_, d)| core.document(d))
                    .map(piecework_queue_doc::epoch::read_lineage)
                    .unwrap_or_default()
            };
            let newest = members
                .iter()
                .max_by(|&&a, &&b| {
                    piecework_queue_doc::epoch::cmp_lineage(&lineage(a), &lineage(b))
                })
                .and_then(|&i| self.nodes[i].core.epoch(queue))
                .map(|(e, d)| (e, d.clone()));
            per_queue.insert(queue, (members, newest));
        }
        self.submitted
            .iter()
            .filter(|(id, queue)| {
                let (members, newest) = &per_queue[queue];
                let seen_final = || self.ever_final.contains(*id);
                !members.iter().all(|&i| {
                    let core = &self.nodes[i].core;
                    match core.view(queue).map(|v| v.task(id)) {
                        Some(Some(t)) => t.state().is_final(),
                        Some(None) => {
                            core.epoch(queue).map(|(e, d)| (e, d.clone())) == *newest
                                && seen_final()
                        }
                        None => false,
                    }
                })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The settle limit passed: invariants 3 and 1 failed (3 for each queue without a single
    /// agreed active router; 1 if nothing else did).
    pub(super) fn unsettled(&mut self) {
        // Where each node stands, for the trace.
        for q in self.queues.clone().into_iter().flatten() {
            let lines: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    format!(
                        "unsettled {q} node{i}: epoch {:?} role {:?} router {:?}",
                        n.core.epoch(&q),
                        n.core.role(&q),
                        n.core.view(&q).and_then(|v| v.router.clone())
                    )
                })
                .collect();
            for line in lines {
                self.trace(|| line);
            }
            // The tasks still open, as each member's view shows them.
            let open: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| Some((i, n.core.view(&q)?)))
                .flat_map(|(i, v)| {
                    v.tasks()
                        .values()
                        .filter(|t| !t.state().is_final())
                        .map(|t| {
                            format!(
                                "open on node{i}: {} {} waiting on {:?} not before {} key {:?} dup {:?}",
                                t.id,
                                t.state().as_str(),
                                t.waiting_on().collect::<Vec<_>>(),
                                t.rules.not_before,
                                t.rules.dedup_key,
                                t.duplicate_of
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            for line in open {
                self.trace(|| line);
            }
        }
        for t in self.lost_tasks() {
            self.trace(|| format!("lost {t}"));
        }
        let mut routers = vec![];
        for q in 0..self.members.len() {
            let Some(id) = self.queues[q].clone() else {
                continue;
            };
            for n in &self.nodes {
                routers.push(format!(
                    "{} on {q}: {:?} ({:?})",
                    n.peer,
                    n.core.view(&id).and_then(|v| v.router.clone()),
                    n.core.role(&id)
                ));
            }
            let active = self.nodes.iter().filter(|n| n.core.is_active(&id)).count();
            if self.everyone_agrees(q).is_none() || active != 1 {
                self.violate(
                    3,
                    format!("no single agreed active router of queue {q} after the settle limit"),
                );
            }
        }
        if self.violations.is_empty() {
            self.violate(1, format!("the cluster did not settle: {routers:?}"));
        }
    }
}

/// An epoch of a queue: its number and its document.
type Epoch = (u64, DocId);
