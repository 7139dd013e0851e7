//! The node's API types: what a node's handle and its HTTP API take and return (as JSON), and
//! the errors of each operation.

use piecework_queue_doc::task::Run;
use std::time::Duration;

use piecework_queue_doc::{
    Attempt, Claim, PeerId, QueueConfig, QueueId, RunningReport, StateCounts, TaskId, TaskState,
    queue, task,
};
use serde::{Deserialize, Serialize};

/// `POST /v1/queues`: create a queue.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateQueue {
    /// The queue's name.
    pub name: String,
    /// Its configuration; the defaults if absent.
    #[serde(default)]
    pub config: Option<QueueConfig>,
}

/// A queue id, as returned on creation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Created {
    /// The new queue's id.
    pub queue_id: QueueId,
}

/// `POST /v1/queues/{id}/tasks`: submit a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubmitTask {
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    #[serde(default)]
    pub input: serde_json::Value,
    /// Relative priority in `[-99999, 99999]`.
    #[serde(default)]
    pub priority: i64,
    /// Run before every non-urgent task.
    #[serde(default)]
    pub urgent: bool,
    /// Failed attempts before dead-lettering; the queue's default if absent.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Priority tags: the queue's boost of each adds to the task's effective priority.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Tasks of the same queue that must succeed first (each must exist).
    #[serde(default)]
    pub depends_on: Vec<TaskId>,
    /// Not routed before this many milliseconds after the submit.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Not routed before this time (RFC 3339, e.g. `2026-11-28T09:00:00Z`). Not with
    /// `delay_ms`.
    #[serde(default)]
    pub not_before: Option<String>,
    /// While a pending task of the queue holds this key, a submit of it adds no task: it moves
    /// that one to the front of its priority class (`deduplicated: true` in the answer).
    #[serde(default)]
    pub dedup_key: Option<String>,
    /// A retry of a submit with this key (a client that lost the answer) returns the task
    /// the first one made, whatever its state, for at least 24 hours.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Resources a pool must hold to be assigned the task (names like tags).
    #[serde(default)]
    pub requires: Vec<String>,
    /// A run past this many milliseconds is cancelled and recorded failed ("timed out after N
    /// ms"), then retried by the policy; the queue's `timeout_ms` if absent. At most 7 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl SubmitTask {
    /// A schedule's task template, as its record holds it.
    pub fn from_template(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// A submit of `kind` with `input` and every other field at its default.
    pub fn new(kind: impl Into<String>, input: serde_json::Value) -> Self {
        SubmitTask {
            kind: kind.into(),
            input,
            priority: 0,
            urgent: false,
            max_attempts: None,
            tags: Vec::new(),
            depends_on: Vec::new(),
            delay_ms: None,
            not_before: None,
            dedup_key: None,
            idempotency_key: None,
            requires: Vec::new(),
            timeout_ms: None,
        }
    }
}

/// A submitted task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Submitted {
    /// The task's id.
    pub task_id: TaskId,
    /// Whether a connected peer held the task before the submit returned. `false` means only
    /// this node has it for now (it was offline, or peers were slow): it is durable here and
    /// spreads when peers are reachable.
    pub replicated: bool,
    /// The submit's dedup key was held by a pending task of the queue: no task was added, this
    /// is that task (moved to the front of its priority class, its priority raised to the
    /// submit's where higher).
    #[serde(default)]
    pub deduplicated: bool,
}

/// The most entries one batch submit may hold ([`crate::Command::SubmitMany`],
/// `POST /v1/queues/{id}/tasks` with an array body).
pub const MAX_BATCH: usize = 1_000;

/// One entry of a batch submit's answer, in the order of the request: the task, or why this
/// entry was refused (the others are not affected).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BatchEntry {
    /// The entry was indexed as a task.
    Submitted {
        /// The entry's position in the request, from 0.
        index: usize,
        /// The task's id.
        task_id: TaskId,
        /// As in [`Submitted::replicated`], for the whole batch.
        replicated: bool,
        /// As in [`Submitted::deduplicated`].
        #[serde(default)]
        deduplicated: bool,
    },
    /// The entry was refused.
    Refused {
        /// The entry's position in the request, from 0.
        index: usize,
        /// Why.
        error: String,
    },
}

