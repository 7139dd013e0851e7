//! Task documents: one per task, its URL the task's id. The document holds the task's input and
//! its run history, one record per attempt that started.

use automerge::transaction::{Transactable, Transaction};
use automerge::{Automerge, AutomergeError, ObjId, ObjType, ROOT, ReadDoc};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::entry::AttemptOutcome;
use crate::ids::{AttemptId, Claim, PeerId, QueueId, WorkerId};
use crate::judge::{Judge, Right};
use crate::keys;
use crate::membership::Membership;

/// What a task document is created with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewTask {
    /// The queue the task is submitted to.
    pub queue: QueueId,
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    pub input: serde_json::Value,
    /// The submitting peer.
    pub submitter: PeerId,
    /// Wall-clock submit time (unix ms).
    pub submitted_at: u64,
}

/// The start of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStart {
    /// The attempt being run.
    pub attempt: AttemptId,
    /// The worker running it.
    pub worker: WorkerId,
    /// The worker's pool incarnation.
    pub incarnation: u64,
    /// Wall-clock start time (unix ms).
    pub at: u64,
}

/// The end of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// Wall-clock end time (unix ms).
    pub at: u64,
    /// The handler's result, on success.
    pub result: Option<serde_json::Value>,
    /// The error, on failure.
    pub error: Option<String>,
    /// Log lines the handler wrote.
    pub logs: Vec<String>,
    /// The progress the handler last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::Progress>,
}

/// One run of a task, as its task document records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The attempt.
    pub attempt: AttemptId,
    /// The worker that ran it.
    pub worker: WorkerId,
    /// The worker's pool incarnation.
    pub incarnation: u64,
    /// Wall-clock start time (unix ms).
    pub started_at: u64,
    /// How it ended, if it did.
    pub end: Option<RunEnd>,
}

/// A task document, read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskDoc {
    /// The queue it belongs to.
    pub queue: QueueId,
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    pub input: serde_json::Value,
    /// The submitting peer.
    pub submitter: PeerId,
    /// Wall-clock submit time (unix ms).
    pub submitted_at: u64,
    /// Every run, in document order.
    pub runs: Vec<Run>,
    /// The task's final summary, once it reached an outcome ([`record_summary`]).
    pub summary: Option<Summary>,
}

/// What a task came to, written into its document when it reaches an outcome, so that its
/// status is known after the queue document stops carrying it (see [`crate::epoch`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The final state.
    pub state: crate::TaskState,
    /// Every attempt, as the queue document had them.
    pub attempts: Vec<crate::Attempt>,
    /// The error of the latest failed attempt, if any.
    pub error: Option<String>,
    /// Its priority, as the queue document had it (`None` in a summary written before
    /// summaries carried it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Whether it was urgent (as `priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urgent: Option<bool>,
    /// The attempts it was allowed (as `priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Its tags, delay and dependencies, as the queue document had them.
    #[serde(default, skip_serializing_if = "crate::Rules::is_empty")]
    pub rules: crate::Rules,
    /// Why it was cancelled, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
}

/// The summary key in a task document: one scalar (JSON); concurrent values resolve to the
/// greatest state rank.
const SUMMARY: &str = "summary";

/// Writes a task's final summary, unless one of at least its rank is already there.
pub fn record_summary(doc: &mut Automerge, summary: &Summary) -> Result<(), TaskWriteError> {
    if !summary.state.is_final() {
        return Ok(());
    }
    if read_summary(doc, &Judge::open()).is_some_and(|s| s.state.rank() >= summary.state.rank()) {
        return Ok(());
    }
    let json = serde_json::to_string(summary)?;
    commit(doc, |tx| {
        if !is_task(tx) {
            return Err(TaskWriteError::NotATask);
        }
        tx.put(ROOT, SUMMARY, json.as_str())?;
        Ok(())
    })
}

fn read_summary<R: ReadDoc>(doc: &R, judge: &Judge<'_>) -> Option<Summary> {
    doc.get_all(ROOT, SUMMARY)
        .ok()?
        .into_iter()
        .filter(|(_, id)| judge.allows(id, Right::Work))
        .filter_map(|(v, _)| match v {
            automerge::Value::Scalar(s) => match s.as_ref() {
                automerge::ScalarValue::Str(s) => serde_json::from_str::<Summary>(s).ok(),
                _ => None,
            },
            _ => None,
        })
        .max_by_key(|s| (s.state.rank(), s.attempts.len()))
}

