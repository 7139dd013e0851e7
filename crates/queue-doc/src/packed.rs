//! Layout version 2 of the queue document: one scalar per event.
//!
//! An Automerge operation costs several microseconds whatever it writes, so the queue document
//! writes each event of a task's life as a single scalar (a small JSON object) under a key that
//! names it, instead of a map of fields:
//!
//! | root map | key | value | written by |
//! |---|---|---|---|
//! | `tasks` | task id | [`Entry`] (kind, submit time, submitter, priority, urgency, max attempts) | the submitter |
//! | `assigned` | attempt key | [`Assigned`] (worker, pool incarnation, time) | the router |
//! | `started` | attempt key | [`Start`] (time, pool incarnation) | the worker's pool |
//! | `ended` | attempt key | [`End`] (time, outcome, error) | the worker's pool, or a router |
//! | `seen` | task id | the attempt number up to which its input was seen available | members |
//! | `output` | attempt key | [`Output`] (result, logs, progress) of an inline task's run, and the undo tasks of any successful run | the worker's pool, with the end |
//! | `bumps` | task id | a dedup bump (time, priority, urgency) | a member that took a submit with the task's dedup key |
//! | `cancels` | task id | a cancel request (time, member) | any member |
//! | `requeues` | task id | a requeue (attempt number, runs started, time) | any member |
//! | `idempotency` | a client's idempotency key | the task its first submit made, and when | the member that took that submit |
//!
//! The attempt key is `TASK/N/TERM/ROUTER` (attempt number, and the assigning router's claim):
//! a task's attempts are the keys between `TASK/` and `TASK0`, and an attempt is a key, never a
//! position in a list. Keys are written once by one writer; where two writers can meet (two
//! ends of one attempt after a restart, two members marking an input) readers take every
//! concurrent value (`get_all`) and resolve them as in layout 1. A task's whole life is four
//! operations on the queue document instead of about twenty.
//!
//! Layout 1 (a map per task entry with a list of attempt maps) is still read, and a layout-1
//! document gains the layout-2 maps at its first layout-2 write; readers take the union.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, Claim, PeerId, TaskId};

pub(crate) const ASSIGNED: &str = "assigned";
pub(crate) const STARTED: &str = "started";
pub(crate) const ENDED: &str = "ended";
pub(crate) const SEEN: &str = "seen";
pub(crate) const OUTPUT: &str = "output";
/// Dedup bumps, by task id (see [`crate::entry::Bump`]). In documents created or rotated by a
/// version that knows dedup keys; a document without the map takes no bump.
pub(crate) const BUMPS: &str = "bumps";

/// Idempotency records, by the client's key: [`Idem`]. Like `bumps`, in documents created
/// or rotated by a version that knows them. Not a layout map: its keys name no task.
pub(crate) const IDEMPOTENCY: &str = "idempotency";

/// An idempotency record: the task a submit with the key made, and when (unix ms, the
/// submitting member's clock).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Idem {
    /// When.
    pub(crate) t: u64,
    /// The task.
    pub(crate) k: String,
}

/// Cancel requests, by task id (see [`crate::entry::Cancel`]). Made at a document's
/// creation or rotation, or by the first cancel of a document made before they existed.
pub(crate) const CANCELS: &str = "cancels";
/// Requeues of dead-lettered tasks, by task id (see [`crate::entry::Requeue`]). Made like
/// `cancels`.
pub(crate) const REQUEUES: &str = "requeues";

/// The layout-2 maps, by root key.
pub(crate) const MAPS: [&str; 8] = [
    ASSIGNED, STARTED, ENDED, SEEN, OUTPUT, BUMPS, CANCELS, REQUEUES,
];

/// A task's index entry.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// Kind.
    pub(crate) k: String,
    /// Submit time (unix ms).
    pub(crate) t: u64,
    /// Submitter.
    pub(crate) s: String,
    /// Priority.
    #[serde(default)]
    pub(crate) p: i64,
    /// Urgent.
    #[serde(default)]
    pub(crate) u: bool,
    /// Max attempts.
    pub(crate) m: u64,
    /// The input (JSON text) of an inline task: one small enough to live in the queue
    /// document, with no task document (see [`crate::queue::Submission::input`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) i: Option<String>,
    /// Tags, delay, dependencies and their recorded outcomes.
    #[serde(default, skip_serializing_if = "crate::entry::Rules::is_empty")]
    pub(crate) r: crate::entry::Rules,
}