impl BatchEntry {
    /// The task's id, if the entry was indexed.
    pub fn task_id(&self) -> Option<&TaskId> {
        match self {
            BatchEntry::Submitted { task_id, .. } => Some(task_id),
            BatchEntry::Refused { .. } => None,
        }
    }
}

/// One queue as this node sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QueueStatus {
    /// The queue's id.
    pub id: QueueId,
    /// Its name.
    pub name: String,
    /// The effective router, per this node's replica.
    pub router: Option<Claim>,
    /// This node's router role: `follower`, `claiming` or `active`.
    pub role: String,
    /// Members.
    pub members: usize,
    /// Whether routing is paused.
    pub paused: bool,
    /// The queue document's epoch this node is on (0 until the first rotation): how many
    /// times the queue document was rotated into a successor that carries only live tasks.
    pub epoch: u64,
    /// Task counts by state, over the queue's whole life (tasks that ended in earlier epochs
    /// count as they ended).
    pub tasks: StateCounts,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// The boost of each priority tag that has one.
    #[serde(default)]
    pub boosts: std::collections::BTreeMap<String, i64>,
    /// The queue's schedules, by name.
    #[serde(default)]
    pub schedules: Vec<ScheduleStatus>,
}

/// `PUT /v1/queues/{id}/schedules/{name}`: a named schedule that submits `task` at every slot,
/// given as `every_ms` or `cron` (not both).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutSchedule {
    /// Every this many ms (at least 100), at the multiples of the interval since the unix
    /// epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// A cron expression, in UTC: 5 fields (minute first), or 6 with seconds first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The task each slot submits: a submit body, without `depends_on`, `not_before`,
    /// `dedup_key` or `idempotency_key` (a slot's dedup key is `schedule/<name>/<slot>`).
    pub task: SubmitTask,
    /// Paused: its slots pass without firing.
    #[serde(default)]
    pub paused: bool,
}

/// A schedule, as this node's view of the queue shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScheduleStatus {
    /// Its name.
    pub name: String,
    /// Its interval, for an interval schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// Its cron expression, for a cron schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The task each slot submits.
    pub task: serde_json::Value,
    /// Paused.
    pub paused: bool,
    /// The last slot fired (unix ms); null until one is.
    pub last_slot: Option<u64>,
    /// When the next slot falls due (unix ms); null while paused.
    pub next_fire_at: Option<u64>,
    /// Slots skipped because they were more than one interval late (nobody fired them).
    pub missed: u64,
    /// When the schedule was last written (unix ms).
    pub updated_at: u64,
}

impl ScheduleStatus {
    /// The status of schedule `name` as a view reads it.
    pub fn of(name: &str, s: &piecework_queue_doc::Schedule) -> Self {
        let (every_ms, cron) = match &s.every {
            piecework_queue_doc::Every::Ms(ms) => (Some(*ms), None),
            piecework_queue_doc::Every::Cron(c) => (None, Some(c.clone())),
        };
        ScheduleStatus {
            name: name.to_owned(),
            every_ms,
            cron,
            task: serde_json::from_str(&s.template).unwrap_or(serde_json::Value::Null),
            paused: s.paused,
            last_slot: (s.slot.l > 0).then_some(s.slot.l),
            next_fire_at: s.next_fire_at(),
            missed: s.slot.m,
            updated_at: s.updated_at,
        }
    }
}

/// `GET /v1/queues/{id}/schedules`: a queue's schedules, by name.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Schedules {
    /// Each schedule.
    pub schedules: Vec<ScheduleStatus>,
}

/// The most tasks one page of a listing holds; larger limits are clamped.
pub const MAX_LIST: usize = 500;

/// `GET /v1/queues/{id}/tasks`: a page of a queue's tasks, by id.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskList {
    /// Each task's status without its runs.
    pub tasks: Vec<serde_json::Value>,
    /// Pass as `cursor` for the next page; null on the last.
    pub next_cursor: Option<TaskId>,
}

