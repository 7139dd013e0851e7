//! `Submits`: the submits waiting to be acknowledged (durable, and held by a peer or out of
//! time), the task documents they keep in memory, and when they are looked at again. A
//! sub-machine: its fields are its own. The turn tells it of a new wait and of anything that
//! may answer one (a save, a peer's message, a stream opened or closed); it asks it whether
//! there is room for another, which waits to look at now, whether a document is held for one,
//! and when it is due next. It asks nothing of the others.

use std::collections::BTreeSet;
use std::time::Instant;

use piecework_replica::DocId;

use crate::MAX_PENDING_SUBMITS;
use crate::node::waiters::SubmitWait;

/// Submits waiting to be acknowledged.
#[derive(Debug, Default)]
pub(in crate::node) struct Submits {
    /// Submits waiting for durability and replication: at most [`MAX_PENDING_SUBMITS`].
    waits: Vec<SubmitWait>,
    /// The task documents of `waits`: kept in memory until their submit is answered (a
    /// document that left memory is no longer synced, so no peer would acknowledge it).
    acking: BTreeSet<DocId>,
    /// Something that can answer a submit wait happened since the waits were last checked.
    dirty: bool,
    /// The earliest deadline of a durable submit that waits only for a peer to hold it.
    deadline: Option<Instant>,
}

impl Submits {
    /// Something happened that may answer a wait (a save ended, a peer sent something or
    /// came or went): the waits are looked at again at the end of the turn.
    pub(in crate::node) fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// Whether no other submit may wait now ([`MAX_PENDING_SUBMITS`]).
    pub(in crate::node) fn is_full(&self) -> bool {
        self.waits.len() >= MAX_PENDING_SUBMITS
    }

    /// A submit waits for its acknowledgement: its task documents stay in memory meanwhile,
    /// and the waits are looked at again.
    pub(in crate::node) fn wait(&mut self, wait: SubmitWait) {
        self.dirty = true;
        self.acking
            .extend(wait.tasks.iter().map(|(d, _, _)| d.clone()));
        self.waits.push(wait);
    }

    /// The waits to look at now, taken (none unless something happened since they were last
    /// looked at, or the earliest deadline passed at `now`). Each one not answered comes back
    /// through [`Submits::still_waiting`] or [`Submits::waits_for_deadline`].
    pub(in crate::node) fn take_due(&mut self, now: Instant) -> Option<Vec<SubmitWait>> {
        let due = self.deadline.is_some_and(|d| now >= d);
        if !std::mem::take(&mut self.dirty) && !due {
            return None;
        }
        self.deadline = None;
        Some(std::mem::take(&mut self.waits))
    }

    /// A wait that is not durable yet goes on waiting.
    pub(in crate::node) fn still_waiting(&mut self, wait: SubmitWait) {
        self.waits.push(wait);
    }

    /// A durable wait that only its deadline (or a peer's message) can answer now: it goes on
    /// waiting, and its deadline counts for the next look.
    pub(in crate::node) fn waits_for_deadline(&mut self, wait: SubmitWait) {
        self.deadline = Some(
            self.deadline
                .map_or(wait.deadline, |d| d.min(wait.deadline)),
        );
        self.waits.push(wait);
    }

    /// A submit with the task document `doc` was answered: the document is no longer held
    /// for it.
    pub(in crate::node) fn release(&mut self, doc: &DocId) {
        self.acking.remove(doc);
    }

    /// Whether `doc` is held in memory for a submit waiting to be acknowledged.
    pub(in crate::node) fn holds(&self, doc: &DocId) -> bool {
        self.acking.contains(doc)
    }

    /// When the waits must be looked at again, if nothing else happens before.
    pub(in crate::node) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// How many submits wait.
    pub(in crate::node) fn waiting(&self) -> usize {
        self.waits.len()
    }
}
