//! The routing policy: which pending tasks go to which idle workers, this round.
//!
//! - Tasks are taken in the queue's order ([`QueueView::pending`]): urgent first, then
//!   effective priority (the boosts of the task's tags, then its priority), then submit time
//!   (FIFO or LIFO), then id.
//! - A task waits until each of its dependencies succeeded ([`QueueView::waiting_on_dependencies`]),
//!   and a task with a not-before time until this router's wall clock reaches it
//!   ([`QueueView::timed`]; the clock is the one the router was told last, advanced by its
//!   monotonic clock). Due tasks are sorted into the order each plan: a plan costs the due
//!   timed tasks not yet assigned, plus the first one not due.
//! - A task goes only to an idle worker whose pool's heartbeat names its kind and every resource
//!   it requires ([`PoolBeat::lacks`]). Routable tasks are read by class (kind and required
//!   resources, [`QueueView::routable_by_need`]), only the classes some idle worker can run, so
//!   tasks no pool can run cost a plan nothing and hold back nothing behind them.
//! - A task whose open attempts are all on pools silent for `lease` is routed again.
//! - A task that failed waits `retry_delay(failures)` with jitter
//!   ([`piecework_queue_doc::QueueConfig::retry_delay_jittered_ms`]: a function of the task and its attempt number,
//!   so a successor computes the same), measured on this router's clock from when it first saw
//!   the failure. A requeued task with no attempt since goes at once (it is not retrying). A task whose last attempt was refused (by a fenced, busy
//!   or task-less worker) waits [`REFUSAL_BACKOFF`] doubled per refusal, at most
//!   [`MAX_REFUSAL_BACKOFF`], so that a task no worker can run does not spin.
//! - Idle workers are those of pools heard within three pool-heartbeat intervals (capped by the
//!   lease), whose node is not stopping, that have no open attempt in the document and report
//!   no unfinished run. They are
//!   taken index-first across pools (`0` of every pool, then `1`, …) to spread the load. Each
//!   assignment names the incarnation of the pool in the heartbeat it was based on, so that a
//!   restarted pool does not start work addressed to its earlier life.
//! - A task whose input is unavailable (no reachable member had its document) is not routed
//!   until a member marks it available; then it waits the refusal backoff like a refused one.
//! - A task whose attempt numbers are exhausted (`u64::MAX`, only ever written by a faulty
//!   peer) is not routed.
//! - A run whose end was recorded while its handler goes on (it ignored a cancel or timeout
//!   past its grace time: its pool's heartbeats report it `overdue`, and its end says so)
//!   keeps its worker busy and its task from being routed again, and counts against
//!   `concurrency`, while its pool is heard and reports it.
//! - `concurrency` caps tasks assigned or running at once, counting, while their pool is alive,
//!   runs that outlived their task's outcome and earlier runs of a task whose current attempts
//!   ended, and this router's attempts whose task a rotation sealed elsewhere dropped (for a
//!   lease, then while pool heartbeats report them);
//!   `rate_interval` allows one assignment per interval.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, PoolBeat, QueueId, QueueView, TaskEntry,
    TaskId, TaskState, WorkerId,
};

use crate::later;

/// The wait before routing a task again after its first refusal.
pub const REFUSAL_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait after refusals.
pub const MAX_REFUSAL_BACKOFF: Duration = Duration::from_secs(5);

/// Local retry schedule entry: the (failures, refusals) it was computed for, and not-before.
pub(crate) type RetryAt = ((u32, u32), Instant);

fn refusal_delay(refusals: u32) -> Duration {
    REFUSAL_BACKOFF
        .saturating_mul(1u32 << refusals.saturating_sub(1).min(16))
        .min(MAX_REFUSAL_BACKOFF)
}

pub(crate) struct Input<'a> {
    pub(crate) now: Instant,
    pub(crate) queue: &'a QueueId,
    pub(crate) me: &'a Claim,
    pub(crate) view: &'a QueueView,
    pub(crate) pools: &'a BTreeMap<PeerId, (Instant, &'a PoolBeat)>,
    pub(crate) started_at: Instant,
    pub(crate) retry_at: &'a mut HashMap<TaskId, RetryAt>,
    /// When this router first saw each open attempt (its lease runs from then at the earliest).
    /// Also: the worker's peer, for attempts that later leave the view.
    pub(crate) attempt_seen: &'a mut HashMap<(TaskId, AttemptId), (Instant, PeerId)>,
    pub(crate) last_assign: Option<Instant>,
    /// The wall clock at `now` (unix ms), if the router was told it: tasks whose not-before
    /// time it has reached are routable.
    pub(crate) wall_ms: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) assignments: Vec<Assignment>,
    /// When a timer could make more work routable (a retry, a lease, the rate interval).
    pub(crate) next_check: Option<Instant>,
    /// Task entries and workers this plan looked at (a work counter for tests: it depends on
    /// the live work, never on the queue's history).
    pub(crate) visited: usize,
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

