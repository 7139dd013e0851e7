//! Read views of a queue document: the effective router, members, tasks and their states.
//!
//! A view is computed from the document alone, so every replica holding the same changes
//! computes the same view, whatever order the changes arrived in.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use automerge::{Automerge, ObjId, ObjType, ROOT, ReadDoc, ValueRef};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::config::{Order, QueueConfig};
use crate::ids::{AttemptId, Claim, PeerId, TaskId, WorkerId};
use crate::keys;
use crate::packed;
use crate::queue::MAX_PRIORITY;

/// How an attempt ended.
///
/// When concurrent writes leave an attempt with more than one ending (possible only after a
/// node restarted from a copy that lacked its own last writes), the greatest by this order wins:
/// `Succeeded > Failed > Interrupted > Unavailable > Refused`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptOutcome {
    /// The worker did not start it: fenced, busy, superseded, or the task already ran.
    Refused,
    /// The worker could not get the task's input: no reachable member had its document. The
    /// task waits in [`TaskState::InputUnavailable`] until a member that has it says so.
    Unavailable,
    /// The worker's node restarted while the attempt ran.
    Interrupted,
    /// The handler returned an error, panicked or timed out.
    Failed,
    /// The handler returned a result.
    Succeeded,
}

impl AttemptOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Refused => "refused",
            AttemptOutcome::Unavailable => "unavailable",
            AttemptOutcome::Interrupted => "interrupted",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Succeeded => "succeeded",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "refused" => AttemptOutcome::Refused,
            "unavailable" => AttemptOutcome::Unavailable,
            "interrupted" => AttemptOutcome::Interrupted,
            "failed" => AttemptOutcome::Failed,
            "succeeded" => AttemptOutcome::Succeeded,
            _ => return None,
        })
    }

    /// Whether the attempt counts towards the task's `max_attempts`.
    pub fn is_failure(self) -> bool {
        matches!(self, AttemptOutcome::Failed | AttemptOutcome::Interrupted)
    }
}

/// The start of an attempt, written by the worker's pool before the handler runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// Wall-clock time of the start (unix ms, the worker's clock).
    pub at: u64,
    /// The pool's incarnation (how many times its node had started).
    pub incarnation: u64,
}

/// The end of an attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finished {
    /// Wall-clock time (unix ms, the worker's clock).
    pub at: u64,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error or refusal reason, if any.
    pub error: Option<String>,
}

/// One attempt at a task: an assignment to a worker, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The attempt's number and router.
    pub id: AttemptId,
    /// The worker it was assigned to.
    pub worker: WorkerId,
    /// The incarnation of the worker's pool the assignment is addressed to (the one the router
    /// had heard from). A pool of another incarnation never starts it. `None` in attempts
    /// written before assignments named an incarnation.
    pub pool_incarnation: Option<u64>,
    /// Wall-clock time of the assignment (unix ms, the router's clock).
    pub assigned_at: u64,
    /// Set once the worker started it.
    pub started: Option<Started>,
    /// Set once it ended.
    pub finished: Option<Finished>,
}

impl Attempt {
    /// Assigned or running, not yet ended.
    pub fn is_open(&self) -> bool {
        self.finished.is_none()
    }
}

/// Where a task stands, derived from its attempts.
///
/// States are ordered by rank: the non-final states rank 0, `Failed` 1, `Succeeded` 2. A final
/// state never turns back into a non-final one and only ever gives way to a higher rank (a
/// zombie attempt that succeeds after the task was dead-lettered turns it into `Succeeded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting to be routed.
    Pending,
    /// Assigned to a worker that has not started it.
    Assigned,
    /// Running on a worker.
    Running,
    /// Its last attempt found no reachable member holding the task's document. Not final and
    /// not routed: it revives (turns pending) when a member that holds the document marks it
    /// available ([`crate::queue::mark_input_available`]).
    #[serde(rename = "input_unavailable")]
    InputUnavailable,
    /// Failed `max_attempts` times: dead-lettered.
    Failed,
    /// Some attempt succeeded.
    Succeeded,
}

impl TaskState {
    /// The state's rank in the merge order (see the type's docs).
    pub fn rank(self) -> u8 {
        match self {
            TaskState::Pending
            | TaskState::Assigned
            | TaskState::Running
            | TaskState::InputUnavailable => 0,
            TaskState::Failed => 1,
            TaskState::Succeeded => 2,
        }
    }

    /// `Succeeded` or `Failed`.
    pub fn is_final(self) -> bool {
        self.rank() > 0
    }

    /// The state's name, as the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Assigned => "assigned",
            TaskState::Running => "running",
            TaskState::InputUnavailable => "input_unavailable",
            TaskState::Failed => "failed",
            TaskState::Succeeded => "succeeded",
        }
    }
}

/// A task as indexed in its queue document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEntry {
    /// The task's id (its task document's URL).
    pub id: TaskId,
    /// The handler kind.
    pub kind: String,
    /// Wall-clock submit time (unix ms, the submitter's clock).
    pub submitted_at: u64,
    /// The submitting peer.
    pub submitter: PeerId,
    /// Relative priority in `[-99999, 99999]`; greater runs first.
    pub priority: i64,
    /// Urgent tasks run before every non-urgent one.
    pub urgent: bool,
    /// Failed attempts after which the task is dead-lettered.
    pub max_attempts: u32,
    /// Every attempt, in document order.
    pub attempts: Vec<Attempt>,
    /// The greatest attempt number at which a member holding the task's document marked its
    /// input available (0: never).
    pub input_seen: u64,
    /// The input (JSON text) of an inline task, which has no task document; `None` for a task
    /// whose input is in its task document.
    pub input: Option<String>,
}