/// `PUT /v1/queues/{id}/boosts/{tag}`: a tag's boost.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetBoost {
    /// In `[-1000000, 1000000]`; 0 removes it.
    pub boost: i64,
}

/// Why a pending task cannot be routed now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum BlockedOn {
    /// Dependencies that have not succeeded yet.
    Dependencies {
        /// Their ids.
        tasks: Vec<TaskId>,
    },
    /// Its not-before time has not come (by this node's clock).
    NotBefore {
        /// The time, unix ms.
        until: u64,
    },
    /// The queue is paused.
    Paused,
    /// No live pool this node hears from has a handler for its kind.
    Kind {
        /// The kind.
        kind: String,
    },
    /// No live pool with a handler for its kind holds every resource it requires.
    Resource {
        /// The resources missing (those no such pool holds, or all it requires if each is
        /// held by some pool but none holds them all).
        resources: Vec<String>,
    },
}

/// `GET /v1/resources`: the resources this node's pool holds or has withdrawn for a while.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// By name.
    pub resources: Vec<Resource>,
}

/// One resource of this node's pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// Its name.
    pub name: String,
    /// Held now (advertised in the pool's heartbeats).
    pub held: bool,
    /// Withdrawn: held again by itself at this time (unix ms, this node's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_at: Option<u64>,
}

/// A change to this node's resources failed.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// Not a valid resource name.
    #[error(
        "invalid resource name {0:?}: names are 1 to 64 ASCII letters, digits, '_', '-', '.' or ':'"
    )]
    InvalidName(String),
    /// Withdrawing a resource this node neither holds nor restores later.
    #[error("this node does not hold resource {0:?}")]
    NotHeld(String),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
    /// The node's shell is gone, for this reason.
    #[error("the node has stopped: {0}")]
    Ended(String),
}

/// One of this node's workers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// The worker's name (`<peer>/<index>`).
    pub name: String,
    /// What it runs, if anything.
    pub running: Option<RunningReport>,
}

/// `GET /v1/status`: this node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node's peer id.
    pub peer_id: String,
    /// How many times this node has started.
    pub incarnation: u64,
    /// Addresses it listens on.
    pub listen: Vec<String>,
    /// Connected peers.
    pub connected: Vec<String>,
    /// Handler kinds this node runs.
    pub kinds: Vec<String>,
    /// Its queues.
    pub queues: Vec<QueueStatus>,
    /// Its workers.
    pub workers: Vec<WorkerStatus>,
    /// Documents held in memory (queues and live tasks; finished tasks' stay on disk).
    pub documents_loaded: usize,
    /// The sizes of the node's internal collections (documents loaded, sealed epochs held,
    /// waiters…), each bounded: for an operator who watches a node's memory.
    #[serde(default)]
    pub internals: std::collections::BTreeMap<String, usize>,
}

