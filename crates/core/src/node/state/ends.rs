//! `Ends`: the ends of the tasks this node saw end lately (each task's entry as the view read
//! it, shared with the view, and its inline runs' outputs), kept in memory. A
//! sub-machine: its fields are its own. The turn records a task's end when a view first shows
//! it final; a move to another branch asks for those of the tasks the branch shows live again. It asks nothing of the others.
//!
//! Why: at a double seal each side's successor drops the tasks that side saw end. If the side
//! that saw a task end loses, and every document holding the end is deleted
//! (`keep_sealed_epochs`), the winner's branch shows the task live and nothing on disk says
//! otherwise: the node that saw the end writes it into the winner at the move, so its view does
//! not go back (simulator seed 3013 at 7 nodes keeping 2 sealed epochs). The memory is bounded:
//! an end older than the bound is forgotten, and such a task may run again (at least once).

use std::collections::{BTreeMap, VecDeque};

use piecework_queue_doc::epoch::TaskEnd;
use piecework_queue_doc::{QueueId, TaskId};

/// Tasks whose ends are kept: about as many as a queue document holds live at once, several
/// times over.
pub(in crate::node) const RECENT_ENDS: usize = 4_096;
/// Bytes of ends kept (inline inputs and outputs are the large part; an end over it is not
/// kept).
pub(in crate::node) const RECENT_ENDS_BYTES: usize = 32 * 1024 * 1024;

/// The ends of the tasks seen ending lately, oldest forgotten first.
#[derive(Debug)]
pub(in crate::node) struct Ends {
    /// How many are kept ([`RECENT_ENDS`] unless configured otherwise).
    limit: usize,
    ends: BTreeMap<TaskId, TaskEnd>,
    /// The queue of each kept end (a listing of a queue's tasks shows them).
    queues: BTreeMap<TaskId, QueueId>,
    /// `ends`' keys, oldest first.
    order: VecDeque<TaskId>,
    bytes: usize,
}

impl Default for Ends {
    fn default() -> Self {
        Ends::keeping(RECENT_ENDS)
    }
}

impl Ends {
    /// Ends that keep at most `limit` tasks' ends.
    pub(in crate::node) fn keeping(limit: usize) -> Self {
        Ends {
            limit,
            ends: BTreeMap::new(),
            queues: BTreeMap::new(),
            order: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Keeps a task's end (replacing any kept of it), forgetting the oldest beyond the
    /// bounds. Costs no read of any document: the entry is the view's.
    #[cfg(test)]
    pub(in crate::node) fn record(&mut self, end: TaskEnd) {
        self.record_of(None, end);
    }

    /// [`Ends::record`], remembering the task's queue.
    pub(in crate::node) fn record_of(&mut self, queue: Option<&QueueId>, end: TaskEnd) {
        let size = end.bytes();
        if size > RECENT_ENDS_BYTES {
            return;
        }
        let task = end.entry().id.clone();
        if let Some(q) = queue {
            self.queues.insert(task.clone(), q.clone());
        }
        match self.ends.insert(task.clone(), end) {
            Some(old) => self.bytes -= old.bytes(),
            None => self.order.push_back(task),
        }
        self.bytes += size;
        while self.order.len() > self.limit || self.bytes > RECENT_ENDS_BYTES {
            let Some(t) = self.order.pop_front() else {
                break;
            };
            if let Some(r) = self.ends.remove(&t) {
                self.bytes -= r.bytes();
            }
            self.queues.remove(&t);
        }
    }

    /// The end kept of `task`, if any.
    pub(in crate::node) fn get(&self, task: &TaskId) -> Option<&TaskEnd> {
        self.ends.get(task)
    }

    /// The queue of the kept end of `task`, if known.
    pub(in crate::node) fn queue_of(&self, task: &TaskId) -> Option<&QueueId> {
        self.queues.get(task)
    }

    /// The ends kept of `queue`'s tasks: O(ends kept).
    pub(in crate::node) fn of_queue<'a>(
        &'a self,
        queue: &'a QueueId,
    ) -> impl Iterator<Item = &'a TaskEnd> + 'a {
        self.queues
            .iter()
            .filter(move |(_, q)| *q == queue)
            .filter_map(|(t, _)| self.ends.get(t))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use piecework_queue_doc::{PeerId, TaskEntry};

    use super::*;

    fn end(id: &str, input: usize) -> TaskEnd {
        let entry = TaskEntry {
            id: TaskId::new(id),
            kind: "k".into(),
            submitted_at: 0,
            submitter: PeerId::new("s"),
            priority: 0,
            urgent: false,
            max_attempts: 1,
            attempts: Vec::new(),
            input_seen: 0,
            input: (input > 0).then(|| "x".repeat(input)),
            rules: Default::default(),
            dependencies: Default::default(),
            bump: None,
            duplicate_of: None,
            cancel: None,
            requeue: None,
        };
        TaskEnd::new(Arc::new(entry), Vec::new())
    }

    #[test]
    fn the_oldest_end_is_forgotten_past_the_count() {
        let mut e = Ends::default();
        for i in 0..=RECENT_ENDS {
            e.record(end(&format!("t{i}"), 0));
        }
        assert!(e.get(&TaskId::new("t0")).is_none());
        assert!(e.get(&TaskId::new("t1")).is_some());
        assert!(e.get(&TaskId::new(format!("t{RECENT_ENDS}"))).is_some());
        assert_eq!(e.ends.len(), RECENT_ENDS);
        let bytes: usize = e.ends.values().map(TaskEnd::bytes).sum();
        assert_eq!(e.bytes, bytes);
    }

    #[test]
    fn ends_past_the_bytes_are_forgotten_and_one_too_large_is_not_kept() {
        let mut e = Ends::default();
        let big = RECENT_ENDS_BYTES / 3;
        for i in 0..4 {
            e.record(end(&format!("t{i}"), big));
        }
        assert!(e.get(&TaskId::new("t0")).is_none());
        assert!(e.get(&TaskId::new("t3")).is_some());
        assert!(e.bytes <= RECENT_ENDS_BYTES);
        e.record(end("huge", RECENT_ENDS_BYTES + 1));
        assert!(e.get(&TaskId::new("huge")).is_none());
        assert!(e.get(&TaskId::new("t3")).is_some());
    }

    #[test]
    fn a_second_end_of_a_task_replaces_the_first() {
        let mut e = Ends::default();
        e.record(end("t", 10));
        e.record(end("t", 100));
        assert_eq!(e.ends.len(), 1);
        assert_eq!(e.order.len(), 1);
        assert_eq!(e.bytes, end("t", 100).bytes());
    }
}