impl TaskEntry {
    /// The number of failed attempts (errors and interruptions).
    pub fn failures(&self) -> u32 {
        let n = self
            .attempts
            .iter()
            .filter(|a| a.finished.as_ref().is_some_and(|f| f.outcome.is_failure()))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The number of attempts not run (refused: fenced, busy worker, superseded; or the task's
    /// document unavailable).
    pub fn refusals(&self) -> u32 {
        let n = self
            .attempts
            .iter()
            .filter(|a| {
                a.finished.as_ref().is_some_and(|f| {
                    matches!(
                        f.outcome,
                        AttemptOutcome::Refused | AttemptOutcome::Unavailable
                    )
                })
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The highest attempt number, 0 if never assigned.
    pub fn last_n(&self) -> u64 {
        self.attempts.iter().map(|a| a.id.n).max().unwrap_or(0)
    }

    /// The attempts with the highest number (more than one only after concurrent routers).
    pub fn current_attempts(&self) -> impl Iterator<Item = &Attempt> {
        let n = self.last_n();
        self.attempts.iter().filter(move |a| a.id.n == n)
    }

    /// The task's state, derived from its attempts (see [`TaskState`]).
    pub fn state(&self) -> TaskState {
        if self.attempts.iter().any(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
        }) {
            return TaskState::Succeeded;
        }
        if self.failures() >= self.max_attempts {
            return TaskState::Failed;
        }
        let n = self.last_n();
        let unavailable = n > self.input_seen
            && self.current_attempts().all(|a| {
                a.finished
                    .as_ref()
                    .is_some_and(|f| f.outcome == AttemptOutcome::Unavailable)
            });
        if n > 0 && unavailable {
            return TaskState::InputUnavailable;
        }
        let mut state = TaskState::Pending;
        for a in self.current_attempts().filter(|a| a.is_open()) {
            if a.started.is_some() {
                return TaskState::Running;
            }
            state = TaskState::Assigned;
        }
        state
    }

    /// The routing order between two tasks: urgent first, then greater priority, then submit
    /// time (oldest first for [`Order::Fifo`], newest first for [`Order::Lifo`]), then id.
    pub fn route_cmp(&self, other: &TaskEntry, order: Order) -> std::cmp::Ordering {
        other
            .urgent
            .cmp(&self.urgent)
            .then(other.priority.cmp(&self.priority))
            .then(match order {
                Order::Fifo => self.submitted_at.cmp(&other.submitted_at),
                Order::Lifo => other.submitted_at.cmp(&self.submitted_at),
            })
            .then(self.id.cmp(&other.id))
    }

    /// The attempt with this id.
    pub fn attempt(&self, id: &AttemptId) -> Option<&Attempt> {
        self.attempts.iter().find(|a| &a.id == id)
    }
}

/// A member of a queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's role (`member` for now).
    pub role: String,
    /// Addresses the member listens on, as it last wrote them.
    pub addrs: Vec<String>,
}

/// Everything a queue document says, read at one moment.
///
/// The tasks live in a persistent map (cloning a view costs O(1), changing one task
/// O(log n)), and the view keeps indexes over them that every change updates: pending tasks in
/// routing order, tasks with open attempts by worker peer, tasks waiting for their input, and
/// counts by state. Reading them costs what they hold, never the queue's history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueView {
    /// The queue's name.
    pub name: String,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// The effective router: the greatest claim among the router record's concurrent values.
    pub router: Option<Claim>,
    /// Every concurrent value of the router record, except claims above
    /// [`MAX_TERM`](crate::MAX_TERM) (ignored, and counted in [`QueueView::malformed`]).
    pub claims: Vec<Claim>,
    /// Members by peer.
    pub members: BTreeMap<PeerId, Member>,
    /// Whether routing is paused.
    pub paused: bool,
    /// The document's schema version. A node does not route a queue whose version is above
    /// the one it knows ([`QueueView::routable_version`]).
    pub version: u64,
    /// This document's epoch: 0 for a queue's first document ([`crate::epoch`]).
    pub epoch: u64,
    /// The queue this document continues (its first document's id); `None` in epoch 0.
    pub origin: Option<crate::QueueId>,
    /// The sealed document this one continues, and its heads at sealing; `None` in epoch 0.
    pub prev: Option<crate::epoch::Prev>,
    /// Seals written into this document: successors that continue it, in order (the last is
    /// the [winner](crate::epoch::winner)).
    pub seals: Vec<crate::epoch::Seal>,
    /// In a queue's first document: the newest epoch it knows of.
    pub latest: Option<crate::epoch::Latest>,
    /// Tasks that ended in earlier epochs and were left behind by rotations (a running
    /// total, as each sealer counted them).
    pub retired: crate::epoch::Retired,
    /// Every indexed task by id.
    tasks: OrdMap<TaskId, Arc<TaskEntry>>,
    /// Derived from `tasks` (and `config.order`); updated by [`QueueView::set_task`].
    index: TaskIndex,
    /// Task entries, attempts and router claims that could not be read or were ignored (written
    /// by a faulty or hostile peer).
    pub malformed: usize,
}

/// A pending task's place in the routing order: urgent first, then greater priority, then
/// submit time (per the queue's [`Order`]), then id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct RouteKey {
    not_urgent: bool,
    priority: std::cmp::Reverse<i64>,
    /// `submitted_at` for FIFO, its complement for LIFO.
    time: u64,
    id: TaskId,
}

impl RouteKey {
    fn of(t: &TaskEntry, order: Order) -> Self {
        RouteKey {
            not_urgent: !t.urgent,
            priority: std::cmp::Reverse(t.priority),
            time: match order {
                Order::Fifo => t.submitted_at,
                Order::Lifo => u64::MAX - t.submitted_at,
            },
            id: t.id.clone(),
        }
    }
}

/// The view's indexes over its tasks. Every field is a function of the tasks and the order;
/// [`TaskIndex::add`] and [`TaskIndex::remove`] keep it so one task at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct TaskIndex {
    order: Order,
    /// Pending tasks in routing order.
    routable: OrdSet<RouteKey>,
    /// Pending tasks that failed or were refused before (they wait a retry delay).
    retrying: OrdSet<TaskId>,
    /// Tasks with at least one open attempt, by the peer of each open attempt's worker.
    open: OrdMap<PeerId, OrdSet<TaskId>>,
    /// Tasks in [`TaskState::InputUnavailable`].
    unavailable: OrdSet<TaskId>,
    counts: StateCounts,
}

