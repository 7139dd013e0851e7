//! Typed operations on a queue document. Each is one Automerge transaction: it applies whole or
//! not at all.

use automerge::transaction::{Transactable, Transaction};
use automerge::{Automerge, AutomergeError, ObjId, ObjType, ROOT, ReadDoc, ScalarValue};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::config::QueueConfig;
use crate::ids::{AttemptId, Claim, MAX_TERM, PeerId, TaskId, WorkerId};
use crate::keys;
use crate::view::{AttemptOutcome, read_finished, read_started};

/// A task to index in a queue document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submission {
    /// The task's id: its task document's URL.
    pub id: TaskId,
    /// The handler kind.
    pub kind: String,
    /// The submitting peer.
    pub submitter: PeerId,
    /// Wall-clock submit time (unix ms).
    pub submitted_at: u64,
    /// Relative priority in `[-99999, 99999]`; greater runs first.
    pub priority: i64,
    /// Run before every non-urgent task.
    pub urgent: bool,
    /// Failed attempts before the task is dead-lettered; the queue's default if `None`.
    pub max_attempts: Option<u32>,
}

/// An assignment of one task attempt to a worker, made by a router.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assignment {
    /// The task.
    pub task: TaskId,
    /// The attempt: its number and the assigning router's claim.
    pub attempt: AttemptId,
    /// The worker that is to run it.
    pub worker: WorkerId,
    /// The incarnation of the worker's pool this assignment is addressed to: the one in the
    /// pool heartbeat the router based it on. A pool of another incarnation (a restarted node
    /// that finds an assignment made to its earlier life) refuses it instead of starting it.
    pub incarnation: u64,
}

/// Relative priorities are clamped to this magnitude.
pub const MAX_PRIORITY: i64 = 99_999;

