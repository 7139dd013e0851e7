//! A task's status as the API answers it, from a queue entry (`inline_status`) or from the archive
//! (`archived_status`), and the small rules over statuses (`is_done`, `last_error`), with the
//! archive's memory bound (`RECENT_ARCHIVED`). Pure functions.

use std::collections::BTreeMap;

use automerge::Automerge;
use piecework_queue_doc::task::{self};
use piecework_queue_doc::{
    AttemptId, AttemptOutcome, Output, QueueId, QueueView, TaskEntry, TaskId, TaskState,
};

use crate::TaskRunEnd;
use crate::api::{self, TaskError};

/// Archived statuses kept in memory as well, the latest: a lookup right after an archive
/// write answers without waiting for the disk.
pub(super) const RECENT_ARCHIVED: usize = 4_096;

/// The status of an inline task from its queue's view and document (its runs' outputs are
/// read from the document: the view does not keep them).
pub(super) fn inline_status(queue: &QueueId, t: &TaskEntry, doc: &Automerge) -> api::TaskStatus {
    status_with_outputs(queue, t, &piecework_queue_doc::read_outputs(doc, &t.id))
}

/// The status of an inline task from its queue's view and its runs' outputs, already read.
pub(super) fn status_with_outputs(
    queue: &QueueId,
    t: &TaskEntry,
    outputs: &[(AttemptId, Output)],
) -> api::TaskStatus {
    let outputs: BTreeMap<&AttemptId, &Output> = outputs.iter().map(|(a, o)| (a, o)).collect();
    let runs: Vec<task::Run> = t
        .attempts
        .iter()
        .filter_map(|a| {
            let started = a.started.as_ref()?;
            let f = a.finished.as_ref()?;
            let out = outputs.get(&a.id);
            Some(task::Run {
                attempt: a.id.clone(),
                worker: a.worker.clone(),
                incarnation: started.incarnation,
                started_at: started.at,
                end: Some(TaskRunEnd {
                    outcome: f.outcome,
                    at: f.at,
                    // A success with no result written returned null.
                    result: out
                        .and_then(|o| o.result.as_deref())
                        .and_then(|r| serde_json::from_str(r).ok())
                        .or((f.outcome == AttemptOutcome::Succeeded)
                            .then_some(serde_json::Value::Null)),
                    error: f.error.clone(),
                    logs: out.map(|o| o.logs.clone()).unwrap_or_default(),
                    progress: out.and_then(|o| o.progress),
                }),
            })
        })
        .collect();
    let result = runs
        .iter()
        .filter_map(|r| r.end.as_ref())
        .find(|e| e.outcome == AttemptOutcome::Succeeded)
        .and_then(|e| e.result.clone());
    api::TaskStatus {
        id: t.id.clone(),
        queue: queue.clone(),
        kind: t.kind.clone(),
        state: t.state(),
        submitted_at: t.submitted_at,
        submitter: t.submitter.to_string(),
        input: t
            .input
            .as_deref()
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or(serde_json::Value::Null),
        priority: Some(t.priority_now()),
        urgent: Some(t.urgent_now()),
        max_attempts: Some(t.max_attempts),
        tags: t.rules.tags.clone(),
        depends_on: t.rules.depends_on.clone(),
        dedup_key: t.rules.dedup_key.clone(),
        requires: t.rules.requires.clone(),
        not_before: (t.rules.not_before > 0).then_some(t.rules.not_before),
        effective_priority: None,
        blocked_on: None,
        cancel_reason: t.cancel_reason(),
        cancel_requested: t.cancel_requested(),
        progress: last_progress(&runs),
        follows: t.rules.follows.clone(),
        undoes: t.rules.undoes.clone(),
        result,
        error: last_error(t),
        attempts: t.attempts.clone(),
        runs,
    }
}

/// The progress the last run that reported any kept at its end.
pub(super) fn last_progress(runs: &[task::Run]) -> Option<piecework_queue_doc::Progress> {
    runs.iter()
        .rev()
        .find_map(|r| r.end.as_ref().and_then(|e| e.progress))
}

/// An archived status, as the archive keeps it: the task's final status when it was archived.
pub(super) fn archived_status(task: &TaskId, json: &[u8]) -> Result<api::TaskStatus, TaskError> {
    serde_json::from_slice::<api::TaskStatus>(json).map_err(|e| {
        tracing::warn!(%task, "unreadable archived status: {e}");
        TaskError::NotFound(task.clone())
    })
}

/// Why a pending task cannot be routed now, by `view` and this node's clock: the queue is
/// paused, a dependency has not succeeded, or its not-before time has not come.
pub(super) fn blocked_on(view: &QueueView, t: &TaskEntry, now_ms: u64) -> Option<api::BlockedOn> {
    if view.paused {
        return Some(api::BlockedOn::Paused);
    }
    let waiting: Vec<TaskId> = t.waiting_on().cloned().collect();
    if !waiting.is_empty() {
        return Some(api::BlockedOn::Dependencies { tasks: waiting });
    }
    (t.rules.not_before > now_ms).then_some(api::BlockedOn::NotBefore {
        until: t.rules.not_before,
    })
}

pub(super) fn is_done(s: &api::TaskStatus) -> bool {
    match s.state {
        TaskState::Failed | TaskState::Cancelled => true,
        TaskState::Succeeded => s.result.is_some(),
        _ => false,
    }
}

/// The error of a task's latest failed attempt.
pub(super) fn last_error(t: &TaskEntry) -> Option<String> {
    t.attempts
        .iter()
        .filter_map(|a| a.finished.as_ref())
        .filter(|f| f.outcome.is_failure())
        .max_by_key(|f| f.at)
        .and_then(|f| f.error.clone())
}
