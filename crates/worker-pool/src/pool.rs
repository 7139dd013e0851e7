//! The pool state machine: which assignments to start, refuse or mark interrupted, and the
//! pool's heartbeat. Pure: time comes in as `now`, effects go out as [`Action`]s.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use piecework_queue_doc::{
    Attempt, AttemptId, AttemptOutcome, DEFERRED, FailurePolicy, GRACE_RAN_OUT, IGNORED, PeerId,
    PoolBeat, Progress, QueueConfig, QueueId, QueueView, RunningReport, TaskEntry, TaskId,
    WorkerId, WorkerReport,
};

/// A pool's fixed settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The pool's peer.
    pub peer: PeerId,
    /// How many task workers the pool runs.
    pub workers: u32,
    /// How many times this node has started; tells this start's runs from earlier ones.
    pub incarnation: u64,
    /// How often the pool beats (the smallest `pool_heartbeat_ms` of the queues it serves is a
    /// good choice). [`Pool::new`] and [`Pool::set_heartbeat`] clamp it to the queue
    /// configuration's pool heartbeat range,
    /// [`MIN_POOL_HEARTBEAT_MS`](QueueConfig::MIN_POOL_HEARTBEAT_MS) to
    /// [`MAX_POOL_HEARTBEAT_MS`](QueueConfig::MAX_POOL_HEARTBEAT_MS).
    pub heartbeat: Duration,
}

/// An attempt a worker is running or about to run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// The worker.
    pub worker: WorkerId,
    /// The task's queue.
    pub queue: QueueId,
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: AttemptId,
    /// The handler kind.
    pub kind: String,
    /// Which run of the task this is over its whole life, this one included (refusals do not
    /// count; a requeue does not reset it): what the handler sees as its attempt.
    pub number: u64,
}

impl Run {
    /// The action that records this run's end.
    fn finish(
        self,
        outcome: AttemptOutcome,
        error: Option<String>,
        started_by: Option<u64>,
        overdue: bool,
    ) -> Action {
        Action::Finish {
            worker: self.worker,
            queue: self.queue,
            task: self.task,
            attempt: self.attempt,
            outcome,
            error,
            started_by,
            overdue,
        }
    }
}

/// How long a handler that was asked to stop (its task cancelled, or its run timed out) may
/// go on before its end is recorded without it: [`Pool::set_cancel_grace`].
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Why a run was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// A member cancelled its task.
    Cancelled,
    /// It ran past its timeout (ms).
    TimedOut(u64),
}

impl Why {
    /// The error recorded: with the handler's, or without it when its grace time ran out.
    fn error(self, handler: Option<&str>) -> String {
        match (self, handler) {
            (Why::TimedOut(ms), Some(_)) => format!("timed out after {ms} ms"),
            (Why::TimedOut(ms), None) => format!("timed out after {ms} ms {GRACE_RAN_OUT}"),
            (Why::Cancelled, Some(e)) => format!("cancelled: {e}"),
            (Why::Cancelled, None) => format!("cancelled {GRACE_RAN_OUT}"),
        }
    }
}

/// A run's timers: its timeout, and once asked to stop, its grace time. Both run only once its
/// handler was handed over ([`Pool::handle_started`]): fetching the task's input and writing
/// the start may take a while, and a run not under way can neither be signalled nor outlive a
/// grace time.
#[derive(Clone, Debug)]
struct Watch {
    /// Its timeout in ms (0: none).
    timeout_ms: u64,
    /// Once started: when it times out, and after how many ms (none without a timeout).
    timeout: Option<(Instant, u64)>,
    /// Its handler was handed over.
    started: bool,
    /// Asked to stop: why, until when it may go on, and whether its end was recorded without
    /// it (the worker stays busy until the handler returns).
    stop: Option<(Why, Instant, bool)>,
    /// The progress its handler last reported.
    progress: Option<Progress>,
}