pub(crate) fn plan(input: &mut Input<'_>) -> Plan {
    let mut plan = Plan::default();
    let view = input.view;
    // A queue of a schema version this node does not know is not routed: its records may mean
    // something else.
    if view.paused || !view.routable_version() {
        return plan;
    }
    let c = &view.config;
    let now = input.now;
    let lease = Duration::from_millis(c.lease_ms);
    let fresh = Duration::from_millis(c.pool_heartbeat_ms.saturating_mul(3).min(c.lease_ms));
    let heard_at = |peer: &PeerId| {
        input
            .pools
            .get(peer)
            .map_or(input.started_at, |(t, _)| *t)
            .max(input.started_at)
    };

    // The retry schedule: only pending tasks that failed or were refused before.
    let mut still_retrying = HashMap::new();
    let mut waiting: HashSet<&TaskId> = HashSet::new();
    // Runs whose end was recorded while their handler goes on (asked to stop, they did not
    // within their grace time), as live pools report them: their tasks are not routed again
    // until the handler returns, and each holds its worker against the concurrency limit.
    let mut overdue = 0u32;
    for (heard_at, beat) in input.pools.values() {
        if now.saturating_duration_since(*heard_at) > fresh {
            continue;
        }
        for r in beat.workers.iter().filter_map(|w| w.running.as_ref()) {
            if &r.queue == input.queue && (r.overdue || ended_overdue(view, r)) {
                plan.visited += 1;
                overdue += 1;
                if let Some((id, _)) = view.tasks().get_key_value(&r.task) {
                    waiting.insert(id);
                }
            }
        }
    }
    for t in view.retrying() {
        plan.visited += 1;
        let (failures, refusals) = (t.failures(), t.refusals());
        // A deferred attempt (its kind's failure policy paused a resource) waits like a
        // refusal: another pool may hold the resource.
        let last_refused = t.current_attempts().all(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Refused || f.deferred())
        });
        let delay = match last_refused {
            true => refusal_delay(refusals),
            false => Duration::from_millis(c.retry_delay_jittered_ms(failures, &t.id, t.last_n())),
        };
        let entry = match input.retry_at.get(&t.id) {
            Some(e) if e.0 == (failures, refusals) => *e,
            _ => ((failures, refusals), later(now, delay)),
        };
        still_retrying.insert(t.id.clone(), entry);
        if now < entry.1 {
            plan.next_check = earliest(plan.next_check, entry.1);
            waiting.insert(&t.id);
        }
    }
    *input.retry_at = still_retrying;

    // Tasks with open attempts: lease-expired ones are routed again, the others count against
    // the concurrency limit. An attempt's lease runs from the later of its pool's last
    // heartbeat and the moment this router first saw the attempt: an attempt that arrives
    // with a healed partition, assigned to a pool this router has not heard from while they
    // were apart, gets a whole lease for its pool's heartbeats to arrive too, instead of
    // being routed again at once while it runs.
    let mut active = overdue;
    let mut expired: Vec<&TaskEntry> = Vec::new();
    let mut seen = HashMap::new();
    let mut lease_end = |t: &TaskEntry, a: &piecework_queue_doc::Attempt| {
        let key = (t.id.clone(), a.id.clone());
        let first = input.attempt_seen.get(&key).map_or(now, |(t, _)| *t);
        seen.insert(key, (first, a.worker.peer.clone()));
        later(heard_at(&a.worker.peer).max(first), lease)
    };
    for t in view.with_open_attempts() {
        plan.visited += 1;
        // The run a task's state shows: its current attempts, while it is assigned or running.
        let shown = matches!(t.state(), TaskState::Assigned | TaskState::Running);
        if shown {
            let expires = t
                .current_attempts()
                .filter(|a| a.is_open())
                .map(|a| lease_end(t, a))
                .max();
            match expires {
                Some(e) if now >= e => expired.push(t),
                Some(e) => {
                    active += 1;
                    plan.next_check = earliest(plan.next_check, e);
                }
                None => {}
            }
        }
        // Runs its state does not show still hold their workers: each counts against the
        // concurrency limit until it ends or its pool's lease runs out. These are the open
        // attempts of a task that has an outcome (routers on both sides of a partition both
        // ran the task, and one run outlived the outcome), and the open attempts below the
        // current number of a task that is not final. Its current attempts may have ended
        // while an earlier run goes on, and the task is pending again: the other side's router
        // ran the task up to a higher number and those runs failed (simulator seed 212, where
        // the router counted its own run nowhere and assigned another task beside it). So do
        // such attempts whose start has not reached this router yet: their worker may have
        // started them before learning of the outcome or of the higher number.
        let last = t.last_n();
        let unshown = t
            .attempts
            .iter()
            .filter(|a| a.is_open() && !(shown && a.id.n == last))
            .filter(|a| now < lease_end(t, a))
            .count();
        active = active.saturating_add(u32::try_from(unshown).unwrap_or(u32::MAX));
    }
    // This router's open attempts whose task left the view: a rotation sealed by another
    // router dropped the task as finished while a run of it that this router assigned goes on
    // (routers on both sides of a partition both ran it). Its end can no longer be written, so
    // it holds its worker for a lease from when it was first seen, and then for as long as
    // its pool's heartbeats report it running.
    for (key, (first, peer)) in input.attempt_seen.iter() {
        let (task, attempt) = key;
        if seen.contains_key(key) || attempt.claim != *input.me || view.tasks().contains_key(task) {
            continue;
        }
        plan.visited += 1;
        let reported = input.pools.get(peer).is_some_and(|(at, beat)| {
            now.saturating_duration_since(*at) <= fresh
                && beat.workers.iter().any(|w| {
                    w.running
                        .as_ref()
                        .is_some_and(|r| r.task == *task && r.attempt == *attempt)
                })
        });
        let end = later(*first, lease);
        if reported || now < end {
            active += 1;
            if now < end {
                plan.next_check = earliest(plan.next_check, end);
            }
            seen.insert(key.clone(), (*first, peer.clone()));
        }
    }
    *input.attempt_seen = seen;

    // Tasks with a not-before time: those due by this router's wall clock join the
    // lease-expired ones; the first not yet due sets a timer.
    if let Some(wall) = input.wall_ms {
        for (at, t) in view.timed() {
            plan.visited += 1;
            if at > wall {
                let wait = Duration::from_millis(at - wall);
                plan.next_check = earliest(plan.next_check, later(now, wait));
                break;
            }
            if !waiting.contains(&t.id) {
                expired.push(t);
            }
        }
    }
    if expired.is_empty() && view.routable().next().is_none() {
        return plan;
    }
    let mut budget = usize::MAX;
    if c.concurrency > 0 {
        budget = budget.min(c.concurrency.saturating_sub(active) as usize);
    }
    if c.rate_interval_ms > 0 {
        let interval = Duration::from_millis(c.rate_interval_ms);
        match input.last_assign.filter(|t| now < later(*t, interval)) {
            Some(last) => {
                plan.next_check = earliest(plan.next_check, later(last, interval));
                budget = 0;
            }
            None => budget = budget.min(1),
        }
    }
    if budget == 0 {
        return plan;
    }
    let mut workers = idle_workers(input, view, fresh);
    plan.visited += workers.len();
    expired.sort_by(|a, b| view.route_cmp(a, b));
    assign(
        &mut plan,
        input.me,
        view,
        &waiting,
        expired,
        &mut workers,
        budget,
    );
    plan
}

