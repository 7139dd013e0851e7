//! Typed operations on a queue document. Each is one Automerge transaction: it applies whole or
//! not at all.

use automerge::transaction::{Transactable, Transaction};
use automerge::{Automerge, AutomergeError, ObjId, ObjType, ROOT, ReadDoc};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::config::QueueConfig;
use crate::entry::{AttemptOutcome, Started};
use crate::ids::{AttemptId, Claim, MAX_TERM, PeerId, TaskId, WorkerId};
use crate::keys;
use crate::packed;
use crate::read::{input_seen, packed_finished, packed_started, read_finished, read_started};
use crate::view::QueueView;

pub use crate::entry::MAX_PRIORITY;

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
    /// The input (JSON text) of an inline task: a task small enough to live in the queue
    /// document alone. An inline task has no task document; its runs' results and logs are
    /// written into the queue document with their ends ([`Output`](crate::Output)). `None`
    /// for a task whose input is in its task document.
    pub input: Option<String>,
    /// Tags, delay and dependencies ([`Rules`](crate::Rules)). Each dependency must be indexed
    /// by the document, or have its final outcome in [`Rules::outcomes`](crate::Rules::outcomes)
    /// (it finished in an earlier epoch).
    #[serde(default)]
    pub rules: crate::entry::Rules,
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
    /// No claim counts at the term below the claim's: readers would ignore it (terms rise one
    /// at a time).
    #[error("router term {0} skips a term: no claim counts at the term below it")]
    SkipsTerm(u64),
    /// A task record names a task the document does not index.
    #[error("task {0} is not in the queue")]
    UnknownTask(TaskId),
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
    /// A tag is not 1 to 64 letters, digits, `_`, `-`, `.` or `:`, or there are too many.
    #[error("invalid tag {0:?}: tags are 1 to {max} ASCII letters, digits, '_', '-', '.' or ':', at most {tags} per task", max = crate::entry::MAX_TAG_LEN, tags = crate::entry::MAX_TAGS)]
    BadTag(String),
    /// A dependency is neither in the queue nor among the recorded outcomes.
    #[error("unknown dependency {0}: no task of this queue has that id")]
    UnknownDependency(TaskId),
    /// A bump names a task the document does not index.
    #[error("task {0} is not in the queue")]
    UnknownTask(TaskId),
    /// A dedup or idempotency key is empty or longer than 256 bytes.
    #[error("a dedup or idempotency key is 1 to {max} bytes", max = crate::entry::MAX_KEY_LEN)]
    BadKey,
    /// Too many dependencies, or the task depends on itself.
    #[error("a task depends on at most {max} other tasks of its queue", max = crate::entry::MAX_DEPENDENCIES)]
    BadDependencies,
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
    /// A success's follow-ups could not be written with it: the whole batch was abandoned,
    /// this write with it.
    #[error("the batch was abandoned: {0}")]
    Aborted(String),
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
        tx.put(ROOT, keys::VERSION, keys::QUEUE_VERSION)?;
        tx.put(ROOT, keys::NAME, name)?;
        tx.put(ROOT, keys::CREATED_AT, now_ms)?;
        tx.put(ROOT, keys::CREATOR, creator.as_str())?;
        tx.put(ROOT, keys::PAUSED, false)?;
        write_config(tx, config)?;
        let members = tx.put_object(ROOT, keys::MEMBERS, ObjType::Map)?;
        write_member(tx, &members, creator, &[], now_ms)?;
        tx.put_object(ROOT, keys::TASKS, ObjType::Map)?;
        tx.put_object(ROOT, keys::CLAIMS, ObjType::Map)?;
        for key in packed::MAPS {
            tx.put_object(ROOT, key, ObjType::Map)?;
        }
        tx.put_object(ROOT, packed::IDEMPOTENCY, ObjType::Map)?;
        Ok::<_, CreateQueueError>(())
    })
}

pub(crate) fn write_config(
    tx: &mut Transaction<'_>,
    c: &QueueConfig,
) -> Result<ObjId, AutomergeError> {
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
        ("timeout_ms", c.timeout_ms),
    ] {
        tx.put(&obj, k, v)?;
    }
    tx.put(&obj, "order", c.order.as_str())?;
    tx.put(
        &obj,
        "failure_policy",
        crate::settings::policy_text(&c.failure_policy),
    )?;
    Ok(obj)
}