/// Something the driver must do for the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Record the start in the queue and task documents, then run the handler. Report its end
    /// with [`Pool::handle_finished`].
    Start(Run),
    /// Signal the run's handler to stop (its cancellation token): its task was cancelled or it
    /// ran past its timeout. Report its end as usual; a handler that does not return within
    /// the grace time has its end recorded without it ([`Action::Finish`] with `overdue`).
    Cancel(Run),
    /// Record this end of an attempt in the queue document (and, for a run that had started,
    /// in the task document's run record of that incarnation).
    Finish {
        /// The worker the attempt was assigned to.
        worker: WorkerId,
        /// The task's queue.
        queue: QueueId,
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: AttemptId,
        /// How it ended.
        outcome: AttemptOutcome,
        /// The error or the refusal's reason.
        error: Option<String>,
        /// The incarnation that started the run, if it started.
        started_by: Option<u64>,
        /// The run was asked to stop and its handler did not return within the grace time:
        /// no handler end will record this run in its task document, the driver does (the
        /// worker stays busy until the handler returns).
        overdue: bool,
    },
    /// Broadcast this heartbeat on every queue the pool serves.
    Beat(PoolBeat),
}

/// How a handler run ended, as the runner reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// The handler returned a result.
    Succeeded,
    /// The handler returned an error, panicked or timed out.
    Failed(String),
}

/// A node's pool of task workers. Drive it like the router: `handle_*` in, `poll_action` out,
/// `poll_timeout` for the next deadline.
#[derive(Debug)]
pub struct Pool {
    config: Config,
    slots: Vec<Option<Run>>,
    /// The timers of running slots, by worker index.
    watches: BTreeMap<u32, Watch>,
    /// Each queue's failure policies, from its last view.
    policies: BTreeMap<QueueId, BTreeMap<String, FailurePolicy>>,
    /// See [`Pool::set_cancel_grace`].
    grace: Duration,
    /// The time of the last [`Pool::handle_timeout`].
    last_now: Instant,
    /// Attempts this pool already answered (start, refusal, interruption); the view may not
    /// show the answer yet.
    answered: BTreeSet<(QueueId, TaskId, AttemptId)>,
    next_beat: Instant,
    counter: u64,
    /// The node is stopping ([`Pool::drain`]): nothing new starts.
    draining: bool,
    /// The handler kinds the pool runs ([`Pool::set_kinds`]); `None`: any (not reported).
    kinds: Option<BTreeSet<String>>,
    /// The resources the pool holds ([`Pool::add_resource`]).
    held: BTreeSet<String>,
    /// Resources withdrawn for a while, with when each is held again.
    withdrawn: BTreeMap<String, Instant>,
    actions: VecDeque<Action>,
    /// A deliberately broken pool that starts fenced assignments, for the simulator's test
    /// that it catches a broken protocol. Exists only with the `broken` feature.
    #[cfg(feature = "broken")]
    skip_fencing: bool,
}

impl Pool {
    /// Breaks this pool on purpose: it stops fencing (starts assignments from deposed routers).
    /// Only for proving that the simulator catches it; never enable it elsewhere.
    #[cfg(feature = "broken")]
    pub fn break_fencing(&mut self) {
        self.skip_fencing = true;
    }

    fn fencing(&self) -> bool {
        #[cfg(feature = "broken")]
        if self.skip_fencing {
            return false;
        }
        true
    }

    /// A pool with every worker idle, started at `now`; it beats at once. The heartbeat is
    /// clamped into its range (see [`Config::heartbeat`]).
    pub fn new(mut config: Config, now: Instant) -> Self {
        config.heartbeat = clamp_heartbeat(config.heartbeat);
        let slots = vec![None; config.workers as usize];
        Pool {
            config,
            slots,
            watches: BTreeMap::new(),
            policies: BTreeMap::new(),
            grace: CANCEL_GRACE,
            last_now: now,
            answered: BTreeSet::new(),
            next_beat: now,
            counter: 0,
            draining: false,
            kinds: None,
            held: BTreeSet::new(),
            withdrawn: BTreeMap::new(),
            actions: VecDeque::new(),
            #[cfg(feature = "broken")]
            skip_fencing: false,
        }
    }

    /// The pool's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes how often the pool beats, from the next beat on; clamped into its range (see
    /// [`Config::heartbeat`]), so a zero interval cannot busy-loop the pool or flood gossip.
    pub fn set_heartbeat(&mut self, every: Duration) {
        self.config.heartbeat = clamp_heartbeat(every);
    }

