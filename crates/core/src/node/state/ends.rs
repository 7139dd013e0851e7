//! `Ends`: the attempt records of the tasks this node saw end lately, kept in memory. A
//! sub-machine: its fields are its own. The turn records a task's records when a view first
//! shows it final; a move to another branch asks for those of the tasks the branch shows live
//! again. It asks nothing of the others.
//!
//! Why: at a double seal each side's successor drops the tasks that side saw end. If the side
//! that saw a task end loses, and every document holding the end is deleted
//! (`keep_sealed_epochs`), the winner's branch shows the task live and nothing on disk says
//! otherwise: the node that saw the end writes it into the winner at the move, so its view does
//! not go back (simulator seed 3013 at 7 nodes keeping 2 sealed epochs). The memory is bounded:
//! an end older than the bound is forgotten, and such a task may run again (at least once).

use std::collections::{BTreeMap, VecDeque};

use piecework_queue_doc::TaskId;
use piecework_queue_doc::epoch::TaskRecords;

/// Tasks whose ends are kept: about as many as a queue document holds live at once, several
/// times over.
pub(in crate::node) const RECENT_ENDS: usize = 4_096;
/// Bytes of records kept (inline outputs are the large part; a record over it is not kept).
pub(in crate::node) const RECENT_ENDS_BYTES: usize = 32 * 1024 * 1024;

/// The records of the tasks seen ending lately, oldest forgotten first.
#[derive(Debug, Default)]
pub(in crate::node) struct Ends {
    records: BTreeMap<TaskId, TaskRecords>,
    /// `records`' keys, oldest first.
    order: VecDeque<TaskId>,
    bytes: usize,
}

impl Ends {
    /// Keeps `task`'s records (replacing any kept), forgetting the oldest beyond the bounds.
    pub(in crate::node) fn record(&mut self, task: TaskId, records: TaskRecords) {
        let size = records.bytes();
        if records.is_empty() || size > RECENT_ENDS_BYTES {
            return;
        }
        match self.records.insert(task.clone(), records) {
            Some(old) => self.bytes -= old.bytes(),
            None => self.order.push_back(task),
        }
        self.bytes += size;
        while self.order.len() > RECENT_ENDS || self.bytes > RECENT_ENDS_BYTES {
            let Some(t) = self.order.pop_front() else {
                break;
            };
            if let Some(r) = self.records.remove(&t) {
                self.bytes -= r.bytes();
            }
        }
    }

    /// The records kept of `task`, if any.
    pub(in crate::node) fn get(&self, task: &TaskId) -> Option<&TaskRecords> {
        self.records.get(task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_records_are_not_kept() {
        let mut e = Ends::default();
        e.record(TaskId::new("a"), TaskRecords::default());
        assert!(e.get(&TaskId::new("a")).is_none());
        assert_eq!(e.bytes, 0);
    }
}
