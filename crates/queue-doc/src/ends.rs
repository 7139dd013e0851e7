//! A task's end kept apart from any document ([`TaskEnd`]), its writing back into a queue
//! document ([`write_ends`], [`restore_ends`]), and its bytes on disk ([`TaskEnd::encode`],
//! [`TaskEnd::decode`]).
//!
//! A node keeps the ends of the tasks it saw end, to write them into a branch that shows such
//! a task live again once every document that held its end is deleted (the other side of a
//! double seal, say). What is kept is the task's entry as the view read it (shared with the
//! view: keeping it copies nothing) and its inline runs' outputs; the records written are the
//! ones a successor is built with (`epoch::build_successor`), each only where it is newer than
//! the document's own, as a carry writes them.

use std::sync::Arc;

use automerge::transaction::Transactable;
use automerge::{Automerge, ObjType, ROOT};

use crate::am;
use crate::entry::{Cancel, Requeue, TaskEntry};
use crate::epoch::{CARRIED, attempt_value};
use crate::ids::{AttemptId, QueueId, TaskId};
use crate::keys;
use crate::packed::{self, Output};
use crate::queue::WriteError;

/// The version of [`TaskEnd::encode`]'s format.
const STORED_VERSION: u32 = 1;

/// A task's end as stored apart from any document: the same packed values a queue document
/// holds of it, so that reading it back is reading a document.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    /// Format version ([`STORED_VERSION`]).
    v: u32,
    /// The task's queue.
    q: String,
    /// The task.
    t: String,
    /// Its packed entry, with its dependencies' outcomes.
    e: String,
    /// Its records: (index in `CARRIED`, key, packed value).
    r: Vec<(usize, String, String)>,
}

/// A stored task end that cannot be read back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeEndError {
    /// Not the format [`TaskEnd::encode`] writes.
    #[error("malformed stored task end: {0}")]
    Malformed(String),
    /// Written by a later version.
    #[error("stored task end of format version {0}, this version reads {STORED_VERSION}")]
    Version(u32),
}

/// A task's end as this node saw it: its entry and the outputs of its inline runs.
#[derive(Clone, Debug)]
pub struct TaskEnd {
    entry: Arc<TaskEntry>,
    outputs: Vec<(AttemptId, Output)>,
}

impl TaskEnd {
    /// The end of `entry`'s task, with its inline runs' `outputs` (see
    /// [`crate::read_outputs`]; none for a task with a task document).
    pub fn new(entry: Arc<TaskEntry>, outputs: Vec<(AttemptId, Output)>) -> Self {
        TaskEnd { entry, outputs }
    }

    /// The entry kept.
    pub fn entry(&self) -> &TaskEntry {
        &self.entry
    }

    /// The outputs kept of its runs (an inline task's results and logs, any task's undo tasks).
    pub fn outputs(&self) -> &[(AttemptId, Output)] {
        &self.outputs
    }

    /// The task's entry, shared.
    pub fn shared_entry(&self) -> Arc<TaskEntry> {
        Arc::clone(&self.entry)
    }

    /// About how many bytes it keeps in memory (the entry counted whole, though the view may
    /// share it).
    pub fn bytes(&self) -> usize {
        let e = &self.entry;
        let entry = 128
            + e.id.as_str().len()
            + e.kind.len()
            + e.input.as_ref().map_or(0, String::len)
            + e.attempts.len() * 160;
        let outputs: usize = self
            .outputs
            .iter()
            .map(|(_, o)| {
                48 + o.result.as_ref().map_or(0, String::len)
                    + o.logs.iter().map(String::len).sum::<usize>()
            })
            .sum();
        entry + outputs
    }

    /// Its packed entry, as a document indexes it: its dependencies that ended are recorded
    /// with their outcomes, as a rotation records them.
    fn packed_entry(&self) -> String {
        let t = &self.entry;
        let mut r = t.rules.clone();
        for d in &t.rules.depends_on {
            if let Some(s) = t.dependencies.get(d).filter(|s| s.is_final()) {
                r.outcomes.insert(d.clone(), *s);
            }
        }
        packed::encode(&packed::Entry::of(t, r))
    }

    /// The end as bytes to store (the task's queue with it), read back with
    /// [`TaskEnd::decode`]: the packed values a queue document would hold of the task.
    pub fn encode(&self, queue: &QueueId) -> Vec<u8> {
        let stored = Stored {
            v: STORED_VERSION,
            q: queue.to_string(),
            t: self.entry.id.to_string(),
            e: self.packed_entry(),
            r: self.records().collect(),
        };
        serde_json::to_vec(&stored).unwrap_or_default()
    }