    /// How long a handler asked to stop may go on before its end is recorded without it
    /// ([`CANCEL_GRACE`] unless set).
    pub fn set_cancel_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// The handler kinds this pool runs: its heartbeats say so (routers assign it only tasks
    /// of these kinds), and it refuses an assignment of another kind. Until this is called a
    /// pool reports no kinds, and routers take it to run any.
    pub fn set_kinds(&mut self, kinds: impl IntoIterator<Item = String>) {
        self.kinds = Some(kinds.into_iter().collect());
    }

    /// The pool holds `resource` from `now` on (again, if it was withdrawn): it beats at once.
    pub fn add_resource(&mut self, resource: String, now: Instant) {
        self.withdrawn.remove(&resource);
        self.held.insert(resource);
        self.next_beat = now;
    }

    /// The pool gives `resource` up at `now`: for `restore_after`, after which it holds it
    /// again by itself, or for good with `None`. It beats at once, and refuses assignments
    /// that require the resource meanwhile. Returns whether it held or was waiting to restore
    /// the resource; if it was neither, nothing changes (a withdrawal never makes the pool hold
    /// a resource it did not have).
    pub fn withdraw_resource(
        &mut self,
        resource: &str,
        now: Instant,
        restore_after: Option<Duration>,
    ) -> bool {
        let known = self.held.remove(resource) | self.withdrawn.remove(resource).is_some();
        if !known {
            return false;
        }
        if let Some(d) = restore_after {
            self.withdrawn
                .insert(resource.to_owned(), now.checked_add(d).unwrap_or(now));
        }
        self.next_beat = now;
        true
    }

    /// The resources the pool holds, and those withdrawn with when each is restored.
    pub fn resources(&self) -> (&BTreeSet<String>, &BTreeMap<String, Instant>) {
        (&self.held, &self.withdrawn)
    }

    /// The handler kinds the pool reports, if set ([`Pool::set_kinds`]).
    pub fn kinds(&self) -> Option<&BTreeSet<String>> {
        self.kinds.as_ref()
    }

    /// What each worker is running.
    pub fn runs(&self) -> impl Iterator<Item = (u32, Option<&Run>)> {
        (0u32..).zip(self.slots.iter().map(Option::as_ref))
    }

    /// How many workers are idle.
    pub fn idle(&self) -> usize {
        self.slots.iter().filter(|s| s.is_none()).count()
    }

    /// Whether the pool is draining ([`Pool::drain`]).
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// The node is stopping: from now on the pool starts nothing (an assignment is refused,
    /// so that its router routes the task elsewhere at once), and its heartbeats, the next one
    /// at `now`, say so ([`PoolBeat::draining`]), so that routers assign it nothing. Runs in
    /// progress go on until they end or [`Pool::interrupt`] ends them.
    pub fn drain(&mut self, now: Instant) {
        if !self.draining {
            self.draining = true;
            self.next_beat = now;
        }
    }

    /// Ends the run on worker `index` as interrupted, with `reason`, without waiting for its
    /// handler (a stopping node whose grace time ran out); its later end is ignored. Returns
    /// `false` (and does nothing) if the worker was not running.
    pub fn interrupt(&mut self, index: u32, reason: String) -> bool {
        let started_by = Some(self.config.incarnation);
        self.end_slot(index, AttemptOutcome::Interrupted, reason, started_by)
    }

