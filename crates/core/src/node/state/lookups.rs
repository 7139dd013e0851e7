//! `Lookups`: the status requests that wait (for a task to end, for the archive, for the
//! members' answers) and the members' questions that wait for the archive. A sub-machine: its
//! fields are its own. The turn tells it of requests and questions to wait, of answers and of
//! members gone; it asks it which requests an answer, a member's silence or a deadline
//! releases, whether the archive is to be asked, and when the next deadline is. It asks nothing
//! of the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use piecework_queue_doc::{PeerId, QueueId, TaskId};

use crate::CommandId;
use crate::node::waiters::{Asking, MAX_PEER_LOOKUPS, TaskWaiter};

/// Status requests that wait, and members' questions.
#[derive(Debug, Default)]
pub(in crate::node) struct Lookups {
    /// `task status --wait` requests: counted in [`crate::MAX_WAITERS`], each with a
    /// deadline.
    waiters: Vec<TaskWaiter>,
    /// Status requests waiting for an archive lookup, by task: counted in
    /// [`crate::MAX_WAITERS`].
    archive: BTreeMap<TaskId, Vec<(CommandId, Option<Instant>)>>,
    /// Status requests asked of the members, by task: counted in [`crate::MAX_WAITERS`].
    asks: BTreeMap<TaskId, Asking>,
    /// Members' questions waiting for an archive lookup, by task: at most
    /// [`MAX_PEER_LOOKUPS`].
    for_peers: BTreeMap<TaskId, BTreeSet<PeerId>>,
    /// Life-cycle commands waiting for the kept ends of tasks that left the live documents,
    /// by lookup: counted in [`crate::MAX_WAITERS`].
    ends: BTreeMap<u64, (CommandId, EndWait)>,
    /// The next lookup of kept ends.
    next_ends: u64,
}

/// A life-cycle command that waits for kept ends read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::node) enum EndWait {
    /// A requeue of this task.
    Requeue(TaskId),
    /// An undo of this task.
    Undo(TaskId),
    /// A requeue of every dead letter of this queue.
    RequeueAll(QueueId),
}

/// What becomes of a member's question that waits for the archive.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::node) enum PeerLookup {
    /// Too many lookups for members in flight ([`MAX_PEER_LOOKUPS`]): answered "unknown".
    Refused,
    /// It waits: the archive is to be asked.
    Ask,
    /// It waits for a lookup already in flight.
    Joined,
}

impl Lookups {
    /// A status request waits for the archive's answer about `task`: whether the archive is
    /// to be asked (no request waits for it yet).
    pub(in crate::node) fn wait_for_archive(
        &mut self,
        task: &TaskId,
        cmd: CommandId,
        wait_until: Option<Instant>,
    ) -> bool {
        let asked = self.archive.contains_key(task);
        self.archive
            .entry(task.clone())
            .or_default()
            .push((cmd, wait_until));
        !asked
    }

    /// `peer` asked about `task`, which this node must look up in its archive.
    pub(in crate::node) fn peer_asks(&mut self, task: &TaskId, peer: &PeerId) -> PeerLookup {
        let looking = self.archive.contains_key(task) || self.for_peers.contains_key(task);
        if !looking && self.for_peers.len() >= MAX_PEER_LOOKUPS {
            return PeerLookup::Refused;
        }
        self.for_peers
            .entry(task.clone())
            .or_default()
            .insert(peer.clone());
        if looking {
            PeerLookup::Joined
        } else {
            PeerLookup::Ask
        }
    }

    /// The archive answered about `task`: the members whose questions waited for it.
    pub(in crate::node) fn take_peers_asking(&mut self, task: &TaskId) -> BTreeSet<PeerId> {
        self.for_peers.remove(task).unwrap_or_default()
    }

    /// The archive answered about `task`: the status requests that waited for it, in order.
    pub(in crate::node) fn take_archive_waiters(
        &mut self,
        task: &TaskId,
    ) -> Vec<(CommandId, Option<Instant>)> {
        self.archive.remove(task).unwrap_or_default()
    }

    /// How many status requests wait for the members' answers.
    pub(in crate::node) fn asking(&self) -> usize {
        self.asks.values().map(|a| a.cmds.len()).sum()
    }

    /// If the members are already asked about `task`, `cmd` waits for their answer too (true).
    pub(in crate::node) fn join_question(&mut self, task: &TaskId, cmd: CommandId) -> bool {
        match self.asks.get_mut(task) {
            Some(a) => {
                a.cmds.push(cmd);
                true
            }
            None => false,
        }
    }

