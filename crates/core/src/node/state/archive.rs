//! `Archive`: the final statuses of inline tasks to archive at the end of the turn, and the
//! latest archived, kept in memory too; and the listing entries and ends of every task that
//! became final, to store for listings and for requeues and undos once it left the live
//! documents. A sub-machine: its fields are its own. The turn records statuses into it; it
//! asks it whether any waits, for a recent one, and takes the turn's records from it to hand
//! to the driver. It asks nothing of the others.

use std::collections::{BTreeMap, VecDeque};

use piecework_queue_doc::TaskId;

use crate::Listed;

/// Final statuses of inline tasks: to archive, and the latest archived.
#[derive(Debug, Default)]
pub(in crate::node) struct Archive {
    /// Final statuses of inline tasks to archive at the end of the turn (tasks that became
    /// final in this turn's refreshes).
    pending: Vec<(TaskId, Vec<u8>)>,
    /// The latest archived statuses, also in memory: at most
    /// [`crate::node::statuses::RECENT_ARCHIVED`].
    recent: BTreeMap<TaskId, Vec<u8>>,
    /// `recent`'s keys, oldest first.
    order: VecDeque<TaskId>,
    /// Listing entries of tasks that became final this turn.
    listed: Vec<Listed>,
    /// Ends of tasks that became final this turn, encoded.
    ends: Vec<(TaskId, Vec<u8>)>,
}

impl Archive {
    /// A task's final status (JSON) to archive at the end of this turn.
    pub(in crate::node) fn record(&mut self, task: TaskId, json: Vec<u8>) {
        self.pending.push((task, json));
    }

    /// A task that became final, to list at the end of this turn.
    pub(in crate::node) fn list(&mut self, listed: Listed) {
        self.listed.push(listed);
    }

    /// A task's end (encoded), to keep at the end of this turn.
    pub(in crate::node) fn end(&mut self, task: TaskId, end: Vec<u8>) {
        self.ends.push((task, end));
    }

    /// Whether statuses, listing entries or ends wait to be stored.
    pub(in crate::node) fn is_pending(&self) -> bool {
        !self.pending.is_empty() || !self.listed.is_empty() || !self.ends.is_empty()
    }

    /// The turn's ends, for the driver to store.
    pub(in crate::node) fn take_ends(&mut self) -> Vec<(TaskId, Vec<u8>)> {
        std::mem::take(&mut self.ends)
    }

    /// The turn's listing entries, for the driver to store.
    pub(in crate::node) fn take_listed(&mut self) -> Vec<Listed> {
        std::mem::take(&mut self.listed)
    }

    /// A status archived lately (kept in memory), if `task` is among them.
    pub(in crate::node) fn recent(&self, task: &TaskId) -> Option<&Vec<u8>> {
        self.recent.get(task)
    }

    /// The turn's records, for the driver to store: each is kept in memory too, the oldest
    /// beyond `keep` forgotten.
    pub(in crate::node) fn take(&mut self, keep: usize) -> Vec<(TaskId, Vec<u8>)> {
        let records = std::mem::take(&mut self.pending);
        for (task, json) in &records {
            if self.recent.insert(task.clone(), json.clone()).is_none() {
                self.order.push_back(task.clone());
            }
        }
        while self.order.len() > keep {
            if let Some(t) = self.order.pop_front() {
                self.recent.remove(&t);
            }
        }
        records
    }
}
