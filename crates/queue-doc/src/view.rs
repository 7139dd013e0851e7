//! Read views of a queue document: the effective router, members, tasks and their states.
//!
//! A view is computed from the document alone, so every replica holding the same changes
//! computes the same view, whatever order the changes arrived in.

use std::collections::BTreeMap;

use automerge::{Automerge, ObjId, ObjType, ROOT, ReadDoc};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::config::{Order, QueueConfig};
use crate::ids::{AttemptId, Claim, PeerId, TaskId, WorkerId};
use crate::keys;

/// How an attempt ended.
///
/// When concurrent writes leave an attempt with more than one ending (possible only after a
/// node restarted from a copy that lacked its own last writes), the greatest by this order wins:
/// `Succeeded > Failed > Interrupted > Refused`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptOutcome {
    /// The worker did not start it: fenced, busy, or the task's document was unavailable.
    Refused,
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
            AttemptOutcome::Interrupted => "interrupted",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Succeeded => "succeeded",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "refused" => AttemptOutcome::Refused,
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
    /// Failed `max_attempts` times: dead-lettered.
    Failed,
    /// Some attempt succeeded.
    Succeeded,
}

impl TaskState {
    /// The state's rank in the merge order (see the type's docs).
    pub fn rank(self) -> u8 {
        match self {
            TaskState::Pending | TaskState::Assigned | TaskState::Running => 0,
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueView {
    /// The queue's name.
    pub name: String,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// The effective router: the greatest claim among the router record's concurrent values.
    pub router: Option<Claim>,
    /// Every concurrent value of the router record.
    pub claims: Vec<Claim>,
    /// Members by peer.
    pub members: BTreeMap<PeerId, Member>,
    /// Whether routing is paused.
    pub paused: bool,
    /// Every indexed task by id.
    pub tasks: BTreeMap<TaskId, TaskEntry>,
    /// Task entries or attempts that could not be read (written by a faulty or hostile peer).
    pub malformed: usize,
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
    /// Succeeded.
    pub succeeded: usize,
    /// Failed for good.
    pub failed: usize,
}

impl QueueView {
    /// Reads a queue document. Returns `None` if the document is not a queue document.
    /// Malformed task entries are skipped and counted in [`QueueView::malformed`].
    pub fn read(doc: &Automerge) -> Option<QueueView> {
        if am::string(doc, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return None;
        }
        let mut view = QueueView {
            name: am::string(doc, &ROOT, keys::NAME).unwrap_or_default(),
            config: read_config(doc),
            paused: am::boolean(doc, &ROOT, keys::PAUSED).unwrap_or(false),
            ..QueueView::default()
        };
        view.claims = read_claims(doc);
        view.router = view.claims.iter().max().cloned();
        if let Some(members) = am::object(doc, &ROOT, keys::MEMBERS, ObjType::Map) {
            for item in doc.map_range(&members, ..) {
                let obj = item.id();
                let role = am::string(doc, &obj, keys::ROLE).unwrap_or_default();
                let addrs = am::object(doc, &obj, keys::ADDRS, ObjType::List)
                    .map(|l| am::list_strings(doc, &l))
                    .unwrap_or_default();
                view.members
                    .insert(PeerId::new(item.key.as_ref()), Member { role, addrs });
            }
        }
        if let Some(tasks) = am::object(doc, &ROOT, keys::TASKS, ObjType::Map) {
            for item in doc.map_range(&tasks, ..) {
                let id = TaskId::new(item.key.as_ref());
                match read_task_entry(doc, &item.id(), id.clone(), &mut view.malformed) {
                    Some(entry) => {
                        view.tasks.insert(id, entry);
                    }
                    None => view.malformed += 1,
                }
            }
        }
        Some(view)
    }

    /// Pending tasks in the order the router should take them: urgent first, then by priority
    /// (greater first), then by submit time (per the queue's [`Order`]), then by id.
    pub fn pending(&self) -> Vec<&TaskEntry> {
        let mut pending: Vec<&TaskEntry> = self
            .tasks
            .values()
            .filter(|t| t.state() == TaskState::Pending)
            .collect();
        let order = self.config.order;
        pending.sort_by(|a, b| a.route_cmp(b, order));
        pending
    }

    /// Open (not ended) attempts by worker.
    pub fn open_attempts(&self) -> BTreeMap<&WorkerId, Vec<(&TaskEntry, &Attempt)>> {
        let mut open: BTreeMap<&WorkerId, Vec<(&TaskEntry, &Attempt)>> = BTreeMap::new();
        for task in self.tasks.values() {
            for a in task.attempts.iter().filter(|a| a.is_open()) {
                open.entry(&a.worker).or_default().push((task, a));
            }
        }
        open
    }

    /// Open attempts assigned to the workers of `peer`.
    pub fn open_attempts_of<'a>(
        &'a self,
        peer: &'a PeerId,
    ) -> impl Iterator<Item = (&'a TaskEntry, &'a Attempt)> + 'a {
        self.tasks.values().flat_map(move |t| {
            t.attempts
                .iter()
                .filter(move |a| a.is_open() && &a.worker.peer == peer)
                .map(move |a| (t, a))
        })
    }

    /// Task counts by state.
    pub fn counts(&self) -> StateCounts {
        let mut c = StateCounts::default();
        for t in self.tasks.values() {
            match t.state() {
                TaskState::Pending => c.pending += 1,
                TaskState::Assigned => c.assigned += 1,
                TaskState::Running => c.running += 1,
                TaskState::Succeeded => c.succeeded += 1,
                TaskState::Failed => c.failed += 1,
            }
        }
        c
    }
}

fn read_config(doc: &Automerge) -> QueueConfig {
    let mut c = QueueConfig::default();
    let Some(obj) = am::object(doc, &ROOT, keys::CONFIG, ObjType::Map) else {
        return c;
    };
    let u = |k: &str, v: &mut u64| {
        if let Some(x) = am::uint(doc, &obj, k) {
            *v = x;
        }
    };
    u("heartbeat_ms", &mut c.heartbeat_ms);
    u("takeover_after_ms", &mut c.takeover_after_ms);
    u("settle_ms", &mut c.settle_ms);
    u("pool_heartbeat_ms", &mut c.pool_heartbeat_ms);
    u("lease_ms", &mut c.lease_ms);
    u("retry_backoff_ms", &mut c.retry_backoff_ms);
    u("retry_backoff_max_ms", &mut c.retry_backoff_max_ms);
    u("rate_interval_ms", &mut c.rate_interval_ms);
    if let Some(x) = am::uint(doc, &obj, "max_attempts") {
        c.max_attempts = u32::try_from(x).unwrap_or(u32::MAX);
    }
    if let Some(x) = am::uint(doc, &obj, "concurrency") {
        c.concurrency = u32::try_from(x).unwrap_or(u32::MAX);
    }
    if let Some(o) = am::string(doc, &obj, "order").and_then(|s| Order::parse(&s)) {
        c.order = o;
    }
    c
}

pub(crate) fn read_claims<R: ReadDoc>(doc: &R) -> Vec<Claim> {
    am::all_objects(doc, &ROOT, keys::ROUTER, ObjType::Map)
        .into_iter()
        .filter_map(|obj| {
            let term = am::uint(doc, &obj, keys::TERM)?;
            let peer = am::string(doc, &obj, keys::PEER)?;
            Some(Claim::new(term, PeerId::new(peer)))
        })
        .collect()
}

fn read_task_entry(
    doc: &Automerge,
    obj: &ObjId,
    id: TaskId,
    malformed: &mut usize,
) -> Option<TaskEntry> {
    let kind = am::string(doc, obj, keys::KIND)?;
    let submitted_at = am::uint(doc, obj, keys::SUBMITTED_AT)?;
    let submitter = PeerId::new(am::string(doc, obj, keys::SUBMITTER)?);
    let priority = am::int(doc, obj, keys::PRIORITY).unwrap_or(0);
    let urgent = am::boolean(doc, obj, keys::URGENT).unwrap_or(false);
    let max_attempts = am::uint(doc, obj, keys::MAX_ATTEMPTS)
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
        .unwrap_or(1)
        .max(1);
    let mut attempts = Vec::new();
    if let Some(list) = am::object(doc, obj, keys::ATTEMPTS, ObjType::List) {
        for a in am::list_objects(doc, &list, ObjType::Map) {
            match read_attempt(doc, &a) {
                Some(a) => attempts.push(a),
                None => *malformed += 1,
            }
        }
    }
    Some(TaskEntry {
        id,
        kind,
        submitted_at,
        submitter,
        priority,
        urgent,
        max_attempts,
        attempts,
    })
}

pub(crate) fn read_attempt<R: ReadDoc>(doc: &R, obj: &ObjId) -> Option<Attempt> {
    let n = am::uint(doc, obj, keys::N)?;
    let term = am::uint(doc, obj, keys::TERM)?;
    let router = PeerId::new(am::string(doc, obj, keys::ROUTER)?);
    let worker = am::string(doc, obj, keys::WORKER)?.parse().ok()?;
    let assigned_at = am::uint(doc, obj, keys::ASSIGNED_AT)?;
    Some(Attempt {
        id: AttemptId {
            n,
            claim: Claim::new(term, router),
        },
        worker,
        assigned_at,
        started: read_started(doc, obj),
        finished: read_finished(doc, obj),
    })
}

/// The start record; among concurrent ones, the greatest `(incarnation, at)`.
pub(crate) fn read_started<R: ReadDoc>(doc: &R, attempt: &ObjId) -> Option<Started> {
    am::all_objects(doc, attempt, keys::START, ObjType::Map)
        .into_iter()
        .filter_map(|o| {
            Some(Started {
                at: am::uint(doc, &o, keys::AT)?,
                incarnation: am::uint(doc, &o, keys::INCARNATION)?,
            })
        })
        .max_by_key(|s| (s.incarnation, s.at))
}

/// The end record; among concurrent ones, the greatest by outcome, then time, then error text.
pub(crate) fn read_finished<R: ReadDoc>(doc: &R, attempt: &ObjId) -> Option<Finished> {
    am::all_objects(doc, attempt, keys::FINISH, ObjType::Map)
        .into_iter()
        .filter_map(|o| {
            Some(Finished {
                at: am::uint(doc, &o, keys::AT)?,
                outcome: AttemptOutcome::parse(&am::string(doc, &o, keys::OUTCOME)?)?,
                error: am::string(doc, &o, keys::ERROR),
            })
        })
        .max_by(|a, b| {
            a.outcome
                .cmp(&b.outcome)
                .then(a.at.cmp(&b.at))
                .then(a.error.cmp(&b.error))
        })
}