    /// The queue document of `queue` changed: answer every open attempt assigned to this pool.
    ///
    /// An attempt started by an earlier incarnation of this node is marked interrupted. An
    /// attempt not yet started is started only if
    ///
    /// - its task has no outcome yet,
    /// - it is addressed to this incarnation of the pool ([`Attempt::pool_incarnation`]; an
    ///   attempt written before assignments named one is accepted), so that a restarted node
    ///   never starts work assigned to its earlier life, which may have been routed again
    ///   since,
    /// - it is the task's current attempt (no attempt with a greater number exists),
    /// - its router's claim is not below the effective router (from the view: heartbeats
    ///   raise no fence),
    /// - the pool has a handler for its kind and holds every resource it requires
    ///   ([`Pool::set_kinds`], [`Pool::add_resource`]: the router may have gone by an earlier
    ///   heartbeat),
    /// - this node is not stopping ([`Pool::drain`]),
    /// - no other attempt of the task is running: none open and started with the same or a
    ///   greater number, and none on this pool (an open, started attempt with a smaller number
    ///   on another pool is one the router gave up on after its lease: running again is the
    ///   point), and
    /// - its worker exists and is idle;
    ///
    /// otherwise it is refused, with the reason.
    ///
    /// [`Attempt::pool_incarnation`]: piecework_queue_doc::Attempt::pool_incarnation
    ///
    /// A run of this pool whose task the view shows a cancel request for is asked to stop
    /// ([`Action::Cancel`]), once.
    pub fn handle_view(&mut self, queue: &QueueId, view: &Arc<QueueView>, now: Instant) {
        // A queue of a schema version this node does not know: its assignments are not run.
        if !view.routable_version() {
            return;
        }
        if self.policies.get(queue) != Some(&view.config.failure_policy) {
            self.policies
                .insert(queue.clone(), view.config.failure_policy.clone());
        }
        let me = &self.config.peer;
        // Only the document raises a fence: a heartbeat's claim the document does not hold
        // could be anything a member chose, up to the term bound.
        let fence = view.router.clone().filter(|_| self.fencing());
        // Forget answers the view now shows, so the set stays as small as the open attempts.
        self.answered.retain(|(q, t, a)| {
            q != queue
                || view
                    .tasks()
                    .get(t)
                    .and_then(|e| e.attempt(a))
                    .is_none_or(|a| a.is_open())
        });
        for (task, attempt) in view.open_attempts_of(me) {
            let key = (queue.clone(), task.id.clone(), attempt.id.clone());
            if self.answered.contains(&key) {
                continue;
            }
            let finish = |outcome, error: String, started_by| Action::Finish {
                worker: attempt.worker.clone(),
                queue: queue.clone(),
                task: task.id.clone(),
                attempt: attempt.id.clone(),
                outcome,
                error: Some(error),
                started_by,
                overdue: false,
            };
            let action = if let Some(started) = &attempt.started {
                if started.incarnation == self.config.incarnation {
                    continue; // ours, running (or just finished: its Finish is on its way)
                }
                finish(
                    AttemptOutcome::Interrupted,
                    format!(
                        "the worker's node restarted (incarnation {} -> {})",
                        started.incarnation, self.config.incarnation
                    ),
                    Some(started.incarnation),
                )
            } else if task.state().is_final() {
                // Two routers on either side of a partition can both route a task; once one
                // run's outcome has merged in, the other router's assignment must not run it
                // again (nor count against a concurrency limit no router can see).
                finish(
                    AttemptOutcome::Refused,
                    format!("the task already has an outcome: {:?}", task.state()),
                    None,
                )
            } else if let Some(dep) = task.waiting_on().next() {
                // A worker checks dependencies again before it starts: its replica must hold
                // each one's success too.
                finish(
                    AttemptOutcome::Refused,
                    format!("dependency {dep} has not succeeded here"),
                    None,
                )
            } else if let Some(addressed) = attempt
                .pool_incarnation
                .filter(|i| *i != self.config.incarnation)
            {
                // A restarted node: the assignment was made to its earlier life, and the task
                // may have been routed again since (and be running elsewhere).
                finish(
                    AttemptOutcome::Refused,
                    format!(
                        "stale: assigned to incarnation {addressed} of this pool, this is incarnation {}",
                        self.config.incarnation
                    ),
                    None,
                )
            } else if attempt.id.n < task.last_n() {
                finish(
                    AttemptOutcome::Refused,
                    format!(
                        "superseded: the task has attempt #{} already",
                        task.last_n()
                    ),
                    None,
                )
            } else if let Some(f) = fence.as_ref().filter(|f| attempt.id.claim < **f) {
                finish(
                    AttemptOutcome::Refused,
                    format!(
                        "fenced: assigned by {}, but {} is the router",
                        attempt.id.claim, f
                    ),
                    None,
                )
            } else if let Some(lack) = self.lacks(task) {
                finish(AttemptOutcome::Refused, lack, None)
            } else if self.draining {
                finish(
                    AttemptOutcome::Refused,
                    "the worker's node is stopping".to_owned(),
                    None,
                )
            } else if let Some(running) = self.running_elsewhere(queue, task, attempt) {
                finish(
                    AttemptOutcome::Refused,
                    format!("the task is running already: {running}"),
                    None,
                )
            } else {
                match self.slots.get(attempt.worker.index as usize) {
                    None => finish(
                        AttemptOutcome::Refused,
                        format!("this pool has no worker {}", attempt.worker.index),
                        None,
                    ),
                    Some(Some(busy)) => finish(
                        AttemptOutcome::Refused,
                        format!("worker busy with {} {}", busy.task, busy.attempt),
                        None,
                    ),
                    Some(None) => {
                        let run = Run {
                            worker: attempt.worker.clone(),
                            queue: queue.clone(),
                            task: task.id.clone(),
                            attempt: attempt.id.clone(),
                            kind: task.kind.clone(),
                            number: task.runs_started().saturating_add(1),
                        };
                        self.slots[attempt.worker.index as usize] = Some(run.clone());
                        let timeout_ms = match task.rules.timeout_ms {
                            0 => view.config.timeout_ms,
                            ms => ms,
                        };
                        let watch = Watch {
                            timeout_ms,
                            progress: None,
                            timeout: None,
                            started: false,
                            stop: None,
                        };
                        self.watches.insert(attempt.worker.index, watch);
                        Action::Start(run)
                    }
                }
            };
            self.answered.insert(key);
            self.actions.push_back(action);
        }
        // Runs whose task a member cancelled: asked to stop, once.
        for (index, slot) in (0u32..).zip(&self.slots) {
            let Some(run) = slot.as_ref().filter(|r| &r.queue == queue) else {
                continue;
            };
            let cancelled = view
                .tasks()
                .get(&run.task)
                .is_some_and(|t| t.cancel_requested());
            if let Some(w) = self.watches.get_mut(&index)
                && cancelled
                && w.started
                && w.stop.is_none()
            {
                w.stop = Some((Why::Cancelled, later(now, self.grace), false));
                self.actions.push_back(Action::Cancel(run.clone()));
            }
        }
    }