impl TaskIndex {
    fn counter(&mut self, state: TaskState) -> &mut usize {
        let c = &mut self.counts;
        match state {
            TaskState::Pending => &mut c.pending,
            TaskState::Assigned => &mut c.assigned,
            TaskState::Running => &mut c.running,
            TaskState::InputUnavailable => &mut c.input_unavailable,
            TaskState::Succeeded => &mut c.succeeded,
            TaskState::Failed => &mut c.failed,
        }
    }

    fn add(&mut self, t: &TaskEntry) {
        let state = t.state();
        *self.counter(state) += 1;
        match state {
            TaskState::Pending => {
                self.routable.insert(RouteKey::of(t, self.order));
                if t.failures() + t.refusals() > 0 {
                    self.retrying.insert(t.id.clone());
                }
            }
            TaskState::InputUnavailable => {
                self.unavailable.insert(t.id.clone());
            }
            _ => {}
        }
        for a in t.attempts.iter().filter(|a| a.is_open()) {
            self.open
                .entry(a.worker.peer.clone())
                .or_default()
                .insert(t.id.clone());
        }
    }

    fn remove(&mut self, t: &TaskEntry) {
        let state = t.state();
        let n = self.counter(state);
        *n = n.saturating_sub(1);
        match state {
            TaskState::Pending => {
                self.routable.remove(&RouteKey::of(t, self.order));
                self.retrying.remove(&t.id);
            }
            TaskState::InputUnavailable => {
                self.unavailable.remove(&t.id);
            }
            _ => {}
        }
        for a in t.attempts.iter().filter(|a| a.is_open()) {
            if let Some(set) = self.open.get_mut(&a.worker.peer) {
                set.remove(&t.id);
                if set.is_empty() {
                    self.open.remove(&a.worker.peer);
                }
            }
        }
    }
}

/// Task counts by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts {
    /// Waiting to be routed.
    pub pending: usize,
    /// Assigned, not started.
    pub assigned: usize,
    /// Running.
    pub running: usize,
    /// Waiting for a member that holds the task's document.
    #[serde(default)]
    pub input_unavailable: usize,
    /// Succeeded.
    pub succeeded: usize,
    /// Failed for good.
    pub failed: usize,
}

impl QueueView {
    /// Reads a queue document. Returns `None` if the document is not a queue document.
    /// Malformed task entries are skipped and counted in [`QueueView::malformed`]; the
    /// configuration is read [clamped](QueueConfig::clamped) into its ranges.
    ///
    /// This reads the whole document; [`crate::ViewCache`] keeps a view up to date at the cost
    /// of the changes since its last read.
    pub fn read(doc: &Automerge) -> Option<QueueView> {
        let mut view = QueueView::default();
        let (tasks, bad_claims) = read_root(doc, &mut view)?;
        view.malformed += bad_claims;
        if let Some(tasks) = tasks {
            let records = Records::read(doc);
            for item in doc.map_range(&tasks, ..) {
                let id = TaskId::new(item.key.as_ref());
                let value = EntryValue::of(&item.value, item.id());
                let (bad, records) = (&mut view.malformed, Some(&records));
                match read_task_entry_from(doc, records, value, id.clone(), bad, &mut |_| {}) {
                    Some(entry) => view.set_task(id, Some(entry)),
                    None => view.malformed += 1,
                }
            }
        }
        Some(view)
    }

    /// Whether this node knows the document's schema version, so may route it and run its
    /// tasks.
    pub fn routable_version(&self) -> bool {
        self.version <= keys::QUEUE_VERSION
    }

    /// Every indexed task by id.
    pub fn tasks(&self) -> &OrdMap<TaskId, Arc<TaskEntry>> {
        &self.tasks
    }

    /// One task's entry.
    pub fn task(&self, id: &TaskId) -> Option<&TaskEntry> {
        self.tasks.get(id).map(|t| &**t)
    }

    /// Replaces (or, with `None`, removes) one task's entry and updates the indexes:
    /// O(log n + the entry's attempts).
    pub(crate) fn set_task(&mut self, id: TaskId, entry: Option<TaskEntry>) {
        if let Some(old) = self.tasks.get(&id) {
            self.index.remove(old);
        }
        match entry {
            Some(e) => {
                self.index.add(&e);
                self.tasks.insert(id, Arc::new(e));
            }
            None => {
                self.tasks.remove(&id);
            }
        }
    }