/// Creating a queue document failed.
#[derive(Debug, thiserror::Error)]
pub enum CreateQueueError {
    /// The document already has content.
    #[error("the document is not empty")]
    NotEmpty,
    /// The configuration cannot work.
    #[error("invalid queue configuration: {0}")]
    Config(#[from] crate::ConfigError),
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

/// Writing to a queue document failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The document is not a queue document.
    #[error("not a queue document")]
    NotAQueue,
    /// The claim's term is above [`MAX_TERM`]: readers would ignore it.
    #[error("router term {0} is above the maximum {MAX_TERM}")]
    TermTooLarge(u64),
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

/// Submitting a task failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The document is not a queue document.
    #[error("not a queue document")]
    NotAQueue,
    /// A task with this id is already indexed.
    #[error("task {0} is already in the queue")]
    Duplicate(TaskId),
    /// The kind is empty.
    #[error("a task needs a kind")]
    EmptyKind,
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

/// Recording an assignment failed; no assignment of the batch was written.
#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    /// The document is not a queue document.
    #[error("not a queue document")]
    NotAQueue,
    /// The task is not indexed.
    #[error("task {0} is not in the queue")]
    UnknownTask(TaskId),
    /// The task already has an attempt with this id.
    #[error("task {0} already has attempt {1}")]
    DuplicateAttempt(TaskId, AttemptId),
    /// The attempt's router term is above [`MAX_TERM`]: readers would count the attempt as
    /// malformed.
    #[error("router term {0} is above the maximum {MAX_TERM}")]
    TermTooLarge(u64),
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

/// Recording an attempt's start or end failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The document is not a queue document.
    #[error("not a queue document")]
    NotAQueue,
    /// The task is not indexed.
    #[error("task {0} is not in the queue")]
    UnknownTask(TaskId),
    /// The task has no such attempt.
    #[error("task {0} has no attempt {1}")]
    UnknownAttempt(TaskId, AttemptId),
    /// The attempt is assigned to another worker.
    #[error("attempt {attempt} of task {task} belongs to {owner}, not {worker}")]
    WrongWorker {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: AttemptId,
        /// The worker it was assigned to.
        owner: Box<WorkerId>,
        /// The worker that tried to write.
        worker: Box<WorkerId>,
    },
    /// The attempt was already started.
    #[error("attempt {1} of task {0} was already started")]
    AlreadyStarted(TaskId, AttemptId),
    /// The attempt has not started, so it cannot succeed or fail.
    #[error("attempt {1} of task {0} has not started")]
    NotStarted(TaskId, AttemptId),
    /// The attempt already ended.
    #[error("attempt {1} of task {0} already ended")]
    AlreadyFinished(TaskId, AttemptId),
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

fn is_queue(tx: &Transaction<'_>) -> bool {
    am::string(tx, &ROOT, keys::SCHEMA).as_deref() == Some(keys::QUEUE_SCHEMA)
}

fn commit<O, E>(
    doc: &mut Automerge,
    f: impl FnOnce(&mut Transaction<'_>) -> Result<O, E>,
) -> Result<O, E>
where
    E: From<AutomergeError>,
{
    doc.transact(f).map(|s| s.result).map_err(|f| f.error)
}

/// Writes a new queue into an empty document, with `creator` as its first member.
pub fn create(
    doc: &mut Automerge,
    name: &str,
    config: &QueueConfig,
    creator: &PeerId,
    now_ms: u64,
) -> Result<(), CreateQueueError> {
    config.validate()?;
    if !doc.get_heads().is_empty() {
        return Err(CreateQueueError::NotEmpty);
    }
    commit(doc, |tx| {
        tx.put(ROOT, keys::SCHEMA, keys::QUEUE_SCHEMA)?;
        tx.put(ROOT, keys::VERSION, keys::SCHEMA_VERSION)?;
        tx.put(ROOT, keys::NAME, name)?;
        tx.put(ROOT, keys::CREATED_AT, now_ms)?;
        tx.put(ROOT, keys::CREATOR, creator.as_str())?;
        tx.put(ROOT, keys::PAUSED, false)?;
        write_config(tx, config)?;
        let members = tx.put_object(ROOT, keys::MEMBERS, ObjType::Map)?;
        write_member(tx, &members, creator, &[], now_ms)?;
        tx.put_object(ROOT, keys::TASKS, ObjType::Map)?;
        Ok::<_, CreateQueueError>(())
    })
}

fn write_config(tx: &mut Transaction<'_>, c: &QueueConfig) -> Result<(), AutomergeError> {
    let obj = tx.put_object(ROOT, keys::CONFIG, ObjType::Map)?;
    for (k, v) in [
        ("heartbeat_ms", c.heartbeat_ms),
        ("takeover_after_ms", c.takeover_after_ms),
        ("settle_ms", c.settle_ms),
        ("pool_heartbeat_ms", c.pool_heartbeat_ms),
        ("lease_ms", c.lease_ms),
        ("max_attempts", u64::from(c.max_attempts)),
        ("retry_backoff_ms", c.retry_backoff_ms),
        ("retry_backoff_max_ms", c.retry_backoff_max_ms),
        ("concurrency", u64::from(c.concurrency)),
        ("rate_interval_ms", c.rate_interval_ms),
    ] {
        tx.put(&obj, k, v)?;
    }
    tx.put(&obj, "order", c.order.as_str())?;
    Ok(())
}

fn write_member(
    tx: &mut Transaction<'_>,
    members: &ObjId,
    peer: &PeerId,
    addrs: &[String],
    now_ms: u64,
) -> Result<(), AutomergeError> {
    let m = tx.put_object(members, peer.as_str(), ObjType::Map)?;
    tx.put(&m, keys::ROLE, "member")?;
    tx.put(&m, keys::JOINED_AT, now_ms)?;
    let list = tx.put_object(&m, keys::ADDRS, ObjType::List)?;
    for (i, a) in addrs.iter().enumerate() {
        tx.insert(&list, i, a.as_str())?;
    }
    Ok(())
}

/// Adds `peer` as a member, or refreshes the addresses it listens on.
pub fn set_member(
    doc: &mut Automerge,
    peer: &PeerId,
    addrs: &[String],
    now_ms: u64,
) -> Result<(), WriteError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        let members = match am::object(tx, &ROOT, keys::MEMBERS, ObjType::Map) {
            Some(m) => m,
            None => tx.put_object(ROOT, keys::MEMBERS, ObjType::Map)?,
        };
        write_member(tx, &members, peer, addrs, now_ms)?;
        Ok(())
    })
}

/// Writes `claim` as the queue's router (step one of the takeover protocol). Concurrent claims
/// coexist as conflicting values; the greatest `(term, peer)` among them is effective. A term
/// above [`MAX_TERM`] is refused.
pub fn claim_router(doc: &mut Automerge, claim: &Claim, now_ms: u64) -> Result<(), WriteError> {
    if !claim.is_valid() {
        return Err(WriteError::TermTooLarge(claim.term));
    }
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        let r = tx.put_object(ROOT, keys::ROUTER, ObjType::Map)?;
        tx.put(&r, keys::TERM, claim.term)?;
        tx.put(&r, keys::PEER, claim.peer.as_str())?;
        tx.put(&r, keys::CLAIMED_AT, now_ms)?;
        Ok(())
    })
}