impl Entry {
    /// The entry of task `t` as a view read it, with rules `r`.
    pub(crate) fn of(t: &crate::entry::TaskEntry, r: crate::entry::Rules) -> Entry {
        Entry {
            k: t.kind.clone(),
            t: t.submitted_at,
            s: t.submitter.to_string(),
            p: t.priority,
            u: t.urgent,
            m: u64::from(t.max_attempts),
            i: t.input.clone(),
            r,
        }
    }
}

/// What a run of an inline task produced, written with its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The handler's result (JSON text), on success.
    #[serde(default, rename = "r", skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The log lines the handler wrote.
    #[serde(default, rename = "l", skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
    /// The tasks that undo a successful run, which an `undo` of the task submits (any task's
    /// run, inline or not; see [`crate::PlannedTask`]).
    #[serde(default, rename = "u", skip_serializing_if = "Vec::is_empty")]
    pub undo: Vec<crate::PlannedTask>,
    /// The progress the handler last reported (an inline task's; a task with a document
    /// keeps it in its run record).
    #[serde(default, rename = "p", skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::Progress>,
}

/// An assignment.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Assigned {
    /// Worker (`PEER/INDEX`).
    pub(crate) w: String,
    /// The pool incarnation it is addressed to (absent in attempts carried from a layout-1
    /// attempt that named none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) i: Option<u64>,
    /// Time (unix ms, the router's clock).
    pub(crate) a: u64,
}

/// A start.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Start {
    /// Time (unix ms, the worker's clock).
    pub(crate) a: u64,
    /// The pool's incarnation.
    pub(crate) i: u64,
}

/// An end.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct End {
    /// Time (unix ms).
    pub(crate) a: u64,
    /// Outcome.
    pub(crate) o: String,
    /// Error or refusal reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) e: Option<String>,
}

impl End {
    pub(crate) fn of(f: &crate::entry::Finished) -> Self {
        End {
            a: f.at,
            o: f.outcome.as_str().to_owned(),
            e: f.error.clone(),
        }
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("packed records serialize")
}

pub(crate) fn decode<'a, T: Deserialize<'a>>(s: &'a str) -> Option<T> {
    serde_json::from_str(s).ok()
}

/// `TASK/N/TERM/ROUTER`.
pub(crate) fn attempt_key(task: &TaskId, id: &AttemptId) -> String {
    format!("{}/{}/{}/{}", task, id.n, id.claim.term, id.claim.peer)
}

/// The task and attempt an attempt key names.
pub(crate) fn parse_attempt_key(key: &str) -> Option<(&str, AttemptId)> {
    let mut parts = key.splitn(4, '/');
    let task = parts.next()?;
    let n = parts.next()?.parse().ok()?;
    let term = parts.next()?.parse().ok()?;
    let peer = parts.next().filter(|p| !p.is_empty() && !p.contains('/'))?;
    Some((
        task,
        AttemptId {
            n,
            claim: Claim::new(term, PeerId::new(peer)),
        },
    ))
}

/// The task a layout-2 key belongs to (the key itself for `tasks` and `seen`).
pub(crate) fn task_of(key: &str) -> &str {
    key.split('/').next().unwrap_or(key)
}

/// The keys of `task`'s attempts: `TASK/` up to `TASK0` (`0` follows `/`).
pub(crate) fn attempts_of(task: &TaskId) -> Range<String> {
    format!("{task}/")..format!("{task}0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_keys_round_trip_and_sort_under_their_task() {
        let task = TaskId::new("automerge:2Xc7");
        let id = AttemptId {
            n: 12,
            claim: Claim::new(3, PeerId::new("12D3KooWabc")),
        };
        let key = attempt_key(&task, &id);
        assert_eq!(parse_attempt_key(&key), Some((task.as_str(), id)));
        assert_eq!(task_of(&key), task.as_str());
        let range = attempts_of(&task);
        assert!(range.contains(&key));
        assert!(!range.contains(&"automerge:2Xc70/1/1/p".to_owned()));
        assert!(!range.contains(&"automerge:2Xc/1/1/p".to_owned()));
        assert_eq!(parse_attempt_key("t/x/1/p"), None);
        assert_eq!(parse_attempt_key("t/1/1/"), None);
    }
}