    /// `members` were asked about `task` for `cmd`: answered "not found" at `deadline` if no
    /// one told.
    pub(in crate::node) fn ask(
        &mut self,
        task: TaskId,
        cmd: CommandId,
        members: BTreeSet<PeerId>,
        deadline: Instant,
    ) {
        self.asks.insert(
            task,
            Asking {
                cmds: vec![cmd],
                waiting: members,
                deadline,
            },
        );
    }

    /// `peer` answered about `task`: whether it was asked and had not answered yet (it has
    /// now).
    pub(in crate::node) fn answered_by(&mut self, task: &TaskId, peer: &PeerId) -> bool {
        self.asks
            .get_mut(task)
            .is_some_and(|a| a.waiting.remove(peer))
    }

    /// A member told what became of `task`: the requests that asked, which it answers.
    pub(in crate::node) fn take_question(&mut self, task: &TaskId) -> Vec<CommandId> {
        self.asks.remove(task).map_or_else(Vec::new, |a| a.cmds)
    }

    /// `peer` will not tell anything of `task`: the requests to answer "not found" if no
    /// member asked is left (none otherwise).
    pub(in crate::node) fn not_answered(&mut self, task: &TaskId, peer: &PeerId) -> Vec<CommandId> {
        let Some(a) = self.asks.get_mut(task) else {
            return vec![];
        };
        a.waiting.remove(peer);
        if a.waiting.is_empty()
            && let Some(a) = self.asks.remove(task)
        {
            return a.cmds;
        }
        vec![]
    }

    /// `peer` is gone: it answers no question, and its own questions are forgotten. The
    /// requests left with no member to answer them ("not found"), by task.
    pub(in crate::node) fn peer_gone(&mut self, peer: &PeerId) -> Vec<(TaskId, Vec<CommandId>)> {
        let tasks: Vec<TaskId> = self.asks.keys().cloned().collect();
        let mut unanswered = vec![];
        for task in tasks {
            let cmds = self.not_answered(&task, peer);
            if !cmds.is_empty() {
                unanswered.push((task, cmds));
            }
        }
        for peers in self.for_peers.values_mut() {
            peers.remove(peer);
        }
        unanswered
    }

    /// The questions to the members whose deadline passed at `now`, taken: their requests
    /// (to answer "not found"), by task.
    pub(in crate::node) fn expire_questions(
        &mut self,
        now: Instant,
    ) -> Vec<(TaskId, Vec<CommandId>)> {
        let late: Vec<TaskId> = self
            .asks
            .iter()
            .filter(|(_, a)| now >= a.deadline)
            .map(|(t, _)| t.clone())
            .collect();
        late.into_iter()
            .filter_map(|task| self.asks.remove(&task).map(|a| (task, a.cmds)))
            .collect()
    }

    /// `cmd` waits for a lookup of kept ends: the lookup's number, for the store's answer.
    pub(in crate::node) fn wait_for_ends(&mut self, cmd: CommandId, what: EndWait) -> u64 {
        let lookup = self.next_ends;
        self.next_ends += 1;
        self.ends.insert(lookup, (cmd, what));
        lookup
    }

    /// The store answered lookup `lookup`: the command that waited for it.
    pub(in crate::node) fn take_ends_waiter(
        &mut self,
        lookup: u64,
    ) -> Option<(CommandId, EndWait)> {
        self.ends.remove(&lookup)
    }

    /// A task wait goes on (a new one, or one looked at and not answered).
    pub(in crate::node) fn wait_on_task(&mut self, waiter: TaskWaiter) {
        self.waiters.push(waiter);
    }

    /// The task waits, taken to be looked at: each not answered comes back through
    /// [`Lookups::wait_on_task`].
    pub(in crate::node) fn take_task_waits(&mut self) -> Vec<TaskWaiter> {
        std::mem::take(&mut self.waiters)
    }

    /// Whether a task wait is on `task`.
    pub(in crate::node) fn waits_on(&self, task: &TaskId) -> bool {
        self.waiters.iter().any(|w| w.task == *task)
    }

    /// How many task waits there are.
    pub(in crate::node) fn task_waits(&self) -> usize {
        self.waiters.len()
    }

    /// The requests that wait here: what counts in [`crate::MAX_WAITERS`] here.
    pub(in crate::node) fn waiting(&self) -> usize {
        self.waiters.len()
            + self.ends.len()
            + self.archive.values().map(Vec::len).sum::<usize>()
            + self.asks.values().map(|a| a.cmds.len()).sum::<usize>()
    }

    /// The earliest deadline: of a question to the members, or of a task wait.
    pub(in crate::node) fn next_deadline(&self) -> Option<Instant> {
        let asks = self.asks.values().map(|a| a.deadline);
        let waits = self.waiters.iter().map(|w| w.until);
        asks.chain(waits).min()
    }
}