/// Pauses or resumes routing.
pub fn set_paused(doc: &mut Automerge, paused: bool) -> Result<(), WriteError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        tx.put(ROOT, keys::PAUSED, paused)?;
        Ok(())
    })
}

/// Indexes a task in the queue. The queue's `max_attempts` applies unless the submission says
/// otherwise, and is fixed into the entry so later config changes cannot revive a dead task.
/// Like the queue's, it is clamped to
/// `[QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS]`.
pub fn submit(doc: &mut Automerge, s: &Submission) -> Result<(), SubmitError> {
    if s.kind.is_empty() {
        return Err(SubmitError::EmptyKind);
    }
    let max_attempts = s
        .max_attempts
        .unwrap_or_else(|| crate::view::read_config_of(doc).map_or(1, |c| c.max_attempts))
        .clamp(QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS);
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(SubmitError::NotAQueue);
        }
        let tasks = match am::object(tx, &ROOT, keys::TASKS, ObjType::Map) {
            Some(t) => t,
            None => tx.put_object(ROOT, keys::TASKS, ObjType::Map)?,
        };
        if tx.get(&tasks, s.id.as_str())?.is_some() {
            return Err(SubmitError::Duplicate(s.id.clone()));
        }
        let e = tx.put_object(&tasks, s.id.as_str(), ObjType::Map)?;
        tx.put(&e, keys::KIND, s.kind.as_str())?;
        tx.put(&e, keys::SUBMITTED_AT, s.submitted_at)?;
        tx.put(&e, keys::SUBMITTER, s.submitter.as_str())?;
        tx.put(
            &e,
            keys::PRIORITY,
            ScalarValue::Int(s.priority.clamp(-MAX_PRIORITY, MAX_PRIORITY)),
        )?;
        tx.put(&e, keys::URGENT, s.urgent)?;
        tx.put(&e, keys::MAX_ATTEMPTS, u64::from(max_attempts))?;
        tx.put_object(&e, keys::ATTEMPTS, ObjType::List)?;
        Ok(())
    })
}

fn task_obj(tx: &Transaction<'_>, task: &TaskId) -> Option<ObjId> {
    let tasks = am::object(tx, &ROOT, keys::TASKS, ObjType::Map)?;
    am::object(tx, &tasks, task.as_str(), ObjType::Map)
}

fn attempts_list(tx: &mut Transaction<'_>, entry: &ObjId) -> Result<ObjId, AutomergeError> {
    match am::object(tx, entry, keys::ATTEMPTS, ObjType::List) {
        Some(l) => Ok(l),
        None => tx.put_object(entry, keys::ATTEMPTS, ObjType::List),
    }
}

fn find_attempt(tx: &Transaction<'_>, entry: &ObjId, id: &AttemptId) -> Option<ObjId> {
    let list = am::object(tx, entry, keys::ATTEMPTS, ObjType::List)?;
    am::list_objects(tx, &list, ObjType::Map)
        .into_iter()
        .find(|a| {
            am::uint(tx, a, keys::N) == Some(id.n)
                && am::uint(tx, a, keys::TERM) == Some(id.claim.term)
                && am::string(tx, a, keys::ROUTER).as_deref() == Some(id.claim.peer.as_str())
        })
}

/// Records a round of assignments in one change, each with the pool incarnation it is
/// addressed to.
pub fn record_assignments(
    doc: &mut Automerge,
    assignments: &[Assignment],
    now_ms: u64,
) -> Result<(), AssignError> {
    if assignments.is_empty() {
        return Ok(());
    }
    if let Some(a) = assignments.iter().find(|a| !a.attempt.claim.is_valid()) {
        return Err(AssignError::TermTooLarge(a.attempt.claim.term));
    }
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(AssignError::NotAQueue);
        }
        for a in assignments {
            let entry =
                task_obj(tx, &a.task).ok_or_else(|| AssignError::UnknownTask(a.task.clone()))?;
            if find_attempt(tx, &entry, &a.attempt).is_some() {
                return Err(AssignError::DuplicateAttempt(
                    a.task.clone(),
                    a.attempt.clone(),
                ));
            }
            let list = attempts_list(tx, &entry)?;
            let len = tx.length(&list);
            let obj = tx.insert_object(&list, len, ObjType::Map)?;
            tx.put(&obj, keys::N, a.attempt.n)?;
            tx.put(&obj, keys::TERM, a.attempt.claim.term)?;
            tx.put(&obj, keys::ROUTER, a.attempt.claim.peer.as_str())?;
            tx.put(&obj, keys::WORKER, a.worker.to_string())?;
            tx.put(&obj, keys::POOL_INCARNATION, a.incarnation)?;
            tx.put(&obj, keys::ASSIGNED_AT, now_ms)?;
        }
        Ok(())
    })
}