pub(crate) fn write_member(
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

/// Makes a queue's membership signed from now on ([`crate::membership`]): writes its id and
/// its creator's key, if it has no creator key yet. From then on the members its `members` map
/// lists count only as the signed operations say; write an add for each first (see
/// [`add_member_op`]) to keep them.
pub fn set_signed_membership(
    doc: &mut Automerge,
    queue: &crate::QueueId,
    creator_key: &crate::membership::PublicKey,
) -> Result<(), WriteError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        if am::string(tx, &ROOT, keys::CREATOR_KEY).is_some() {
            return Ok(());
        }
        tx.put(ROOT, keys::QUEUE_ID, queue.as_str())?;
        tx.put(ROOT, keys::CREATOR_KEY, hex::encode(creator_key))?;
        Ok(())
    })
}

/// Stores a signed membership operation (under `mop/<its id>`, once: storing it again writes
/// nothing). Whether it counts is the materialization's ([`crate::Membership`]).
pub fn add_member_op(doc: &mut Automerge, op: &crate::MemberOp) -> Result<bool, WriteError> {
    let key = op.key_name();
    if doc.get(ROOT, key.as_str()).ok().flatten().is_some() {
        return Ok(false);
    }
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        tx.put(
            ROOT,
            key.as_str(),
            automerge::ScalarValue::Bytes(op.bytes().to_vec()),
        )?;
        Ok(true)
    })
}

/// Writes `claim` as the queue's router (step one of the takeover protocol). Claims are
/// chained: the record names the claim it supersedes, the greatest that counts at the term
/// below (none at term 1), so terms rise one at a time. Concurrent claims coexist; the
/// greatest `(term, peer)` that counts is effective. A term above [`MAX_TERM`], or one with
/// no claim counting at the term below it ([`WriteError::SkipsTerm`]), is refused.
pub fn claim_router(doc: &mut Automerge, claim: &Claim, now_ms: u64) -> Result<(), WriteError> {
    claim_router_among(doc, claim, now_ms, None)
}

/// [`claim_router`], naming the claim it supersedes among the claims `view` counts (`view`
/// must be this document's view at its current heads): a claim a view ignores (written by a
/// peer whose role does not route, see `judge.rs`) is never the one superseded, so the new
/// claim counts where that view's does.
pub fn claim_router_in_view(
    doc: &mut Automerge,
    view: &QueueView,
    claim: &Claim,
    now_ms: u64,
) -> Result<(), WriteError> {
    claim_router_among(doc, claim, now_ms, Some(&view.claims))
}

fn claim_router_among(
    doc: &mut Automerge,
    claim: &Claim,
    now_ms: u64,
    counted: Option<&[Claim]>,
) -> Result<(), WriteError> {
    if !claim.is_valid() {
        return Err(WriteError::TermTooLarge(claim.term));
    }
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        let prev = match claim.term.checked_sub(1) {
            Some(0) => None,
            Some(below) => {
                let counted = match counted {
                    Some(c) => c.to_vec(),
                    None => crate::view::read_claims(tx, &crate::judge::Judge::open()).0,
                };
                let prev = counted
                    .into_iter()
                    .filter(|c| c.term == below)
                    .max()
                    .ok_or(WriteError::SkipsTerm(claim.term))?;
                Some(prev.peer.to_string())
            }
            None => return Err(WriteError::SkipsTerm(claim.term)),
        };
        let claims = match am::object(tx, &ROOT, keys::CLAIMS, ObjType::Map) {
            Some(m) => m,
            None => tx.put_object(ROOT, keys::CLAIMS, ObjType::Map)?,
        };
        let rec = crate::view::PackedClaim {
            t: claim.term,
            c: claim.peer.to_string(),
            p: prev,
            a: now_ms,
        };
        tx.put(
            &claims,
            format!("{}/{}", claim.term, claim.peer),
            packed::encode(&rec),
        )?;
        Ok(())
    })
}

pub use crate::schedule::{delete_schedule, put_schedule};
pub use crate::settings::{set_boost, set_config, set_paused};

/// Indexes a task in the queue. The queue's `max_attempts` applies unless the submission says
/// otherwise, and is fixed into the entry so later config changes cannot revive a dead task.
/// Like the queue's, it is clamped to
/// `[QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS]`.
pub fn submit(doc: &mut Automerge, s: &Submission) -> Result<(), SubmitError> {
    submit_many(doc, std::slice::from_ref(s))
}

/// Indexes several tasks in one change, as [`submit`] does each. All or none: an error (an
/// empty kind, a duplicate id) leaves the document as it was.
pub fn submit_many(doc: &mut Automerge, subs: &[Submission]) -> Result<(), SubmitError> {
    submit_and_bump(doc, subs, &[])
}

