//! The merge rules of `docs/protocol.md` ("Documents and their writers", "Attempts"), written
//! out here from the text rather than taken from the crate, for the property tests to judge
//! the crate by.

// Each test file that includes this module uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;

use piecework_queue_doc::{
    Attempt, AttemptId, AttemptOutcome, Finished, QueueView, Started, TaskEntry, TaskId, TaskState,
};
use proptest::prelude::*;

/// The merge order of two ends of one attempt: the greater outcome
/// (`succeeded > failed > interrupted > unavailable > refused`), then the later time, then the
/// greater error text.
pub fn end_key(f: &Finished) -> (u8, u64, Option<String>) {
    let rank = match f.outcome {
        AttemptOutcome::Refused => 0,
        AttemptOutcome::Unavailable => 1,
        AttemptOutcome::Interrupted => 2,
        AttemptOutcome::Failed => 3,
        AttemptOutcome::Succeeded => 4,
    };
    (rank, f.at, f.error.clone())
}

/// The merge order of two starts of one attempt: the greater `(incarnation, time)`.
pub fn start_key(s: &Started) -> (u64, u64) {
    (s.incarnation, s.at)
}

/// A task's state as the protocol derives it from its attempts: any success → succeeded; else
/// `max_attempts` ends `failed` or `interrupted` → failed; else current attempts (the highest
/// number) all ended `unavailable` with the input mark below that number → input_unavailable;
/// else an open current attempt that started → running, one that did not → assigned; else
/// pending.
pub fn expected_state(t: &TaskEntry) -> TaskState {
    let ended =
        |a: &Attempt, o: AttemptOutcome| a.finished.as_ref().is_some_and(|f| f.outcome == o);
    if t.attempts
        .iter()
        .any(|a| ended(a, AttemptOutcome::Succeeded))
    {
        return TaskState::Succeeded;
    }
    let failures = t
        .attempts
        .iter()
        .filter(|a| ended(a, AttemptOutcome::Failed) || ended(a, AttemptOutcome::Interrupted))
        .count();
    if failures >= usize::try_from(t.max_attempts).unwrap_or(usize::MAX) {
        return TaskState::Failed;
    }
    let last = t.attempts.iter().map(|a| a.id.n).max().unwrap_or(0);
    let current: Vec<&Attempt> = t.attempts.iter().filter(|a| a.id.n == last).collect();
    if last > 0
        && t.input_seen < last
        && current
            .iter()
            .all(|a| ended(a, AttemptOutcome::Unavailable))
    {
        return TaskState::InputUnavailable;
    }
    if current
        .iter()
        .any(|a| a.finished.is_none() && a.started.is_some())
    {
        return TaskState::Running;
    }
    if current.iter().any(|a| a.finished.is_none()) {
        return TaskState::Assigned;
    }
    TaskState::Pending
}

/// An attempt, by its task.
pub type Key = (TaskId, AttemptId);

/// The starts, ends and input marks that writers wrote, whatever replica or epoch document
/// they wrote them on.
#[derive(Debug, Default)]
pub struct Written {
    /// Every start written, per attempt.
    pub starts: BTreeMap<Key, Vec<Started>>,
    /// Every end written, per attempt.
    pub ends: BTreeMap<Key, Vec<Finished>>,
    /// The greatest input mark written, per task.
    pub marks: BTreeMap<TaskId, u64>,
}

impl Written {
    /// Logs a start.
    pub fn start(&mut self, task: &TaskId, attempt: &AttemptId, s: Started) {
        self.starts
            .entry((task.clone(), attempt.clone()))
            .or_default()
            .push(s);
    }

    /// Logs an end.
    pub fn end(&mut self, task: &TaskId, attempt: &AttemptId, f: Finished) {
        self.ends
            .entry((task.clone(), attempt.clone()))
            .or_default()
            .push(f);
    }

    /// Logs an input mark.
    pub fn mark(&mut self, task: &TaskId, n: u64) {
        let m = self.marks.entry(task.clone()).or_default();
        *m = (*m).max(n);
    }

    /// Adds another writer's log.
    pub fn extend(&mut self, other: &Written) {
        for (k, v) in &other.starts {
            self.starts
                .entry(k.clone())
                .or_default()
                .extend(v.iter().cloned());
        }
        for (k, v) in &other.ends {
            self.ends
                .entry(k.clone())
                .or_default()
                .extend(v.iter().cloned());
        }
        for (t, n) in &other.marks {
            self.mark(t, *n);
        }
    }

    /// The task in `view` shows, for each of its attempts, the greatest start and end written
    /// for it, and the greatest input mark; and its state is the one its attempts give.
    pub fn check_task(&self, view: &QueueView, id: &TaskId) -> Result<(), TestCaseError> {
        let Some(t) = view.task(id) else {
            return Err(TestCaseError::fail(format!("{id} is not in the view")));
        };
        prop_assert_eq!(t.state(), expected_state(t), "task {}: {:?}", id, t);
        prop_assert_eq!(
            t.input_seen,
            self.marks.get(id).copied().unwrap_or(0),
            "task {}: the greatest input mark wins",
            id
        );
        for a in &t.attempts {
            let key = (id.clone(), a.id.clone());
            let start = self
                .starts
                .get(&key)
                .and_then(|v| v.iter().max_by_key(|s| start_key(s)));
            prop_assert_eq!(
                a.started.as_ref(),
                start,
                "{:?}: the greatest start wins",
                key
            );
            let end = self
                .ends
                .get(&key)
                .and_then(|v| v.iter().max_by_key(|f| end_key(f)));
            prop_assert_eq!(a.finished.as_ref(), end, "{:?}: the greatest end wins", key);
        }
        Ok(())
    }
}