fn owned_attempt(
    tx: &Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
) -> Result<ObjId, AttemptError> {
    let entry = task_obj(tx, task).ok_or_else(|| AttemptError::UnknownTask(task.clone()))?;
    let obj = find_attempt(tx, &entry, attempt)
        .ok_or_else(|| AttemptError::UnknownAttempt(task.clone(), attempt.clone()))?;
    let owner: Option<WorkerId> = am::string(tx, &obj, keys::WORKER).and_then(|w| w.parse().ok());
    match owner {
        Some(o) if &o == worker => Ok(obj),
        Some(o) => Err(AttemptError::WrongWorker {
            task: task.clone(),
            attempt: attempt.clone(),
            owner: Box::new(o),
            worker: Box::new(worker.clone()),
        }),
        None => Err(AttemptError::UnknownAttempt(task.clone(), attempt.clone())),
    }
}

/// Records that `worker` started an attempt assigned to it.
pub fn record_start(
    doc: &mut Automerge,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
    incarnation: u64,
    now_ms: u64,
) -> Result<(), AttemptError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(AttemptError::NotAQueue);
        }
        let obj = owned_attempt(tx, task, attempt, worker)?;
        if read_finished(tx, &obj).is_some() {
            return Err(AttemptError::AlreadyFinished(task.clone(), attempt.clone()));
        }
        if read_started(tx, &obj).is_some() {
            return Err(AttemptError::AlreadyStarted(task.clone(), attempt.clone()));
        }
        let s = tx.put_object(&obj, keys::START, ObjType::Map)?;
        tx.put(&s, keys::AT, now_ms)?;
        tx.put(&s, keys::INCARNATION, incarnation)?;
        Ok(())
    })
}

/// Records how an attempt ended. `Refused` needs an attempt that never started; `Succeeded` and
/// `Failed` need one that did; `Interrupted` applies to either.
pub fn record_finish(
    doc: &mut Automerge,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
    outcome: AttemptOutcome,
    error: Option<&str>,
    now_ms: u64,
) -> Result<(), AttemptError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(AttemptError::NotAQueue);
        }
        let obj = owned_attempt(tx, task, attempt, worker)?;
        if read_finished(tx, &obj).is_some() {
            return Err(AttemptError::AlreadyFinished(task.clone(), attempt.clone()));
        }
        let started = read_started(tx, &obj).is_some();
        match outcome {
            AttemptOutcome::Refused | AttemptOutcome::Unavailable if started => {
                return Err(AttemptError::AlreadyStarted(task.clone(), attempt.clone()));
            }
            AttemptOutcome::Succeeded | AttemptOutcome::Failed if !started => {
                return Err(AttemptError::NotStarted(task.clone(), attempt.clone()));
            }
            _ => {}
        }
        let f = tx.put_object(&obj, keys::FINISH, ObjType::Map)?;
        tx.put(&f, keys::AT, now_ms)?;
        tx.put(&f, keys::OUTCOME, outcome.as_str())?;
        if let Some(e) = error {
            tx.put(&f, keys::ERROR, e)?;
        }
        Ok(())
    })
}

/// Marks a task's input available again: a member holding its task document says so after an
/// attempt found no reachable member with it (the task is in
/// [`crate::TaskState::InputUnavailable`] until an attempt number at least `n` is marked).
/// Concurrent marks keep their greatest value. Does nothing if `n` is not above the mark.
pub fn mark_input_available(
    doc: &mut Automerge,
    task: &TaskId,
    n: u64,
) -> Result<(), AttemptError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(AttemptError::NotAQueue);
        }
        let entry = task_obj(tx, task).ok_or_else(|| AttemptError::UnknownTask(task.clone()))?;
        if am::max_uint(tx, &entry, keys::INPUT_SEEN) >= n {
            return Ok(());
        }
        tx.put(&entry, keys::INPUT_SEEN, n)?;
        Ok(())
    })
}