/// [`submit_many`], and in the same change a dedup bump of each task `bumps` names (a submit
/// of its dedup key found it pending): each merges with the task's earlier bumps. A document
/// without the `bumps` map (created by a version before dedup keys, until its next
/// rotation) takes no bump; a bump of a task it does not index is refused.
pub fn submit_and_bump(
    doc: &mut Automerge,
    subs: &[Submission],
    bumps: &[(TaskId, crate::entry::Bump)],
) -> Result<(), SubmitError> {
    submit_all(doc, subs, bumps, 0)
}

/// How long an idempotency record is kept at least: a rotation drops those older than this
/// (by the rotating router's clock).
pub const IDEMPOTENCY_KEEP_MS: u64 = 24 * 3600 * 1000;

/// [`submit_and_bump`], and an idempotency record (`submitted_at` of `now_ms`) for each
/// submission whose rules carry an idempotency key: a retry of the key finds the task with
/// [`idempotent_task`]. A document without the `idempotency` map (created by an earlier
/// version, until its next rotation) keeps no record.
pub fn submit_all(
    doc: &mut Automerge,
    subs: &[Submission],
    bumps: &[(TaskId, crate::entry::Bump)],
    now_ms: u64,
) -> Result<(), SubmitError> {
    let keys: Vec<(String, TaskId)> = subs
        .iter()
        .filter_map(|s| Some((s.rules.idempotency_key.clone()?, s.id.clone())))
        .collect();
    submit_keyed(doc, subs, bumps, &keys, now_ms)
}

/// [`submit_all`], with the idempotency records given: each key names the task its submit
/// answered (a task of `subs`, or one a dedup bumped).
pub fn submit_keyed(
    doc: &mut Automerge,
    subs: &[Submission],
    bumps: &[(TaskId, crate::entry::Bump)],
    keys: &[(String, TaskId)],
    now_ms: u64,
) -> Result<(), SubmitError> {
    submit_fired(doc, subs, bumps, keys, &[], now_ms)
}

/// [`submit_keyed`], also recording the slots of schedules these submits fire, in the same
/// change (see [`crate::schedule`]).
pub fn submit_fired(
    doc: &mut Automerge,
    subs: &[Submission],
    bumps: &[(TaskId, crate::entry::Bump)],
    keys: &[(String, TaskId)],
    fired: &[crate::schedule::Firing],
    now_ms: u64,
) -> Result<(), SubmitError> {
    if subs.is_empty() && bumps.is_empty() && fired.is_empty() {
        return Ok(());
    }
    if subs.iter().any(|s| s.kind.is_empty()) {
        return Err(SubmitError::EmptyKind);
    }
    for s in subs {
        check_rules(s)?;
    }
    let default_max = crate::view::read_config_of(doc).map_or(1, |c| c.max_attempts);
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(SubmitError::NotAQueue);
        }
        let tasks = match am::object(tx, &ROOT, keys::TASKS, ObjType::Map) {
            Some(t) => t,
            None => tx.put_object(ROOT, keys::TASKS, ObjType::Map)?,
        };
        for (i, s) in subs.iter().enumerate() {
            if tx.get(&tasks, s.id.as_str())?.is_some() {
                return Err(SubmitError::Duplicate(s.id.clone()));
            }
            for d in &s.rules.depends_on {
                let known = s.rules.outcomes.contains_key(d)
                    || subs[..i].iter().any(|e| &e.id == d)
                    || tx.get(&tasks, d.as_str())?.is_some();
                if !known {
                    return Err(SubmitError::UnknownDependency(d.clone()));
                }
            }
            let entry = entry_of(s, default_max);
            tx.put(&tasks, s.id.as_str(), packed::encode(&entry))?;
        }
        if let Some(map) = am::object(tx, &ROOT, packed::IDEMPOTENCY, ObjType::Map) {
            for (k, task) in keys {
                if k.is_empty() || k.len() > crate::entry::MAX_KEY_LEN {
                    return Err(SubmitError::BadKey);
                }
                let rec = packed::Idem {
                    t: now_ms,
                    k: task.to_string(),
                };
                tx.put(&map, k.as_str(), packed::encode(&rec))?;
            }
        }
        crate::schedule::write_slots(tx, fired)?;
        if bumps.is_empty() {
            return Ok(());
        }
        let Some(map) = am::object(tx, &ROOT, packed::BUMPS, ObjType::Map) else {
            return Ok(());
        };
        for (task, b) in bumps {
            if tx.get(&tasks, task.as_str())?.is_none() {
                return Err(SubmitError::UnknownTask(task.clone()));
            }
            let b = crate::entry::Bump {
                p: b.p.clamp(-MAX_PRIORITY, MAX_PRIORITY),
                ..*b
            };
            let merged = crate::read::bump_of(crate::read::packed_values(
                &*tx,
                packed::BUMPS,
                task.as_str(),
            ))
            .map_or(b, |m| m.merge(b));
            tx.put(&map, task.as_str(), packed::encode(&merged))?;
        }
        Ok(())
    })
}