/// `GET /v1/tasks/{id}`: a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task's id.
    pub id: TaskId,
    /// Its queue.
    pub queue: QueueId,
    /// Its kind.
    pub kind: String,
    /// Its state, per this node's replica of the queue.
    pub state: TaskState,
    /// Wall-clock submit time (unix ms).
    pub submitted_at: u64,
    /// The submitter.
    pub submitter: String,
    /// Its input.
    pub input: serde_json::Value,
    /// Its priority: from the queue's current epoch while it indexes the task, then from the
    /// task's final summary (`None` only for a task finished by a version whose summaries did
    /// not carry it).
    #[serde(default)]
    pub priority: Option<i64>,
    /// Whether it was submitted urgent (same as `priority`).
    #[serde(default)]
    pub urgent: Option<bool>,
    /// The attempts it may take (same as `priority`).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Its priority tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The tasks it depends on.
    #[serde(default)]
    pub depends_on: Vec<TaskId>,
    /// Its dedup key, if it has one.
    #[serde(default)]
    pub dedup_key: Option<String>,
    /// The resources a pool must hold to run it.
    #[serde(default)]
    pub requires: Vec<String>,
    /// Not routed before this time (unix ms), if it has one.
    #[serde(default)]
    pub not_before: Option<u64>,
    /// The sum of its tags' boosts × 200,000, plus its priority (while the queue's current
    /// epoch indexes it).
    #[serde(default)]
    pub effective_priority: Option<i64>,
    /// Why it cannot be routed now (`state` is then `blocked`); null otherwise.
    #[serde(default)]
    pub blocked_on: Option<BlockedOn>,
    /// Why it was cancelled (`state` is then `cancelled`).
    #[serde(default)]
    pub cancel_reason: Option<String>,
    /// A member asked to cancel it (`POST /v1/tasks/{id}/cancel`). Its state is then
    /// `cancelled`, unless a run of it succeeded (a success outranks a cancel).
    #[serde(default)]
    pub cancel_requested: bool,
    /// How far it is: while it runs, as its handler last reported (carried by its pool's
    /// heartbeats); once a run ended, as that run's record keeps it. `{"fraction": f}` or
    /// `{"done": n, "total": n}`; null if never reported.
    #[serde(default)]
    pub progress: Option<piecework_queue_doc::Progress>,
    /// The task whose successful run submitted this one as a follow-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<TaskId>,
    /// The task whose undo submitted this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undoes: Option<TaskId>,
    /// The result of the first successful run, once this node has it.
    pub result: Option<serde_json::Value>,
    /// The last error, if an attempt failed.
    pub error: Option<String>,
    /// Every attempt (from the queue document).
    pub attempts: Vec<Attempt>,
    /// Every run that ended (from the task document: a run is recorded whole when it ends;
    /// a running one shows in its attempt).
    pub runs: Vec<Run>,
}

/// One step in the life of a queue or of one of its tasks, as a node's replica learned it
/// (whoever made it): `GET /v1/events` streams them, [`EVENT_NAMES`] lists their names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueEvent {
    /// The event's name (one of [`EVENT_NAMES`]).
    pub event: String,
    /// The queue.
    pub queue: QueueId,
    /// The task it is about, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// When the node learned it (unix ms, its clock).
    pub at: u64,
    /// What else it says (an attempt's number and worker, an error, a progress...).
    #[serde(flatten)]
    pub data: serde_json::Map<String, serde_json::Value>,
}

/// The names of the events, a task's in the order of its life, then the queue's.
pub const EVENT_NAMES: [&str; 17] = [
    "submitted",
    "blocked",
    "assigned",
    "started",
    "progress",
    "succeeded",
    "attempt_failed",
    "retrying",
    "dead_lettered",
    "cancelled",
    "requeued",
    "queue_paused",
    "queue_resumed",
    "router_elected",
    "router_stepped_down",
    "peer_up",
    "peer_down",
];

/// An error from the HTTP API.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong.
    pub error: String,
}

/// A storage failure reported by the driver (the shell's disk), carried as its message: the core
/// cannot inspect I/O errors, only report them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("storage: {0}")]
pub struct StorageFailure(pub String);