    /// Reads back an end [`TaskEnd::encode`] stored, with its queue: written into a
    /// document of its own and read from there as a view reads a task.
    ///
    /// # Errors
    /// The bytes are not an encoded end of this version, or hold no readable entry.
    pub fn decode(bytes: &[u8]) -> Result<(QueueId, TaskEnd), DecodeEndError> {
        let bad = |e: &dyn std::fmt::Display| DecodeEndError::Malformed(e.to_string());
        let s: Stored = serde_json::from_slice(bytes).map_err(|e| bad(&e))?;
        if s.v != STORED_VERSION {
            return Err(DecodeEndError::Version(s.v));
        }
        let task = TaskId::new(s.t.clone());
        let mut doc = Automerge::new();
        doc.transact(|tx| {
            tx.put(ROOT, keys::SCHEMA, keys::QUEUE_SCHEMA)
                .map_err(|e| bad(&e))?;
            let tasks = tx
                .put_object(ROOT, keys::TASKS, ObjType::Map)
                .map_err(|e| bad(&e))?;
            tx.put(&tasks, task.as_str(), s.e.as_str())
                .map_err(|e| bad(&e))?;
            for (i, key, value) in &s.r {
                let Some(name) = CARRIED.get(*i).filter(|_| *i > 0) else {
                    return Err(DecodeEndError::Malformed(format!("record map {i}")));
                };
                let map = match am::object(tx, &ROOT, name, ObjType::Map) {
                    Some(m) => m,
                    None => tx
                        .put_object(ROOT, *name, ObjType::Map)
                        .map_err(|e| bad(&e))?,
                };
                tx.put(&map, key.as_str(), value.as_str())
                    .map_err(|e| bad(&e))?;
            }
            Ok(())
        })
        .map_err(|f| f.error)?;
        let entry = crate::epoch::task_entry(&doc, &task)
            .ok_or_else(|| DecodeEndError::Malformed(format!("no readable entry of {task}")))?;
        let outputs = crate::read::read_outputs(&doc, &task);
        Ok((QueueId::new(s.q), TaskEnd::new(Arc::new(entry), outputs)))
    }

    /// The records it writes: (index in `CARRIED`, attempt key, packed value).
    fn records(&self) -> impl Iterator<Item = (usize, String, String)> + '_ {
        let task = &self.entry.id;
        let attempts = self.entry.attempts.iter().flat_map(move |a| {
            let key = packed::attempt_key(task, &a.id);
            let assigned = packed::Assigned {
                w: a.worker.to_string(),
                i: a.pool_incarnation,
                a: a.assigned_at,
            };
            let started = a.started.as_ref().map(|s| packed::Start {
                a: s.at,
                i: s.incarnation,
            });
            let ended = a.finished.as_ref().map(packed::End::of);
            let output = self
                .outputs
                .iter()
                .find(|(id, _)| *id == a.id)
                .map(|(_, o)| o);
            [
                Some((1, packed::encode(&assigned))),
                started.map(|s| (2, packed::encode(&s))),
                ended.map(|e| (3, packed::encode(&e))),
                output.map(|o| (5, packed::encode(o))),
            ]
            .into_iter()
            .flatten()
            .map(move |(i, v)| (i, key.clone(), v))
        });
        // A cancel ends a task too; a requeue keeps its attempt numbers going.
        let marks = [
            self.entry.cancel.as_ref().map(|c| (8, packed::encode(c))),
            self.entry.requeue.as_ref().map(|q| (9, packed::encode(q))),
        ];
        attempts.chain(
            marks
                .into_iter()
                .flatten()
                .map(move |(i, v)| (i, task.to_string(), v)),
        )
    }
}

/// The value to write under `key` of `CARRIED[i]` in `into` for a kept record `theirs`: an
/// attempt record if newer than `into`'s, a cancel or requeue merged with `into`'s.
fn kept_value<R: automerge::ReadDoc>(
    i: usize,
    theirs: String,
    into: &R,
    key: &str,
) -> Option<automerge::ScalarValue> {
    fn merged<T: crate::read::Merge + serde::Serialize + PartialEq + Clone>(
        theirs: String,
        mine: Option<T>,
    ) -> Option<automerge::ScalarValue> {
        let theirs = packed::decode::<T>(&theirs)?;
        let merged = match mine.clone() {
            Some(m) => m.merge(theirs),
            None => theirs,
        };
        (Some(&merged) != mine.as_ref())
            .then(|| automerge::ScalarValue::from(packed::encode(&merged)))
    }
    let mine = |map| crate::read::packed_values(into, map, key);
    match i {
        8 => merged(
            theirs,
            crate::read::merged_of::<Cancel>(mine(packed::CANCELS)),
        ),
        9 => merged(
            theirs,
            crate::read::merged_of::<Requeue>(mine(packed::REQUEUES)),
        ),
        _ => attempt_value(i, std::iter::once(theirs), into, key),
    }
}