/// The task a submit with idempotency key `key` made, if the document holds its record: among
/// concurrent records (two members took the key apart), the earliest `(time, task)`.
pub fn idempotent_task<R: ReadDoc>(doc: &R, key: &str) -> Option<TaskId> {
    crate::read::packed_values(doc, packed::IDEMPOTENCY, key)
        .filter_map(|v| packed::decode::<packed::Idem>(&v))
        .min()
        .map(|r| TaskId::new(r.k))
}

/// Checks what a writer controls of a submission's rules: tags valid and at most
/// [`MAX_TAGS`](crate::entry::MAX_TAGS), dependencies at most
/// [`MAX_DEPENDENCIES`](crate::entry::MAX_DEPENDENCIES) and not the task itself.
fn check_rules(s: &Submission) -> Result<(), SubmitError> {
    if let Some(t) = s.rules.tags.iter().find(|t| !crate::entry::valid_tag(t)) {
        return Err(SubmitError::BadTag(t.clone()));
    }
    if s.rules.tags.len() > crate::entry::MAX_TAGS {
        return Err(SubmitError::BadTag(
            s.rules.tags[crate::entry::MAX_TAGS].clone(),
        ));
    }
    let bad_key = |k: &Option<String>| {
        k.as_ref()
            .is_some_and(|k| k.is_empty() || k.len() > crate::entry::MAX_KEY_LEN)
    };
    if bad_key(&s.rules.dedup_key) || bad_key(&s.rules.idempotency_key) {
        return Err(SubmitError::BadKey);
    }
    if s.rules.depends_on.len() > crate::entry::MAX_DEPENDENCIES
        || s.rules.depends_on.contains(&s.id)
    {
        return Err(SubmitError::BadDependencies);
    }
    Ok(())
}

/// A layout-2 root map ([`packed`]), created (and the document's version raised) at the first
/// layout-2 write into a layout-1 document.
fn layout_map(tx: &mut Transaction<'_>, key: &str) -> Result<ObjId, AutomergeError> {
    if let Some(m) = am::object(tx, &ROOT, key, ObjType::Map) {
        return Ok(m);
    }
    if am::uint(tx, &ROOT, keys::VERSION).unwrap_or(0) < keys::QUEUE_VERSION {
        tx.put(ROOT, keys::VERSION, keys::QUEUE_VERSION)?;
    }
    tx.put_object(ROOT, key, ObjType::Map)
}

/// Whether the task is indexed (in either layout).
fn task_exists(tx: &Transaction<'_>, task: &TaskId) -> bool {
    am::object(tx, &ROOT, keys::TASKS, ObjType::Map)
        .and_then(|t| tx.get(&t, task.as_str()).ok().flatten())
        .is_some()
}

/// Where an attempt is recorded, and the worker it was assigned to.
enum Found {
    /// A layout-1 attempt map.
    Map(ObjId, Option<WorkerId>),
    /// A layout-2 key.
    Key(Option<WorkerId>),
}

fn find(tx: &Transaction<'_>, task: &TaskId, id: &AttemptId) -> Option<Found> {
    let key = packed::attempt_key(task, id);
    for m in am::all_objects(tx, &ROOT, packed::ASSIGNED, ObjType::Map) {
        if let Some(v) = am::string(tx, &m, &key) {
            let worker = packed::decode::<packed::Assigned>(&v).and_then(|a| a.w.parse().ok());
            return Some(Found::Key(worker));
        }
    }
    let entry = task_obj(tx, task)?;
    let obj = find_attempt(tx, &entry, id)?;
    let worker = am::string(tx, &obj, keys::WORKER).and_then(|w| w.parse().ok());
    Some(Found::Map(obj, worker))
}