    /// Why this pool cannot run `task`: no handler for its kind, or a required resource it
    /// does not hold (withdrawn since the heartbeat the assignment was based on).
    fn lacks(&self, task: &TaskEntry) -> Option<String> {
        if let Some(kinds) = &self.kinds
            && !kinds.contains(&task.kind)
        {
            return Some(format!("no handler for kind {:?} on this node", task.kind));
        }
        task.rules
            .requires
            .iter()
            .find(|r| !self.held.contains(*r))
            .map(|r| format!("resource {r:?} is not held on this node"))
    }

    /// Another run of `task` that starting `attempt` would duplicate: one of this pool's workers
    /// runs the task, or the document shows another attempt open and started that `attempt`
    /// does not supersede (same or greater number) or that this incarnation started.
    fn running_elsewhere(
        &self,
        queue: &QueueId,
        task: &TaskEntry,
        attempt: &Attempt,
    ) -> Option<String> {
        if let Some(run) = self
            .slots
            .iter()
            .flatten()
            .find(|r| &r.queue == queue && r.task == task.id)
        {
            return Some(format!("attempt {} on worker {}", run.attempt, run.worker));
        }
        task.attempts
            .iter()
            .filter(|o| o.id != attempt.id && o.is_open())
            .find(|o| {
                o.started.as_ref().is_some_and(|s| {
                    o.id.n >= attempt.id.n
                        || (o.worker.peer == self.config.peer
                            && s.incarnation == self.config.incarnation)
                })
            })
            .map(|o| format!("attempt {} on worker {}", o.id, o.worker))
    }

    /// The handler of the run on worker `index` was handed over at `now`: its timeout runs from
    /// now, and it can be signalled to stop.
    pub fn handle_started(&mut self, index: u32, now: Instant) {
        if let Some(w) = self.watches.get_mut(&index) {
            w.started = true;
            w.timeout = (w.timeout_ms > 0).then(|| {
                let at = now
                    .checked_add(Duration::from_millis(w.timeout_ms))
                    .unwrap_or(now);
                (at, w.timeout_ms)
            });
        }
    }