/// A task at the head of one stream of candidates, ordered for a min-heap by the routing
/// order.
struct Head<'a> {
    view: &'a QueueView,
    task: &'a TaskEntry,
    /// The stream it came from: 0 for the lease-expired and due timed tasks, `1 + i` for the
    /// `i`-th class of routable tasks.
    stream: usize,
}

impl PartialEq for Head<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Head<'_> {}
impl PartialOrd for Head<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: `BinaryHeap` pops its greatest, the routing order's first.
        self.view
            .route_cmp(other.task, self.task)
            .then(other.stream.cmp(&self.stream))
    }
}

/// Hands out up to `budget` tasks to `workers` in routing order: the lease-expired and due
/// timed tasks (`expired`, sorted) merged with the routable ones. Routable tasks come by class
/// ([`Need`]: kind and required resources), and only the classes some idle worker's pool can
/// run are read at all; each task goes to the first idle worker (index-first across pools)
/// whose pool has its kind and every resource it requires. A class that no worker left can
/// run is dropped, so a plan visits the tasks it assigns, plus one per class.
fn assign<'a>(
    plan: &mut Plan,
    me: &Claim,
    view: &'a QueueView,
    waiting: &HashSet<&TaskId>,
    expired: Vec<&'a TaskEntry>,
    workers: &mut Vec<(WorkerId, u64, &PoolBeat)>,
    budget: usize,
) {
    let can_run = |beat: &PoolBeat, t: &TaskEntry| beat.lacks(&t.kind, &t.rules.requires).is_none();
    let visited = std::cell::Cell::new(0usize);
    let mut streams: Vec<Box<dyn Iterator<Item = &'a TaskEntry> + '_>> =
        vec![Box::new(expired.into_iter())];
    for (need, tasks) in view.routable_by_need() {
        let runnable = workers
            .iter()
            .any(|(_, _, b)| b.lacks(&need.kind, &need.requires).is_none());
        if runnable {
            let visited = &visited;
            streams.push(Box::new(
                tasks
                    .inspect(move |_| visited.set(visited.get() + 1))
                    .filter(|t| !waiting.contains(&t.id)),
            ));
        }
    }
    let mut heads = std::collections::BinaryHeap::new();
    for (stream, tasks) in streams.iter_mut().enumerate() {
        if let Some(task) = tasks.next() {
            heads.push(Head { view, task, stream });
        }
    }
    let mut given = 0usize;
    while given < budget && !workers.is_empty() {
        let Some(Head { task, stream, .. }) = heads.pop() else {
            break;
        };
        let worker = workers.iter().position(|(_, _, b)| can_run(b, task));
        let next_n = task.last_n().checked_add(1);
        match (worker, next_n) {
            // No worker left can run this class: drop it (a lease-expired or due task is
            // skipped alone).
            (None, _) if stream > 0 => continue,
            (Some(i), Some(n)) => {
                let (worker, incarnation, _) = workers.remove(i);
                plan.assignments.push(Assignment {
                    task: task.id.clone(),
                    attempt: AttemptId {
                        n,
                        claim: me.clone(),
                    },
                    worker,
                    incarnation,
                });
                given += 1;
            }
            _ => {}
        }
        if let Some(task) = streams[stream].next() {
            heads.push(Head { view, task, stream });
        }
    }
    drop(heads);
    drop(streams);
    plan.visited += visited.get();
}