/// The attempt's start, from either layout; among concurrent ones the greatest.
fn started(tx: &Transaction<'_>, task: &TaskId, id: &AttemptId, found: &Found) -> Option<Started> {
    let key = packed::attempt_key(task, id);
    let v1 = match found {
        Found::Map(obj, _) => read_started(tx, obj),
        Found::Key(_) => None,
    };
    v1.into_iter()
        .chain(packed_started(tx, &key))
        .max_by_key(|s| (s.incarnation, s.at))
}

fn finished(tx: &Transaction<'_>, task: &TaskId, id: &AttemptId, found: &Found) -> bool {
    let key = packed::attempt_key(task, id);
    matches!(found, Found::Map(obj, _) if read_finished(tx, obj).is_some())
        || packed_finished(tx, &key).is_some()
}

fn task_obj(tx: &Transaction<'_>, task: &TaskId) -> Option<ObjId> {
    let tasks = am::object(tx, &ROOT, keys::TASKS, ObjType::Map)?;
    am::object(tx, &tasks, task.as_str(), ObjType::Map)
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
    assign_checked(doc, assignments, now_ms, |tx, a, _| {
        if !task_exists(tx, &a.task) {
            return Err(AssignError::UnknownTask(a.task.clone()));
        }
        if find(tx, &a.task, &a.attempt).is_some() {
            return Err(AssignError::DuplicateAttempt(
                a.task.clone(),
                a.attempt.clone(),
            ));
        }
        Ok(())
    })
}

/// As [`record_assignments`], but each assignment is checked against `view` instead of the
/// document: `view` must be this document's view at its current heads (see
/// [`record_attempts_in_view`]). A task the view does not show is unknown, an attempt it shows
/// is a duplicate; assignments earlier in the round count.
pub fn record_assignments_in_view(
    doc: &mut Automerge,
    view: &QueueView,
    assignments: &[Assignment],
    now_ms: u64,
) -> Result<(), AssignError> {
    assign_checked(doc, assignments, now_ms, |_, a, earlier| {
        let Some(entry) = view.task(&a.task) else {
            return Err(AssignError::UnknownTask(a.task.clone()));
        };
        let again = earlier
            .iter()
            .any(|e| e.task == a.task && e.attempt == a.attempt);
        if again || entry.attempts.iter().any(|x| x.id == a.attempt) {
            return Err(AssignError::DuplicateAttempt(
                a.task.clone(),
                a.attempt.clone(),
            ));
        }
        Ok(())
    })
}

/// Writes a round of assignments in one change, each after `check` (given the transaction,
/// the assignment and the ones before it in the round) let it; the first refusal rolls the
/// round back.
fn assign_checked(
    doc: &mut Automerge,
    assignments: &[Assignment],
    now_ms: u64,
    check: impl Fn(&Transaction<'_>, &Assignment, &[Assignment]) -> Result<(), AssignError>,
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
        let assigned = layout_map(tx, packed::ASSIGNED)?;
        for (i, a) in assignments.iter().enumerate() {
            check(tx, a, &assignments[..i])?;
            let record = packed::Assigned {
                w: a.worker.to_string(),
                i: Some(a.incarnation),
                a: now_ms,
            };
            tx.put(
                &assigned,
                packed::attempt_key(&a.task, &a.attempt),
                packed::encode(&record),
            )?;
        }
        Ok(())
    })
}

fn owned_attempt(
    tx: &Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
) -> Result<Found, AttemptError> {
    if !task_exists(tx, task) {
        return Err(AttemptError::UnknownTask(task.clone()));
    }
    let found = find(tx, task, attempt)
        .ok_or_else(|| AttemptError::UnknownAttempt(task.clone(), attempt.clone()))?;
    let owner = match &found {
        Found::Map(_, w) | Found::Key(w) => w.clone(),
    };
    match owner {
        Some(o) if &o == worker => Ok(found),
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
        start_in(tx, task, attempt, worker, incarnation, now_ms)
    })
}

fn start_in(
    tx: &mut Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
    incarnation: u64,
    now_ms: u64,
) -> Result<(), AttemptError> {
    let facts = facts_in_doc(tx, task, attempt, worker)?;
    facts.check_start(task, attempt)?;
    write_start(tx, task, attempt, incarnation, now_ms)
}

/// What the checks of a start or an end need to know about the attempt, found owned by the
/// worker that writes.
#[derive(Clone, Copy, Debug, Default)]
struct Facts {
    started: bool,
    finished: bool,
}