/// A queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The id is not an `automerge:` URL.
    #[error("not a queue id (expected automerge:<id>): {0:?}")]
    BadId(String),
    /// No connected peer has the queue.
    #[error("no connected peer has queue {0} (is a member of it connected?)")]
    NotFound(QueueId),
    /// The document is not a queue document.
    #[error("{0} is not a queue document")]
    NotAQueue(QueueId),
    /// This node is not a member of the queue.
    #[error("this node has not joined queue {0}")]
    NotJoined(QueueId),
    /// The configuration cannot work.
    #[error(transparent)]
    Create(#[from] queue::CreateQueueError),
    /// The document could not be written.
    #[error(transparent)]
    Write(#[from] queue::WriteError),
    /// A configuration change would give a configuration that cannot work; nothing was
    /// written.
    #[error("invalid queue configuration: {0}")]
    InvalidConfig(piecework_queue_doc::ConfigError),
    /// A boost's tag or value is invalid; nothing was written.
    #[error("{0}")]
    InvalidBoost(String),
    /// A schedule's name, timing or task is invalid; nothing was written.
    #[error("{0}")]
    InvalidSchedule(String),
    /// The queue has no schedule of that name.
    #[error("queue {0} has no schedule named {1:?}")]
    UnknownSchedule(QueueId, String),
    /// Too many requests are waiting on this node.
    #[error("the node is busy: {0} requests are waiting already")]
    Busy(usize),
    /// The queue document could not be written to disk, so the queue is not durably
    /// remembered: the node serves it and keeps trying to write it, but would forget it at a
    /// restart before that succeeds.
    #[error("queue {0} could not be made durable: {1}")]
    NotDurable(QueueId, StorageFailure),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
    /// The node's shell is gone, for this reason (a stop, or a failure it reported).
    #[error("the node has stopped: {0}")]
    Ended(String),
    /// Joining a queue this node never joined needs an invite token, not its id.
    #[error(
        "joining queue {0} needs an invite token: ask an admin of the queue for one \
         (`piecework queue invite {0}`), then `piecework queue join TOKEN`"
    )]
    InviteNeeded(QueueId),
    /// This node's role in the queue does not allow the action.
    #[error("this node is {role} of queue {queue}: {action} needs {needs}")]
    Forbidden {
        /// The queue.
        queue: QueueId,
        /// This node's role (`not a member` if none).
        role: String,
        /// What was refused.
        action: &'static str,
        /// The role it needs.
        needs: &'static str,
    },
    /// The invite token is malformed, not for this queue, expired or not signed by an admin.
    #[error("invalid invite: {0}")]
    BadInvite(String),
    /// The queue's creator cannot be removed.
    #[error("the creator of queue {0} cannot be removed")]
    CreatorStays(QueueId),
    /// No member of the queue holds that peer id.
    #[error("queue {0} has no member {1}")]
    UnknownMember(QueueId, PeerId),
}

/// A member of a queue, as `GET /v1/queues/{id}/members` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberEntry {
    /// Its peer id.
    pub peer: PeerId,
    /// Its role (`submitter`, `member`, `admin`): the last one given.
    pub role: piecework_queue_doc::Role,
    /// Who added it (`null`: the creator, or a member of a queue made before memberships
    /// were signed).
    pub added_by: Option<PeerId>,
    /// Whether it was removed.
    pub removed: bool,
    /// Who removed it.
    pub removed_by: Option<PeerId>,
}

/// An invite, as `POST /v1/queues/{id}/invites` asks for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteRequest {
    /// The role it gives (`member` if absent).
    #[serde(default)]
    pub role: Option<piecework_queue_doc::Role>,
    /// The peer it is for; absent: a bearer invite (whoever holds it), until `expires_ms`.
    #[serde(default, rename = "for")]
    pub for_peer: Option<PeerId>,
    /// How long a bearer invite may be redeemed, in ms from now ([`INVITE_EXPIRES_MS`] if
    /// absent).
    #[serde(default)]
    pub expires_ms: Option<u64>,
}

/// How long a bearer invite may be redeemed when its request says nothing: a day.
pub const INVITE_EXPIRES_MS: u64 = 24 * 60 * 60 * 1000;

/// An invite made: its token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invited {
    /// The token, to give to `piecework queue join` (or `POST /v1/join`).
    pub token: String,
}

