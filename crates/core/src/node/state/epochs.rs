//! `Epochs`: the epoch documents this node holds for its queues, the rotations in flight, and
//! the carrying of late writes (its budget per turn, its work counter, whether it is due
//! again). A sub-machine: its fields are its own. The turn tells it of documents held and
//! retired, of rotations begun, going on and ended, and of what each carry cost; it asks it
//! which queue a document is of, whether a queue is rotating or a document is being sealed,
//! which rotations are late, how much a carry may take now, and when carrying is due. It asks
//! nothing of the others.

use std::collections::BTreeMap;
use std::time::Instant;

use piecework_queue_doc::QueueId;
use piecework_replica::DocId;

use crate::RotateId;
use crate::node::queue_state::{CARRY_PER_TURN, Rotating};

/// The epochs of this node's queues: the documents it holds and the work in flight.
#[derive(Debug)]
pub(in crate::node) struct Epochs {
    /// Every epoch document of a joined queue this node holds (current, sealed, the first),
    /// and its queue.
    docs: BTreeMap<DocId, QueueId>,
    /// Successors being built off this thread ([`crate::Io::Rotate`]): at most one per queue.
    rotating: BTreeMap<RotateId, Rotating>,
    /// The last rotation id given.
    next_rotate: u64,
    /// Changes of sealed documents this turn may still carry ([`CARRY_PER_TURN`]).
    carry_budget: usize,
    /// Changes of sealed documents looked at by carries since start.
    carried_changes: u64,
    /// Carry without the budget: what is carried now is shown in the view (a follower moving
    /// to a successor carries its own late writes before showing it).
    carry_whole: bool,
    /// A carry was left for the next turn, which is due at once.
    carry_again: Option<Instant>,
}

impl Default for Epochs {
    fn default() -> Self {
        Epochs {
            docs: BTreeMap::new(),
            rotating: BTreeMap::new(),
            next_rotate: 0,
            carry_budget: CARRY_PER_TURN,
            carried_changes: 0,
            carry_whole: false,
            carry_again: None,
        }
    }
}

impl Epochs {
    /// `doc` is an epoch document of `queue` that this node holds.
    pub(in crate::node) fn hold(&mut self, doc: DocId, queue: QueueId) {
        self.docs.insert(doc, queue);
    }

    /// `doc` is retired: no longer an epoch document this node holds.
    pub(in crate::node) fn retired(&mut self, doc: &DocId) {
        self.docs.remove(doc);
    }

    /// The queue whose epoch document `doc` is, if this node holds it.
    pub(in crate::node) fn queue_of(&self, doc: &DocId) -> Option<&QueueId> {
        self.docs.get(doc)
    }

    /// Whether `doc` is an epoch document this node holds.
    pub(in crate::node) fn holds(&self, doc: &DocId) -> bool {
        self.docs.contains_key(doc)
    }

    /// How many epoch documents this node holds.
    pub(in crate::node) fn held(&self) -> usize {
        self.docs.len()
    }

    /// A new id for work off this thread ([`crate::Io::Rotate`]: a build, a catch-up, a read).
    pub(in crate::node) fn next_rotate_id(&mut self) -> RotateId {
        self.next_rotate += 1;
        RotateId(self.next_rotate)
    }

    /// Whether a rotation of `queue` is in flight.
    pub(in crate::node) fn is_rotating(&self, queue: &QueueId) -> bool {
        self.rotating.values().any(|r| r.queue == *queue)
    }

    /// A rotation is in flight under `id` (begun, or going on with another catch-up).
    pub(in crate::node) fn rotation(&mut self, id: RotateId, r: Rotating) {
        self.rotating.insert(id, r);
    }

    /// The rotation `id`'s work came back: the rotation, taken, if still in flight.
    pub(in crate::node) fn take_rotation(&mut self, id: &RotateId) -> Option<Rotating> {
        self.rotating.remove(id)
    }

    /// The rotations whose last catch-up did not come back by its deadline at `now`,
    /// dropped: them, in id order.
    pub(in crate::node) fn take_late_rotations(&mut self, now: Instant) -> Vec<Rotating> {
        let late: Vec<RotateId> = self
            .rotating
            .iter()
            .filter(|(_, r)| r.last.is_some_and(|d| now >= d))
            .map(|(id, _)| *id)
            .collect();
        late.iter()
            .filter_map(|rid| self.rotating.remove(rid))
            .collect()
    }

    /// Whether a rotation in flight seals `doc`.
    pub(in crate::node) fn seals(&self, doc: &DocId) -> bool {
        self.rotating.values().any(|r| r.prev == *doc)
    }

    /// The earliest deadline of a rotation's last catch-up.
    pub(in crate::node) fn next_rotation_deadline(&self) -> Option<Instant> {
        self.rotating.values().filter_map(|r| r.last).min()
    }

    /// How many rotations are in flight.
    pub(in crate::node) fn rotations(&self) -> usize {
        self.rotating.len()
    }

    /// A turn begins: its carries have the whole budget ([`CARRY_PER_TURN`]), and none is
    /// left for later yet.
    pub(in crate::node) fn new_turn(&mut self) {
        self.carry_budget = CARRY_PER_TURN;
        self.carry_again = None;
    }

    /// What is carried from now on is shown in the view at once: carried whole, whatever the
    /// budget, until [`Epochs::carry_within_budget`].
    pub(in crate::node) fn carry_without_budget(&mut self) {
        self.carry_whole = true;
    }

    /// Carries keep to the turn's budget again.
    pub(in crate::node) fn carry_within_budget(&mut self) {
        self.carry_whole = false;
    }

    /// How many changes a carry may look at now (0: none left this turn).
    pub(in crate::node) fn carry_limit(&self) -> usize {
        if self.carry_whole {
            usize::MAX
        } else {
            self.carry_budget
        }
    }

    /// A carry looked at `changes` changes: counted, and taken from the turn's budget unless
    /// carrying whole.
    pub(in crate::node) fn carried(&mut self, changes: usize) {
        self.carried_changes += changes as u64;
        if !self.carry_whole {
            self.carry_budget = self.carry_budget.saturating_sub(changes);
        }
    }

    /// A carry was left for later: the next turn is due at `now`.
    pub(in crate::node) fn carry_later(&mut self, now: Instant) {
        self.carry_again = Some(now);
    }

    /// When a turn is due for a carry left for later.
    pub(in crate::node) fn carry_due(&self) -> Option<Instant> {
        self.carry_again
    }

    /// How many changes of sealed documents carries have looked at since start.
    pub(in crate::node) fn carried_changes(&self) -> u64 {
        self.carried_changes
    }
}
