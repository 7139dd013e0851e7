//! The node's state by concern: what documents are being loaded, waited for and evicted
//! (`Documents`), the peers (`Members`), submits waiting for their acknowledgement
//! (`Submits`), status requests and questions (`Lookups`), archived statuses (`Archive`), runs
//! and the writes they make (`Runs`), and the epoch work in flight (`Epochs`). Plain data,
//! each bounded as its fields say; the turn modules decide about them. Imports nothing of the
//! node but the other state modules.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use piecework_queue_doc::{PeerId, TaskId};

mod documents;
mod epochs;
mod lookups;
mod runs;
mod submits;

pub(super) use documents::Documents;
pub(super) use epochs::Epochs;
pub(super) use lookups::{Lookups, PeerLookup};
pub(super) use runs::Runs;
pub(super) use submits::Submits;

/// The peers this node is connected to, and what it tells them of itself. A sub-machine: its
/// fields are its own; the turn tells it of connections and addresses and asks it whether a
/// peer is connected and whether members are due to be dialed.
#[derive(Debug)]
pub(super) struct Members {
    /// Peers with an open sync stream (bounded by the transport's connections).
    connected: BTreeSet<PeerId>,
    /// This node's listen addresses, as written into its queues' member lists.
    advertised: Vec<String>,
    /// When the members this node has no stream with are dialed next.
    next_dial: Instant,
}

impl Members {
    pub(super) fn new(now: Instant) -> Self {
        Members {
            connected: BTreeSet::new(),
            advertised: vec![],
            next_dial: now,
        }
    }

    /// A sync stream with `peer` opened.
    pub(super) fn connected(&mut self, peer: PeerId) {
        self.connected.insert(peer);
    }

    /// The stream with `peer` closed.
    pub(super) fn disconnected(&mut self, peer: &PeerId) {
        self.connected.remove(peer);
    }

    /// Whether a sync stream with `peer` is open.
    pub(super) fn is_connected(&self, peer: &PeerId) -> bool {
        self.connected.contains(peer)
    }

    /// The peers with an open sync stream, in order.
    pub(super) fn connected_peers(&self) -> impl Iterator<Item = &PeerId> {
        self.connected.iter()
    }

    /// How many peers this node has a stream with.
    pub(super) fn connected_count(&self) -> usize {
        self.connected.len()
    }

    /// This node's listen addresses, as its queues' member lists should say.
    pub(super) fn advertised(&self) -> &[String] {
        &self.advertised
    }

    /// The node's listen addresses are `addrs`; whether they changed.
    pub(super) fn advertise(&mut self, addrs: Vec<String>) -> bool {
        if addrs == self.advertised {
            return false;
        }
        self.advertised = addrs;
        true
    }

    /// When the members are dialed next.
    pub(super) fn next_dial(&self) -> Instant {
        self.next_dial
    }

    /// Dial the members at the next turn (a queue was joined, or a member list changed).
    pub(super) fn dial_now(&mut self, now: Instant) {
        self.next_dial = now;
    }

    /// Whether members are due to be dialed at `now`; if so, the next time is `every` later.
    pub(super) fn dial_due(&mut self, now: Instant, every: std::time::Duration) -> bool {
        if now < self.next_dial {
            return false;
        }
        self.next_dial = now + every;
        true
    }
}

/// Final statuses of inline tasks: to archive, and the latest archived. A sub-machine: its
/// fields are its own; the turn records statuses into it, asks it for a recent one, and takes
/// the turn's records from it to hand to the driver.
#[derive(Debug, Default)]
pub(super) struct Archive {
    /// Final statuses of inline tasks to archive at the end of the turn (tasks that became
    /// final in this turn's refreshes).
    pending: Vec<(TaskId, Vec<u8>)>,
    /// The latest archived statuses, also in memory: at most
    /// [`super::statuses::RECENT_ARCHIVED`].
    recent: BTreeMap<TaskId, Vec<u8>>,
    /// `recent`'s keys, oldest first.
    order: VecDeque<TaskId>,
}

impl Archive {
    /// A task's final status (JSON) to archive at the end of this turn.
    pub(super) fn record(&mut self, task: TaskId, json: Vec<u8>) {
        self.pending.push((task, json));
    }

    /// Whether statuses wait to be archived.
    pub(super) fn is_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// A status archived lately (kept in memory), if `task` is among them.
    pub(super) fn recent(&self, task: &TaskId) -> Option<&Vec<u8>> {
        self.recent.get(task)
    }

    /// The turn's records, for the driver to store: each is kept in memory too, the oldest
    /// beyond `keep` forgotten.
    pub(super) fn take(&mut self, keep: usize) -> Vec<(TaskId, Vec<u8>)> {
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