    /// Re-sorts the routing index if the configured order changed (a switch between FIFO and
    /// LIFO rebuilds it: O(pending), off the hot path).
    pub(crate) fn reorder(&mut self) {
        let order = self.config.order;
        if self.index.order == order {
            return;
        }
        self.index.order = order;
        let pending: Vec<RouteKey> = self
            .index
            .routable
            .iter()
            .filter_map(|k| self.task(&k.id))
            .map(|t| RouteKey::of(t, order))
            .collect();
        self.index.routable = pending.into_iter().collect();
    }

    /// Pending tasks in routing order, lazily: taking the first k costs O(k log n).
    pub fn routable(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.routable.iter().filter_map(|k| self.task(&k.id))
    }

    /// Pending tasks that failed or were refused before, so wait a retry delay.
    pub fn retrying(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.retrying.iter().filter_map(|id| self.task(id))
    }

    /// Tasks waiting for a member that holds their document.
    pub fn input_unavailable(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.unavailable.iter().filter_map(|id| self.task(id))
    }

    /// Tasks with an open attempt (of any state: a task with an outcome can still have a run
    /// in flight that another router started), once each.
    pub fn with_open_attempts(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        let mut ids: Vec<&TaskId> = self.index.open.values().flat_map(|s| s.iter()).collect();
        ids.sort();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.task(id))
    }

    /// Peers whose workers hold open attempts, with how many tasks each.
    pub fn open_peers(&self) -> impl Iterator<Item = (&PeerId, usize)> + '_ {
        self.index.open.iter().map(|(p, s)| (p, s.len()))
    }

    /// Pending tasks in the order the router should take them: urgent first, then by priority
    /// (greater first), then by submit time (per the queue's [`Order`]), then by id.
    pub fn pending(&self) -> Vec<&TaskEntry> {
        self.routable().collect()
    }

    /// Open (not ended) attempts by worker: O(open attempts).
    pub fn open_attempts(&self) -> BTreeMap<&WorkerId, Vec<(&TaskEntry, &Attempt)>> {
        let mut open: BTreeMap<&WorkerId, Vec<(&TaskEntry, &Attempt)>> = BTreeMap::new();
        for task in self.with_open_attempts() {
            for a in task.attempts.iter().filter(|a| a.is_open()) {
                open.entry(&a.worker).or_default().push((task, a));
            }
        }
        open
    }

    /// Open attempts assigned to the workers of `peer`: O(its open attempts).
    pub fn open_attempts_of<'a>(
        &'a self,
        peer: &'a PeerId,
    ) -> impl Iterator<Item = (&'a TaskEntry, &'a Attempt)> + 'a {
        self.index
            .open
            .get(peer)
            .into_iter()
            .flat_map(|s| s.iter())
            .filter_map(|id| self.task(id))
            .flat_map(move |t| {
                t.attempts
                    .iter()
                    .filter(move |a| a.is_open() && &a.worker.peer == peer)
                    .map(move |a| (t, a))
            })
    }

    /// Task counts by state in this epoch document: O(1), kept by every change.
    pub fn counts(&self) -> StateCounts {
        self.index.counts.clone()
    }

    /// Task counts by state over the queue's whole life: [`QueueView::counts`] plus the
    /// tasks that ended in earlier epochs ([`QueueView::retired`]), as succeeded or failed.
    pub fn total_counts(&self) -> StateCounts {
        let mut c = self.counts();
        c.succeeded += usize::try_from(self.retired.succeeded).unwrap_or(usize::MAX);
        c.failed += usize::try_from(self.retired.failed).unwrap_or(usize::MAX);
        c
    }
}

/// Reads everything but the tasks into `view`; returns the tasks map's id (`None` if the
/// document has none) and the number of router claims ignored as malformed (the caller counts
/// them in [`QueueView::malformed`]), or `None` if the document is not a queue.
pub(crate) fn read_root(doc: &Automerge, view: &mut QueueView) -> Option<(Option<ObjId>, usize)> {
    let mut schema_ok = false;
    let mut tasks = None;
    let mut config = None;
    let mut members = None;
    view.name.clear();
    view.paused = false;
    view.version = 1;
    view.epoch = 0;
    view.origin = None;
    let mut prev = None;
    let mut prev_heads = Vec::new();
    for item in doc.map_range(ROOT, ..) {
        match (item.key.as_ref(), &item.value) {
            (crate::epoch::EPOCH, v) => view.epoch = am::as_uint(v).unwrap_or(0),
            (crate::epoch::ORIGIN, v) => view.origin = am::as_str(v).map(crate::QueueId::new),
            (crate::epoch::PREV, v) => prev = am::as_str(v).map(str::to_owned),
            (crate::epoch::PREV_HEADS, v) => {
                prev_heads = am::as_str(v)
                    .map(crate::epoch::decode_heads)
                    .unwrap_or_default()
            }
            (keys::SCHEMA, v) => schema_ok = am::as_str(v) == Some(keys::QUEUE_SCHEMA),
            (keys::VERSION, v) => view.version = am::as_uint(v).unwrap_or(u64::MAX),
            (keys::NAME, v) => view.name = am::as_str(v).unwrap_or_default().to_owned(),
            (keys::PAUSED, v) => view.paused = am::as_bool(v).unwrap_or(false),
            (keys::TASKS, ValueRef::Object(ObjType::Map)) => tasks = Some(item.id()),
            (keys::CONFIG, ValueRef::Object(ObjType::Map)) => config = Some(item.id()),
            (keys::MEMBERS, ValueRef::Object(ObjType::Map)) => members = Some(item.id()),
            _ => {}
        }
    }
    if !schema_ok {
        return None;
    }
    view.prev = prev.map(|doc| crate::epoch::Prev {
        doc,
        heads: prev_heads,
    });
    view.seals = crate::epoch::read_seals(doc);
    view.latest = crate::epoch::read_latest(doc);
    view.retired = crate::epoch::read_retired(doc);
    view.config = config.map(|c| read_config(doc, &c)).unwrap_or_default();
    view.reorder();
    let (claims, bad_claims) = read_claims(doc);
    view.claims = claims;
    view.router = view.claims.iter().max().cloned();
    view.members.clear();
    if let Some(members) = members {
        for item in doc.map_range(&members, ..) {
            if !matches!(item.value, ValueRef::Object(ObjType::Map)) {
                continue;
            }
            let obj = item.id();
            let mut m = Member {
                role: String::new(),
                addrs: vec![],
            };
            for f in doc.map_range(&obj, ..) {
                match (f.key.as_ref(), &f.value) {
                    (keys::ROLE, v) => m.role = am::as_str(v).unwrap_or_default().to_owned(),
                    (keys::ADDRS, ValueRef::Object(ObjType::List)) => {
                        m.addrs = am::list_strings(doc, &f.id())
                    }
                    _ => {}
                }
            }
            view.members.insert(PeerId::new(item.key.as_ref()), m);
        }
    }
    Some((tasks, bad_claims))
}