/// Whether the document shows a reported run's attempt ended while its handler went on (past
/// its grace time): a heartbeat sent before the pool recorded that end still reports it
/// running, and it is, until a later heartbeat says otherwise.
fn ended_overdue(view: &QueueView, r: &piecework_queue_doc::RunningReport) -> bool {
    view.tasks()
        .get(&r.task)
        .and_then(|t| t.attempt(&r.attempt))
        .and_then(|a| a.finished.as_ref())
        .is_some_and(|f| f.overdue())
}

/// Idle workers, each with the incarnation of its pool's heartbeat, and that heartbeat.
fn idle_workers<'a>(
    input: &Input<'a>,
    view: &QueueView,
    fresh: Duration,
) -> Vec<(WorkerId, u64, &'a PoolBeat)> {
    let open = view.open_attempts();
    let mut idle: Vec<(WorkerId, u64, &PoolBeat)> = Vec::new();
    for (peer, (heard_at, beat)) in input.pools {
        if input.now.saturating_duration_since(*heard_at) > fresh
            || !view.may_work(peer)
            || beat.draining
        {
            continue;
        }
        for w in &beat.workers {
            let id = WorkerId::new(peer.clone(), w.index);
            if open.contains_key(&id) {
                continue;
            }
            let busy = w.running.as_ref().is_some_and(|r| {
                // A run the document does not show finished yet keeps the worker busy, and so
                // does one whose end was recorded while its handler goes on (asked to stop, it
                // did not within its grace time).
                r.overdue
                    || ended_overdue(view, r)
                    || &r.queue != input.queue
                    || view
                        .tasks()
                        .get(&r.task)
                        .and_then(|t| t.attempt(&r.attempt))
                        .is_none_or(|a| a.is_open())
            });
            if !busy {
                idle.push((id, beat.incarnation, beat));
            }
        }
    }
    idle.sort_by(|(a, ..), (b, ..)| a.index.cmp(&b.index).then(a.peer.cmp(&b.peer)));
    idle
}