impl Facts {
    fn check_start(self, task: &TaskId, attempt: &AttemptId) -> Result<(), AttemptError> {
        if self.finished {
            return Err(AttemptError::AlreadyFinished(task.clone(), attempt.clone()));
        }
        if self.started {
            return Err(AttemptError::AlreadyStarted(task.clone(), attempt.clone()));
        }
        Ok(())
    }

    fn check_finish(
        self,
        task: &TaskId,
        attempt: &AttemptId,
        outcome: AttemptOutcome,
    ) -> Result<(), AttemptError> {
        if self.finished {
            return Err(AttemptError::AlreadyFinished(task.clone(), attempt.clone()));
        }
        match outcome {
            AttemptOutcome::Refused | AttemptOutcome::Unavailable if self.started => {
                Err(AttemptError::AlreadyStarted(task.clone(), attempt.clone()))
            }
            AttemptOutcome::Succeeded | AttemptOutcome::Failed if !self.started => {
                Err(AttemptError::NotStarted(task.clone(), attempt.clone()))
            }
            _ => Ok(()),
        }
    }
}

/// The attempt's facts, read from the document.
fn facts_in_doc(
    tx: &Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
) -> Result<Facts, AttemptError> {
    let found = owned_attempt(tx, task, attempt, worker)?;
    Ok(Facts {
        finished: finished(tx, task, attempt, &found),
        started: started(tx, task, attempt, &found).is_some(),
    })
}

/// The attempt's facts, from a view of the document (the same checks as
/// [`facts_in_doc`], without reading the document).
fn facts_in_view(
    view: &QueueView,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
) -> Result<Facts, AttemptError> {
    let entry = view
        .task(task)
        .ok_or_else(|| AttemptError::UnknownTask(task.clone()))?;
    let a = entry
        .attempts
        .iter()
        .find(|a| a.id == *attempt)
        .ok_or_else(|| AttemptError::UnknownAttempt(task.clone(), attempt.clone()))?;
    if a.worker != *worker {
        return Err(AttemptError::WrongWorker {
            task: task.clone(),
            attempt: attempt.clone(),
            owner: Box::new(a.worker.clone()),
            worker: Box::new(worker.clone()),
        });
    }
    Ok(Facts {
        started: a.started.is_some(),
        finished: a.finished.is_some(),
    })
}

fn write_start(
    tx: &mut Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    incarnation: u64,
    now_ms: u64,
) -> Result<(), AttemptError> {
    let map = layout_map(tx, packed::STARTED)?;
    let record = packed::Start {
        a: now_ms,
        i: incarnation,
    };
    tx.put(
        &map,
        packed::attempt_key(task, attempt),
        packed::encode(&record),
    )?;
    Ok(())
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
        finish_in(tx, task, attempt, worker, outcome, error, None, now_ms)
    })
}

#[allow(clippy::too_many_arguments)]
fn finish_in(
    tx: &mut Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    worker: &WorkerId,
    outcome: AttemptOutcome,
    error: Option<&str>,
    output: Option<&packed::Output>,
    now_ms: u64,
) -> Result<(), AttemptError> {
    let facts = facts_in_doc(tx, task, attempt, worker)?;
    facts.check_finish(task, attempt, outcome)?;
    write_finish(tx, task, attempt, outcome, error, output, now_ms)
}

fn write_finish(
    tx: &mut Transaction<'_>,
    task: &TaskId,
    attempt: &AttemptId,
    outcome: AttemptOutcome,
    error: Option<&str>,
    output: Option<&packed::Output>,
    now_ms: u64,
) -> Result<(), AttemptError> {
    let map = layout_map(tx, packed::ENDED)?;
    let record = packed::End {
        a: now_ms,
        o: outcome.as_str().to_owned(),
        e: error.map(str::to_owned),
    };
    let key = packed::attempt_key(task, attempt);
    tx.put(&map, key.as_str(), packed::encode(&record))?;
    if let Some(out) = output.filter(|o| **o != packed::Output::default()) {
        let map = layout_map(tx, packed::OUTPUT)?;
        tx.put(&map, key.as_str(), packed::encode(out))?;
    }
    Ok(())
}

/// Indexes a successful run's follow-up tasks (in its end's change): each id not indexed yet.
fn write_follow_ups(tx: &mut Transaction<'_>, subs: &[Submission]) -> Result<(), AttemptError> {
    let tasks = match am::object(tx, &ROOT, keys::TASKS, ObjType::Map) {
        Some(t) => t,
        None => tx.put_object(ROOT, keys::TASKS, ObjType::Map)?,
    };
    for s in subs {
        if s.kind.is_empty() || tx.get(&tasks, s.id.as_str())?.is_some() {
            continue;
        }
        let entry = entry_of(s, 1);
        tx.put(&tasks, s.id.as_str(), packed::encode(&entry))?;
    }
    Ok(())
}