/// The configuration of a queue document, read alone (without the tasks): `None` if the
/// document has no config map.
pub(crate) fn read_config_of(doc: &Automerge) -> Option<QueueConfig> {
    am::object(doc, &ROOT, keys::CONFIG, ObjType::Map).map(|c| read_config(doc, &c))
}

/// The configuration as written, [clamped](QueueConfig::clamped) into its ranges: every replica
/// derives the same timers from the same document, whatever a peer wrote.
fn read_config(doc: &Automerge, obj: &ObjId) -> QueueConfig {
    let mut c = QueueConfig::default();
    for item in doc.map_range(obj, ..) {
        let v = &item.value;
        let u = am::as_uint(v);
        let small = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        match item.key.as_ref() {
            "heartbeat_ms" => c.heartbeat_ms = u.unwrap_or(c.heartbeat_ms),
            "takeover_after_ms" => c.takeover_after_ms = u.unwrap_or(c.takeover_after_ms),
            "settle_ms" => c.settle_ms = u.unwrap_or(c.settle_ms),
            "pool_heartbeat_ms" => c.pool_heartbeat_ms = u.unwrap_or(c.pool_heartbeat_ms),
            "lease_ms" => c.lease_ms = u.unwrap_or(c.lease_ms),
            "retry_backoff_ms" => c.retry_backoff_ms = u.unwrap_or(c.retry_backoff_ms),
            "retry_backoff_max_ms" => c.retry_backoff_max_ms = u.unwrap_or(c.retry_backoff_max_ms),
            "rate_interval_ms" => c.rate_interval_ms = u.unwrap_or(c.rate_interval_ms),
            "max_attempts" => c.max_attempts = u.map_or(c.max_attempts, small),
            "concurrency" => c.concurrency = u.map_or(c.concurrency, small),
            "order" => c.order = am::as_str(v).and_then(Order::parse).unwrap_or(c.order),
            _ => {}
        }
    }
    c.clamped()
}

/// Every concurrent router claim, and how many were ignored: unreadable, or above
/// [`MAX_TERM`](crate::MAX_TERM).
pub(crate) fn read_claims<R: ReadDoc>(doc: &R) -> (Vec<Claim>, usize) {
    let mut bad = 0;
    let claims = am::all_objects(doc, &ROOT, keys::ROUTER, ObjType::Map)
        .into_iter()
        .filter_map(|obj| {
            let claim = am::uint(doc, &obj, keys::TERM)
                .zip(am::string(doc, &obj, keys::PEER))
                .map(|(term, peer)| Claim::new(term, PeerId::new(peer)))
                .filter(Claim::is_valid);
            if claim.is_none() {
                bad += 1;
            }
            claim
        })
        .collect();
    (claims, bad)
}

/// A task's value in the `tasks` map: a layout-1 entry map, or a layout-2 packed entry.
pub(crate) enum EntryValue {
    /// Layout 1.
    Map(ObjId),
    /// Layout 2 ([`packed::Entry`] as JSON).
    Packed(String),
    /// Anything else (malformed).
    Other,
}

impl EntryValue {
    pub(crate) fn of(value: &ValueRef<'_>, id: ObjId) -> Self {
        match value {
            ValueRef::Object(ObjType::Map) => EntryValue::Map(id),
            v => am::as_str(v).map_or(EntryValue::Other, |s| EntryValue::Packed(s.to_owned())),
        }
    }
}