    /// The handler of the run on worker `index` reported `progress`: the pool's next heartbeats
    /// carry it (not a document change per report).
    pub fn handle_progress(&mut self, index: u32, progress: Progress) {
        if let Some(w) = self.watches.get_mut(&index) {
            w.progress = Some(progress);
        }
    }

    /// The progress the handler of the run on worker `index` last reported.
    pub fn progress(&self, index: u32) -> Option<Progress> {
        self.watches.get(&index).and_then(|w| w.progress)
    }

    /// The run on worker `index` ended at `now`: the end to record, which [`Action::Finish`]
    /// follows. A run asked to stop ends `failed` whatever its handler returned if it timed out
    /// ("timed out after N ms"), and if its task was cancelled, `failed` ("cancelled: ...")
    /// unless the handler succeeded (a success stands). `None` (and nothing to record) if the
    /// worker was not running, or its end was recorded already when its grace time ran out.
    ///
    /// A failure (a timeout included) then follows its kind's failure policy in the queue's
    /// configuration: `ignore` marks the error [`IGNORED`] (the task is dead-lettered at
    /// once); `pause_resource` withdraws the resource from this pool until its restore time
    /// and marks the error [`DEFERRED`] (the attempt does not count towards `max_attempts`).
    pub fn handle_finished(
        &mut self,
        index: u32,
        end: RunEnd,
        now: Instant,
    ) -> Option<(AttemptOutcome, Option<String>)> {
        let run = self.slots.get_mut(index as usize).and_then(Option::take)?;
        let stop = self.watches.remove(&index).and_then(|w| w.stop);
        let (outcome, error) = match (end, stop) {
            (_, Some((_, _, true))) => {
                // The beat says the worker is free again.
                self.next_beat = self.next_beat.min(self.last_now);
                return None;
            }
            (RunEnd::Succeeded, None | Some((Why::Cancelled, ..))) => {
                (AttemptOutcome::Succeeded, None)
            }
            (RunEnd::Failed(e), None) => (AttemptOutcome::Failed, Some(e)),
            (RunEnd::Failed(e), Some((why, ..))) => {
                (AttemptOutcome::Failed, Some(why.error(Some(&e))))
            }
            (RunEnd::Succeeded, Some((why, ..))) => (
                AttemptOutcome::Failed,
                Some(why.error(Some("it returned a result"))),
            ),
        };
        let cancelled = matches!(stop, Some((Why::Cancelled, ..)));
        let error = match (outcome, error) {
            (AttemptOutcome::Failed, Some(e)) if !cancelled => {
                Some(self.apply_policy(&run, e, now))
            }
            (_, e) => e,
        };
        let started_by = Some(self.config.incarnation);
        let finish = run.finish(outcome, error.clone(), started_by, false);
        self.actions.push_back(finish);
        Some((outcome, error))
    }

    /// What run's kind's failure policy makes of its failure `error`, at `now`.
    fn apply_policy(&mut self, run: &Run, error: String, now: Instant) -> String {
        let policy = self
            .policies
            .get(&run.queue)
            .and_then(|p| p.get(&run.kind))
            .cloned();
        match policy {
            None | Some(FailurePolicy::Retry) => error,
            Some(FailurePolicy::Ignore) => format!("{IGNORED}{error}"),
            Some(FailurePolicy::PauseResource {
                resource,
                restore_after_ms,
            }) => {
                let restore = Duration::from_millis(restore_after_ms);
                self.withdraw_resource(&resource, now, Some(restore));
                format!("{DEFERRED}resource {resource} paused for {restore_after_ms} ms: {error}")
            }
        }
    }

    /// The run on worker `index` could not start (its task document is unavailable, or the
    /// start could not be recorded): free the worker and refuse the attempt with `reason`.
    pub fn handle_start_failed(&mut self, index: u32, reason: String) -> bool {
        self.not_started(index, AttemptOutcome::Refused, reason)
    }

    /// The run on worker `index` could not start because no reachable member has the task's
    /// document: free the worker and end the attempt `Unavailable` (the task waits, unrouted,
    /// until a member holding the document marks it available).
    pub fn handle_input_unavailable(&mut self, index: u32, reason: String) -> bool {
        self.not_started(index, AttemptOutcome::Unavailable, reason)
    }