/// Writes into `into` each kept record newer than `into`'s (an assignment or output `into`
/// lacks, a later start or end); how many. One change, none if nothing is new.
///
/// # Errors
/// `into` is not a queue document, or Automerge refuses a write.
pub fn write_ends(into: &mut Automerge, ends: &[&TaskEnd]) -> Result<usize, WriteError> {
    write_kept(into, ends, false)
}

/// [`write_ends`], and each task's entry where `into` does not index it: the task is back in
/// `into` whole, as it ended (a requeue of a dead letter a rotation left behind starts here).
/// Each task is such a dead letter, which the rotation counted among the retired failures: the
/// document's count of them ([`crate::chain::Retired`]) goes down by one per entry written
/// back, so that the task counts again where it ends next, once. (Two members restoring
/// different tasks at once write the count concurrently: one write wins and the count, shown
/// only, may be one off.)
///
/// # Errors
/// As [`write_ends`].
pub fn restore_ends(into: &mut Automerge, ends: &[&TaskEnd]) -> Result<usize, WriteError> {
    write_kept(into, ends, true)
}

fn write_kept(into: &mut Automerge, ends: &[&TaskEnd], entries: bool) -> Result<usize, WriteError> {
    let mut writes = 0;
    into.transact(|tx| {
        if am::string(tx, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return Err(WriteError::NotAQueue);
        }
        // A dead letter written back was counted among the retired failures when the
        // rotation left it behind; it counts again where it ends next.
        let mut restored_failures = 0u64;
        if entries {
            let tasks = match am::object(tx, &ROOT, keys::TASKS, ObjType::Map) {
                Some(m) => m,
                None => tx.put_object(ROOT, keys::TASKS, ObjType::Map)?,
            };
            for e in ends {
                let t = e.entry();
                if crate::epoch::indexes(&*tx, &t.id) {
                    continue;
                }
                // Its dependencies ended long ago: their outcomes go with it.
                tx.put(&tasks, t.id.as_str(), e.packed_entry())?;
                writes += 1;
                restored_failures += 1;
            }
            if restored_failures > 0 {
                let mut retired = crate::chain::read_retired(&*tx);
                retired.failed = retired.failed.saturating_sub(restored_failures);
                tx.put(ROOT, keys::RETIRED, packed::encode(&retired))?;
            }
        }
        for (i, key, theirs) in ends.iter().flat_map(|e| e.records()) {
            let Some(v) = kept_value(i, theirs, tx, &key) else {
                continue;
            };
            let target = match am::object(tx, &ROOT, CARRIED[i], ObjType::Map) {
                Some(m) => m,
                None => tx.put_object(ROOT, CARRIED[i], ObjType::Map)?,
            };
            tx.put(&target, key.as_str(), v)?;
            writes += 1;
        }
        Ok(())
    })
    .map_err(|f| f.error)?;
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Claim, PeerId, TaskId};

    #[test]
    fn a_task_end_counts_its_input_and_outputs() {
        let entry = |input: Option<String>| TaskEntry {
            id: TaskId::new("t"),
            kind: "k".into(),
            submitted_at: 0,
            submitter: PeerId::new("s"),
            priority: 0,
            urgent: false,
            max_attempts: 1,
            attempts: Vec::new(),
            input_seen: 0,
            input,
            rules: Default::default(),
            dependencies: Default::default(),
            bump: None,
            duplicate_of: None,
            cancel: None,
            requeue: None,
        };
        let bare = TaskEnd::new(Arc::new(entry(None)), Vec::new());
        let with_input = TaskEnd::new(Arc::new(entry(Some("x".repeat(1000)))), Vec::new());
        assert_eq!(with_input.bytes(), bare.bytes() + 1000);
        let id = AttemptId {
            n: 1,
            claim: Claim::new(1, PeerId::new("r")),
        };
        let out = Output {
            result: Some("y".repeat(500)),
            logs: vec!["z".repeat(250)],
            ..Output::default()
        };
        let with_output = TaskEnd::new(Arc::new(entry(None)), vec![(id, out)]);
        assert!(with_output.bytes() >= bare.bytes() + 750);
    }
}
