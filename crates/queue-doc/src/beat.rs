//! The heartbeats peers gossip beside the documents: a router's, and a pool's.
//!
//! They travel over the network (signed by the sender's key) and are never stored. Both carry a
//! counter that strictly increases per sender and start, so replays can be told apart.

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, Claim, PeerId, QueueId, TaskId};

/// "I am the active router of this queue, under this claim."
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RouterBeat {
    /// The queue.
    pub queue: QueueId,
    /// The sender's claim; `claim.peer` must be the authenticated sender.
    pub claim: Claim,
    /// Strictly increasing per claim.
    pub counter: u64,
    /// The sender's current epoch document ([`crate::epoch`]): a peer that missed a rotation
    /// learns it here. Absent before epochs existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<crate::chain::Latest>,
    /// The member the sender hands the router role to: the sender is stopping (a planned
    /// restart) and that member claims at once instead of waiting `takeover_after`. Absent in
    /// every other heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<PeerId>,
}

/// What one worker of a pool is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The worker's index in its pool.
    pub index: u32,
    /// The attempt it is running, if any.
    pub running: Option<RunningReport>,
}

/// An attempt a worker is running.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunningReport {
    /// The task's queue.
    pub queue: QueueId,
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: AttemptId,
}

/// "My pool is alive and its workers are doing this."
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolBeat {
    /// The pool's peer; must be the authenticated sender.
    pub peer: PeerId,
    /// How many times the pool's node has started.
    pub incarnation: u64,
    /// Strictly increasing per incarnation.
    pub counter: u64,
    /// Every worker of the pool.
    pub workers: Vec<WorkerReport>,
    /// The epoch document the sender is on, for the queue of the topic it is published on
    /// ([`crate::epoch`]): peers on another branch of a double seal learn of it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<crate::chain::Latest>,
    /// The pool's node is stopping: it starts nothing new, and routers assign it nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}