/// Reads one task entry, in either layout, with its attempts from both, reporting every
/// layout-1 object id that belongs to it to `owned` (for [`crate::ViewCache`]'s object table).
pub(crate) fn read_task_entry(
    doc: &Automerge,
    value: EntryValue,
    id: TaskId,
    malformed: &mut usize,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<TaskEntry> {
    read_task_entry_from(doc, None, value, id, malformed, owned)
}

/// The layout-2 records of a whole document, read map by map: a whole read looks a task's
/// records up here instead of seeking each in the document (about seven seeks per task, which
/// made a whole read of 3,000 tasks take 50 ms). Values are kept as Automerge holds them:
/// every concurrent value of starts, ends and marks, the winning assignment (as a per-task
/// read sees them).
#[derive(Default)]
pub(crate) struct Records {
    /// Attempt key → (the index of the `assigned` object that holds it, its value).
    assigned: BTreeMap<String, Vec<(usize, String)>>,
    started: HashMap<String, Vec<String>>,
    ended: HashMap<String, Vec<String>>,
    seen: HashMap<String, u64>,
}

impl Records {
    /// Reads the layout-2 maps of `doc` whole: O(records).
    pub(crate) fn read(doc: &Automerge) -> Records {
        let mut r = Records::default();
        let text = |v: &automerge::Value<'_>| match v {
            automerge::Value::Scalar(s) => match s.as_ref() {
                automerge::ScalarValue::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        };
        let assigned = am::all_objects(doc, &ROOT, packed::ASSIGNED, ObjType::Map);
        for (i, m) in assigned.iter().enumerate() {
            for item in doc.map_range(m, ..) {
                let value = am::as_str(&item.value).map(str::to_owned);
                // Unreadable values count as malformed where the task reads them.
                r.assigned
                    .entry(item.key.to_string())
                    .or_default()
                    .push((i, value.unwrap_or_default()));
            }
        }
        for (name, into) in [
            (packed::STARTED, &mut r.started),
            (packed::ENDED, &mut r.ended),
        ] {
            for m in am::all_objects(doc, &ROOT, name, ObjType::Map) {
                for item in doc.map_range(&m, ..) {
                    let values = into.entry(item.key.to_string()).or_default();
                    match item.conflict {
                        false => values.extend(am::as_str(&item.value).map(str::to_owned)),
                        true => values.extend(
                            doc.get_all(&m, item.key.as_ref())
                                .unwrap_or_default()
                                .iter()
                                .filter_map(|(v, _)| text(v)),
                        ),
                    }
                }
            }
        }
        for m in am::all_objects(doc, &ROOT, packed::SEEN, ObjType::Map) {
            for item in doc.map_range(&m, ..) {
                let n = match item.conflict {
                    false => am::as_uint(&item.value).unwrap_or(0),
                    true => am::max_uint(doc, &m, item.key.as_ref()),
                };
                let e = r.seen.entry(item.key.to_string()).or_default();
                *e = (*e).max(n);
            }
        }
        r
    }

    fn started(&self, key: &str) -> Option<Started> {
        started_of(self.started.get(key).into_iter().flatten().cloned())
    }

    fn finished(&self, key: &str) -> Option<Finished> {
        finished_of(self.ended.get(key).into_iter().flatten().cloned())
    }
}

/// [`read_task_entry`], with the layout-2 records from `records` when given (a whole read)
/// and from the document otherwise.
pub(crate) fn read_task_entry_from(
    doc: &Automerge,
    records: Option<&Records>,
    value: EntryValue,
    id: TaskId,
    malformed: &mut usize,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<TaskEntry> {
    let mut entry = match value {
        EntryValue::Map(obj) => read_map_entry(doc, &obj, id.clone(), malformed, owned)?,
        EntryValue::Packed(s) => {
            let e: packed::Entry = packed::decode(&s)?;
            TaskEntry {
                id: id.clone(),
                kind: e.k,
                submitted_at: e.t,
                submitter: PeerId::new(e.s),
                priority: e.p.clamp(-MAX_PRIORITY, MAX_PRIORITY),
                urgent: e.u,
                max_attempts: u32::try_from(e.m)
                    .unwrap_or(u32::MAX)
                    .clamp(QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS),
                attempts: Vec::new(),
                input_seen: 0,
                input: e.i,
            }
        }
        EntryValue::Other => return None,
    };
    // Layout-2 records: attempts, and the starts and ends of attempts of either layout.
    let started = |key: &str| match records {
        Some(r) => r.started(key),
        None => packed_started(doc, key),
    };
    let finished = |key: &str| match records {
        Some(r) => r.finished(key),
        None => packed_finished(doc, key),
    };
    for a in &mut entry.attempts {
        let key = packed::attempt_key(&id, &a.id);
        a.started = a
            .started
            .take()
            .into_iter()
            .chain(started(&key))
            .max_by_key(|s| (s.incarnation, s.at));
        a.finished = a
            .finished
            .take()
            .into_iter()
            .chain(finished(&key))
            .max_by(later_finish);
    }
    let mut push = |key: &str, value: Option<&str>| match value
        .and_then(|v| read_packed_attempt(key, v, &started, &finished))
    {
        Some(a) => entry.attempts.push(a),
        None => *malformed += 1,
    };
    match records {
        Some(r) => {
            // In the order the document path takes them (object by object, each in key
            // order), so that equal attempt ids (keys that differ only in how they spell a
            // number) dedup to the same one.
            let mut found: Vec<(usize, &str, &str)> = r
                .assigned
                .range(packed::attempts_of(&id))
                .flat_map(|(k, vs)| vs.iter().map(move |(i, v)| (*i, k.as_str(), v.as_str())))
                .collect();
            found.sort_by_key(|(i, _, _)| *i);
            for (_, key, value) in found {
                push(key, Some(value));
            }
        }
        None => {
            for m in am::all_objects(doc, &ROOT, packed::ASSIGNED, ObjType::Map) {
                for item in doc.map_range(&m, packed::attempts_of(&id)) {
                    push(item.key.as_ref(), am::as_str(&item.value));
                }
            }
        }
    }
    entry.attempts.sort_by(|a, b| a.id.cmp(&b.id));
    entry.attempts.dedup_by(|a, b| a.id == b.id);
    let seen = match records {
        Some(r) => r.seen.get(id.as_str()).copied().unwrap_or(0),
        None => packed_seen(doc, &id),
    };
    entry.input_seen = entry.input_seen.max(seen);
    Some(entry)
}

fn read_packed_attempt(
    key: &str,
    value: &str,
    started: &dyn Fn(&str) -> Option<Started>,
    finished: &dyn Fn(&str) -> Option<Finished>,
) -> Option<Attempt> {
    let (_, id) = packed::parse_attempt_key(key)?;
    if !id.claim.is_valid() {
        return None;
    }
    let rec: packed::Assigned = packed::decode(value)?;
    Some(Attempt {
        id,
        worker: rec.w.parse().ok()?,
        pool_incarnation: rec.i,
        assigned_at: rec.a,
        started: started(key),
        finished: finished(key),
    })
}

/// An attempt's layout-2 start; among concurrent ones, the greatest `(incarnation, at)`.
pub(crate) fn packed_started<R: ReadDoc>(doc: &R, key: &str) -> Option<Started> {
    started_of(packed_values(doc, packed::STARTED, key))
}

fn started_of(values: impl Iterator<Item = String>) -> Option<Started> {
    values
        .filter_map(|s| packed::decode::<packed::Start>(&s))
        .map(|s| Started {
            at: s.a,
            incarnation: s.i,
        })
        .max_by_key(|s| (s.incarnation, s.at))
}

/// An attempt's layout-2 end; among concurrent ones, the greatest (see [`AttemptOutcome`]).
pub(crate) fn packed_finished<R: ReadDoc>(doc: &R, key: &str) -> Option<Finished> {
    finished_of(packed_values(doc, packed::ENDED, key))
}

fn finished_of(values: impl Iterator<Item = String>) -> Option<Finished> {
    values
        .filter_map(|s| {
            let e: packed::End = packed::decode(&s)?;
            Some(Finished {
                at: e.a,
                outcome: AttemptOutcome::parse(&e.o)?,
                error: e.e,
            })
        })
        .max_by(later_finish)
}

/// The layout-2 mark of a task's input (0 if none); concurrent marks keep the greatest.
fn packed_seen<R: ReadDoc>(doc: &R, task: &TaskId) -> u64 {
    am::all_objects(doc, &ROOT, packed::SEEN, ObjType::Map)
        .iter()
        .map(|m| am::max_uint(doc, m, task.as_str()))
        .max()
        .unwrap_or(0)
}

/// The greatest attempt number at which a task's input was marked available, in either layout.
pub(crate) fn input_seen<R: ReadDoc>(doc: &R, task: &TaskId) -> u64 {
    let v1 = am::object(doc, &ROOT, keys::TASKS, ObjType::Map)
        .and_then(|t| am::object(doc, &t, task.as_str(), ObjType::Map))
        .map_or(0, |e| am::max_uint(doc, &e, keys::INPUT_SEEN));
    v1.max(packed_seen(doc, task))
}

/// Every concurrent string value of `key` in every concurrent copy of the root map `map`.
pub(crate) fn packed_values<'a, R: ReadDoc>(
    doc: &'a R,
    map: &str,
    key: &'a str,
) -> impl Iterator<Item = String> + 'a {
    am::all_objects(doc, &ROOT, map, ObjType::Map)
        .into_iter()
        .flat_map(move |m| doc.get_all(&m, key).unwrap_or_default())
        .filter_map(|(v, _)| match v {
            automerge::Value::Scalar(s) => match s.as_ref() {
                automerge::ScalarValue::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        })
}

/// The order among concurrent ends: outcome, then time, then error text.
pub(crate) fn later_finish(a: &Finished, b: &Finished) -> std::cmp::Ordering {
    a.outcome
        .cmp(&b.outcome)
        .then(a.at.cmp(&b.at))
        .then(a.error.cmp(&b.error))
}

/// Reads a layout-1 task entry in a single pass over each of its objects.
fn read_map_entry(
    doc: &Automerge,
    obj: &ObjId,
    id: TaskId,
    malformed: &mut usize,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<TaskEntry> {
    owned(obj);
    let (mut kind, mut submitted_at, mut submitter) = (None, None, None);
    let (mut priority, mut urgent, mut max_attempts, mut list) = (0, false, 1, None);
    let mut input_seen = 0;
    for item in doc.map_range(obj, ..) {
        let v = &item.value;
        match item.key.as_ref() {
            keys::KIND => kind = am::as_str(v).map(str::to_owned),
            keys::SUBMITTED_AT => submitted_at = am::as_uint(v),
            keys::SUBMITTER => submitter = am::as_str(v).map(PeerId::new),
            keys::PRIORITY => {
                priority = am::as_int(v).map_or(0, |p| p.clamp(-MAX_PRIORITY, MAX_PRIORITY))
            }
            keys::URGENT => urgent = am::as_bool(v).unwrap_or(false),
            keys::MAX_ATTEMPTS => {
                max_attempts = am::as_uint(v)
                    .map_or(1, |x| u32::try_from(x).unwrap_or(u32::MAX))
                    .clamp(QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS);
            }
            keys::ATTEMPTS if matches!(v, ValueRef::Object(ObjType::List)) => {
                list = Some(item.id())
            }
            // Members write it concurrently: the greatest value counts.
            keys::INPUT_SEEN => input_seen = am::max_uint(doc, obj, keys::INPUT_SEEN),
            _ => {}
        }
    }
    let mut attempts = Vec::new();
    if let Some(list) = list {
        owned(&list);
        for item in doc.list_range(&list, ..) {
            if !matches!(item.value, ValueRef::Object(ObjType::Map)) {
                *malformed += 1;
                continue;
            }
            match read_attempt(doc, &item.id(), owned) {
                Some(a) => attempts.push(a),
                None => *malformed += 1,
            }
        }
    }
    Some(TaskEntry {
        id,
        kind: kind?,
        submitted_at: submitted_at?,
        submitter: submitter?,
        priority,
        urgent,
        max_attempts,
        attempts,
        input_seen,
        input: None,
    })
}

/// What the runs of an inline task produced, by attempt, from the `output` map of a queue
/// document (the view does not keep it: only a task's status reads it). Among concurrent
/// values of one attempt (two ends after a restart) the greatest text wins.
pub fn read_outputs<R: ReadDoc>(doc: &R, task: &TaskId) -> Vec<(AttemptId, crate::Output)> {
    let mut out: BTreeMap<AttemptId, String> = BTreeMap::new();
    for m in am::all_objects(doc, &ROOT, packed::OUTPUT, ObjType::Map) {
        for item in doc.map_range(&m, packed::attempts_of(task)) {
            let Some((_, id)) = packed::parse_attempt_key(item.key.as_ref()) else {
                continue;
            };
            for (v, _) in doc.get_all(&m, item.key.as_ref()).unwrap_or_default() {
                if let automerge::Value::Scalar(sv) = v
                    && let automerge::ScalarValue::Str(text) = sv.as_ref()
                {
                    let e = out.entry(id.clone()).or_default();
                    if text.as_str() > e.as_str() {
                        *e = text.to_string();
                    }
                }
            }
        }
    }
    out.into_iter()
        .filter_map(|(id, text)| Some((id, packed::decode(&text)?)))
        .collect()
}

pub(crate) fn read_attempt(
    doc: &Automerge,
    obj: &ObjId,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<Attempt> {
    owned(obj);
    let (mut n, mut term, mut router, mut worker, mut assigned_at) = (None, None, None, None, None);
    let (mut start, mut finish, mut pool_incarnation) = (None, None, None);
    for item in doc.map_range(obj, ..) {
        let v = &item.value;
        match item.key.as_ref() {
            keys::N => n = am::as_uint(v),
            keys::TERM => term = am::as_uint(v),
            keys::ROUTER => router = am::as_str(v).map(PeerId::new),
            keys::WORKER => worker = am::as_str(v).and_then(|w| w.parse::<WorkerId>().ok()),
            keys::ASSIGNED_AT => assigned_at = am::as_uint(v),
            keys::POOL_INCARNATION => pool_incarnation = Some(am::as_uint(v)),
            keys::START => start = Some(item.conflict),
            keys::FINISH => finish = Some(item.conflict),
            _ => {}
        }
    }
    // Start and end records are rare and small; read them (with their conflicts) directly.
    let started = start.and_then(|_| {
        let objs = am::all_objects(doc, obj, keys::START, ObjType::Map);
        objs.iter().for_each(&mut *owned);
        resolve_started(doc, &objs)
    });
    let finished = finish.and_then(|_| {
        let objs = am::all_objects(doc, obj, keys::FINISH, ObjType::Map);
        objs.iter().for_each(&mut *owned);
        resolve_finished(doc, &objs)
    });
    // An attempt made under a claim above MAX_TERM is malformed: no router can hold one, and it
    // would pass every fence. So is one whose pool incarnation is there but not a number.
    let pool_incarnation = match pool_incarnation {
        Some(None) => return None,
        p => p.flatten(),
    };
    Some(Attempt {
        id: AttemptId {
            n: n?,
            claim: Some(Claim::new(term?, router?)).filter(Claim::is_valid)?,
        },
        worker: worker?,
        pool_incarnation,
        assigned_at: assigned_at?,
        started,
        finished,
    })
}

/// The start record; among concurrent ones, the greatest `(incarnation, at)`.
pub(crate) fn read_started<R: ReadDoc>(doc: &R, attempt: &ObjId) -> Option<Started> {
    resolve_started(
        doc,
        &am::all_objects(doc, attempt, keys::START, ObjType::Map),
    )
}

fn resolve_started<R: ReadDoc>(doc: &R, objs: &[ObjId]) -> Option<Started> {
    objs.iter()
        .filter_map(|o| {
            Some(Started {
                at: am::uint(doc, o, keys::AT)?,
                incarnation: am::uint(doc, o, keys::INCARNATION)?,
            })
        })
        .max_by_key(|s| (s.incarnation, s.at))
}

/// The end record; among concurrent ones, the greatest by outcome, then time, then error text.
pub(crate) fn read_finished<R: ReadDoc>(doc: &R, attempt: &ObjId) -> Option<Finished> {
    resolve_finished(
        doc,
        &am::all_objects(doc, attempt, keys::FINISH, ObjType::Map),
    )
}

fn resolve_finished<R: ReadDoc>(doc: &R, objs: &[ObjId]) -> Option<Finished> {
    objs.iter()
        .filter_map(|o| {
            Some(Finished {
                at: am::uint(doc, o, keys::AT)?,
                outcome: AttemptOutcome::parse(&am::string(doc, o, keys::OUTCOME)?)?,
                error: am::string(doc, o, keys::ERROR),
            })
        })
        .max_by(later_finish)
}