/// A submission's index entry, with `default_max` attempts where it names none.
fn entry_of(s: &Submission, default_max: u32) -> packed::Entry {
    let max_attempts = s
        .max_attempts
        .unwrap_or(default_max)
        .clamp(QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS);
    packed::Entry {
        k: s.kind.clone(),
        t: s.submitted_at,
        s: s.submitter.to_string(),
        p: s.priority.clamp(-MAX_PRIORITY, MAX_PRIORITY),
        u: s.urgent,
        m: u64::from(max_attempts),
        i: s.input.clone(),
        r: s.rules.clone().normalized(&s.id),
    }
}

/// One write about an attempt, for [`record_attempts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptWrite {
    /// As [`record_start`].
    Start {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: AttemptId,
        /// The worker it was assigned to.
        worker: WorkerId,
        /// The worker's pool incarnation.
        incarnation: u64,
    },
    /// As [`record_finish`].
    Finish {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: AttemptId,
        /// The worker it was assigned to.
        worker: WorkerId,
        /// How it ended.
        outcome: AttemptOutcome,
        /// The error, for a failure or a refusal.
        error: Option<String>,
        /// What the run produced, for an inline task (written with the end, in the `output`
        /// map; nothing is written for an empty one).
        output: Option<crate::Output>,
        /// The run's follow-up tasks, indexed in the same change as a success (nothing is
        /// written for another outcome). An id the document indexes already (another run of
        /// the task made it) is left as it is.
        follow_ups: Vec<Submission>,
    },
}

/// Records a batch of starts and ends in one change: each write is checked as
/// [`record_start`] or [`record_finish`] would check it, against the document as the writes
/// before it in the batch left it, and the result of each comes back at its index. A write
/// that is refused leaves nothing behind and does not stop the others. No change is made if
/// every write is refused (or the batch is empty).
pub fn record_attempts(
    doc: &mut Automerge,
    writes: &[AttemptWrite],
    now_ms: u64,
) -> Vec<Result<(), AttemptError>> {
    attempts_checked(doc, writes, now_ms, facts_in_doc)
}

/// As [`record_attempts`], but each write is checked against `view` instead of the document:
/// `view` must be this document's view at its current heads (a [`crate::ViewCache`] of it,
/// refreshed since its last change). The checks are the same (a view shows exactly what the
/// checks read), and writes earlier in the batch count as in [`record_attempts`]; what is
/// saved is the document lookups, several per write, each costing in the size of the maps.
pub fn record_attempts_in_view(
    doc: &mut Automerge,
    view: &QueueView,
    writes: &[AttemptWrite],
    now_ms: u64,
) -> Vec<Result<(), AttemptError>> {
    attempts_checked(doc, writes, now_ms, |_, task, attempt, worker| {
        facts_in_view(view, task, attempt, worker)
    })
}

