//! What waits on something: a request parked on a document (`DocWaiter`), a task wait
//! (`TaskWaiter`), a question asked of the members (`Asking`), a submit waiting for durability
//! (`SubmitWait`), and a stop in progress (`Stopping`), with their bounds. Plain data, held by
//! the state sub-machines (`Documents`, `Lookups`, `Submits`) and by `Core` (`Stopping`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use automerge::ChangeHash;
use piecework_queue_doc::{PeerId, QueueId, TaskId};
use piecework_replica::DocId;
use piecework_worker_pool::Run;

use crate::CommandId;
use crate::api::{self};

/// Something parked until a document arrives (or turns out unavailable).
#[derive(Debug)]
pub(super) enum DocWaiter {
    Join {
        cmd: CommandId,
        id: QueueId,
        from_peers: bool,
        deadline: Instant,
        /// A join by invite: presented to its member rather than asked of every peer.
        invite: Option<Box<super::membership::InviteJoin>>,
    },
    Status {
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
        deadline: Instant,
    },
    /// A run waiting for its task's document, since when.
    Start { run: Run, since: Instant },
    /// An epoch document of a queue (a successor, or a successor that lost a double seal).
    Epoch { queue: QueueId },
    /// The epoch document a reopened queue was on when this node stopped
    /// ([`Config::resume`]): the queue moves there once it is read back.
    Resume { queue: QueueId },
    /// A task whose input was unavailable: if this node has its document, mark it available.
    Revive {
        queue: QueueId,
        task: TaskId,
        n: u64,
    },
    /// Run records or a summary for a task document that had left memory: written by the
    /// next turn once it is back (`Runs` keeps them meanwhile).
    Write,
}

/// How often a join still waiting for its queue document asks the connected peers again: a
/// request or its answer lost with a stream that was reset, or a peer that joined the queue
/// since it was first asked, does not hold the join until [`FIND_TIMEOUT`].
pub(super) const JOIN_ASK_EVERY: Duration = Duration::from_secs(1);

/// A stop in progress ([`Command::Stop`]).
#[derive(Debug)]
pub(super) struct Stopping {
    /// The stop commands to answer (a second one is answered with the first).
    pub(super) cmds: Vec<CommandId>,
    /// Runs still going then are interrupted.
    pub(super) grace_until: Instant,
    /// The answer goes out then at the latest, with what is still unsaved.
    pub(super) flush_until: Instant,
    /// Runs in flight when the stop began.
    pub(super) runs_at_stop: usize,
    /// Once every run ended and its records were written: each document then not on disk,
    /// and the version it must reach (what peers send meanwhile is not waited for).
    pub(super) flush: Option<Vec<(DocId, u64)>>,
    pub(super) report: api::StopReport,
    /// The answer went out: the node does nothing more but wait for its driver to end it.
    pub(super) answered: bool,
}

/// A status request this node could answer from nothing it holds, asked of the connected
/// members ([`Ask::Status`]).
#[derive(Debug)]
pub(super) struct Asking {
    /// The requests to answer.
    pub(super) cmds: Vec<CommandId>,
    /// The members asked that have not answered yet.
    pub(super) waiting: BTreeSet<PeerId>,
    /// Answered "not found" then, whoever is left.
    pub(super) deadline: Instant,
}

/// Archive lookups at most in flight for members' questions ([`Ask::Status`]); beyond this a
/// question is answered "unknown".
pub(super) const MAX_PEER_LOOKUPS: usize = 1_024;

#[derive(Debug)]
pub(super) struct TaskWaiter {
    pub(super) cmd: CommandId,
    pub(super) task: TaskId,
    pub(super) until: Instant,
    pub(super) wait: Duration,
}

#[derive(Debug)]
pub(super) struct SubmitWait {
    pub(super) cmd: CommandId,
    /// How to answer: one task, or a batch (whose refused entries are already known).
    pub(super) answer: SubmitAnswer,
    /// Each new task document, its heads and its save version after the submit.
    pub(super) tasks: Vec<(DocId, Vec<ChangeHash>, u64)>,
    pub(super) queue: QueueId,
    pub(super) queue_doc: DocId,
    pub(super) queue_heads: Vec<ChangeHash>,
    pub(super) queue_version: u64,
    pub(super) deadline: Instant,
}

#[derive(Debug)]
pub(super) enum SubmitAnswer {
    /// The task, and whether the submit was deduplicated into it.
    One(TaskId, bool),
    /// Per request entry: its task and whether it was deduplicated, or why it was refused.
    Many(Vec<Result<(TaskId, bool), String>>),
}