/// Submitting a task failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// This node has not joined the queue.
    #[error("this node has not joined queue {0}")]
    NotJoined(QueueId),
    /// This node was removed from the queue.
    #[error("this node was removed from queue {0}: it submits nothing more")]
    Removed(QueueId),
    /// The request is invalid.
    #[error("invalid task: {0}")]
    Invalid(String),
    /// The task document could not be written.
    #[error(transparent)]
    TaskDoc(#[from] task::TaskWriteError),
    /// The queue document refused the entry.
    #[error(transparent)]
    Queue(#[from] queue::SubmitError),
    /// The task could not be written to disk: it is not acknowledged. The node keeps it in
    /// memory and keeps trying, and it may still run; submit again to be sure.
    #[error("the task could not be made durable: {0}")]
    NotDurable(StorageFailure),
    /// Too many submits are waiting on this node.
    #[error("the node is busy: {0} submits are waiting already")]
    Busy(usize),
    /// The queue holds as many live tasks as this node takes submits for
    /// ([`crate::Config::max_live`]): submit again once some finish.
    #[error(
        "queue {queue} is full: {live} live tasks, at most {max}; submit again once some finish"
    )]
    Full {
        /// The queue.
        queue: QueueId,
        /// Its live tasks in this node's view.
        live: usize,
        /// The bound.
        max: usize,
    },
    /// A batch holds more than [`MAX_BATCH`] entries.
    #[error("a batch holds at most {MAX_BATCH} tasks; this one holds {0}")]
    TooMany(usize),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
    /// The node's shell is gone, for this reason (a stop, or a failure it reported).
    #[error("the node has stopped: {0}")]
    Ended(String),
}

/// Looking up a task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The id is not an `automerge:` URL.
    #[error("not a task id (expected automerge:<id>): {0:?}")]
    BadId(String),
    /// Neither this node nor a connected peer has the task.
    #[error("task {0} not found here or on any connected peer")]
    NotFound(TaskId),
    /// The document is not a task document.
    #[error("{0} is not a task document: {1}")]
    NotATask(TaskId, task::TaskReadError),
    /// This node has not joined the task's queue.
    #[error("task {0} belongs to queue {1}, which this node has not joined")]
    NotJoined(TaskId, QueueId),
    /// The task's queue does not index it (yet).
    #[error("task {0} is not (yet) in queue {1}'s index on this node")]
    NotIndexed(TaskId, QueueId),
    /// The wait ended before the task did.
    #[error("task {0} had not finished after {1:?}")]
    Timeout(TaskId, Duration),
    /// Too many requests are waiting on this node.
    #[error("the node is busy: {0} requests are waiting already")]
    Busy(usize),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
    /// The node's shell is gone, for this reason (a stop, or a failure it reported).
    #[error("the node has stopped: {0}")]
    Ended(String),
    /// The task's state does not allow the request (cancel of a task that ended, requeue of
    /// one that is not dead-lettered), with why.
    #[error("{0}")]
    Conflict(String),
    /// This node's role in the task's queue does not allow the action.
    #[error("{0}")]
    Forbidden(String),
    /// Writing the request's record failed.
    #[error("the task's record could not be written: {0}")]
    Write(String),
}

/// Task ids a command wrote records for (`POST /v1/queues/{id}/requeue`, and later `undo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskIds {
    /// The tasks.
    pub task_ids: Vec<TaskId>,
}

/// What a node's stop ([`crate::Command::Stop`]) did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopReport {
    /// Per queue this node was the active router of: the member it handed the role to (none:
    /// no member was heard from, and the others take over after `takeover_after`).
    pub handed_over: Vec<(QueueId, Option<PeerId>)>,
    /// Runs that ended within the grace time.
    pub runs_finished: usize,
    /// Runs still going when the grace time ran out: recorded interrupted (their tasks run
    /// again elsewhere).
    pub runs_interrupted: usize,
    /// Documents whose last changes could not be written (a failing disk): 0 on a clean stop.
    pub unsaved_documents: usize,
}

impl From<piecework_queue_doc::SetConfigError> for QueueError {
    fn from(e: piecework_queue_doc::SetConfigError) -> Self {
        match e {
            piecework_queue_doc::SetConfigError::Invalid(c) => QueueError::InvalidConfig(c),
            piecework_queue_doc::SetConfigError::Write(w) => QueueError::Write(w),
        }
    }
}

impl From<piecework_queue_doc::SetBoostError> for QueueError {
    fn from(e: piecework_queue_doc::SetBoostError) -> Self {
        match e {
            piecework_queue_doc::SetBoostError::Write(w) => QueueError::Write(w),
            e => QueueError::InvalidBoost(e.to_string()),
        }
    }
}