    /// Frees worker `index`, whose run never started, and ends its attempt with `outcome`.
    fn not_started(&mut self, index: u32, outcome: AttemptOutcome, reason: String) -> bool {
        self.end_slot(index, outcome, reason, None)
    }

    /// Frees worker `index` and ends its attempt with `outcome` and `reason`, as started by
    /// `started_by` (if it started). `false` if the worker was idle.
    fn end_slot(
        &mut self,
        index: u32,
        outcome: AttemptOutcome,
        reason: String,
        started_by: Option<u64>,
    ) -> bool {
        let Some(run) = self.slots.get_mut(index as usize).and_then(Option::take) else {
            return false;
        };
        let overdue = self
            .watches
            .remove(&index)
            .and_then(|w| w.stop)
            .is_some_and(|(_, _, recorded)| recorded);
        if !overdue {
            let finish = run.finish(outcome, Some(reason), started_by, false);
            self.actions.push_back(finish);
        }
        true
    }

    /// A deadline from [`Pool::poll_timeout`] passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = now;
        // Runs past their timeout are asked to stop; those past their grace time too have
        // their end recorded without them.
        for (index, w) in self.watches.iter_mut() {
            let Some(run) = self.slots.get(*index as usize).and_then(Option::as_ref) else {
                continue;
            };
            match (&mut w.stop, w.timeout) {
                (None, Some((at, ms))) if at <= now => {
                    w.stop = Some((Why::TimedOut(ms), later(now, self.grace), false));
                    self.actions.push_back(Action::Cancel(run.clone()));
                }
                (Some((why, until, recorded)), _) if !*recorded && *until <= now => {
                    *recorded = true;
                    let started_by = Some(self.config.incarnation);
                    let error = Some(why.error(None));
                    let finish =
                        run.clone()
                            .finish(AttemptOutcome::Failed, error, started_by, true);
                    self.actions.push_back(finish);
                    self.next_beat = now;
                }
                _ => {}
            }
        }
        let due: Vec<String> = self
            .withdrawn
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(r, _)| r.clone())
            .collect();
        for r in due {
            self.withdrawn.remove(&r);
            self.held.insert(r);
            self.next_beat = now;
        }
        if now >= self.next_beat {
            self.counter += 1;
            let workers = self
                .runs()
                .map(|(index, run)| WorkerReport {
                    index,
                    running: run.map(|r| RunningReport {
                        queue: r.queue.clone(),
                        task: r.task.clone(),
                        attempt: r.attempt.clone(),
                        overdue: self
                            .watches
                            .get(&index)
                            .and_then(|w| w.stop)
                            .is_some_and(|(_, _, recorded)| recorded),
                        progress: self.watches.get(&index).and_then(|w| w.progress),
                    }),
                })
                .collect();
            self.actions.push_back(Action::Beat(PoolBeat {
                peer: self.config.peer.clone(),
                incarnation: self.config.incarnation,
                counter: self.counter,
                workers,
                epoch: None,
                draining: self.draining,
                kinds: self.kinds.as_ref().map(|k| k.iter().cloned().collect()),
                resources: self.held.iter().cloned().collect(),
            }));
            // The heartbeat is clamped (a minute at most): the sum fits.
            self.next_beat = now.checked_add(self.config.heartbeat).unwrap_or(now);
        }
    }

    /// The next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Pool::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Instant {
        let timers = self.watches.values().filter_map(|w| match w.stop {
            None => w.timeout.map(|(at, _)| at),
            Some((_, until, false)) => Some(until),
            Some((_, _, true)) => None,
        });
        self.withdrawn
            .values()
            .copied()
            .chain(timers)
            .fold(self.next_beat, |t, at| t.min(at))
    }
}

fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or(t)
}

/// A pool heartbeat interval within the queue configuration's range.
fn clamp_heartbeat(every: Duration) -> Duration {
    every.clamp(
        Duration::from_millis(QueueConfig::MIN_POOL_HEARTBEAT_MS),
        Duration::from_millis(QueueConfig::MAX_POOL_HEARTBEAT_MS),
    )
}