/// Writes a batch of starts and ends in one change, each checked against the facts `facts`
/// gives (from the transaction or a view) with what the batch's earlier writes did on top.
fn attempts_checked(
    doc: &mut Automerge,
    writes: &[AttemptWrite],
    now_ms: u64,
    facts: impl Fn(&Transaction<'_>, &TaskId, &AttemptId, &WorkerId) -> Result<Facts, AttemptError>,
) -> Vec<Result<(), AttemptError>> {
    if writes.is_empty() {
        return Vec::new();
    }
    let mut tx = doc.transaction();
    if !is_queue(&tx) {
        tx.rollback();
        return writes
            .iter()
            .map(|_| Err(AttemptError::NotAQueue))
            .collect();
    }
    // What the batch's earlier writes did.
    let mut written: std::collections::HashMap<(&TaskId, &AttemptId), Facts> = Default::default();
    let mut results = Vec::with_capacity(writes.len());
    let mut aborted: Option<String> = None;
    for w in writes {
        let (task, attempt, worker) = match w {
            AttemptWrite::Start {
                task,
                attempt,
                worker,
                ..
            }
            | AttemptWrite::Finish {
                task,
                attempt,
                worker,
                ..
            } => (task, attempt, worker),
        };
        // The owner is checked as `facts` sees it; whether the attempt started or ended is the
        // batch's if it wrote so.
        let facts = facts(&tx, task, attempt, worker)
            .map(|f| written.get(&(task, attempt)).copied().unwrap_or(f));
        let result = facts.and_then(|mut f| {
            match w {
                AttemptWrite::Start { incarnation, .. } => {
                    f.check_start(task, attempt)?;
                    write_start(&mut tx, task, attempt, *incarnation, now_ms)?;
                    f.started = true;
                }
                AttemptWrite::Finish {
                    outcome,
                    error,
                    output,
                    follow_ups,
                    ..
                } => {
                    f.check_finish(task, attempt, *outcome)?;
                    write_finish(
                        &mut tx,
                        task,
                        attempt,
                        *outcome,
                        error.as_deref(),
                        output.as_ref(),
                        now_ms,
                    )?;
                    // In the same change: a failure here abandons the whole batch, so that
                    // no success is written without its follow-ups.
                    if *outcome == AttemptOutcome::Succeeded
                        && !follow_ups.is_empty()
                        && let Err(e) = write_follow_ups(&mut tx, follow_ups)
                    {
                        aborted = Some(e.to_string());
                        return Err(e);
                    }
                    f.finished = true;
                }
            }
            written.insert((task, attempt), f);
            Ok(())
        });
        results.push(result);
    }
    if let Some(why) = aborted {
        tx.rollback();
        return writes
            .iter()
            .map(|_| Err(AttemptError::Aborted(why.clone())))
            .collect();
    }
    if tx.pending_ops() == 0 {
        tx.rollback();
    } else {
        tx.commit();
    }
    results
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
        if !task_exists(tx, task) {
            return Err(AttemptError::UnknownTask(task.clone()));
        }
        if input_seen(tx, task) >= n {
            return Ok(());
        }
        let map = layout_map(tx, packed::SEEN)?;
        tx.put(&map, task.as_str(), n)?;
        Ok(())
    })
}

/// Writes a member's request to cancel `task` (`cancels/<task>`): the task is `cancelled`
/// unless a run of it succeeds (see [`crate::TaskState`]). Concurrent requests merge to the
/// earliest. The caller checks that the task is not final; this only checks that the
/// document indexes it.
pub fn cancel(
    doc: &mut Automerge,
    task: &TaskId,
    by: &PeerId,
    now_ms: u64,
) -> Result<(), WriteError> {
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        if !task_exists(tx, task) {
            return Err(WriteError::UnknownTask(task.clone()));
        }
        let rec = crate::entry::Cancel {
            t: now_ms,
            b: by.to_string(),
        };
        let merged = crate::read::merged_of::<crate::entry::Cancel>(crate::read::packed_values(
            &*tx,
            packed::CANCELS,
            task.as_str(),
        ))
        .map_or(rec.clone(), |m| m.merge(rec));
        let map = layout_map(tx, packed::CANCELS)?;
        tx.put(&map, task.as_str(), packed::encode(&merged))?;
        Ok(())
    })
}

/// Writes a requeue of `task` (`requeues/<task>`): failures count only in attempts numbered
/// above `requeue.n`, so a dead-lettered task is pending again with a fresh budget, its
/// attempts kept. Concurrent requeues merge to the greatest. The caller checks that the task
/// is `failed` and builds `requeue` from its entry ([`crate::TaskEntry::requeue_now`]).
pub fn requeue(
    doc: &mut Automerge,
    task: &TaskId,
    requeue: crate::entry::Requeue,
) -> Result<(), WriteError> {
    requeue_many(doc, &[(task.clone(), requeue)])
}

/// [`requeue`] of each task, in one change (none if `requeues` is empty); nothing is written
/// if the document does not index one of them.
pub fn requeue_many(
    doc: &mut Automerge,
    requeues: &[(TaskId, crate::entry::Requeue)],
) -> Result<(), WriteError> {
    if requeues.is_empty() {
        return Ok(());
    }
    commit(doc, |tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        for (task, requeue) in requeues {
            if !task_exists(tx, task) {
                return Err(WriteError::UnknownTask(task.clone()));
            }
            let merged = crate::read::merged_of::<crate::entry::Requeue>(
                crate::read::packed_values(&*tx, packed::REQUEUES, task.as_str()),
            )
            .map_or(*requeue, |m| m.merge(*requeue));
            let map = layout_map(tx, packed::REQUEUES)?;
            tx.put(&map, task.as_str(), packed::encode(&merged))?;
        }
        Ok(())
    })
}