impl TaskDoc {
    /// The result of the first successful run, if any.
    pub fn result(&self) -> Option<&serde_json::Value> {
        self.runs.iter().find_map(|r| match &r.end {
            Some(e) if e.outcome == AttemptOutcome::Succeeded => e.result.as_ref(),
            _ => None,
        })
    }

    /// How many runs succeeded (more than one means the task ran twice).
    pub fn successful_runs(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| {
                r.end
                    .as_ref()
                    .is_some_and(|e| e.outcome == AttemptOutcome::Succeeded)
            })
            .count()
    }
}

/// Writing a task document failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskWriteError {
    /// The document already has content (on create).
    #[error("the document is not empty")]
    NotEmpty,
    /// The document is not a task document.
    #[error("not a task document")]
    NotATask,
    /// The run to end has no start record from this worker and incarnation.
    #[error("no run of attempt {0} by this worker")]
    UnknownRun(AttemptId),
    /// The run already ended.
    #[error("the run of attempt {0} already ended")]
    AlreadyEnded(AttemptId),
    /// A value could not be encoded.
    #[error("cannot encode a JSON value: {0}")]
    Json(#[from] serde_json::Error),
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

/// Reading a task document failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskReadError {
    /// The document is not a task document.
    #[error("not a task document")]
    NotATask,
    /// A required field is missing or has the wrong type.
    #[error("malformed task document: bad or missing {0:?}")]
    Malformed(&'static str),
}

fn commit<O>(
    doc: &mut Automerge,
    f: impl FnOnce(&mut Transaction<'_>) -> Result<O, TaskWriteError>,
) -> Result<O, TaskWriteError> {
    doc.transact(f).map(|s| s.result).map_err(|f| f.error)
}

fn is_task<R: ReadDoc>(doc: &R) -> bool {
    am::string(doc, &ROOT, keys::SCHEMA).as_deref() == Some(keys::TASK_SCHEMA)
}

/// Writes a new task into an empty document.
pub fn init(doc: &mut Automerge, t: &NewTask) -> Result<(), TaskWriteError> {
    if !doc.get_heads().is_empty() {
        return Err(TaskWriteError::NotEmpty);
    }
    let input = serde_json::to_string(&t.input)?;
    commit(doc, |tx| {
        tx.put(ROOT, keys::SCHEMA, keys::TASK_SCHEMA)?;
        tx.put(ROOT, keys::VERSION, keys::SCHEMA_VERSION)?;
        tx.put(ROOT, keys::QUEUE, t.queue.as_str())?;
        tx.put(ROOT, keys::KIND, t.kind.as_str())?;
        tx.put(ROOT, keys::INPUT, input.as_str())?;
        tx.put(ROOT, keys::SUBMITTER, t.submitter.as_str())?;
        tx.put(ROOT, keys::SUBMITTED_AT, t.submitted_at)?;
        tx.put_object(ROOT, keys::RUNS, ObjType::List)?;
        Ok(())
    })
}

/// Appends a run record.
pub fn record_run_start(doc: &mut Automerge, s: &RunStart) -> Result<(), TaskWriteError> {
    commit(doc, |tx| {
        if !is_task(tx) {
            return Err(TaskWriteError::NotATask);
        }
        insert_run(tx, s)?;
        Ok(())
    })
}

fn insert_run(tx: &mut Transaction<'_>, s: &RunStart) -> Result<ObjId, TaskWriteError> {
    let runs = match am::object(tx, &ROOT, keys::RUNS, ObjType::List) {
        Some(r) => r,
        None => tx.put_object(ROOT, keys::RUNS, ObjType::List)?,
    };
    let len = tx.length(&runs);
    let r = tx.insert_object(&runs, len, ObjType::Map)?;
    tx.put(&r, keys::N, s.attempt.n)?;
    tx.put(&r, keys::TERM, s.attempt.claim.term)?;
    tx.put(&r, keys::ROUTER, s.attempt.claim.peer.as_str())?;
    tx.put(&r, keys::WORKER, s.worker.to_string())?;
    tx.put(&r, keys::INCARNATION, s.incarnation)?;
    tx.put(&r, keys::AT, s.at)?;
    tx.put_object(&r, keys::LOGS, ObjType::List)?;
    Ok(r)
}

fn find_run(tx: &Transaction<'_>, s: &RunStart) -> Option<ObjId> {
    let runs = am::object(tx, &ROOT, keys::RUNS, ObjType::List)?;
    am::list_objects(tx, &runs, ObjType::Map)
        .into_iter()
        .find(|r| {
            read_run(tx, r).is_some_and(|run| {
                run.attempt == s.attempt
                    && run.worker == s.worker
                    && run.incarnation == s.incarnation
            })
        })
}

/// Records how a run ended: outcome, result or error, and its logs.
pub fn record_run_end(
    doc: &mut Automerge,
    s: &RunStart,
    end: &RunEnd,
) -> Result<(), TaskWriteError> {
    let result = end.result.as_ref().map(serde_json::to_string).transpose()?;
    commit(doc, |tx| {
        if !is_task(tx) {
            return Err(TaskWriteError::NotATask);
        }
        let r = find_run(tx, s).ok_or_else(|| TaskWriteError::UnknownRun(s.attempt.clone()))?;
        end_run(tx, &r, s, end, result.as_deref())
    })
}

fn end_run(
    tx: &mut Transaction<'_>,
    r: &ObjId,
    s: &RunStart,
    end: &RunEnd,
    result: Option<&str>,
) -> Result<(), TaskWriteError> {
    if am::object(tx, r, keys::FINISH, ObjType::Map).is_some() {
        return Err(TaskWriteError::AlreadyEnded(s.attempt.clone()));
    }
    let logs = match am::object(tx, r, keys::LOGS, ObjType::List) {
        Some(l) => l,
        None => tx.put_object(r, keys::LOGS, ObjType::List)?,
    };
    for line in &end.logs {
        let len = tx.length(&logs);
        tx.insert(&logs, len, line.as_str())?;
    }
    let f = tx.put_object(r, keys::FINISH, ObjType::Map)?;
    tx.put(&f, keys::AT, end.at)?;
    tx.put(&f, keys::OUTCOME, end.outcome.as_str())?;
    if let Some(e) = &end.error {
        tx.put(&f, keys::ERROR, e.as_str())?;
    }
    if let Some(r) = result {
        tx.put(&f, keys::RESULT, r)?;
    }
    if let Some(p) = &end.progress {
        tx.put(&f, keys::PROGRESS, serde_json::to_string(p)?)?;
    }
    Ok(())
}

/// Writes what one node learned about a task since its last write, in one change: each run
/// that ended, with its start and its end (a run whose start is already recorded gets its
/// end; one that already ended is left as it is), and the task's final summary (as
/// [`record_summary`]). Nothing is written if there is nothing new.
pub fn record_runs(
    doc: &mut Automerge,
    runs: &[(RunStart, RunEnd)],
    summary: Option<&Summary>,
) -> Result<(), TaskWriteError> {
    let results = runs
        .iter()
        .map(|(_, e)| e.result.as_ref().map(serde_json::to_string).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    let summary = summary
        .filter(|s| s.state.is_final())
        .filter(|s| {
            read_summary(doc, &Judge::open()).is_none_or(|o| o.state.rank() < s.state.rank())
        })
        .map(serde_json::to_string)
        .transpose()?;
    if runs.is_empty() && summary.is_none() {
        return Ok(());
    }
    commit(doc, |tx| {
        if !is_task(tx) {
            return Err(TaskWriteError::NotATask);
        }
        for ((s, end), result) in runs.iter().zip(&results) {
            let r = match find_run(tx, s) {
                Some(r) => r,
                None => insert_run(tx, s)?,
            };
            match end_run(tx, &r, s, end, result.as_deref()) {
                Ok(()) | Err(TaskWriteError::AlreadyEnded(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(json) = &summary {
            tx.put(ROOT, SUMMARY, json.as_str())?;
        }
        Ok(())
    })
}

fn read_run<R: ReadDoc>(doc: &R, r: &ObjId) -> Option<Run> {
    let attempt = AttemptId {
        n: am::uint(doc, r, keys::N)?,
        claim: Claim::new(
            am::uint(doc, r, keys::TERM)?,
            PeerId::new(am::string(doc, r, keys::ROUTER)?),
        ),
    };
    let worker = am::string(doc, r, keys::WORKER)?.parse().ok()?;
    let logs = am::object(doc, r, keys::LOGS, ObjType::List)
        .map(|l| am::list_strings(doc, &l))
        .unwrap_or_default();
    let end = am::object(doc, r, keys::FINISH, ObjType::Map).and_then(|f| {
        Some(RunEnd {
            outcome: AttemptOutcome::parse(&am::string(doc, &f, keys::OUTCOME)?)?,
            at: am::uint(doc, &f, keys::AT)?,
            result: am::string(doc, &f, keys::RESULT).and_then(|s| serde_json::from_str(&s).ok()),
            error: am::string(doc, &f, keys::ERROR),
            logs,
            progress: am::string(doc, &f, keys::PROGRESS)
                .and_then(|s| serde_json::from_str(&s).ok()),
        })
    });
    Some(Run {
        attempt,
        worker,
        incarnation: am::uint(doc, r, keys::INCARNATION)?,
        started_at: am::uint(doc, r, keys::AT)?,
        end,
    })
}

/// Reads only a task document's input: what a worker needs to run it, without the runs.
pub fn read_input(doc: &Automerge) -> Result<serde_json::Value, TaskReadError> {
    if !is_task(doc) {
        return Err(TaskReadError::NotATask);
    }
    am::string(doc, &ROOT, keys::INPUT)
        .and_then(|s| serde_json::from_str(&s).ok())
        .ok_or(TaskReadError::Malformed(keys::INPUT))
}

/// Reads a task document. Malformed run records are skipped.
pub fn read(doc: &Automerge) -> Result<TaskDoc, TaskReadError> {
    read_with(doc, &Judge::open())
}

/// [`read`], counting only the run records and summaries that a member or an admin of the
/// task's queue wrote, by `membership` (its queue's): a submitter's node, modified to write a
/// run's result, is not read (`judge.rs`). A task document names no epoch, so a removal's cut
/// does not apply here: a removed peer's runs are judged by its role.
pub fn read_judged(doc: &Automerge, membership: &Membership) -> Result<TaskDoc, TaskReadError> {
    read_with(doc, &Judge::new(membership, None))
}

fn read_with(doc: &Automerge, judge: &Judge<'_>) -> Result<TaskDoc, TaskReadError> {
    if !is_task(doc) {
        return Err(TaskReadError::NotATask);
    }
    let input = am::string(doc, &ROOT, keys::INPUT)
        .and_then(|s| serde_json::from_str(&s).ok())
        .ok_or(TaskReadError::Malformed(keys::INPUT))?;
    let runs = am::object(doc, &ROOT, keys::RUNS, ObjType::List)
        .map(|l| {
            am::list_objects(doc, &l, ObjType::Map)
                .iter()
                .filter(|r| judge.allows(r, Right::Work))
                .filter_map(|r| read_run(doc, r))
                .collect()
        })
        .unwrap_or_default();
    Ok(TaskDoc {
        queue: QueueId::new(
            am::string(doc, &ROOT, keys::QUEUE).ok_or(TaskReadError::Malformed(keys::QUEUE))?,
        ),
        kind: am::string(doc, &ROOT, keys::KIND).ok_or(TaskReadError::Malformed(keys::KIND))?,
        input,
        submitter: PeerId::new(
            am::string(doc, &ROOT, keys::SUBMITTER)
                .ok_or(TaskReadError::Malformed(keys::SUBMITTER))?,
        ),
        submitted_at: am::uint(doc, &ROOT, keys::SUBMITTED_AT)
            .ok_or(TaskReadError::Malformed(keys::SUBMITTED_AT))?,
        runs,
        summary: read_summary(doc, judge),
    })
}
