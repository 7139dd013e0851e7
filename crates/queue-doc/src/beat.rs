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
    /// The run was asked to stop and its end is recorded, but its handler has not returned:
    /// the worker is still busy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overdue: bool,
    /// How far the run is, as its handler last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::Progress>,
}

/// The most workers a pool has (and a pool heartbeat reports): a node runs at most this many.
/// A heartbeat is read from a peer, so a reader keeps only the reports of indexes below it.
pub const MAX_POOL_WORKERS: u32 = 256;

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
    /// The handler kinds the pool runs; `None` (a pool from before kinds were reported): any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<String>>,
    /// The resources the pool holds now (a withdrawn one is left out until it is restored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
}

/// The most handler kinds a reader keeps of one pool heartbeat.
pub const MAX_POOL_KINDS: usize = 256;
/// The most resources a reader keeps of one pool heartbeat.
pub const MAX_POOL_RESOURCES: usize = 256;

/// What a pool lacks to be assigned a task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Lack {
    /// It has no handler for the task's kind.
    Kind(String),
    /// It does not hold these of the task's required resources.
    Resources(Vec<String>),
}

impl PoolBeat {
    /// The heartbeat as a reader should count it: one report per worker index below
    /// [`MAX_POOL_WORKERS`], in index order. A worker listed more than once is kept once
    /// (its first report), so a beat that repeats an index cannot win more assignments
    /// than one worker's.
    pub fn normalized(&self) -> PoolBeat {
        let mut workers: Vec<WorkerReport> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for w in &self.workers {
            if w.index < MAX_POOL_WORKERS && seen.insert(w.index) {
                workers.push(w.clone());
            }
            if seen.len() == MAX_POOL_WORKERS as usize {
                break;
            }
        }
        workers.sort_by_key(|w| w.index);
        let bounded = |v: &Vec<String>, max: usize| {
            let mut v: Vec<String> = v.iter().take(max).cloned().collect();
            v.sort();
            v.dedup();
            v
        };
        PoolBeat {
            workers,
            kinds: self.kinds.as_ref().map(|k| bounded(k, MAX_POOL_KINDS)),
            resources: bounded(&self.resources, MAX_POOL_RESOURCES),
            ..self.clone()
        }
    }

    /// What this pool lacks to run a task of `kind` that requires `requires`, if anything
    /// (the kind first). Expects a [`PoolBeat::normalized`] beat (sorted lists).
    pub fn lacks(&self, kind: &str, requires: &[String]) -> Option<Lack> {
        if let Some(kinds) = &self.kinds
            && kinds.binary_search_by(|k| k.as_str().cmp(kind)).is_err()
        {
            return Some(Lack::Kind(kind.to_owned()));
        }
        let missing: Vec<String> = requires
            .iter()
            .filter(|r| self.resources.binary_search(r).is_err())
            .cloned()
            .collect();
        (!missing.is_empty()).then_some(Lack::Resources(missing))
    }
}
